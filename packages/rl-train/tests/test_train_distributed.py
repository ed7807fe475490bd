"""Real 2-rank gloo runs (torch.multiprocessing spawn): FSDP2 and DeepSpeed ZeRO-2/3 reproduce
single-process training, log-probs match HF, NaN skips on all ranks, bit-exact resume, fallback.

Most tests declare their training runs (``@runs``) instead of spawning them: the module's
``trained`` fixture starts the runs of every selected test together, one spawn per phase and
world size (rl_train.testing.train_runs), and each test then asserts on its own folder. A spawn
per run started torch, transformers and DeepSpeed again in both ranks: 38 spawns in the slow
step. A run that resumes another's checkpoint comes a phase later; a test's own step between
runs (truncating a shard) is a ``Between`` of the phase it precedes. Runs that must fail, or
that patch the process (``swap_after_verify``), still spawn alone inside their test."""

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_train.backends.native import fsdp2_averages_over_gloo
from rl_train.dist import spawn
from rl_train.testing import train_runs, train_worker

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


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of a test: rl_train.testing.train_worker's ``spec`` on ``world`` ranks,
    in ``phase`` (after every run of the phases before it)."""

    world: int
    spec: dict[str, Any]
    phase: int = 0


@dataclasses.dataclass(frozen=True)
class Between:
    """A test's own step between its runs, in the test process, before ``phase``'s runs."""

    phase: int
    step: Callable[[], None]


Plan = Callable[[Path, str, dict[str, Any]], list[Run | Between]]
"""(the test's folder, the tiny model's path, the test's parameters and the session fixtures
``trained`` passes on) -> its runs and steps"""
PLANS: dict[str, Plan] = {}


def runs(plan: Plan):
    """Declares a test's runs; the ``trained`` fixture gives the test its folder after them."""

    def register(test):
        PLANS[test.__name__] = plan
        return test

    return register


def _skipped(item: pytest.Item) -> bool:
    """Whether a skip or boolean skipif mark skips ``item`` (its runs are then not started)."""
    if any(True for _ in item.iter_markers("skip")):
        return True
    for mark in item.iter_markers("skipif"):
        conditions = [*mark.args, mark.kwargs.get("condition", False)]
        if any(not isinstance(c, bool) for c in conditions):
            raise TypeError(f"{item.nodeid}: give skipif a bool here, not {conditions!r}")
        if any(conditions):
            return True
    return False


class Trained:
    """The runs of this module's selected tests (``@runs``), started at the first request."""

    def __init__(
        self, root: Path, model: str, items: list[pytest.Item], fixtures: dict[str, Any]
    ) -> None:
        self.root, self.model, self.fixtures = root, model, fixtures
        self.items = {item.nodeid: item for item in items}
        self.plans = {item.nodeid: PLANS[getattr(item, "originalname", item.name)]
                      for item in items}  # fmt: skip
        self.folders: dict[str, Path] = {}
        self.failed: dict[str, str] = {}  # nodeid -> why its runs did not all complete
        self.started = False

    def folder(self, item: pytest.Item) -> Path:
        if item.nodeid not in self.plans:
            raise LookupError(f"{item.nodeid}: not a selected test with @runs")
        if not self.started:
            self.started = True
            self._run_all()
        if item.nodeid in self.failed:
            pytest.fail(self.failed[item.nodeid], pytrace=False)
        return self.folders[item.nodeid]

    def _run_all(self) -> None:
        steps: dict[str, list[Run | Between]] = {}
        for i, (nodeid, plan) in enumerate(self.plans.items()):
            folder = self.root / f"t{i:02d}"
            folder.mkdir()
            item = self.items[nodeid]
            callspec = getattr(item, "callspec", None)
            params = dict(callspec.params) if callspec is not None else {}
            params.update(self.fixtures)
            self.folders[nodeid] = folder
            steps[nodeid] = plan(folder, self.model, params)
        phases = sorted({s.phase for todo in steps.values() for s in todo})
        for phase in phases:
            for nodeid, todo in steps.items():
                for s in todo:
                    if isinstance(s, Between) and s.phase == phase and nodeid not in self.failed:
                        try:
                            s.step()
                        except Exception as err:
                            self.failed[nodeid] = f"its step before phase {phase} failed: {err!r}"
            for world in (1, 2):
                batch = [(nodeid, s) for nodeid, todo in steps.items() for s in todo
                         if isinstance(s, Run) and s.phase == phase and s.world == world
                         and nodeid not in self.failed]  # fmt: skip
                if not batch:
                    continue
                try:
                    spawn(train_runs, world, [s.spec for _, s in batch], env=ENV)
                except Exception as err:  # every test of this spawn fails with the cause
                    why = f"the shared {world}-rank spawn of phase {phase} failed: {err}"
                    self.failed.update((nodeid, why) for nodeid, _ in batch)


