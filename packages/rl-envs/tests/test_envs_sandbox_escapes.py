"""Escapes from the sandbox found by a security review, one test each.

Tests that depend on an isolation feature check ``pool.isolation`` and skip, naming it, where
this host cannot provide it; the non-root and no-namespace environments are exercised for real
by running a "trainer" (``sandbox_scenario.py``) as another uid or as root without
CAP_SYS_ADMIN (how Docker's default profile refuses ``unshare``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from rl_envs.sandbox import SandboxLimits, SandboxPool

pytestmark = pytest.mark.xdist_group("dist")  # starts sandbox worker processes

SCENARIO = Path(__file__).with_name("sandbox_scenario.py")
NON_ROOT_UID = 4242


def _need(pool: SandboxPool, aspect: str, *values: str) -> None:
    got = pool.isolation.get(aspect)
    if got not in values:
        pytest.skip(f"this host gives sandbox {aspect}={got!r}, the test needs {values}")


@pytest.fixture
def bystander():
    """A process standing in for the trainer, with a secret on its command line and in its
    environment."""
    secret = f"SECRET-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", secret],
        env={"RL_TRAINER_TOKEN": secret, "PATH": os.environ.get("PATH", "")},
    )
    yield proc, secret
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("target", ["secret_file", "trainer_environ"])
def test_output_symlink_does_not_leak_files(hostile_pool, tmp_path, bystander, target):
    """The call replaces its output file with a symlink; the worker (root) must not read it."""
    proc, secret = bystander
    if target == "secret_file":
        path = tmp_path / "shadow"
        path.write_text(secret)
        path.chmod(0o600)
    else:
        path = Path(f"/proc/{proc.pid}/environ")
    code = textwrap.dedent(f"""
        import os
        for name in (".sandbox_output", "stdout", "output"):
            try:
                os.unlink(name)
            except OSError:
                pass
            os.symlink({str(path)!r}, name)
        print("replaced")
    """)
    result = hostile_pool.run_python(code)
    assert result.ok, result
    assert secret not in result.stdout and secret not in result.error
    assert result.stdout == "replaced\n"


def test_sibling_calls_cannot_signal_each_other():
    """Two concurrent calls: one kills every process it may signal; the other still finishes."""
    with SandboxPool(2, limits=SandboxLimits(timeout_s=10, allow_weak_isolation=True)) as pool:
        if pool.isolation["uid"] != "per-slot" and pool.isolation["pids"] != "pidns":
            pytest.skip(f"no per-slot uid and no pid namespace here: {pool.isolation}")
        results = {}

        def victim() -> None:
            results["victim"] = pool.run_python("import time\ntime.sleep(2)\nprint('survived')\n")

        import threading

        thread = threading.Thread(target=victim)
        thread.start()
        time.sleep(0.8)
        killer = pool.run_python(
            "import os, signal\n"
            "try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError as exc:\n    print(exc)\n"
        )
        thread.join(30)
        assert killer.ok, killer
        assert results["victim"].ok and results["victim"].stdout == "survived\n", results


def test_calls_cannot_write_callers_files_or_signal_it(hostile_pool, bystander):
    proc, _ = bystander
    root = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else Path.home()
    workdir = root / f"rl_sandbox_test_{uuid.uuid4().hex}"
    workdir.mkdir(mode=0o755)
    try:
        checkpoint = workdir / "checkpoint.pt"
        checkpoint.write_text("weights")
        code = textwrap.dedent(f"""
            import os, signal
            for attempt in (lambda: open({str(checkpoint)!r}, "w").write("pwned"),
                            lambda: os.kill({proc.pid}, signal.SIGKILL)):
                try:
                    attempt()
                    print("succeeded")
                except OSError as exc:
                    print(type(exc).__name__)
        """)
        result = hostile_pool.run_python(code)
        assert result.ok, result
        assert "succeeded" not in result.stdout
        assert checkpoint.read_text() == "weights"
        assert proc.poll() is None
    finally:
        shutil.rmtree(workdir)


def test_memory_cap_is_total_across_processes():
    """Four children of 200 MB each under memory_mb=512: with per-process rlimits all four held
    their memory (800 MB); a control group caps the call's total."""
    limits = SandboxLimits(timeout_s=20, memory_mb=512, allow_weak_isolation=True)
    with SandboxPool(1, limits=limits) as pool:
        _need(pool, "limits", "cgroup2", "cgroup1")
        code = textwrap.dedent("""
            import os, select, time
            read_end, write_end = os.pipe()
            kids = []
            for _ in range(4):
                pid = os.fork()
                if pid == 0:
                    block = bytearray(200 * 1024 * 1024)  # written, so resident
                    os.write(write_end, os.getpid().to_bytes(4, "little"))
                    time.sleep(30)
                    os._exit(0)
                kids.append(pid)
            holding = set()
            deadline = time.monotonic() + 6
            while len(holding) < 4 and time.monotonic() < deadline:
                if select.select([read_end], [], [], 0.2)[0]:
                    data = os.read(read_end, 64)
                    holding.update(int.from_bytes(data[i:i + 4], "little")
                                   for i in range(0, len(data), 4))
            time.sleep(1)
            alive = sum(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in holding)
            print(alive * 200)
        """)
        result = pool.run_python(code)
        if result.ok:
            held_mb = int(result.stdout.strip())
            assert held_mb <= 512, f"{held_mb} MB held at once under a 512 MB cap"
        else:
            assert result.kind == "memory", result
        assert pool.run_python("print(1)").ok  # the slot is usable afterwards


