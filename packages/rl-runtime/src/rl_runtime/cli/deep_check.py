"""`rl-config check --deep FILE`: the preflight of a config file on this host, without an app.

rl-config cannot import rl-runtime (the dependency rule), so `--deep` finds this check through
the `rl_config.deep_check` entry point that rl-runtime declares. It composes the config for its
pipeline kind (RLVR, DPO, agentic) and runs `rl_runtime.run.preflight.preflight` with what an app
section in the file says about the model (`build_tiny_model`), generated data and Ray
(`use_ray`, `num_cpus`, `cpu_per_bundle`): the same checks an app's `--dry-run` and run make."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rl_config.errors import ConfigError, ConfigIssue


@dataclass(frozen=True)
class _AppSection:
    """The keys of an app section the preflight reads (`AppRunOptions`'s names)."""

    SECTION: str
    build_tiny_model: str | None = None


def deep_check(
    cfg: Any, section: str | None, raw: Mapping[str, Any] | None
) -> tuple[list[str], list[str]]:
    """`(problems, notes)` of the preflight of the validated config `cfg`; `raw`: the app
    section `section` of the file, if any. Composing errors are problems too."""
    from rl_runtime.run.plan import machine_kwargs
    from rl_runtime.run.preflight import DataFiles, check_devices, preflight

    raw = dict(raw or {})
    app = _AppSection(section or "app", raw.get("build_tiny_model") or None)
    try:
        check_devices(cfg)
        kind = cfg.pipeline_kind
        data: tuple[Any, ...] = ()
        if kind == "rlvr":
            from rl_envs.tasks.arith import arith_parquet_paths
            from rl_runtime.pipelines.rlvr.compose import compose_rlvr
            from rl_runtime.pipelines.rlvr.data import preflight_data

            composed = compose_rlvr(cfg)
            arith = raw.get("arith_data") or {}
            generated = (
                arith_parquet_paths(arith.get("out_dir", "./output/rlvr_data"))
                if arith.get("generate")
                else ()
            )
            components, data = composed.components, preflight_data(composed.plan.data, generated)
        elif kind == "dpo":
            from rl_runtime.pipelines.dpo.compose import compose_dpo

            components = compose_dpo(cfg, **machine_kwargs())
            d = cfg.actor_train.data_args
            if not raw.get("generate_arithmetic"):
                data = tuple(
                    DataFiles(key, (value,) if isinstance(value, str) else tuple(value))
                    for key, value in (("actor_train.data_args.file_name", d.file_name),
                                       ("actor_train.data_args.eval_file_name", d.eval_file_name))
                    if value
                )  # fmt: skip
        elif kind == "sft":
            from rl_runtime.pipelines.sft.compose import compose_sft

            components = compose_sft(cfg, **machine_kwargs())
            if not raw.get("generate_arithmetic"):
                held = cfg.validation.data_args.file_name if cfg.validation else None
                data = tuple(
                    DataFiles(key, (value,) if isinstance(value, str) else tuple(value))
                    for key, value in (("actor_train.data_args.file_name",
                                        cfg.actor_train.data_args.file_name),
                                       ("validation.data_args.file_name", held))
                    if value
                )  # fmt: skip
        else:
            from rl_runtime.run.plan import compose_here

            components = compose_here(cfg)
        report = preflight(
            cfg, components, app=app, data=data, use_ray=bool(raw.get("use_ray", True)),
            num_cpus=raw.get("num_cpus"), cpu_per_bundle=float(raw.get("cpu_per_bundle", 1.0)),
        )  # fmt: skip
    except ConfigError as exc:
        return [str(i) for i in exc.issues], []
    except (ValueError, KeyError) as exc:
        return [str(ConfigIssue("", str(exc)))], []
    return [str(i) for i in report.problems], report.notes
