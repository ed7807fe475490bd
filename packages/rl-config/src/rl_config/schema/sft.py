"""Supervised fine-tuning keys (ROLL's SFT pipeline). Top-level keys; only `apps/sft` reads them.

A ROLL SFT config names its training role `sft_train`; it is read as `actor_train` (the policy
being trained), with a note (rl_config.roll_keys.rename_sft_role)."""

from __future__ import annotations

from pydantic import Field

from rl_config.schema.base import StrictModel


class SFTFields(StrictModel):
    """Which columns of a prompt/response row make the conversation (chat rows: the messages
    column, actor_train.data_args.messages)."""

    prompt_key: str = Field(
        default="instruction",
        description="SFT: dataset column of the user's prompt text (ROLL's prompt_key).",
    )
    query_key: str | None = Field(
        default=None,
        description="SFT: optional dataset column appended to the prompt after a newline "
        "(ROLL's query_key, e.g. alpaca's input).",
    )
    response_key: str = Field(
        default="output",
        description="SFT: dataset column of the assistant's response, the trained tokens.",
    )
    system_key: str | None = Field(
        default=None,
        description="SFT: optional dataset column of a system message (unset: the chat "
        "template's default system prompt).",
    )
    global_template: str | None = Field(
        default=None,
        description="SFT: chat template for every dataset (ROLL); unset: "
        "actor_train.data_args.template.",
    )
