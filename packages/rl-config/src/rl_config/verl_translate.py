"""A verl command line or config file -> the equivalent config of this stack (``--verl``).

``translate(overrides, entry=..., config_file=...)`` reads verl's Hydra overrides (``a.b=1``,
``+a.b=1``, ``~a.b``) on top of verl's defaults (``VERL_DEFAULTS``, those this translation reads,
and the recipe's own for the one-step-off and fully-async entry modules) and builds the config
with verl's *meaning*:

* batches: ``data.train_batch_size`` counts prompts (``rollout_batch_size``) and
  ``rollout.n`` samples each (``num_return_sequences_in_group``); ``ppo_mini_batch_size`` counts
  prompts per optimizer step, so an optimizer step takes ``ppo_mini_batch_size x n`` samples =
  ``per_device_train_batch_size x gradient_accumulation_steps x ranks``; the micro-batch keys
  are memory knobs (the largest divisor of a rank's share not above them);
* verl's loss as verl computes it: dual-clip always (``clip_ratio_c``), clip-higher only when
  ``clip_ratio_low != clip_ratio_high``, ``loss_agg_mode`` token-mean, no reward normalisation
  before the estimator, GAE advantages whitened, ``norm_adv_by_std_in_grpo=False`` = Dr.GRPO;
  no supervised warm-up and no dynamic sampling unless ``algorithm.filter_groups.enable``;
* devices: ``trainer.device`` -> ``system_envs.RL_DEVICE`` (a device the host lacks is refused
  before anything starts); ``nnodes x n_gpus_per_node`` devices shared by every role (verl's
  hybrid engine), or, for the asynchronous recipes, ``rollout.nnodes x rollout.n_gpus_per_node``
  of their own for generation;
* the asynchronous recipes: one-step-off is ``async.max_staleness: 1``; fully async is
  ``async.max_staleness: ceil(staleness_threshold)`` with ``async_training.partial_rollout``,
  and a step of ``trigger_parameter_sync_step x require_batches x ppo_mini_batch_size`` prompts
  (one weight version).

Every key given is translated (``Row``), accepted without effect (a row saying why) or refused
(``ConfigIssue`` naming it and the reason), by the rules of :mod:`rl_config.verl_rules`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_config.errors import ConfigError, ConfigIssue
from rl_config.verl_rules import rule_for

MAIN_PPO = "verl.trainer.main_ppo"
ONE_STEP_OFF = "one_step_off"
FULLY_ASYNC = "fully_async"
ENTRIES: dict[str, str] = {
    MAIN_PPO: "sync",
    "verl.trainer.main": "sync",
    "recipe.one_step_off_policy.main_ppo": ONE_STEP_OFF,
    "verl.experimental.one_step_off_policy.main_ppo": ONE_STEP_OFF,
    "recipe.fully_async_policy.fully_async_main": FULLY_ASYNC,
    "verl.experimental.fully_async_policy.fully_async_main": FULLY_ASYNC,
}
"""verl's entry modules (as ``python -m`` runs them) -> the training mode they select."""

CONFIG_NAMES: dict[str, str | None] = {
    "ppo_trainer": None,
    "one_step_off_ppo_trainer": None,
    "fully_async_ppo_trainer": None,
    "ppo_megatron_trainer": "Megatron-LM is not implemented; use verl's ppo_trainer (FSDP)",
    "one_step_off_ppo_megatron_trainer": "Megatron-LM is not implemented; use the FSDP config",
    "fully_async_ppo_megatron_trainer": "Megatron-LM is not implemented; use the FSDP config",
}
"""verl's own ``--config-name`` values: None when their defaults are this translation's."""

