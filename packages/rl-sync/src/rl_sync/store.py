"""Rendezvous stores that listen only where they must: loopback in single-node runs.

``TCPStore(host, port, is_master=True)`` listens on every interface (``::``) whatever ``host``
says: ``host`` only tells clients where to connect. Anyone who reaches that port can write keys
into a rendezvous. :func:`create_store` therefore binds the listening socket itself when ``host`` is
a loopback address and hands its descriptor to the store (``master_listen_fd``), so the server is
reachable from this machine only. A non-loopback ``host`` (a multi-node run) keeps torch's
behaviour: the peers on other machines must reach it.

:func:`loopback_interface` names the loopback interface, and :func:`loopback_socket_env` the
backend's own variable that pins a single-node group's sockets to it (``GLOO_SOCKET_IFNAME``,
``NCCL_SOCKET_IFNAME``, ``HCCL_SOCKET_IFNAME``), so the gloo pairs and the NCCL/HCCL bootstrap
sockets listen on loopback too instead of on the hostname's or the first external interface's
address.

Picking a port is a race: a port found free (bind to 0, close) can be taken by any process (Ray
opens many connections, each on an ephemeral port) before the store binds it. Two ways out:

- :func:`node_local_store`: the ranks of a group that lives on one node meet in a ``FileStore``
  named by a random token: no port and no network listener at all;
- ``create_store(..., listener=sock)``: rank 0 binds its listener first (:func:`bind_listener`,
  port 0), publishes the port, and hands the socket to the store later; nothing else can take the
  port in between.

A node-local store's file outlives a launcher that is killed (SIGKILL) before it removes it. A
token names the process that made it and its host (``<pid>-<host tag>-<random>``), so
:func:`sweep_leaked_rendezvous`, run when a group starts, can remove this user's files whose
maker on this host is gone.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import stat
import tempfile
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

from torch._C._distributed_c10d import FileStore, HashStore, Store, TCPStore

IFF_LOOPBACK = 0x8


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and for any address in 127.0.0.0/8 or ``::1``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_listener(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A listening TCP socket on exactly ``host:port`` (``port=0``: a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]") if host != "localhost" else "127.0.0.1", port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def create_store(
    host: str,
    port: int,
    world_size: int,
    is_master: bool,
    timeout_s: float,
    *,
    listener: socket.socket | None = None,
) -> TCPStore:
    """A ``TCPStore`` server (``is_master``) or client at ``host:port``.

    The server listens on ``host`` alone when it is a loopback address (see module docstring);
    ``port=0`` picks a free port (read it back from ``store.port``). ``listener`` (server only): a
    socket already bound and listening (:func:`bind_listener`), which the store takes over, so the
    port published before this call cannot have been taken meanwhile. Clients do not wait for the
    other ranks here: the backend's rendezvous does.
    """
    timeout = timedelta(seconds=timeout_s)
    if listener is not None and not is_master:
        raise ValueError("listener: only the store's server (is_master) listens")
    if is_master and (listener is not None or is_loopback_host(host)):
        sock = listener if listener is not None else bind_listener(host, port)
        bound_port = int(sock.getsockname()[1])
        if port not in (0, bound_port):
            sock.close()
            raise ValueError(f"listener is bound to port {bound_port}, not the requested {port}")
        fd = sock.detach()  # the store owns the descriptor from here on
        try:
            return TCPStore(
                host, bound_port, world_size, True, timeout=timeout, wait_for_workers=False,
                master_listen_fd=fd,
            )  # fmt: skip
        except RuntimeError as exc:
            # torch 2.7's libuv backend refuses a listen fd (before touching it); the legacy
            # backend takes it
            if "listen fd" not in str(exc):
                os.close(fd)
                raise
            return TCPStore(
                host, bound_port, world_size, True, timeout=timeout, wait_for_workers=False,
                master_listen_fd=fd, use_libuv=False,
            )  # fmt: skip
    return TCPStore(host, port, world_size, is_master, timeout=timeout, wait_for_workers=False)


_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,64}")
STORE_PREFIX = "rl-rendezvous-"
#: a store file named by :func:`new_rendezvous_token`: the maker's pid, its host's tag, then
#: 128 random bits
_SWEEPABLE = re.compile(re.escape(STORE_PREFIX) + r"([1-9][0-9]{0,6})-([0-9a-f]{8})-[0-9a-f]{32}")


def node_local_store(token: str, world_size: int) -> Store:
    """The rendezvous store of a group whose ranks all run on this node: a ``FileStore`` at
    ``<tempdir>/rl-rendezvous-<token>``. Every rank passes the same ``token`` (16-64 characters
    of ``[A-Za-z0-9_-]``, random: :func:`new_rendezvous_token`; a guessable name could be
    planted). No port, no listener: nothing to race for and nothing another host can reach. The
    file is created 0600 (:func:`create_private_file`): other local users cannot read its keys. The
    launcher removes the file after its ranks (:func:`remove_node_local_store`). ``FileStore``'s
    own removal, by the last rank whose store is destroyed, is not to be relied on: it never
    happens for a rank that is killed or leaves by ``os._exit``, and it races when two ranks leave
    together (its "finished" and "references" counters are updated under separate locks, so each
    rank can read that the other is still there).

    A group of one rank meets no one: it gets an in-memory ``HashStore`` and no file is made, so
    a killed single-rank worker (the common role size on one machine) leaves nothing behind."""
    path = node_local_store_path(token)  # the token is checked either way
    if world_size == 1:
        return HashStore()
    create_private_file(path)
    return FileStore(str(path), world_size)


def create_private_file(path: Path) -> None:
    """Make ``path`` an empty file only this user can read and write (0600, whatever the umask),
    before ``FileStore`` opens it: ``FileStore`` would create it 0644 under umask 022, and its
    keys (for NCCL groups, the unique id) would be readable by every local user.

    Every rank of a group calls this, concurrently: the one whose exclusive create wins makes the
    file; the others find it and check it is a private regular file of this user, not a symlink
    or a file someone else planted under the name (which a sticky temp dir keeps others from
    replacing afterwards). ``FileStore`` works on the pre-created empty file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        info = os.lstat(path)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != os.geteuid()
            or stat.S_IMODE(info.st_mode) & 0o077
        ):
            raise PermissionError(
                f"rendezvous store {path} exists but is not a private regular file of this user "
                f"(mode {stat.S_IMODE(info.st_mode):04o}, uid {info.st_uid}): refusing to use it"
            ) from None
        return
    try:
        os.fchmod(fd, 0o600)  # a umask that took the owner's bits away too
    finally:
        os.close(fd)


