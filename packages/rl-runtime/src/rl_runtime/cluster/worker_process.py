"""What every worker class Ray runs as an actor (or the runtime builds in-process with `--no-ray`)
shares: the process setup (`_init_process`) and weight-sync metrics as plain floats. Arguments and
results of workers are plain data (dicts of CPU tensors, msgspec records), so they travel through
Ray's object store."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import torch

from rl_runtime.cluster.worker_group import DRIVER_CWD_ENV
from rl_runtime.state.seeds import seed_globals


def _init_process(dist_env: Mapping[str, str], seed: int) -> None:
    """Working directory, environment, threads and every global RNG stream of a worker process
    (torch, python, numpy): unseeded, python's and numpy's would start from OS entropy in each
    process, so a run could not be repeated nor a resumed worker match an uninterrupted one.
    Torch's threads: ``OMP_NUM_THREADS``, which the cluster sets for its workers
    (rl_runtime.cluster.ray_setup.worker_threads), else 1.

    A Ray actor starts in the directory its cluster was started from, which is not the driver's
    after a `chdir` or on a cluster joined through RAY_ADDRESS: it enters the driver's
    (`DRIVER_CWD_ENV`), so that a relative path in the config (checkpoints, records, outputs,
    a key file) names the same directory in the driver and in every worker. A node without that
    directory keeps its own (relative paths there need a shared file system anyway)."""
    driver_cwd = os.environ.get(DRIVER_CWD_ENV)
    if driver_cwd and os.path.isdir(driver_cwd):
        os.chdir(driver_cwd)
    os.environ.update({k: str(v) for k, v in dist_env.items()})
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS") or 1)))
    seed_globals(seed)


def in_ray_actor() -> bool:
    """Whether this code runs in a Ray actor's process, which the worker group kills
    (`ray.kill`) right after its `shutdown` call; False in the driver and its `--no-ray` worker
    threads."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    return ray.get_runtime_context().get_actor_id() is not None


def _sync_metrics(metrics: Any) -> dict[str, float]:
    return {
        "bytes": float(getattr(metrics, "bytes", 0)),
        "seconds": float(getattr(metrics, "seconds", 0.0)),
        "gbps": float(getattr(metrics, "gbps", 0.0)),
        "num_buckets": float(getattr(metrics, "num_buckets", 0)),
        "version": float(getattr(metrics, "version", -1)),
    }