_A = "actor_rollout_ref"
VERL_DEFAULTS: dict[str, Any] = {
    "data.train_files": None,
    "data.val_files": None,
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.prompt_key": "prompt",
    "data.truncation": "error",
    "data.filter_overlong_prompts": False,
    "data.seed": None,
    f"{_A}.model.path": None,
    f"{_A}.model.enable_gradient_checkpointing": True,
    f"{_A}.model.use_remove_padding": True,
    f"{_A}.model.lora_rank": 0,
    f"{_A}.model.lora_alpha": 16,
    f"{_A}.model.target_modules": "all-linear",
    f"{_A}.model.lora_adapter_path": None,
    f"{_A}.hybrid_engine": True,
    f"{_A}.actor.strategy": "fsdp",
    f"{_A}.actor.ppo_mini_batch_size": 256,
    f"{_A}.actor.ppo_micro_batch_size": None,
    f"{_A}.actor.ppo_micro_batch_size_per_gpu": None,
    f"{_A}.actor.use_dynamic_bsz": False,
    f"{_A}.actor.ppo_max_token_len_per_gpu": 16384,
    f"{_A}.actor.ppo_epochs": 1,
    f"{_A}.actor.clip_ratio": 0.2,
    f"{_A}.actor.clip_ratio_low": 0.2,
    f"{_A}.actor.clip_ratio_high": 0.2,
    f"{_A}.actor.clip_ratio_c": 3.0,
    f"{_A}.actor.policy_loss.loss_mode": "vanilla",
    f"{_A}.actor.loss_agg_mode": "token-mean",
    f"{_A}.actor.entropy_coeff": 0,
    f"{_A}.actor.use_kl_loss": False,
    f"{_A}.actor.kl_loss_coef": 0.001,
    f"{_A}.actor.kl_loss_type": "low_var_kl",
    f"{_A}.actor.grad_clip": 1.0,
    f"{_A}.actor.use_rollout_log_probs": False,
    f"{_A}.actor.optim.lr": 1e-6,
    f"{_A}.actor.optim.weight_decay": 0.01,
    f"{_A}.actor.optim.betas": [0.9, 0.999],
    f"{_A}.actor.optim.clip_grad": 1.0,
    f"{_A}.actor.optim.lr_warmup_steps": -1,
    f"{_A}.actor.optim.lr_warmup_steps_ratio": 0.0,
    f"{_A}.actor.optim.lr_scheduler_type": "constant",
    f"{_A}.actor.optim.warmup_style": None,
    f"{_A}.actor.optim.lr_decay_style": None,
    f"{_A}.actor.fsdp_config.param_offload": False,
    f"{_A}.actor.fsdp_config.optimizer_offload": False,
    f"{_A}.actor.fsdp_config.offload_policy": False,
    f"{_A}.ref.fsdp_config.param_offload": False,
    f"{_A}.rollout.name": None,
    f"{_A}.rollout.n": 1,
    f"{_A}.rollout.temperature": 1.0,
    f"{_A}.rollout.top_k": -1,
    f"{_A}.rollout.top_p": 1.0,
    f"{_A}.rollout.do_sample": True,
    f"{_A}.rollout.gpu_memory_utilization": 0.5,
    f"{_A}.rollout.tensor_model_parallel_size": 2,
    f"{_A}.rollout.log_prob_micro_batch_size_per_gpu": None,
    f"{_A}.rollout.val_kwargs.temperature": 0,
    f"{_A}.rollout.val_kwargs.top_k": -1,
    f"{_A}.rollout.val_kwargs.top_p": 1.0,
    f"{_A}.rollout.val_kwargs.do_sample": False,
    f"{_A}.rollout.val_kwargs.n": 1,
    "critic.enable": None,
    "critic.strategy": "fsdp",
    "critic.model.path": None,
    "critic.model.enable_gradient_checkpointing": True,
    "critic.optim.lr": 1e-5,
    "critic.optim.weight_decay": 0.01,
    "critic.ppo_mini_batch_size": None,
    "critic.ppo_micro_batch_size": None,
    "critic.ppo_micro_batch_size_per_gpu": None,
    "algorithm.adv_estimator": "gae",
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "algorithm.kl_ctrl.target_kl": 0.1,
    "algorithm.filter_groups.enable": False,
    "algorithm.filter_groups.max_num_gen_batches": 0,
    "algorithm.rollout_correction.rollout_is": None,
    "algorithm.rollout_correction.rollout_is_threshold": 2.0,
    "algorithm.rollout_correction.bypass_mode": False,
    "custom_reward_function.path": None,
    "custom_reward_function.name": "compute_score",
    "reward_model.reward_manager": "naive",
    "reward_manager.name": None,
    "trainer.total_epochs": 30,
    "trainer.total_training_steps": None,
    "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "gsm8k",
    "trainer.logger": ["console", "wandb"],
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.save_freq": -1,
    "trainer.test_freq": -1,
    "trainer.resume_mode": "auto",
    "trainer.resume_from_path": None,
    "trainer.val_before_train": True,
    "trainer.default_local_dir": None,
    "trainer.max_actor_ckpt_to_keep": None,
    "trainer.device": "cuda",
    "ray_kwargs.ray_init.num_cpus": None,
    "rollout.nnodes": 1,
    "rollout.n_gpus_per_node": 8,
    "rollout.total_rollout_steps": None,
    "rollout.total_epochs": None,
    "rollout.test_freq": None,
    "async_training.staleness_threshold": 0,
    "async_training.trigger_parameter_sync_step": 1,
    "async_training.require_batches": 1,
    "async_training.partial_rollout": False,
    "async_training.use_rollout_log_probs": False,
}
"""verl's defaults (``verl/trainer/config/ppo_trainer.yaml`` composed) of the keys this
translation reads; a test compares them with verl's recorded key set."""

