"""Nothing of an earlier call is readable in a later one: each call is forked from a zygote that
never held a task (``rl_envs.sandbox.zygote``). The attack scans the call's own memory (which a
fork copies from its parent) for the arguments of earlier calls; the non-root mode makes the
same scan in ``sandbox_scenario.py``."""

from __future__ import annotations

import uuid

import pytest

from rl_envs.sandbox import SandboxLimits, SandboxPool

pytestmark = pytest.mark.xdist_group("dist")  # starts sandbox worker processes

#: run in a call: every readable mapping of its own memory, searched for a marker pattern
SCAN_MEMORY = r"""
import ctypes, re
found = set()
pattern = re.compile(rb"%s-[0-9a-f]{32}")
with open("/proc/self/maps") as handle:
    regions = handle.read().splitlines()
for line in regions:
    fields = line.split()
    if not fields[1].startswith("r") or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]", "[vvar_vclock]")):
        continue
    start, end = (int(x, 16) for x in fields[0].split("-"))
    if end - start > 1 << 30:
        continue
    try:
        data = ctypes.string_at(start, end - start)
    except Exception:
        continue
    found.update(m.decode() for m in pattern.findall(data))
print(sorted(found))
"""


def scan_code(marker: str) -> str:
    return SCAN_MEMORY % marker.encode().decode()


def test_a_call_cannot_read_earlier_calls_arguments():
    """A grader's call receives a ground truth; a tool call on the same worker then scans its
    memory for it (before the zygote the worker's freed frames were in every later fork)."""
    marker = f"TRUTH{uuid.uuid4().hex[:8]}"
    secrets = [f"{marker}-{uuid.uuid4().hex}" for _ in range(3)]
    with SandboxPool(1, limits=SandboxLimits(timeout_s=20, allow_weak_isolation=True)) as pool:
        for secret in secrets:  # a trusted grader, an untrusted source, a batch
            assert pool.call("json:dumps", {"ground_truth": secret}).ok
            assert pool.run_python(f"x = {secret!r}\n").ok
        assert all(r.ok for r in pool.call_each("json:dumps", [([s], {}) for s in secrets]))
        own = uuid.uuid4().hex  # the scan finds what this call holds itself
        code = f"own = {marker!r} + '-' + {own!r}\n" + scan_code(marker)
        result = pool.run_python(code, timeout_s=20)
    assert result.ok, result
    assert result.stdout == f"['{marker}-{own}']\n", result.stdout
