"""Helpers for tests and benchmarks: synthetic right-padded batches, a plain NLL loss, and a
rank worker that trains any backend and writes its results (used with :func:`rl_train.dist.spawn`,
so it must live in an importable module)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rl_algos.aggregate import aggregate
from rl_train.batching import select
from rl_train.types import Batch, ForwardOutput, LossContext, LossResult


@contextmanager
def throwaway_checkpoint_key(directory: Path) -> Iterator[Path]:
    """Point ``$RL_CHECKPOINT_KEY_FILE`` at a fresh key in ``directory`` (inherited by child
    processes), so tests never sign with, or create, the user's key; restores the variable."""
    from rl_train.signing import KEY_FILE_ENV

    old = os.environ.get(KEY_FILE_ENV)
    os.environ[KEY_FILE_ENV] = str(directory / "checkpoint.key")
    try:
        yield directory / "checkpoint.key"
    finally:
        if old is None:
            os.environ.pop(KEY_FILE_ENV, None)
        else:
            os.environ[KEY_FILE_ENV] = old


#: what someone who can write a checkpoint directory (but has no key) may put in its signature
MALFORMED_SIGNATURES = (
    "non_ascii_mac",
    "deep_json_large",
    "deep_json_small",
    "oversized",
    "not_an_object",
    "mac_not_a_string",
    "short_mac",
    "uppercase_mac",
    "invalid_utf8",
    "fifo",
    "directory",
)


def plant_malformed_signature(ckpt: Path, form: str) -> None:
    """Replace ``ckpt/MANIFEST.hmac`` with the ``form`` of :data:`MALFORMED_SIGNATURES`."""
    import json

    from rl_train.signing import MAX_SIGNATURE_BYTES, SIGNATURE

    path = ckpt / SIGNATURE
    mac = json.loads(path.read_bytes())["mac"]
    path.unlink()
    if form == "fifo":  # opening it for reading would block a reader forever
        os.mkfifo(path)
        return
    if form == "directory":
        path.mkdir()
        return
    data = {
        "non_ascii_mac": '{"mac": "\u00e9"}'.encode(),
        "deep_json_large": b"[" * 100_000,
        "deep_json_small": b"[" * (MAX_SIGNATURE_BYTES - 1),
        # the right mac, but more than a signature's size limit
        "oversized": json.dumps({"mac": mac, "pad": " " * MAX_SIGNATURE_BYTES}).encode(),
        "not_an_object": json.dumps([mac]).encode(),
        "mac_not_a_string": b'{"mac": 5}',
        "short_mac": json.dumps({"mac": mac[:32]}).encode(),
        "uppercase_mac": json.dumps({"mac": mac.upper()}).encode(),
        "invalid_utf8": b'{"mac": "\xff\xfe"}',
    }[form]
    path.write_bytes(data)


def make_batch(
    n: int,
    max_len: int,
    *,
    vocab: int = 1000,
    min_len: int | None = None,
    prompt_len: int = 4,
    seed: int = 0,
    group_size: int = 1,
) -> Batch:
    """``n`` random right-padded sequences with lengths in ``[min_len, max_len]``; the first
    ``prompt_len`` tokens of each are prompt (``response_mask`` False). Consecutive rows in groups
    of ``group_size`` share their prompt (as GRPO samples each prompt G times)."""
    g = torch.Generator().manual_seed(seed)
    lo = min_len if min_len is not None else max(prompt_len + 2, max_len // 2)
    lengths = torch.randint(lo, max_len + 1, (n,), generator=g)
    cols = torch.arange(max_len)[None, :]
    attention = (cols < lengths[:, None]).long()
    ids = torch.randint(3, vocab, (n, max_len), generator=g)
    first_of_group = torch.arange(n) // group_size * group_size
    ids[:, :prompt_len] = ids[first_of_group, :prompt_len]
    ids = ids * attention
    response = attention.bool() & (cols >= prompt_len)
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "response_mask": response,
        "advantages": torch.randn(n, max_len, generator=g) * response,
    }


def nll_loss(mb: Batch, out: ForwardOutput, ctx: LossContext) -> LossResult:
    """Token-mean negative log-likelihood of the response tokens (global normaliser)."""
    assert out.log_probs is not None
    loss = aggregate(
        -out.log_probs, mb["response_mask"], "token-mean", global_token_count=ctx.global_tokens
    )
    return loss, {}


