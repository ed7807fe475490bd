"""Where the trainer -> rollout weight-sync group meets: the trainer node's address.

Rank 0 of the sync group (the trainer) hosts its TCP store and the others connect to it, so the
address must reach the trainer's node from every rollout node. `choose_sync_host` decides: the
configured `weight_sync_host` if set; loopback when the trainer and every rollout worker share a
node (the store then listens on loopback only, as the security rule asks of single-node runs);
else the trainer node's Ray IP. `node_address()` is what a worker reports about its own node;
`sync_local_addr(host)` is where its own gloo connections listen (its node's IP in a cross-node
group, so peers on other nodes can reach it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class NodeAddress:
    """A worker's node: Ray's node id (``"local"`` without Ray) and its IP."""

    node_id: str
    ip: str


def node_address() -> NodeAddress:
    """The node of the calling process: Ray's node id and IP under Ray, else loopback."""
    try:
        import ray
    except ImportError:  # pragma: no cover - rl-runtime depends on ray
        return NodeAddress("local", LOOPBACK)
    if not ray.is_initialized():
        return NodeAddress("local", LOOPBACK)
    return NodeAddress(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())


def sync_local_addr(host: str) -> str | None:
    """Where this worker's own collective connections listen in a group meeting at `host`:
    None (loopback, rl_sync's default) for a loopback `host`, else this node's IP."""
    from rl_sync.store import is_loopback_host

    return None if is_loopback_host(host) else node_address().ip


def choose_sync_host(
    trainer: NodeAddress, rollout: Sequence[NodeAddress], configured: str | None = None
) -> str:
    """The address the trainer's sync store listens on and the rollout workers connect to."""
    if configured:
        return configured
    if all(r.node_id == trainer.node_id for r in rollout):
        return LOOPBACK
    return trainer.ip


__all__ = ["LOOPBACK", "NodeAddress", "choose_sync_host", "node_address", "sync_local_addr"]
