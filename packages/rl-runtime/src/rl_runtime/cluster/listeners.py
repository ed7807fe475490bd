"""Which TCP addresses a process tree listens on (Linux `/proc`), to check loopback-only binds.

`listening_sockets(pid)` walks `pid` and its descendants (Ray's GCS, raylet, agents and workers
are descendants of the driver that started them), maps each process's socket descriptors to the
kernel's socket table (`/proc/net/tcp`, `/proc/net/tcp6`) and returns the sockets in LISTEN state.
`exposed(listeners)` keeps those reachable from outside the machine (not loopback).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

LISTEN_STATE = "0A"


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: owning pid, process name, local address and port."""

    pid: int
    name: str
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        address = ipaddress.ip_address(self.host)
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address.is_loopback


def process_tree(root: int) -> list[int]:
    """`root` and every live descendant, by parent pid from `/proc/<pid>/stat`."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _decode(hex_address: str) -> tuple[str, int]:
    """`/proc/net/tcp{,6}` local address (host bytes in kernel order, hex) -> (ip, port)."""
    host_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(host_hex)
    # each 32-bit word is stored in host (little-endian) order
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(packed) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, packed), int(port_hex, 16)


def _listening_table() -> dict[str, tuple[str, int]]:
    """inode -> (ip, port) of every LISTEN socket in this network namespace."""
    table: dict[str, tuple[str, int]] = {}
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net", name)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN_STATE:
                table[fields[9]] = _decode(fields[1])
    return table


def listening_sockets(root: int | None = None) -> list[Listener]:
    """Listening TCP sockets owned by `root` (default: this process) and its descendants."""
    table = _listening_table()
    out = []
    for pid in process_tree(os.getpid() if root is None else root):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for inode in _socket_inodes(pid):
            if inode in table:
                host, port = table[inode]
                out.append(Listener(pid, name, host, port))
    return sorted(set(out), key=lambda x: (x.pid, x.port))


def exposed(listeners: list[Listener]) -> list[Listener]:
    """The listeners reachable from other machines (bound to a non-loopback or any address)."""
    return [x for x in listeners if not x.loopback]
