"""Rendezvous stores that listen only where they must: loopback in single-node runs.

``TCPStore(host, port, is_master=True)`` listens on every interface (``::``) whatever ``host``
says: ``host`` only tells clients where to connect. Anyone who reaches that port can write keys
into a rendezvous. :func:`create_store` therefore binds the listening socket itself when ``host`` is
a loopback address and hands its descriptor to the store (``master_listen_fd``), so the server is
reachable from this machine only. A non-loopback ``host`` (a multi-node run) keeps torch's
behaviour: the peers on other machines must reach it.

:func:`loopback_interface` names the loopback interface for ``GLOO_SOCKET_IFNAME``, so the gloo
pairs of a default process group listen on loopback too instead of on the hostname's address.
"""

from __future__ import annotations

import ipaddress
import socket
from datetime import timedelta
from pathlib import Path

from torch._C._distributed_c10d import TCPStore

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
    host: str, port: int, world_size: int, is_master: bool, timeout_s: float
) -> TCPStore:
    """A ``TCPStore`` server (``is_master``) or client at ``host:port``.

    The server listens on ``host`` alone when it is a loopback address (see module docstring);
    ``port=0`` picks a free port (read it back from ``store.port``). Clients do not wait for the
    other ranks here: the backend's rendezvous does.
    """
    timeout = timedelta(seconds=timeout_s)
    if is_master and is_loopback_host(host):
        sock = bind_listener(host, port)
        bound_port = int(sock.getsockname()[1])
        store = TCPStore(
            host,
            bound_port,
            world_size,
            True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=sock.detach(),  # the store owns the descriptor from here on
        )
        return store
    return TCPStore(host, port, world_size, is_master, timeout=timeout, wait_for_workers=False)


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


def _interface_names() -> list[str]:
    try:
        return [name for _index, name in socket.if_nameindex()]
    except OSError:  # pragma: no cover - platforms without if_nameindex
        return []


__all__ = ["bind_listener", "create_store", "is_loopback_host", "loopback_interface"]
