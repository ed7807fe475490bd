"""Real 2-rank gloo runs (torch.multiprocessing spawn): FSDP2 and DeepSpeed ZeRO-2/3 reproduce
single-process training, log-probs match HF, NaN skips on all ranks, bit-exact resume, fallback."""

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_train.backends.native import fsdp2_averages_over_gloo
from rl_train.dist import spawn
from rl_train.testing import train_worker

pytestmark = pytest.mark.xdist_group("dist")

# torch < 2.10 (vllm-ascend 0.11's 2.7.1): fsdp2_train with several gloo ranks is refused (FSDP2
# summed their gradients there; test_train_fsdp2_torch_floor.py tests the refusal)
FSDP2_ON_GLOO_RANKS = pytest.mark.skipif(
    not fsdp2_averages_over_gloo(),
    reason="fsdp2_train with several gloo ranks is refused on torch < 2.10 (summed gradients)",
)
ENV = {"OMP_NUM_THREADS": "1"}
ZERO2 = {
    "zero_optimization": {"stage": 2, "overlap_comm": False, "reduce_bucket_size": "auto"},
    "bf16": {"enabled": "auto"},
}
ZERO0 = {"zero_optimization": {"stage": 0}}  # a plain optimizer step (rl_train.backends.deepspeed)
ZERO3 = {
    "zero_optimization": {
        "stage": 3,
        "stage3_param_persistence_threshold": "auto",
        "stage3_prefetch_bucket_size": "auto",
    }
}