RECIPE_DEFAULTS: dict[str, dict[str, Any]] = {
    ONE_STEP_OFF: {
        f"{_A}.rollout.calculate_log_probs": True,
        f"{_A}.rollout.free_cache_engine": False,
        "algorithm.rollout_correction.bypass_mode": True,
    },
    FULLY_ASYNC: {
        "async_training.staleness_threshold": 0.1,
        "async_training.trigger_parameter_sync_step": 4,
        "async_training.require_batches": 1,
        "async_training.partial_rollout": True,
        "async_training.use_rollout_log_probs": True,
        "rollout.total_rollout_steps": 100,
        "rollout.total_epochs": 10,
        "rollout.test_freq": 1,
    },
}
"""The recipes' own config files' values (one_step_off_ppo_trainer.yaml,
fully_async_ppo_trainer.yaml) where they differ from ppo_trainer's."""

ESTIMATORS: dict[str, str | None] = {
    "gae": "gae",
    "grpo": "grpo",
    "grpo_vectorized": "grpo",
    "reinforce_plus_plus": "reinforce_plus_plus",
    "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline",
    "remax": "remax",
    "rloo": "rloo",
    "rloo_vectorized": "rloo",
    "opo": "opo",
    "grpo_passk": "grpo_passk",
    "gpg": "gpg",
    "optimal_token_baseline": "optimal_token_baseline",
    "tir_optimal_token_baseline": None,
}
"""verl's advantage estimators -> this stack's (None: not implemented)."""

POLICY_LOSSES: dict[str, str | None] = {
    "vanilla": "ppo_clip",
    "gspo": "gspo",
    "sapo": "sapo",
    "clip_cov": "clip_cov",
    "kl_cov": "kl_cov",
    "geo_mean": "gmpo",
    "cispo": "cispo",
    "gpg": "reinforce",
    "bypass_mode": None,
}
"""verl's ``policy_loss.loss_mode`` -> ``actor_train.pg_variant`` (None: not implemented); GPG's
loss is the plain policy gradient ``-A * log pi`` (no ratio, no clip): ``reinforce`` here."""

SCHEDULES = {"constant": "constant", "cosine": "cosine", "linear": "linear"}
TRACKERS = ("wandb", "tensorboard")
REWARD_MANAGERS = ("naive", "dapo", "prime")


@dataclass(frozen=True)
class Row:
    """One line of the translation table: verl keys -> our key = value (``target`` "" when the
    keys have no effect here), and why."""

    sources: tuple[str, ...]
    target: str
    value: Any = None
    note: str = ""


@dataclass
class VerlTranslation:
    """The translated config (``data``: this stack's keys, the ``rlvr_app`` section included),
    the table rows, what was refused, and the verl keys given (command line and file)."""

    entry: str
    mode: str
    given: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    refused: list[ConfigIssue] = field(default_factory=list)

    def table(self) -> str:
        """``verl key = value  ->  our key = value  (note)``, one line per row."""
        lines = [f"verl translation ({self.entry}: {self.mode}):"]
        for row in self.rows:
            src = ", ".join(_given_text(k, self.given) for k in row.sources)
            dst = f"{row.target} = {_text(row.value)}" if row.target else "(no effect here)"
            note = f"  ({row.note})" if row.note else ""
            lines.append(f"  {src}  ->  {dst}{note}")
        return "\n".join(lines)

    def raise_if_refused(self) -> None:
        if self.refused:
            raise ConfigError(self.refused, source="verl command")

    def to_yaml(self, header: str) -> str:
        """The config as YAML, each translated key with a comment naming the verl keys it came
        from (``rl-config convert --from verl``)."""
        origin: dict[str, str] = {}
        for row in self.rows:
            if row.target:
                origin.setdefault(row.target, ", ".join(row.sources))
        lines = [f"# {line}" if line else "#" for line in header.splitlines()]
        for row in self.rows:
            if not row.target:
                lines.append(f"# no effect here: {', '.join(row.sources)} ({row.note})")
        lines += _yaml_lines(self.data, "", origin)
        return "\n".join(lines) + "\n"


def _given_text(key: str, given: Mapping[str, Any]) -> str:
    return f"{key}={_text(given[key])}" if key in given else f"{key} (verl default)"


