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
test runs in a process forked inside the sandbox call, with its own deadline: a test that hangs
fails and the next one runs. That process closes every descriptor but its two report pipes, runs
the program as ``__main__``, then the test's asserts in its namespace, and only then asks the
call for a random nonce and reports it: a test passes only if the report carries its nonce (and,
for stdin tests, the expected output). A program that exits before its asserts ran
(``sys.exit``, ``SystemExit`` of any code, ``os._exit``) or writes a report of its own fails.
Out of reach of any in-process runner: a program that imitates this harness's protocol or
patches the interpreter, and results whose ``__eq__`` lies. Score: the fraction of tests passed
(a response with no code block: 0.0, ``no_code`` True).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import select
import signal
import sys
import time
import types
from typing import Any

ASSERT_TYPES = ("assert", "pytest")
IO_TYPES = ("input", "stdin")
MAX_TESTS = 256
OUTPUT_LIMIT = 1 << 20
NONCE_BYTES = 16
READY = b"R"  # the child's request for the nonce, after its tests ran
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


def _close_fds_except(*keep: int) -> None:
    """Close every descriptor from 3 up but ``keep`` (the call's JSON result pipe among them:
    the program must not be able to write the call's result)."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _exec(source: str, filename: str, namespace: dict[str, Any]) -> None:
    """Run untrusted ``source`` in ``namespace`` (only ever in a sandboxed test process)."""
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # noqa: S102


def _run_case(program: str, case: dict[str, str]) -> None:
    """Run the program as ``__main__``, then (assert tests) the test code and its ``test_*``
    functions in the program's namespace. Returns only if all of it ran; raises otherwise. A
    ``SystemExit`` ends an stdin/stdout program (code 0 or None: its output is judged) but fails
    an assert test, whose asserts have not run."""
    path = os.path.join(os.getcwd(), f"solution_{os.getpid()}.py")
    with open(path, "w") as handle:
        handle.write(program)
    module = types.ModuleType("__main__")
    module.__file__ = path
    sys.modules["__main__"] = module
    sys.argv = [path]
    if "stdin" in case:
        try:
            _exec(program, path, module.__dict__)
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        return
    _exec(program, path, module.__dict__)
    _exec(case["assert_code"], "tests.py", module.__dict__)
    for name, fn in list(module.__dict__.items()):
        if name.startswith("test_") and callable(fn):
            fn()


def _child(program: str, case: dict[str, str], report_fd: int, nonce_fd: int) -> None:
    """Forked test process: run the test, then report it passed (never returns).

    The report is ``READY``, then the nonce the parent creates and sends only when the report's
    first bytes arrive (it did not exist while the program ran), then the captured stdout. An
    exit of any kind before that, a ``SystemExit`` included, leaves no report: the test
    fails."""
    write, read, exit_now = os.write, os.read, os._exit  # bound before the program can patch os
    status = 1
    captured = io.StringIO()
    try:
        _close_fds_except(report_fd, nonce_fd)
        os.setpgid(0, 0)
        sys.stdin = io.StringIO(case.get("stdin", ""))
        with contextlib.redirect_stdout(captured):
            _run_case(program, case)
        write(report_fd, READY)
        nonce = read(nonce_fd, NONCE_BYTES)
        write(report_fd, nonce + captured.getvalue()[:OUTPUT_LIMIT].encode(errors="replace"))
        status = 0
    except BaseException:
        status = 1
    finally:
        exit_now(status)


def _collect(report_fd: int, nonce_fd: int, deadline: float) -> tuple[bytes, bytes, bool]:
    """``(report, nonce, timed_out)``: read the child's report until EOF, sending a fresh nonce
    once its first bytes arrive."""
    chunks: list[bytes] = []
    nonce = b""
    while True:
        wait = deadline - time.monotonic()
        if wait <= 0:
            return b"".join(chunks), nonce, True
        ready, _, _ = select.select([report_fd], [], [], wait)
        if not ready:
            continue
        chunk = os.read(report_fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), nonce, False
        if sum(map(len, chunks)) < OUTPUT_LIMIT:
            chunks.append(chunk)
        if not nonce:
            nonce = os.urandom(NONCE_BYTES)
            with contextlib.suppress(OSError):  # the child may be gone already
                os.write(nonce_fd, nonce)


def _run_one(program: str, case: dict[str, str], timeout_s: float) -> tuple[bool, bool]:
    """``(passed, timed_out)`` of one test in a forked process: passed only when the child's
    report carries this test's nonce (and, for stdin tests, the expected output)."""
    report_r, report_w = os.pipe()
    nonce_r, nonce_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _child(program, case, report_w, nonce_r)
    os.close(report_w)
    os.close(nonce_r)
    try:
        report, nonce, timed_out = _collect(report_r, nonce_w, time.monotonic() + timeout_s)
    finally:
        os.close(report_r)
        os.close(nonce_w)
    if timed_out:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    marker = READY + nonce
    if timed_out or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return False, timed_out
    if not nonce or not report.startswith(marker):
        return False, False
    if "stdin" in case:
        output = report[len(marker) :].decode(errors="replace")
        return _same_output(output, case["expected_stdout"]), False
    return True, False


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
