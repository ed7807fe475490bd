"""Generate docs/config.md: every configuration key, its type, default, status and home.

    uv run python tools/config_reference.py           # rewrite docs/config.md
    uv run python tools/config_reference.py --check   # exit 1 when docs/config.md is stale

The rows come from the schema (`rl_config.schema.ExperimentConfig`, walked by
`rl_config.contract.schema_keys`) and the key contract (`rl_config.contract.declared` per
pipeline kind). "Takes effect in" is measured, not listed: the shipped app configs (and a few
variants that switch on the critic, KL, clipping, LoRA, asynchrony and a decaying schedule) are
composed through a proxy that records the module of every line that reads a key. ROLL's names are
the schema's own (this stack reads ROLL's keys), plus the renamed keys (`roll_compat.KEY_ALIASES`);
verl's names come from `rl_config.verl_keys.VERL_SECTIONS` and `rl_config.verl_rules.RULES`.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic.fields import PydanticUndefined

from rl_config.contract import CHANGES_WHAT_IS_TRAINED, declared, schema_keys
from rl_config.explain import explain
from rl_config.key_reads import KeyReads
from rl_config.loading import compose_config
from rl_config.roll_compat import KEY_ALIASES, ROLL_IGNORED, ROLL_NOT_SUPPORTED
from rl_config.schema import ExperimentConfig
from rl_config.verl_keys import VERL_SECTIONS
from rl_config.verl_rules import RULES

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "config.md"
REGENERATE = "uv run python tools/config_reference.py"
PIPELINES = ("agentic", "rlvr", "dpo", "sft")
ROLES = ("actor_train", "actor_infer", "reference", "critic")
APP_CONFIGS = {
    "agentic": ROOT / "apps/agentic/configs/cpu_default.yaml",
    "rlvr": ROOT / "apps/rlvr/configs/cpu_default.yaml",
    "dpo": ROOT / "apps/dpo/configs/cpu_default.yaml",
    "sft": ROOT / "apps/sft/configs/cpu_default.yaml",
}
# Settings under which compose reads more keys (each alone, on the agentic default).
_DECAY = {"training_args": {"lr_scheduler_type": "cosine"}}
_LORA = {"model_args": {"lora_target": "all-linear"}}
AGENTIC_VARIANTS: list[dict[str, Any]] = [
    {
        "adv_estimator": "gae",
        "critic": {
            "training_args": {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4},
            "device_mapping": [0],
            "strategy_args": {"strategy_name": "fsdp2_train", "strategy_config": {}},
        },
    },
    {"init_kl_coef": 0.1, "add_token_level_kl": True, "use_kl_loss": True, "target_kl": 0.05},
    {
        "use_pg_clip_range": True,
        "dual_clip_loss": True,
        "train_infer_correction": {"is_weight": {"enabled": True}},
    },
    {"actor_train": {**_DECAY, **_LORA}},
    {"num_gpus_per_node": 2, "actor_infer": {"device_mapping": [1]}, "async": {"max_staleness": 1}},
    {"actor_train": {"max_tokens_per_microbatch_in_train": 1280}},
]
RLVR_VARIANTS: list[dict[str, Any]] = [
    {
        "overlong_penalty": {"enable": True, "buffer_length": 4},
        "max_len_mask": True,
        "difficulty_mask": True,
    },
    {
        "actor_train": {"data_args": {"eval_file_name": None}},
        "validation": {
            "data_args": {"file_name": "val.jsonl", "template": "qwen3"},
            "generating_args": {"temperature": 0.6, "max_new_tokens": 5, "stop_strings": ["\\n"]},
            "eval_steps": 30,
        },
    },
    {
        "rewards": {
            "math_rule": {
                "worker_cls": "roll.pipeline.rlvr.rewards.MathRuleRewardWorker",
                "tag_included": ["gsm8k"],
                "timeout_s": 5.0,
            },
            "fmt": {"reward_fn": "format", "format_pattern": "^#### \\d+$", "tag_included": ["f"]},
            "mcq": {"reward_fn": "crossthinkqa", "reward_type": "soft", "tag_included": ["mcq"]},
        },
    },
]


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _load(app: str) -> dict[str, Any]:
    data = dict(compose_config(APP_CONFIGS[app], []).data)
    data.pop(f"{app}_app", None)
    return data


def readers() -> dict[str, set[str]]:
    """Dotted key -> the modules whose code reads it while composing the shipped configs."""
    from rl_runtime.compose import compose
    from rl_runtime.pipelines.dpo.compose import compose_dpo
    from rl_runtime.pipelines.rlvr.compose import build_rlvr
    from rl_runtime.pipelines.sft.compose import compose_sft

    seen: dict[str, set[str]] = defaultdict(set)

    def traced(data: dict[str, Any]) -> Any:
        return KeyReads(ExperimentConfig.model_validate(data), seen)

    agentic = _load("agentic")
    for data in [agentic, *(_merge(agentic, extra) for extra in AGENTIC_VARIANTS)]:
        compose(traced(data), device_kind="cpu")
    rlvr = _load("rlvr")
    for data in [rlvr, *(_merge(rlvr, extra) for extra in RLVR_VARIANTS)]:
        cfg = traced(data)
        compose(cfg, device_kind="cpu", pipeline="rlvr")
        build_rlvr(cfg)
    compose_dpo(traced(_load("dpo")), device_kind="cpu")
    sft = _merge(_load("sft"), {"validation": {"data_args": {"template": "qwen2_5"}}})
    compose_sft(traced(sft), device_kind="cpu")
    return seen


def _generic(key: str) -> str:
    """`actor_train.x` -> `ROLE.x`, for the tables written with a role placeholder."""
    head, _, rest = key.partition(".")
    return f"ROLE.{rest}" if head in ROLES else key


def verl_names() -> dict[str, set[str]]:
    """This stack's key -> the verl keys that set it."""
    out: dict[str, set[str]] = defaultdict(set)
    for section, table in VERL_SECTIONS.items():
        for key, found in table.items():
            for ours in found.keys:
                out[ours].add(f"{section}.{key}")
    for key, rule in RULES.items():
        if rule.kind == "to" and rule.target:
            out[rule.target].add(key)
    return out


