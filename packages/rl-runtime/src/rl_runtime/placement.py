"""Placement planning: which worker of which role runs on which device, and who shares devices.

`plan_placement` is pure (no Ray): it validates every role's `device_mapping` against the devices
the cluster declares, splits each role into workers of `num_gpus_per_worker` devices, and finds
colocation groups (roles whose device maps overlap; they take turns on the device: sleep/wake and
offload between phases). `PlacementPlan.bundles()` gives the Ray placement-group bundles for each
colocation group; `rl_runtime.worker_group` turns them into placement groups and actors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: CPU reserved per device bundle when roles run on accelerators.
DEFAULT_CPU_PER_BUNDLE = 1.0


@dataclass(frozen=True)
class WorkerSlot:
    """One worker of a role: its rank, the devices it uses and the bundle that holds them."""

    rank: int
    devices: tuple[int, ...]
    bundle_index: int
    #: share of each device this worker asks Ray for (1/k when k roles share the device)
    device_fraction: float
    cpus: float


@dataclass(frozen=True)
class RolePlacement:
    role: str
    devices: tuple[int, ...]
    devices_per_worker: int
    colocation_group: int
    colocated_with: tuple[str, ...]
    workers: tuple[WorkerSlot, ...]

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def is_colocated(self) -> bool:
        return bool(self.colocated_with)


@dataclass
class PlacementPlan:
    """The resolved placement of every role."""

    device_kind: str
    #: Ray resource name of the accelerator ("GPU", "NPU") or None on CPU
    resource_name: str | None
    num_devices: int
    roles: dict[str, RolePlacement]
    #: each group: the roles that share devices and the device slots (bundles) they share
    groups: list[tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]] = field(default_factory=list)
    cpu_per_bundle: float = DEFAULT_CPU_PER_BUNDLE

    def bundles(self, group_index: int) -> list[dict[str, float]]:
        """Ray placement-group bundles of one colocation group: one per device slot."""
        _roles, slots = self.groups[group_index]
        out = []
        for slot in slots:
            bundle = {"CPU": self.cpu_per_bundle}
            if self.resource_name is not None:
                bundle[self.resource_name] = float(len(slot))
            out.append(bundle)
        return out

    def describe(self) -> str:
        """A human-readable table of roles, workers and devices."""
        lines = [
            f"devices: {self.num_devices} x {self.device_kind}"
            + (f" (Ray resource {self.resource_name})" if self.resource_name else "")
        ]
        for role, rp in self.roles.items():
            coloc = f", colocated with {', '.join(rp.colocated_with)}" if rp.colocated_with else ""
            lines.append(
                f"  {role:<12} workers={rp.num_workers} devices={list(rp.devices)} "
                f"per_worker={rp.devices_per_worker}{coloc}"
            )
        return "\n".join(lines)


def _check_devices(role: str, devices: Sequence[int], num_devices: int) -> tuple[int, ...]:
    if len(devices) == 0:
        raise ValueError(f"{role}.device_mapping is empty; give at least one device index")
    seen: set[int] = set()
    for d in devices:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise ValueError(f"{role}.device_mapping has {d!r}; device indices are ints >= 0")
        if d >= num_devices:
            raise ValueError(
                f"{role}.device_mapping uses device {d} but only {num_devices} device(s) are "
                f"declared (num_nodes x num_gpus_per_node); valid indices are 0..{num_devices - 1}"
            )
        if d in seen:
            raise ValueError(f"{role}.device_mapping lists device {d} twice")
        seen.add(d)
    return tuple(devices)


def plan_placement(
    device_mappings: Mapping[str, Sequence[int]],
    *,
    num_devices: int,
    device_kind: str = "cpu",
    resource_name: str | None = None,
    devices_per_worker: Mapping[str, int] | None = None,
    cpu_per_bundle: float = DEFAULT_CPU_PER_BUNDLE,
) -> PlacementPlan:
    """Validate device maps and place every role.

    `device_mappings`: role -> device indices (global: node * num_gpus_per_node + local).
    On CPU the indices are virtual devices (each bundle reserves `cpu_per_bundle` CPUs).
    Raises ValueError naming the role for an index out of range, a duplicate, or a device count
    not divisible by the role's `devices_per_worker`.
    """
    if num_devices <= 0:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    per_worker = dict(devices_per_worker or {})
    checked = {
        role: _check_devices(role, devs, num_devices) for role, devs in device_mappings.items()
    }
    for role, devs in checked.items():
        dpw = per_worker.get(role, 1)
        if dpw < 1 or len(devs) % dpw:
            raise ValueError(
                f"{role}: {len(devs)} device(s) in device_mapping are not divisible by "
                f"num_gpus_per_worker={dpw}"
            )
    # colocation groups: connected components of "device sets overlap"
    roles = list(checked)
    parent = {r: r for r in roles}

    def find(r: str) -> str:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for i, a in enumerate(roles):
        for b in roles[i + 1 :]:
            if set(checked[a]) & set(checked[b]):
                parent[find(a)] = find(b)
    components: dict[str, list[str]] = {}
    for r in roles:
        components.setdefault(find(r), []).append(r)

    plan = PlacementPlan(
        device_kind=device_kind,
        resource_name=resource_name,
        num_devices=num_devices,
        roles={},
        cpu_per_bundle=cpu_per_bundle,
    )
    for group_index, members in enumerate(components.values()):
        union = sorted({d for r in members for d in checked[r]})
        multi = [r for r in members if per_worker.get(r, 1) > 1]
        if multi and len(members) > 1:
            raise ValueError(
                f"roles {multi} use num_gpus_per_worker > 1 while sharing devices with "
                f"{[r for r in members if r not in multi]}; colocated roles must use one "
                f"device per worker"
            )
        if multi:
            dpw = per_worker[multi[0]]
            devs = checked[multi[0]]
            slots = tuple(tuple(devs[i : i + dpw]) for i in range(0, len(devs), dpw))
        else:
            slots = tuple((d,) for d in union)
        slot_of = {slot[0]: i for i, slot in enumerate(slots)}
        share = {d: sum(d in checked[r] for r in members) for d in union}
        plan.groups.append((tuple(members), slots))
        for role in members:
            dpw = per_worker.get(role, 1)
            devs = checked[role]
            workers = []
            for rank, start in enumerate(range(0, len(devs), dpw)):
                wdevs = tuple(devs[start : start + dpw])
                k = max(share[d] for d in wdevs)
                workers.append(
                    WorkerSlot(
                        rank=rank,
                        devices=wdevs,
                        bundle_index=slot_of[wdevs[0]],
                        device_fraction=1.0 / k,
                        cpus=cpu_per_bundle / k,
                    )
                )
            plan.roles[role] = RolePlacement(
                role=role,
                devices=devs,
                devices_per_worker=dpw,
                colocation_group=group_index,
                colocated_with=tuple(r for r in members if r != role),
                workers=tuple(workers),
            )
    return plan