def _spec(
    out: Path, model: str, strategy: str, cfg: dict, world: int, steps: int = 2, **extra
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    return dict(
        strategy=strategy,
        steps=steps,
        out=str(out),
        batch=extra.pop("batch", dict(n=8, max_len=20)),
        kwargs=dict(
            role="actor",
            model_path=model,
            strategy_config=cfg,
            training_args=dict(
                per_device_train_batch_size=2,
                gradient_accumulation_steps=4 // world,
                learning_rate=1e-3,
                adam_epsilon=1e-6,
                lr_scheduler_type="cosine",
                warmup_steps=1,
                max_steps=4,
            ),
        ),
        **extra,
    )


def _result(out: Path, rank: int = 0):
    return torch.load(out / f"result_rank{rank}.pt", weights_only=True)


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def single_run(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    train_worker(0, _spec(out, tiny_model_path, "hf_infer", {}, 1, forward_check=True))
    return out


def _check_matches_single(single: Path, multi: Path):
    a, b = _result(single), _result(multi)
    for ha, hb in zip(a["history"], b["history"], strict=True):
        assert hb["actor/loss"] == pytest.approx(ha["actor/loss"], rel=1e-5)
        assert hb["actor/grad_norm"] == pytest.approx(ha["actor/grad_norm"], rel=1e-3)
    assert _max_diff(a["params"], b["params"]) < 1e-5


@FSDP2_ON_GLOO_RANKS
@pytest.mark.parametrize("cfg", [{}, {"fused_lm_head": True}], ids=["logits", "fused_head"])
def test_fsdp2_two_ranks_match_single_process_and_hf_log_probs(
    tiny_model_path, single_run, tmp_path, cfg
):
    spawn(
        train_worker,
        2,
        _spec(tmp_path, tiny_model_path, "fsdp2_train", cfg, 2, forward_check=True),
        env=ENV,
    )
    _check_matches_single(single_run, tmp_path)
    # each rank's forward of its rows equals the single-process forward of those rows
    full = torch.load(single_run / "forward_rank0.pt", weights_only=True)["log_probs"]
    r0 = torch.load(tmp_path / "forward_rank0.pt", weights_only=True)["log_probs"]
    r1 = torch.load(tmp_path / "forward_rank1.pt", weights_only=True)["log_probs"]
    torch.testing.assert_close(
        torch.cat([r0, r1]), torch.cat([full[:4], full[4:]]), atol=2e-5, rtol=1e-5
    )


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [{}, ZERO0], ids=["no_zero_section", "zero0"])
def test_deepspeed_without_zero_one_rank_matches_single_process(
    tiny_model_path, single_run, tmp_path, cfg
):
    """ZeRO stage 0 (the default without a zero_optimization section) in fp32 steps a plain torch
    optimizer, whose norm DeepSpeed does not report: the step ran, with the single process's
    gradient norm (clipped by max_grad_norm as there), and trained the same weights."""
    spawn(train_worker, 1, _spec(tmp_path, tiny_model_path, "deepspeed_train", cfg, 1), env=ENV)
    _check_matches_single(single_run, tmp_path)
    assert [h["actor/skipped_steps"] for h in _result(tmp_path)["history"]] == [0.0, 0.0]


def test_fsdp2_one_rank_trains_the_plain_module_bit_exactly(tiny_model_path, single_run, tmp_path):
    """One rank has nothing to shard: fsdp2_train trains the module without FSDP2's hooks
    (rl_train.backends.native), with the single-process hf_infer run's results to the bit."""
    spawn(train_worker, 1, _spec(tmp_path, tiny_model_path, "fsdp2_train", {}, 1), env=ENV)
    plain, single = _result(tmp_path), _result(single_run)
    assert plain["fsdp_wrapped"] is False and single["fsdp_wrapped"] is False
    timing = "actor/response_tokens_per_s"
    assert [{k: v for k, v in h.items() if k != timing} for h in plain["history"]] == [
        {k: v for k, v in h.items() if k != timing} for h in single["history"]
    ]
    assert _max_diff(plain["params"], single["params"]) == 0.0


@pytest.mark.slow
def test_two_rank_fsdp2_checkpoint_resumes_on_one_unwrapped_rank(tiny_model_path, tmp_path):
    """Sharded and unwrapped models save and load the same DCP checkpoint: one unwrapped rank
    loads what two FSDP2 ranks saved (model and Adam's moments, gathered on load) and continues
    as the two ranks would have."""
    ck = tmp_path / "ckpt"
    two = dict(strategy="fsdp2_train", cfg={}, world=2)
    spawn(train_worker, 2, _spec(tmp_path / "straight", tiny_model_path, **two, steps=4), env=ENV)
    spawn(
        train_worker,
        2,
        _spec(tmp_path / "first", tiny_model_path, **two, steps=2, save_at=2, ckpt_root=str(ck)),
        env=ENV,
    )
    one = dict(strategy="fsdp2_train", cfg={}, world=1)
    spawn(
        train_worker,
        1,
        _spec(tmp_path / "resumed", tiny_model_path, **one, steps=4, resume_from=str(ck)),
        env=ENV,
    )
    straight, resumed = _result(tmp_path / "straight"), _result(tmp_path / "resumed")
    assert straight["fsdp_wrapped"] is True and resumed["fsdp_wrapped"] is False
    assert resumed["load_report"]["loaded"] == "step-000002"
    assert len(resumed["history"]) == 2
    for a, b in zip(straight["history"][2:], resumed["history"], strict=True):
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], rel=1e-5)
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-3)
    assert _max_diff(straight["params"], resumed["params"]) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(
    "cfg",
    [ZERO0, ZERO2, ZERO3, {**ZERO3, "fused_lm_head": True}],
    ids=["zero0", "zero2", "zero3", "zero3_fused_head"],
)
def test_deepspeed_two_ranks_match_single_process(tiny_model_path, single_run, tmp_path, cfg):
    spawn(train_worker, 2, _spec(tmp_path, tiny_model_path, "deepspeed_train", cfg, 2), env=ENV)
    _check_matches_single(single_run, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,cfg",
    [("fsdp2_train", {}), ("deepspeed_train", ZERO2), ("deepspeed_train", ZERO0)],
    ids=["fsdp2", "zero2", "zero0"],
)
def test_nan_on_one_rank_skips_step_on_both(tiny_model_path, tmp_path, strategy, cfg):
    spawn(
        train_worker,
        2,
        _spec(
            tmp_path,
            tiny_model_path,
            strategy,
            cfg,
            2,
            steps=3,
            nan_steps=[1],
            nan_rank=1,
            all_ranks_write=True,
        ),
        env=ENV,
    )
    for rank in (0, 1):
        hist = _result(tmp_path, rank)["history"]
        assert [h["actor/skipped_steps"] for h in hist] == [0.0, 1.0, 0.0]
        assert hist[-1]["actor/nonfinite_total"] == 1.0
        assert hist[-1]["actor/global_step"] == 2.0
    assert _max_diff(_result(tmp_path, 0)["params"], _result(tmp_path, 1)["params"]) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,cfg",
    [("deepspeed_train", ZERO2), ("deepspeed_train", ZERO0)],
    ids=["zero2", "zero0"],  # DeepSpeed keeps its own step counts; FSDP2: the core test
)
def test_a_step_without_a_trainable_token_is_as_if_it_never_came(
    tiny_model_path, tmp_path, strategy, cfg
):
    """A batch with every response masked out, on both ranks: skipped whole, so the weights,
    the optimizer's moments, DeepSpeed's micro-step count and the lr schedule after the next
    step are those of a run that never saw it (AdamW stepped on zero gradients before)."""
    runs = {"empty": dict(empty_steps=[1]), "omitted": dict(omit_steps=[1])}
    for name, extra in runs.items():
        spec = _spec(tmp_path / name, tiny_model_path, strategy, cfg, 2, steps=3, **extra)
        spawn(train_worker, 2, spec, env=ENV)
    empty, omitted = _result(tmp_path / "empty"), _result(tmp_path / "omitted")
    assert [h["actor/optimizer_steps"] for h in empty["history"]] == [1.0, 0.0, 1.0]
    assert empty["history"][1]["actor/empty_mini_batches"] == 1.0
    assert empty["history"][-1]["actor/global_step"] == 2.0
    assert empty["history"][-1]["actor/lr"] == omitted["history"][-1]["actor/lr"]
    assert _max_diff(empty["params"], omitted["params"]) == 0.0


