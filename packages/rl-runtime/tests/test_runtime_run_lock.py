"""One run per output directory: a second run on a live run's output or checkpoint directory
fails at once, naming the directory and the holder's pid, before it moves or writes anything
there; the lock goes with the holder (finished or killed). Two real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_fakes import FakeRecipe, _runner

from rl_runtime.run.run_lock import LOCK_NAME, RunDirectoryInUseError, run_directory_lock

# ------------------------------------------------------------ one run per output directory
# rl_runtime.run.run_lock, with two real processes: a second Runner on a directory a live run holds
# fails at once, naming the directory and the holder's pid, before it moves or writes anything
# there; the lock goes with the holder (finished or killed).
TESTS = Path(__file__).resolve().parent

# a Runner (runtime_fakes' recipe and workers) that holds at step 1 until told
HOLDING_RUN = """
import time
from pathlib import Path
from runtime_fakes import FakeRecipe, _runner

class Holding(FakeRecipe):
    def step(self, ctx):
        if ctx.step == 1:
            Path({started!r}).touch()
            while not Path({release!r}).exists():
                time.sleep(0.05)
        return super().step(ctx)

_runner(Path({root!r}), Holding(), **{extra!r}).run()
"""


def _start_holding_run(tmp_path: Path, **extra: object) -> tuple[subprocess.Popen[bytes], Path]:
    started, release = tmp_path / "started", tmp_path / "release"
    script = HOLDING_RUN.format(
        started=str(started),
        release=str(release),
        root=str(tmp_path),
        extra=extra,
    )
    # `python -c` imports from its working directory: this test module, as the child's
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, cwd=TESTS)
    deadline = time.monotonic() + 120
    while not started.exists():
        if child.poll() is not None:
            raise AssertionError(f"the holding run exited: {child.stderr.read().decode()}")  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the holding run did not reach step 1"
        time.sleep(0.1)
    return child, release


def test_a_second_run_on_a_live_runs_output_dir_fails_naming_it_and_the_pid(tmp_path):
    out = tmp_path / "out"
    child, release = _start_holding_run(tmp_path)
    try:
        config_before = (out / "resolved_config.yaml").read_bytes()
        with pytest.raises(RunDirectoryInUseError) as caught:
            _runner(tmp_path, FakeRecipe()).run()
        message = str(caught.value)
        assert str(out.resolve()) in message and f"pid {child.pid}" in message
        # refused before touching the directory: nothing moved aside, nothing rewritten
        assert not list(out.glob("previous-*"))
        assert (out / "resolved_config.yaml").read_bytes() == config_before
        release.touch()
        assert child.wait(timeout=120) == 0
    finally:
        child.kill()
        child.wait()
    assert (out / "summary.json").exists()  # the first run finished undisturbed
    _runner(tmp_path, FakeRecipe()).run()  # its lock went with it: the directory is free


def test_a_second_run_sharing_only_the_checkpoint_dir_fails_naming_it(tmp_path):
    """Different output dirs, one checkpoint_config.output_dir outside both: the second run is
    refused on the checkpoint directory before it writes a checkpoint there, and the first
    run's checkpoints are its own."""
    shared = {"checkpoint_config": {"output_dir": str(tmp_path / "shared_checkpoints")}}
    child, release = _start_holding_run(tmp_path, **shared)
    second = tmp_path / "second"
    try:
        with pytest.raises(RunDirectoryInUseError) as caught:
            _runner(second, FakeRecipe(), **shared).run()
        message = str(caught.value)
        assert str((tmp_path / "shared_checkpoints").resolve()) in message
        assert f"pid {child.pid}" in message
        assert not (second / "out" / "resolved_config.yaml").exists()  # refused before writing
        release.touch()
        assert child.wait(timeout=120) == 0
    finally:
        child.kill()
        child.wait()
    _runner(second, FakeRecipe(), **shared).run()  # both locks went with the first run
    assert (second / "out" / "summary.json").exists()


def test_a_checkpoint_dir_inside_the_output_dir_takes_one_lock(tmp_path):
    from rl_runtime.run.run_lock import directories_to_lock

    out = tmp_path / "out"
    assert directories_to_lock(out, out / "checkpoints") == [out.resolve()]
    assert directories_to_lock(out, tmp_path / "ckpt") == [
        out.resolve(),
        (tmp_path / "ckpt").resolve(),
    ]


def test_a_killed_runs_lock_is_released_by_the_os(tmp_path):
    child, _ = _start_holding_run(tmp_path)
    with (
        pytest.raises(RunDirectoryInUseError, match=f"pid {child.pid}"),
        run_directory_lock(tmp_path / "out"),
    ):
        pass
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    assert (tmp_path / "out" / LOCK_NAME).exists()  # the file stays; the lock does not
    with run_directory_lock(tmp_path / "out") as lock_file:
        assert lock_file.read_text() == f"{os.getpid()}\n"


def test_the_lock_is_released_when_the_run_raises(tmp_path):
    with pytest.raises(ValueError, match="inside"), run_directory_lock(tmp_path / "new" / "dir"):
        raise ValueError("inside")
    with run_directory_lock(tmp_path / "new" / "dir"):
        pass


def test_a_symlink_under_the_lock_name_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / LOCK_NAME).symlink_to(target)
    with pytest.raises(OSError), run_directory_lock(tmp_path / "out"):
        pass
    assert target.read_text() == "keep me"
