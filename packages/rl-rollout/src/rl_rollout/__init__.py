"""Generation engines (HF transformers, vLLM on CUDA/CPU/Ascend) and the multi-turn agent loop."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rl-rollout")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"
