"""``SandboxPool``: run untrusted functions and code out of the caller's process.

Workers are separate interpreters (``python -m rl_envs.sandbox._worker``, spawn semantics, own
session), one per call slot. Each call forks a fresh call process inside a worker with hard
limits (see ``SandboxLimits``); results come back as JSON. A worker that stops answering is
killed with its whole process group, reaped and replaced in the same slot. Safe to use from any
thread. ``isolation`` says what the workers could set up; ``stats()`` counts calls, failures by
kind, timeouts and worker restarts for the caller's metrics (all callers'; one caller's own:
``rl_envs.sandbox.counting.CountingPool``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rl_envs.sandbox.cgroups import SlotCgroup
from rl_envs.sandbox.counting import Tally, active_tallies, stats_report
from rl_envs.sandbox.credentials import secret_paths
from rl_envs.sandbox.limits import SandboxLimits
from rl_envs.sandbox.protocol import FrameTimeout, read_frame, write_frame

logger = logging.getLogger(__name__)

GRACE_S = 3.0
MAX_RESULT_DEPTH = 64  # of a call's JSON result: deeper is a bad_result
_ENV_KEEP = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "VIRTUAL_ENV", "TZ")
#: the outcomes a call's own result may name (``rl_envs.sandbox.call``); the call writes that
#: result, so any other name it sends is a ``bad_result`` (else each call could add a counter)
CALL_KINDS = frozenset({"ok", "exception", "memory", "exit", "bad_result"})
MAX_ERROR_CHARS = 2000
MAX_TRACEBACK_CHARS = 4000
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass
class SandboxResult:
    """Outcome of one call. ``kind``: ok | exception | memory | timeout | cpu_limit | crashed |
    exit | output_too_large | bad_result | worker_lost | pool_busy | worker_error."""

    ok: bool
    value: Any = None
    kind: str = "ok"
    error: str = ""
    stdout: str = ""
    duration_s: float = 0.0
    traceback: str = ""


class WeakIsolationError(RuntimeError):
    """The host refused the namespaces that isolate untrusted code from the network."""


@dataclass(eq=False)
class _Worker:
    process: subprocess.Popen[bytes]
    slot: int
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", HOME="/tmp")
    return env


def _to_jsonable(value: Any) -> Any:
    """Arguments travel as JSON; numpy scalars/arrays and tuples are converted."""
    return json.loads(json.dumps(value, default=_default, allow_nan=True))


def _default(value: Any) -> Any:
    for attr in ("tolist", "item"):
        fn = getattr(value, attr, None)
        if callable(fn):
            return fn()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return repr(value)


def _call_kind(value: Any, ok: bool) -> str:
    """The outcome a call's result names, if it is one a call may report."""
    if ok:
        return "ok"
    return value if value in CALL_KINDS and value != "ok" else "bad_result"


def _message(value: Any, limit: int = MAX_ERROR_CHARS) -> str:
    """A call's error or traceback text, for people: at most ``limit`` characters, control
    characters (terminal escape sequences: a model's code chooses its exception's message)
    written as ``\\xNN``; newlines and tabs kept."""
    escaped = _CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value)[:limit])
    return escaped[:limit]


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests lists/objects more than ``limit`` deep (iterative: a result
    nested as deep as the parser allows must not make its reader recurse)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)
    return False


def _split_batch(batch: SandboxResult, n: int) -> list[SandboxResult] | None:
    """The ``n`` outcomes of a ``call_each`` batch; None when the batch itself failed."""
    if not batch.ok or not isinstance(batch.value, list) or len(batch.value) != n:
        return None
    if not all(isinstance(one, dict) for one in batch.value):
        return None
    share = batch.duration_s / n
    return [
        SandboxResult(True, value=one.get("value"), duration_s=share)
        if one.get("ok")
        else SandboxResult(
            False,
            kind=_call_kind(one.get("kind", "exception"), False),
            error=_message(one.get("error", "")),
            duration_s=share,
        )
        for one in batch.value
    ]


