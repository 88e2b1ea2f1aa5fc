"""What every response body built from a store row shares."""

from __future__ import annotations

from typing import Annotated

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class FromRow(BaseModel):
    """A response body read straight from a store row (`Model.model_validate(row)`)."""

    model_config = ConfigDict(from_attributes=True)


ModelId = Annotated[
    str,
    Field(
        validation_alias=AliasChoices("model_id", "model"),
        description="Model id as jobs resolved it (packaged alias, local path or HF id).",
    ),
]
"""The `model` of a body read from a row's `model_id`."""
