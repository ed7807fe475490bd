"""What this machine composes and plans for a config: its device kind (`machine_kwargs`),
`compose_here`, the placement the cluster will make, and the dry run's text (`plan_text`)."""

from __future__ import annotations

from typing import Any

from rl_runtime.compose import Components


def machine_kwargs() -> dict[str, Any]:
    """What composing needs to know about this machine: its device kind and whether flash-attn
    imports (`compose(cfg, **machine_kwargs())`)."""
    import importlib.util

    from rl_sync.device import detect_device_kind

    return {
        "device_kind": detect_device_kind(),
        "flash_attn_available": importlib.util.find_spec("flash_attn") is not None,
    }


def compose_here(
    cfg: Any, *, rollout_only: bool = False, pipeline: str | None = None
) -> Components:
    """`compose(cfg)` for this machine (`machine_kwargs`), for the app kind `pipeline`."""
    from rl_runtime.compose import compose

    return compose(cfg, rollout_only=rollout_only, pipeline=pipeline, **machine_kwargs())


def plan_text(components: Components) -> str:
    """What `--dry-run` prints: the device placement of every role, then the components."""
    from rl_runtime.compose import describe

    return placement_plan(components).describe() + "\n" + describe(components)


def placement_plan(components: Components, cpu_per_bundle: float = 1.0) -> Any:
    """The `rl_runtime.cluster.placement.PlacementPlan` the cluster will make on this machine's device
    kind (an impossible placement raises here)."""
    from rl_runtime.cluster.placement import plan_placement
    from rl_sync.device import detect_device_kind, ray_resource_name

    kind = detect_device_kind()
    return plan_placement(
        {r.role: list(r.device_mapping) for r in components.roles},
        num_devices=components.cluster.num_devices,
        device_kind=kind,
        resource_name=ray_resource_name(kind),
        devices_per_worker={r.role: r.devices_per_worker for r in components.roles},
        cpu_per_bundle=cpu_per_bundle,
        devices_per_node=components.cluster.devices_per_node,
        node_resources=components.cluster.node_resources,
    )
