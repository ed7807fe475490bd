"""A fake recipe and in-process fake workers for the Runner's tests (imported by the
test_runtime_pipeline*, test_runtime_resume and test_runtime_run_lock modules)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rl_config.schema import ExperimentConfig
from rl_runtime.cluster.cluster import RoleSpec
from rl_runtime.compose import compose
from rl_runtime.run.options import RunOptions
from rl_runtime.run.recipe import Recipe
from rl_runtime.run.runner import Runner


class FakeTrainer:
    def __init__(self, **_: object) -> None:
        self.w = torch.zeros(2)

    def ready(self) -> bool:
        return True

    def named_tensors(
        self, bucket_bytes: int = 0, host_copies: bool = True, tied_once: bool = False
    ) -> list:
        return [("w", self.w.clone())]

    def save_checkpoint(
        self, root: str, step: int, extra: dict | None = None, key_file: str | None = None
    ) -> str:
        Path(root).mkdir(parents=True, exist_ok=True)
        (Path(root) / "step.txt").write_text(str(step))
        return root

    def load_checkpoint(self, root: str, key_file: str | None = None) -> tuple[int, dict]:
        return int((Path(root) / "step.txt").read_text()), {}

    def export_hf(self, out: str) -> str:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "config.json").write_text(json.dumps({"step": self.w.tolist()}))
        return out

    def offload(self) -> None: ...

    def onload(self) -> None: ...

    def shutdown(self) -> None: ...


class FakeEngine:
    def __init__(self, **_: object) -> None:
        self.version = 0

    def ready(self) -> bool:
        return True

    def update_weights(self, named: list, version: int) -> int:
        self.version = version
        return version

    def weight_version(self) -> int:
        return self.version

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self) -> None: ...

    def shutdown(self) -> None: ...


class FakeRecipe(Recipe):
    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.calls: list[tuple[str, int]] = []
        self.counter = 0

    def roles(self, components):
        return [
            RoleSpec("actor_train", FakeTrainer, [0]),
            RoleSpec("actor_infer", FakeEngine, [0]),
        ]

    def step(self, ctx) -> dict[str, float]:
        if ctx.step == self.fail_at:
            raise RuntimeError("boom")
        self.counter += 1
        self.calls.append(("step", ctx.step))
        ctx.sync_weights()
        return {"train/loss": float(ctx.step)}

    def evaluate(self, ctx) -> dict[str, float]:
        self.calls.append(("eval", ctx.step))
        return {"val/success_rate": ctx.step / 10}

    def state(self) -> dict:
        return {"counter": self.counter}

    def load_state(self, state: dict) -> None:
        self.counter = state["counter"]


def _runner(
    tmp_path: Path, recipe: FakeRecipe, run_options: dict | None = None, **extra: object
) -> Runner:
    data = {
        "pretrain": "unused",
        "output_dir": str(tmp_path / "out"),
        "logging_dir": str(tmp_path / "out" / "logs"),
        "track_with": "stdout",
        "max_steps": 5,
        "eval_steps": 2,
        "save_steps": 3,
        "logging_steps": 2,
        "rollout_batch_size": 2,
        "train_env_manager": {"num_env_groups": 1, "group_size": 2, "tags": ["FL"]},
        "custom_envs": {"FL": {"env_type": "frozen_lake"}},
        **extra,
    }
    cfg = ExperimentConfig.model_validate(data)
    options = RunOptions(model_path="unused", use_ray=False, **(run_options or {}))
    return Runner(cfg, compose(cfg), recipe, options)


def _run(tmp_path: Path, recipe: FakeRecipe, run_options: dict | None = None, **extra: object):
    runner = _runner(tmp_path, recipe, run_options, **extra)
    return runner, runner.run()


def _logged_steps(tmp_path: Path) -> list[int]:
    lines = (tmp_path / "out" / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["step"] for x in lines if "train/loss" in json.loads(x)]
