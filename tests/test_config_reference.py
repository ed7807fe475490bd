"""docs/config.md is what tools/config_reference.py generates from the schema and the contract."""

from __future__ import annotations

import re

from rl_config.contract import declared, schema_keys
from tools import config_reference


def test_config_reference_is_current() -> None:
    text = config_reference.render()
    current = (
        config_reference.OUT.read_text(encoding="utf-8") if config_reference.OUT.exists() else ""
    )
    assert current == text, (
        f"docs/config.md is stale (the schema, the key contract or a reading module changed): "
        f"run `{config_reference.REGENERATE}` and commit the result"
    )


def test_every_schema_key_has_one_row_with_its_contract_status() -> None:
    rows = {}
    for line in config_reference.OUT.read_text(encoding="utf-8").splitlines():
        found = re.match(r"\| `([^`]+)` \| `", line)
        if found:
            assert found.group(1) not in rows, f"{found.group(1)} listed twice"
            rows[found.group(1)] = line
    keys = schema_keys()
    assert sorted(rows) == sorted(keys)
    for key in keys:
        status = rows[key].rsplit("|", 2)[-2]
        for pipeline in config_reference.PIPELINES:
            kind = declared(key, pipeline)
            word = {None: "consumed", "unsupported": "refused", "ignored": "warned"}[
                kind and kind[0]
            ]
            assert word in status, f"{key} ({pipeline}): {word} missing from {status!r}"
        if all(declared(key, p) is None for p in config_reference.PIPELINES):
            assert "`rl_runtime." in rows[key], f"{key} is consumed, but no reader is named"


def test_roll_distillation_keys_are_in_the_contract_and_the_reference() -> None:
    """Every ROLL distillation key the converters read (the teacher's, the offline loss's) has
    a row saying where apps/distill reads it, and apps/distill's off_policy section has each
    offline loss key under ROLL's name."""
    from dataclasses import fields

    from rl_config.contract import DISTILL_KEYS
    from rl_config.convert_ofd import KD_KEYS, MARKERS
    from rl_config.convert_opd import FLAGS, RENAMED, TEACHER_READ
    from rl_runtime.pipelines.distill.off_policy import KD_KEYS as APP_KD_KEYS
    from rl_runtime.pipelines.distill.off_policy import OffPolicyOptions

    wanted = {*KD_KEYS, *MARKERS, *FLAGS, *RENAMED, "teacher", "student", "question_key",
              "answer_key", "logits_transfer_backend"}  # fmt: skip
    wanted |= {f"teacher.{k}" for k in TEACHER_READ if k != "model_args"}
    wanted |= {"teacher.model_args.model_name_or_path", "teacher.model_args.dtype"}
    assert wanted <= set(DISTILL_KEYS), sorted(wanted - set(DISTILL_KEYS))
    assert set(KD_KEYS) == set(APP_KD_KEYS) <= {f.name for f in fields(OffPolicyOptions)}
    text = config_reference.OUT.read_text(encoding="utf-8")
    for key in DISTILL_KEYS:
        assert f"| `{key}` | " in text, key
