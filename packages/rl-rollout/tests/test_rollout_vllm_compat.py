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
    with pytest.raises(RuntimeError, match="emptied after loading .*w: a kernel-packed copy"):
        vllm_compat.load_weights(runner, [("w", torch.ones(2))])


def test_sampled_log_probs_read_the_last_positions() -> None:
    logprob = lambda v: SimpleNamespace(logprob=v)  # noqa: E731
    positions = [{5: logprob(-0.1)}, {7: logprob(-0.2), 8: logprob(-3.0)}, {9: logprob(-0.3)}]
    assert vllm_compat.sampled_log_probs(positions, [7, 9]) == [-0.2, -0.3]
    assert vllm_compat.sampled_log_probs(positions, []) == []
