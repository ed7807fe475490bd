"""Hostile reward functions and code: every one yields reward 0 and a counted failure within its
deadline, from the main thread and from a worker thread; nothing is left running."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from rl_envs.rewards import RewardInput, RewardManager, load_custom_reward
from rl_envs.sandbox import SandboxLimits, SandboxPool
from rl_envs.sandbox.uids import UID_SPAN

pytestmark = pytest.mark.xdist_group("dist")  # starts sandbox worker processes

HOSTILE = {
    "loops_forever": ("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                      "    while True:\n        pass\n", "timeout"),
    "fork_bomb": ("import os\n"
                  "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                  "    while True:\n        try:\n            os.fork()\n"
                  "        except OSError:\n            pass\n", "timeout"),
    "allocates_4gb": ("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                      "    block = bytearray(4 * 1024 ** 3)\n    return 1.0\n", "memory"),
    "os_exit": ("import os\n"
                "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                "    os._exit(0)\n", "crashed"),
    # 100 MB in 1 KB lines: the output cap (1 MiB) ends it long before the deadline, even on a
    # loaded host (one 100 MB string took longer than the 1.5 s deadline to build there)
    "prints_100mb": ("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                     "    try:\n        for _ in range(100_000):\n            print('x' * 1000)\n"
                     "    except OSError:\n        pass\n"
                     "    return 1.0\n", "output_too_large"),
    "returns_nan": ("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                    "    return float('nan')\n", "not_finite"),
    "returns_none": ("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                     "    return None\n", "none"),
    "returns_string": ("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                       "    return '1.0'\n", "bad_result"),
    "huge_result": ("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                    "    return {'score': 1.0, 'junk': 'y' * 5_000_000}\n", "output_too_large"),
    "writes_result_pipe": ("import os, stat\n"  # JSON the pool's parser recursed on until it died
                           "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                           "    stdout = os.fstat(1).st_ino\n"
                           "    for fd in range(3, 256):\n"
                           "        try:\n"
                           "            if stat.S_ISFIFO(os.fstat(fd).st_mode) and os.fstat(fd).st_ino != stdout:\n"
                           "                os.write(fd, b'[' * 200_000)\n"
                           "        except OSError:\n"
                           "            pass\n"
                           "    os._exit(0)\n", "bad_result"),
    "returns_deep_nesting": ("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                             "    junk = 0\n    for _ in range(500):\n        junk = [junk]\n"
                             "    return {'score': 1.0, 'junk': junk}\n", "bad_result"),
}  # fmt: skip


def _score_in(thread: str, manager: RewardManager, item: RewardInput):
    if thread == "main":
        return manager.score_one(item)
    box = {}
    worker = threading.Thread(target=lambda: box.setdefault("out", manager.score_one(item)))
    worker.start()
    worker.join(30)
    assert not worker.is_alive()
    return box["out"]


def _calls_of(info: dict) -> list[int]:
    """The children of a worker (``pool.worker_info``) but its zygote."""
    pid = info["pid"]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split() if int(p) != info["zygote"]]
    except OSError:
        return []


@pytest.mark.parametrize("thread", ["main", "worker"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_reward_function_scores_zero_within_deadline(hostile_pool, tmp_path, case, thread):
    source, expected_kind = HOSTILE[case]
    path = tmp_path / f"{case}.py"
    path.write_text(source)
    manager = RewardManager(hostile_pool, load_custom_reward(str(path)))
    start = time.monotonic()
    out = _score_in(thread, manager, RewardInput("custom", "answer", "1"))
    elapsed = time.monotonic() - start
    assert out.reward == 0.0 and not out.ok
    assert out.kind == expected_kind, out
    assert manager.stats["failures"] == 1
    assert elapsed < hostile_pool.limits.timeout_s + 2.5
    # the worker survived (or was replaced) and left nothing behind
    info = hostile_pool.worker_info
    assert info.get("pid") is not None and _calls_of(info) == []
    good = manager.pool.call_source("def f(a):\n    return a + 1\n", "f", [1])
    assert good.ok and good.value == 2


def test_good_custom_reward_runs_out_of_process(hostile_pool, tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(
        "import os\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str == ground_truth), 'pid': os.getpid(),\n"
        "            'uid': os.getuid(), 'src': data_source}\n"
    )
    manager = RewardManager(hostile_pool, load_custom_reward(str(path)))
    outs = manager.score([RewardInput("d", "7", "7"), RewardInput("d", "7", "8")])
    assert [o.reward for o in outs] == [1.0, 0.0]
    assert outs[0].extra["pid"] != os.getpid() and outs[0].extra["src"] == "d"
    if os.geteuid() == 0:  # the uid this pool's one slot claimed, from uid_base up
        uid = outs[0].extra["uid"]
        assert uid == hostile_pool.worker_info["isolation"]["sandbox_uid"]
        assert hostile_pool.limits.uid_base <= uid < hostile_pool.limits.uid_base + UID_SPAN


def test_custom_reward_file_is_checked_without_running(tmp_path):
    marker = tmp_path / "ran"
    bad = tmp_path / "bad.py"
    bad.write_text(f"open({str(marker)!r}, 'w').close()\ndef score(x):\n    return 1\n")
    with pytest.raises(ValueError, match="compute_score"):
        load_custom_reward(str(bad))
    with pytest.raises(ValueError, match="extra_info"):
        load_custom_reward(str(bad), "score")
    with pytest.raises(FileNotFoundError):
        load_custom_reward(str(tmp_path / "missing.py"))
    assert not marker.exists()


def test_fork_count_is_bounded(hostile_pool):
    code = (
        "import os, time\nn = 0\nfor _ in range(500):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
        "    n += 1\nprint(n)\n"
    )
    result = hostile_pool.run_python(code, timeout_s=5)
    assert result.ok, result
    if os.geteuid() == 0 or os.getuid() != 0:
        assert int(result.stdout.strip()) < hostile_pool.limits.max_processes
    assert _calls_of(hostile_pool.worker_info) == []


def test_cpu_limit_is_reported():
    """The call may be pid 1 of its pid namespace, which ignores SIGXCPU: the hard limit's
    SIGKILL still reads as a CPU limit."""
    limits = SandboxLimits(timeout_s=60, cpu_s=1, allow_weak_isolation=True)  # loaded CI hosts
    with SandboxPool(1, limits=limits) as pool:
        result = pool.run_python("while True:\n    pass\n")
    assert result.kind == "cpu_limit", result


def test_escaped_descendants_are_killed(hostile_pool, tmp_path):
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(60)\n    os._exit(0)\nprint('parent done')\n"
    )
    result = hostile_pool.run_python(code)
    assert result.ok and "parent done" in result.stdout
    assert _calls_of(hostile_pool.worker_info) == []


def test_no_network_in_sandbox(hostile_pool):
    code = "import socket\nsocket.create_connection(('127.0.0.1', 1), timeout=1)\n"
    result = hostile_pool.run_python(code)
    assert not result.ok
    assert (
        "unreachable" in result.error.lower()
        or "disabled" in result.error.lower()
        or "refused" in result.error.lower()
    )


def test_python_code_cannot_touch_files_outside_its_dir(hostile_pool, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("privilege drop only happens when the pool runs as root")
    target = tmp_path / "owned_by_root"
    result = hostile_pool.run_python(f"open({str(target)!r}, 'w').write('x')\n")
    assert not result.ok and not target.exists()


def test_worker_killed_when_unresponsive_is_replaced_and_reaped():
    pool = SandboxPool(1, limits=SandboxLimits(timeout_s=1.0))
    try:
        first = pool.worker_info["pid"]
        os.kill(first, 9)  # the worker dies between calls
        time.sleep(0.1)
        result = pool.call("math:sqrt", 4)  # notices, replaces, still answers
        assert result.ok and result.value == 2.0
        second = pool.worker_info["pid"]
        assert second != first
        if os.path.exists(f"/proc/{first}"):
            with open(f"/proc/{first}/stat") as handle:
                assert handle.read().split()[2] != "Z"
    finally:
        pool.close()
    assert not os.path.exists(f"/proc/{second}")


def test_concurrent_calls_from_many_threads():
    with SandboxPool(2, limits=SandboxLimits(timeout_s=5.0)) as pool:
        results: list = [None] * 8

        def run(i: int) -> None:
            results[i] = pool.call_source("def f(x):\n    return x * x\n", "f", [i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [r.value for r in results] == [i * i for i in range(8)]
        assert pool.stats()["calls"] == 8


def _stats_delta(pool: SandboxPool, before: dict, *keys: str) -> dict[str, int]:
    after = pool.stats()
    return {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in keys}


def test_call_each_runs_a_batch_in_one_call_and_keeps_exceptions_per_call(hostile_pool):
    target = "rl_envs.rewards.rules:format_score"
    calls = [
        (["src", "aaa", None, {}], {"pattern": "a+"}),
        (["src", "aaa", None, {}], {"pattern": "("}),  # re.error: fails alone
        (["src", "bbb", None, {}], {"pattern": "a+"}),
    ]
    before = hostile_pool.stats()
    results = hostile_pool.call_each(target, calls, timeout_s=5.0)
    assert [r.ok for r in results] == [True, False, True]
    assert [r.value for r in results] == [1.0, None, 0.0]
    assert results[1].kind == "exception" and "missing )" in results[1].error
    delta = _stats_delta(hostile_pool, before, "batches", "batch_fallbacks", "calls", "failures")
    assert delta == {"batches": 1, "batch_fallbacks": 0, "calls": 3, "failures": 1}


def test_call_each_rescores_a_failed_batch_call_by_call(hostile_pool):
    """A response that makes the batch time out (catastrophic regex backtracking) is the only
    failure: the batch is run again call by call."""
    target = "rl_envs.rewards.rules:format_score"
    texts = ["aaaa", "a" * 40 + "!", "aa"]
    calls = [(["src", t, None, {}], {"pattern": r"(a+)+$"}) for t in texts]
    before = hostile_pool.stats()
    results = hostile_pool.call_each(target, calls, timeout_s=3.0)
    assert [r.value for r in results] == [1.0, None, 1.0]
    assert results[1].kind == "timeout"
    delta = _stats_delta(hostile_pool, before, "batches", "batch_fallbacks", "calls", "timeouts")
    assert delta == {"batches": 1, "batch_fallbacks": 1, "calls": 3, "timeouts": 1}


def test_calls_cannot_read_the_users_credentials(monkeypatch):
    """The user's credentials (SSH keys, the checkpoint signing key named by
    $RL_CHECKPOINT_KEY_FILE ...) are empty inside a call, even where the call's uid could read
    them (here made world-readable); other files of the home directory stay readable."""
    home = Path(tempfile.mkdtemp(dir="/var/tmp"))  # not under /tmp: a call's /tmp is its own
    try:
        home.chmod(0o755)
        (home / ".ssh").mkdir(mode=0o755)
        files = {
            home / ".ssh" / "id_ed25519": "SSH-SECRET",
            home / "keys" / "checkpoint.key": "KEY-SECRET",
            home / "notes.txt": "PUBLIC-NOTE",
        }
        for path, text in files.items():
            path.parent.mkdir(mode=0o755, exist_ok=True)
            path.write_text(text)
            path.chmod(0o644)
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("RL_CHECKPOINT_KEY_FILE", str(home / "keys" / "checkpoint.key"))
        code = "".join(
            f"try:\n    print(open({str(p)!r}).read())\nexcept OSError as e:\n    print(e)\n"
            for p in files
        )
        with SandboxPool(1, limits=SandboxLimits(timeout_s=5.0, allow_weak_isolation=True)) as pool:
            if pool.isolation["mounts"] != "private":
                pytest.skip("no mount namespaces here: nothing can be hidden")
            assert pool.isolation["credentials"] == "hidden"
            result = pool.run_python(code)
        assert result.ok, result.error
        assert "PUBLIC-NOTE" in result.stdout  # the call can read what it could before
        assert "SSH-SECRET" not in result.stdout and "KEY-SECRET" not in result.stdout
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_counting_pool_counts_the_calls_made_through_it_only():
    """Two callers share one pool from two threads at once (an evaluation grading while
    training rollout grades): each `CountingPool` handle's `stats()` counts its own calls, their
    outcomes, the batch and the worker restart its call caused; the pool counts them all. A
    caller's before/after difference of the pool's stats counted the other's calls too."""
    import signal

    from rl_envs.sandbox import CountingPool
    from rl_envs.sandbox.counting import Tally, counting_into

    with SandboxPool(1, limits=SandboxLimits(timeout_s=5.0, allow_weak_isolation=True)) as pool:
        evaluation, training = CountingPool(pool), CountingPool(pool)
        target = "rl_envs.rewards.rules:format_score"
        go = threading.Barrier(2)

        def evaluate() -> None:
            go.wait()
            for i in range(3):
                evaluation.call("math:sqrt", i * i)
            evaluation.call_source("def f():\n    raise ValueError('no')\n", "f")

        def train() -> None:
            go.wait()
            training.call_each(target, [(["s", t, None, {}], {"pattern": "a+"}) for t in "ab"])
            training.run_python("while True:\n    pass\n", timeout_s=0.5)

        threads = [threading.Thread(target=evaluate), threading.Thread(target=train)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        os.kill(pool.worker_info["pid"], signal.SIGKILL)  # the next call finds it dead
        time.sleep(0.1)
        outer = Tally()
        with counting_into(outer):  # nested: the handle's call counts in both
            assert training.call("math:sqrt", 4).value == 2.0
        own = ("calls", "failures", "timeouts", "kind.ok", "kind.exception", "batches",
               "worker_restarts")  # fmt: skip
        ev, tr, total = evaluation.stats(), training.stats(), pool.stats()
        assert {k: ev.get(k, 0) for k in own} == {"calls": 4, "failures": 1, "timeouts": 0,
            "kind.ok": 3, "kind.exception": 1, "batches": 0, "worker_restarts": 0}  # fmt: skip
        assert {k: tr.get(k, 0) for k in own} == {"calls": 4, "failures": 1, "timeouts": 1,
            "kind.ok": 3, "kind.exception": 0, "batches": 1, "worker_restarts": 1}  # fmt: skip
        assert {k: total.get(k, 0) for k in own} == {k: ev.get(k, 0) + tr.get(k, 0) for k in own}
        assert outer.counts() == {"calls": 1, "kind.ok": 1, "worker_restarts": 1}
        assert ev["isolation"] == total["isolation"] == pool.isolation["mode"]
