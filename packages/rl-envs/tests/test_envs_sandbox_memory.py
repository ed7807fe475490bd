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


# ----- graders never share an address space with the code they grade (code_sandbox) -----------
CODE_TARGET = "rl_envs.rewards.code_tests:code_sandbox_score"
IO_TESTS = {"test_cases": [{"stdin": "2\n", "expected_stdout": "SECRET-OUTPUT-4\n"}],
            "case_type": "stdin"}  # fmt: skip
ASSERT_TESTS = {"test_cases": [{"assert_code": "assert f(2) == 'SECRET-VALUE'"}],
                "case_type": "assert"}  # fmt: skip
WALK_FRAMES = """
import gc, sys
for obj in gc.get_objects():  # any dict of the harness holding the test
    if isinstance(obj, dict) and "expected_stdout" in obj:
        print(obj["expected_stdout"], end="")
        break
    if isinstance(obj, dict) and "assert_code" in obj:
        obj["assert_code"] = "pass"
frame = sys._getframe()
while frame is not None:  # the caller's frames: its locals hold the test
    for value in list(frame.f_locals.values()):
        if isinstance(value, dict) and "assert_code" in value:
            value["assert_code"] = "pass"
        if isinstance(value, dict) and "expected_stdout" in value:
            print(value["expected_stdout"], end="")
            frame = None
            break
    if frame is None:
        break
    frame = frame.f_back
def f(x):
    return "wrong"
"""
LYING_EQ = """
class Anything:
    def __eq__(self, other):
        return True
def f(x):
    return Anything()
"""


def _score(pool, program: str, tests: dict) -> float:
    result = pool.call(CODE_TARGET, "code", f"```python\n{program}```", None, {}, **tests)
    assert result.ok, result
    return result.value["score"]


@pytest.mark.parametrize("tests", [IO_TESTS, ASSERT_TESTS], ids=["stdin", "assert"])
def test_a_program_cannot_grade_itself_through_the_harness(math_pool, tests):
    """It walks the interpreter's objects and its caller's frames for the test (prints the
    expected output, replaces the asserts with ``pass``): the test lives in another process."""
    assert _score(math_pool, WALK_FRAMES, tests) == 0.0


def test_a_result_whose_eq_lies_does_not_pass(math_pool):
    assert _score(math_pool, LYING_EQ, ASSERT_TESTS) == 0.0


def test_a_program_cannot_find_the_expected_values_in_its_memory(math_pool):
    marker = "EXPECTED"
    tests = {"test_cases": [{"stdin": "", "expected_stdout": f"{marker}-{uuid.uuid4().hex}"}],
             "case_type": "stdin"}  # fmt: skip
    program = scan_code(marker).replace("print(sorted(found))", "print(min(found, default=''))")
    result = math_pool.call(CODE_TARGET, "code", f"```python\n{program}```", None, {}, **tests)
    assert result.ok and result.value["score"] == 0.0, result


def test_honest_programs_still_pass_through_the_proxies(math_pool):
    """Classes, in-place changes of arguments, exceptions the test expects, generators."""
    program = (
        "class Stack:\n"
        "    def __init__(self):\n        self.items = []\n"
        "    def push(self, x):\n        self.items.append(x)\n        return self\n"
        "    def __len__(self):\n        return len(self.items)\n"
        "def sort_in_place(xs):\n    xs.sort()\n"
        "def checked(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x * 1.5\n"
        "def evens(n):\n    yield from range(0, n, 2)\n"
        "LIMIT = (1, 2.5, {'a': {1, 2}})\n"
    )
    asserts = (
        "s = Stack()\nassert len(s.push(1).push(2)) == 2\nassert s.items == [1, 2]\n"
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]\n"
        "assert checked(2) == 3.0\n"
        "try:\n    checked(-1)\n    raise AssertionError('no error')\nexcept ValueError:\n    pass\n"
        "assert list(evens(7)) == [0, 2, 4, 6]\n"
        "assert LIMIT == (1, 2.5, {'a': {1, 2}})\n"
        "def test_more():\n    assert checked(0) == 0\n"
    )
    tests = {"test_cases": [{"assert_code": asserts}, {"assert_code": "assert checked(1) == 2"}],
             "case_type": "assert"}  # fmt: skip
    assert _score(math_pool, program, tests) == 0.5