@pytest.mark.slow
def test_fsdp2_resume_bit_exact_and_truncated_shard_falls_back(tiny_model_path, tmp_path):
    ck = tmp_path / "ckpt"
    spawn(
        train_worker,
        2,
        _spec(tmp_path / "straight", tiny_model_path, "fsdp2_train", {}, 2, steps=4),
        env=ENV,
    )
    # the first job saves at steps 1 and 2, then its processes exit ("killed")
    spawn(
        train_worker,
        2,
        _spec(
            tmp_path / "first",
            tiny_model_path,
            "fsdp2_train",
            {},
            2,
            steps=2,
            save_at=[1, 2],
            ckpt_root=str(ck),
        ),
        env=ENV,
    )
    spawn(
        train_worker,
        2,
        _spec(
            tmp_path / "resumed",
            tiny_model_path,
            "fsdp2_train",
            {},
            2,
            steps=4,
            resume_from=str(ck),
        ),
        env=ENV,
    )
    straight, resumed = _result(tmp_path / "straight"), _result(tmp_path / "resumed")
    assert _max_diff(straight["params"], resumed["params"]) == 0.0
    assert len(resumed["history"]) == 2

    # the older complete checkpoint, and the newer one with its rank-1 shard truncated
    shard = ck / "step-000002" / "model_optim" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    spawn(
        train_worker,
        2,
        _spec(
            tmp_path / "fallback",
            tiny_model_path,
            "fsdp2_train",
            {},
            2,
            steps=4,
            resume_from=str(ck),
        ),
        env=ENV,
    )
    fallback = _result(tmp_path / "fallback")
    assert fallback["load_report"]["loaded"] == "step-000001"
    ((rejected_name, reason),) = fallback["load_report"]["rejected"]
    assert rejected_name == "step-000002" and "__1_0.distcp" in reason and "truncated" in reason
    # resuming from step 1 (three more steps) reproduces the straight run too
    assert _max_diff(straight["params"], fallback["params"]) == 0.0
    assert len(fallback["history"]) == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,cfg", [("fsdp2_train", {}), ("deepspeed_train", ZERO2)], ids=["fsdp2", "zero2"]
)
def test_two_rank_resume_takes_the_configured_settings_and_loads_a_stateless_optimizer(
    tiny_model_path, tmp_path, strategy, cfg, resumed_training_settings
):
    """Two ranks: a checkpoint written when the optimizer held no state (dropped after step 2,
    as a schedule restarted after a warm-up drops it) resumes, with no state; one with state
    resumes with it. Either way the optimizer's settings are the resuming config's (rate at
    the schedule's checkpointed position, betas, epsilon, weight decay), not the checkpoint's."""
    ck = tmp_path / "ckpt"
    first = _spec(tmp_path / "first", tiny_model_path, strategy, cfg, 2, steps=2,
                  save_at=[1, 2], ckpt_root=str(ck), forget_optimizer_state_at=[2])  # fmt: skip
    spawn(train_worker, 2, first, env=ENV)

    def resume(name: str) -> dict:
        spec = _spec(tmp_path / name, tiny_model_path, strategy, cfg, 2, steps=3,
                     resume_from=str(ck))  # fmt: skip
        spec["kwargs"]["training_args"].update(resumed_training_settings)
        spawn(train_worker, 2, spec, env=ENV)
        return _result(tmp_path / name)

    def settings(lr: float) -> list[dict]:
        common = dict(lr=pytest.approx(lr), betas=(0.8, 0.99), eps=1e-7)
        return [dict(common, weight_decay=0.1), dict(common, weight_decay=0.0)]

    stateless = resume("from_step_2")
    assert stateless["load_report"]["loaded"] == "step-000002"
    # linear decay from 1e-4 to the floor 0.5e-4 over 10 steps: position 2 -> 0.9e-4
    assert stateless["load_report"]["optimizer"] == {"groups": settings(0.9e-4), "states": 0}
    assert [h.get("error") for h in stateless["history"]] == [None]

    shutil.rmtree(ck / "step-000002")
    with_state = resume("from_step_1")
    assert with_state["load_report"]["loaded"] == "step-000001"
    loaded = with_state["load_report"]["optimizer"]
    assert loaded["groups"] == settings(0.95e-4) and loaded["states"] > 0
    assert [h.get("error") for h in with_state["history"]] == [None, None]


