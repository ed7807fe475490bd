"""Placement planning: which worker of which role runs on which device, and who shares devices.

`plan_placement` is pure (no Ray): it validates every role's `device_mapping` against the devices
the cluster declares, splits each role into workers of `num_gpus_per_worker` devices, and finds
colocation groups (roles whose device maps overlap; they take turns on the device: sleep/wake and
offload between phases). `PlacementPlan.bundles()` gives the Ray placement-group bundles for each
colocation group; `rl_runtime.cluster.worker_group` turns them into placement groups and actors.

Node pinning: device ids count across nodes (node n owns ids n*devices_per_node ..). With
`node_resources` (one Ray custom resource name per node, the config key of the same name) every
bundle also asks for `NODE_RESOURCE_SHARE` of its node's resource, so Ray reserves it only on a node
started with that resource (`ray start --resources '{"<name>": 1}'`): device_mapping then pins
roles to nodes, e.g. training on one and rollout on another.

Mixed colocation (ROLL's usual layout: a vLLM engine of tensor_parallel_size 2 on the devices of
1-device training workers): the group gets one bundle per device; a worker of several devices is
pinned to the bundle of its first device with a fractional share (Ray cannot give one actor
resources of two bundles), so the bundles of its other devices are reserved by the group but not
asked for. Ray's own per-actor device assignment then no longer says which devices a worker uses,
so such a plan sets `sets_visible_devices` and every worker of the plan (all groups, so Ray's
choices cannot collide with the explicit ones) gets the device-visibility env var listing its
devices' node-local ids (`worker_device_env`), with Ray's override of that variable turned off.
On several nodes, pin bundles with `node_resources` so that each bundle (and each worker's
devices) is reserved on the node its device ids name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: CPU reserved per device bundle when roles run on accelerators.
DEFAULT_CPU_PER_BUNDLE = 1.0
#: Amount of its node's custom resource one bundle asks for (a node advertising 1 holds 1000).
NODE_RESOURCE_SHARE = 0.001


@dataclass(frozen=True)
class WorkerSlot:
    """One worker of a role: its rank, the devices it uses and the bundle that holds them."""

    rank: int
    devices: tuple[int, ...]
    bundle_index: int
    #: share of each device this worker asks Ray for (1/k when k roles share the device)
    device_fraction: float
    cpus: float
    #: amount of the device resource asked from its bundle: the fraction times the number of
    #: its devices that bundle holds (a multi-device worker in a mixed colocation group asks
    #: only for its first device's share)
    device_request: float
    #: node-local ids of its devices (device id % devices_per_node), for the visibility env var
    visible_devices: tuple[int, ...]


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
    #: devices per node (device id // devices_per_node = node index); None: one node
    devices_per_node: int | None = None
    #: Ray custom resource marking each node (index = node); None: no node pinning
    node_resources: tuple[str, ...] | None = None
    #: workers get the device-visibility env var from the plan instead of Ray's assignment
    #: (set when a colocation group mixes devices-per-worker; see module docstring)
    sets_visible_devices: bool = False

    def node_of(self, device: int) -> int:
        """The node index that owns a global device id."""
        return device // self.devices_per_node if self.devices_per_node else 0

    def local_device(self, device: int) -> int:
        """The node-local index of a global device id."""
        return device % self.devices_per_node if self.devices_per_node else device

    def bundles(self, group_index: int) -> list[dict[str, float]]:
        """Ray placement-group bundles of one colocation group: one per device slot (pinned to
        the slot's node when `node_resources` is set)."""
        _roles, slots = self.groups[group_index]
        out = []
        for slot in slots:
            bundle = {"CPU": self.cpu_per_bundle}
            if self.resource_name is not None:
                bundle[self.resource_name] = float(len(slot))
            if self.node_resources is not None:
                bundle[self.node_resources[self.node_of(slot[0])]] = NODE_RESOURCE_SHARE
            out.append(bundle)
        return out

    def resource_totals(self) -> dict[str, float]:
        """What the plan's placement groups reserve together, per Ray resource."""
        totals: dict[str, float] = {}
        for index in range(len(self.groups)):
            for bundle in self.bundles(index):
                for key, amount in bundle.items():
                    totals[key] = totals.get(key, 0.0) + amount
        return totals

    def shortfall(self, available: Mapping[str, float]) -> list[str]:
        """One line per resource the plan reserves beyond ``available`` (the totals of a cluster
        that nothing will join: Ray would wait for them until the placement timeout)."""
        bundles = sum(len(slots) for _roles, slots in self.groups)
        lines = []
        for key, need in self.resource_totals().items():
            have = float(available.get(key, 0.0))
            if need > have + 1e-9:
                why = (
                    f" ({bundles} device bundle(s) x cpu_per_bundle {self.cpu_per_bundle:g})"
                    if key == "CPU"
                    else ""
                )
                lines.append(f"{key}: the placement needs {need:g}{why}, the cluster has {have:g}")
        return lines

    def describe(self) -> str:
        """A human-readable table of roles, workers and devices."""
        lines = [
            f"devices: {self.num_devices} x {self.device_kind}"
            + (f" (Ray resource {self.resource_name})" if self.resource_name else "")
        ]
        for role, rp in self.roles.items():
            coloc = f", colocated with {', '.join(rp.colocated_with)}" if rp.colocated_with else ""
            nodes = ""
            if self.node_resources is not None:
                names = sorted({self.node_resources[self.node_of(d)] for d in rp.devices})
                nodes = f" nodes={names}"
            lines.append(
                f"  {role:<12} workers={rp.num_workers} devices={list(rp.devices)} "
                f"per_worker={rp.devices_per_worker}{nodes}{coloc}"
            )
        if self.sets_visible_devices:
            lines.append(
                "  (colocated roles mix devices per worker: each worker is pinned to its first "
                "device's bundle and sees its devices through the visibility env var)"
            )
        return "\n".join(lines)


def worker_device_env(plan: PlacementPlan, slot: WorkerSlot) -> dict[str, str]:
    """Env vars that make one worker see exactly its devices: ``{CUDA_VISIBLE_DEVICES: "2,3",
    RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: "1"}`` (ASCEND_RT_VISIBLE_DEVICES on NPU) when the
    plan `sets_visible_devices`; empty otherwise and on CPU (no such variable)."""
    from rl_sync.device import visible_devices_env_var

    var = visible_devices_env_var(plan.device_kind)  # type: ignore[arg-type]
    if not plan.sets_visible_devices or var is None:
        return {}
    return {
        var: ",".join(str(d) for d in slot.visible_devices),
        f"RAY_EXPERIMENTAL_NOSET_{var}": "1",
    }


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


def _check_worker_nodes(
    plan: PlacementPlan, role: str, devices: Sequence[int], per_worker: int
) -> None:
    """Every worker's devices on one node, else a ValueError naming the role."""
    for start in range(0, len(devices), per_worker):
        wdevs = list(devices[start : start + per_worker])
        if len({plan.node_of(d) for d in wdevs}) > 1:
            raise ValueError(
                f"{role}: one worker's devices {wdevs} span nodes (devices_per_node="
                f"{plan.devices_per_node}); a worker must sit on one node: list its "
                f"num_gpus_per_worker devices consecutively within one node in device_mapping"
            )


def plan_placement(
    device_mappings: Mapping[str, Sequence[int]],
    *,
    num_devices: int,
    device_kind: str = "cpu",
    resource_name: str | None = None,
    devices_per_worker: Mapping[str, int] | None = None,
    cpu_per_bundle: float = DEFAULT_CPU_PER_BUNDLE,
    devices_per_node: int | None = None,
    node_resources: Sequence[str] | None = None,
) -> PlacementPlan:
    """Validate device maps and place every role.

    `device_mappings`: role -> device indices (global: node * devices_per_node + local).
    On CPU the indices are virtual devices (each bundle reserves `cpu_per_bundle` CPUs).
    `node_resources`: one Ray custom resource name per node (needs `devices_per_node`); pins
    each device's bundle to its node (see module docstring).
    Roles whose devices overlap share them (a colocation group); they may use different
    `devices_per_worker` (see the module docstring for how that is reserved).
    Raises ValueError naming the role for an index out of range, a duplicate, a device count
    not divisible by the role's `devices_per_worker`, or a worker whose devices span nodes.
    """
    if num_devices <= 0:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    if node_resources is not None:
        if not devices_per_node or num_devices % devices_per_node:
            raise ValueError(
                f"node_resources needs devices_per_node dividing num_devices={num_devices}, "
                f"got {devices_per_node}"
            )
        if len(node_resources) != num_devices // devices_per_node:
            raise ValueError(
                f"node_resources has {len(node_resources)} name(s) for "
                f"{num_devices // devices_per_node} node(s); give one per node"
            )
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
        devices_per_node=devices_per_node,
        node_resources=tuple(node_resources) if node_resources is not None else None,
    )
    for group_index, members in enumerate(components.values()):
        union = sorted({d for r in members for d in checked[r]})
        multi = [r for r in members if per_worker.get(r, 1) > 1]
        for role in members:
            _check_worker_nodes(plan, role, checked[role], per_worker.get(role, 1))
        if multi and len(members) == 1:  # a lone multi-device role: one bundle per worker
            dpw = per_worker[multi[0]]
            devs = checked[multi[0]]
            slots = tuple(tuple(devs[i : i + dpw]) for i in range(0, len(devs), dpw))
        else:  # one bundle per device (mixed colocation pins a worker to its first device's)
            slots = tuple((d,) for d in union)
            if multi:
                plan.sets_visible_devices = True
        slot_of = {d: i for i, slot in enumerate(slots) for d in slot}
        share = {d: sum(d in checked[r] for r in members) for d in union}
        plan.groups.append((tuple(members), slots))
        for role in members:
            dpw = per_worker.get(role, 1)
            devs = checked[role]
            workers = []
            for rank, start in enumerate(range(0, len(devs), dpw)):
                wdevs = tuple(devs[start : start + dpw])
                k = max(share[d] for d in wdevs)
                bundle = slot_of[wdevs[0]]
                held = sum(d in slots[bundle] for d in wdevs)
                workers.append(
                    WorkerSlot(
                        rank=rank,
                        devices=wdevs,
                        bundle_index=bundle,
                        device_fraction=1.0 / k,
                        cpus=cpu_per_bundle / k,
                        device_request=held / k,
                        visible_devices=tuple(plan.local_device(d) for d in wdevs),
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
