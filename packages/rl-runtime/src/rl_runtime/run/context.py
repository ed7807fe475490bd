"""What a recipe sees of a run (`Context`): the cluster, the components, the step and weight
version, the phase timer, logging, sharded `forward`/`train` calls on a role, and the weight sync
to the rollout engines (`sync_weights`: synchronous, deferred, or staged for the rollout producer
of asynchronous training). A pipeline without rollout engines (no `actor_infer` role, e.g.
offline preference training) has no weight sync."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from rl_runtime.compose import Components
from rl_runtime.run.options import RunOptions
from rl_runtime.track.timing import PhaseTimer
from rl_runtime.track.tracking import Tracker


@dataclass
class Context:
    """What a recipe sees: cluster, components, step counters, timer, logging."""

    components: Components
    options: RunOptions
    cluster: Any
    tracker: Tracker
    sync: Any = None
    step: int = 0
    weight_version: int = 0
    timer: PhaseTimer = field(default_factory=PhaseTimer)
    #: a context every weight sync runs in (asynchronous training without partial rollout:
    #: the rollout producer's `between_batches`)
    sync_gate: Callable[[], AbstractContextManager[Any]] | None = None
    #: a weight sync returns once sent; the engines' versions are checked at the next sync,
    #: evaluation, checkpoint or the end of the loop (`settle_weights`; asynchronous training
    #: with partial rollout, where generation never waits for a sync: WeightSync.sync)
    defer_sync: bool = False
    #: a weight sync is staged (`WeightSync.stage`: the trainer snapshots its weights into shared
    #: memory) and posted to this rollout producer, which delivers it between two batches
    #: (`RolloutProducer.post_weights`; asynchronous training without partial rollout, where a
    #: weight update must not reach a generation half-way): the trainer never waits for the
    #: batch in flight, only, at its next sync, for a delivery running then (the staging buffers
    #: alternate; a staged version still waiting is superseded, `sync/superseded`)
    sync_producer: Any = None
    #: RL starts from a supervised warm-up's policy, not `pretrain`
    #: (`adopt_policy_as_reference`); checkpoints then carry the reference role's weights
    warmed_up: bool = False
    #: records learn calls for `rl-replay` (`record_steps`; rl_runtime.state.recorder)
    recorder: Any = None

    def check_warm_up_allowed(self) -> None:
        """A supervised warm-up cannot run when the reference is actor_train's base model (its
        LoRA adapter disabled, `Components.reference_from_actor`): the KL terms would measure
        the distance from the pretrained model, not from the warmed-up policy RL starts from."""
        if self.components.reference_from_actor:
            raise ValueError(
                "a supervised warm-up before RL moves the policy away from the reference, which "
                "is actor_train's base model (its LoRA adapter disabled): give the reference "
                "its own model (reference.model_args.model_name_or_path) or drop the warm-up"
            )

    def adopt_policy_as_reference(self) -> None:
        """After a supervised warm-up: the reference role takes actor_train's current weights,
        so that KL terms measure the distance from the policy RL starts from (the warmed-up one),
        not from the `pretrain` model the warm-up moved away from."""
        self.check_warm_up_allowed()
        self.warmed_up = True
        if self.cluster.has("reference"):
            weights = self.cluster["actor_train"].call_all("named_tensors")[0]
            self.cluster["reference"].call_all("adopt_weights", weights)

    def sync_weights(self, *, new_version: bool = True) -> dict[str, float]:
        """Hand the devices to rollout and push the trainer's weights to the engines, as the next
        weight version (or again as the current one, after a restore). Colocated, the engines wake
        first and the weights cross while the trainer still holds them on the device; then the
        trainer offloads (`Cluster.enter_phase(..., handoff=...)`)."""
        if new_version:
            self.weight_version += 1
        with self.sync_gate() if self.sync_gate is not None else nullcontext():
            return self.cluster.enter_phase("rollout", handoff=self._push_weights)

    def _push_weights(self) -> dict[str, float]:
        if self.sync_producer is None:
            return self.sync.sync(self.weight_version, settle=not self.defer_sync)
        t0 = time.perf_counter()
        self.sync_producer.wait_for_delivery()  # its buffer may be the one this stage reuses
        waited = time.perf_counter() - t0
        deliver, metrics = self.sync.stage(self.weight_version)
        superseded = self.sync_producer.post_weights(deliver)
        return {**metrics, "sync/delivery_wait_s": waited, "sync/superseded": float(superseded)}

    def settle_weights(self) -> None:
        """Until every engine holds the last synced version (a deferred sync confirmed, a
        posted one delivered)."""
        if self.sync_producer is not None:
            self.sync_producer.deliver_posted()
        if self.sync is not None:
            self.sync.settle()

    def has_reference(self) -> bool:
        """Whether the run has reference log-probs: a reference role, or actor_train's LoRA
        with its adapter disabled (`Components.reference_from_actor`)."""
        return self.cluster.has("reference") or self.components.reference_from_actor

    def forward(self, role: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`forward` on every rank of `role`, rows sharded over the ranks and merged back.
        `reference` without a reference role (`Components.reference_from_actor`) is
        actor_train's `forward_base`: its base model, the LoRA adapter disabled."""
        from rl_runtime.step.collate import merge_rows, shard_rows

        method = "forward"
        if role == "reference" and self.components.reference_from_actor:
            role, method = "actor_train", "forward_base"
        group = self.cluster[role]
        shards = shard_rows(tensors, len(group.workers))
        outs = group.wait(group.submit_each(method, [(s,) for s in shards]), method)
        return merge_rows(outs)

    def train(self, role: str, tensors: dict[str, torch.Tensor], loss: str = "default") -> dict:
        """One `train_step` of `role` on sharded rows; rank 0's metrics."""
        from rl_runtime.step.collate import shard_rows

        group = self.cluster[role]
        shards = shard_rows(tensors, len(group.workers))

        def run() -> list[dict]:
            args = [(s, loss) for s in shards]
            return group.wait(group.submit_each("train_step", args), "train_step")

        if self.recorder is None:
            return run()[0]
        return self.recorder.train(
            group, role, shards, loss, step=self.step + 1, weight_version=self.weight_version,
            run=run,
        )  # fmt: skip

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.tracker.log(metrics, step=self.step if step is None else step)


def engine_weight_diff(ctx: Context) -> float:
    """Largest |trainer - engine| over the parameters the engines expose (0.0 after an exact
    sync), once the last sync has settled (`Context.settle_weights`). vLLM on the CPU cannot read
    back oneDNN-packed weights, so only the common names are compared; an engine name the
    trainer lacks is an error."""
    ctx.settle_weights()
    cluster = ctx.cluster
    trainer = cluster["actor_train"].call_rank0("state_dict_for_check")
    diffs = []
    for engine in cluster["actor_infer"].call_all("state_dict_for_check"):
        extra = sorted(set(engine) - set(trainer))
        if extra or not engine:
            raise RuntimeError(f"engine parameters not in the trainer: {extra[:5]}")
        diffs += [float((trainer[k].float() - engine[k].float()).abs().max()) for k in engine]
    return max(diffs) if diffs else 0.0
