"""The recipe contract: every hook the Runner calls on a pipeline's science, typed, with no-op
defaults. A recipe subclasses `Recipe` and overrides what its pipeline has:

    step(ctx) -> metrics             one pipeline step (the runner counts steps); required
    evaluate(ctx) -> metrics         validation ({} when there is none)
    roles(components) -> specs|None  the worker roles to start (None: compose.role_specs)
    setup(ctx)                       recipe state that needs the cluster (tokenizer ...)
    before_training(ctx) -> metrics  e.g. a supervised warm-up (not on resume)
    baselines(ctx) -> {name: metrics} reference policies scored like `evaluate` (rows of the
                                     final table, lines in curves.png, summary.json)
    summary(before, after) -> dict   figures derived from the evaluations (summary.json)
    state() / load_state(d)          recipe-only state saved in checkpoints
    rollout(ctx, index) -> batch     asynchronous training (components.asynchronous): the step
    learn(ctx, batch) -> metrics     split into generation (on the producer thread: only
                                     actor_infer calls) and training + weight sync
    rollout_state() / load_rollout_state(d)  the rollout side's state (a prompt sampler) as it
                                     was before a batch (rl_runtime.asynchrony.training)

The defaults are what the Runner does for a recipe without the hook: nothing, `{}` or None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_runtime.asynchrony.queue import PendingBatch, RolloutBatch
    from rl_runtime.cluster.cluster import RoleSpec
    from rl_runtime.compose import RunComponents
    from rl_runtime.run.runner import Context


class Recipe:
    """A pipeline's science on the Runner (see the module docstring for the hooks)."""

    #: a recipe with rollout-side state defines the method `rollout_state(self)`; None: its
    #: batches are a function of their index (nothing to record before each one)
    rollout_state: Callable[[], Any] | None = None

    def step(self, ctx: Context) -> dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__} has no `step`")

    def evaluate(self, ctx: Context) -> dict[str, float]:
        return {}

    def roles(self, components: RunComponents) -> Sequence[RoleSpec] | None:
        return None

    def setup(self, ctx: Context) -> None:
        return None

    def before_training(self, ctx: Context) -> dict[str, float]:
        return {}

    def baselines(self, ctx: Context) -> dict[str, dict[str, float]]:
        return {}

    def summary(self, before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
        return {}

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        return None

    def rollout(self, ctx: Context, index: int) -> RolloutBatch | PendingBatch:
        raise NotImplementedError(f"{type(self).__name__} has no `rollout`")

    def learn(self, ctx: Context, batch: RolloutBatch) -> dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__} has no `learn`")

    def load_rollout_state(self, state: Any) -> None:
        return None


def splits_step(recipe: object) -> bool:
    """Whether `recipe` is a `Recipe` whose step is split into `rollout` and `learn` (what
    asynchronous training runs)."""
    return isinstance(recipe, Recipe) and all(
        getattr(type(recipe), hook) is not getattr(Recipe, hook) for hook in ("rollout", "learn")
    )
