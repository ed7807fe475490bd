"""The agentic pipeline (ROLL's AgenticPipeline, seed 004): setup, step loop, teardown.

Every block comes from rl_runtime; this file only decides the order:

    rollout (AgentLoop over env groups) -> collate -> reference / old log-probs (+ critic values)
    -> advantages (reward normalisation + adv_estimator) -> train -> weight sync (version checked)
    -> log -> evaluate every eval_steps -> checkpoint every save_steps
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from agentic_options import AppOptions

from rl_algos.correction import mismatch_metrics
from rl_runtime.advantages import AdvantageConfig, compute_advantages
from rl_runtime.checkpoint import CheckpointManager, RunState, capture_rng, restore_rng
from rl_runtime.cluster import Cluster, RoleSpec, WeightSync
from rl_runtime.collate import CollatedBatch, collate_trajectories, merge_rows, shard_rows
from rl_runtime.envs import env_assignments
from rl_runtime.metrics import rollout_metrics, val_metrics
from rl_runtime.ray_setup import RayOptions
from rl_runtime.timing import PhaseTimer, StepProgress
from rl_runtime.tracking import Tracker
from rl_runtime.workers import RolloutWorker, TrainWorker

ROLE_OF = {"actor_train": "actor", "critic": "critic", "reference": "reference"}


def _dtype_name(dtype: str) -> str:
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)


def env_configs(cfg: Any) -> dict[str, dict[str, Any]]:
    """Per-tag env specs from custom_envs: `{"env_type": ..., "config": env_config}`."""
    out: dict[str, dict[str, Any]] = {}
    for tag, env in cfg.custom_envs.items():
        kw = dict(env.env_config or {})
        if env.max_steps is not None:
            kw.setdefault("max_steps", env.max_steps)
        out[tag] = {"env_type": env.env_type, "config": kw}
    return out


def algorithm_dict(cfg: Any) -> dict[str, Any]:
    from rl_config.schema.algorithm import AlgorithmFields

    data = cfg.model_dump(mode="python")
    out = {k: data[k] for k in AlgorithmFields.model_fields if k in data}
    out["pg_variant"] = cfg.actor_train.pg_variant
    return out


class AgenticPipeline:
    def __init__(self, cfg: Any, app: AppOptions, *, rollout_only: bool = False) -> None:
        self.cfg = cfg
        self.app = app
        self.rollout_only = rollout_only
        self.step = 0
        self.weight_version = 0
        self.out_dir = Path(cfg.output_dir)
        self.timer = PhaseTimer()
        self.cluster: Cluster | None = None
        self.sync: WeightSync | None = None
        self.tracker: Tracker | None = None
        self.summary: dict[str, dict[str, float | str]] = {}

    # ------------------------------------------------------------------------------- setup
    @property
    def workers(self) -> Cluster:
        if self.cluster is None:
            raise RuntimeError("the pipeline is not set up (call setup() first)")
        return self.cluster

    @property
    def weights(self) -> WeightSync:
        if self.sync is None:
            raise RuntimeError("no weight sync in rollout-only mode")
        return self.sync

    @property
    def log(self) -> Tracker:
        if self.tracker is None:
            raise RuntimeError("the pipeline is not set up (call setup() first)")
        return self.tracker

    def model_path(self) -> str:
        path = self.cfg.pretrain
        if self.app.build_tiny_model:
            from rl_rollout.tiny_model import build_tiny_model

            t = self.app.tiny_model
            path = str(
                build_tiny_model(
                    path,
                    hidden_size=t.hidden_size,
                    num_layers=t.num_layers,
                    num_heads=t.num_heads,
                    num_kv_heads=t.num_kv_heads,
                    intermediate_size=t.intermediate_size,
                    seed=t.seed,
                )
            )
        return _resolve_local(str(path))

    def role_specs(self, model_path: str) -> list[RoleSpec]:
        cfg = self.cfg
        specs = []
        infer = cfg.actor_infer
        specs.append(
            RoleSpec(
                "actor_infer",
                RolloutWorker,
                infer.device_mapping or [0],
                dict(
                    model_path=_resolve_local(infer.model_args.model_name_or_path or model_path),
                    strategy_name=infer.strategy_args.strategy_name,
                    strategy_config=dict(infer.strategy_args.strategy_config or {}),
                    dtype=_dtype_name(infer.model_args.dtype),
                    seed=cfg.seed,
                    env_configs=env_configs(cfg),
                    agent_kwargs=dict(
                        max_tokens_per_step=cfg.max_tokens_per_step or 128,
                        max_running_requests=cfg.max_running_requests,
                        max_sequence_length=cfg.sequence_length,
                        mode=self.app.agent_loop_mode,
                    ),
                ),
                infer.num_gpus_per_worker,
            )
        )
        if self.rollout_only:
            return specs
        train_roles = ["actor_train"]
        if cfg.enable_reference:
            train_roles.append("reference")
        if cfg.critic is not None:
            train_roles.append("critic")
        algo = algorithm_dict(cfg)
        for role in train_roles:
            worker = getattr(cfg, role)
            targs = worker.training_args.model_dump(mode="python")
            targs.update(
                ppo_epochs=cfg.ppo_epochs,
                max_grad_norm=cfg.max_grad_norm,
                seed=cfg.seed,
                infer_batch_size=worker.infer_batch_size,
                max_steps=max(1, cfg.max_steps),
            )
            specs.append(
                RoleSpec(
                    role,
                    TrainWorker,
                    worker.device_mapping or [0],
                    dict(
                        role=ROLE_OF[role],
                        model_path=_resolve_local(
                            worker.model_args.model_name_or_path or model_path
                        ),
                        strategy_name=worker.strategy_args.strategy_name,
                        strategy_config=dict(worker.strategy_args.strategy_config or {}),
                        training_args=targs,
                        model_args=worker.model_args.model_dump(mode="python"),
                        loss_config=algo if role in ("actor_train", "critic") else None,
                        seed=cfg.seed,
                    ),
                    worker.num_gpus_per_worker,
                )
            )
        return specs

    def setup(self) -> None:
        cfg, app = self.cfg, self.app
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        model_path = self.model_path()
        from rl_sync.device import detect_device_kind, ray_resource_name

        kind = detect_device_kind()
        self.cluster = Cluster.start(
            self.role_specs(model_path),
            num_devices=cfg.total_devices,
            device_kind=kind,
            resource_name=ray_resource_name(kind),
            use_ray=app.use_ray,
            ray_options=RayOptions(
                num_cpus=app.num_cpus,
                object_store_bytes=app.object_store_mb * 1024**2 if kind == "cpu" else None,
                env_vars=dict(cfg.system_envs),
            ),
            rpc_timeout=float(cfg.rpc_timeout),
            cpu_per_bundle=app.cpu_per_bundle,
        )
        self.tracker = Tracker(
            cfg.track_with, cfg.logging_dir, cfg.tracker_kwargs, stdout_keys=STDOUT_KEYS
        )
        if not self.rollout_only:
            self.sync = WeightSync(
                self.workers["actor_train"],
                self.workers["actor_infer"],
                mode="broadcast" if app.use_ray else "direct",
                timeout_s=float(cfg.rpc_timeout),
                bucket_bytes=int(cfg.model_update_buffer_size_mb) * 1024**2,
            )
            self.ckpt = CheckpointManager(
                cfg.checkpoint_dir,
                keep_last=cfg.max_ckpt_to_keep or None,
                key_file=cfg.checkpoint_config.key_file,
            )
            self.ckpt.cleanup()
            resume = self.ckpt.resolve(cfg.resume_from_checkpoint)
            if resume is not None:
                self.restore(resume)

    # ---------------------------------------------------------------------------- blocks
    def rollout(self, split: str, epoch: int, greedy: bool = False) -> list:
        """Play one batch of episodes: `train` samples with actor_infer's generating_args; `val`
        does too (the policy RL optimises) unless `greedy`."""
        cfg = self.cfg
        mgr = cfg.train_env_manager if split == "train" else cfg.val_env_manager
        assignments = env_assignments(
            tags=mgr.tags,
            num_env_groups=mgr.num_env_groups,
            group_size=mgr.group_size,
            num_groups_partition=mgr.num_groups_partition,
            base_seed=cfg.seed,
            epoch=epoch,
            split=split,
            num_episodes=cfg.rollout_batch_size if split == "train" else None,
        )
        gen = cfg.actor_infer.generating_args
        sampling = dict(
            temperature=0.0 if greedy else gen.temperature,
            top_p=1.0 if greedy else gen.top_p,
            top_k=gen.top_k if (not greedy and gen.top_k > 0) else -1,
            max_new_tokens=min(gen.max_new_tokens, cfg.max_tokens_per_step or gen.max_new_tokens),
            seed=cfg.seed * 100_003 + epoch * 7 + (0 if split == "train" else 1),
        )
        infer = self.workers["actor_infer"]
        chunks = shard_rows(assignments, len(infer.workers))
        render = None
        if split == "val" and cfg.render_save_dir:
            render = str(Path(cfg.render_save_dir) / f"step_{self.step:05d}")
        args = [
            (chunk, sampling, render if i == 0 else None, self.app.render_val_envs)
            for i, chunk in enumerate(chunks)
        ]
        results = infer.wait(infer.submit_each("rollout", args), "rollout")
        return [t for part in results for t in part]

    def forward(self, role: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        group = self.workers[role]
        shards = shard_rows(tensors, len(group.workers))
        outs = group.wait(group.submit_each("forward", [(s,) for s in shards]), "forward")
        return merge_rows(outs)

    def train(self, role: str, tensors: dict[str, torch.Tensor], loss: str = "default") -> dict:
        group = self.workers[role]
        shards = shard_rows(tensors, len(group.workers))
        outs = group.wait(
            group.submit_each("train_step", [(s, loss) for s in shards]), "train_step"
        )
        return outs[0]

    def collate(self, trajectories: list) -> CollatedBatch:
        return collate_trajectories(
            trajectories, pad_token_id=self.pad_token_id, max_length=self.cfg.sequence_length
        )

    @property
    def pad_token_id(self) -> int:
        if not hasattr(self, "_pad"):
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(self.model_path_cache)
            self._pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        return self._pad

    # ------------------------------------------------------------------------------ step
    def train_step(self) -> dict[str, float]:
        _cfg, timer, cluster = self.cfg, self.timer, self.workers
        timer.reset()
        with timer.phase("rollout"):
            cluster.enter_phase("rollout")
            trajectories = self.rollout("train", epoch=self.step)
        batch = self.collate(trajectories)
        tensors = dict(batch.tensors)
        cluster.enter_phase("train")
        with timer.phase("old_log_probs"):
            old = self.forward("actor_train", tensors)
            tensors["old_log_probs"] = old["log_probs"]
        mismatch = mismatch_metrics(
            tensors["old_log_probs"], tensors["rollout_log_probs"], tensors["response_mask"]
        )
        ref_lp = None
        if cluster.has("reference"):
            with timer.phase("ref_log_probs"):
                ref_lp = self.forward("reference", tensors)["log_probs"]
                tensors["ref_log_probs"] = ref_lp
        values = None
        if cluster.has("critic"):
            with timer.phase("values"):
                values = self.forward("critic", tensors)["values"]
                tensors["values"] = values
        with timer.phase("advantages"):
            adv = compute_advantages(
                batch,
                self.adv_cfg,
                values=values,
                log_probs=tensors["old_log_probs"],
                ref_log_probs=ref_lp,
            )
            tensors["advantages"] = adv["advantages"]
            tensors["returns"] = adv["returns"]
        metrics: dict[str, float] = {}
        if cluster.has("critic"):
            with timer.phase("critic_train"):
                metrics.update(_prefixed(self.train("critic", tensors), "critic/"))
        with timer.phase("actor_train"):
            metrics.update(_prefixed(self.train("actor_train", tensors), "train/"))
        with timer.phase("sync"):
            cluster.enter_phase("rollout")
            self.weight_version += 1
            metrics.update(self.weights.sync(self.weight_version))
            if self.app.check_sync_weights:
                metrics["sync/max_abs_diff"] = self.sync_weight_diff()
        self.step += 1
        metrics.update(rollout_metrics(trajectories, batch))
        # train/inference mismatch of this rollout (engine vs trainer log-probs of the same tokens)
        metrics.update({f"rollout/{k}": float(v) for k, v in mismatch.items()})
        metrics["train/advantage_mean"] = float(
            adv["advantages"].sum() / batch.tensors["response_mask"].sum().clamp(min=1)
        )
        metrics.update(timer.metrics())
        return metrics

    def sync_weight_diff(self) -> float:
        """Largest |trainer - engine| over the parameters the engines expose (0.0 after an exact
        sync). vLLM on the CPU cannot read back oneDNN-packed linear weights, so only the common
        names are compared; an engine name the trainer lacks is an error."""
        trainer = self.workers["actor_train"].call_rank0("state_dict_for_check")
        diffs = []
        for engine in self.workers["actor_infer"].call_all("state_dict_for_check"):
            extra = sorted(set(engine) - set(trainer))
            if extra or not engine:
                raise RuntimeError(f"engine parameters not in the trainer: {extra[:5]}")
            diffs += [float((trainer[k].float() - engine[k].float()).abs().max()) for k in engine]
        return max(diffs) if diffs else 0.0

    def evaluate(self) -> dict[str, float]:
        if self.cfg.val_env_manager is None:
            return {}
        t0 = time.perf_counter()
        self.workers.enter_phase("rollout")
        out = val_metrics(self.rollout("val", epoch=0))
        if self.app.eval_greedy:
            out.update(val_metrics(self.rollout("val", epoch=0, greedy=True), prefix="val/greedy"))
        out["timing/eval"] = time.perf_counter() - t0
        return out

    # ----------------------------------------------------------------------- warm-up (SFT)
    def warmup(self) -> dict[str, float]:
        w = self.app.warmup
        from rl_runtime.demos import solver_demonstrations

        cfg = self.cfg
        tm = cfg.train_env_manager
        t0 = time.perf_counter()
        demos = solver_demonstrations(
            self.model_path_cache,
            tags=tm.tags,
            env_configs=env_configs(cfg),
            num_episodes=w.episodes,
            base_seed=cfg.seed + 1_000_000,
            max_tokens_per_step=cfg.max_tokens_per_step or 128,
            max_sequence_length=cfg.sequence_length,
            action_noise=w.action_noise,
            seed=cfg.seed,
        )
        batch = self.collate(demos)
        n = batch.batch_size
        gen = torch.Generator().manual_seed(cfg.seed)
        self.workers.enter_phase("train")
        base_lr = cfg.actor_train.training_args.learning_rate
        factor = (w.learning_rate / base_lr) if w.learning_rate else 1.0
        if factor != 1.0:
            self.workers["actor_train"].call_all("scale_learning_rate", factor)
        last: dict[str, float] = {}
        for i in range(w.steps):
            rows = torch.randperm(n, generator=gen)[: w.batch_size]
            tensors = {k: v[rows] for k, v in batch.tensors.items()}
            last = self.train("actor_train", tensors, loss="sft")
            if self.tracker and (i % 5 == 0 or i == w.steps - 1):
                self.log.log(
                    {f"warmup/{k}": v for k, v in last.items() if isinstance(v, int | float)},
                    step=-(w.steps - i),
                )
        if factor != 1.0:
            self.workers["actor_train"].call_all("scale_learning_rate", 1.0 / factor)
        # RL starts with fresh Adam moments: the warm-up's (large SFT gradients) would shrink
        # the first RL updates for hundreds of steps (beta2 = 0.999)
        self.workers["actor_train"].call_all("reset_optimizer_state")
        self.workers.enter_phase("rollout")
        self.weight_version += 1
        self.weights.sync(self.weight_version)
        return {"warmup/seconds": time.perf_counter() - t0, "warmup/demos": float(n)}

    # --------------------------------------------------------------------- checkpointing
    def save(self) -> Path:
        cluster = self.workers

        def write(d: Path) -> None:
            for role in ("actor_train", "critic"):
                if cluster.has(role):
                    cluster[role].call_all(
                        "save_checkpoint", str(d / role), self.step, None, self.ckpt.key_file
                    )

        state = RunState(
            step=self.step,
            weight_version=self.weight_version,
            env_seed_epoch=self.step,
            rng=capture_rng(),
            extra={"warmed_up": True},
        )
        return self.ckpt.save(state, write)

    def restore(self, path: Path) -> None:
        state = self.ckpt.load_state(path)
        for role in ("actor_train", "critic"):
            if self.workers.has(role):
                self.workers[role].call_all("load_checkpoint", str(path / role), self.ckpt.key_file)
        self.step = state.step
        self.weight_version = state.weight_version
        restore_rng(state.rng)
        self.resumed_from = path
        # engines get the restored weights under the restored version
        self.workers.enter_phase("rollout")
        self.weights.sync(self.weight_version)

    # ------------------------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        cfg, app = self.cfg, self.app
        t_start = time.perf_counter()
        self.model_path_cache = self.model_path()
        self.adv_cfg = AdvantageConfig(
            adv_estimator=cfg.adv_estimator,
            grouping=cfg.reward_normalization.grouping,
            method=cfg.reward_normalization.method,
            gamma=cfg.gamma,
            lam=cfg.lambd,
            whiten_advantages=cfg.whiten_advantages,
            advantage_clip=cfg.advantage_clip,
            kl_coef=cfg.init_kl_coef,
        )
        self.setup()
        assert self.tracker is not None
        try:
            if self.rollout_only:
                return self.run_rollout_only()
            resumed = hasattr(self, "resumed_from")
            if not resumed and app.warmup.steps > 0:
                self.log.log(self.warmup(), step=0)
            if app.eval_before_training and not resumed and cfg.val_env_manager is not None:
                before = self.evaluate()
                self.log.log(before, step=self.step)
                self.summary["before RL"] = _summary_row(before)
            with StepProgress(cfg.max_steps, self.step) as progress:
                while self.step < cfg.max_steps:
                    metrics = self.train_step()
                    if self.step % cfg.eval_steps == 0 or self.step == cfg.max_steps:
                        metrics.update(self.evaluate())
                    if self.step % cfg.logging_steps == 0 or self.step == cfg.max_steps:
                        self.log.log(metrics, step=self.step)
                    if cfg.save_steps and self.step % cfg.save_steps == 0:
                        self.save()
                    progress.advance(
                        {k: v for k, v in metrics.items() if k.startswith("timing/")},
                        f"success={metrics.get('env/success_rate', float('nan')):.2f}",
                    )
                    if metrics.get("val/success_rate") is not None and self.step == cfg.max_steps:
                        self.summary["after RL"] = _summary_row(metrics)
            return self.finish(time.perf_counter() - t_start)
        finally:
            self.teardown()

    def run_rollout_only(self) -> dict[str, Any]:
        from rl_config.records import to_jsonl

        out = self.out_dir / "rollouts.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        total = 0
        with out.open("wb") as f:
            for epoch in range(self.cfg.max_steps):
                trajectories = self.rollout("train", epoch=epoch)
                f.write(to_jsonl(trajectories))
                total += len(trajectories)
                succ = sum(t.success for t in trajectories) / max(1, len(trajectories))
                self.log.log(
                    {"env/success_rate": succ, "env/num_trajectories": float(len(trajectories))},
                    step=epoch,
                )
        print(f"wrote {total} trajectories to {out}")
        return {"rollouts": str(out), "num_trajectories": total}

    def finish(self, wall: float) -> dict[str, Any]:
        from rl_runtime.curves import write_curves

        cfg = self.cfg
        png = write_curves(
            self.log.history, Path(cfg.output_dir) / "curves.png", title=cfg.exp_name
        )
        hf_dir = None
        if self.app.export_hf:
            hf_dir = self.workers["actor_train"].call_rank0(
                "export_hf", str(Path(cfg.output_dir) / "hf_model")
            )
        result = {
            "wall_seconds": wall,
            "curves": str(png),
            "hf_model": hf_dir,
            "summary": self.summary,
            "step": self.step,
            "weight_version": self.weight_version,
        }
        return result

    def teardown(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None


STDOUT_KEYS = [
    "env/success_rate",
    "env/episode_reward",
    "val/success_rate",
    "val/episode_reward",
    "train/loss",
    "train/pg_loss",
    "train/grad_norm",
    "sync/weight_version",
    "timing/step",
]


def _resolve_local(path: str) -> str:
    """An existing local path made absolute here, in the driver (Ray workers may run in another
    working directory); anything else (a hub id) unchanged."""
    return str(Path(path).resolve()) if Path(path).exists() else path


def _prefixed(metrics: dict, prefix: str) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, int | float):
            name = k if k.startswith(prefix) else prefix + k.split("/")[-1]
            out[name] = float(v)
    return out


def _summary_row(metrics: dict[str, float]) -> dict[str, float | str]:
    keys = ("success_rate", "greedy/success_rate", "episode_reward", "num_turns", "format_ok")
    return {k: float(metrics[f"val/{k}"]) for k in keys if f"val/{k}" in metrics}
