"""Bounds on a YAML config file before it is loaded: its size, and the size of what it expands to.

A YAML alias (``*name``) refers to an anchored node (``&name``) without copying it, so a file of
a few hundred bytes can name ten million values (the "billion laughs": each level repeats the one
before ten times), and an alias inside its own anchor names an endless one. The YAML parser shares
the nodes, but OmegaConf (and Hydra's composition) copies every value it reaches: such a file
takes minutes and gigabytes, or recurses until the stack runs out.

Offers: ``check_yaml_file(path)``: raise ``ConfigError`` naming the file when it is larger than
``MAX_CONFIG_BYTES`` or expands to more than ``MAX_CONFIG_NODES`` values (aliases counted as
often as they are used), or when an alias refers to a node that holds it. The count walks the
parsed node graph once per distinct node (shared nodes are counted from a memo), so the check
itself costs no more than the file's size. The check is a function of the file's bytes alone:
the SHA-256 digests of the last ``PASSED_MEMO`` files that passed are kept, and the same bytes
(a fragment every ROLL example's defaults list brings in; one file composed again) are not
parsed again (the pure-Python parse was a sixth of a ROLL example's composition). Real configs
(ROLL's examples: a few hundred values; DeepSpeed fragments shared by alias) stay far below both
bounds.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from rl_config.errors import ConfigError, ConfigIssue

if TYPE_CHECKING:
    import yaml

MAX_CONFIG_BYTES = 4 << 20
MAX_CONFIG_NODES = 200_000
PASSED_MEMO = 4096
_passed: set[bytes] = set()  # SHA-256 digests of file contents that passed the check


def check_yaml_file(path: str | Path) -> None:
    """Raise ``ConfigError`` unless ``path`` is a YAML file within the bounds (module doc)."""
    import yaml

    path = Path(path)
    with path.open("rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        _refuse(path, f"the file is larger than {MAX_CONFIG_BYTES >> 20} MiB")
    digest = hashlib.sha256(data).digest()
    if digest in _passed:
        return
    try:
        root = yaml.compose(data, Loader=yaml.SafeLoader)
        if root is not None:
            _expanded_size(root, {}, set(), path)
    except yaml.YAMLError:
        return  # the loader reports the syntax error itself, with its line
    except RecursionError:
        _refuse(path, "its values are nested too deep")
    if len(_passed) >= PASSED_MEMO:
        _passed.clear()
    _passed.add(digest)


def _expanded_size(node: yaml.Node, memo: dict[int, int], open_nodes: set[int], path: Path) -> int:
    """How many values ``node`` stands for once every alias is copied out (raises past the
    bound, or on a node that contains itself)."""
    key = id(node)
    if key in memo:
        return memo[key]
    if key in open_nodes:
        _refuse(path, "an alias (*name) refers to a node that contains it (an endless value)")
    open_nodes.add(key)
    size = 1
    if isinstance(node.value, list):  # sequence: [node]; mapping: [(key node, value node)]
        for child in node.value:
            for sub in child if isinstance(child, tuple) else (child,):
                size += _expanded_size(sub, memo, open_nodes, path)
                if size > MAX_CONFIG_NODES:
                    _refuse(
                        path,
                        f"its aliases (*name) expand it to more than {MAX_CONFIG_NODES} values",
                    )
    open_nodes.discard(key)
    memo[key] = size
    return size


def _refuse(path: Path, why: str) -> None:
    raise ConfigError(ConfigIssue("", f"refused to load {path.name}: {why}"), source=str(path))