class _Payload:
    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.sentinel}",))


@pytest.mark.slow
def test_deepspeed_crafted_checkpoint_runs_nothing(tiny_model_path, tmp_path):
    """DeepSpeed loads its files with torch.load(weights_only=False): a checkpoint whose model
    states file carries a pickle payload (and a manifest forged to match) runs nothing on resume
    and is refused naming MANIFEST.json; the untouched checkpoint resumes."""
    import hashlib
    import json
    import shutil

    ck = tmp_path / "ck"
    cfg = {"zero_optimization": {"stage": 2, "overlap_comm": False}}
    spawn(
        train_worker,
        2,
        _spec(
            tmp_path / "first",
            tiny_model_path,
            "deepspeed_train",
            cfg,
            2,
            steps=1,
            save_at=1,
            ckpt_root=str(ck),
        ),
        env=ENV,
    )
    saved = ck / "step-000001"
    spawn(
        train_worker,
        2,
        _spec(
            tmp_path / "ok",
            tiny_model_path,
            "deepspeed_train",
            cfg,
            2,
            steps=1,
            resume_from=str(ck),
        ),
        env=ENV,
    )
    assert _result(tmp_path / "ok")["load_report"]["loaded"] == "step-000001"
    sentinel = tmp_path / "PWNED"
    states = sorted(saved.rglob("*model_states.pt"))
    assert states, sorted(p.name for p in saved.rglob("*"))
    torch.save({"module": _Payload(sentinel)}, states[0])
    files = {
        p.relative_to(saved).as_posix(): {
            "bytes": p.stat().st_size,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
        for p in sorted(saved.rglob("*"))
        if p.is_file() and p.name not in ("MANIFEST.json", "MANIFEST.hmac", "COMMITTED")
    }
    (saved / "MANIFEST.json").write_text(json.dumps({"format": 1, "step": 1, "files": files}))
    shutil.rmtree(tmp_path / "ok")
    with pytest.raises(Exception):  # noqa: B017 - the rank's CheckpointError ends the spawn
        spawn(
            train_worker,
            2,
            _spec(
                tmp_path / "evil",
                tiny_model_path,
                "deepspeed_train",
                cfg,
                2,
                steps=1,
                resume_from=str(ck),
            ),
            env=ENV,
        )
    assert not sentinel.exists(), "resuming executed the checkpoint's payload"
    from rl_train import checkpoint as ckpt

    with pytest.raises(ckpt.CheckpointError, match="MANIFEST.json fails its HMAC check"):
        ckpt.verify(saved)


@pytest.mark.slow
def test_deepspeed_file_swapped_after_verification_is_never_unpickled(tiny_model_path, tmp_path):
    """Between rank 0's verification and DeepSpeed's loads, an attacker who can write the
    checkpoint directory renames a pickle payload over the model states file (which every rank
    reads): each rank hashes what it unpickles, so the resume fails naming the file and runs
    nothing."""
    ck = tmp_path / "ck"
    cfg = {"zero_optimization": {"stage": 2, "overlap_comm": False}}
    two_ranks = dict(strategy="deepspeed_train", cfg=cfg, world=2)
    spawn(
        train_worker,
        2,
        _spec(tmp_path / "first", tiny_model_path, **two_ranks, steps=1, save_at=1,
              ckpt_root=str(ck)),
        env=ENV,
    )  # fmt: skip
    saved = ck / "step-000001"
    (states,) = saved.rglob("mp_rank_00_model_states.pt")
    sentinel, payload = tmp_path / "PWNED", tmp_path / "payload.pt"
    torch.save({"module": _Payload(sentinel)}, payload)
    swap = {"file": states.relative_to(saved).as_posix(), "replacement": str(payload)}
    with pytest.raises(Exception, match="changed after verification"):
        spawn(
            train_worker,
            2,
            _spec(tmp_path / "evil", tiny_model_path, **two_ranks, steps=2, resume_from=str(ck),
                  swap_after_verify=swap),
            env=ENV,
        )  # fmt: skip
    assert not sentinel.exists(), "resuming unpickled the file swapped in after verification"


GROUPED = dict(n=8, max_len=20, prompt_len=7, group_size=2)
SHARED = {"share_prompt_forward": True}


@pytest.fixture(scope="module")
def single_grouped_run(tiny_model_path, tmp_path_factory):
    """The plain forward, one process, on rows whose prompts come in groups of 2."""
    out = tmp_path_factory.mktemp("single_grouped")
    train_worker(0, _spec(out, tiny_model_path, "hf_infer", {}, 1, batch=GROUPED))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,cfg",
    [
        ("fsdp2_train", {}),
        ("fsdp2_train", {"gradient_checkpointing": True}),
        ("deepspeed_train", ZERO2),
        ("deepspeed_train", {**ZERO3, "fused_lm_head": True}),
    ],
    ids=["fsdp2", "fsdp2_checkpointing", "zero2", "zero3_fused_head"],
)
def test_shared_prompt_forward_two_ranks_match_plain_single_process(
    tiny_model_path, single_grouped_run, tmp_path, strategy, cfg
):
    """share_prompt_forward calls the model twice per micro-batch before backward: FSDP2 and
    DeepSpeed must still reduce the same gradients as the plain single-process forward. FSDP2
    without activation checkpointing once failed here: the prefix pass's gradients arrived after
    the layer's parameters were resharded (`storage of size 0`)."""
    spec = _spec(tmp_path, tiny_model_path, strategy, cfg, 2, batch=GROUPED)
    kwargs = spec["kwargs"]
    assert isinstance(kwargs, dict)
    kwargs["training_args"].update(SHARED)
    spawn(train_worker, 2, spec, env=ENV)
    _check_matches_single(single_grouped_run, tmp_path)


