"""Signed manifests: how a checkpoint directory proves this project wrote it.

A checkpoint holds pickles (DCP's ``.metadata``, DCP byte items, DeepSpeed's files) that execute
code when loaded, and whoever can write the directory can also rewrite a plain manifest. So the
manifest (size and sha256 of every file) is authenticated with HMAC-SHA256 under a secret key kept
OUTSIDE the checkpoint directory, and nothing in a checkpoint is opened by a loader before
:func:`verify_manifest` has checked the MAC, then every file's size and hash, and found no file
the manifest does not list (and no symlink).

The key file: ``key_file`` when given, else ``$RL_CHECKPOINT_KEY_FILE``, else
``$XDG_CONFIG_HOME/rl-stack/checkpoint.key`` (``~/.config/rl-stack/checkpoint.key``). It is
created on first use (32 random bytes, hex, mode 0600, in a 0700 directory) and must stay
private: one that others can read or write is refused. Every host that loads a checkpoint needs
the same key file (copy it, or point ``$RL_CHECKPOINT_KEY_FILE`` at a shared private path).

Files: ``MANIFEST.json`` (``{"format": 1, "step": N, "files": {rel: {"bytes", "sha256"}}}``)
and ``MANIFEST.hmac`` (``{"alg": "hmac-sha256", "key_id": ..., "mac": hex}``; ``key_id`` is a
fingerprint that names the key in errors, not the key).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_train.durable import write_durable

KEY_FILE_ENV = "RL_CHECKPOINT_KEY_FILE"
MANIFEST = "MANIFEST.json"
SIGNATURE = "MANIFEST.hmac"
_ALG = "hmac-sha256"
_KEY_BYTES = 32
#: size limits of what is read from a checkpoint before its MAC is checked: a manifest lists every
#: file in about 130 bytes (a sharded checkpoint of a large model has thousands), a signature is ~150
MAX_MANIFEST_BYTES = 64 << 20
MAX_SIGNATURE_BYTES = 4096
_HEX_RE = re.compile(r"[0-9a-f]+")


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete, corrupt or not vouched for; the message names the file."""


@dataclass(frozen=True)
class CheckpointKey:
    """The secret that signs manifests, and where it came from."""

    path: Path
    secret: bytes = b""

    @property
    def key_id(self) -> str:
        return hashlib.sha256(b"rl-stack key id\0" + self.secret).hexdigest()[:16]

    def __repr__(self) -> str:  # never print the secret
        return f"CheckpointKey(path={str(self.path)!r}, key_id={self.key_id!r})"


def default_key_file() -> Path:
    """``$RL_CHECKPOINT_KEY_FILE``, else ``$XDG_CONFIG_HOME/rl-stack/checkpoint.key``."""
    if os.environ.get(KEY_FILE_ENV):
        return Path(os.environ[KEY_FILE_ENV]).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "rl-stack" / "checkpoint.key"


