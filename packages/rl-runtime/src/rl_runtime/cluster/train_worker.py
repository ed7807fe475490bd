"""`TrainWorker`: one rank of a training role (actor, critic or reference) around an rl-train
backend, as a Ray actor or in-process (`--no-ray`)."""

from __future__ import annotations

import gc
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from rl_runtime.cluster.worker_process import _init_process, _sync_metrics, in_ray_actor
from rl_runtime.state.seeds import worker_seed


def _outputs(out: Any) -> dict[str, torch.Tensor]:
    """A backend's `ForwardOutput` as CPU float32 tensors by name (those it has)."""
    named = (("log_probs", out.log_probs), ("entropy", out.entropy), ("values", out.values),
             ("sum_pi_squared", out.sum_pi_squared))  # fmt: skip
    return {k: v.detach().float().cpu() for k, v in named if v is not None}


class TrainWorker:
    """One rank of a training role: forward (log-probs / values), train steps, weights, checkpoints.

    `training_args`/`model_args` are rl_train.args' dataclasses and `loss_config` an
    rl_train.losses `ActorLossConfig`/`CriticLossConfig` (frozen dataclasses, built by
    rl_runtime.compose; they cross process boundaries as they are).
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        dist_env: Mapping[str, str],
        role: str,
        model_path: str,
        strategy_name: str,
        strategy_config: Mapping[str, Any] | None = None,
        training_args: Any = None,
        model_args: Any = None,
        loss_config: Any = None,
        seed: int = 0,
        sync_adapter_only: bool = False,
    ) -> None:
        _init_process(dist_env, worker_seed(seed, "train", rank))
        self.rank = rank
        self.role = role
        #: weight syncs to the engines carry the LoRA adapter only (rl_sync.adapter), which the
        #: engines merge into the base weights they loaded; False: the full (merged) weights
        self.sync_adapter_only = sync_adapter_only
        #: how the backend is built, but the model: `reload` builds it again from another one
        self._backend_args: dict[str, Any] = {
            "role": role,
            "strategy_config": dict(strategy_config or {}),
            "training_args": training_args,
            "model_args": model_args,
            "loss_config": loss_config,
        }
        self._strategy_name = strategy_name
        #: where `adopt_weights` wrote the weights this worker now holds (removed at shutdown)
        self._adopted_dir: str | None = None
        self.backend = self._build_backend(model_path)
        #: the weight-sync store's socket between `open_sync_listener` and `init_sync_group`
        self._sync_listener: socket.socket | None = None
        #: rank 0's shared-memory buffers of the weights: one for `send_weights_shared`, two
        #: alternating ones for `export_weights_shared`
        self._ipc_sender: Any = None
        self._staging_sender: Any = None
        #: `train_step(loss="kd")`'s loss config (`set_distill_loss`)
        self._kd_config: Any = None
        #: the schedule's (base rates, multipliers) while `hold_learning_rate` holds the rate
        self._held_schedule: tuple[list[float], list[Any]] | None = None

    def _build_backend(self, model_path: str) -> Any:
        from rl_train import build_backend

        self._model_path = model_path
        return build_backend(self._strategy_name, model_path=model_path, **self._backend_args)

    def ready(self) -> bool:
        return True

    def reload(self, model_path: str) -> None:
        """Build the backend again, the same way, from the HF model directory `model_path`: the
        reference role taking the policy RL starts from (a checkpoint's `reference/`). A role
        with an optimizer starts it afresh. Collective: every rank of the role calls it."""
        del self.backend  # its memory is free before the new one is built
        gc.collect()
        self.backend = self._build_backend(model_path)

    def adopt_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Hold `named_tensors` (HF names, full tensors: another role's `named_tensors()`) as
        this worker's weights: the reference role takes the policy a supervised warm-up made,
        the model RL starts from. Written as an HF directory of this worker's own architecture
        (rl_train.export.save_state_as_hf) in a directory of its own, then `reload`ed."""
        from rl_train.export import save_state_as_hf

        previous = self._adopted_dir
        self._adopted_dir = tempfile.mkdtemp(prefix=f"rl-{self.role}-adopted-")
        out = save_state_as_hf(self.backend, dict(named_tensors), Path(self._adopted_dir) / "model")
        self.reload(str(out))
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return _outputs(self.backend.forward(batch))

    def forward_base(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`forward` of the base model, the LoRA adapter disabled (the reference log-probs of
        a LoRA actor whose reference is its base model)."""
        return _outputs(self.backend.forward_base(batch))

    def forward_topk(
        self, batch: dict[str, torch.Tensor], k: int, temperature: float = 1.0
    ) -> dict[str, torch.Tensor]:
        """The model's top-`k` next-token distribution at every position (a distillation
        teacher's; rl_train `forward_topk`): `{teacher_topk_log_probs, teacher_topk_ids}`,
        `[B, T, k]` each."""
        from rl_runtime.step.losses import TEACHER_IDS, TEACHER_LOG_PROBS

        lp, ids = self.backend.forward_topk(batch, k, temperature)
        return {TEACHER_LOG_PROBS: lp, TEACHER_IDS: ids}

    def set_distill_loss(self, config: Any) -> None:
        """The `KDLossConfig` (rl_runtime.step.losses) `train_step(loss="kd")` trains with."""
        self._kd_config = config

    def train_step(self, batch: dict[str, torch.Tensor], loss: str = "default") -> dict:
        """One `train_step` with the backend's configured loss, or `loss="sft"` (warm-up: one
        pass over the batch, whatever `ppo_epochs` says), or `loss="kd"` (one pass of
        token-level distillation with the config `set_distill_loss` gave)."""
        if loss == "sft":
            from rl_runtime.step.losses import sft_loss_fn

            return dict(self.backend.train_step(batch, sft_loss_fn, epochs=1))
        if loss == "kd":
            from rl_runtime.step.losses import kd_loss_fn

            config = self._kd_config
            if config is None:
                raise ValueError("train_step(loss='kd') before set_distill_loss")
            return dict(self.backend.train_step(batch, kd_loss_fn(config), epochs=1))
        if loss != "default":
            raise ValueError(f"unknown loss {loss!r}; use 'default', 'sft' or 'kd'")
        return dict(self.backend.train_step(batch))

    def hold_learning_rate(self, learning_rate: float | None = None) -> float:
        """Train at a constant rate until `restart_schedule`, whatever the LR schedule (warm-up,
        decay) says: `learning_rate`, or the configured one when None. For a supervised warm-up
        before RL, which must neither follow nor use up RL's schedule. Needs a backend with
        `optimizer` and a LambdaLR `scheduler` (rl_train's backends); returns the rate."""
        optimizer, scheduler = self._optimizer_and_scheduler()
        if self._held_schedule is None:
            self._held_schedule = (list(scheduler.base_lrs), list(scheduler.lr_lambdas))
        base_lrs = self._held_schedule[0]
        rates = [learning_rate] * len(base_lrs) if learning_rate is not None else base_lrs
        scheduler.base_lrs = list(rates)
        scheduler.lr_lambdas = [_constant_multiplier] * len(rates)
        for group, rate in zip(optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        return float(optimizer.param_groups[0]["lr"])

    def restart_schedule(self) -> float:
        """Start optimization afresh: the LR schedule back at its step 0 (after
        `hold_learning_rate`, the configured schedule again) and the optimizer's moment
        estimates forgotten (a supervised warm-up's much larger gradient statistics would shrink
        RL's first updates), its gradients too (`set_to_none`: an optimizer that has gradients
        but no state is one torch's checkpoint code takes as initialised). The weights are kept.
        Returns the rate of the next step."""
        optimizer, scheduler = self._optimizer_and_scheduler()
        if self._held_schedule is not None:
            scheduler.base_lrs, scheduler.lr_lambdas = (list(x) for x in self._held_schedule)
            self._held_schedule = None
        optimizer.state.clear()
        optimizer.zero_grad(set_to_none=True)
        scheduler.last_epoch = -1
        scheduler.step()  # to step 0: every group's rate is base * multiplier(0)
        return float(optimizer.param_groups[0]["lr"])

    def _optimizer_and_scheduler(self) -> tuple[Any, Any]:
        optimizer = getattr(self.backend, "optimizer", None)
        scheduler = getattr(self.backend, "scheduler", None)
        if optimizer is None or not hasattr(scheduler, "lr_lambdas"):
            raise NotImplementedError(
                f"{type(self.backend).__name__} exposes no optimizer and LambdaLR scheduler"
            )
        return optimizer, scheduler

    def named_tensors(
        self, bucket_bytes: int = 1 << 28, host_copies: bool = True, tied_once: bool = False
    ) -> list[tuple[str, torch.Tensor]]:
        """All HF-named full tensors: CPU copies (for the object store, checks and exports), or,
        with ``host_copies=False``, the backend's own tensors where they live (the in-process
        weight sync: an engine's `update_weights` copies what it keeps before it returns, so the
        weights never round-trip through host memory on a device). ``tied_once``: a tied
        parameter under its first name only (a weight sync; rl_train's `tied_aliases`)."""
        out: list[tuple[str, torch.Tensor]] = []
        for bucket in self.backend.iter_full_tensor_buckets(bucket_bytes, tied_once=tied_once):
            if host_copies:
                out.extend((n, t.detach().cpu().clone()) for n, t in bucket)
            else:
                out.extend((n, t.detach()) for n, t in bucket)
        return out

    def replay_spec(self) -> dict[str, Any]:
        """How this rank's trainer was built, as plain data (rl_runtime.state.step_record.
        TrainerSpec): what `rl-replay` builds it again from."""
        import msgspec

        args = self._backend_args
        loss = args["loss_config"]
        return {
            "strategy_name": self._strategy_name,
            "model_path": self._model_path,
            "backend_role": self.role,
            "world_size": int(getattr(self.backend, "world_size", 1)),
            "strategy_config": msgspec.to_builtins(args["strategy_config"]),
            "training_args": msgspec.to_builtins(args["training_args"] or {}),
            "model_args": msgspec.to_builtins(args["model_args"] or {}),
            "loss_config_type": None if loss is None else type(loss).__name__,
            "loss_config": None if loss is None else msgspec.to_builtins(loss),
            "num_threads": torch.get_num_threads(),
            "torch_version": str(torch.__version__),
        }

    def rng_state(self) -> torch.Tensor:
        """This process's torch CPU RNG state, `[N]` uint8 (what a recorded step starts from)."""
        from rl_runtime.state.step_record import rng_tensor

        return rng_tensor()

    def weight_checksum(self) -> str:
        """sha256 of the full weights (rl_runtime.state.step_record.weight_checksum). Collective:
        every rank of the role calls it."""
        from rl_runtime.state.step_record import weight_checksum

        return weight_checksum(self.named_tensors())

    def state_dict_for_check(self) -> dict[str, torch.Tensor]:
        return dict(self.named_tensors())

    def node_address(self) -> tuple[str, str]:
        """(Ray node id, node IP) of this worker's node (("local", loopback) without Ray)."""
        from rl_runtime.cluster.sync_address import node_address

        node = node_address()
        return node.node_id, node.ip

    def open_sync_listener(self, host: str) -> int:
        """Bind and listen on `host` (this worker's node address or loopback), port 0: the sync
        group's store socket, held until `init_sync_group` hands it to the store. Returns its
        port, which nothing else can take in between (a port only found free could be)."""
        from rl_sync.store import bind_listener

        if self._sync_listener is not None:
            self._sync_listener.close()
        self._sync_listener = bind_listener(host, 0)
        return int(self._sync_listener.getsockname()[1])

    def init_sync_group(self, host: str, port: int, world_size: int, timeout_s: float) -> bool:
        """Rank 0 hosts the weight-sync group (trainer = rank 0, rollout workers = 1..N), on the
        socket `open_sync_listener` bound, if any."""
        if self.rank != 0:
            return False
        from rl_runtime.cluster.sync_address import sync_local_addr
        from rl_sync.group import init_group

        listener, self._sync_listener = self._sync_listener, None
        self._sync_group = init_group(
            host,
            port,
            0,
            world_size,
            timeout_s=timeout_s,
            local_addr=sync_local_addr(host),
            listener=listener,
        )
        return True

    def _full_tensors(self, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]] | None:
        """The full (gathered) tensors a weight sync sends (with `sync_adapter_only`, the
        adapter-only payload), lazily, on rank 0; None on the other ranks, which only
        take part in the gathering (`iter_full_tensor_buckets` is collective: every rank of the
        role runs the same call)."""
        buckets = (
            self.backend.iter_adapter_buckets(bucket_bytes)
            if self.sync_adapter_only
            else self.backend.iter_full_tensor_buckets(bucket_bytes)
        )
        if self.rank != 0:
            for _bucket in buckets:
                pass
            return None
        return (item for bucket in buckets for item in bucket)

    def send_weights(self, version: int, bucket_bytes: int = 1 << 26) -> dict[str, float]:
        """Rank 0 broadcasts the weights to the rollout ranks (buckets over the sync group)."""
        named = self._full_tensors(bucket_bytes)
        if named is None:
            return {}
        from rl_sync.transfer import WeightSender

        sender = WeightSender(self._sync_group, bucket_bytes=bucket_bytes)
        return _sync_metrics(sender.send(named, version))

    def sync_info(self, measure: bool, bucket_bytes: int = 1 << 26) -> dict[str, Any]:
        """What choosing the weight-sync transport needs (rl_runtime.cluster.sync_transport): the device
        kind the weights live on and, with `measure`, the bytes of the full weights and the free
        shared memory of this node. Collective with `measure` (the full tensors are gathered
        once): every rank of the role calls it."""
        info: dict[str, Any] = {"device": str(self.backend.device_kind)}
        if measure:
            from rl_runtime.cluster.sync_transport import shm_free_bytes

            info["weight_bytes"] = sum(
                t.numel() * t.element_size()
                for bucket in self.backend.iter_full_tensor_buckets(bucket_bytes)
                for _name, t in bucket
            )
            info["shm_free_bytes"] = shm_free_bytes()
        return info

    def _shared_sender(self) -> Any:
        from rl_sync.ipc import IpcSender

        if self._ipc_sender is None:
            self._ipc_sender = IpcSender("cpu")
        return self._ipc_sender

    def send_weights_shared(self, version: int, bucket_bytes: int = 1 << 26) -> dict[str, float]:
        """`send_weights` through shared memory (rl_sync.ipc): rank 0 packs the full weights into
        its /dev/shm buffer (kept across versions, removed at shutdown) and sends the handle
        over the sync group."""
        named = self._full_tensors(bucket_bytes)
        if named is None:
            return {}
        return _sync_metrics(self._shared_sender().send_over(self._sync_group, named, version))

    def export_weights_shared(self, version: int, bucket_bytes: int = 1 << 26) -> dict[str, Any]:
        """Rank 0 packs the full weights as `version` into its /dev/shm buffer and returns the
        handle (`handle`: rl_sync.ipc.IpcHandle.to_json, for `RolloutWorker.
        receive_weights_handle`) and the pack's metrics, without waiting for any receiver: the
        buffer is a snapshot the next training step does not change, delivered later (between
        two rollout batches: rl_runtime.cluster.weight_sync.WeightSync.stage). Exports alternate between
        two buffers (kept across versions, removed at shutdown), so a handle stays valid while
        the next export is packed; the one after reuses its buffer."""
        named = self._full_tensors(bucket_bytes)
        if named is None:
            return {}
        t0 = time.perf_counter()
        if self._staging_sender is None:
            from rl_sync.ipc import IpcSender

            self._staging_sender = IpcSender("cpu", num_buffers=2)
        handle = self._staging_sender.export(named, version)
        seconds = time.perf_counter() - t0
        return {"handle": handle.to_json(), "bytes": float(handle.nbytes), "seconds": seconds}

    def save_checkpoint(
        self, root: str, step: int, extra: dict | None = None, key_file: str | None = None
    ) -> str:
        return str(self.backend.save_checkpoint(root, step, extra or {}, key_file=key_file))

    def load_checkpoint(self, root: str, key_file: str | None = None) -> tuple[int, dict]:
        step, extra = self.backend.load_checkpoint(root, key_file=key_file)
        return int(step), dict(extra or {})

    def export_hf(self, out_dir: str) -> str:
        return str(self.backend.export_hf(out_dir))

    def offload(self) -> None:
        self.backend.offload()

    def onload(self) -> None:
        self.backend.onload()

    def shutdown(self) -> None:
        import torch.distributed as dist

        if self._adopted_dir is not None:
            shutil.rmtree(self._adopted_dir, ignore_errors=True)
            self._adopted_dir = None
        for sender in (self._ipc_sender, self._staging_sender):
            if sender is not None:
                sender.close()
        self._ipc_sender = self._staging_sender = None
        # A Ray actor's process is killed right after this call, which closes the group's sockets;
        # destroying a gloo group can deadlock on torch 2.7 (rl_train.dist._leave says how), which
        # cost the bounded shutdown call its full minute. In the driver's process (`--no-ray`)
        # the group is destroyed, so that a later run there can start its own.
        if dist.is_available() and dist.is_initialized() and not in_ray_actor():
            dist.destroy_process_group()


def _constant_multiplier(step: int) -> float:
    """The LR multiplier of a held rate (`TrainWorker.hold_learning_rate`), at any step."""
    return 1.0
