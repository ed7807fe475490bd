"""Dataset-backed single-turn tasks (GSM8K/MATH), Countdown and the tool-use env."""

from rl_envs.tasks.countdown import CountdownEnv, generate_countdown
from rl_envs.tasks.data import LoadReport, RowError, TaskRow, load_rows, validate_records
from rl_envs.tasks.single_turn import SingleTurnEnv
from rl_envs.tasks.tool_env import ToolEnv, generate_arithmetic_task

__all__ = [
    "CountdownEnv",
    "LoadReport",
    "RowError",
    "SingleTurnEnv",
    "TaskRow",
    "ToolEnv",
    "generate_arithmetic_task",
    "generate_countdown",
    "load_rows",
    "validate_records",
]
