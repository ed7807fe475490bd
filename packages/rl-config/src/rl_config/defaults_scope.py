"""Where a config's defaults list may reach: its own directory tree, ROLL's fragment folder
beside it, and rl-config's bundled library.

A Hydra defaults entry is a path relative to the config's directory, and ``../`` may climb out
of it: ``defaults: [../../../../home/me/secrets@_here_]`` would merge (and ``rl-config check``
print) any YAML file the user can read. ROLL's examples climb one level, into the fragment folder
beside the example folders (``examples/qwen2.5-0.5B-agentic/x.yaml`` lists
``../config/traj_envs@_here_``: ``examples/config/``); no example climbs further.

Offers:

* ``defaults_roots(config_file, library)``: the directories a defaults entry of ``config_file``
  may resolve into: the config's directory, its sibling ``config/`` folder (ROLL's layout) and
  ``library``, symlinks resolved.
* ``check_defaults_file(file, entry, roots, source)``: raise ``ConfigError`` naming the entry,
  the file it resolves to (symlinks followed) and ``source`` unless it lies inside a root.
"""

from __future__ import annotations

from pathlib import Path

from rl_config.errors import ConfigError, ConfigIssue

ROLL_FRAGMENTS = "config"
"""The folder beside a ROLL example's folder that holds the fragments its defaults list names."""


def defaults_roots(config_file: Path, library: Path) -> tuple[Path, ...]:
    """The directories (resolved) that ``config_file``'s defaults entries may reach."""
    folder = config_file.resolve().parent
    return (folder, (folder.parent / ROLL_FRAGMENTS).resolve(), library.resolve())


def check_defaults_file(file: Path, entry: str, roots: tuple[Path, ...], source: str) -> None:
    """``ConfigError`` unless ``file`` (the defaults entry ``entry``, symlinks resolved) lies
    inside one of ``roots``."""
    resolved = file.resolve()
    if any(resolved.is_relative_to(root) for root in roots):
        return
    raise ConfigError(
        ConfigIssue(
            "defaults",
            f"entry {entry!r} resolves to {resolved}, outside the directories a defaults list "
            f"may read: {roots[0]} (the config's own), {roots[1]} (ROLL's fragment folder "
            "beside it) and rl-config's library; copy the file there",
        ),
        source=source,
    )
