"""``rl-doctor``: checks this host (device, versions, Ascend settings) and, with ``--config FILE``,
whether the config's placement fits the devices found. Reads, never changes; exit 1 on an error.

    uv run rl-doctor                      # the host
    uv run rl-doctor --config apps/agentic/configs/cpu_default.yaml

The host checks are :mod:`rl_sync.doctor`'s; this module adds the config's: its device count
(``num_gpus_per_node`` x ``num_nodes``) against the devices this process sees, A3's two dies per
card, and the vLLM rollout settings that matter on Ascend (NZ, prefix caching, sleep mode).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_sync.doctor import Finding, HostFacts, collect_facts, diagnose, exit_code, report

__all__ = ["check_config", "main"]


def _load(path: Path) -> Any:
    """The validated experiment of an app's YAML (its own ``*_app`` section set aside)."""
    from rl_config.loading import load_app_config, load_yaml_dict

    sections = [k for k in load_yaml_dict(path) if str(k).endswith("_app")]
    cfg, _ = load_app_config(path, section=sections[0] if sections else None)
    return cfg


def check_config(cfg: Any, facts: HostFacts) -> list[Finding]:
    """A validated experiment against the host: devices, placement, the rollout's vLLM settings."""
    out: list[Finding] = []
    per_node, nodes = int(cfg.num_gpus_per_node), int(cfg.num_nodes)
    mappings = {
        role: list(worker.device_mapping)
        for role, worker in cfg.workers().items()
        if worker is not None and worker.device_mapping
    }
    if facts.device_kind == "cpu":
        out.append(Finding("info", "placement", f"CPU host: the {len(mappings)} role(s) with a device_mapping run as CPU workers (one bundle per listed device)"))  # fmt: skip
    elif per_node > facts.device_count:
        out.append(Finding("error", "placement", f"num_gpus_per_node={per_node}, but this process sees {facts.device_count} {facts.device_kind} device(s)",
                           f"set num_gpus_per_node: {facts.device_count} and device_mapping within 0..{facts.device_count - 1}, or check {('ASCEND_RT_VISIBLE_DEVICES' if facts.device_kind == 'npu' else 'CUDA_VISIBLE_DEVICES')}"))  # fmt: skip
    smi = facts.npu_smi
    if (
        facts.device_kind == "npu"
        and smi is not None
        and smi.chips_per_card > 1
        and per_node == smi.cards < facts.device_count
    ):
        out.append(Finding("warn", "A3", f"num_gpus_per_node={per_node} is the card count; this A3 host has {facts.device_count} devices ({smi.chips_per_card} dies per card)",
                           f"num_gpus_per_node: {facts.device_count} to use every die"))  # fmt: skip
    highest = max((d for devices in mappings.values() for d in devices), default=-1)
    if highest >= per_node * nodes:
        out.append(Finding("error", "placement", f"a device_mapping lists device {highest}; num_gpus_per_node x num_nodes = {per_node * nodes}",
                           "raise num_gpus_per_node / num_nodes or lower the device indices"))  # fmt: skip
    infer = cfg.actor_infer
    strategy = infer.strategy_args if infer is not None else None
    if strategy is not None and strategy.strategy_name == "vllm":
        out += _vllm_settings(dict(strategy.strategy_config or {}), facts)
    if not any(f.level == "error" for f in out):
        out.append(Finding("ok", "placement", f"{len(mappings)} role(s) on {per_node * nodes} device(s): " + ", ".join(f"{r} {d}" for r, d in mappings.items())))  # fmt: skip
    return out


def _vllm_settings(strategy_config: Mapping[str, Any], facts: HostFacts) -> list[Finding]:
    ascend = facts.device_kind == "npu" or bool(facts.versions.get("vllm-ascend"))
    if not ascend:
        return []
    out: list[Finding] = []
    extra = strategy_config.get("additional_config") or {}
    nz = extra.get("weight_nz_mode") if isinstance(extra, Mapping) else None
    if nz not in (None, 0):
        out.append(Finding("error", "weight_nz_mode", f"actor_infer strategy_config additional_config.weight_nz_mode={nz}: NZ weights break in-place RL weight updates",
                           "set additional_config.weight_nz_mode: 0 (or leave it out)"))  # fmt: skip
    if strategy_config.get("enable_prefix_caching", True):
        out.append(Finding("info", "enable_prefix_caching", "on: the engine resets it after every weight update; ROLL's Ascend guide turns it off",
                           "actor_infer.strategy_args.strategy_config.enable_prefix_caching: false"))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rl-doctor",
        description="Check this host's device, versions and Ascend settings (and a config's "
        "placement) against known-good combinations. Reads, never changes; exit 1 on an error.",
    )
    parser.add_argument("--config", type=Path, help="an experiment / app YAML to check here")
    args = parser.parse_args(argv)
    facts = collect_facts()
    findings = diagnose(facts)
    if args.config is not None:
        from rl_config.errors import ConfigError

        try:
            findings += check_config(_load(args.config), facts)
        except (ConfigError, ValueError, OSError) as exc:
            findings.append(Finding("error", "config", f"{args.config}: {exc}", "fix the config (uv run <app> --config FILE --dry-run names the key)"))  # fmt: skip
    print(report(facts, findings))
    print(f"\nchecked on this host: {facts.device_kind} x {facts.device_count}; "
          f"{sum(f.level == 'error' for f in findings)} error(s), {sum(f.level == 'warn' for f in findings)} warning(s)")  # fmt: skip
    return exit_code(findings)


if __name__ == "__main__":
    sys.exit(main())