def _status(key: str, read: bool) -> str:
    """Per pipeline: consumed, refused (reason) or warned (reason); equal ones grouped."""
    by_status: dict[str, list[str]] = defaultdict(list)
    for pipeline in PIPELINES:
        found = declared(key, pipeline)
        if found is None:
            text = "consumed" if read else "consumed (read where its setting applies)"
        else:
            kind, reason = found
            text = ("refused: " if kind == "unsupported" else "warned: ") + reason
        by_status[text].append(pipeline)
    if len(by_status) == 1:
        return next(iter(by_status))
    return "; ".join(f"{', '.join(p)}: {text}" for text, p in by_status.items())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(value: Any) -> str:
    if value is PydanticUndefined:
        return "(required)"
    text = json.dumps(value, sort_keys=True)
    return f"`{text}`" if len(text) <= 40 else f"`{text[:37]}...`"


_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!vs)\.\s+(?=[A-Z(`])")


def _summary(description: str) -> str:
    """The description's first sentence."""
    first = _SENTENCE_END.split(description.strip(), maxsplit=1)[0].strip()
    return first if first.endswith(".") or not first else first + "."


def _section(key: str) -> str:
    head = key.split(".")[0]
    return head if "." in key else ""


def render() -> str:
    seen = readers()
    verl = verl_names()
    aliases = {new: old for old, new in KEY_ALIASES.items()}
    groups: dict[str, list[str]] = defaultdict(list)
    for key in schema_keys():
        groups[_section(key)].append(key)
    lines = [
        "# Configuration reference",
        "",
        f"Generated by `{REGENERATE}` from the schema (`rl_config.schema`) and the key contract "
        "(`rl_config.contract`); do not edit by hand (a test compares). `rl-config explain KEY` "
        "prints one key's full description.",
        "",
        "- **ROLL / verl**: the key is ROLL's own name (this stack reads ROLL's keys); renamed ROLL "
        "keys and the verl keys that `--verl` / `--verl-config` translate into it are listed.",
        "- **takes effect in**: the module whose code reads the key while the shipped app configs "
        "(and variants that switch on the critic, KL, clipping, LoRA, asynchrony, reward domains, a "
        "validation set) are composed.",
        "- **status**, per pipeline (agentic, rlvr, dpo, sft): *consumed* (read by the composition layer), "
        "*refused* (a value other than the default is an error naming the key, before anything "
        "starts) or *warned* (no effect here; a value other than the default is a warning).",
        "- `ROLE` sections (`actor_train`, `actor_infer`, `reference`, `critic`) share one "
        "schema; their keys are listed per role, since the contract treats the roles apart. "
        "`custom_envs.*` and `rewards.*` stand for any entry name.",
        "",
        "Sections: " + ", ".join(f"[{s or 'top level'}](#{s or 'top-level'})" for s in groups),
        "",
    ]
    for section, keys in groups.items():
        lines += [f"## {section or 'top level'}", ""]
        lines += ["| key | type | default | what | takes effect in | ROLL / verl | status |"]
        lines += ["|---|---|---|---|---|---|---|"]
        for key in keys:
            doc = explain(key.replace("*", "x"))
            names = sorted(verl.get(key, set()))
            alias = aliases.get(key.split(".")[-1])
            if alias and _generic(key).endswith(alias.split(".")[-1]):
                names.insert(0, f"ROLL: {alias}")
            where = ", ".join(f"`{m}`" for m in sorted(seen.get(key, ())))
            row = [
                f"`{key}`",
                _cell(f"`{doc.type}`"),
                _cell(_default(doc.default)),
                _cell(_summary(doc.description)),
                where,
                _cell(", ".join(f"`{n}`" for n in names)),
                _cell(_status(key, key in seen)),
            ]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += [
        "## ROLL keys outside the schema",
        "",
        "ROLL keys this stack accepts without reading them, or refuses by name. Patterns: `ROLE` "
        "is a worker section, `*` any one key.",
        "",
        "| ROLL key | status |",
        "|---|---|",
    ]
    for pattern, reason in CHANGES_WHAT_IS_TRAINED.items():
        lines.append(
            f"| `{pattern}` | refused (leaving it out would change what is trained): {_cell(reason)} |"
        )
    for pattern, reason in ROLL_NOT_SUPPORTED.items():
        lines.append(f"| `{pattern}` | warned, not supported, value ignored: {_cell(reason)} |")
    for pattern, reason in ROLL_IGNORED.items():
        lines.append(f"| `{pattern}` | warned, ignored as ROLL ignores it: {_cell(reason)} |")
    lines += _distill_lines()
    return "\n".join(lines) + "\n"


def _distill_lines() -> list[str]:
    from rl_config.contract import DISTILL_KEYS

    lines = ["", "## ROLL distillation keys (apps/distill)", "",
             "ROLL's on-policy (`student_train`, `student_infer`, `teacher`) and offline "
             "(`student`, `teacher`, `kd_objective` ...) distillation keys are outside the "
             "experiment schema: `rl-config convert` rewrites them into apps/distill's "
             "`distill_app` section (`rl_config.convert_opd`, `rl_config.convert_ofd`), and a "
             "config that still holds them is refused naming that command. `NAME`: a teacher's "
             "name (`default` for ROLL's single `teacher`).", "",
             "| ROLL key | read by apps/distill as |", "|---|---|"]  # fmt: skip
    lines += [f"| `{key}` | {_cell(what)} |" for key, what in DISTILL_KEYS.items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Generate docs/config.md (the configuration reference)."
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
