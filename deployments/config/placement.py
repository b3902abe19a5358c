"""``GraphConfig.auto_placement``: how ``text_placement: auto`` decides
(``routing/text_placement.py``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AutoPlacementConfig(BaseModel):
    """The Ingress sends a share of the text requests worth moving to the Derender tier,
    and moves that share with the measured load of the Generate and Derender hosts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    refresh_s: float = Field(
        1.0, gt=0, description="How often the Ingress reads every replica's host load."
    )
    idle_stop_s: float = Field(
        30.0,
        gt=0,
        description="Reading stops this long after the last auto-placed request (an idle "
        "graph makes no calls); the next one starts it again.",
    )
    step: float = Field(
        0.5, gt=0, le=1, description="How far one reading moves the share sent to the tier."
    )
    busy: float = Field(
        0.85,
        gt=0,
        le=1,
        description="Generate's pressure (the busier of its host's CPUs and its event "
        "loop) from which text moves to the tier.",
    )
    idle: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="Generate's pressure below which text moves back inline.",
    )
    margin: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="Text moves to the tier only while Generate's pressure exceeds the "
        "tier's by this much, and back inline once the tier's exceeds Generate's by it: "
        "the band between holds the share (hysteresis).",
    )
    min_tokens: int = Field(
        64,
        ge=0,
        description="A request without parsers stays inline if it may generate fewer "
        "tokens than this: its text work does not pay for the hop to the tier.",
    )
    min_tokens_parsed: int = Field(
        16,
        ge=0,
        description="The same for a request whose text runs a reasoning or tool parser.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> AutoPlacementConfig:
        if self.idle >= self.busy:
            raise ValueError("auto_placement.idle must be below auto_placement.busy")
        return self
