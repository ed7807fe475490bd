"""The asynchronous plan compose builds (max_staleness, ROLL's async_generation_ratio, refusals)
and asynchronous training's checks and totals, without Ray."""

from __future__ import annotations

import pytest
from async_fakes import traj

from rl_runtime.asynchrony.producer import RolloutProducer
from rl_runtime.asynchrony.queue import (
    RolloutBatch,
    SampleQueue,
)
from rl_runtime.run.recipe import Recipe


def test_partial_rollout_reaches_the_plan():
    on = _compose(_cfg(**{"async": {"max_staleness": 1, "partial_rollout": True}})).asynchronous
    off = _compose(_cfg(**{"async": {"max_staleness": 1}})).asynchronous
    assert on is not None and on.partial_rollout
    assert off is not None and not off.partial_rollout


def _cfg(**extra):
    from rl_config.schema import ExperimentConfig

    base = {
        "pretrain": "m", "num_gpus_per_node": 2, "rollout_batch_size": 4,
        "num_return_sequences_in_group": 2,
        "actor_train": {"device_mapping": [0]}, "actor_infer": {"device_mapping": [1]},
        "reference": {"device_mapping": [0]},
    }  # fmt: skip
    base.update(extra)
    return ExperimentConfig.model_validate(base)


def _compose(cfg):
    from rl_runtime.compose import compose

    return compose(cfg, pipeline="rlvr")


def test_synchronous_by_default_and_with_max_staleness_zero():
    assert _compose(_cfg()).asynchronous is None
    c = _compose(_cfg(**{"async": {"max_staleness": 0, "queue_size": 16}}))
    assert c.asynchronous is None
    assert any("async.queue_size=16 has no effect" in w for w in c.warnings)


def test_roll_async_generation_ratio_maps_onto_max_staleness():
    plan = _compose(_cfg(async_generation_ratio=1.5)).asynchronous
    assert plan is not None and plan.max_staleness == 2
    assert plan.queue_samples == 2 * 8  # samples_per_step (4 prompts x 2) x max_staleness
    assert plan.source == "async_generation_ratio=1.5 -> max_staleness=2"
    one_step_off = _compose(_cfg(**{"async": {"max_staleness": 1}})).asynchronous
    assert one_step_off is not None and one_step_off.max_staleness == 1
    assert one_step_off.source == "async.max_staleness=1"


def test_a_queue_smaller_than_a_batch_is_refused_by_name():
    with pytest.raises(ValueError, match="async.queue_size=5 is smaller than one step's batch"):
        _compose(_cfg(**{"async": {"max_staleness": 1, "queue_size": 5}}))


def test_async_without_is_correction_warns_and_with_it_does_not():
    c = _compose(_cfg(**{"async": {"max_staleness": 1}}))
    assert any("without train_infer_correction" in w for w in c.warnings)
    tic = {"is_weight": {"enabled": True, "upper_bound": 2.0}}
    c = _compose(_cfg(**{"async": {"max_staleness": 1}, "train_infer_correction": tic}))
    assert not any("train_infer_correction" in w for w in c.warnings)
    assert c.role("actor_train").loss.is_weight is not None  # the loss corrects against rollout


def test_a_role_colocated_with_the_engines_is_refused_for_async():
    from rl_config.errors import ConfigError

    with pytest.raises(ConfigError, match="shares devices \\[1\\] with reference"):
        _cfg(**{"async": {"max_staleness": 1}, "reference": {"device_mapping": [1]}})
    # actor_infer without a device_mapping passes the config check (placement is compose's):
    # compose places it on device 0, with actor_train and the reference
    with pytest.raises(ValueError, match="actor_train.device_mapping shares devices \\[0\\]"):
        _compose(_cfg(**{"async": {"max_staleness": 1}, "actor_infer": {}}))


@pytest.mark.parametrize(
    "section, match",
    [
        ({"max_staleness": 1, "max_inflight_samples": 4}, "one step's batch at a time"),
    ],
)
def test_unimplemented_async_keys_are_refused_by_name(section, match):
    from rl_config.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        _compose(_cfg(**{"async": section}))


# ---------------------------------------------------------------------------- async runner
class FakeCluster:
    def __init__(self, colocated: list[str]) -> None:
        self.colocated = colocated

    def colocated_with_infer(self) -> list[str]:
        return self.colocated


class SplitRecipe(Recipe):
    def rollout(self, ctx, index):
        return RolloutBatch(index, [])

    def learn(self, ctx, batch):
        return {}


