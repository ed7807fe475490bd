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
