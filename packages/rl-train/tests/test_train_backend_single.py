"""Single-process behaviour of the shared loop (hf_infer backend): alignment, accumulation,
packing, losses, guard, checkpoints and export."""

import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import rl_train
from rl_algos.aggregate import masked_mean
from rl_train import checkpoint as ckpt
from rl_train.args import LogprobSampling
from rl_train.losses import (
    ActorLossConfig,
    CriticLossConfig,
    build_actor_loss,
    build_critic_loss,
)
from rl_train.optim import lr_multiplier
from rl_train.testing import make_batch, nll_loss


def _backend(path, role="actor", **targs):
    base = dict(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        learning_rate=1e-3,
        adam_epsilon=1e-6,
    )
    base.update(targs)
    return rl_train.build_backend("hf_infer", role=role, model_path=path, training_args=base)


def _reference_log_probs(path, batch, temperature=1.0):
    """Plain loop: one HF forward per row on its real tokens, log_softmax(logits / temperature),
    pick the next token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = torch.zeros(batch["input_ids"].shape)
    with torch.no_grad():
        for b in range(batch["input_ids"].shape[0]):
            n = int(batch["attention_mask"][b].sum())
            logits = model(input_ids=batch["input_ids"][b : b + 1, :n]).logits[0]
            logp = torch.log_softmax(logits.float() / temperature, -1)
            for t in range(1, n):
                out[b, t] = logp[t - 1, batch["input_ids"][b, t]]
    return out


@pytest.mark.parametrize("packed", [False, True])
def test_forward_log_probs_equal_direct_hf_forward(tiny_model_path, packed):
    batch = make_batch(5, 20, seed=7)
    backend = _backend(
        tiny_model_path, role="reference", use_sequence_packing=packed, infer_batch_size=2
    )
    out = backend.forward(batch)
    expected = _reference_log_probs(tiny_model_path, batch)
    assert out.log_probs is not None
    torch.testing.assert_close(out.log_probs, expected, atol=2e-5, rtol=1e-5)
    assert torch.all(out.log_probs[:, 0] == 0)


@pytest.mark.parametrize("role", ["reference", "actor"])
@pytest.mark.parametrize("packed", [False, True])
def test_log_probs_at_the_configured_temperature(tiny_model_path, role, packed):
    """`logprob_sampling.temperature` (the rollout's sampling temperature) scales the logits of every
    log-prob forward: the reference's, the actor's no-grad forward and the detached log-probs
    its policy loss reads as `old_log_probs` (ratio exactly 1 on the first pass)."""
    batch = make_batch(4, 18, seed=11)
    backend = _backend(
        tiny_model_path,
        role=role,
        use_sequence_packing=packed,
        logprob_sampling=LogprobSampling(temperature=0.6),
    )
    out = backend.forward(batch)
    assert out.log_probs is not None
    expected = _reference_log_probs(tiny_model_path, batch, temperature=0.6)
    torch.testing.assert_close(out.log_probs, expected, atol=2e-5, rtol=1e-5)
    at_one = _reference_log_probs(tiny_model_path, batch)
    assert (out.log_probs - at_one).abs().max() > 1e-2
    if role == "actor":
        seen: list[torch.Tensor] = []

        def loss_fn(mb, fwd, ctx):
            seen.append(fwd.log_probs.detach().cpu())
            return nll_loss(mb, fwd, ctx)

        backend.train_step(batch, loss_fn, epochs=1)
        got = torch.cat(seen)  # micro-batches in row order (no shuffling)
        torch.testing.assert_close(got * batch["attention_mask"], expected, atol=2e-5, rtol=1e-5)
        # a loss that names its own temperature (a supervised loss: 1) reads log-probs at it
        backend = _backend(tiny_model_path, role=role, use_sequence_packing=packed,
                           logprob_sampling=LogprobSampling(0.6), learning_rate=0.0)  # fmt: skip
        seen.clear()
        loss_fn.logprob_sampling = LogprobSampling()  # type: ignore[attr-defined]
        backend.train_step(batch, loss_fn, epochs=1)
        got = torch.cat(seen) * batch["attention_mask"]
        torch.testing.assert_close(got, at_one, atol=2e-5, rtol=1e-5)


def test_logprob_temperature_must_be_positive(tiny_model_path):
    with pytest.raises(ValueError, match="logprob_sampling.temperature"):
        _backend(tiny_model_path, logprob_sampling={"temperature": 0.0})


def test_critic_values_aligned_and_packed_equal(tiny_model_path):
    batch = make_batch(4, 16, seed=2)
    plain = _backend(tiny_model_path, role="critic").forward(batch).values
    packed = (
        _backend(tiny_model_path, role="critic", use_sequence_packing=True).forward(batch).values
    )
    assert plain is not None and packed is not None
    torch.testing.assert_close(plain, packed, atol=1e-5, rtol=1e-5)
    assert torch.all(plain[:, 0] == 0)
    assert torch.all(plain[batch["attention_mask"] == 0] == 0)


def _params(backend):
    return {n: t.clone() for b in backend.iter_full_tensor_buckets(1 << 16) for n, t in b}


def _max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_accumulation_dynamic_batching_and_packing_match_full_batch(tiny_model_path):
    batches = [make_batch(8, 20, seed=s) for s in range(2)]
    ref = _backend(tiny_model_path, per_device_train_batch_size=8, gradient_accumulation_steps=1)
    variants = [
        _backend(tiny_model_path, per_device_train_batch_size=2, gradient_accumulation_steps=4),
        _backend(
            tiny_model_path,
            per_device_train_batch_size=8,
            gradient_accumulation_steps=1,
            use_dynamic_batching=True,
            max_tokens_per_microbatch=40,
            use_sequence_packing=True,
        ),
    ]
    for batch in batches:
        m_ref = ref.train_step(batch, nll_loss)
        for v in variants:
            m = v.train_step(batch, nll_loss)
            assert m["actor/loss"] == pytest.approx(m_ref["actor/loss"], rel=1e-5)
    p_ref = _params(ref)
    for v in variants:
        assert _max_diff(p_ref, _params(v)) < 2e-5
    assert _max_diff(p_ref, _params(_backend(tiny_model_path))) > 1e-4  # training moved weights


def test_ppo_epochs_and_mini_batches_count_optimizer_steps(tiny_model_path):
    backend = _backend(
        tiny_model_path, per_device_train_batch_size=2, gradient_accumulation_steps=2, ppo_epochs=3
    )
    metrics = backend.train_step(make_batch(8, 12), nll_loss)
    assert metrics["actor/optimizer_steps"] == 6.0  # 3 epochs x (8 samples / 4 per mini-batch)
    assert backend.global_step == 6
    # a supervised pass (warm-up) asks for one epoch whatever ppo_epochs says
    assert backend.train_step(make_batch(8, 12), nll_loss, epochs=1)["actor/optimizer_steps"] == 2
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        backend.train_step(make_batch(8, 12), nll_loss, epochs=0)


def test_a_mini_batch_without_a_trainable_token_takes_no_optimizer_step(tiny_model_path):
    """Every response masked out (e.g. max_len_mask with all responses truncated): the loss and
    its gradients are 0, yet an AdamW step still moved the weights (its momentum from the last
    step, and weight decay). Such a mini-batch is now skipped whole and counted."""
    backend = _backend(tiny_model_path, per_device_train_batch_size=2,
                       gradient_accumulation_steps=2, weight_decay=0.1)  # fmt: skip
    backend.train_step(make_batch(4, 12), nll_loss)  # momentum is non-zero from here on
    before = _params(backend)
    empty = make_batch(8, 12, seed=1)
    empty["response_mask"] = torch.zeros_like(empty["response_mask"])
    m = backend.train_step(empty, nll_loss)
    assert _max_diff(before, _params(backend)) == 0.0
    assert m["actor/optimizer_steps"] == 0.0 and m["actor/empty_mini_batches"] == 2.0
    assert backend.global_step == 1
    half = make_batch(8, 12, seed=2)  # mini-batch 1 (rows 0-3) empty, mini-batch 2 trains
    half["response_mask"][:4] = False
    m = backend.train_step(half, nll_loss)
    assert m["actor/optimizer_steps"] == 1.0 and m["actor/empty_mini_batches"] == 1.0
    assert backend.global_step == 2 and _max_diff(before, _params(backend)) > 0.0


def test_actor_loss_on_policy_ppo_equals_minus_mean_advantage(tiny_model_path):
    batch = make_batch(6, 16, seed=4)
    loss_fn = build_actor_loss(
        ActorLossConfig(policy_loss="ppo", loss_agg_mode="token-mean", entropy_loss_coef=0.0)
    )
    backend = _backend(
        tiny_model_path, per_device_train_batch_size=3, gradient_accumulation_steps=2
    )
    old = backend.forward(batch).log_probs
    metrics = backend.train_step({**batch, "old_log_probs": old}, loss_fn)
    # ratio == 1 at the first step: L = -sum(A m) / sum(m) over the whole mini-batch
    expected = -masked_mean(batch["advantages"], batch["response_mask"]).item()
    assert metrics["actor/pg_loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert metrics["actor/clip_frac"] == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("ppo_epochs", "accumulation", "shuffle"),
    [(1, 3, False), (2, 3, False), (1, 1, False), (1, 1, True), (2, 1, True)],
    ids=["one-step", "epochs", "minis", "minis-shuffled", "epochs-minis-shuffled"],
)
def test_policy_loss_without_old_log_probs_equals_the_old_policy_forward(
    tiny_model_path, ppo_epochs, accumulation, shuffle
):
    """A batch without `old_log_probs` trains exactly like one that carries the policy's no-grad
    forward from before the call: the first optimizer step takes the detached training log-probs
    (no extra pass), the later mini-batches of one pass get the forward before that step, and
    several epochs get it for the whole batch. Before, every step compared against the current
    weights (ratio 1: no clipping after the first step)."""
    batch = make_batch(6, 16, seed=4)
    loss_cfg = ActorLossConfig(
        policy_loss="ppo_clip", clip_ratio_low=0.05, clip_ratio_high=0.05, entropy_loss_coef=0.0
    )
    runs = []
    for explicit in (True, False):
        backend = _backend(
            tiny_model_path,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=accumulation,
            ppo_epochs=ppo_epochs,
            learning_rate=3e-3,
            shuffle_mini_batches=shuffle,
        )
        loss_fn = build_actor_loss(loss_cfg)
        data = {**batch, "old_log_probs": backend.forward(batch).log_probs} if explicit else batch
        runs.append((backend.train_step(dict(data), loss_fn), _params(backend)))
    (m_explicit, p_explicit), (m_implicit, p_implicit) = runs
    steps = ppo_epochs * (6 // (2 * accumulation))
    assert m_explicit["actor/optimizer_steps"] == m_implicit["actor/optimizer_steps"] == steps
    assert _max_diff(p_explicit, p_implicit) < 1e-6
    assert m_implicit["actor/clip_frac"] == pytest.approx(m_explicit["actor/clip_frac"], abs=1e-6)
    if steps > 1:
        assert (
            m_implicit["actor/clip_frac"] > 0
        )  # the later steps are clipped against the old policy


@pytest.mark.parametrize(
    ("ppo_epochs", "accumulation", "forwarded"),
    [(1, 3, []), (1, 1, [4]), (2, 1, [6]), (2, 3, [6])],
    ids=["one-step", "three-minis", "epochs", "epochs-one-mini"],
)
def test_the_old_policy_forward_skips_the_first_mini_batch_of_one_pass(
    tiny_model_path, monkeypatch, ppo_epochs, accumulation, forwarded
):
    """The implicit old-policy forward covers only the rows that train after the first optimizer
    step: none with one step, the later mini-batches (4 of 6 rows here) with one pass over
    several, the whole batch with several epochs (every row trains again)."""
    backend = _backend(
        tiny_model_path,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulation,
        ppo_epochs=ppo_epochs,
        shuffle_mini_batches=True,
    )
    rows: list[int] = []
    real_forward = backend.forward

    def counting_forward(batch):
        rows.append(int(batch["input_ids"].shape[0]))
        return real_forward(batch)

    monkeypatch.setattr(backend, "forward", counting_forward)
    loss_fn = build_actor_loss(ActorLossConfig(policy_loss="ppo_clip", entropy_loss_coef=0.0))
    metrics = backend.train_step(make_batch(6, 12, seed=3), loss_fn)
    assert rows == forwarded
    assert metrics["actor/optimizer_steps"] == ppo_epochs * 6 // (2 * accumulation)


def test_implicit_old_log_probs_only_for_policy_losses(tiny_model_path, monkeypatch):
    """Another loss (SFT, preference) never pays for an old-policy forward."""
    backend = _backend(
        tiny_model_path, per_device_train_batch_size=2, gradient_accumulation_steps=1
    )
    monkeypatch.setattr(backend, "forward", lambda batch: pytest.fail("unexpected forward"))
    assert backend.train_step(make_batch(6, 12), nll_loss)["actor/optimizer_steps"] == 3.0


def test_policy_loss_reports_train_inference_mismatch(tiny_model_path):
    batch = make_batch(4, 12, seed=2)
    backend = _backend(
        tiny_model_path, per_device_train_batch_size=4, gradient_accumulation_steps=1
    )
    old = backend.forward(batch).log_probs
    assert old is not None
    shift = 0.1 * batch["response_mask"]  # the engine gave every response token e^0.1 the mass
    metrics = backend.train_step(
        {**batch, "rollout_log_probs": old + shift}, build_actor_loss(ActorLossConfig())
    )
    # k1 = mean(log pi_rollout - log pi_train) over response tokens
    assert metrics["actor/mismatch_k1"] == pytest.approx(0.1, abs=1e-4)
    assert metrics["actor/mismatch_abs_log_ratio"] == pytest.approx(0.1, abs=1e-4)


def test_critic_train_step_reduces_value_loss(tiny_model_path):
    batch = make_batch(4, 12, seed=5)
    batch["returns"] = torch.ones(4, 12) * batch["response_mask"]
    backend = _backend(
        tiny_model_path,
        role="critic",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        learning_rate=3e-3,
    )
    loss_fn = build_critic_loss(CriticLossConfig(value_clip=None))
    first = backend.train_step(batch, loss_fn)["critic/vf_loss"]
    for _ in range(5):
        last = backend.train_step(batch, loss_fn)["critic/vf_loss"]
    assert last < first


def test_nonfinite_loss_skips_step_and_k_consecutive_raise(tiny_model_path):
    backend = _backend(tiny_model_path, max_consecutive_nonfinite=2)
    before = _params(backend)
    bad = make_batch(8, 12)
    bad["advantages"][1, 5] = float("nan")

    def loss_fn(mb, out, ctx):
        loss, m = nll_loss(mb, out, ctx)
        w = masked_mean(mb["advantages"], mb["response_mask"])
        return loss + 0.0 * w, m

    m = backend.train_step(bad, loss_fn)
    assert m["actor/skipped_steps"] == 1.0 and math.isnan(m["actor/grad_norm"])
    assert _max_diff(before, _params(backend)) == 0.0
    assert backend.train_step(make_batch(8, 12), loss_fn)["actor/skipped_steps"] == 0.0
    backend.train_step(bad, loss_fn)
    with pytest.raises(rl_train.NonFiniteTrainingError, match="2 optimizer steps in a row"):
        backend.train_step(bad, loss_fn)


def test_lr_schedules_hand_values():
    args = rl_train.parse_training_args(
        {"lr_scheduler_type": "cosine", "warmup_steps": 4, "max_steps": 14}
    )
    assert lr_multiplier(0, args) == pytest.approx(1 / 5)
    assert lr_multiplier(3, args) == pytest.approx(4 / 5)
    assert lr_multiplier(4, args) == pytest.approx(1.0)
    assert lr_multiplier(9, args) == pytest.approx(0.5)  # half-way through the cosine
    assert lr_multiplier(14, args) == pytest.approx(0.0)
    lin = rl_train.parse_training_args({"lr_scheduler_type": "linear", "max_steps": 10})
    assert lr_multiplier(5, lin) == pytest.approx(0.5)


def test_training_args_errors_name_the_field():
    with pytest.raises(ValueError, match="training_args.per_device_train_batch_size"):
        rl_train.parse_training_args({"per_device_train_batch_size": 1.5})
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        rl_train.parse_training_args({"lr_scheduler_type": "exp"})
    assert rl_train.parse_training_args({"output_dir": "x", "ppo_epochs": 2}).ppo_epochs == 2


def test_checkpoint_resume_is_bit_exact_and_falls_back(tiny_model_path, tmp_path):
    batches = [make_batch(8, 14, seed=10 + s) for s in range(4)]
    straight = _backend(tiny_model_path, lr_scheduler_type="cosine", warmup_steps=1, max_steps=4)
    for b in batches:
        straight.train_step(b, nll_loss)
    first = _backend(tiny_model_path, lr_scheduler_type="cosine", warmup_steps=1, max_steps=4)
    for s, b in enumerate(batches[:2]):
        first.train_step(b, nll_loss)
        first.save_checkpoint(tmp_path, s + 1, {"epoch": s})
    (tmp_path / ".tmp-step-000009").mkdir()  # a crashed save is never picked
    assert [p.name for p in ckpt.committed_checkpoints(tmp_path)] == [
        "step-000002",
        "step-000001",
    ]
    resumed = _backend(tiny_model_path, lr_scheduler_type="cosine", warmup_steps=1, max_steps=4)
    step, extra = resumed.load_checkpoint(tmp_path)
    assert (step, extra) == (2, {"epoch": 1})
    for b in batches[2:]:
        resumed.train_step(b, nll_loss)
    assert _max_diff(_params(straight), _params(resumed)) == 0.0

    # truncate a shard of the newest checkpoint: reported by name, previous one used
    shard = next((tmp_path / "step-000002" / "model_optim").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    again = _backend(tiny_model_path)
    step, _ = again.load_checkpoint(tmp_path)
    assert step == 1
    report = again.last_load_report
    assert report is not None and report.loaded.name == "step-000001"
    assert shard.name in report.rejected[0][1] and "truncated" in report.rejected[0][1]
    shutil.rmtree(tmp_path / "step-000001")
    with pytest.raises(rl_train.CheckpointError, match=shard.name):
        _backend(tiny_model_path).load_checkpoint(tmp_path)


def _adam_state(backend: Any) -> list[dict]:
    return [backend.optimizer.state[p] for p in backend.model.parameters()]


def test_resume_takes_the_configured_optimizer_and_schedule_settings(
    tiny_model_path, tmp_path, resumed_training_settings
):
    """A checkpoint keeps what training accumulated (Adam's moments and step counts, the
    schedule's position); every setting the resuming config gives (rate, betas, epsilon,
    weight decay, schedule type, warm-up, floor, horizon) is that config's, from the first
    step after the load on."""
    batches = [make_batch(8, 14, seed=10 + s) for s in range(3)]
    first = _backend(tiny_model_path, lr_scheduler_type="cosine", warmup_steps=1, max_steps=4)
    for b in batches[:2]:
        first.train_step(b, nll_loss)
    first.save_checkpoint(tmp_path, 2)
    resumed: Any = _backend(tiny_model_path, **resumed_training_settings)
    assert resumed.load_checkpoint(tmp_path)[0] == 2
    groups = resumed.optimizer.param_groups
    # linear decay from 1e-4 to the floor 0.5e-4 over 10 steps, at position 2: 0.5 + 0.5 * 0.8
    assert [g["lr"] for g in groups] == pytest.approx([0.9e-4, 0.9e-4])
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert [(g["betas"], g["eps"]) for g in groups] == [((0.8, 0.99), 1e-7)] * 2
    assert resumed.scheduler.last_epoch == 2 and resumed.scheduler.base_lrs == [1e-4, 1e-4]
    for saved, loaded in zip(_adam_state(first), _adam_state(resumed), strict=True):
        assert saved.keys() == loaded.keys()
        assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    # the step after the load ran at 0.9e-4 and leaves the rate of position 3: 0.5 + 0.5 * 0.7
    assert resumed.train_step(batches[2], nll_loss)["actor/lr"] == pytest.approx(0.85e-4)


def test_an_optimizer_without_state_is_checkpointed_without_one(
    tiny_model_path, tmp_path, monkeypatch
):
    """An optimizer holding no state at a save (before its first step, or cleared as a restarted
    schedule does after a warm-up, its gradients left over) is saved as none: the save leaves it
    as it was (DCP would otherwise step it at rate 0 into zero moments, changing the updates
    that follow), the resumed run trains exactly as the uninterrupted one, and a checkpoint
    written before this (the groups' settings but no state) loads too."""
    from rl_train.backends import dcp_io

    batches = [make_batch(8, 14, seed=20 + s) for s in range(3)]

    def fresh() -> Any:
        return _backend(tiny_model_path, lr_scheduler_type="cosine", warmup_steps=1, max_steps=4)

    def warmed_up() -> Any:  # one step, then the optimizer's state forgotten; gradients left
        backend = fresh()
        backend.train_step(batches[0], nll_loss)
        backend.optimizer.state.clear()
        return backend

    def trained(backend):
        for b in batches[1:]:
            backend.train_step(b, nll_loss)
        return _params(backend)

    unsaved = trained(warmed_up())
    saved = warmed_up()
    saved.save_checkpoint(tmp_path / "restart", 1)
    assert not saved.optimizer.state
    assert _max_diff(trained(saved), unsaved) == 0.0
    resumed = fresh()
    resumed.load_checkpoint(tmp_path / "restart")
    assert not resumed.optimizer.state
    assert _max_diff(trained(resumed), unsaved) == 0.0

    never_stepped = fresh()
    never_stepped.save_checkpoint(tmp_path / "fresh", 0)
    assert not never_stepped.optimizer.state
    trained(never_stepped)
    assert _max_diff(_params(never_stepped), trained(fresh())) == 0.0

    monkeypatch.setattr(dcp_io, "_has_optimizer_state", lambda backend: True)
    warmed_up().save_checkpoint(tmp_path / "groups_only", 1)  # as saved before the fix
    monkeypatch.undo()
    resumed = fresh()
    resumed.load_checkpoint(tmp_path / "groups_only")
    assert _max_diff(trained(resumed), unsaved) == 0.0


def test_export_hf_loads_in_transformers(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    backend = _backend(tiny_model_path)
    backend.train_step(make_batch(8, 12), nll_loss)
    out = backend.export_hf(tmp_path / "hf")
    assert (Path(out) / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    AutoTokenizer.from_pretrained(out)
    batch = make_batch(3, 10, seed=9)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None])[
        ..., 0
    ]
    ours = backend.forward(batch).log_probs
    assert ours is not None
    mask = batch["attention_mask"][:, 1:].bool()
    torch.testing.assert_close(ours[:, 1:][mask], lp[mask], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("world", "cfg", "compute", "weights", "trained", "wrapped"),
    [
        (1, {}, "fp32", "fp32", True, False),  # the CPU defaults: nothing to shard or cast
        (2, {}, "fp32", "fp32", True, True),  # two ranks shard
        (1, {"cpu_offload": True}, "fp32", "fp32", True, True),
        (1, {}, "bf16", "fp32", True, True),  # fp32 master weights, bf16 compute
        (1, {"param_dtype": "bf16"}, "fp32", "fp32", True, True),
        (1, {"reduce_dtype": "bf16"}, "fp32", "fp32", True, True),  # gradients cast
        (1, {"reduce_dtype": "bf16"}, "fp32", "fp32", False, False),  # a reference has none
        (1, {}, "bf16", "bf16", False, False),  # a bf16 reference loads and computes in bf16
        (1, {"reshard_after_forward": False, "keep_last": 2}, "fp32", "fp32", True, False),
    ],
)
def test_fsdp2_wraps_only_when_it_changes_the_training(
    world, cfg, compute, weights, trained, wrapped
):
    from rl_train.backends.native import fsdp2_changes_training
    from rl_train.modeling import DTYPES

    assert (
        fsdp2_changes_training(world, cfg, DTYPES[compute], DTYPES[weights], trained=trained)
        is wrapped
    )


@pytest.mark.parametrize(
    ("saved_shape", "error"),
    [
        ({"num_layers": 3}, r"holds another model .*: 12 parameters this model lacks \(first "),
        ({"num_layers": 1}, r"holds another model .*: 12 of this model's parameters missing"),
        ({"intermediate_size": 512}, r"6 of another shape \(first .*mlp.*: \[512, 128\] saved"),
    ],
)
def test_a_checkpoint_of_another_model_is_refused_before_anything_loads(
    tiny_model_path, tmp_path, saved_shape, error
):
    """DCP loads only the keys the model asks for: a deeper model's checkpoint loaded silently
    into this model's layers, and a shallower one or another width ended in DCP's bare "Missing
    key" / size error. Each is one CheckpointError naming the first differing parameter, and
    the model keeps its weights."""
    from rl_rollout.tiny_model import build_tiny_model

    other = build_tiny_model(tmp_path / "other_model", **saved_shape)
    _backend(str(other)).save_checkpoint(tmp_path / "ckpt", 1)
    here = _backend(tiny_model_path)
    before = _params(here)
    with pytest.raises(rl_train.CheckpointError, match=error):
        here.load_checkpoint(tmp_path / "ckpt")
    assert _max_diff(before, _params(here)) == 0.0


def test_a_weight_sync_sends_a_tied_lm_head_once(tiny_model_path, tmp_path):
    """The tiny model ties its LM head to the embedding: a weight sync (``tied_once``) sends that
    tensor once, under its first name; every other name and tensor as the full listing. An
    engine holding the same tied model takes it whole (the copy into the embedding is the head's
    too); an untied model loses nothing."""
    from rl_rollout.hf_engine import HFEngine
    from rl_rollout.tiny_model import build_tiny_model

    backend = rl_train.build_backend(
        "hf_infer",
        role="actor",
        model_path=tiny_model_path,
        training_args=dict(per_device_train_batch_size=1, max_steps=1),
    )
    with torch.no_grad():  # a policy the engine does not hold yet
        for p in backend.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    every = {n: t.clone() for b in backend.iter_full_tensor_buckets(1 << 16) for n, t in b}
    once = {n: t for b in backend.iter_full_tensor_buckets(1 << 16, tied_once=True) for n, t in b}
    assert backend.tied_aliases() == {"lm_head.weight"}
    assert set(every) - set(once) == {"lm_head.weight"}
    assert torch.equal(every["lm_head.weight"], every["model.embed_tokens.weight"])
    for name, tensor in once.items():
        assert torch.equal(tensor, every[name]), name

    engine = HFEngine(tiny_model_path, device="cpu")
    try:
        engine.update_weights(list(once.items()), version=1)
        held = engine.model.state_dict()
    finally:
        engine.shutdown()
    for name, tensor in every.items():  # the head too, through the tie
        torch.testing.assert_close(held[name], tensor.to(held[name].dtype), rtol=0, atol=0)

    untied = build_tiny_model(tmp_path / "untied", tie_word_embeddings=False)
    plain = rl_train.build_backend(
        "hf_infer",
        role="actor",
        model_path=str(untied),
        training_args=dict(per_device_train_batch_size=1, max_steps=1),
    )
    assert plain.tied_aliases() == frozenset()
    names = [n for b in plain.iter_full_tensor_buckets(1 << 16, tied_once=True) for n, _ in b]
    assert "lm_head.weight" in names and len(names) == len(set(names)) == len(every)