@pytest.fixture(scope="module")
def trained(request, tiny_model_path, tmp_path_factory, resumed_training_settings) -> Trained:
    selected = [
        item
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        and getattr(item, "originalname", item.name) in PLANS
        and not _skipped(item)
    ]
    fixtures = {"resumed_training_settings": resumed_training_settings}  # for the plans
    return Trained(tmp_path_factory.mktemp("dist"), tiny_model_path, selected, fixtures)


@pytest.fixture
def out(trained: Trained, request) -> Path:
    """This test's folder, after its ``@runs`` (and those of the other selected tests)."""
    return trained.folder(request.node)


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
@runs(lambda d, m, p: [Run(2, _spec(d, m, "fsdp2_train", p["cfg"], 2, forward_check=True))])
def test_fsdp2_two_ranks_match_single_process_and_hf_log_probs(single_run, out, cfg):
    _check_matches_single(single_run, out)
    # each rank's forward of its rows equals the single-process forward of those rows
    full = torch.load(single_run / "forward_rank0.pt", weights_only=True)["log_probs"]
    r0 = torch.load(out / "forward_rank0.pt", weights_only=True)["log_probs"]
    r1 = torch.load(out / "forward_rank1.pt", weights_only=True)["log_probs"]
    torch.testing.assert_close(
        torch.cat([r0, r1]), torch.cat([full[:4], full[4:]]), atol=2e-5, rtol=1e-5
    )


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [{}, ZERO0], ids=["no_zero_section", "zero0"])
@runs(lambda d, m, p: [Run(1, _spec(d, m, "deepspeed_train", p["cfg"], 1))])
def test_deepspeed_without_zero_one_rank_matches_single_process(single_run, out, cfg):
    """ZeRO stage 0 (the default without a zero_optimization section) in fp32 steps a plain torch
    optimizer, whose norm DeepSpeed does not report: the step ran, with the single process's
    gradient norm (clipped by max_grad_norm as there), and trained the same weights."""
    _check_matches_single(single_run, out)
    assert [h["actor/skipped_steps"] for h in _result(out)["history"]] == [0.0, 0.0]


@runs(lambda d, m, p: [Run(1, _spec(d, m, "fsdp2_train", {}, 1))])
def test_fsdp2_one_rank_trains_the_plain_module_bit_exactly(single_run, out):
    """One rank has nothing to shard: fsdp2_train trains the module without FSDP2's hooks
    (rl_train.backends.native), with the single-process hf_infer run's results to the bit."""
    plain, single = _result(out), _result(single_run)
    assert plain["fsdp_wrapped"] is False and single["fsdp_wrapped"] is False
    timing = "actor/response_tokens_per_s"
    assert [{k: v for k, v in h.items() if k != timing} for h in plain["history"]] == [
        {k: v for k, v in h.items() if k != timing} for h in single["history"]
    ]
    assert _max_diff(plain["params"], single["params"]) == 0.0


def _two_ranks_saved_then_one_resumes(d: Path, m: str, p: dict) -> list[Run | Between]:
    ck = str(d / "ckpt")
    two: dict[str, Any] = dict(strategy="fsdp2_train", cfg={}, world=2)
    one: dict[str, Any] = dict(strategy="fsdp2_train", cfg={}, world=1)
    return [
        Run(2, _spec(d / "straight", m, **two, steps=4)),
        Run(2, _spec(d / "first", m, **two, steps=2, save_at=2, ckpt_root=ck)),
        Run(1, _spec(d / "resumed", m, **one, steps=4, resume_from=ck), phase=1),
    ]


