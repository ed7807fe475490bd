"""`RolloutWorker`: an rl-rollout engine, the agent loop and the rl-envs environments it steps,
as a Ray actor or in-process (`--no-ray`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rl_runtime.cluster.worker_process import _init_process, _sync_metrics
from rl_runtime.state.seeds import engine_seed, worker_seed


class RolloutWorker:
    """One rollout engine plus the agent loop over rl-envs environments."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        dist_env: Mapping[str, str],
        model_path: str,
        strategy_name: str,
        strategy_config: Mapping[str, Any] | None = None,
        dtype: str = "float32",
        seed: int = 0,
        env_configs: Mapping[str, Mapping[str, Any]] | None = None,
        agent_kwargs: Mapping[str, Any] | None = None,
        sandbox_allow_weak_isolation: bool = False,
        config_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        _init_process(dist_env, worker_seed(seed, "rollout", rank))
        from transformers import AutoTokenizer

        from rl_envs.sandbox.shared import configure_shared_pool
        from rl_rollout import build_engine

        # before any env grades an answer: the process-wide sandbox pool's isolation policy
        configure_shared_pool(allow_weak_isolation=sandbox_allow_weak_isolation)

        self.rank = rank
        self.engine = build_engine(
            strategy_name,
            model_path,
            dict(strategy_config or {}),
            dtype=dtype,
            seed=engine_seed(seed, rank),
            config_overrides=dict(config_overrides or {}),
        )
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.env_configs = {k: dict(v) for k, v in (env_configs or {}).items()}
        self.agent_kwargs = dict(agent_kwargs or {})
        from rl_runtime.step.failures import SandboxCounters

        self.sandbox = SandboxCounters()
        #: the trainer's shared-memory buffer, mapped (`receive_weights_shared`)
        self._ipc_receiver: Any = None

    def ready(self) -> bool:
        return True

    def rollout(
        self,
        assignments: Sequence[tuple[str, str, int]],
        sampling: Any,
        render_save_dir: str | None = None,
        render_count: int | None = None,
        split: str = "train",
    ) -> list:
        """Run one episode per `(group_id, tag, seed)`; returns `Trajectory` records in order.
        The sandbox counts of its envs go to `split`'s totals (`take_sandbox_stats(split)`)."""
        from rl_config.records import SamplingParams
        from rl_rollout.agent_loop import AgentLoop
        from rl_runtime.step.envs import make_envs, restore_env_seeds

        envs = make_envs(
            assignments,
            self.env_configs,
            render_save_dir=render_save_dir,
            render_count=render_count,
        )
        loop = AgentLoop(
            self.engine,
            self.tokenizer,
            sampling=sampling
            if isinstance(sampling, SamplingParams)
            else SamplingParams(**sampling),
            **self.agent_kwargs,
        )
        snapshot = self.sandbox.start(item[0] for item in envs)
        try:
            trajectories = asyncio.run(loop.run_episodes(envs))
            return restore_env_seeds(trajectories, assignments)
        finally:
            self.sandbox.stop(snapshot, split)
            for item in envs:
                env = item[-1] if isinstance(item, tuple) else item
                close = getattr(env, "close", None)
                if callable(close):
                    close()

    def generate(self, requests: Sequence[Any]) -> list:
        """Complete `GenerationRequest`s (single-turn, e.g. RLVR prompts): each request's
        `sampling.n` `GenerationResult`s, in request order."""
        return asyncio.run(self.engine.generate(list(requests)))

    def take_sandbox_stats(self, split: str = "train") -> dict[str, float]:
        """`sandbox/*` counts (calls, failures, timeouts, worker restarts ...) of the sandbox pools
        this worker's `split` rollouts used since the last take of `split` (see
        rl_runtime.step.failures.SandboxCounters)."""
        return self.sandbox.take(split)

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> int:
        self.engine.update_weights(named_tensors, version)
        return int(self.engine.weight_version)

    def node_address(self) -> tuple[str, str]:
        """(Ray node id, node IP) of this worker's node (("local", loopback) without Ray)."""
        from rl_runtime.cluster.sync_address import node_address

        node = node_address()
        return node.node_id, node.ip

    def init_sync_group(self, host: str, port: int, world_size: int, timeout_s: float) -> bool:
        from rl_runtime.cluster.sync_address import sync_local_addr
        from rl_sync.group import init_group
        from rl_sync.transfer import WeightReceiver

        self._sync_group = init_group(
            host,
            port,
            1 + self.rank,
            world_size,
            timeout_s=timeout_s,
            local_addr=sync_local_addr(host),
        )
        self._receiver = WeightReceiver(self._sync_group, last_version=self.engine.weight_version)
        return True

    def receive_weights(self, expected_version: int) -> dict[str, float]:
        """Receive one verified sync and commit it into the engine (version checked)."""
        from rl_sync.transfer import receive_into_engine

        metrics = receive_into_engine(
            self._receiver, self.engine, expected_version=expected_version
        )
        return _sync_metrics(metrics)

    def _shared_receiver(self) -> Any:
        from rl_sync.ipc import IpcReceiver

        if self._ipc_receiver is None:
            self._ipc_receiver = IpcReceiver("cpu", last_version=self.engine.weight_version)
        return self._ipc_receiver

    def receive_weights_shared(self, expected_version: int) -> dict[str, float]:
        """`receive_weights` through shared memory: receive the handle over the sync group, map
        the trainer's buffer (once), verify it and commit it into the engine (version checked)."""
        from rl_sync.transfer import engine_apply

        receiver = self._shared_receiver()
        metrics = receiver.receive_over(
            self._sync_group,
            engine_apply(self.engine, receiver),
            expected_version=expected_version,
        )
        return _sync_metrics(metrics)

    def receive_weights_handle(
        self, handle: dict[str, Any], expected_version: int
    ) -> dict[str, float]:
        """Commit the weights behind a handle `TrainWorker.export_weights_shared` returned:
        map, verify (version, checksum) and apply, as `receive_weights_shared` does."""
        from rl_sync.ipc import IpcHandle
        from rl_sync.transfer import engine_apply

        receiver = self._shared_receiver()
        metrics = receiver.receive(
            IpcHandle.from_json(handle),
            engine_apply(self.engine, receiver),
            expected_version=expected_version,
        )
        return _sync_metrics(metrics)

    def weight_version(self) -> int:
        return int(self.engine.weight_version)

    def engine_stats(self) -> dict[str, float]:
        """The engine's running counters (`generated_tokens`, `weight_swaps`, ...), readable
        while a generation runs (the actor takes two calls at once)."""
        return {k: float(v) for k, v in getattr(self.engine, "stats", {}).items()}

    def state_dict_for_check(self) -> dict[str, torch.Tensor]:
        return self.engine.state_dict_for_check()

    def sleep(self, level: int = 1) -> None:
        self.engine.sleep(level)

    def wake_up(self) -> None:
        self.engine.wake_up()

    def save_frames(self, out_dir: str) -> str:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return out_dir

    def shutdown(self) -> None:
        self.engine.shutdown()
