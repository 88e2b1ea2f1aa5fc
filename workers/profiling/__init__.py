"""Profiling a dense model for the predictors: what slicing would discard, without slicing."""

from workers.profiling.profile import profile_model
from workers.profiling.report import (
    DEFAULT_LENS_TOKENS,
    LensReading,
    ProfileReport,
    ProfileStopped,
    SignalProfile,
)

__all__ = [
    "DEFAULT_LENS_TOKENS",
    "LensReading",
    "ProfileReport",
    "ProfileStopped",
    "SignalProfile",
    "profile_model",
]