def _text(value: Any) -> str:
    import json

    if isinstance(value, str):
        return value
    return json.dumps(value)


def _yaml_lines(node: Mapping[str, Any], prefix: str, origin: Mapping[str, str]) -> list[str]:
    import yaml

    lines: list[str] = []
    indent = "  " * prefix.count(".") if prefix else ""
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        pad = "  " * path.count(".")
        comment = f"  # verl: {origin[path]}" if path in origin else ""
        if isinstance(value, Mapping) and value:
            lines.append(f"{pad}{key}:{comment}")
            lines += _yaml_lines(value, path, origin)
        else:
            text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
            text = text.removesuffix("\n...").removesuffix("...").strip()
            lines.append(f"{pad}{key}: {text}{comment}")
    del indent
    return lines


# --- reading verl's command line and files ---------------------------------------------------


def parse_value(text: str) -> Any:
    """A Hydra override value: quoted -> the string; else YAML (lists, bools, null), with
    ``1e-6``-style floats as floats."""
    import yaml

    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_overrides(overrides: Iterable[str]) -> tuple[dict[str, Any], list[ConfigIssue]]:
    """verl's ``key=value`` / ``+key=value`` / ``++key=value`` / ``~key`` -> {key: value} in order
    (``~key`` removes it: verl's default applies)."""
    given: dict[str, Any] = {}
    issues: list[ConfigIssue] = []
    for text in overrides:
        if text.startswith("~"):
            given.pop(text[1:].split("=")[0], None)
            continue
        key, sep, value = text.lstrip("+").partition("=")
        if not sep or not key:
            issues.append(ConfigIssue(text, "not a verl override (expected key=value)"))
            continue
        given[key.strip()] = parse_value(value)
    return given, issues


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted leaves of a nested mapping (an empty mapping is a leaf)."""
    if not isinstance(node, Mapping) or not node:
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def read_verl_file(path: str | Path) -> tuple[dict[str, Any], list[ConfigIssue]]:
    """The leaves of a verl (Hydra) config file, its defaults list composed: entries found next to
    the file are merged in order (``_self_`` where listed, else last); verl's own config names
    (``ppo_trainer``, ``actor@...``) are the defaults this translation starts from."""
    import yaml

    file = Path(path).expanduser()
    if not file.is_file():
        return {}, [ConfigIssue(str(path), "no such verl config file")]
    data = yaml.safe_load(file.read_text()) or {}
    if not isinstance(data, dict):
        return {}, [ConfigIssue(str(path), "not a mapping")]
    issues: list[ConfigIssue] = []
    defaults = data.pop("defaults", None) or []
    data.pop("hydra", None)
    merged: dict[str, Any] = {}
    own = flatten(data)
    placed = False
    for entry in defaults:
        name = entry if isinstance(entry, str) else None
        if isinstance(entry, Mapping) and len(entry) == 1:
            name = str(next(iter(entry.values())))
        if name == "_self_":
            merged.update(own)
            placed = True
            continue
        if name is None:
            continue
        reason = CONFIG_NAMES.get(name.removesuffix(".yaml"))
        if reason:
            issues.append(ConfigIssue(f"{path}: defaults {name}", reason))
        candidate = file.parent / f"{name.removesuffix('.yaml')}.yaml"
        if candidate.is_file() and candidate.resolve() != file.resolve():
            inner, more = read_verl_file(candidate)
            merged.update(inner)
            issues += more
    if not placed:
        merged.update(own)
    return merged, issues


# --- the translation ---------------------------------------------------------------------------


class _Out:
    """The config being built, its rows and refusals."""

    def __init__(self, given: Mapping[str, Any], view: Mapping[str, Any]) -> None:
        self.given = given
        self.view = view
        self.data: dict[str, Any] = {}
        self.rows: list[Row] = []
        self.refused: list[ConfigIssue] = []
        self.covered: set[str] = set()
        self.read: set[str] = set()
        self.rollout_devices = 1

    def get(self, key: str) -> Any:
        self.read.add(key)
        value = self.view.get(key)
        return None if isinstance(value, str) and value.startswith("${") else value

    def integer(self, key: str) -> int:
        """``key``'s value as an int (refused, naming it, when it is not one: verl's default)."""
        return int(self._number(key, int))

    def number(self, key: str) -> float:
        return float(self._number(key, float))

    def _number(self, key: str, kind: type) -> float:
        value = self.get(key)
        try:
            if isinstance(value, bool) or value is None:
                raise ValueError
            return kind(float(value)) if kind is float else kind(str(value))
        except (TypeError, ValueError):
            self.refuse(key, f"expected {'an integer' if kind is int else 'a number'}")
            fallback = VERL_DEFAULTS.get(key)
            return fallback if isinstance(fallback, (int, float)) and fallback else 1

    def set(self, sources: Sequence[str], target: str, value: Any, note: str = "") -> None:
        node = self.data
        *parents, last = target.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        self.rows.append(Row(tuple(sources), target, value, note))
        self.covered.update(sources)

    def noop(self, key: str, note: str) -> None:
        self.rows.append(Row((key,), "", None, note))
        self.covered.add(key)

    def refuse(self, key: str, why: str) -> None:
        if key in self.covered and any(i.path == key for i in self.refused):
            return
        value = self.given.get(key, self.view.get(key))
        self.refused.append(ConfigIssue(key, f"verl key ={_text(value)}: {why}"))
        self.covered.add(key)


def entry_mode(entry: str) -> str:
    """The mode an entry module selects (ConfigError naming an unknown one)."""
    module = entry.removesuffix(".py").replace("/", ".")
    mode = ENTRIES.get(module)
    if mode is None:
        known = ", ".join(ENTRIES)
        raise ConfigError(ConfigIssue("--entry", f"{entry!r} is not a verl entry module ({known})"))
    return mode


def translate(
    overrides: Iterable[str] = (),
    *,
    entry: str = MAIN_PPO,
    config_file: str | Path | None = None,
    config_name: str | None = None,
    count_rows: Any = None,
) -> VerlTranslation:
    """Translate a verl command (``entry`` module, ``overrides``, optional ``config_file`` or
    verl ``config_name``); refusals are collected in ``.refused`` (``raise_if_refused``).
    ``count_rows(path) -> int | None`` counts a data file's rows (default: parquet metadata when
    pyarrow is importable)."""
    mode = entry_mode(entry)
    issues: list[ConfigIssue] = []
    from_file: dict[str, Any] = {}
    if config_name is not None:
        reason = CONFIG_NAMES.get(config_name.removesuffix(".yaml"))
        if reason:
            issues.append(ConfigIssue("--config-name", f"{config_name}: {reason}"))
        elif config_file is None and config_name.removesuffix(".yaml") not in CONFIG_NAMES:
            issues.append(ConfigIssue("--config-name", f"{config_name}: no such verl config"))
    if config_file is not None:
        from_file, more = read_verl_file(config_file)
        issues += more
    command, more = parse_overrides(overrides)
    issues += more
    given = {**from_file, **command}
    view = {**VERL_DEFAULTS, **RECIPE_DEFAULTS.get(mode, {}), **given}
    out = _Out(given, view)
    out.refused += issues
    for key, value in given.items():
        _apply_rule(out, key, value)
    _build(out, mode, count_rows or _parquet_rows)
    for key in given:
        if key in out.covered:
            continue
        if key in out.read:  # read, and its value (often verl's default) adds no row of its own
            out.noop(key, "read; with this value it changes nothing here")
        elif out.refused:  # the translation stopped short at a refusal: not a missing rule
            continue
        else:
            out.refuse(key, "read by no translation rule (a bug: please report it)")
    return VerlTranslation(entry, mode, given, out.data, out.rows, out.refused)


def _apply_rule(out: _Out, key: str, value: Any) -> None:
    rule = rule_for(key)
    if rule is None:
        out.refuse(key, "not a verl key this translation knows")
    elif rule.kind == "to":
        try:
            converted = rule.convert(value) if rule.convert else value
        except (TypeError, ValueError) as exc:
            out.refuse(key, f"bad value ({exc})")
            return
        out.set((key,), rule.target, converted, rule.why)
    elif rule.kind == "noop":
        out.noop(key, rule.why)
    elif rule.kind == "only":
        assert rule.accept is not None
        if rule.accept(value):
            out.noop(key, f"as verl's default; {rule.why}" if rule.why else "")
        else:
            out.refuse(key, rule.why)
    elif rule.kind == "refuse":
        out.refuse(key, rule.why)
    # "derived": _build writes its rows


def _parquet_rows(path: str) -> int | None:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    try:
        return int(pq.ParquetFile(str(Path(path).expanduser())).metadata.num_rows)
    except (OSError, ValueError):
        return None


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, min(n, at_most)) + 1) if n % d == 0)


def _build(out: _Out, mode: str, count_rows: Any) -> None:
    """The keys that depend on several verl keys (batches, devices, steps, roles, loss)."""
    from rl_config.verl_build import build

    build(out, mode, count_rows)
