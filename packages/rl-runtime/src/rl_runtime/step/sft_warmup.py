"""The supervised warm-up before RL that apps/agentic, apps/rlvr and apps/distill share: imitate
demonstrations (solver-played episodes, training answers, a teacher's samples) with actor_train's
own optimizer, then start RL from fresh optimizer moments and the LR schedule at its first step,
and sync the weights to the engines. The rows and the loss are the SFT pipeline's
(rl_runtime.step.sft_data: `SFTExample`s, `collate`; actor_train's `sft` loss); trajectories
become rows through `sft_data.examples_from_trajectories`."""

from __future__ import annotations

import time
from typing import Any

import torch

from rl_runtime.step.sft_data import SFTExample, collate


def supervised_warmup(
    ctx: Any,
    demos: list[SFTExample],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float | None = None,
    log_every: int = 5,
    pad_token_id: int = 0,
) -> dict[str, float]:
    """`steps` SFT steps on random `batch_size`-row batches of the `demos` rows (drawn
    with a generator seeded by the run seed), at the constant `learning_rate` when given (else
    actor_train's), whatever actor_train's LR schedule says, logged every `log_every` steps as
    `warmup/*` at negative steps (the warm-up precedes step 0). Then actor_train starts afresh
    (`TrainWorker.restart_schedule`): its Adam moments are reset (the warm-up's large SFT
    gradients would shrink RL's first updates) and its schedule (`warmup_steps`, decay to
    `max_steps`) begins at RL's first step, not used up by the warm-up's; a reference role takes
    the warmed-up weights (`Context.adopt_policy_as_reference`: KL terms are to the policy RL
    starts from); the weights are synced. Returns `warmup/seconds`, `warmup/demos`."""
    ctx.check_warm_up_allowed()  # before any step, not after the warm-up
    t0 = time.perf_counter()
    if not demos:
        raise ValueError("supervised warm-up: no demonstration to train on")
    batch = collate(demos, pad_token_id)
    rows_total = batch["input_ids"].shape[0]
    gen = torch.Generator().manual_seed(ctx.components.seed)
    actor = ctx.cluster["actor_train"]
    ctx.cluster.enter_phase("train")
    actor.call_all("hold_learning_rate", learning_rate or None)
    for i in range(steps):
        rows = torch.randperm(rows_total, generator=gen)[:batch_size]
        last = ctx.train("actor_train", {k: v[rows] for k, v in batch.items()}, "sft")
        if i % log_every == 0 or i == steps - 1:
            ctx.log({f"warmup/{k}": v for k, v in last.items() if isinstance(v, int | float)},
                    -(steps - i))  # fmt: skip
            print(f"warm-up {i + 1}/{steps} | loss={last.get('actor/loss', float('nan')):.3f}"
                  f" | {time.perf_counter() - t0:.0f}s", flush=True)  # fmt: skip
    actor.call_all("restart_schedule")
    ctx.adopt_policy_as_reference()
    ctx.sync_weights()
    return {"warmup/seconds": time.perf_counter() - t0, "warmup/demos": float(rows_total)}