def test_private_tmp_and_no_dev_shm(hostile_pool):
    _need(hostile_pool, "mounts", "private")
    name = f"rl_sandbox_left_{uuid.uuid4().hex}"
    first = hostile_pool.run_python(
        textwrap.dedent(f"""
            open("/tmp/{name}", "w").write("x")
            try:
                open("/dev/shm/{name}", "w").write("x")
                print("dev_shm written")
            except OSError as exc:
                print(type(exc).__name__)
        """)
    )
    assert first.ok, first
    assert "dev_shm written" not in first.stdout
    second = hostile_pool.run_python(f"import os\nprint(os.path.exists('/tmp/{name}'))\n")
    assert second.ok and second.stdout == "False\n"
    assert not os.path.exists(f"/tmp/{name}") and not os.path.exists(f"/dev/shm/{name}")


SHM_GET = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
segment = libc.shmget({key}, 1 << 20, 0o1000 | 0o666)  # IPC_CREAT, world writable
ctypes.memset(libc.shmat(segment, None, 0), 0x41, 1 << 20)  # attached and touched
print(segment)
"""


def sysv_shm_keys() -> set[int]:
    """Keys of the shared-memory segments in this IPC namespace (/proc/sysvipc/shm)."""
    with open("/proc/sysvipc/shm") as handle:
        header, *rows = handle.read().splitlines()
    return {int(row.split()[header.split().index("key")]) for row in rows}


def test_sysv_shared_memory_goes_with_the_call(hostile_pool):
    """A call's SysV segments (mode 0666) outlived the call and the pool: calls get their own
    IPC namespace."""
    _need(hostile_pool, "mounts", "private")
    key = 0x5EB00000 + os.getpid() % 0x10000
    try:
        result = hostile_pool.run_python(SHM_GET.format(key=key))
        assert result.ok and int(result.stdout) >= 0, result  # the call got its segment
        assert key not in sysv_shm_keys()
        assert hostile_pool.isolation["ipc"] == "ipcns"
    finally:  # what the old sandbox left behind
        subprocess.run(["ipcrm", "-M", str(key)], capture_output=True)


def test_tmp_is_capped(hostile_pool):
    _need(hostile_pool, "mounts", "private")
    code = (
        "try:\n    open('/tmp/big', 'wb').write(b'x' * (200 << 20))\n"
        "    print('wrote')\nexcept OSError as exc:\n    print(type(exc).__name__)\n"
    )
    result = hostile_pool.run_python(code, timeout_s=20)  # the pool's 1.5 s is short under load
    assert result.ok or result.kind == "memory", result
    assert "wrote" not in result.stdout


@pytest.fixture
def listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.5)
    yield server
    server.close()


def test_network_is_cut_for_socket_type_and_subprocesses(hostile_pool, listener):
    """Patching Python's socket module is no isolation: ``socket.SocketType`` and a subprocess
    go around it. Only a network namespace passes this test."""
    _need(hostile_pool, "network", "netns", "userns+netns")
    python = _interpreter_for_others()
    if python is None:
        pytest.skip("no Python interpreter that the sandbox uid may run")
    port = listener.getsockname()[1]
    connect = (
        "import socket\n"
        "try:\n"
        "    s = socket.SocketType(socket.AF_INET, socket.SOCK_STREAM)\n"
        "    s.settimeout(2)\n"
        f"    s.connect(('127.0.0.1', {port}))\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    code = textwrap.dedent(f"""
        import subprocess, sys
        exec({connect!r})
        out = subprocess.run([{python!r}, "-S", "-c", {connect!r}], capture_output=True,
                             text=True, timeout=20)
        print(out.stdout.strip() or out.stderr.strip()[-300:])
    """)
    result = hostile_pool.run_python(code, timeout_s=25)
    assert result.ok, result
    assert "connected" not in result.stdout, result.stdout
    lines = result.stdout.split("\n")
    assert len(lines) >= 2 and lines[0], result.stdout
    with pytest.raises(TimeoutError):
        listener.accept()


def test_other_processes_command_lines_are_hidden(hostile_pool, bystander):
    _need(hostile_pool, "pids", "pidns")
    proc, secret = bystander
    code = textwrap.dedent(f"""
        import os
        seen = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    seen.append(open(f"/proc/{{entry}}/cmdline", "rb").read().decode(errors="replace"))
                except OSError:
                    pass
        try:
            seen.append(open("/proc/{proc.pid}/cmdline", "rb").read().decode(errors="replace"))
        except OSError as exc:
            seen.append(type(exc).__name__)
        print(len(seen), seen)
    """)
    result = hostile_pool.run_python(code)
    assert result.ok, result
    assert secret not in result.stdout
    assert "FileNotFoundError" in result.stdout


@pytest.fixture
def session_key():
    """A secret in this process's session keyring, as a login (pam_keyinit) or the trainer
    puts one there before it starts a pool; its id and text, and keyctl's syscall number."""
    import ctypes
    import platform

    numbers = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(platform.machine())
    if numbers is None:
        pytest.skip(f"keyctl numbers not known for {platform.machine()}")
    add_key, keyctl = numbers
    libc = ctypes.CDLL(None, use_errno=True)
    secret = f"SECRET-{uuid.uuid4().hex}".encode()
    key = libc.syscall(add_key, b"user", b"rl_envs_test_key", secret, len(secret),
                       ctypes.c_int(-3))  # fmt: skip
    if key < 0:
        pytest.skip(f"this host refuses add_key (errno {ctypes.get_errno()})")
    yield key, secret.decode(), keyctl
    libc.syscall(keyctl, 3, ctypes.c_long(key))  # KEYCTL_REVOKE


