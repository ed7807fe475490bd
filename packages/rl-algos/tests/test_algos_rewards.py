from __future__ import annotations

import math

import pytest
import torch

from rl_algos import kl_control, rewards
from rl_algos.rewards import RunningMeanStd


def test_normalize_group_batch_identity() -> None:
    s = torch.tensor([1.0, 0.0, 2.0, 2.0])
    out = rewards.normalize_rewards(s, grouping="group", method="mean_std", index=[0, 0, 1, 1])
    d = math.sqrt(0.5) + 1e-6
    torch.testing.assert_close(out, torch.tensor([0.5 / d, -0.5 / d, 0.0, 0.0]))
    out = rewards.normalize_rewards(s, grouping="batch", method="mean")
    torch.testing.assert_close(out, s - 1.25)
    assert rewards.normalize_rewards(s, grouping="batch", method="identity") is not None
    torch.testing.assert_close(rewards.normalize_rewards(s, method="identity"), s)
    with pytest.raises(ValueError, match="index"):
        rewards.normalize_rewards(s, grouping="group")
    with pytest.raises(ValueError, match="method"):
        rewards.normalize_rewards(s, grouping="batch", method="zscore")


def test_asym_clip() -> None:
    s = torch.tensor([0.0] * 9 + [10.0])  # z of the outlier = 2.85, of the rest -0.316
    out = rewards.normalize_rewards(
        s, grouping="batch", method="asym_clip", asym_low=-0.2, asym_high=2.0
    )
    assert out[-1].item() == pytest.approx(2.0) and out[0].item() == pytest.approx(-0.2)
    flat = rewards.normalize_rewards(torch.ones(3), grouping="batch", method="asym_clip")
    assert (flat == 0).all()


def test_running_mean_std_matches_all_data() -> None:
    torch.manual_seed(0)
    rms = RunningMeanStd(epsilon=0.0)
    chunks = [torch.randn(n) * 3 + 1 for n in (5, 17, 1, 40)]
    for c in chunks:
        rms.update(c)
    allx = torch.cat(chunks).double()
    assert rms.mean == pytest.approx(allx.mean().item())
    assert rms.var == pytest.approx(allx.var(unbiased=False).item())
    state = rms.state_dict()
    other = RunningMeanStd()
    other.load_state_dict(state)
    assert other.state_dict() == state
    out = rewards.normalize_rewards(
        torch.tensor([1.0, 2.0]), grouping="running", method="mean_std", running=other
    )
    assert out.shape == (2,)


def test_clips_and_whiten() -> None:
    x = torch.tensor([-3.0, 0.5, 4.0])
    torch.testing.assert_close(rewards.clip_rewards(x, 1.0), torch.tensor([-1.0, 0.5, 1.0]))
    torch.testing.assert_close(rewards.clip_advantages(x, 2.0), torch.tensor([-2.0, 0.5, 2.0]))
    assert rewards.clip_rewards(x, None) is x
    w = rewards.whiten(torch.tensor([[1.0, 3.0, 99.0]]), torch.tensor([[True, True, False]]))
    # values 1, 3: mean 2, unbiased var 2 -> (x - 2) / sqrt(2)
    torch.testing.assert_close(w, torch.tensor([[-1.0, 1.0, 0.0]]) / math.sqrt(2.0))


def test_overlong_penalty_hand_values() -> None:
    lengths = torch.tensor([10, 16, 18, 20, 25])
    out = rewards.overlong_penalty(
        lengths, max_response_length=20, buffer_length=4, penalty_factor=1.0
    )
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    with pytest.raises(ValueError, match="buffer_length"):
        rewards.overlong_penalty(lengths, 20, 0)


def test_length_penalty_hand_values() -> None:
    lengths = torch.tensor([10, 20, 30, 5, 5])
    correct = torch.tensor([True, True, False, True, False])
    out = rewards.length_penalty(lengths, correct, [0, 0, 0, 1, 1])
    torch.testing.assert_close(out, torch.tensor([0.5, 0.0, -0.5, 0.0, 0.0]))


def test_dynamic_sampling_mask() -> None:
    keep = rewards.dynamic_sampling_mask(
        torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]), ["a", "a", "b", "b", "c"]
    )
    assert keep.tolist() == [False, False, True, True, False]


def test_kl_controllers() -> None:
    fixed = kl_control.build_kl_controller(0.1)
    fixed.update(5.0, 100)
    assert fixed.value == 0.1
    ada = kl_control.build_kl_controller(0.1, target_kl=1.0, kl_horizon=100)
    ada.update(2.0, 10)  # error clipped to 0.2 -> x1.02
    assert ada.value == pytest.approx(0.102)
    ada.update(0.5, 50)  # error -0.5 -> -0.2 -> x0.9
    assert ada.value == pytest.approx(0.102 * 0.9)
    clone = kl_control.AdaptiveKLController(1.0, 1.0, 1)
    clone.load_state_dict(ada.state_dict())
    assert clone == ada
    with pytest.raises(ValueError, match="target_kl"):
        kl_control.AdaptiveKLController(0.1, 0.0, 10)


def test_apply_kl_penalty() -> None:
    scores = torch.tensor([[0.0, 1.0, 0.0]])
    lp, ref = torch.tensor([[0.0, -1.0, -2.0]]), torch.tensor([[0.0, -1.5, -1.0]])
    m = torch.tensor([[False, True, True]])
    r, kl = kl_control.apply_kl_penalty(scores, lp, ref, m, kl_coef=0.1, kind="k1")
    torch.testing.assert_close(kl, torch.tensor([[0.0, 0.5, -1.0]]))
    torch.testing.assert_close(r, torch.tensor([[0.0, 0.95, 0.1]]))
