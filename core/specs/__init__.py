"""Job request schemas: the contract between the API (which validates and stores a request) and the
workers (which validate the stored request again before they run it)."""

from core.specs.common import AccuracySpec, CalibrationSpec, ModelSpec, PerplexitySpec, StrictModel
from core.specs.jobs import JOB_KINDS, EvaluateJobCreate, JobCreate, PruneJobCreate, SweepJobCreate
from core.specs.probe import ProbeJobCreate
from core.specs.profile import ProfileJobCreate

__all__ = [
    "JOB_KINDS",
    "AccuracySpec",
    "CalibrationSpec",
    "EvaluateJobCreate",
    "JobCreate",
    "ModelSpec",
    "PerplexitySpec",
    "ProbeJobCreate",
    "ProfileJobCreate",
    "PruneJobCreate",
    "StrictModel",
    "SweepJobCreate",
]