PPO = {"policy_loss": "ppo_clip", "clip_ratio_low": 0.02, "clip_ratio_high": 0.02}
TWO_MINIS = dict(n=16, max_len=20)  # 2 optimizer steps per train_step (8-row mini-batches)


@pytest.fixture(scope="module")
def single_ppo_run(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("single_ppo")
    spec = _spec(out, tiny_model_path, "hf_infer", {}, 1, batch=TWO_MINIS, actor_loss=PPO)
    train_worker(0, spec)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,cfg", [("fsdp2_train", {}), ("deepspeed_train", ZERO3)], ids=["fsdp2", "zero3"]
)
def test_implicit_old_policy_forward_two_ranks_match_single_process(
    tiny_model_path, single_ppo_run, tmp_path, strategy, cfg
):
    """A policy loss over a batch without old log-probs, two mini-batches per call: each rank
    forwards only its later mini-batch's rows (a collective under FSDP2 and ZeRO-3) and takes the
    first one's from its training forward; the ranks must train like one process, clipping the
    second step against the same old policy."""
    spawn(
        train_worker,
        2,
        _spec(tmp_path, tiny_model_path, strategy, cfg, 2, batch=TWO_MINIS, actor_loss=PPO),
        env=ENV,
    )
    _check_matches_single(single_ppo_run, tmp_path)
    single, multi = _result(single_ppo_run)["history"], _result(tmp_path)["history"]
    for a, b in zip(single, multi, strict=True):
        assert a["actor/optimizer_steps"] == b["actor/optimizer_steps"] == 2
        assert b["actor/clip_frac"] == pytest.approx(a["actor/clip_frac"], abs=1e-6)
    assert max(h["actor/clip_frac"] for h in single) > 0  # the second step is clipped