class SandboxPool:
    """A pool of sandbox workers, one per call slot.

    Start fails with ``WeakIsolationError`` where the workers cannot get a network namespace,
    unless ``limits.allow_weak_isolation`` (or ``limits.network``) is set. ``preload``: modules imported by each worker at start (calls running as an unprivileged user
    may not be able to import anything else). ``warmup``: ``"module:function"`` targets called
    once at start (to trigger lazy imports).
    """

    def __init__(
        self,
        num_workers: int = 2,
        *,
        limits: SandboxLimits | None = None,
        preload: tuple[str, ...] | list[str] = (),
        warmup: tuple[str, ...] | list[str] = (),
        start_timeout_s: float = 120.0,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.limits = limits or SandboxLimits()
        self.num_workers = num_workers
        self._config = {"preload": list(preload), "warmup": list(warmup),
                        "network": self.limits.network, "limits": self.limits.to_dict(),
                        "hidden": secret_paths()}  # fmt: skip
        self._start_timeout_s = start_timeout_s
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._totals = Tally()  # every call's counts (and each caller's: rl_envs.sandbox.counting)
        self._closed = False
        self._isolation: dict[str, Any] = {}
        starting = [self._spawn(slot) for slot in range(num_workers)]
        try:
            for worker in starting:
                self._await_ready(worker)
            self._isolation = dict(starting[0].info.get("isolation", {}))
            self._check_isolation()
        except BaseException:
            self.close()
            raise
        for worker in starting:
            self._idle.put(worker)
        logger.info("sandbox pool of %d workers, isolation %s", num_workers, self._isolation)

    def _check_isolation(self) -> None:
        if self.limits.allow_weak_isolation:
            return
        if self._isolation.get("sockets") != "seccomp":
            raise WeakIsolationError(
                "sandbox: calls cannot be kept from opening sockets here ("
                f"{self._isolation.get('sockets_error', 'no seccomp filter')}); unix sockets bound "
                "to files and vsock reach outside any network namespace. Set "
                "SandboxLimits(allow_weak_isolation=True) (config key "
                "sandbox_allow_weak_isolation) to run calls anyway."
            )
        if self._isolation.get("network") != "none":
            return
        raise WeakIsolationError(
            "sandbox: this host refuses network namespaces (e.g. Docker's default seccomp "
            "profile), so untrusted code could reach the network; set "
            "SandboxLimits(allow_weak_isolation=True) (config key "
            "sandbox_allow_weak_isolation) to run with Python-level socket blocking only, "
            f"which a subprocess or socket.SocketType bypasses. Isolation here: {self._isolation}"
        )

    # ----- workers ---------------------------------------------------------------------------
    def _spawn(self, slot: int) -> _Worker:
        process = subprocess.Popen(
            [sys.executable, "-m", "rl_envs.sandbox._worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=_clean_env(),
            close_fds=True,
        )
        worker = _Worker(process, slot)
        assert process.stdin is not None
        write_frame(process.stdin.fileno(), {**self._config, "slot": slot})
        with self._lock:
            self._all.add(worker)
        return worker

    def _await_ready(self, worker: _Worker) -> None:
        assert worker.process.stdout is not None
        deadline = time.monotonic() + self._start_timeout_s
        try:
            info = read_frame(worker.process.stdout.fileno(), deadline)
        except FrameTimeout:
            info = None
        if not info or not info.get("ready"):
            self._kill(worker)
            raise RuntimeError("sandbox worker failed to start")
        worker.info = info

    def _kill(self, worker: _Worker) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            worker.process.kill()
        with contextlib.suppress(Exception):
            worker.process.wait(timeout=10)
        cgroup = worker.info.get("cgroup") or []
        if cgroup:  # the killed worker's control group, and any call process still in it
            SlotCgroup(str(cgroup[0]), tuple(str(d) for d in cgroup[1:])).remove()
        for stream in (worker.process.stdin, worker.process.stdout):
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.close()
        with self._lock:
            self._all.discard(worker)

    def _replace_async(self, slot: int) -> None:
        callers = active_tallies()  # the restart's caller counts its failure to start too

        def _start() -> None:
            try:
                worker = self._spawn(slot)
                self._await_ready(worker)
            except Exception:
                self._add("worker_start_failures", tallies=callers)
                return
            if self._closed:
                self._kill(worker)
            else:
                self._idle.put(worker)

        self._add("worker_restarts")
        threading.Thread(target=_start, name="sandbox-replace", daemon=True).start()

    @property
    def isolation(self) -> dict[str, Any]:
        """What a call gets, as the workers measured it at start: ``network`` (netns |
        userns+netns | none | allowed), ``uid`` (per-slot | shared-with-caller), ``limits``
        (cgroup2 | cgroup1 | rlimit), ``mounts`` (private | shared), ``pids`` (pidns | shared),
        ``ipc`` (ipcns | removed-per-call: the slot uid's SysV objects are removed after each
        call | shared), ``credentials`` (hidden: the user's credential files are empty in each
        call, rl_envs.sandbox.credentials | slot-uid: only the slot uid's permissions keep them |
        readable), ``sockets`` (seccomp: no socket of any family can be made in a call,
        rl_envs.sandbox.seccomp | open), ``groups`` (dropped | kept: the caller's supplementary
        groups, which an unprivileged user namespace may not drop), and ``mode``: "strong" when
        network, mounts, pids and sockets are isolated and memory is capped in total, else
        "weak"."""
        report = dict(self._isolation)
        strong = (
            report.get("network") in ("netns", "userns+netns")
            and report.get("mounts") == "private"
            and report.get("pids") == "pidns"
            and report.get("sockets") == "seccomp"
            and report.get("limits") in ("cgroup2", "cgroup1")
        )
        report["mode"] = "strong" if strong else "weak"
        return report

    @property
    def worker_info(self) -> dict[str, Any]:
        """What the first live worker reported at start (network isolation, root, preload)."""
        with self._lock:
            for worker in self._all:
                return dict(worker.info)
        return {}

    @property
    def workers_info(self) -> list[dict[str, Any]]:
        """What every live worker reported at start, in start order (its slot's ``isolation``,
        including the ``sandbox_uid`` it claimed)."""
        with self._lock:
            return [dict(worker.info) for worker in self._all]

    # ----- calls ---------------------------------------------------------------------------------
    def _submit(self, task: dict[str, Any], timeout_s: float | None) -> SandboxResult:
        return self._count(self._run(task, timeout_s))

    def _run(self, task: dict[str, Any], timeout_s: float | None) -> SandboxResult:
        """One task on an idle worker (not counted in ``stats()``)."""
        if self._closed:
            raise RuntimeError("SandboxPool is closed")
        limits = self.limits.with_timeout(timeout_s)
        task["limits"] = limits.to_dict()
        start = time.monotonic()
        try:
            worker = self._idle.get(timeout=limits.timeout_s + 4 * GRACE_S + self._start_timeout_s)
        except queue.Empty:
            return SandboxResult(False, kind="pool_busy", error="no idle worker")
        if not worker.alive:
            self._kill(worker)
            self._replace_async(worker.slot)
            return self._run_again(task, timeout_s, start)
        assert worker.process.stdin is not None and worker.process.stdout is not None
        try:
            write_frame(worker.process.stdin.fileno(), task)
            response = read_frame(
                worker.process.stdout.fileno(), start + limits.timeout_s + GRACE_S
            )
        except (FrameTimeout, OSError, ValueError, RecursionError):
            response = None
        if response is None:
            self._kill(worker)
            self._replace_async(worker.slot)
            result = SandboxResult(
                False, kind="worker_lost", error="sandbox worker stopped answering"
            )
        else:
            self._idle.put(worker)
            result = self._decode(response, limits)
        result.duration_s = time.monotonic() - start
        return result

    def _run_again(
        self, task: dict[str, Any], timeout_s: float | None, start: float
    ) -> SandboxResult:
        if time.monotonic() - start > self._start_timeout_s:
            return SandboxResult(False, kind="pool_busy", error="no live worker")
        return self._run(task, timeout_s)

    @staticmethod
    def _decode(response: dict[str, Any], limits: SandboxLimits) -> SandboxResult:
        stdout = str(response.get("stdout", ""))
        if not response.get("ok"):
            return SandboxResult(False, kind=str(response.get("kind", "crashed")),
                                 error=str(response.get("error", "")), stdout=stdout)  # fmt: skip
        raw = str(response.get("result_json", ""))
        if len(raw) > limits.max_output_bytes + 4096:
            return SandboxResult(
                False, kind="output_too_large", error="result too large", stdout=stdout
            )
        try:  # untrusted: a call can write its result pipe ("[" * 10**5 is a RecursionError)
            payload = json.loads(raw)
        except (ValueError, RecursionError):
            return SandboxResult(
                False, kind="bad_result", error="result is not valid JSON", stdout=stdout
            )
        if _deeper_than(payload, MAX_RESULT_DEPTH):
            return SandboxResult(False, kind="bad_result", stdout=stdout,
                                 error=f"result nested deeper than {MAX_RESULT_DEPTH}")  # fmt: skip
        if not isinstance(payload, dict):
            return SandboxResult(
                False, kind="bad_result", error="result is not an object", stdout=stdout
            )
        ok = payload.get("ok") is True
        return SandboxResult(
            ok,
            value=payload.get("value") if ok else None,
            kind=_call_kind(payload.get("kind", "exception"), ok),
            error=_message(payload.get("error", "")),
            stdout=stdout,
            traceback=_message(payload.get("traceback", ""), MAX_TRACEBACK_CHARS),
        )

    def _add(self, key: str, n: int = 1, *, tallies: tuple[Tally, ...] | None = None) -> None:
        """Count `key` in the pool's totals and in the calling context's tallies (`tallies`:
        those captured where the count's cause ran)."""
        for tally in (self._totals, *(active_tallies() if tallies is None else tallies)):
            tally.add(key, n)

    def _count(self, result: SandboxResult) -> SandboxResult:
        self._add("calls")
        self._add(f"kind.{result.kind}")
        if not result.ok:
            self._add("failures")
        return result

    def call(
        self, target: str, *args: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> SandboxResult:
        """Call a trusted function ``"package.module:function"`` with JSON-able arguments."""
        if ":" not in target:
            raise ValueError(f"target must be 'module:function', got {target!r}")
        task = {"kind": "call", "target": target, "args": _to_jsonable(list(args)),
                "kwargs": _to_jsonable(kwargs)}  # fmt: skip
        return self._submit(task, timeout_s)

    def call_each(
        self,
        target: str,
        calls: list[tuple[list[Any], dict[str, Any]]],
        *,
        timeout_s: float | None = None,
    ) -> list[SandboxResult]:
        """``call(target, *args, **kwargs)`` for each ``(args, kwargs)``, all in ONE call process
        (one fork instead of ``len(calls)``): for functions that only read their arguments
        (graders parsing model output), never for code that runs them. An exception fails only
        its own call. When the batch as a whole fails (timeout, memory, crash, a result that
        does not serialise ...), every call is run again alone, so the failure lands on the
        call that caused it. ``timeout_s`` bounds the batch, then each call alone. ``stats()``
        counts each call as one, and ``batches``/``batch_fallbacks``."""
        if ":" not in target:
            raise ValueError(f"target must be 'module:function', got {target!r}")
        if len(calls) <= 1:
            return [self.call(target, *a, timeout_s=timeout_s, **kw) for a, kw in calls]
        task = {"kind": "call_each", "target": target,
                "calls": _to_jsonable([[list(a), dict(kw)] for a, kw in calls])}  # fmt: skip
        self._add("batches")
        results = _split_batch(self._run(task, timeout_s), len(calls))
        if results is not None:
            return [self._count(result) for result in results]
        self._add("batch_fallbacks")
        return [self.call(target, *a, timeout_s=timeout_s, **kw) for a, kw in calls]

    def call_source(
        self,
        source: str,
        function: str,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        filename: str = "reward_fn.py",
        timeout_s: float | None = None,
    ) -> SandboxResult:
        """Run untrusted module ``source`` and call its ``function`` inside the sandbox."""
        task = {"kind": "source", "source": source, "function": function,
                "filename": os.path.basename(filename) or "reward_fn.py",
                "args": _to_jsonable(list(args)), "kwargs": _to_jsonable(kwargs or {})}  # fmt: skip
        return self._submit(task, timeout_s)

    def run_python(self, code: str, *, timeout_s: float | None = None) -> SandboxResult:
        """Run untrusted Python code as ``__main__``; ``stdout`` holds what it printed."""
        return self._submit({"kind": "python", "source": code}, timeout_s)

    def stats(self) -> dict[str, Any]:
        """Counters for the caller's metrics: ``calls``, ``failures``, ``timeouts``,
        ``worker_restarts``, ``worker_start_failures``, ``kind.<kind>`` per outcome, and
        ``isolation`` (the ``mode``, "strong" or "weak") plus ``isolation.<aspect>`` strings.
        Every caller's calls: one caller's own are its ``CountingPool``'s ``stats()``."""
        return stats_report(self._totals.counts(), self.isolation)

    # ----- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers = list(self._all)
        for worker in workers:
            self._kill(worker)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
