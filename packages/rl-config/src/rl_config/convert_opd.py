"""``rl-config convert`` on a config of ROLL's on-policy distillation (OPD: ``student_train``,
``student_infer``, ``teacher``): rewritten for apps/distill.

* ``student_train`` -> ``actor_train`` and ``student_infer`` -> ``actor_infer`` (ROLL maps them so
  in pure OPD mode);
* ``teacher`` (one section, or a mapping of named teachers) -> ``distill_app.teachers``:
  ``model_args.model_name_or_path`` -> ``model`` (unset: ``pretrain``), ``model_args.dtype`` ->
  ``dtype``, ``tag_included`` -> ``tags``, ``opd_kl_coef`` -> ``kl_coef`` (ROLL's default 1.0),
  ``device_mapping`` and ``infer_batch_size`` as they are; the first teacher's
  ``strategy_args`` become the ``reference`` section's, which every teacher's workers run;
  every other teacher key is dropped with a note;
* ``is_pure_opd`` and ``pure_opd_pipeline_type: rlvr`` are what apps/distill runs (dropped);
  ROLL's mixed mode (``use_opd``: RL rewards plus the teacher KL) and agentic OPD are errors.

Values are written resolved (``${...}`` substituted) into ``distill_app``, the app's own
section, which is no variable scope.
"""

from __future__ import annotations

from typing import Any

from rl_config.errors import ConfigError, ConfigIssue

APP_SECTION = "distill_app"
RENAMED = {"student_train": "actor_train", "student_infer": "actor_infer"}
FLAGS = ("is_pure_opd", "use_opd", "pure_opd_pipeline_type")
#: a teacher's keys apps/distill reads (model_args: model_name_or_path and dtype only)
TEACHER_READ = ("model_args", "tag_included", "opd_kl_coef", "device_mapping",
                "infer_batch_size", "strategy_args")  # fmt: skip
#: keys that make a `teacher` section one teacher (not a mapping of named teachers)
WORKER_MARKERS = ("model_args", "strategy_args", "device_mapping", "training_args",
                  "infer_batch_size", "tag_included", "opd_kl_coef")  # fmt: skip


def is_opd(data: dict[str, Any]) -> bool:
    """Whether ``data`` is a config of ROLL's on-policy distillation."""
    return "teacher" in data and any(k in data for k in (*RENAMED, *FLAGS))


def teachers_of(section: Any) -> dict[str, Any]:
    """ROLL's `teacher`: one worker section (named `default`, as ROLL names it) or a mapping
    of named ones."""
    if not isinstance(section, dict) or not section:
        raise ConfigError(ConfigIssue("teacher", "expected a worker section or named teachers"))
    if any(k in section for k in WORKER_MARKERS):
        return {"default": section}
    return dict(section)


def convert_opd(data: dict[str, Any], resolved: dict[str, Any], notes: list[str]) -> None:
    """Rewrite ``data`` (unresolved; ``resolved`` is its interpolated twin) in place."""
    if resolved.get("use_opd"):
        raise ConfigError(ConfigIssue(
            "use_opd", "ROLL's mixed OPD (RL rewards plus the teacher KL) is not implemented; "
            "apps/distill runs pure on-policy distillation (is_pure_opd)",
        ))  # fmt: skip
    if resolved.get("pure_opd_pipeline_type", "rlvr") != "rlvr":
        raise ConfigError(ConfigIssue(
            "pure_opd_pipeline_type", f"{resolved['pure_opd_pipeline_type']!r}: apps/distill "
            "distils on RLVR prompts (rlvr); agentic on-policy distillation is not implemented",
        ))  # fmt: skip
    for old, new in RENAMED.items():
        if old not in data:
            continue
        if new in data:
            raise ConfigError(ConfigIssue(old, f"{old} and {new} are both set; ROLL maps {old} "
                                               f"to {new} in OPD mode: keep one"))  # fmt: skip
        data[new] = data.pop(old)
        notes.append(f"{old} -> {new} (ROLL's OPD mapping)")
    for flag in FLAGS:
        if flag in data:
            notes.append(f"dropped {flag}={data.pop(flag)!r} (apps/distill is pure OPD on RLVR)")
    teachers = teachers_of(resolved["teacher"])
    converted = teachers_of(data.pop("teacher"))  # the Megatron conversion's strategy
    out: dict[str, dict[str, Any]] = {}
    for name, t in teachers.items():
        key = "teacher" if list(teachers) == ["default"] else f"teacher.{name}"
        model_args = dict(t.get("model_args") or {})
        entry: dict[str, Any] = {"model": model_args.get("model_name_or_path")}
        if entry["model"] is None:
            entry["model"] = resolved.get("pretrain")
            notes.append(f"{key}.model_args.model_name_or_path unset: the teacher is pretrain")
        if model_args.get("dtype") is not None:
            entry["dtype"] = model_args["dtype"]
        entry["tags"] = list(t.get("tag_included") or [])
        entry["kl_coef"] = 1.0 if t.get("opd_kl_coef") is None else t["opd_kl_coef"]
        for k in ("device_mapping", "infer_batch_size"):
            if t.get(k) is not None:
                entry[k] = t[k]
        out[name] = entry
        for k in sorted(set(t) - set(TEACHER_READ)):
            notes.append(f"dropped {key}.{k} (not read by apps/distill's teachers)")
        for k in sorted(set(model_args) - {"model_name_or_path", "dtype"}):
            notes.append(
                f"dropped {key}.model_args.{k} (a teacher reads model_name_or_path, dtype)"
            )
    first_name = next(iter(converted))
    strategy = converted[first_name].get("strategy_args")
    if strategy is not None:
        if "reference" in data:
            notes.append("reference: replaced by the teachers' (ROLL's pure OPD does the same)")
        data["reference"] = {"strategy_args": strategy}
        if len(converted) > 1:
            notes.append(
                f"reference.strategy_args: teacher {first_name}'s; every teacher's workers run it"
            )
    data[APP_SECTION] = {"teachers": out}
    notes.append(f"teacher -> {APP_SECTION}.teachers {sorted(out)}; run it with apps/distill")