def _training(recipe, colocated=(), samples_per_batch=2):
    from types import SimpleNamespace

    from rl_runtime.asynchrony.training import AsyncTraining
    from rl_runtime.compose import AsyncPlan

    plan = AsyncPlan(max_staleness=1, queue_samples=2 * samples_per_batch, wait_timeout_s=5.0,
                     source="test")  # fmt: skip
    ctx = SimpleNamespace(cluster=FakeCluster(list(colocated)))
    return AsyncTraining(
        plan, recipe, ctx, samples_per_batch=samples_per_batch, start_index=0, stop_index=2
    )


def test_async_training_refuses_colocated_engines_and_unsplit_recipes():
    with pytest.raises(
        RuntimeError,
        match=r"\['reference'\] share devices with actor_infer: asynchronous training generates",
    ):
        _training(SplitRecipe(), colocated=["reference"])
    with pytest.raises(TypeError, match="no `rollout`"):
        _training(object())
    _training(SplitRecipe())


def test_a_checkpoint_whose_async_bookkeeping_disagrees_is_refused():
    from rl_runtime.asynchrony.training import restore_rollout_state

    loaded: list[dict] = []

    class Recipe:
        def load_rollout_state(self, state):
            loaded.append(state)

    good = {"trainer_version": 5, "next_index": 4, "rollout_state": {"sampler": 1}}
    restore_rollout_state(Recipe(), good, step=4, weight_version=5)
    assert loaded == [{"sampler": 1}]
    with pytest.raises(RuntimeError, match="disagrees with its run state"):
        restore_rollout_state(Recipe(), {**good, "trainer_version": 0}, step=4, weight_version=5)


def test_trainer_progress_never_goes_back():
    """Deferred weight syncs report their ends from watcher threads, possibly out of order: a
    late report of an earlier step must not close the gate again."""
    producer = RolloutProducer(
        lambda index: RolloutBatch(index, []), SampleQueue(10), max_staleness=0,
        samples_per_batch=1, start_index=0, stop_index=5, timeout_s=5.0,
    )  # fmt: skip
    producer.trainer_finished(3)
    producer.trainer_finished(2)
    assert producer._gate_open(3) and not producer._gate_open(4)


class ScreeningRecipe(Recipe):
    """Batches of 4 samples of one group, the sample `k == 1` of each one whose reward call
    failed; `learn` is the recipes' own path up to train_step: failed episodes screened out
    (rl_runtime.step.failures), the rest collated, `rollout_metrics` of what is trained."""

    def rollout(self, ctx, index):
        from rl_config.records import Turn

        samples = [traj(f"g{index}", version=index, k=k) for k in range(4)]
        for t in samples:
            failed = t.traj_id.endswith("-1")
            t.turns = [Turn(turn_idx=0, start=1, end=3, info={"reward_failed": failed})]
        return RolloutBatch(index, samples)

    def learn(self, ctx, batch):
        from rl_runtime.step.collate import collate_trajectories
        from rl_runtime.step.failures import screen_failures
        from rl_runtime.step.metrics import rollout_metrics

        screened = screen_failures(batch.trajectories, max_failed_fraction=0.5)
        collated = collate_trajectories(screened.kept, pad_token_id=0)
        self.trained = getattr(self, "trained", 0) + collated.batch_size  # train_step's rows
        return {**screened.metrics, **rollout_metrics(screened.kept, collated)}


def test_trained_samples_total_counts_what_reached_train_step_not_failed_samples():
    """`async/trained_samples_total` adds up the samples train_step got: a batch's failed
    episodes, which learn screens out, are not trained on. Before, it counted every sample the
    staleness bound kept (8 after two steps here, not 6)."""
    from types import SimpleNamespace

    recipe = ScreeningRecipe()
    training = _training(recipe, samples_per_batch=4)
    ctx = SimpleNamespace(cluster=FakeCluster([]), step=0, weight_version=0)
    training.start()
    try:
        rows = []
        for step in range(2):
            ctx.step = ctx.weight_version = step
            rows.append(training.step(ctx))
            training.trainer_finished(step + 1)
    finally:
        training.stop()
    assert [r["failures/reward_failures"] for r in rows] == [1.0, 1.0]
    assert [r["rollout/num_trajectories"] for r in rows] == [3.0, 3.0]
    assert [r["async/trained_samples_total"] for r in rows] == [3.0, 6.0] and recipe.trained == 6
    assert [r["async/lag_hist/0"] for r in rows] == [4.0, 4.0]  # lags: all the bound kept


def test_a_learn_that_does_not_say_what_it_trained_on_is_an_error():
    from types import SimpleNamespace

    class Silent(ScreeningRecipe):
        def learn(self, ctx, batch):
            return {"train/loss": 0.0}

    training = _training(Silent(), samples_per_batch=4)
    training.start()
    try:
        with pytest.raises(RuntimeError, match="Silent.learn reported neither rollout/num_traj"):
            training.step(SimpleNamespace(step=0, weight_version=0))
    finally:
        training.stop()
