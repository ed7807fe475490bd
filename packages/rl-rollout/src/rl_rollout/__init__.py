"""Generation engines (HF transformers, vLLM on CUDA/CPU/Ascend) and the multi-turn agent loop.

Importing this package never imports vLLM; ``build_engine("vllm", ...)`` does, lazily.
"""

from importlib.metadata import PackageNotFoundError, version

from rl_rollout.engine import Engine, EngineAsleepError
from rl_rollout.registry import build_engine, list_engines, register_engine
from rl_rollout.tiny_model import build_tiny_model

try:
    __version__ = version("rl-rollout")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"

__all__ = [
    "Engine",
    "EngineAsleepError",
    "__version__",
    "build_engine",
    "build_tiny_model",
    "list_engines",
    "register_engine",
]
