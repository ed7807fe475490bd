"""Rollout replay: record an engine's generations, then serve them again without a model.

`RecordingEngine` wraps any engine (``strategy_config.record_generations: DIR`` on any
registered engine, handled by `rl_rollout.registry.build_engine`): each `generate` call's
requests and results go to ``DIR/<seed>-<call>.msgpack`` (msgspec msgpack, written to a
temporary name and renamed: a file is complete or absent; nothing pickled), ``seed`` being the
engine's seed (one per rollout worker) and ``call`` its call count.

`ReplayEngine` (``strategy_name: replay``, ``strategy_config: {generations: DIR}``) holds no
model: it loads every recorded call under DIR and answers each request with the results
recorded for the same request (request id, prompt token ids and sampling parameters all
equal), the n-th identical request with the n-th recording of it. A request never recorded is
an error naming it. Weight updates are accepted and only advance the version, so a pipeline
runs its rollout, learn and sync phases with no generation engine at all: debugging a step
without engines, as ROLL's rollout mock does. A run that replays the generations of a recorded
run, from the same initial weights and config, trains on the same batches: its steps equal the
recorded run's bit for bit (the test compares step records).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import torch

from rl_config.records import GenerationRequest, GenerationResult

FORMAT = 1
#: size bound of one recorded call file (a large batch of long generations is far smaller)
MAX_CALL_BYTES = 1 << 30
SUFFIX = ".msgpack"


class GenerationCall(msgspec.Struct, frozen=True):
    """One recorded `generate` call: its requests and the results, in the engine's order."""

    format: int
    requests: list[GenerationRequest]
    results: list[GenerationResult]


class ReplayError(RuntimeError):
    """A replayed request that was not recorded, or an unreadable recording (names the file)."""


def _key(request: GenerationRequest) -> bytes:
    return msgspec.msgpack.encode((request.request_id, request.prompt_ids, request.sampling))


class RecordingEngine:
    """`inner`, with each `generate` call's requests and results written to `directory`."""

    def __init__(self, inner: Any, directory: str | os.PathLike[str], seed: int) -> None:
        self.inner = inner
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.seed = seed
        self.calls = 0

    def __getattr__(self, name: str) -> Any:  # everything but generate: the wrapped engine's
        return getattr(self.inner, name)

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        results = await self.inner.generate(requests)
        self.calls += 1
        data = msgspec.msgpack.encode(GenerationCall(FORMAT, list(requests), list(results)))
        name = f"{self.seed}-{self.calls:06d}{SUFFIX}"
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.directory / name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return results


def _call_order(path: Path) -> tuple[int, int]:
    seed, _, call = path.name.removesuffix(SUFFIX).partition("-")
    try:
        return int(seed), int(call)
    except ValueError:
        raise ReplayError(f"{path}: not a recorded call (<seed>-<call>{SUFFIX})") from None


def generations_problem(directory: str | os.PathLike[str]) -> str | None:
    """Why `directory` cannot serve recorded generations (missing, or no recorded call in it),
    or None; the calls themselves are read and checked when the engine starts."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        return f"generations directory {root} does not exist"
    if next(root.glob(f"*{SUFFIX}"), None) is None:
        return f"{root}: no recorded generations (*{SUFFIX})"
    return None


def load_generations(directory: str | os.PathLike[str]) -> dict[bytes, deque[list]]:
    """Every recorded call under `directory`: per request key, the results of each recording
    of that request, oldest first."""
    root = Path(directory)
    problem = generations_problem(root)
    if problem is not None:
        raise ReplayError(problem)
    files = sorted(root.glob(f"*{SUFFIX}"), key=_call_order)
    served: dict[bytes, deque[list]] = {}
    for path in files:
        if path.is_symlink() or path.stat().st_size > MAX_CALL_BYTES:
            raise ReplayError(f"{path}: a symlink or over {MAX_CALL_BYTES} bytes")
        try:
            call = msgspec.msgpack.decode(path.read_bytes(), type=GenerationCall)
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as err:
            raise ReplayError(f"{path}: not a recorded call: {err}") from None
        if call.format != FORMAT:
            raise ReplayError(f"{path}: format {call.format}, this reader knows {FORMAT}")
        by_id: dict[str, list[GenerationResult]] = {}
        for result in call.results:
            by_id.setdefault(result.request_id, []).append(result)
        for request in call.requests:
            results = by_id.get(request.request_id, [])
            if len(results) != request.sampling.n:
                raise ReplayError(
                    f"{path}: request {request.request_id!r} asked for {request.sampling.n} "
                    f"samples, {len(results)} recorded"
                )
            served.setdefault(_key(request), deque()).append(results)
    return served


class ReplayEngine:
    """Answers requests with recorded results (module docstring); no model, no device."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        strategy_config: dict[str, Any] | None = None,
        *,
        dtype: Any = None,
        device: Any = None,
        seed: int = 0,
    ) -> None:
        problems = replay_option_problems(dict(strategy_config or {}))
        if problems:
            key, why = next(iter(problems.items()))
            raise ValueError(f"replay engine: strategy_config.{key}: {why}")
        assert strategy_config is not None
        self.directory = Path(strategy_config["generations"])
        self._served = load_generations(self.directory)
        self._version = 0
        self._ticket = 0
        self.stats = {"replayed_requests": 0}

    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        out: list[GenerationResult] = []
        for request in requests:
            queue = self._served.get(_key(request))
            if not queue:
                raise ReplayError(
                    f"request {request.request_id!r} ({len(request.prompt_ids)} prompt tokens, "
                    f"sampling {msgspec.json.encode(request.sampling).decode()}) was not "
                    f"recorded under {self.directory} (or not as often): the replayed run "
                    "differs from the recorded one before this generation"
                )
            out.extend(queue.popleft())
            self.stats["replayed_requests"] += 1
        return out

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        self.stage_weights(named_tensors, version)

    def stage_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        for _ in named_tensors:  # consume a streamed iterable as an engine would
            pass
        self._version = version
        self._ticket += 1
        return self._ticket

    @property
    def applied_ticket(self) -> int:
        return self._ticket

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def abort(self, request_ids: Iterable[str]) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def state_dict_for_check(self) -> dict[str, torch.Tensor]:
        return {}


def replay_option_problems(strategy_config: dict[str, Any]) -> dict[str, str]:
    """`{key: why}` for the replay engine's strategy_config: `generations` (a directory of
    recorded calls) is required, nothing else is read."""
    problems = {
        key: "the replay engine reads only `generations`"
        for key in strategy_config
        if key != "generations"
    }
    if not isinstance(strategy_config.get("generations"), str):
        problems["generations"] = "required: the directory of recorded generations (a path)"
    return problems
