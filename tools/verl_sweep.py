"""Dry-run verl's own example scripts through the translator (``--verl``) and print a verdict per
script, the count that plan, and each refusal reason with its count.

    uv run python tools/verl_sweep.py /path/to/verl            # a checkout, or a bare git dir
    uv run python tools/verl_sweep.py VERL --rev HEAD -k gmpo  # scripts whose path contains gmpo

The scripts are ``examples/*_trainer/*.sh`` without "megatron" in their path. Each runs under
bash with ``python``/``python3`` (and the cluster commands around them: srun, conda, ray,
nvidia-smi, ...) replaced by a shim that records the arguments, in a temporary copy of the
examples with ``HOME`` in a temporary folder; nothing the scripts name is run or downloaded.
The recorded ``python -m <verl entry> KEY=VALUE ...`` then runs as ``apps/rlvr --verl`` (main_ppo)
or ``apps/async --verl -m <entry>`` (the asynchronous recipes) with ``--dry-run``, the only
changes those a user makes here: data files -> a small GSM8K-format parquet, model paths -> a
tiny model built locally, checkpoint directory -> a temporary one, ``trainer.device=cpu``.

A script "plans" when the dry run exits 0, or exits 1 with only this host's preflight problems
(more devices than this host has, ...): the translation and the composed config were accepted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIMMED = ("python", "python3", "srun", "conda", "ray", "nvidia-smi", "sleep", "huggingface-cli",
           "hf", "scontrol", "pip", "wandb", "hostname")  # fmt: skip
"""Commands the scripts call that the shim stands in for (it records a verl entry's arguments)."""

SCRIPT_ENV = {"SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_PER_NODE": "8", "SLURM_CPUS_PER_TASK": "16",
              "SLURM_JOB_NODELIST": "node0", "SLURM_NNODES": "1", "HDFS_ROOT": "/data",
              "DATA_ROOT": "/data"}  # fmt: skip
"""What a one-node Slurm allocation sets, and the data root some scripts ask their user for."""

HOST_PROBLEM_KEYS = ("pretrain", "placement", "data_args.file_name", "data_args.eval_file_name",
                     "model_name_or_path", "reward_pretrain")  # fmt: skip
"""Preflight problems of this host, not of the config (a dry run still prints the whole plan)."""

MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path",
              "actor_rollout_ref.model.tokenizer_path", "critic.model.tokenizer_path",
              "reward_model.model.input_tokenizer")  # fmt: skip

_SHIM = """#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
if name == "scontrol":
    print("node0")
elif name == "hostname":
    print("127.0.0.1")
elif any(a.startswith(("verl.", "recipe.")) for a in args):
    with open(os.environ["VERL_SWEEP_LOG"], "a") as log:
        log.write(json.dumps({{"command": name, "argv": args}}) + "\\n")
"""


@dataclass
class Call:
    """A verl entry a script runs: its module and its arguments (Hydra overrides and flags)."""

    entry: str
    argv: list[str]


@dataclass
class Verdict:
    script: str
    planned: bool
    reasons: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)


def scripts(examples: Path, contains: str = "") -> list[Path]:
    """``examples/*_trainer/*.sh`` without megatron, sorted (``contains``: a substring filter)."""
    found = sorted(p for p in examples.glob("*_trainer/*.sh") if "megatron" not in p.name.lower())
    return [p for p in found if contains in str(p.relative_to(examples))]


