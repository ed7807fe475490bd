"""`xdist_group` marks group for real under `--dist loadgroup` (the workspace's pytest settings):
tests that start Ray, process groups or engines are marked so that parallel workers run each
group's tests one after another, on one worker. pytest 9.2 with pytest-xdist 3.8 ignored the
marks without a word (every grouped test ran wherever it fell); this test fails if that returns."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import time

import pytest


@pytest.mark.xdist_group("g")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    time.sleep(0.2)


@pytest.mark.parametrize("i", range(4))
def test_free(i):
    time.sleep(0.2)
"""


def test_marked_tests_run_as_one_group_on_one_worker(tmp_path: Path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the workspace's settings
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "--rootdir",
         str(tmp_path), "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v",
         str(tmp_path / "test_grouped.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", proc.stdout)
    grouped = {node: worker for worker, node in ran if "test_grouped[" in node}
    assert len(grouped) == 4 and len(ran) == 8, proc.stdout
    # the group's name joins each node id (how xdist's scheduler groups), and one worker ran them
    assert all(node.endswith("@g") for node in grouped), sorted(grouped)
    assert len(set(grouped.values())) == 1, grouped
