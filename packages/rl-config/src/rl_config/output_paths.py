"""Where a run writes: `output_dir` given on the command line is the root of everything.

A config file may name its own directories outside `output_dir` (ROLL's examples write
`checkpoint_config.output_dir: /data/cpfs/.../checkpoints` and `tracker_kwargs.log_dir:
/data/oss/tensorboard/...`). When the user gives `output_dir` on the command line and not such a
key, the key's path from the file is rebased under the user's `output_dir` (`REBASED`: the
directory it gets there), and a note names the key, the file's path and the new one; a key given
on the command line, or a path already under `output_dir`, is kept."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rl_config.errors import ConfigIssue

REBASED: dict[str, str] = {
    "checkpoint_config.output_dir": "checkpoints",
    "logging_dir": "logs",
    "tracker_kwargs.log_dir": "tensorboard",
    "render_save_dir": "render",
}
"""Keys of directories a run writes -> their directory under a user-given `output_dir`."""


def _get(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _set(data: dict[str, Any], key: str, value: str) -> None:
    *parents, last = key.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[last] = value


def rebase_under_output_dir(data: dict[str, Any], overrides: Iterable[str]) -> list[ConfigIssue]:
    """Rebase `data`'s `REBASED` paths outside a command-line `output_dir` under it (in place);
    one note per key rebased."""
    from rl_config.overrides import parse_override

    given = {parse_override(text).key.lstrip("+~") for text in overrides}
    out = data.get("output_dir")
    if "output_dir" not in given or not isinstance(out, str) or not out:
        return []
    root = Path(out).expanduser().absolute()
    notes = []
    for key, name in REBASED.items():
        if any(k == key or k.startswith(key + ".") or key.startswith(k + ".") for k in given):
            continue
        value = _get(data, key)
        if not isinstance(value, str) or not value:
            continue
        if Path(value).expanduser().absolute().is_relative_to(root):
            continue
        new = str(Path(out) / name)
        _set(data, key, new)
        notes.append(
            ConfigIssue(
                key,
                f"{value} (from the config file) is outside output_dir={out} given on the "
                f"command line: written to {new} instead (give {key} on the command line to "
                "keep it)",
            )
        )
    return notes