def load_key(
    key_file: str | os.PathLike[str] | None = None,
    *,
    create: bool = True,
    checkpoint_root: str | os.PathLike[str] | None = None,
) -> CheckpointKey:
    """Read the signing key (creating it when missing and ``create``, unless
    ``checkpoint_root`` already holds signed checkpoints: then a missing key is an error naming
    both); refuses a key file that is not a private regular file of this user, or that lies in
    an unsafe place (`check_key_location`)."""
    path = Path(key_file).expanduser() if key_file else default_key_file()
    check_key_location(path, checkpoint_root)
    if not path.exists():
        signed = _signed_checkpoint(checkpoint_root)
        if signed is not None:
            raise CheckpointError(
                f"checkpoint key file {path} does not exist, but {signed} was signed with a key: "
                "restore the key that signed it (checkpoint_config.key_file or "
                f"${KEY_FILE_ENV} names where it is) instead of creating a new one"
            )
    if create and not path.exists():
        _create_key(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint key file {path} does not exist") from None
    except OSError as err:
        raise CheckpointError(f"checkpoint key file {path}: cannot open ({err})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"checkpoint key file {path} is not a regular file")
        if info.st_mode & 0o077:
            raise CheckpointError(
                f"checkpoint key file {path} is accessible by others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); run `chmod 600 {path}`"
            )
        if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
            raise CheckpointError(f"checkpoint key file {path} belongs to another user")
        text = f.read().strip()
    try:
        secret = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise CheckpointError(f"checkpoint key file {path}: not a hex key") from None
    if len(secret) < _KEY_BYTES:
        raise CheckpointError(
            f"checkpoint key file {path}: key has {len(secret)} bytes, need {_KEY_BYTES}"
        )
    return CheckpointKey(path, secret)


def check_key_location(path: Path, checkpoint_root: str | os.PathLike[str] | None = None) -> None:
    """Refuse a key file where others could replace or read it: under a directory others may
    write (world-writable without the sticky bit anywhere above it, or world-writable right
    above it), inside the checkpoint root, or inside the checkout of the code being run (the
    work tree, with a ``pyproject.toml``, holding the current directory)."""
    absolute = Path(os.path.abspath(path))
    parents = list(absolute.parents)
    for parent in parents:
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue  # not there yet: created private (0700) with the key
        writable = mode & stat.S_IWOTH
        if writable and (parent == absolute.parent or not mode & stat.S_ISVTX):
            raise CheckpointError(
                f"checkpoint key file {path}: {parent} is writable by every user (mode "
                f"{stat.S_IMODE(mode):04o}), so another user could replace the key; keep it "
                "in a private directory"
            )
    real = Path(os.path.realpath(absolute))
    if checkpoint_root is not None:
        root = Path(os.path.realpath(checkpoint_root))
        if real == root or root in real.parents:
            raise CheckpointError(
                f"checkpoint key file {path} is inside the checkpoint root {checkpoint_root}: "
                "whoever can write a checkpoint could replace the key that vouches for it; keep "
                "it outside"
            )
    checkout = _checkout_of(Path.cwd())
    if checkout is not None and checkout in real.parents:
        raise CheckpointError(
            f"checkpoint key file {path} is inside the checkout {checkout} (it could be "
            "committed, shipped or read with the code); keep it outside"
        )


def _checkout_of(directory: Path) -> Path | None:
    """The project work tree holding ``directory``: the nearest ancestor with both ``.git``
    and ``pyproject.toml``."""
    for candidate in (directory, *directory.parents):
        if (candidate / ".git").exists() and (candidate / "pyproject.toml").is_file():
            return Path(os.path.realpath(candidate))
    return None


def _signed_checkpoint(root: str | os.PathLike[str] | None) -> Path | None:
    """A signed checkpoint directory directly under ``root``, if any."""
    if root is None:
        return None
    with contextlib.suppress(OSError):
        for child in sorted(Path(root).iterdir()):
            if (child / SIGNATURE).is_file():
                return child
    return None


def _create_key(path: Path) -> None:
    """Write the key to a private temporary file, then link it into place: a process racing us
    (another rank, the critic's worker) sees either no key or the complete one."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(_KEY_BYTES) + "\n")
            f.flush()
            os.fsync(f.fileno())
        # another process created it first: use theirs
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def list_files(ckpt: Path) -> list[str]:
    """Every file under ``ckpt`` as a relative posix path, sorted; a symlink is an error."""
    out = []
    for dirpath, dirnames, filenames in os.walk(ckpt, followlinks=False):
        here = Path(dirpath)
        for name in dirnames + filenames:
            p = here / name
            if p.is_symlink():
                raise CheckpointError(
                    f"checkpoint {ckpt}: {p.relative_to(ckpt).as_posix()} is a symlink"
                )
        out.extend((here / name).relative_to(ckpt).as_posix() for name in filenames)
    return sorted(out)


def _mac(key: CheckpointKey, payload: bytes) -> str:
    return hmac.new(key.secret, payload, hashlib.sha256).hexdigest()


def write_manifest(
    ckpt: Path, key: CheckpointKey, *, step: int, skip: tuple[str, ...] = ()
) -> dict[str, dict[str, Any]]:
    """Hash every file under ``ckpt`` (but ``skip``), write and sign the manifest (fsynced)."""
    ignored = {MANIFEST, SIGNATURE, *skip}
    files = {
        rel: {"bytes": (ckpt / rel).stat().st_size, "sha256": sha256_file(ckpt / rel)}
        for rel in list_files(ckpt)
        if rel not in ignored
    }
    payload = json.dumps({"format": 1, "step": step, "files": files}, indent=1).encode()
    write_durable(ckpt / MANIFEST, payload)
    sig = {"alg": _ALG, "key_id": key.key_id, "mac": _mac(key, payload)}
    write_durable(ckpt / SIGNATURE, json.dumps(sig).encode())
    return files


def read_bounded(path: Path, limit: int, ckpt: Path, missing: str = "") -> bytes:
    """The bytes of ``path``, a regular file (not a symlink, FIFO or device) of at most ``limit``
    bytes; anything else is a :class:`CheckpointError` naming the file (``missing`` is added to
    the message of a missing one)."""
    name = path.relative_to(ckpt).as_posix()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {ckpt}: missing file {name}{missing}") from None
    except OSError as err:
        raise CheckpointError(f"checkpoint {ckpt}: cannot open file {name} ({err})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"checkpoint {ckpt}: file {name} is not a regular file")
        data = b""
        while len(data) <= limit and (chunk := os.read(fd, limit + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > limit:
        raise CheckpointError(f"checkpoint {ckpt}: file {name} is larger than {limit} bytes")
    return data


def _signed_mac(ckpt: Path) -> tuple[bytes, str]:
    """``(mac as ASCII hex bytes, key_id)`` from ``MANIFEST.hmac``; anything but a small JSON
    object whose ``mac`` is exactly 64 lowercase hex digits is a :class:`CheckpointError`."""
    raw = read_bounded(
        ckpt / SIGNATURE,
        MAX_SIGNATURE_BYTES,
        ckpt,
        missing=": the checkpoint is not signed, so it cannot be vouched for (written by an "
        "older version or by someone else)",
    )
    try:
        sig = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"checkpoint {ckpt}: unreadable {SIGNATURE} (not JSON)") from None
    mac = sig.get("mac") if isinstance(sig, dict) else None
    if not isinstance(mac, str) or not _HEX_RE.fullmatch(mac) or len(mac) != 64:
        raise CheckpointError(
            f"checkpoint {ckpt}: unreadable {SIGNATURE} (its mac is not 64 lowercase hex digits)"
        )
    key_id = sig.get("key_id")
    if not (isinstance(key_id, str) and len(key_id) <= 64 and _HEX_RE.fullmatch(key_id)):
        key_id = "?"  # only a fingerprint for the message: never echo arbitrary text
    return mac.encode("ascii"), key_id


def _signed_files(ckpt: Path, payload: bytes, step: int | None) -> dict[str, dict[str, Any]]:
    """The ``files`` of an authenticated manifest, checked for shape and for ``step``."""
    try:
        manifest = json.loads(payload)
        files, signed_step = manifest["files"], manifest["step"]
        shape_ok = isinstance(files, dict) and all(
            isinstance(meta, dict)
            and isinstance(meta.get("bytes"), int)
            and isinstance(meta.get("sha256"), str)
            for meta in files.values()
        )
    except (ValueError, RecursionError, KeyError, TypeError):
        shape_ok = False
    if not shape_ok:
        raise CheckpointError(f"checkpoint {ckpt}: unreadable {MANIFEST}")
    if step is not None and signed_step != step:
        raise CheckpointError(
            f"checkpoint {ckpt}: {MANIFEST} is signed for step {signed_step}, but the directory "
            f"is step {step}: renamed or copied from elsewhere"
        )
    return files


def verify_manifest(
    ckpt: Path,
    key: CheckpointKey,
    *,
    step: int | None,
    hashes: bool = True,
    skip: tuple[str, ...] = (),
) -> dict[str, str]:
    """Check the MAC, that the manifest was signed for ``step`` (the step the directory's name
    says; None: a directory named by no step scheme, given explicitly), then each file's size (and
    sha256 when ``hashes``), and that no file is unlisted. ``ckpt`` itself must not be a symlink.
    Returns ``{relative path: sha256}``. Raises :class:`CheckpointError` naming the file.
    Reads only the manifest, its signature and file bytes (the first two bounded in size):
    nothing is unpickled."""
    if ckpt.is_symlink():
        raise CheckpointError(f"checkpoint {ckpt} is a symlink")
    payload = read_bounded(ckpt / MANIFEST, MAX_MANIFEST_BYTES, ckpt)
    mac, key_id = _signed_mac(ckpt)
    if not hmac.compare_digest(mac, _mac(key, payload).encode("ascii")):
        other = "" if key_id == key.key_id else f" (signed by key {key_id})"
        raise CheckpointError(
            f"checkpoint {ckpt}: {MANIFEST} fails its HMAC check under key {key.key_id} from "
            f"{key.path}{other}: modified, or not written by a holder of this key"
        )
    files = _signed_files(ckpt, payload, step)
    ignored = {MANIFEST, SIGNATURE, *skip}
    present = list_files(ckpt)
    unlisted = [rel for rel in present if rel not in files and rel not in ignored]
    if unlisted:
        raise CheckpointError(f"checkpoint {ckpt}: file {unlisted[0]} is not in {MANIFEST}")
    for rel, meta in files.items():
        path = ckpt / rel
        if not path.is_file():
            raise CheckpointError(f"checkpoint {ckpt}: missing file {rel}")
        size = path.stat().st_size
        if size != meta["bytes"]:
            raise CheckpointError(
                f"checkpoint {ckpt}: file {rel} has {size} bytes, manifest says {meta['bytes']} "
                "(truncated or overwritten)"
            )
        if hashes and sha256_file(path) != meta["sha256"]:
            raise CheckpointError(f"checkpoint {ckpt}: file {rel} fails its sha256 check (corrupt)")
    return {rel: str(meta["sha256"]) for rel, meta in files.items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m rl_train.signing trust DIR [--key-file F] [--step N]``: sign an existing
    checkpoint you trust (e.g. one written before checkpoints were signed) with this host's key,
    for the step its name says (``step-N``, or the earlier ``step_N``) unless ``--step`` is given;
    ``verify DIR`` checks one."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rl_train.signing")
    parser.add_argument("command", choices=["trust", "verify"])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--key-file", default=None)
    parser.add_argument("--step", type=int, default=None)
    args = parser.parse_args(argv)
    key = load_key(args.key_file)
    from rl_train.checkpoint_store import dir_step

    named = dir_step(args.checkpoint)
    if args.command == "trust":
        if None not in (named, args.step) and named != args.step:
            parser.error(f"--step {args.step}: {args.checkpoint.name} is step {named}")
        step = named if args.step is None else args.step
        write_manifest(args.checkpoint, key, step=-1 if step is None else step, skip=("COMMITTED",))
        print(f"signed {args.checkpoint} with key {key.key_id} ({key.path})")
        return 0
    try:
        verify_manifest(args.checkpoint, key, step=named, skip=("COMMITTED",))
    except CheckpointError as err:
        print(err)
        return 1
    print(f"{args.checkpoint}: verified with key {key.key_id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