def extract_examples(verl: Path, rev: str, into: Path) -> Path:
    """A folder holding verl's tree (``examples`` and the files the scripts name): ``verl`` itself
    when it is a checkout, else ``git archive rev`` of a (bare) git directory unpacked ``into``."""
    if (verl / "examples").is_dir():
        return verl
    data = subprocess.run(
        ["git", f"--git-dir={verl}", "archive", rev], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def capture(script: Path, tree: Path, home: Path, shims: Path) -> list[Call]:
    """The verl entries ``script`` runs (bash with the shims first on PATH; 30 s at most)."""
    log = home / "calls.jsonl"
    log.unlink(missing_ok=True)
    env = {
        "PATH": f"{shims}:/usr/bin:/bin",
        "HOME": str(home),
        "VERL_SWEEP_LOG": str(log),
        "BASH_ENV": str(shims / "bash_env.sh"),
        "LANG": "C.UTF-8",
        **SCRIPT_ENV,
    }
    subprocess.run(["bash", str(script)], cwd=tree, env=env, capture_output=True, timeout=30,
                   stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    calls = []
    for line in log.read_text().splitlines() if log.is_file() else []:
        argv = json.loads(line)["argv"]
        if "-m" in argv:  # python -m MODULE ...; srun ... python3 -m MODULE ...
            at = argv.index("-m")
            calls.append(Call(argv[at + 1], argv[at + 2 :]))
    return calls


_BASH_ENV = """source() { if [ -f "$1" ]; then builtin source "$@"; fi; }
ulimit() { builtin ulimit "$@" 2>/dev/null || true; }
"""
"""Read by bash before a script: sourcing a file this host lacks (Ascend's set_env.sh) and
raising a limit this user may not raise are no-ops."""


def write_shims(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bash_env.sh").write_text(_BASH_ENV)
    for name in SHIMMED:
        shim = folder / name
        shim.write_text(_SHIM.format(python=sys.executable))
        shim.chmod(0o755)
    return folder


def localise(argv: Iterable[str], paths: dict[str, str]) -> list[str]:
    """The arguments with the user's local paths: data files, model paths, checkpoint folder;
    then ``trainer.device=cpu``. ``paths``: ``model``, ``rm`` (a reward model), ``train``,
    ``test``, ``ckpt``."""
    out = []
    for arg in argv:
        key, sep, _ = arg.lstrip("+").partition("=")
        if sep and key == "data.train_files":
            arg = f"data.train_files={paths['train']}"
        elif sep and key == "data.val_files":
            arg = f"data.val_files={paths['test']}"
        elif sep and key in MODEL_KEYS:
            arg = f"{arg.partition('=')[0]}={paths['model']}"
        elif sep and key == "reward_model.model.path":
            arg = f"{arg.partition('=')[0]}={paths['rm']}"
        elif sep and key == "trainer.default_local_dir":
            arg = f"trainer.default_local_dir={paths['ckpt']}"
        elif sep and key == "trainer.device":
            continue
        out.append(arg)
    return [*out, "trainer.device=cpu"]


def app_command(call: Call, paths: dict[str, str]) -> tuple[str, list[str]]:
    """The app and its arguments for a verl ``call`` (``--dry-run`` included)."""
    from rl_config.verl_translate import ENTRIES, MAIN_PPO

    mode = ENTRIES.get(call.entry.removesuffix(".py").replace("/", "."), "sync")
    app = "rlvr" if mode == "sync" else "async"
    head = ["--verl"] + ([] if call.entry == MAIN_PPO else ["-m", call.entry])
    return app, [*head, *localise(call.argv, paths), "--dry-run"]


def _app_main(name: str) -> Callable[[list[str]], int]:
    spec = importlib.util.spec_from_file_location(
        f"{name}_sweep_main", ROOT / "apps" / name / "__main__.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def reasons_of(code: int, err: str) -> list[str]:
    """[] when a dry run planned (exit 0, or only host preflight problems), else its reasons:
    one per refused key (``key: why``), or the error's first line."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    if code == 0:
        return []
    items = [ln[2:] for ln in lines if ln.startswith("- ")]
    host = all(any(k in i.split(":", 1)[0] for k in HOST_PROBLEM_KEYS) for i in items)
    if lines and lines[0].startswith("preflight error") and items and host:
        return []
    if items:
        return items
    return lines[:1] or [f"exit {code}"]


def dry_run(app: str, argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = _app_main(app)(argv)
        except Exception as exc:  # a crash is a verdict too
            print(f"crash: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 2
    return code, err.getvalue()


def reason_kind(reason: str) -> str:
    """What a refusal reason says without the key and its value (for counting by script)."""
    key, _, why = reason.partition(":")
    why = why.strip()
    if why.startswith("verl key ="):
        why = why.split(":", 1)[1].strip() if ":" in why else why
    return why or key.strip()


def make_inputs(root: Path) -> dict[str, str]:
    """A tiny model, a tiny reward model and GSM8K-format parquet files (8192 training rows: the scripts' largest
    batch, 4096 prompts, makes two steps an epoch; 8 held-out problems)."""
    from rl_envs.tasks.convert import convert_file
    from rl_rollout.tiny_model import build_tiny_model
    from rl_rollout.tiny_reward_models import build_tiny_reward_model

    model = build_tiny_model(root / "model")
    rm = build_tiny_reward_model(root / "rm")
    for split, n in (("train", 8192), ("test", 8)):
        rows = [
            {"question": f"What is {i} plus 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
            for i in range(n)
        ]
        (root / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        convert_file(str(root / f"{split}.jsonl"), str(root / f"{split}.parquet"), "gsm8k", split)
    return {
        "model": str(model),
        "rm": str(rm),
        "train": str(root / "train.parquet"),
        "test": str(root / "test.parquet"),
        "ckpt": str(root / "ckpt"),
    }


def sweep(verl: Path, rev: str = "HEAD", contains: str = "") -> list[Verdict]:
    os.environ["RL_DEVICE"] = "cpu"
    with tempfile.TemporaryDirectory(prefix="verl_sweep_") as tmp:
        root = Path(tmp)
        tree = extract_examples(verl, rev, root / "verl")
        shims = write_shims(root / "shims")
        home = root / "home"
        home.mkdir()
        paths = make_inputs(root)
        cwd = Path.cwd()
        verdicts = []
        try:
            os.chdir(root)
            for script in scripts(tree / "examples", contains):
                name = str(script.relative_to(tree))
                calls = capture(script, tree, home, shims)
                if not calls:
                    verdicts.append(Verdict(name, False, ["the script runs no verl entry module"]))
                    continue
                app, argv = app_command(calls[-1], paths)
                code, err = dry_run(app, argv)
                reasons = reasons_of(code, err)
                verdicts.append(Verdict(name, not reasons, reasons, [app, *argv]))
        finally:
            os.chdir(cwd)
        return verdicts


def report(verdicts: list[Verdict], verbose: bool = False) -> str:
    lines = []
    for v in verdicts:
        lines.append(f"{'plans  ' if v.planned else 'REFUSED'} {v.script}")
        for reason in v.reasons:
            lines.append(f"          {reason}")
        if verbose and v.command:
            lines.append(f"          $ uv run apps/{shlex.join(v.command)}")
    planned = sum(v.planned for v in verdicts)
    lines.append(f"\n{planned}/{len(verdicts)} scripts plan (dry-run)")
    kinds = Counter(k for v in verdicts for k in dict.fromkeys(map(reason_kind, v.reasons)))
    if kinds:
        lines.append("refusal reasons (scripts):")
        lines += [f"  {n:3d}  {kind}" for kind, n in kinds.most_common()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("verl", type=Path, help="verl's checkout, or its (bare) git directory")
    parser.add_argument("--rev", default="HEAD", help="the revision of a git directory")
    parser.add_argument("-k", default="", help="only scripts whose path contains this")
    parser.add_argument("-v", action="store_true", help="print each app command too")
    args = parser.parse_args(argv)
    verdicts = sweep(args.verl.expanduser().resolve(), args.rev, args.k)
    print(report(verdicts, args.v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
