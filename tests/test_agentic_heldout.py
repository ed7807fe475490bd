"""apps/agentic's default: validation maps are held out by content, and the baselines are blind.

Draws the episodes the pipeline really plays: every training batch of the default run and the
validation batch through the recipe's own `assignments` and rl_runtime's `make_envs` (what the
rollout workers call), and the warm-up's demonstrations through the recipe's `demonstrations`
(the maps read back from the tokens the model is trained on). A map is its first observation,
which shows layout, start and goal.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "agentic"
MAP_ROW = re.compile(r"^[P_OG]{3,}$")


def _app():
    from rl_app_agentic import recipe, spec

    return spec, recipe


def _composed(overrides: list[str]):
    main, pipeline = _app()
    from rl_runtime.run.plan import compose_here

    cfg, app = main.load(main.DEFAULT_CONFIG, overrides)
    return SimpleNamespace(components=compose_here(cfg)), app, pipeline


def _played_maps(ctx, pipeline, split: str, epochs: range) -> list[str]:
    from rl_runtime.pipelines.agentic.rollout import assignments, env_configs
    from rl_runtime.step.envs import make_envs

    maps = []
    for epoch in epochs:
        batch = assignments(ctx.components, split, epoch)
        for env, *_ in make_envs(batch, env_configs(ctx.components)):
            obs, _ = env.reset()
            maps.append(obs)
    return maps


def _demo_maps(demos, tokenizer) -> list[str]:
    maps = []
    for t in demos:
        text = tokenizer.decode(t.token_ids[: t.prompt_length])
        rows = [line for line in text.splitlines() if MAP_ROW.match(line)]
        assert len(rows) == len(rows[0]), text  # a square map
        maps.append("\n".join(rows))
    return maps


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from rl_rollout.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("heldout") / "tiny_model"))


def test_no_validation_map_in_any_training_or_demonstration_batch(tiny_model):
    from transformers import AutoTokenizer

    ctx, app, pipeline = _composed([])
    c = ctx.components
    val = set(_played_maps(ctx, pipeline, "val", range(1)))
    train = _played_maps(ctx, pipeline, "train", range(c.cadence.max_steps))
    demos = pipeline.AgenticRecipe(app, tiny_model).demonstrations(ctx)
    demo = _demo_maps(demos, AutoTokenizer.from_pretrained(tiny_model))
    # 1,024 draws from the ~600 validation maps of 3x3 (the rest are training maps), some far
    # likelier than others: 342 distinct at seed 42
    assert len(val) >= 0.3 * c.sizes["val_episodes"]
    assert len(train) == c.cadence.max_steps * c.sizes["samples_per_step"]
    # the successful ones: the default's noisy expert (action_noise 0.4) loses some episodes
    # (211 of 512 kept at seed 42)
    assert len(demo) >= 0.3 * app.warmup.episodes, len(demo)
    assert not val & set(train)
    assert not val & set(demo)


def test_without_the_split_the_same_draws_share_maps():
    """The check above can fail: the same seeds with layout_split off share maps."""
    off = ["custom_envs.FrozenLake.env_config.layout_split=null"]
    off += ["custom_envs.FrozenLakeVal.env_config.layout_split=null"]
    ctx, _app_opts, pipeline = _composed(off)
    val = set(_played_maps(ctx, pipeline, "val", range(1)))
    train = set(_played_maps(ctx, pipeline, "train", range(ctx.components.cadence.max_steps)))
    assert val & train


def test_blind_baselines_of_the_default_are_low():
    ctx, app, pipeline = _composed([])
    rows = pipeline.AgenticRecipe(app, "unused").baselines(ctx)
    (fixed_name,) = [k for k in rows if k.startswith("best fixed sequence")]
    assert rows[fixed_name]["val/success_rate"] <= 0.2
    assert rows["random policy"]["val/success_rate"] <= 0.1
