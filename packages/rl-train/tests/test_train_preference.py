"""Preference losses through the training backends: every loss type trains on 2 gloo ranks (FSDP2)
and reproduces one process on the full batch (pairs intact across accumulation and ranks); one
DeepSpeed run; a micro-batch that splits a pair is refused."""

from pathlib import Path

import pytest
import torch

from rl_train.dist import spawn
from rl_train.preference import PreferenceLossConfig, build_preference_loss, check_pairs
from rl_train.testing import make_pairs, preference_worker
from rl_train.types import ForwardOutput, LossContext

pytestmark = pytest.mark.xdist_group("dist")
LOSSES = ["sigmoid", "ipo", "simpo", "kto", "orpo"]
ENV = {"OMP_NUM_THREADS": "1"}


def _spec(out: Path, model: str, strategy: str, **extra):
    out.mkdir(parents=True, exist_ok=True)
    return dict(strategy=strategy, model=model, out=str(out), pairs=4, steps=3, **extra)


def _history(out: Path, name: str) -> list[dict]:
    return torch.load(out / f"pref_{name}.pt", weights_only=True)["history"]


@pytest.fixture(scope="module")
def single(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("pref_single")
    preference_worker(0, _spec(out, tiny_model_path, "hf_infer", loss_types=LOSSES))
    return out


@pytest.mark.slow
def test_every_loss_type_on_two_fsdp2_ranks_matches_one_process(tiny_model_path, single, tmp_path):
    spawn(
        preference_worker,
        2,
        _spec(tmp_path, tiny_model_path, "fsdp2_train", loss_types=LOSSES),
        env=ENV,
    )
    for name in LOSSES:
        one, two = _history(single, name), _history(tmp_path, name)
        for a, b in zip(one, two, strict=True):
            assert b["actor/loss"] == pytest.approx(a["actor/loss"], rel=1e-4, abs=1e-6), name
            assert b["actor/rewards/margins"] == pytest.approx(
                a["actor/rewards/margins"], rel=1e-3, abs=1e-5
            ), name
        # the same batch three times: the loss goes down, the margin up
        assert two[-1]["actor/loss"] < two[0]["actor/loss"], name
        assert two[-1]["actor/rewards/margins"] > two[0]["actor/rewards/margins"], name
    first = _history(tmp_path, "sigmoid")[0]
    # policy == reference before the first update: every DPO pair loses ln 2
    assert first["actor/loss"] == pytest.approx(0.6931472, abs=1e-6)
    # every pair tied: a coin flip each, and reported as ties
    assert first["actor/rewards/accuracies"] == 0.5 and first["actor/rewards/ties"] == 1.0


@pytest.fixture(scope="module")
def single_sigmoid(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("pref_single_sigmoid")
    preference_worker(0, _spec(out, tiny_model_path, "hf_infer", loss_types=["sigmoid"]))
    return out


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_deepspeed_zero2_dpo_matches_one_process(tiny_model_path, single_sigmoid, tmp_path):
    cfg = {"zero_optimization": {"stage": 2, "overlap_comm": False, "reduce_bucket_size": "auto"}}
    spawn(
        preference_worker,
        2,
        _spec(tmp_path, tiny_model_path, "deepspeed_train", loss_types=["sigmoid"],
              strategy_config=cfg, dump_after=400),
        env=ENV,
    )  # fmt: skip
    for a, b in zip(
        _history(single_sigmoid, "sigmoid"), _history(tmp_path, "sigmoid"), strict=True
    ):
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], rel=1e-4, abs=1e-6)


def test_split_pair_is_refused():
    batch = make_pairs(2)
    rows = {k: v[1:3] for k, v in batch.items()}  # rejected of pair 0 + chosen of pair 1
    with pytest.raises(ValueError, match="whole pairs"):
        check_pairs(rows)
    loss = build_preference_loss(PreferenceLossConfig(loss_type="simpo"))
    out = ForwardOutput(log_probs=torch.zeros(2, rows["input_ids"].shape[1]))
    with pytest.raises(ValueError, match="whole pairs"):
        loss(rows, out, LossContext(global_tokens=1.0, global_seqs=2.0, max_seq_len=4))


def test_dpo_loss_is_the_per_pair_mean_over_the_global_pair_count():
    """Two micro-batches of one pair each, normalised by the global count, add up to the mean."""
    from rl_algos.losses import dpo

    batch = make_pairs(2, seed=3)
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(batch["input_ids"].shape, generator=g)
    batch["ref_logps"] = -torch.rand(4, generator=g) * 5
    loss = build_preference_loss(PreferenceLossConfig(loss_type="sigmoid", beta=0.3))
    ctx = LossContext(global_tokens=1.0, global_seqs=4.0, max_seq_len=1)
    parts = [
        loss(
            {k: v[i : i + 2] for k, v in batch.items()}, ForwardOutput(log_probs=lp[i : i + 2]), ctx
        )
        for i in (0, 2)
    ]
    m = batch["response_mask"].float()
    s = (lp * m).sum(-1)
    want = dpo(s[0::2], s[1::2], batch["ref_logps"][0::2], batch["ref_logps"][1::2], beta=0.3)
    assert float(sum(p[0] for p in parts)) == pytest.approx(float(want.loss()), rel=1e-6)
    acc = sum(float(p[1]["rewards/accuracies"]) for p in parts)
    assert acc == pytest.approx(float(want.stats["reward_accuracy"]))