@pytest.mark.slow
@runs(_two_ranks_saved_then_one_resumes)
def test_two_rank_fsdp2_checkpoint_resumes_on_one_unwrapped_rank(out):
    """Sharded and unwrapped models save and load the same DCP checkpoint: one unwrapped rank
    loads what two FSDP2 ranks saved (model and Adam's moments, gathered on load) and continues
    as the two ranks would have."""
    straight, resumed = _result(out / "straight"), _result(out / "resumed")
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
@runs(lambda d, m, p: [Run(2, _spec(d, m, "deepspeed_train", p["cfg"], 2))])
def test_deepspeed_two_ranks_match_single_process(single_run, out, cfg):
    _check_matches_single(single_run, out)


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,cfg",
    [("fsdp2_train", {}), ("deepspeed_train", ZERO2), ("deepspeed_train", ZERO0)],
    ids=["fsdp2", "zero2", "zero0"],
)
@runs(
    lambda d, m, p: [
        Run(2, _spec(d, m, p["strategy"], p["cfg"], 2, steps=3, nan_steps=[1], nan_rank=1,
                     all_ranks_write=True))
    ]
)  # fmt: skip
def test_nan_on_one_rank_skips_step_on_both(out, strategy, cfg):
    for rank in (0, 1):
        hist = _result(out, rank)["history"]
        assert [h["actor/skipped_steps"] for h in hist] == [0.0, 1.0, 0.0]
        assert hist[-1]["actor/nonfinite_total"] == 1.0
        assert hist[-1]["actor/global_step"] == 2.0
    assert _max_diff(_result(out, 0)["params"], _result(out, 1)["params"]) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,cfg",
    [("deepspeed_train", ZERO2), ("deepspeed_train", ZERO0)],
    ids=["zero2", "zero0"],  # DeepSpeed keeps its own step counts; FSDP2: the core test
)
@runs(
    lambda d, m, p: [
        Run(2, _spec(d / name, m, p["strategy"], p["cfg"], 2, steps=3, **extra))
        for name, extra in {"empty": dict(empty_steps=[1]), "omitted": dict(omit_steps=[1])}.items()
    ]
)
def test_a_step_without_a_trainable_token_is_as_if_it_never_came(out, strategy, cfg):
    """A batch with every response masked out, on both ranks: skipped whole, so the weights,
    the optimizer's moments, DeepSpeed's micro-step count and the lr schedule after the next
    step are those of a run that never saw it (AdamW stepped on zero gradients before)."""
    empty, omitted = _result(out / "empty"), _result(out / "omitted")
    assert [h["actor/optimizer_steps"] for h in empty["history"]] == [1.0, 0.0, 1.0]
    assert empty["history"][1]["actor/empty_mini_batches"] == 1.0
    assert empty["history"][-1]["actor/global_step"] == 2.0
    assert empty["history"][-1]["actor/lr"] == omitted["history"][-1]["actor/lr"]
    assert _max_diff(empty["params"], omitted["params"]) == 0.0


def _resume_then_truncate_a_shard(d: Path, m: str, p: dict) -> list[Run | Between]:
    """Straight 4 steps; a job that saves at steps 1 and 2, then its processes exit ("killed");
    its resume; then, with the newer checkpoint's rank-1 shard truncated, a resume again."""
    ck = d / "ckpt"

    def truncate_newer_shard() -> None:
        shard = ck / "step-000002" / "model_optim" / "__1_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    fsdp2: dict[str, Any] = dict(strategy="fsdp2_train", cfg={}, world=2)
    return [
        Run(2, _spec(d / "straight", m, **fsdp2, steps=4)),
        Run(2, _spec(d / "first", m, **fsdp2, steps=2, save_at=[1, 2], ckpt_root=str(ck))),
        Run(2, _spec(d / "resumed", m, **fsdp2, steps=4, resume_from=str(ck)), phase=1),
        Between(2, truncate_newer_shard),
        Run(2, _spec(d / "fallback", m, **fsdp2, steps=4, resume_from=str(ck)), phase=2),
    ]


