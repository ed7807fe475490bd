"""``rl-config convert`` on a config of ROLL's offline (token-level) distillation pipeline
(``student``, ``teacher``, ``student_pretrain``, ``teacher_pretrain``, ``kd_objective`` ...):
rewritten for apps/distill's ``mode: off_policy`` with ``off_policy.loss: kd``.

* ``student`` -> ``actor_train`` (its Megatron strategy converted like any role's),
  ``student_pretrain`` -> ``pretrain``;
* ``teacher`` -> ``distill_app.teachers.default``: ``model`` from ``teacher_pretrain`` (else
  ``teacher.model_args.model_name_or_path``), ``dtype``, ``device_mapping``; its
  ``training_args.per_device_train_batch_size`` (ROLL: the teacher's forward micro-batch) ->
  ``infer_batch_size``; its ``strategy_args`` become the ``reference`` section's, which the
  teacher's workers run;
* the rows: ``student.data_args.file_name`` -> ``distill_app.off_policy.files`` (``source: data``),
  ``question_key`` / ``answer_key`` -> ``prompt_key`` / ``response_key`` (ROLL's defaults
  ``question`` / ``answer``), ``student.data_args.template`` -> ``template``,
  ``sequence_length`` as it is; rows per step ``batch_size`` = ``per_device_train_batch_size`` x
  ``gradient_accumulation_steps`` x data-parallel ranks (ROLL's);
* ``kd_objective``, ``logits_topk``, ``kd_temperature``, ``teacher_temperature``,
  ``distill_loss_weight``, ``adaptive_kl_alpha``, ``skew_lambda``, ``distill_on_prompt`` ->
  ``distill_app.off_policy`` (the same names, ROLL's defaults where unset);
* ``logits_transfer_backend`` is dropped (the teacher's top-k reaches the student through the
  driver here), with a note; ``validation`` stays (the held-out prompts of apps/distill's
  accuracy, an RLVR evaluation: ROLL evaluates the validation rows' loss).

ROLL counts its steps at run time, ``num_train_epochs`` x rows // rows per step; apps/distill
runs ``max_steps`` (a note says so). A vision-language config (a ``*vl*`` template) is an error.
"""

from __future__ import annotations

from typing import Any

from rl_config.errors import ConfigError, ConfigIssue
from rl_config.ranges import parse_device_list

APP_SECTION = "distill_app"
#: ROLL's offline distill keys apps/distill reads (off_policy.<same name>), with ROLL's defaults
KD_KEYS = {"kd_objective": "forward_kl", "logits_topk": 64, "kd_temperature": 1,
           "teacher_temperature": 1, "distill_loss_weight": 0.5, "adaptive_kl_alpha": 0.5,
           "skew_lambda": 0.1, "distill_on_prompt": False}  # fmt: skip
MARKERS = ("student_pretrain", "teacher_pretrain", "kd_objective", "distill_loss_weight",
           "logits_topk")  # fmt: skip


def is_offline_distill(data: dict[str, Any]) -> bool:
    """Whether ``data`` is a config of ROLL's offline distillation pipeline."""
    return "student" in data and "teacher" in data and any(k in data for k in MARKERS)


def is_vision_language(data: dict[str, Any]) -> bool:
    """A vision-language distillation config (its student's template names a VL model)."""
    student = data.get("student")
    args = student.get("data_args") if isinstance(student, dict) else None
    template = args.get("template") if isinstance(args, dict) else None
    return isinstance(template, str) and "vl" in template.lower()


