"""Profile job requests: one dense pass that measures what slicing would discard, without slicing."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from core.specs.common import CalibrationSpec, ModelSpec
from core.specs.pruning import ROUND_TO_DESCRIPTION

PROFILED_METHOD = "slicegpt"
"""The method whose windows a profile draws and whose widths its spectra and lens readings are taken
at (per-layer layout); the mask errors serve the intra-layer methods (`core.profiles.METHOD_FEATURES`)."""
MASK_PROFILED_METHOD = "wanda"
"""What a model slicing refuses must still be prunable by, for its profile's mask errors."""
DEFAULT_PROFILE_SPARSITIES = (0.1, 0.2, 0.3, 0.4, 0.5)
MAX_PROFILE_SPARSITIES = 20
MAX_LENS_TOKENS = 65_536


class ProfileJobCreate(ModelSpec):
    """Profile a dense model for the predictors (`POST /v1/predictions` uses stored profiles): one pass
    over the calibration windows a prune would use, block by block, storing per residual signal the
    eigenvalues of its second moment, the token energy per eigenvector, and logit-lens readings (KL,
    its Taylor estimate, NLL increase) when the signal is projected on its top-d eigenvectors, at
    each sparsity's width d; and per block linear the share of its output energy the Wanda,
    magnitude and per-row magnitude masks would remove at each sparsity (what predicts wanda,
    sparsegpt, magnitude and magnitude-row). A model slicing refuses (Gemma-1) is profiled by its block
    outputs and mask errors only. Read it back at `GET /v1/models/{model}/profile`."""

    kind: Literal["profile"]
    calibration: CalibrationSpec = Field(
        default_factory=CalibrationSpec,
        description="The windows to profile on: send the calibration a prune or sweep will use, so the "
        "profile predicts that pruning (same corpus, seed, count and length).",
    )
    sparsities: list[Annotated[float, Field(gt=0.0, lt=1.0)]] = Field(
        default_factory=lambda: list(DEFAULT_PROFILE_SPARSITIES),
        min_length=1,
        max_length=10 * MAX_PROFILE_SPARSITIES,
        description="Sparsities whose widths get lens readings (each costs one head reading per signal); "
        "the spectra serve every width. Predictions between two of them interpolate the lens readings.",
    )
    measured_on: CalibrationSpec | None = Field(
        None,
        description="Windows to measure what the calibration basis discards on (and the lens readings): "
        "text like what the pruned model will be scored on (never its test split), so the profile sees "
        "how well the calibration generalises to it. None of them overlaps a calibration window; "
        "without a `seed` of their own they are drawn with the job's seed offset, never the "
        "calibration's. null: the calibration windows themselves.",
    )
    round_to: int = Field(8, ge=1, le=128, description=ROUND_TO_DESCRIPTION)
    lens_tokens: int = Field(
        256,
        ge=0,
        le=MAX_LENS_TOKENS,
        description="Positions read through the final norm and head per signal and width: spread evenly "
        "over the `measured_on` windows (else the calibration windows), the first position of each "
        "window left out. Each costs a pass over the "
        "vocabulary per signal and width; 0 skips the lens readings (the spectra alone are cheap), and "
        "with them the lens-KL predictors.",
    )

    @field_validator("sparsities")
    @classmethod
    def _sorted_distinct(cls, value: list[float]) -> list[float]:
        distinct = sorted(set(value))
        if len(distinct) > MAX_PROFILE_SPARSITIES:
            raise ValueError(
                f"{len(distinct)} distinct sparsities, at most {MAX_PROFILE_SPARSITIES} per profile"
            )
        return distinct