@pytest.mark.slow
@runs(_resume_then_truncate_a_shard)
def test_fsdp2_resume_bit_exact_and_truncated_shard_falls_back(out):
    straight, resumed = _result(out / "straight"), _result(out / "resumed")
    assert _max_diff(straight["params"], resumed["params"]) == 0.0
    assert len(resumed["history"]) == 2

    # the older complete checkpoint, and the newer one with its rank-1 shard truncated
    fallback = _result(out / "fallback")
    assert fallback["load_report"]["loaded"] == "step-000001"
    ((rejected_name, reason),) = fallback["load_report"]["rejected"]
    assert rejected_name == "step-000002" and "__1_0.distcp" in reason and "truncated" in reason
    # resuming from step 1 (three more steps) reproduces the straight run too
    assert _max_diff(straight["params"], fallback["params"]) == 0.0
    assert len(fallback["history"]) == 3


def _saved_without_optimizer_state_then_resumed(d: Path, m: str, p: dict) -> list[Run | Between]:
    """Saves at steps 1 and 2 (the optimizer's state dropped after step 2); resumes from step 2
    with other training settings (conftest's resumed_training_settings); then, step 2 removed,
    from step 1."""
    ck = d / "ckpt"
    first = _spec(d / "first", m, p["strategy"], p["cfg"], 2, steps=2,
                  save_at=[1, 2], ckpt_root=str(ck), forget_optimizer_state_at=[2])  # fmt: skip

    def resume(name: str, phase: int) -> Run:
        spec = _spec(d / name, m, p["strategy"], p["cfg"], 2, steps=3, resume_from=str(ck))
        spec["kwargs"]["training_args"].update(p["resumed_training_settings"])
        return Run(2, spec, phase)

    return [
        Run(2, first),
        resume("from_step_2", 1),
        Between(2, lambda: shutil.rmtree(ck / "step-000002")),
        resume("from_step_1", 2),
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,cfg", [("fsdp2_train", {}), ("deepspeed_train", ZERO2)], ids=["fsdp2", "zero2"]
)
@runs(_saved_without_optimizer_state_then_resumed)
def test_two_rank_resume_takes_the_configured_settings_and_loads_a_stateless_optimizer(
    out, strategy, cfg
):
    """Two ranks: a checkpoint written when the optimizer held no state (dropped after step 2,
    as a schedule restarted after a warm-up drops it) resumes, with no state; one with state
    resumes with it. Either way the optimizer's settings are the resuming config's (rate at
    the schedule's checkpointed position, betas, epsilon, weight decay), not the checkpoint's."""

    def settings(lr: float) -> list[dict]:
        common = dict(lr=pytest.approx(lr), betas=(0.8, 0.99), eps=1e-7)
        return [dict(common, weight_decay=0.1), dict(common, weight_decay=0.0)]

    stateless = _result(out / "from_step_2")
    assert stateless["load_report"]["loaded"] == "step-000002"
    # linear decay from 1e-4 to the floor 0.5e-4 over 10 steps: position 2 -> 0.9e-4
    assert stateless["load_report"]["optimizer"] == {"groups": settings(0.9e-4), "states": 0}
    assert [h.get("error") for h in stateless["history"]] == [None]

    with_state = _result(out / "from_step_1")
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


DS_CKPT = {"zero_optimization": {"stage": 2, "overlap_comm": False}}
DS_TWO_RANKS: dict[str, Any] = dict(strategy="deepspeed_train", cfg=DS_CKPT, world=2)


