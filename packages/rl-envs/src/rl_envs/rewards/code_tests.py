"""Code reward: run the response's program against the row's unit tests, INSIDE the sandbox.

Offers: ``parse_test_cases(test_cases, case_type, ground_truth) -> list[dict]`` (trusted, in the
caller: validates a row's tests) and ``code_sandbox_score`` (verl signature plus the tests; runs
only as a sandbox call, ``SandboxPool.call("rl_envs.rewards.code_tests:code_sandbox_score",
...)``). Test formats:

* ROLL ``test_cases`` (a list or its JSON string) with ``case_type`` ``assert``/``pytest``:
  ``{"assert_code": "assert f(1) == 2"}`` (``def test_*`` functions in it are called too);
  with ``case_type`` ``input``/``stdin``: ``{"stdin": "...", "expected_stdout": "..."}``.
* verl/PRIME ``ground_truth`` ``{"inputs": [...], "outputs": [...]}`` (a dict or its JSON
  string): stdin/stdout pairs.

The program is the last fenced code block of the response (```python ...``` preferred). Each
test runs the program in its own candidate process (``rl_envs.rewards.candidate``) with its own
deadline: a test that hangs fails and the next one runs. Candidates are forked by the call's
spawner (``rl_envs.sandbox.spawner``), which was forked before the call received its arguments,
so no candidate holds the expected outputs or the asserts, and none can read this process's
memory. A stdin/stdout test gets the program's output back as text and compares it here; an
assert test runs its asserts here, over proxies whose calls run the program's functions in the
candidate and bring the results back as data (a lying ``__eq__`` stays in the candidate). A
program that exits, raises ``SystemExit`` or stops answering before its asserts ran fails.
Arguments a test passes are copies: in-place changes of list, dict and set arguments come back;
objects the program returns (not data) stay handles that equal only themselves. Score: the
fraction of tests passed (a response with no code block: 0.0, ``no_code`` True).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from typing import Any

from rl_envs.rewards.candidate import Handle, Remote, candidate_main
from rl_envs.sandbox import spawner
from rl_envs.sandbox.protocol import write_frame

ASSERT_TYPES = ("assert", "pytest")
IO_TYPES = ("input", "stdin")
MAX_TESTS = 256
_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def _load_json(value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{what} is not valid JSON: {exc}") from None
        except RecursionError:
            raise ValueError(f"{what} is not valid JSON: nested too deeply") from None
    return value


def _text(case: dict[str, Any], key: str, i: int) -> str:
    value = case.get(key)
    if not isinstance(value, str):
        raise ValueError(f"test {i}: {key!r} must be a string, got {type(value).__name__}")
    return value


def _io_from_truth(ground_truth: Any) -> list[dict[str, str]]:
    truth = _load_json(ground_truth, "ground_truth")
    if not isinstance(truth, dict) or "inputs" not in truth or "outputs" not in truth:
        raise ValueError("no tests: test_cases is empty and ground_truth has no inputs/outputs")
    inputs, outputs = truth["inputs"], truth["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ValueError("ground_truth inputs/outputs must be lists of the same length")
    cases = [{"stdin": i, "expected_stdout": o} for i, o in zip(inputs, outputs)]
    return [
        {"stdin": _text(c, "stdin", i), "expected_stdout": _text(c, "expected_stdout", i)}
        for i, c in enumerate(cases)
    ]


def parse_test_cases(
    test_cases: Any, case_type: Any = None, ground_truth: Any = None
) -> list[dict[str, str]]:
    """The row's tests as ``[{"assert_code"}]`` or ``[{"stdin", "expected_stdout"}]``;
    ``ValueError`` naming what is wrong (no tests, wrong types, unknown ``case_type``)."""
    if test_cases is None or (isinstance(test_cases, str) and not test_cases.strip()):
        return _io_from_truth(ground_truth)
    cases = _load_json(test_cases, "test_cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"test_cases must be a non-empty list, got {type(cases).__name__}")
    if len(cases) > MAX_TESTS:
        raise ValueError(f"{len(cases)} tests; at most {MAX_TESTS}")
    kind = (case_type or "").strip().lower() if isinstance(case_type, str | None) else None
    if kind is None or kind not in ("", *ASSERT_TYPES, *IO_TYPES):
        raise ValueError(
            f"case_type {case_type!r} is not supported (use one of {ASSERT_TYPES + IO_TYPES})"
        )
    out: list[dict[str, str]] = []
    for i, case in enumerate(cases):
        if isinstance(case, str) and kind in ("", *ASSERT_TYPES):
            out.append({"assert_code": case})
            continue
        if not isinstance(case, dict):
            raise ValueError(f"test {i}: wrong type {type(case).__name__}, expected an object")
        if "assert_code" in case and kind not in IO_TYPES:
            out.append({"assert_code": _text(case, "assert_code", i)})
        elif "stdin" in case and kind not in ASSERT_TYPES:
            expected = "expected_stdout" if "expected_stdout" in case else "output"
            out.append(
                {"stdin": _text(case, "stdin", i), "expected_stdout": _text(case, expected, i)}
            )
        else:
            raise ValueError(f"test {i}: needs assert_code or stdin/expected_stdout")
    return out


def extract_code(response: str) -> str | None:
    """The last ```python block of the response, else its last fenced block, else None."""
    blocks = _FENCE.findall(response)
    if not blocks:
        return None
    python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    return (python or [code for _, code in blocks])[-1]


def _same_output(got: str, want: str) -> bool:
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip().splitlines()]

    return lines(got) == lines(want)


def _run_asserts(remote: Remote, assert_code: str) -> None:
    """The test's asserts and ``test_*`` functions, run HERE over proxies of what the program
    defined (its functions run in the candidate process; results come back as data)."""
    namespace: dict[str, Any] = {"__name__": "tests", **remote.namespace()}
    exec(compile(assert_code, "tests.py", "exec", dont_inherit=True), namespace)  # noqa: S102
    for name, fn in list(namespace.items()):
        if name.startswith("test_") and callable(fn) and not isinstance(fn, Handle):
            fn()


def _run_one(program: str, case: dict[str, str], timeout_s: float) -> tuple[bool, bool]:
    """``(passed, timed_out)`` of one test: the program runs in a candidate process from the
    call's spawner (it never holds the expected output nor the asserts); this process judges
    what crosses the pipes."""
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    try:
        pid = spawner.current().spawn([request_r, reply_w])
    finally:
        os.close(request_r)
        os.close(reply_w)
    io_test = "stdin" in case
    remote = Remote(request_w, reply_r, time.monotonic() + timeout_s)
    try:
        write_frame(request_w, {"mode": "io" if io_test else "assert", "program": program,
                                "stdin": case.get("stdin")})  # fmt: skip
        if io_test:
            return _same_output(str(remote.receive().get("stdout")), case["expected_stdout"]), False
        _run_asserts(remote, case["assert_code"])
        return not remote.failed, remote.failed == "timeout"
    except Exception:
        return False, remote.failed == "timeout"
    finally:
        os.close(request_w)
        os.close(reply_r)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@spawner.forks_candidates(candidate_main)
def code_sandbox_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    test_cases: Any = None,
    case_type: Any = None,
    per_test_timeout_s: float = 2.0,
) -> dict[str, Any]:
    """Fraction of the tests the response's program passes (runs only inside the sandbox)."""
    tests = parse_test_cases(test_cases, case_type, ground_truth)
    program = extract_code(solution_str)
    if program is None:
        return {"score": 0.0, "passed": 0, "total": len(tests), "test_timeouts": 0, "no_code": True}
    passed = timeouts = 0
    for case in tests:
        ok, timed_out = _run_one(program, case, per_test_timeout_s)
        passed += ok
        timeouts += timed_out
    return {
        "score": passed / len(tests),
        "passed": passed,
        "total": len(tests),
        "test_timeouts": timeouts,
        "no_code": False,
    }