def test_kto_metrics_average_each_label_over_its_own_rows():
    """KTO's chosen/rejected metrics are means over the desirable / undesirable rows of the whole
    mini-batch (two uneven micro-batches add up to them); they were sums over all rows, so with
    half the rows desirable rewards/chosen read half the desirable rows' mean reward."""
    desirable = torch.tensor([True, False, False, True, True, False])
    policy = torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0, -6.0])
    ref = torch.tensor([-2.0, -1.0, -1.0, -4.5, -4.0, -7.0])  # r = policy - ref
    batch = {
        "response_mask": torch.ones(6, 1, dtype=torch.bool),
        "ref_logps": ref,
        "desirable": desirable,
        "kl_reference": torch.zeros(6),
        "desirable_total": torch.full((6,), 3.0),
    }
    loss = build_preference_loss(PreferenceLossConfig(loss_type="kto", beta=0.5))
    ctx = LossContext(global_tokens=6.0, global_seqs=6.0, max_seq_len=1)
    parts = [  # micro-batches of 2 and 4 rows: 1 and 2 desirable
        loss(
            {k: v[a:b] for k, v in batch.items()}, ForwardOutput(log_probs=policy[a:b, None]), ctx
        )[1]
        for a, b in ((0, 2), (2, 6))
    ]
    got = {k: sum(float(p[k]) for p in parts) for k in parts[0]}
    # r = [1, -1, -2, 0.5, -1, 1]; beta r desirable rows [0.5, 0.25, -0.5], undesirable [-0.5, -1, 0.5]
    assert got["rewards/chosen"] == pytest.approx(0.25 / 3)
    assert got["rewards/rejected"] == pytest.approx(-1.0 / 3)
    assert got["rewards/margins"] == pytest.approx(0.25 / 3 + 1.0 / 3)
    assert got["rewards/accuracies"] == pytest.approx(4 / 6)  # 0.5, 0.25 > 0; -0.5, -1 < 0
    assert got["logps/chosen"] == pytest.approx((-1 - 4 - 5) / 3)
    assert got["logps/rejected"] == pytest.approx((-2 - 3 - 6) / 3)


def _dpo_steps(model_path: str, share: bool, loss_type: str, steps: int = 3):
    """``steps`` train steps of one process on ``make_pairs(4)`` with or without the shared-prompt
    forward: ``(metric history, parameters after)``."""
    from rl_train.preference import sequence_logps
    from rl_train.registry import build_backend

    torch.manual_seed(0)
    backend = build_backend(
        "hf_infer",
        role="actor",
        model_path=model_path,
        training_args=dict(
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            learning_rate=1e-2,
            lr_scheduler_type="constant",
            max_steps=max(steps, 1),
            share_prompt_forward=share,
            # an epsilon above the gradients makes Adam's step about lr * g: with 1e-8 it is
            # lr * sign(g), and float noise in a gradient near 0 (a key bias) flips a full step
            adam_epsilon=1.0,
        ),
        loss_config=PreferenceLossConfig(loss_type=loss_type, beta=0.5),
    )
    batch = make_pairs(4, seed=3)
    ref = backend.forward(batch).log_probs
    assert ref is not None
    batch["ref_logps"] = sequence_logps(ref, batch["response_mask"])[0]
    batch["kl_reference"] = torch.zeros(len(batch["pair_id"]))
    batch["desirable_total"] = batch["desirable"].sum().float().expand(len(batch["pair_id"]))
    history = [backend.train_step(dict(batch)) for _ in range(steps)]
    params = {n: p.detach().clone() for n, p in backend.model.named_parameters()}
    return history, params


@pytest.mark.parametrize("loss_type", ["sigmoid", "orpo"])
def test_a_pairs_shared_prompt_runs_once_and_trains_as_the_plain_forward(
    tiny_model_path, loss_type
):
    """Chosen and rejected of a pair start with the same prompt: with ``share_prompt_forward`` it
    runs once per pair (the plan has one prefix per pair), and three updates end where the plain
    forward's do (the loss, margin and every parameter; ORPO adds a likelihood term)."""
    from rl_train.shared_prefix import plan_prefixes

    pairs = make_pairs(4, seed=3)
    plan = plan_prefixes(pairs["input_ids"], pairs["attention_mask"], pairs["response_mask"])
    assert len(plan.first_rows) == 4 and plan.row_prefix.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    plain, p_plain = _dpo_steps(tiny_model_path, False, loss_type)
    _, start = _dpo_steps(tiny_model_path, False, loss_type, steps=0)
    shared, p_shared = _dpo_steps(tiny_model_path, True, loss_type)
    for a, b in zip(plain, shared, strict=True):
        for key in ("actor/loss", "actor/rewards/margins", "actor/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert plain[-1]["actor/loss"] < plain[0]["actor/loss"]  # it trained
    moved = max(float((p - p0).abs().max()) for p, p0 in zip(p_plain.values(), start.values()))
    assert moved > 1e-3
    for name, p in p_plain.items():
        torch.testing.assert_close(p_shared[name], p, atol=1e-6, rtol=1e-5, msg=name)
