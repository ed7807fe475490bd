"""Workspace-wide pytest hooks (every package's tests and tests/ run under this file).

``RL_REQUIRE_VLLM=1`` (set by CI's vLLM step): a test marked ``vllm`` that is skipped (``import
vllm`` fails, an ``importorskip`` in a fixture) fails instead, and a session in which no ``vllm``
test passes fails too. Without it a broken ``import vllm`` turned the whole step green.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_VLLM_ENV = "RL_REQUIRE_VLLM"


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
        if report.skipped and item.get_closest_marker("vllm"):
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


def pytest_configure(config: pytest.Config) -> None:
    if _vllm_required():
        config.pluginmanager.register(VllmRequired(), "rl-vllm-required")
