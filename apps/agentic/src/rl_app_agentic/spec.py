"""`uv run apps/agentic [--config FILE] [key=value ...] [--dry-run] [--rollout-only] [--no-ray]`

With no arguments: the CPU default (configs/cpu_default.yaml) — a tiny model built locally,
FrozenLake, a short supervised warm-up on solver demonstrations, then RL; it prints a summary table
of validation success before and after RL (also written to output_dir/summary.json).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from rl_app_agentic.options import AppOptions
from rl_runtime.cli.app_main import AppSpec, Composed, app_main, load_app

APP_DIR = Path(__file__).resolve().parents[2]
"""apps/agentic (its configs/ folder)."""
DEFAULT_CONFIG = APP_DIR / "configs" / "cpu_default.yaml"


def compose(cfg, app: AppOptions, flags: frozenset[str]) -> Composed:
    """The components, with a role per model reward scoring episodes at their end (the plan:
    their `ModelRewardPlan`s); a solver warm-up on training envs the solver cannot play is a
    refusal (it would end the run after its start with no demonstration to learn from), and so is
    comparing the replay engine's weights (it has none: the first sync would fail)."""
    import dataclasses

    from rl_runtime.compose.model_rewards import build_episode_rewards
    from rl_runtime.pipelines.agentic.demos import tags_without_solver
    from rl_runtime.pipelines.agentic.rollout import env_configs
    from rl_runtime.run.plan import compose_here

    rollout_only = "rollout_only" in flags
    components = compose_here(cfg, rollout_only=rollout_only)
    engine = cfg.actor_infer.strategy_args.strategy_name
    if app.check_sync_weights and engine == "replay" and not rollout_only:
        return Composed(components, refusals=(
            "agentic_app.check_sync_weights=true: actor_infer's replay engine serves recorded "
            "generations and holds no weights to compare with the trainer's; set it to false",))  # fmt: skip
    train, val = components.train_envs, components.val_envs
    tags = [*(train.tags if train else ()), *(val.tags if val else ())]
    rewards = build_episode_rewards(cfg, list(dict.fromkeys(tags)))
    if rollout_only and rewards:  # its dumps would hold the envs' rewards alone
        refused = tuple(f"rewards.{m.domain}: --rollout-only dumps episodes with the envs' "
                        "rewards; a model reward scores training and evaluation episodes only"
                        for m in rewards)  # fmt: skip
        return Composed(components, refusals=refused)
    if rewards:  # their roles, placed with the others
        roles = (*components.roles, *(m.role_plan() for m in rewards))
        components = dataclasses.replace(components, roles=roles)
    notes = tuple(note for m in rewards for note in m.notes)
    if app.warmup.steps <= 0 or rollout_only or train is None:
        return Composed(components, plan=rewards, notes=notes)
    unplayable = tags_without_solver(train.tags, env_configs(components))
    refusals = tuple(f"agentic_app.warmup.steps={app.warmup.steps}: the warm-up plays the "
                     f"training envs with the BFS solver, which cannot play tag {tag!r} ({why}); "
                     "set agentic_app.warmup.steps=0" for tag, why in unplayable.items())  # fmt: skip
    return Composed(components, plan=rewards, notes=notes, refusals=refusals)


def run(cfg, app: AppOptions, composed: Composed, flags: frozenset[str]):
    """The agentic recipe (or, with --rollout-only, trajectories dumped to JSONL) on the Runner."""
    from rl_app_agentic.recipe import STDOUT_KEYS, AgenticRecipe
    from rl_runtime.pipelines.agentic.rollout import RolloutOnlyRecipe
    from rl_runtime.run.options import RunOptions
    from rl_runtime.run.runner import Runner

    rollout_only = "rollout_only" in flags
    path = app.model_path(cfg.pretrain, cfg.system_envs)
    options = RunOptions.from_app(
        app,
        path,
        agent_mode=app.agent_loop_mode,
        eval_before_training=app.eval_before_training and not rollout_only,
        export_hf=app.export_hf and not rollout_only,
        stdout_keys=STDOUT_KEYS,
    )
    recipe = (
        RolloutOnlyRecipe(cfg.output_dir)
        if rollout_only
        else AgenticRecipe(app, path, model_rewards=composed.plan or ())
    )
    return Runner(cfg, composed.components, recipe, options).run()


def summary_row(metrics: dict[str, float]) -> dict[str, float | str]:
    keys = ("success_rate", "greedy/success_rate", "episode_reward", "num_turns", "format_ok")
    return {k: float(metrics[f"val/{k}"]) for k in keys if f"val/{k}" in metrics}


SPEC = AppSpec(
    prog="apps/agentic",
    description=__doc__ or "",
    default_config=DEFAULT_CONFIG,
    section=AppOptions.SECTION,
    options=AppOptions,
    compose=compose,
    run=run,
    title="validation (success_rate: sampled like training; greedy/success_rate: greedy)",
    summary_row=summary_row,
    flags={"rollout-only": "dump trajectories to JSONL"},
    before_label="after warm-up = before RL",
)
load = partial(load_app, SPEC)
main = partial(app_main, SPEC)
