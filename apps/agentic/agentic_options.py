"""App-only options (the `agentic_app:` section of a config) and the dry-run plan.

The experiment itself is validated by rl_config (ROLL key names); `agentic_app:` holds what only
this app needs: building the tiny model, the supervised warm-up, Ray vs in-process.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class WarmupOptions:
    """Supervised warm-up on BFS-solver demonstrations before RL (0 steps = off); it uses
    actor_train's optimizer, at `learning_rate` when set."""

    steps: int = 0
    episodes: int = 256
    batch_size: int = 32
    #: learning rate of the warm-up (None: actor_train's); RL then runs at actor_train's rate
    learning_rate: float | None = None
    #: probability that a demonstrated move is a random action instead of the solver's: the
    #: warm-up then imitates a noisy expert, and RL has to learn to stop making those moves
    action_noise: float = 0.0


@dataclass
class TinyModelOptions:
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 256
    seed: int = 0


@dataclass
class AppOptions:
    build_tiny_model: bool = False
    tiny_model: TinyModelOptions = field(default_factory=TinyModelOptions)
    warmup: WarmupOptions = field(default_factory=WarmupOptions)
    use_ray: bool = True
    num_cpus: float | None = None
    object_store_mb: int = 200
    cpu_per_bundle: float = 1.0
    export_hf: bool = True
    render_val_envs: int = 2
    eval_before_training: bool = True
    #: also evaluate greedy decoding (`val/greedy/*`) next to the sampled policy (`val/*`)
    eval_greedy: bool = True
    #: after every sync compare the engine's weights with the trainer's (sync/max_abs_diff)
    check_sync_weights: bool = False
    #: rl_rollout AgentLoop mode: "lockstep" batches one turn of every live episode per generate
    #: call (reproducible: a resumed run samples what an uninterrupted one does); "async" lets
    #: every episode run ahead on its own (faster with uneven episodes)
    agent_loop_mode: str = "lockstep"

    @classmethod
    def from_mapping(cls, raw: dict[str, Any] | None) -> AppOptions:
        raw = dict(raw or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"agentic_app: unknown key(s) {unknown}; known: {sorted(known)}")
        if "tiny_model" in raw:
            raw["tiny_model"] = _sub(TinyModelOptions, raw["tiny_model"], "agentic_app.tiny_model")
        if "warmup" in raw:
            raw["warmup"] = _sub(WarmupOptions, raw["warmup"], "agentic_app.warmup")
        return cls(**raw)


def _sub(cls: type, raw: dict[str, Any], path: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw or {}) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; known: {sorted(known)}")
    return cls(**(raw or {}))


def describe_plan(cfg: Any, app: AppOptions, plan_text: str) -> str:
    """The dry-run report: roles, devices, batch arithmetic."""
    lines = [
        f"experiment {cfg.exp_name!r}: {cfg.max_steps} steps, adv_estimator={cfg.adv_estimator}"
    ]
    lines.append(plan_text)
    for role, worker in cfg.workers().items():
        sa = worker.strategy_args
        lines.append(
            f"  {role:<12} strategy={sa.strategy_name if sa else '?'} "
            f"world_size={worker.world_size} model={worker.model_args.model_name_or_path}"
        )
    tm = cfg.train_env_manager
    if tm is not None:
        lines.append(
            f"train envs: {tm.num_env_groups} groups x group_size {tm.group_size} = "
            f"{tm.num_env_groups * tm.group_size} envs; rollout_batch_size "
            f"{cfg.rollout_batch_size} trajectories/step ("
            f"{cfg.rollout_batch_size / (tm.num_env_groups * tm.group_size):g} episode(s) per env); "
            f"tags {tm.tags} partition {tm.num_groups_partition}"
        )
    vm = cfg.val_env_manager
    if vm is not None:
        lines.append(
            f"val envs: {vm.num_env_groups} groups x {vm.group_size} = "
            f"{vm.num_env_groups * vm.group_size} episodes every {cfg.eval_steps} steps; "
            f"tags {vm.tags}"
        )
    ta = cfg.actor_train.training_args
    dp = cfg.actor_train.world_size or 1
    per_opt = ta.per_device_train_batch_size * ta.gradient_accumulation_steps * dp
    lines.append(
        f"actor_train: per_device_train_batch_size {ta.per_device_train_batch_size} x "
        f"gradient_accumulation_steps {ta.gradient_accumulation_steps} x dp {dp} = {per_opt} "
        f"samples/optimizer step; {cfg.rollout_batch_size} samples/step x ppo_epochs "
        f"{cfg.ppo_epochs} -> {max(1, cfg.rollout_batch_size * cfg.ppo_epochs // per_opt)} "
        f"optimizer step(s) per pipeline step"
    )
    lines.append(
        f"sequence_length {cfg.sequence_length}, max_tokens_per_step {cfg.max_tokens_per_step}; "
        f"reference {'on' if cfg.enable_reference else 'off'} (init_kl_coef={cfg.init_kl_coef}, "
        f"use_kl_loss={cfg.use_kl_loss}); critic {'on' if cfg.critic is not None else 'off'}"
    )
    if app.warmup.steps:
        lines.append(
            f"warm-up: {app.warmup.steps} SFT steps on {app.warmup.episodes} solver episodes"
        )
    return "\n".join(lines)
