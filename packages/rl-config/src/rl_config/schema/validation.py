"""ROLL's ``validation:`` section (RLVR): the held-out prompts and how they are sampled."""

from __future__ import annotations

from pydantic import Field

from rl_config.schema.base import StrictModel
from rl_config.schema.worker import DataArgs, GeneratingArgs


class ValidationConfig(StrictModel):
    """RLVR validation (ROLL ``validation``, a worker section of which the RLVR pipeline reads
    the data and the sampling). Rows are read with actor_train.data_args' column names, as ROLL's
    RLVR pipeline does; evaluation runs every top-level ``eval_steps``."""

    data_args: DataArgs = Field(
        default_factory=DataArgs,
        description="file_name: the held-out data file(s) (instead of "
        "actor_train.data_args.eval_file_name); template: the chat template of held-out prompts "
        "(unset: actor_train.data_args.template).",
    )
    generating_args: GeneratingArgs | None = Field(
        default=None,
        description="Sampling of held-out prompts (temperature, top_p, top_k, max_new_tokens, "
        "stop_strings ...); unset: actor_infer.generating_args. num_return_sequences must be 1 "
        "or val_n_sample (the samples per held-out prompt).",
    )
    eval_steps: int | None = Field(
        default=None,
        ge=0,
        description="ROLL writes the top-level eval_steps here too; it must equal eval_steps "
        "(the one cadence of evaluation), unset: eval_steps.",
    )