def shard_rows(batch: Batch, rank: int, world: int, mini: int) -> Batch:
    """Rows of ``batch`` that rank ``rank`` holds so that its k-th mini-batch of ``mini`` rows is
    the rank's slice of the single-process k-th mini-batch of ``mini * world`` rows."""
    from rl_train.batching import batch_size, select

    n = batch_size(batch)
    idx = [i for i in range(n) if (i % (mini * world)) // mini == rank]
    return select(batch, idx)


def train_worker(rank: int, spec: dict[str, Any]) -> None:
    """Build ``spec['strategy']`` with ``spec['kwargs']``, run ``spec['steps']`` train steps on this
    rank's rows of ``make_batch(**spec['batch'])``, and write params + metrics to spec['out'].
    Options: ``resume_from`` (a checkpoint root; the result's ``load_report`` then holds the
    loaded optimizer's group settings and state count), ``save_at``/``ckpt_root``,
    ``forget_optimizer_state_at`` (steps after which the optimizer's state and gradients are
    dropped, before that step's save), ``nan_steps``/``nan_rank``, ``swap_after_verify``,
    ``empty_steps`` (steps whose batch has no response token: every ``response_mask`` False) and
    ``omit_steps`` (steps not trained at all)."""
    torch.set_num_threads(1)
    from rl_train import dist as rdist
    from rl_train.registry import build_backend

    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = build_backend(spec["strategy"], **spec["kwargs"])
    args = backend.args  # type: ignore[attr-defined]
    history: list[dict[str, float]] = []
    nan_steps = set(spec.get("nan_steps", []))
    nan_rank = spec.get("nan_rank", 0)
    start = 0
    load_report: dict[str, Any] = {}
    if spec.get("swap_after_verify"):
        _swap_after_verify(**spec["swap_after_verify"])
    if spec.get("resume_from"):
        start, _ = backend.load_checkpoint(spec["resume_from"])
        report = getattr(backend, "last_load_report", None)
        if report is not None and report.loaded is not None:
            load_report = {
                "loaded": report.loaded.name,
                "rejected": [(p.name, reason) for p, reason in report.rejected],
            }
        optimizer = backend.optimizer  # type: ignore[attr-defined]
        load_report["optimizer"] = {
            "groups": [
                {k: g[k] for k in ("lr", "betas", "eps", "weight_decay")}
                for g in optimizer.param_groups
            ],
            "states": len(optimizer.state),
        }
    loss_fn = spec.get("loss_fn") or _loss_with_nan
    if spec.get("actor_loss") is not None:  # ActorLossConfig kwargs (a closure cannot spawn)
        from rl_train.losses import ActorLossConfig, build_actor_loss

        loss_fn = build_actor_loss(ActorLossConfig(**spec["actor_loss"]))
    for step in range(start, spec["steps"]):
        if step in spec.get("omit_steps", ()):
            continue
        batch = make_batch(**{**spec["batch"], "seed": spec["batch"].get("seed", 0) + step})
        batch = shard_rows(batch, rank, world, args.mini_batch_size)
        if step in spec.get("empty_steps", ()):
            batch["response_mask"] = torch.zeros_like(batch["response_mask"])
        if step in nan_steps and rank == nan_rank:
            batch["advantages"] = batch["advantages"].clone()
            col = int(batch["response_mask"][0].nonzero()[0, 0])
            batch["advantages"][0, col] = float("nan")
        try:
            history.append(backend.train_step(batch, loss_fn))
        except Exception as err:
            history.append({"error": str(err)})  # type: ignore[dict-item]
            break
        if step + 1 in spec.get("forget_optimizer_state_at", ()):  # as a restarted schedule
            backend.optimizer.state.clear()  # type: ignore[attr-defined]
            backend.optimizer.zero_grad(set_to_none=True)  # type: ignore[attr-defined]
        save_at = spec.get("save_at")  # a step, or a list of steps
        if step + 1 in (save_at if isinstance(save_at, list) else [save_at]):
            backend.save_checkpoint(spec["ckpt_root"], step + 1, {"note": "mid"})
    params = {
        name: t.detach().clone().cpu()
        for b in backend.iter_full_tensor_buckets(1 << 20)
        for name, t in b
    }
    out = Path(spec["out"])
    if spec.get("forward_check"):  # with LoRA also the base model's (adapter disabled)
        batch = shard_rows(make_batch(**spec["batch"]), rank, world, args.mini_batch_size)
        seen = {"log_probs": backend.forward(batch).log_probs, "rows": batch["input_ids"]}
        if getattr(backend, "has_adapters", False):
            seen["base_log_probs"] = backend.forward_base(batch).log_probs
            seen["log_probs_after_base"] = backend.forward(batch).log_probs
        torch.save(seen, out / f"forward_rank{rank}.pt")
    if spec.get("export_dir"):
        backend.export_hf(spec["export_dir"])
    if rdist.rank() == 0 or spec.get("all_ranks_write"):
        torch.save(
            {
                "params": params,
                "history": history,
                "load_report": load_report,
                "fsdp_wrapped": bool(getattr(backend, "shard", False)),
            },
            out / f"result_rank{rank}.pt",
        )


def train_runs(rank: int, specs: list[dict[str, Any]]) -> None:
    """:func:`train_worker` for each of ``specs`` in turn, in the same ranks: one process start
    (the imports of torch, transformers and DeepSpeed, seconds per rank) and one process group
    for all of them. Each run builds its own backend and writes its own results. A failing run
    raises naming its ``out`` folder, and the runs after it do not run. ``swap_after_verify``
    is refused: it patches ``rl_train.checkpoint`` for the rest of the process."""
    import gc

    for spec in specs:
        if spec.get("swap_after_verify"):
            raise ValueError("swap_after_verify patches the process: run it alone (train_worker)")
        try:
            train_worker(rank, spec)
        except Exception as err:
            raise RuntimeError(f"rank {rank}: the run writing to {spec['out']} failed") from err
        gc.collect()


def _swap_after_verify(file: str, replacement: str) -> None:
    """Attack simulation: right after a checkpoint is verified (rank 0), replace its ``file``
    (relative to the checkpoint directory) with ``replacement`` by a rename, as an attacker who
    can write the checkpoint directory could between verification and loading."""
    import shutil

    from rl_train import checkpoint as ckpt

    verify = ckpt.verify

    def verify_then_swap(candidate: Path, **kwargs: Any) -> dict[str, str]:
        files = verify(candidate, **kwargs)
        staged = Path(candidate) / (file + ".swap")
        shutil.copyfile(replacement, staged)
        os.replace(staged, Path(candidate) / file)
        return files

    ckpt.verify = verify_then_swap  # type: ignore[assignment]


def rendezvous_probe(rank: int, out: str) -> None:
    """A rank under :func:`rl_train.dist.spawn`: join the default group, all-reduce ``rank + 1``
    and write what it saw (the sum, the rendezvous env) to ``out/probe_rank<r>.json``."""
    import json

    from rl_sync.store import node_local_store_path
    from rl_train import dist as rdist

    rdist.init_distributed("cpu", timeout_s=60.0)
    total = rdist.all_reduce_sum([float(rank + 1)])[0]
    token = os.environ.get(rdist.RENDEZVOUS_ENV)
    seen = {
        "sum": total,
        "world": rdist.world_size(),
        "token": token,
        "master_port": os.environ.get("MASTER_PORT"),
        # while the group lives (every rank has all-reduced, none has left)
        "store_file": bool(token) and node_local_store_path(token).exists(),
        # the interfaces the group's sockets were pinned to (rl_sync.store.loopback_socket_env)
        "socket_env": {
            name: os.environ.get(name)
            for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")
        },
    }
    (Path(out) / f"probe_rank{rank}.json").write_text(json.dumps(seen))


def stalled_rank(rank: int, stalled: int, ready: str) -> None:
    """A rank under :func:`rl_train.dist.spawn` that never returns if it is rank ``stalled``
    (it creates the file ``ready``, then sleeps in this frame, which its stack dump shows); the
    others return at once."""
    import time

    if rank == stalled:
        Path(ready).touch()
    while rank == stalled:
        time.sleep(0.1)


def _loss_with_nan(mb: Batch, out: ForwardOutput, ctx: LossContext) -> LossResult:
    """NLL weighted by ``1 + 0 * advantages``: finite advantages leave it unchanged; a NaN in
    ``advantages`` (fault injection) makes the loss NaN."""
    assert out.log_probs is not None
    weight = 1.0 + 0.0 * mb["advantages"]
    loss = aggregate(
        -out.log_probs * weight,
        mb["response_mask"],
        "token-mean",
        global_token_count=ctx.global_tokens,
    )
    return loss, {}


def rows_batch(rows: list[tuple[list[int], list[int]]], extra_pad: int = 2) -> Batch:
    """Right-padded batch of ``(prompt, response)`` token lists (``extra_pad`` all-pad columns):
    ``input_ids``, ``attention_mask``, ``response_mask`` (the response tokens), ``[B, T]``."""
    t = max(len(p) + len(r) for p, r in rows) + extra_pad
    ids = torch.zeros(len(rows), t, dtype=torch.long)
    attn = torch.zeros(len(rows), t, dtype=torch.long)
    resp = torch.zeros(len(rows), t, dtype=torch.bool)
    for i, (p, r) in enumerate(rows):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        attn[i, : len(p) + len(r)] = 1
        resp[i, len(p) : len(p) + len(r)] = True
    return {"input_ids": ids, "attention_mask": attn, "response_mask": resp}


def make_pairs(pairs: int, seed: int = 0, vocab: int = 200) -> Batch:
    """A paired preference batch (rl_train.preference layout): ``2 * pairs`` right-padded rows,
    chosen/rejected interleaved, a 5-token prompt shared by both sides, responses of 3..8 tokens."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(pairs):
        prompt = torch.randint(5, vocab, (5,), generator=g).tolist()
        for _side in range(2):
            n = int(torch.randint(3, 9, (1,), generator=g))
            rows.append((prompt, torch.randint(5, vocab, (n,), generator=g).tolist()))
    side = torch.arange(len(rows)) % 2
    return {
        **rows_batch(rows, extra_pad=0),
        "pair_side": side,
        "pair_id": torch.arange(len(rows)) // 2,
        "desirable": side == 0,
    }


def preference_worker(rank: int, spec: dict[str, Any]) -> None:
    """For each name in ``spec['loss_types']``: build ``spec['strategy']`` with a
    PreferenceLossConfig, take the initial policy's log-probs as the reference, run
    ``spec['steps']`` train steps on this rank's pairs of ``make_pairs(spec['pairs'])`` and write
    the metric history (rank 0) to ``spec['out']/pref_<name>.pt``."""
    torch.set_num_threads(1)
    if spec.get("dump_after"):  # a hung collective prints every thread's stack, then exits
        import faulthandler

        faulthandler.dump_traceback_later(spec["dump_after"], exit=True)
    from rl_train.preference import PreferenceLossConfig, sequence_logps
    from rl_train.registry import build_backend

    world = int(os.environ.get("WORLD_SIZE", "1"))
    full = make_pairs(spec["pairs"], seed=spec.get("seed", 0))
    per_rank = spec["pairs"] // world
    rows = list(range(2 * per_rank * rank, 2 * per_rank * (rank + 1)))
    for name in spec["loss_types"]:
        backend = build_backend(
            spec["strategy"],
            role="actor",
            model_path=spec["model"],
            strategy_config=spec.get("strategy_config", {}),
            training_args=dict(
                per_device_train_batch_size=2,
                gradient_accumulation_steps=per_rank,
                learning_rate=spec.get("lr", 1e-4),
                lr_scheduler_type="constant",
                max_steps=spec["steps"],
            ),
            loss_config=PreferenceLossConfig(loss_type=name, beta=0.5),
        )
        batch = select(full, rows)
        ref = backend.forward(batch).log_probs
        assert ref is not None
        batch["ref_logps"] = sequence_logps(ref, batch["response_mask"])[0]
        batch["kl_reference"] = torch.zeros(len(rows))
        batch["desirable_total"] = full["desirable"].sum().float().expand(len(rows)).clone()
        history = [backend.train_step(dict(batch)) for _ in range(spec["steps"])]
        if rank == 0:
            torch.save({"history": history}, Path(spec["out"]) / f"pref_{name}.pt")
        del backend
