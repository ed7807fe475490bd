"""Offline preference optimisation knobs (ROLL's DPO pipeline keys, plus TRL's names for the loss
types ROLL lacks). Top-level keys; only `apps/dpo` reads them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl_config.schema.base import StrictModel

PreferenceLossName = Literal["sigmoid", "ipo", "simpo", "kto", "orpo"]


class PreferenceFields(StrictModel):
    """DPO and its relatives: loss, strength, data columns, reference log-probs."""

    loss_type: PreferenceLossName = Field(
        default="sigmoid",
        description="Preference loss (rl_algos preference registry name): sigmoid (DPO; cDPO "
        "with label_smoothing > 0), ipo, simpo and orpo (no reference model), kto (unpaired rows "
        "with a boolean label). ROLL's `ipo: true` selects ipo.",
    )
    ipo: bool = Field(default=False, description="ROLL's IPO switch: true = loss_type ipo.")
    beta: float = Field(
        default=0.1,
        gt=0,
        description="Strength of the implicit KL to the reference (DPO/IPO/KTO beta; SimPO's "
        "reward scale; ORPO's odds-ratio weight lambda).",
    )
    label_smoothing: float = Field(
        default=0.0,
        ge=0,
        lt=0.5,
        description="Conservative DPO (cDPO): assumed probability that a preference label is "
        "flipped (sigmoid and simpo).",
    )
    simpo_gamma: float = Field(default=0.5, ge=0, description="SimPO's target reward margin gamma.")
    kto_desirable_weight: float = Field(
        default=1.0, gt=0, description="KTO's weight lambda_D of desirable rows."
    )
    kto_undesirable_weight: float = Field(
        default=1.0, gt=0, description="KTO's weight lambda_U of undesirable rows."
    )
    chosen_key: str = Field(
        default="chosen", description="Dataset column of the preferred response (text or messages)."
    )
    rejected_key: str = Field(
        default="rejected",
        description="Dataset column of the dispreferred response (text or messages).",
    )
    label_key: str = Field(
        default="label",
        description="KTO: dataset column of the boolean label (true = desirable) of an unpaired "
        "row whose response is in chosen_key.",
    )
    completion_key: str = Field(
        default="completion",
        description="KTO: dataset column of the response of an unpaired row (a row with "
        "label_key); paired rows give KTO one desirable and one undesirable example.",
    )
    precompute_ref_log_probs: bool = Field(
        default=True,
        description="Reference log-probs computed once by the reference worker and cached with "
        "the data (true), or on the fly every step (false); both give the same values.",
    )
    truncation_mode: Literal["keep_start", "drop"] = Field(
        default="keep_start",
        description="Rows whose prompt + response exceed sequence_length: keep_start cuts the "
        "response's end (a row whose prompt alone leaves no response token is dropped); drop "
        "drops the row. Both are counted (data/truncated, data/dropped_too_long).",
    )