_LAUNCHER_VARS = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RL_RENDEZVOUS_TOKEN",
)

LONE_PROCESS = """
import os, sys, json
import torch
import torch.distributed as dist
from rl_train.registry import build_backend
from rl_train.testing import make_batch, nll_loss

backend = build_backend(
    "deepspeed_train", role="actor", model_path=sys.argv[1], strategy_config={},
    training_args=dict(per_device_train_batch_size=4, learning_rate=1e-3),
)
metrics = backend.train_step(make_batch(n=4, max_len=12), nll_loss)
print(json.dumps({
    "world": dist.get_world_size(), "step": metrics["actor/global_step"],
    "grad_norm": metrics["actor/grad_norm"],
    "master_addr": os.environ.get("MASTER_ADDR"), "world_size_env": os.environ.get("WORLD_SIZE"),
}))
"""


@pytest.mark.slow
def test_deepspeed_in_a_lone_process_trains_in_its_own_one_rank_group(tiny_model_path):
    """No launcher (no WORLD_SIZE/RANK/MASTER_ADDR, as a library user's script): the backend makes
    a one-rank group on an in-memory store, instead of DeepSpeed's MPI discovery (an ImportError
    without mpi4py; with it, a store on the first address of `hostname -I`)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    done = subprocess.run(
        [sys.executable, "-c", LONE_PROCESS, tiny_model_path],
        env={**env, **ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["world"] == 1 and result["step"] == 1.0
    assert result["grad_norm"] > 0.0  # the plain-optimizer step's norm, reported
    assert result["master_addr"] is None and result["world_size_env"] is None
