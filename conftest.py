"""Workspace-wide pytest hooks (every package's tests and tests/ run under this file).

``RL_REQUIRE_VLLM=1`` (set by CI's vLLM step): a test marked ``vllm`` that is skipped (``import
vllm`` fails, an ``importorskip`` in a fixture) fails instead, and a session in which no ``vllm``
test passes fails too. Without it a broken ``import vllm`` turned the whole step green.

``RL_TEST_DEADLINE=<unix seconds>`` (set by CI's heavy steps, which must end within CI's time
limit): a test that would start after that moment is skipped with a reason that says so, and the
session's last lines count them. A test already running is not stopped. Every test that ran still
passes or fails as usual, so a step cut short by its budget reports what it did run.
"""

from __future__ import annotations

import os
import time

import pytest

REQUIRE_VLLM_ENV = "RL_REQUIRE_VLLM"
DEADLINE_ENV = "RL_TEST_DEADLINE"
DEADLINE_SKIP = f"{DEADLINE_ENV}: the step's time budget ran out before this test started"


def _vllm_required() -> bool:
    value = os.environ.get(REQUIRE_VLLM_ENV, "")
    if value not in {"", "0", "1"}:
        raise pytest.UsageError(f"{REQUIRE_VLLM_ENV}={value!r}: expected 0 or 1")
    return value == "1"


class VllmRequired:
    """Turns skipped ``vllm`` tests into failures and fails a session where none passed."""

    def __init__(self) -> None:
        self.passed = 0

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        if report.skipped and item.get_closest_marker("vllm") and not _deadline_skip(report):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else longrepr
            report.outcome = "failed"
            report.longrepr = (
                f"{REQUIRE_VLLM_ENV}=1 but this vllm test was skipped ({report.when}): {reason}"
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Under xdist the controller sees every worker's reports here.
        if report.when == "call" and report.passed and "vllm" in report.keywords:
            self.passed += 1

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):  # an xdist worker: the controller decides
            return
        if self.passed == 0:
            session.config.get_terminal_writer().line(
                f"\n{REQUIRE_VLLM_ENV}=1 but no vllm test passed in this session", red=True
            )
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _deadline() -> float | None:
    value = os.environ.get(DEADLINE_ENV, "")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise pytest.UsageError(f"{DEADLINE_ENV}={value!r}: expected unix seconds") from None


def _deadline_skip(report: pytest.TestReport) -> bool:
    longrepr = report.longrepr
    return isinstance(longrepr, tuple) and DEADLINE_SKIP in str(longrepr[2])


class Deadline:
    """Skips the tests that would start after ``RL_TEST_DEADLINE`` and counts them at the end."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.skipped = 0

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if time.time() > self.deadline:
            pytest.skip(DEADLINE_SKIP)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and _deadline_skip(report):
            self.skipped += 1

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.skipped:
            terminalreporter.write_line(
                f"{DEADLINE_ENV}: {self.skipped} test(s) not run, the step's time budget ran out",
                yellow=True,
            )


def pytest_configure(config: pytest.Config) -> None:
    if _vllm_required():
        config.pluginmanager.register(VllmRequired(), "rl-vllm-required")
    deadline = _deadline()
    if deadline is not None:
        config.pluginmanager.register(Deadline(deadline), "rl-test-deadline")
