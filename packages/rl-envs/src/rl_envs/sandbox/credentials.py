"""The user's credentials that untrusted calls must not read, hidden in each call's mounts.

A call sees the whole file tree read-only (``isolation.private_mounts``). Running as its own
slot uid (a root pool), it cannot open the user's ``0600`` files anyway; in a user namespace (a
pool started by an ordinary user) it runs as that user and could read them: the checkpoint
signing key (which would let it forge checkpoints), SSH keys, cloud and registry credentials,
access tokens. Their output reaches logs and the model (a tool's stdout), so each call's mount
namespace hides them: an empty read-only directory over each directory, ``/dev/null`` over each
file. ``secret_paths`` lists those that exist, resolved in the trainer's process (the workers
run with ``HOME=/tmp``). Without mount namespaces (weak isolation) nothing can be hidden, and
the pool's ``isolation["secrets"]`` says so.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from pathlib import Path

#: under the home directory: credentials of common tools
HOME_SECRETS = (
    ".ssh",
    ".gnupg",
    ".netrc",
    ".git-credentials",
    ".aws",
    ".azure",
    ".kube",
    ".docker/config.json",
    ".pypirc",
    ".config/gcloud",
    ".config/gh",
    ".config/rl-stack",  # the checkpoint signing key (rl_train.signing)
    ".cache/huggingface/token",
    ".huggingface/token",
    ".config/wandb",  # tracker credentials (its API key lives in ~/.netrc, above)
)
#: environment variables naming a credential file (or the directory of one)
PATH_VARIABLES = ("RL_CHECKPOINT_KEY_FILE", "HF_TOKEN_PATH", "NETRC", "WANDB_CONFIG_DIR")
#: more paths to hide, ``os.pathsep``-separated: what the runtime knows is secret (a checkpoint
#: key named by ``checkpoint_config.key_file``), set in the trainer's and its workers' environment
HIDE_VARIABLE = "RL_SANDBOX_HIDE"


def secret_paths(env: Mapping[str, str] | None = None) -> list[str]:
    """Existing credential paths of this process's user (absolute, symlinks resolved, sorted):
    `HOME_SECRETS` under ``$HOME`` and under the account's home directory, ``rl-stack`` under
    ``$XDG_CONFIG_HOME``, the files `PATH_VARIABLES` name and those listed in `HIDE_VARIABLE`."""
    env = os.environ if env is None else env
    homes = {env.get("HOME", ""), _account_home()} - {""}
    found = [Path(home, name) for home in homes for name in HOME_SECRETS]
    if env.get("XDG_CONFIG_HOME"):
        found.append(Path(env["XDG_CONFIG_HOME"], "rl-stack"))
    found += [Path(env[name]) for name in PATH_VARIABLES if env.get(name)]
    found += [Path(p) for p in env.get(HIDE_VARIABLE, "").split(os.pathsep) if p]
    return sorted({str(p.resolve()) for p in found if p.is_absolute() and p.exists()})


def hide_from_calls(path: str | os.PathLike[str], env: dict[str, str] | None = None) -> str:
    """Add ``path`` (made absolute) to `HIDE_VARIABLE` in ``env`` (default: this process's
    environment, read by pools started afterwards); returns the variable's new value."""
    target = os.environ if env is None else env
    listed = [p for p in target.get(HIDE_VARIABLE, "").split(os.pathsep) if p]
    absolute = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if absolute not in listed:
        listed.append(absolute)
    target[HIDE_VARIABLE] = os.pathsep.join(listed)
    return target[HIDE_VARIABLE]


def _account_home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return ""