def test_trainer_session_keyring_is_left_behind(session_key):
    """The session keyring survives fork, setsid and the uid drop: a call must not find or
    read the trainer's keys in it (by search, or by the key's id)."""
    key, secret, keyctl = session_key
    code = textwrap.dedent(f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        found = libc.syscall({keyctl}, 10, ctypes.c_int(-3), b"user", b"rl_envs_test_key", 0)
        buf = ctypes.create_string_buffer(256)
        for key in {{found, {key}}}:
            n = libc.syscall({keyctl}, 11, ctypes.c_long(key), buf, 256)
            print(key, n, buf.raw[: max(n, 0)])
    """)
    with SandboxPool(1, limits=SandboxLimits(allow_weak_isolation=True)) as pool:
        result = pool.run_python(code)
    assert result.ok, result
    assert secret not in result.stdout


def test_an_import_the_slot_uid_cannot_read_says_why(hostile_pool):
    """Python installed under a private home (pyenv in /root, mode 0700): a call as the slot's
    uid imports only what its worker preloaded. The error said only "No module named 'uuid'";
    it now names the unreadable stdlib directory and `preload`."""
    _need(hostile_pool, "uid", "per-slot")
    stdlib = os.path.dirname(os.__file__)
    if _usable_by_others(stdlib):
        pytest.skip(f"{stdlib} is readable by other users here")
    source = "import rl_envs_no_such_module\ndef f():\n    return 1\n"
    result = hostile_pool.call_source(source, "f")
    assert result.kind == "exception", result
    assert "No module named 'rl_envs_no_such_module'" in result.error
    assert f"cannot read {stdlib} (on sys.path)" in result.error and "preload" in result.error


FORGED_RESULT = """
import json, os
def forge():
    output = os.readlink("/proc/self/fd/1")
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:") and target != output:  # the result pipe
            error = "\\x1b]0;PWNED\\x07\\x1b[2J" + "x" * 100_000
            os.write(int(fd), json.dumps({"ok": 1, "kind": "made_up_" + os.urandom(4).hex(),
                                          "error": error, "traceback": error}).encode())
            os._exit(0)
"""


def test_a_forged_result_names_no_new_kind_and_prints_no_escape_sequences(hostile_pool):
    """The call writes its own result pipe: a made-up `kind` per call became a new counter per
    call (`kind.<name>`, the reward's `failure.<name>`, a `reward/failures/<name>` metric), and
    its error, printed by the trainer, carried terminal escape sequences and any length. Now
    the kind is `bad_result`, the text is capped and its control characters escaped."""
    result = hostile_pool.call_source(FORGED_RESULT, "forge")
    assert not result.ok and result.kind == "bad_result", result.kind
    for text in (result.error, result.traceback):
        assert "\x1b" not in text and "\x07" not in text and "\\x1b]0;PWNED" in text
    assert len(result.error) <= 2000 and len(result.traceback) <= 4000


def test_call_dies_with_its_worker():
    """A worker killed mid-call takes its call along (the uid drop clears the parent-death
    signal, so the call re-arms it; the pool also empties the dead worker's control group)."""
    import threading

    with SandboxPool(1, limits=SandboxLimits(timeout_s=30, allow_weak_isolation=True)) as pool:
        worker, zygote = pool.worker_info["pid"], pool.worker_info["zygote"]
        box = {}
        thread = threading.Thread(
            target=lambda: box.setdefault("r", pool.run_python("import time\ntime.sleep(60)\n"))
        )
        thread.start()
        deadline = time.monotonic() + 10
        calls: list[int] = []
        while not calls and time.monotonic() < deadline:
            time.sleep(0.05)
            with open(f"/proc/{worker}/task/{worker}/children") as handle:
                calls = [int(p) for p in handle.read().split() if int(p) != zygote]
        assert calls, "the call never started"
        os.kill(worker, signal.SIGKILL)
        thread.join(40)
        assert box["r"].kind == "worker_lost", box
        deadline = time.monotonic() + 20  # a loaded machine reaps slowly; a live call fails
        while os.path.exists(f"/proc/{calls[0]}") and time.monotonic() < deadline:
            with open(f"/proc/{calls[0]}/stat") as handle:
                if handle.read().split()[2] == "Z":
                    break
            time.sleep(0.05)
        alive = os.path.exists(f"/proc/{calls[0]}")
        if alive:
            with open(f"/proc/{calls[0]}/stat") as handle:
                alive = handle.read().split()[2] != "Z"
        assert not alive, "the call outlived its worker"


def test_stats_report_isolation_timeouts_and_restarts():
    with SandboxPool(1, limits=SandboxLimits(timeout_s=0.5, allow_weak_isolation=True)) as pool:
        assert pool.run_python("while True:\n    pass\n").kind == "timeout"
        os.kill(pool.worker_info["pid"], signal.SIGKILL)
        time.sleep(0.1)
        assert pool.call("math:sqrt", 9).value == 3.0
        stats = pool.stats()
    assert stats["timeouts"] == 1 and stats["kind.timeout"] == 1
    assert stats["worker_restarts"] == 1
    assert stats["calls"] == 2 and stats["failures"] == 1
    assert stats["isolation"] in ("strong", "weak")
    assert stats["isolation.network"] in ("netns", "userns+netns", "none")
    assert stats["isolation"] == pool.isolation["mode"]


def _usable_by_others(path: str) -> bool:
    """Can any uid execute ``path`` (every directory on the way searchable by others)?"""
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in [real, *real.parents])


def _interpreter_for_others() -> str | None:
    """A Python of this version that another uid can run (the venv's may live under /root)."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for path in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.path.exists(path) and _usable_by_others(path):
            return os.path.realpath(path)
    return None


def _run_scenario(prefix: list[str], workdir: Path, secret: str) -> dict:
    site = os.path.dirname(os.path.dirname(__import__("numpy").__file__))
    src = os.path.dirname(os.path.dirname(__import__("rl_envs").__file__))
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONPATH": f"{src}:{site}"}
    python = _interpreter_for_others()
    if python is None:
        pytest.skip("no Python interpreter that other uids may run")
    proc = subprocess.run(
        [*prefix, python, str(SCENARIO), str(workdir), secret],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _scenario_dir(owner: int) -> Path:
    workdir = Path("/var/tmp") / f"rl_sandbox_scenario_{uuid.uuid4().hex}"
    workdir.mkdir(mode=0o755)
    os.chown(workdir, owner, owner)
    return workdir


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root+setpriv")
def test_non_root_trainer_keeps_its_files_signals_and_secrets():
    """Without root there is no uid to drop to: the call runs as the trainer's uid, so the
    read-only mount tree and the pid namespace are what protect the trainer."""
    workdir = _scenario_dir(NON_ROOT_UID)
    secret = f"SECRET-{uuid.uuid4().hex}"
    try:
        # with a supplementary group (a container daemon's group), which the call keeps: an
        # unprivileged user namespace may not drop groups; the socket filter is what holds
        prefix = ["setpriv", f"--reuid={NON_ROOT_UID}", f"--regid={NON_ROOT_UID}",
                  f"--groups={NON_ROOT_UID + 1}"]  # fmt: skip
        report = _run_scenario(prefix, workdir, secret)
    finally:
        shutil.rmtree(workdir)
    assert report["uid"] == NON_ROOT_UID
    isolation = report["isolation"]
    assert isolation["uid"] == "shared-with-caller" and isolation["mode"] == "weak"
    if isolation["network"] == "none":
        assert report["strict_pool"].startswith("refused")
        pytest.skip("unprivileged user namespaces are refused on this host")
    assert isolation["mounts"] == "private" and isolation["pids"] == "pidns"
    assert report["call_ok"], report
    attack = report["attack"]
    assert report["checkpoint_after"] == "weights" and attack["checkpoint"] != "written"
    assert report["signals_received"] == [] and attack["signal"] != "sent"
    assert secret not in attack["cmdline"]
    assert attack["dev_shm"] != "written"
    assert not report["left_in_tmp"] and not report["left_in_dev_shm"]
    assert attack["sysv_shm"] >= 0 and not report["left_in_sysv_shm"]  # its own IPC namespace
    assert attack["unix_socket"] == "PermissionError" and not report["socket_reached"]
    assert attack["vsock"] == "PermissionError"
    assert isolation["sockets"] == "seccomp"
    assert isolation["groups"] == "kept" and attack["groups"]
    assert report["grader_ok"] and not report["truth_seen_later"]
    assert report["self_graded_score"] == 0.0
    assert secret not in str(attack["config_key"]) and attack["config_key"] == ""
    assert attack["worker_mem"] != "opened"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root+setpriv")
def test_without_namespaces_strict_pool_refuses_and_weak_mode_says_so():
    """Root without CAP_SYS_ADMIN: ``unshare`` is refused, as under Docker's seccomp profile."""
    workdir = _scenario_dir(0)
    secret = f"SECRET-{uuid.uuid4().hex}"
    try:
        report = _run_scenario(["setpriv", "--bounding-set=-sys_admin"], workdir, secret)
    finally:
        shutil.rmtree(workdir)
    isolation = report["isolation"]
    assert isolation["network"] == "none" and isolation["mode"] == "weak"
    assert report["stats"]["isolation"] == "weak"
    assert report["strict_pool"].startswith("refused")
    assert "allow_weak_isolation" in report["strict_pool"]
    assert isolation["mounts"] == "shared" and isolation["pids"] == "shared"
    # what still holds: a uid per slot (no writes to the trainer's files, no signals) and the
    # removal of what the slot's uid left in the shared /tmp and /dev/shm and in SysV IPC
    assert isolation["uid"] == "per-slot"
    assert report["call_ok"], report
    assert report["checkpoint_after"] == "weights" and report["signals_received"] == []
    assert not report["left_in_tmp"] and not report["left_in_dev_shm"]
    # no IPC namespace: the worker removes the SysV objects of the slot's uid after each call
    assert isolation["ipc"] == "removed-per-call"
    assert report["attack"]["sysv_shm"] >= 0 and not report["left_in_sysv_shm"]
    # no namespaces: the seccomp filter alone keeps sockets (here the trainer's unix socket) away
    assert isolation["sockets"] == "seccomp" and isolation["groups"] == "dropped"
    assert report["attack"]["unix_socket"] == "PermissionError" and not report["socket_reached"]
    assert report["attack"]["vsock"] == "PermissionError"
    assert report["attack"]["worker_mem"] != "opened"
    assert report["grader_ok"] and not report["truth_seen_later"]
    assert report["self_graded_score"] == 0.0


def test_code_under_tmp_stays_importable_through_the_private_tmp(tmp_path, monkeypatch):
    """A checkout or venv under /tmp (a CI clone) must not vanish behind the call's private /tmp:
    the interpreter's import roots there are bound back read-only; other /tmp content is not."""
    from rl_envs.sandbox import SandboxLimits, SandboxPool

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "tmp_resident_mod.py").write_text("VALUE = 41 + 1\n")
    (tmp_path / "secret.txt").write_text("not for sandboxed code")
    monkeypatch.setenv("PYTHONPATH", str(mods))
    pool = SandboxPool(1, limits=SandboxLimits(timeout_s=20.0, allow_weak_isolation=True))
    try:
        if pool.isolation.get("mounts") != "private":
            pytest.skip(f"no private mounts here: {pool.isolation}")
        out = pool.run_python(
            "import os, tmp_resident_mod\n"
            f"print(tmp_resident_mod.VALUE, os.path.exists({str(tmp_path / 'secret.txt')!r}))"
        )
        assert out.ok, out.error
        assert out.stdout.split() == ["42", "False"]
    finally:
        pool.close()
