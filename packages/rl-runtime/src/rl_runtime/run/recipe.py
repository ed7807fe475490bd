"""What a recipe supplies to the Runner (composition, not inheritance): its science, as hooks.

    step(ctx) -> metrics             one pipeline step (the runner counts steps)
    evaluate(ctx) -> metrics         validation ({} when there is none)
    setup(ctx)                       optional: recipe state that needs the cluster (tokenizer ...)
    before_training(ctx) -> metrics  optional: e.g. a supervised warm-up (not on resume)
    baselines(ctx) -> {name: metrics} optional: reference policies scored like `evaluate` (rows
                                     of the final table, lines in curves.png, summary.json)
    summary(before, after) -> dict   optional: figures derived from the evaluations (summary.json)
    state() / load_state(d)          optional: recipe-only state saved in checkpoints
    rollout(ctx, index) -> RolloutBatch  asynchronous training (components.asynchronous): the
    learn(ctx, batch) -> metrics     step split into generation (on the producer thread: only
                                     actor_infer calls) and training + weight sync
    rollout_state() / load_rollout_state(d)  optional: the rollout side's state (a prompt sampler)
                                     as it was before a batch (rl_runtime.asynchrony.training)

`ctx` is a `rl_runtime.run.context.Context`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rl_runtime.run.context import Context


class Recipe(Protocol):
    def step(self, ctx: Context) -> dict[str, float]: ...

    def evaluate(self, ctx: Context) -> dict[str, float]: ...