def node_local_store_path(token: str) -> Path:
    """Where :func:`node_local_store` keeps the store of ``token`` on this node."""
    if not _TOKEN.fullmatch(token):
        raise ValueError(
            f"rendezvous token {token!r}: expected 16-64 characters of [A-Za-z0-9_-] "
            "(rl_sync.store.new_rendezvous_token)"
        )
    return Path(tempfile.gettempdir()) / f"{STORE_PREFIX}{token}"


def remove_node_local_store(token: str) -> bool:
    """Remove the store file of ``token`` on this node after its ranks have left; whether there
    was one (a group of one rank, or ranks on another node, leave none here)."""
    path = node_local_store_path(token)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def new_rendezvous_token() -> str:
    """A fresh token for :func:`node_local_store`: ``<pid>-<host tag>-<128 random bits in
    hex>``, the pid of the process that makes it (the launcher, which removes the store after
    its ranks) and :func:`host_tag`, so a store it leaves when killed can be found by
    :func:`sweep_leaked_rendezvous`."""
    import secrets

    return f"{os.getpid()}-{host_tag()}-{secrets.token_hex(16)}"


def host_tag() -> str:
    """8 hex digits naming this host (of its hostname): a pid means something only on the host
    whose process it is (the ranks of a launcher on another node make its store on theirs)."""
    import hashlib

    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (any user's: a pid reused by another
    process counts as alive; a zombie too, until its parent reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def sweep_leaked_rendezvous(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the node-local store files (``rl-rendezvous-<pid>-<host tag>-<hex>``, in
    ``directory``, default the temp dir) made on this host (:func:`host_tag`) whose maker
    ``<pid>`` is no longer alive: a launcher killed before it removed its store. Only regular
    files owned by this user are removed (a symlink is never followed nor removed, another
    user's file never touched); a live pid, even one reused by another process, keeps its file,
    and so does a file another host's launcher named (its pid means nothing here). Stores named
    by older tokens (no pid) are left alone. Returns what was removed; a file that cannot be
    examined or removed is skipped.

    Containers of one hostname and uid that share a temp dir but not a pid namespace cannot
    tell each other's live launchers from dead ones: give them their own temp dir."""
    root = Path(tempfile.gettempdir() if directory is None else directory)
    tag, removed = host_tag(), []
    try:
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return []
    try:
        with os.scandir(dir_fd) as entries:
            names = [e.name for e in entries if e.name.startswith(STORE_PREFIX)]
        for name in names:
            match = _SWEEPABLE.fullmatch(name)
            if match is None or match.group(2) != tag or pid_alive(int(match.group(1))):
                continue
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                    continue
                os.unlink(name, dir_fd=dir_fd)  # unlink never follows a symlink either
            except OSError:
                continue
            removed.append(root / name)
    finally:
        os.close(dir_fd)
    return removed


def loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux), or None if unknown."""
    for name in _interface_names():
        flags = Path("/sys/class/net", name, "flags")
        try:
            if int(flags.read_text().strip(), 16) & IFF_LOOPBACK:
                return name
        except (OSError, ValueError):
            continue
    return None


#: per backend: the variables that choose the interface its sockets listen on, the one set to
#: pin it to loopback first; a backend whose any of these the user set is left alone.
#: gloo: GLOO_SOCKET_IFNAME, an interface name. nccl: NCCL_SOCKET_IFNAME, where a leading ``=``
#: asks for that exact name rather than a prefix (NCCL's environment variable docs).
#: hccl: HCCL_SOCKET_IFNAME takes the same ``=name`` form for an exact name, and HCCL_IF_IP (one
#: host IP) takes precedence over it; with neither set HCCL prefers any interface other than
#: docker/lo (Ascend CANN environment variable reference, "HCCL_SOCKET_IFNAME" and "HCCL_IF_IP",
#: hiascend.com/document/detail/zh/canncommercial/latest/maintenref/envvar/envref_07_0075.html).
SOCKET_IFNAME_VARS: dict[str, tuple[str, ...]] = {
    "gloo": ("GLOO_SOCKET_IFNAME",),
    "nccl": ("NCCL_SOCKET_IFNAME",),
    "hccl": ("HCCL_SOCKET_IFNAME", "HCCL_IF_IP"),
}
_EXACT_NAME_PREFIX = {"gloo": "", "nccl": "=", "hccl": "="}


def loopback_socket_env(
    backend: str,
    environ: Mapping[str, str] | None = None,
    interface: str | None = None,
) -> dict[str, str]:
    """The variables to set so a group of ``backend`` whose ranks all run on this node listens
    on the loopback interface only: ``{"GLOO_SOCKET_IFNAME": "lo"}``,
    ``{"NCCL_SOCKET_IFNAME": "=lo"}``, ``{"HCCL_SOCKET_IFNAME": "=lo"}``. Empty when the user
    already chose (any of the backend's :data:`SOCKET_IFNAME_VARS` set in ``environ``, default
    ``os.environ``), when no loopback interface is known, or for an unknown backend.
    ``interface``: the loopback interface's name (default :func:`loopback_interface`).

    Set it in the process before the backend's first group there: NCCL reads its interface once
    per process. Callers merge it into ``os.environ`` (nothing here changes the environment)."""
    names = SOCKET_IFNAME_VARS.get(backend)
    environ = os.environ if environ is None else environ
    if names is None or any(name in environ for name in names):
        return {}
    lo = interface if interface is not None else loopback_interface()
    if lo is None:
        return {}
    return {names[0]: _EXACT_NAME_PREFIX[backend] + lo}


def _interface_names() -> list[str]:
    try:
        return [name for _index, name in socket.if_nameindex()]
    except OSError:  # pragma: no cover - platforms without if_nameindex
        return []


__all__ = [
    "bind_listener",
    "create_private_file",
    "create_store",
    "host_tag",
    "is_loopback_host",
    "loopback_interface",
    "loopback_socket_env",
    "new_rendezvous_token",
    "node_local_store",
    "node_local_store_path",
    "pid_alive",
    "sweep_leaked_rendezvous",
]