def convert_offline_distill(
    data: dict[str, Any], resolved: dict[str, Any], notes: list[str]
) -> None:
    """Rewrite ``data`` (unresolved, its Megatron roles already converted; ``resolved`` is its
    interpolated twin before that) in place."""
    if is_vision_language(resolved):
        raise ConfigError(ConfigIssue(
            "student.data_args.template", "ROLL's vision-language distillation is not "
            "implemented; apps/distill distils text models",
        ))  # fmt: skip
    if "actor_train" in data:
        raise ConfigError(ConfigIssue("student", "student and actor_train are both set; ROLL's "
                                                 "student is actor_train here: keep one"))  # fmt: skip
    student = data.pop("student")
    data["actor_train"] = student
    notes.append("student -> actor_train (apps/distill's student)")
    if "student_pretrain" in data:
        data["pretrain"] = data.pop("student_pretrain")
        notes.append("student_pretrain -> pretrain")
    r_student = resolved.get("student") or {}
    r_teacher = resolved.get("teacher") or {}
    teacher_section = data.pop("teacher")
    model_args = dict(r_teacher.get("model_args") or {})
    model = resolved.get("teacher_pretrain") or model_args.get("model_name_or_path")
    data.pop("teacher_pretrain", None)
    entry: dict[str, Any] = {"model": model}
    if model_args.get("dtype") is not None:
        entry["dtype"] = model_args["dtype"]
    if r_teacher.get("device_mapping") is not None:
        entry["device_mapping"] = r_teacher["device_mapping"]
    micro = (r_teacher.get("training_args") or {}).get("per_device_train_batch_size")
    if micro is not None:
        entry["infer_batch_size"] = micro
        notes.append(f"teacher.training_args.per_device_train_batch_size={micro} -> "
                     "distill_app.teachers.default.infer_batch_size (its forward micro-batch)")  # fmt: skip
    for k in sorted(set(r_teacher) - {"model_args", "device_mapping", "training_args",
                                      "strategy_args"}):  # fmt: skip
        notes.append(f"dropped teacher.{k} (not read by apps/distill's teachers)")
    for k in sorted(set(model_args) - {"model_name_or_path", "dtype"}):
        notes.append(f"dropped teacher.model_args.{k} (a teacher reads model_name_or_path, dtype)")
    if teacher_section.get("strategy_args") is not None:
        if "reference" in data:
            notes.append("reference: replaced by the teacher's strategy")
        data["reference"] = {"strategy_args": teacher_section["strategy_args"]}
    off: dict[str, Any] = {"source": "data", "loss": "kd"}
    data_args = dict(r_student.get("data_args") or {})
    files = data_args.get("file_name")
    if files is not None:
        off["files"] = ",".join(files) if isinstance(files, list) else str(files)
    off["messages_key"] = None
    off["prompt_key"] = data.pop("question_key", None) or "question"
    off["response_key"] = data.pop("answer_key", None) or "answer"
    if data_args.get("template") is not None:
        off["template"] = data_args["template"]
    if resolved.get("sequence_length") is not None:
        off["sequence_length"] = resolved["sequence_length"]
    r_training = r_student.get("training_args") or {}
    per_device = int(r_training.get("per_device_train_batch_size") or 1)
    accumulation = int(r_training.get("gradient_accumulation_steps") or 1)
    mapping = r_student.get("device_mapping")
    devices = len(parse_device_list(mapping)) if mapping is not None else 1
    options = (r_student.get("strategy_args") or {}).get("strategy_config") or {}
    model_parallel = 1
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                "context_parallel_size"):  # fmt: skip
        model_parallel *= int(options.get(key) or 1)
    ranks = max(1, devices // model_parallel)
    off["batch_size"] = per_device * accumulation * ranks
    notes.append(f"distill_app.off_policy.batch_size={off['batch_size']}: ROLL's rows per step, "
                 f"{per_device} per device x {accumulation} accumulated x {ranks} data-parallel "
                 f"rank(s) of its {devices} devices")  # fmt: skip
    for key, default in KD_KEYS.items():
        value = data.pop(key, None)
        off[key] = default if value is None else resolved.get(key, value)
    backend = data.pop("logits_transfer_backend", None)
    if backend is not None:
        notes.append(f"dropped logits_transfer_backend={backend!r} (the teacher's top-k reaches "
                     "the student through the driver)")  # fmt: skip
    epochs = r_training.get("num_train_epochs")
    if epochs is not None:
        notes.append(f"actor_train.training_args.num_train_epochs={epochs}: ROLL counts its "
                     "steps at run time (epochs x rows // rows per step); apps/distill runs "
                     "max_steps, set it")  # fmt: skip
    data[APP_SECTION] = {"mode": "off_policy", "teachers": {"default": entry}, "off_policy": off}
    notes.append(f"teacher -> {APP_SECTION}.teachers.default, distill keys -> "
                 f"{APP_SECTION}.off_policy (mode off_policy, loss kd); run it with apps/distill")  # fmt: skip
