"""Trainer -> rollout weight transfer (`WeightSync`): broadcast over an rl_sync group, shared
memory on one node, or direct in-process; every engine's `weight_version` is checked against the
version sent."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from rl_runtime.cluster.sync_transport import TransportChoice
from rl_runtime.cluster.worker_group import WorkerGroup


class WeightSyncError(RuntimeError):
    """The engines do not hold the version the trainer just sent."""


class WeightSync:
    """Trainer -> rollout weight transfer.

    `mode="broadcast"` (Ray mode): an rl_sync group (trainer rank 0 + every rollout worker)
    carries the weights, versioned and checksummed, as broadcast buckets or, through shared
    memory, as a handle to the trainer's /dev/shm buffer: `transport` (`weight_sync_transport`)
    is decided at setup (rl_runtime.cluster.sync_transport: ``auto`` takes shared memory when every
    engine shares the CPU trainer's node and /dev/shm has room). The group's store listens on
    the trainer's node at `host` if given, else at the address
    `rl_runtime.cluster.sync_address.choose_sync_host` picks from the workers' nodes (loopback when all
    share the trainer's node, else the trainer node's IP); the port is picked free on that node.
    `mode="direct"`: the trainer's tensors are handed to the engines through the driver
    (in-process `--no-ray` runs). Either way, every engine's `weight_version` is checked against
    the version sent.
    """

    def __init__(
        self,
        train: WorkerGroup,
        infer: WorkerGroup,
        *,
        mode: Literal["broadcast", "direct"],
        timeout_s: float = 600.0,
        bucket_bytes: int = 1 << 26,
        host: str | None = None,
        transport: str = "auto",
    ) -> None:
        self.train = train
        self.infer = infer
        self.mode = mode
        self.timeout_s = timeout_s
        self.bucket_bytes = bucket_bytes
        self.configured_host = host
        self.configured_transport = transport
        #: where the sync group met (set by setup): the trainer node's address and whether some
        #: rollout worker sits on another node
        self.host: str | None = None
        self.cross_node = False
        #: how the weights travel (set by setup; rl_runtime.cluster.sync_transport)
        self.transport: TransportChoice | None = None
        #: a sync not yet settled: its version and its transfer calls (`sync(settle=False)`)
        self._pending: tuple[int, list[Any]] | None = None
        self._ready = False
        #: /dev/shm holds `stage`'s buffers too (set by setup)
        self._staging_room = False

    def setup(self) -> None:
        if self.mode != "broadcast" or self._ready:
            return
        from rl_runtime.cluster.sync_address import NodeAddress, choose_sync_host

        trainer = NodeAddress(*self.train.call_rank0("node_address"))
        rollout = [NodeAddress(*a) for a in self.infer.call_all("node_address")]
        self.host = choose_sync_host(trainer, rollout, self.configured_host)
        self.cross_node = any(r.node_id != trainer.node_id for r in rollout)
        self.transport = self._choose_transport()
        port = self.train.call_rank0("open_sync_listener", self.host)
        world = 1 + len(self.infer.workers)
        refs = self.train.submit("init_sync_group", self.host, port, world, self.timeout_s)
        refs += self.infer.submit("init_sync_group", self.host, port, world, self.timeout_s)
        self.train.wait(refs, "init_sync_group", self.timeout_s)
        self._ready = True

    def _choose_transport(self) -> TransportChoice:
        """Ask the trainer what the choice needs (measuring the weights and /dev/shm only where
        shared memory is possible) and choose (rl_runtime.cluster.sync_transport)."""
        from rl_runtime.cluster.sync_transport import choose_sync_transport, staging_room

        measure = not self.cross_node and self.configured_transport != "broadcast"
        info = self.train.call_all("sync_info", measure, self.bucket_bytes)[0]
        self._staging_room = staging_room(info.get("weight_bytes"), info.get("shm_free_bytes"))
        return choose_sync_transport(
            self.configured_transport,
            cross_node=self.cross_node,
            trainer_device=str(info["device"]),
            weight_bytes=info.get("weight_bytes"),
            shm_free_bytes=info.get("shm_free_bytes"),
        )

    def sync(self, version: int, *, settle: bool = True) -> dict[str, float]:
        """Push the trainer's weights as `version`; returns `sync/*` metrics. A sync deferred
        before is settled first (its engines must hold its version before the next one is
        sent). `settle=False` (Ray mode; asynchronous training with partial rollout): return
        once the transfer calls are submitted and check what the engines committed at the next
        `settle` (the next sync, an evaluation, a checkpoint, the end), so the trainer's next
        step is not held up by the engines' swap at their next decode step; the trainer's
        actor runs its calls in order, so that step starts after its weights were sent.
        Transfer metrics (`sync/bytes`, ...) are then those of the sync settled last."""
        t0 = time.perf_counter()
        metrics = self.settle()
        if self.mode == "broadcast":
            self.setup()
            send, receive = (
                ("send_weights_shared", "receive_weights_shared")
                if self.shared_memory
                else ("send_weights", "receive_weights")
            )
            refs = self.train.submit(send, version, self.bucket_bytes)
            refs += self.infer.submit(receive, version)
            self._pending = (version, refs)
            if settle:
                metrics = self.settle()
            else:
                metrics["sync/deferred"] = 1.0
            metrics["sync/cross_node"] = float(self.cross_node)
            metrics["sync/shared_memory"] = float(self.shared_memory)
        else:
            # in-process: the engines copy the trainer's own tensors (device to device)
            named = self.train.call_rank0("named_tensors", self.bucket_bytes, False)
            versions = self.infer.call_all("update_weights", named, version)
            _check_committed(version, versions)
            metrics = {"sync/bytes": float(sum(t.numel() * t.element_size() for _n, t in named))}
        metrics["sync/seconds"] = time.perf_counter() - t0
        metrics["sync/weight_version"] = float(version)
        return metrics

    def can_stage(self) -> bool:
        """Whether `stage` works here: Ray mode with the shared-memory transport and room in
        /dev/shm for its two buffers (rl_runtime.cluster.sync_transport.staging_room; sets the sync up
        to know)."""
        self.setup()
        return self.mode == "broadcast" and self.shared_memory and self._staging_room

    def stage(self, version: int) -> tuple[Callable[[], None], dict[str, float]]:
        """Snapshot the trainer's weights as `version` into its shared-memory buffer now and
        return `(deliver, metrics)`: `deliver()` hands the buffer to every engine and checks the
        version they committed. Asynchronous training without partial rollout delivers between
        two rollout batches (rl_runtime.asynchrony.producer.RolloutProducer.post_weights), so the
        trainer goes on training instead of waiting for the batch in flight; the trainer's actor
        packs before it runs its next call, so the snapshot is of the weights just trained.
        Two buffers alternate (TrainWorker.export_weights_shared): a staged version may still
        wait for its delivery while the next is staged (rollout then delivers only the newer
        one), but no delivery may be running when the one after is staged
        (RolloutProducer.wait_for_delivery). Needs `can_stage`."""
        if not self.can_stage():
            raise RuntimeError(
                "WeightSync.stage needs the shared-memory transport (weight_sync_transport) "
                f"and room for its buffers; this sync is {self.mode} / "
                f"{self.transport.transport if self.transport else 'not set up'}, staging room: "
                f"{self._staging_room}"
            )
        t0 = time.perf_counter()
        self.settle()
        exported = self.train.call_all("export_weights_shared", version, self.bucket_bytes)[0]
        handle = exported["handle"]

        def deliver() -> None:
            refs = self.infer.submit("receive_weights_handle", handle, version)
            received = self.infer.wait(refs, "receive_weights_handle", self.timeout_s)
            _check_committed(version, [int(r.get("version", -1)) for r in received])

        metrics = {
            "sync/staged": 1.0,
            "sync/bytes": float(exported["bytes"]),
            "sync/pack_seconds": float(exported["seconds"]),
            "sync/shared_memory": 1.0,
            "sync/cross_node": 0.0,
            "sync/seconds": time.perf_counter() - t0,
            "sync/weight_version": float(version),
        }
        return deliver, metrics

    @property
    def shared_memory(self) -> bool:
        return self.transport is not None and self.transport.transport == "shared_memory"

    def when_committed(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the sync in flight has ended (at once when none is): from a
        watcher thread, without waiting here. The asynchronous pipeline opens the rollout's
        staleness gate with it, so a batch never starts on weights older than the gate allows;
        `settle` checks the outcome."""
        if self._pending is None:
            callback()
            return
        refs = self._pending[1]

        def watch() -> None:
            with contextlib.suppress(Exception):  # `settle` reports a failed transfer
                self.train.wait(refs, "send_weights/receive_weights", self.timeout_s)
            callback()

        threading.Thread(target=watch, name="weight-sync-watch", daemon=True).start()

    def settle(self) -> dict[str, float]:
        """Wait for the transfer calls of the sync in flight (if any) and check the version
        every engine committed; its transfer metrics ({} when none was in flight)."""
        if self._pending is None:
            return {}
        version, refs = self._pending
        self._pending = None
        results = self.train.wait(refs, "send_weights/receive_weights", self.timeout_s)
        # the versions the engines committed, as their transfer calls reported them (no further
        # call: with asynchronous rollout it would queue behind the next generation)
        received = results[len(self.train.workers) :]
        _check_committed(version, [int(r.get("version", -1)) for r in received])
        sent = results[0]
        return {
            "sync/bytes": sent.get("bytes", 0.0),
            "sync/buckets": sent.get("num_buckets", 0.0),
            "sync/gbps": sent.get("gbps", 0.0),
        }


def weight_sync_for(cluster: Any, components: Any, *, use_ray: bool) -> WeightSync | None:
    """The run's trainer -> engine sync (None without both actor_train and actor_infer): a
    broadcast group on Ray, direct calls in one process, with the cluster section's timeout,
    bucket size, address and transport."""
    if not (cluster.has("actor_train") and cluster.has("actor_infer")):
        return None
    settings = components.cluster
    return WeightSync(
        cluster["actor_train"],
        cluster["actor_infer"],
        mode="broadcast" if use_ray else "direct",
        timeout_s=settings.rpc_timeout,
        bucket_bytes=settings.sync_bucket_bytes,
        host=settings.sync_host,
        transport=settings.sync_transport,
    )


def _check_committed(version: int, versions: Sequence[int]) -> None:
    if any(v != version for v in versions):
        raise WeightSyncError(
            f"after syncing version {version} the rollout engines report versions {list(versions)}"
        )