@pytest.mark.slow
@runs(
    lambda d, m, p: [
        Run(2, _spec(d / "first", m, **DS_TWO_RANKS, steps=1, save_at=1, ckpt_root=str(d / "ck"))),
        Run(2, _spec(d / "ok", m, **DS_TWO_RANKS, steps=1, resume_from=str(d / "ck")), phase=1),
    ]
)
def test_deepspeed_crafted_checkpoint_runs_nothing(tiny_model_path, out):
    """DeepSpeed loads its files with torch.load(weights_only=False): a checkpoint whose model
    states file carries a pickle payload (and a manifest forged to match) runs nothing on resume
    and is refused naming MANIFEST.json; the untouched checkpoint resumes."""
    import hashlib
    import json
    import shutil

    ck = out / "ck"
    saved = ck / "step-000001"
    assert _result(out / "ok")["load_report"]["loaded"] == "step-000001"
    sentinel = out / "PWNED"
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
    shutil.rmtree(out / "ok")
    with pytest.raises(Exception):  # noqa: B017 - the rank's CheckpointError ends the spawn
        spawn(
            train_worker,
            2,
            _spec(out / "evil", tiny_model_path, **DS_TWO_RANKS, steps=1, resume_from=str(ck)),
            env=ENV,
        )
    assert not sentinel.exists(), "resuming executed the checkpoint's payload"
    from rl_train import checkpoint as ckpt

    with pytest.raises(ckpt.CheckpointError, match="MANIFEST.json fails its HMAC check"):
        ckpt.verify(saved)


@pytest.mark.slow
@runs(
    lambda d, m, p: [
        Run(2, _spec(d / "first", m, **DS_TWO_RANKS, steps=1, save_at=1, ckpt_root=str(d / "ck")))
    ]
)
def test_deepspeed_file_swapped_after_verification_is_never_unpickled(tiny_model_path, out):
    """Between rank 0's verification and DeepSpeed's loads, an attacker who can write the
    checkpoint directory renames a pickle payload over the model states file (which every rank
    reads): each rank hashes what it unpickles, so the resume fails naming the file and runs
    nothing."""
    ck = out / "ck"
    saved = ck / "step-000001"
    (states,) = saved.rglob("mp_rank_00_model_states.pt")
    sentinel, payload = out / "PWNED", out / "payload.pt"
    torch.save({"module": _Payload(sentinel)}, payload)
    swap = {"file": states.relative_to(saved).as_posix(), "replacement": str(payload)}
    with pytest.raises(Exception, match="changed after verification"):
        spawn(
            train_worker,
            2,
            _spec(out / "evil", tiny_model_path, **DS_TWO_RANKS, steps=2, resume_from=str(ck),
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


def _shared_prompt_run(d: Path, m: str, p: dict) -> list[Run | Between]:
    spec = _spec(d, m, p["strategy"], p["cfg"], 2, batch=GROUPED)
    kwargs = spec["kwargs"]
    assert isinstance(kwargs, dict)
    kwargs["training_args"].update(SHARED)
    return [Run(2, spec)]


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
@runs(_shared_prompt_run)
def test_shared_prompt_forward_two_ranks_match_plain_single_process(
    single_grouped_run, out, strategy, cfg
):
    """share_prompt_forward calls the model twice per micro-batch before backward: FSDP2 and
    DeepSpeed must still reduce the same gradients as the plain single-process forward. FSDP2
    without activation checkpointing once failed here: the prefix pass's gradients arrived after
    the layer's parameters were resharded (`storage of size 0`)."""
    _check_matches_single(single_grouped_run, out)


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
@runs(
    lambda d, m, p: [
        Run(2, _spec(d, m, p["strategy"], p["cfg"], 2, batch=TWO_MINIS, actor_loss=PPO))
    ]
)
def test_implicit_old_policy_forward_two_ranks_match_single_process(
    single_ppo_run, out, strategy, cfg
):
    """A policy loss over a batch without old log-probs, two mini-batches per call: each rank
    forwards only its later mini-batch's rows (a collective under FSDP2 and ZeRO-3) and takes the
    first one's from its training forward; the ranks must train like one process, clipping the
    second step against the same old policy."""
    _check_matches_single(single_ppo_run, out)
    single, multi = _result(single_ppo_run)["history"], _result(out)["history"]
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
