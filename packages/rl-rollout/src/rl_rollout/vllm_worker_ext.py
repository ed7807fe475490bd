"""vLLM worker extension: methods vLLM mixes into every worker, reached with ``collective_rpc``.

Passed to vLLM as ``worker_extension_cls="rl_rollout.vllm_worker_ext.RLWorkerExtension"``. It runs
inside vLLM's worker process (CUDA, CPU or the vllm-ascend NPU worker alike), so it must not import
anything heavy beyond torch. Method names are prefixed ``rl_`` so they never clash with vLLM's.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["RLWorkerExtension"]


class RLWorkerExtension:
    """Mixed into vLLM's Worker (``self.model_runner`` is the worker's model runner)."""

    model_runner: Any

    def _rl_model(self) -> Any:
        return self.model_runner.model

    def rl_load_weights(self, payload: bytes) -> int:
        """Load HF-named full tensors (safetensors bytes, made in memory by the engine: the RPC
        path turns raw tensors into lists) in place (`rl_rollout.vllm_compat.load_weights`: vLLM's
        ``reload_weights`` where it takes tensors, else the model's ``load_weights``): the model's own
        ``load_weights`` fuses q/k/v and gate/up and shards for tensor parallelism, and the
        layer-wise reload re-runs each layer's post-load processing (CPU GEMM packing, Ascend NZ
        format ...), so the kernels see the new values. Returns the number of tensors loaded."""
        from safetensors.torch import load

        from rl_rollout.vllm_compat import load_weights

        named_tensors = list(load(payload).items())
        load_weights(self.model_runner, named_tensors)
        return len(named_tensors)

    def rl_named_parameters(self) -> bytes:
        """The live weights as vLLM stores them (fused names), as safetensors bytes (the RPC
        return path does not carry tensors with their dtype)."""
        return _to_bytes(
            {n: p.detach().to("cpu", copy=True) for n, p in self._rl_model().named_parameters()}
        )

    def rl_hf_state_dict(self) -> bytes:
        """The live weights under HF names (q/k/v and gate/up unfused; tensor_parallel_size=1), as
        safetensors bytes. Tensors packed into a kernel layout (CPU oneDNN) are left out."""
        config = self.model_runner.model_config.hf_config
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        q_size = config.num_attention_heads * head_dim
        kv_size = config.num_key_value_heads * head_dim
        out: dict[str, torch.Tensor] = {}
        from safetensors.torch import load

        for name, tensor in load(self.rl_named_parameters()).items():
            if tensor.numel() == 0:  # packed into a kernel-specific layout (CPU oneDNN)
                continue
            if ".qkv_proj." in name:
                q, k, v = tensor.split([q_size, kv_size, kv_size], dim=0)
                for part, value in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                    out[name.replace("qkv_proj", part)] = value.clone()
            elif ".gate_up_proj." in name:
                gate, up = tensor.chunk(2, dim=0)
                out[name.replace("gate_up_proj", "gate_proj")] = gate.clone()
                out[name.replace("gate_up_proj", "up_proj")] = up.clone()
            else:
                out[name] = tensor
        return _to_bytes(out)


def _to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in tensors.items()})

    # Note: on the CPU vLLM packs linear weights for oneDNN after loading and leaves the parameter
    # empty; such tensors are skipped by rl_hf_state_dict (see its caller).
