"""Dataset-backed single-turn tasks (GSM8K/MATH), Countdown and the tool-use env.

RLVR data: ``load_dataset``/``data_spec`` (files, ROLL column names, domains),
``filter_overlong_prompts``, ``PromptSampler``/``EpochSampler`` (resumable, domain mixing),
``convert`` (GSM8K/MATH rows to verl's parquet schema).
"""

from rl_envs.tasks.countdown import CountdownEnv, generate_countdown
from rl_envs.tasks.data import (
    DataFileError,
    LoadReport,
    RowError,
    RowInvalid,
    RowKeys,
    TaskRow,
    bad_json,
    chat_messages,
    load_rows,
    read_records,
    require_files,
    validate_records,
)
from rl_envs.tasks.dataset import (
    DataError,
    Dataset,
    DataSpec,
    OverlongReport,
    chat_token_counter,
    data_spec,
    filter_overlong_prompts,
    load_dataset,
    longest_token_chars,
)
from rl_envs.tasks.sampler import EpochSampler, PromptSampler, domain_quotas
from rl_envs.tasks.single_turn import SingleTurnEnv
from rl_envs.tasks.tool_env import ToolEnv, generate_arithmetic_task

__all__ = [
    "CountdownEnv",
    "DataError",
    "DataFileError",
    "DataSpec",
    "Dataset",
    "EpochSampler",
    "LoadReport",
    "OverlongReport",
    "PromptSampler",
    "RowError",
    "RowInvalid",
    "RowKeys",
    "SingleTurnEnv",
    "TaskRow",
    "ToolEnv",
    "bad_json",
    "chat_messages",
    "chat_token_counter",
    "data_spec",
    "domain_quotas",
    "filter_overlong_prompts",
    "generate_arithmetic_task",
    "generate_countdown",
    "load_dataset",
    "load_rows",
    "longest_token_chars",
    "read_records",
    "require_files",
    "validate_records",
]
