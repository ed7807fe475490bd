"""The candidate process of a code test, and the grader's proxies for what it defines.

The program under test runs in a candidate process (``candidate_main``) forked from a spawner
that never held the tests (``rl_envs.sandbox.spawner``). It receives only the program and the
test's stdin. For a stdin/stdout test it runs the program and sends back what it printed. For an
assert test it runs the program, sends the names it defined, and then serves requests from the
grader, which runs the test's asserts in ITS process over proxies (``RemoteNamespace``): a call of
a candidate function sends the arguments, and the result crosses the pipe as data (numbers,
strings, bytes, lists, tuples, sets, dicts, None; anything else stays in the candidate as a
handle). Expected values and the assertions never exist in the candidate, and no object of the
candidate's (a lying ``__eq__``) is ever compared in the grader: handles compare by identity.

Frames are length-prefixed JSON both ways (``rl_envs.sandbox.protocol``); values are tagged:
``{"f": repr}`` float, ``{"t": [...]}`` tuple, ``{"s": [...]}`` set, ``{"fs": [...]}`` frozenset,
``{"d": [[k, v], ...]}`` dict, ``{"b": hex}`` bytes, ``{"c": [re, im]}`` complex, ``{"h": n}``
a handle; JSON lists are lists and JSON scalars themselves.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import sys
import types
from typing import Any

from rl_envs.sandbox.protocol import FrameTimeout, read_frame, write_frame

MAX_FRAME = 1 << 20  # bytes of one frame from the candidate
MAX_DEPTH = 64
#: dunder methods forwarded to a candidate's object (never comparisons)
FORWARDED = ("__len__", "__iter__", "__getitem__", "__contains__", "__bool__", "__str__",
             "__repr__", "__call__", "__hash__")  # fmt: skip


class NotData(TypeError):
    """A value that does not cross as data (it stays in the candidate as a handle)."""


class CandidateError(Exception):
    """The candidate raised something that is not a builtin exception (its type name and
    message), or stopped answering."""


def encode(value: Any, handles: dict[int, Any] | None = None, depth: int = 0) -> Any:
    """``value`` as tagged JSON; non-data becomes a handle in ``handles`` (``NotData`` if
    ``handles`` is None). Exact types only: a subclass's methods are the candidate's code."""
    if depth > MAX_DEPTH:
        raise NotData("nested too deeply")
    kind = type(value)
    if kind is Handle:  # the grader passing a candidate's object back
        return {"h": value._handle}
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return {"f": repr(value)}
    if kind is complex:
        return {"c": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"b": value.hex()}
    nested: Any = None
    try:
        if kind is list:
            return [encode(v, None, depth + 1) for v in value]
        tags = {tuple: "t", set: "s", frozenset: "fs"}
        if kind in tags:
            return {tags[kind]: [encode(v, None, depth + 1) for v in value]}
        if kind is dict:
            return {"d": [[encode(k, None, depth + 1), encode(v, None, depth + 1)]
                          for k, v in value.items()]}  # fmt: skip
    except NotData as exc:
        nested = exc
    if handles is None:
        raise nested or NotData(kind.__name__)
    handles[id(value)] = value
    return {"h": id(value)}


def decode(data: Any, resolve: Any = None) -> Any:
    """The value of tagged JSON; ``resolve(n)`` turns a handle into an object (a proxy in the
    grader, the object itself in the candidate)."""
    if isinstance(data, list):
        return [decode(v, resolve) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) != 1:
        raise ValueError("malformed value")
    ((tag, body),) = data.items()
    if tag == "f":
        return float(body)
    if tag == "c":
        return complex(float(body[0]), float(body[1]))
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "t":
        return tuple(decode(v, resolve) for v in body)
    if tag == "s":
        return {decode(v, resolve) for v in body}
    if tag == "fs":
        return frozenset(decode(v, resolve) for v in body)
    if tag == "d":
        return {decode(k, resolve): decode(v, resolve) for k, v in body}
    if tag == "h" and resolve is not None:
        return resolve(int(body))
    raise ValueError(f"malformed value tag {tag!r}")


# ----- the candidate process --------------------------------------------------------------------
def _close_fds_except(*keep: int) -> None:
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _run_program(program: str, stdin: str | None) -> dict[str, Any]:
    path = os.path.join(os.getcwd(), f"solution_{os.getpid()}.py")
    with open(path, "w") as handle:
        handle.write(program)
    module = types.ModuleType("__main__")
    module.__file__ = path
    sys.modules["__main__"] = module
    sys.argv = [path]
    sys.stdin = io.StringIO(stdin or "")
    code = compile(program, path, "exec", dont_inherit=True)
    exec(code, module.__dict__)  # noqa: S102 - the candidate's own process, in the sandbox
    return module.__dict__


def _serve(namespace: dict[str, Any], request_fd: int, reply_fd: int) -> None:
    handles: dict[int, Any] = {}
    names = {}
    for name, value in list(namespace.items()):
        if not name.startswith("__"):
            with contextlib.suppress(Exception):
                names[name] = encode(value, handles)
    write_frame(reply_fd, {"names": names})
    while True:
        request = read_frame(request_fd)
        if request is None:
            return
        args: list[Any] = []
        try:
            target = handles[int(request["target"])]
            args = [decode(a, handles.__getitem__) for a in request.get("args", [])]
            kwargs = {
                k: decode(v, handles.__getitem__) for k, v in request.get("kwargs", {}).items()
            }
            if request["op"] == "getattr":
                value = getattr(target, str(request["name"]))
            elif request["op"] == "__iter__":
                value = list(target)
            elif request["op"] in FORWARDED:  # looked up on the type, as Python does
                method = getattr(type(target), request["op"], None)
                if method is None:
                    raise TypeError(f"{type(target).__name__} has no {request['op']}")
                value = method(target, *args, **kwargs)
            else:
                value = target(*args, **kwargs)
            reply: dict[str, Any] = {"value": encode(value, handles)}
            # in-place changes of list, dict and set arguments go back to the grader's copies
            reply["args_after"] = [
                encode(a, handles) if type(a) in (list, dict, set) else None for a in args
            ]
        except BaseException as exc:  # SystemExit too: the grader decides what it means
            reply = {"raised": type(exc).__name__, "message": str(exc)[:500]}
        write_frame(reply_fd, reply)


def candidate_main(request_fd: int, reply_fd: int) -> None:
    """Entry of a candidate process (forked by the spawner; never returns). The first request is
    ``{"program", "stdin", "mode"}``: ``"io"`` replies ``{"stdout"}`` once the program ended,
    ``"assert"`` replies ``{"names"}`` and then serves the grader's requests."""
    write, exit_now = write_frame, os._exit  # bound before the program can patch them
    status = 1
    try:
        _close_fds_except(request_fd, reply_fd)
        os.setpgid(0, 0)
        start = read_frame(request_fd, None, 64 << 20)
        if start["mode"] == "io":
            captured = io.StringIO()
            with contextlib.redirect_stdout(captured):
                try:
                    _run_program(start["program"], start.get("stdin"))
                except SystemExit as exc:
                    if exc.code not in (0, None):
                        raise
            write(reply_fd, {"stdout": captured.getvalue()[: MAX_FRAME // 2]})
        else:
            _serve(_run_program(start["program"], None), request_fd, reply_fd)
        status = 0
    except BaseException:
        status = 1
    finally:
        exit_now(status)


# ----- the grader's side ------------------------------------------------------------------------
class Remote:
    """The grader's end of one candidate process (request/reply over two pipes)."""

    def __init__(self, request_fd: int, reply_fd: int, deadline: float) -> None:
        self.request_fd, self.reply_fd, self.deadline = request_fd, reply_fd, deadline
        #: set once the candidate timed out, ended or exited from a call: the test fails even
        #: if its code caught the exception
        self.failed = ""

    def receive(self) -> dict[str, Any]:
        try:
            reply = read_frame(self.reply_fd, self.deadline, MAX_FRAME)
        except FrameTimeout:
            self.failed = "timeout"
            raise
        except Exception:
            self.failed = "bad reply"
            raise
        if not isinstance(reply, dict):
            self.failed = "ended"
            raise CandidateError("the candidate process ended")
        return reply

    def request(self, op: str, handle: int, args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None, **extra: Any) -> Any:  # fmt: skip
        write_frame(self.request_fd, {"op": op, "target": handle, **extra,
                                      "args": [encode(a) for a in args],
                                      "kwargs": {k: encode(v) for k, v in (kwargs or {}).items()}})  # fmt: skip
        reply = self.receive()
        if "raised" in reply:
            kind = getattr(builtins, str(reply["raised"]), None)
            message = str(reply.get("message", ""))
            if isinstance(kind, type) and issubclass(kind, Exception):
                raise kind(message)
            if isinstance(kind, type) and issubclass(kind, BaseException):
                self.failed = str(reply["raised"])  # SystemExit and the like: no result
            raise CandidateError(f"{reply['raised']}: {message}")
        for arg, after in zip(args, reply.get("args_after", [])):
            if after is not None:
                _update_in_place(arg, decode(after, self.proxy))
        return decode(reply["value"], self.proxy)

    def proxy(self, handle: int) -> Handle:
        return Handle(self, handle)

    def namespace(self) -> dict[str, Any]:
        """The program's names, as values or proxies (after its start reply)."""
        names = self.receive().get("names")
        if not isinstance(names, dict):
            raise CandidateError("the candidate sent no names")
        return {str(k): decode(v, self.proxy) for k, v in names.items()}


def _update_in_place(arg: Any, after: Any) -> None:
    if type(arg) is not type(after):
        return
    if type(arg) is list:
        arg[:] = after
    elif type(arg) in (dict, set):
        arg.clear()
        arg.update(after)


class Handle:
    """A candidate's object seen from the grader: calls, attributes and a few protocols are
    forwarded; it equals only itself."""

    __slots__ = ("_handle", "_remote")

    def __init__(self, remote: Remote, handle: int) -> None:
        object.__setattr__(self, "_remote", remote)
        object.__setattr__(self, "_handle", handle)

    def __getattr__(self, name: str) -> Any:
        return self._remote.request("getattr", self._handle, name=name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._remote.request("call", self._handle, args, kwargs)

    def __len__(self) -> int:
        return int(self._remote.request("__len__", self._handle))

    def __iter__(self) -> Any:
        return iter(self._remote.request("__iter__", self._handle))

    def __getitem__(self, key: Any) -> Any:
        return self._remote.request("__getitem__", self._handle, (key,))

    def __contains__(self, item: Any) -> bool:
        return self._remote.request("__contains__", self._handle, (item,)) is True

    def __bool__(self) -> bool:
        return self._remote.request("__bool__", self._handle) is True

    def __str__(self) -> str:
        return str(self._remote.request("__str__", self._handle))

    def __repr__(self) -> str:
        return str(self._remote.request("__repr__", self._handle))

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return hash((id(self._remote), self._handle))


__all__ = ["CandidateError", "Handle", "Remote", "candidate_main", "decode", "encode"]
