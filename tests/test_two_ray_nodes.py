"""Two real Ray nodes on this machine (ray.cluster_utils starts a raylet per node, each with its
own address and custom resource): `node_resources` + device_mapping pin training to one node and
rollout to the other, the weight sync meets on the trainer node's address and carries the
trainer's exact weights across (also into a generation in flight: partial rollout), and
apps/agentic trains a few steps on that layout.

The nodes listen on loopback addresses (127.0.0.1 for the rollout node, 127.0.0.2 for the trainer
node; RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray from replacing them by the network address),
so the test exposes nothing to the network while the trainer's address still differs from the
loopback default a hard-coded sync address would use."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "agentic"
TRAINER_IP, ROLLOUT_IP = "127.0.0.2", "127.0.0.1"
NODES = ["trainer_node", "rollout_node"]  # node 0 trains (device 0), node 1 rolls out (device 1)
LAYOUT = {
    "num_nodes": 2,
    "num_gpus_per_node": 1,
    "node_resources": NODES,
    "actor_train": {"device_mapping": [0]},
    "reference": {"device_mapping": [0]},
    "actor_infer": {"device_mapping": [1]},
}


@pytest.fixture()
def two_nodes(monkeypatch):
    from rl_runtime.cluster.ray_setup import set_ray_env_defaults

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    set_ray_env_defaults()
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    common = {"num_cpus": 2, "object_store_memory": 100 << 20, "include_dashboard": False}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**common, "node_ip_address": ROLLOUT_IP, "resources": {NODES[1]: 1}},
    )
    try:
        cluster.add_node(**common, node_ip_address=TRAINER_IP, resources={NODES[0]: 1})
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def _config(model: Path, out: Path) -> dict:
    return {
        "pretrain": str(model),
        "output_dir": str(out),
        "rollout_batch_size": 4,
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["FL"]},
        "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["FL"]},
        "custom_envs": {"FL": {"env_type": "frozen_lake", "max_steps": 2}},
        **LAYOUT,
        "actor_train": {
            **LAYOUT["actor_train"],
            "training_args": {"per_device_train_batch_size": 2},
        },
    }


def _wait_for_first_tokens(infer, timeout_s: float = 300.0) -> None:
    """Until the engine has decoded a few tokens of the generation in flight."""
    deadline = time.monotonic() + timeout_s
    while infer.call_rank0("engine_stats").get("generated_tokens", 0.0) < 8:
        assert time.monotonic() < deadline, "the generation did not start"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_training_and_rollout_pinned_to_two_ray_nodes(two_nodes, tmp_path):
    import ray
    import torch

    from rl_config.records import GenerationRequest, SamplingParams
    from rl_config.schema import ExperimentConfig
    from rl_rollout.tiny_model import build_tiny_model
    from rl_runtime.cluster.cluster import Cluster, WeightSync
    from rl_runtime.cluster.ray_setup import RayOptions
    from rl_runtime.compose import compose
    from rl_runtime.compose.roles import role_specs

    model = build_tiny_model(tmp_path / "tiny_model", seed=0)
    components = compose(ExperimentConfig.model_validate(_config(model, tmp_path / "inproc")))
    settings = components.cluster
    assert settings.node_resources == tuple(NODES) and settings.devices_per_node == 1
    specs = [s for s in role_specs(components, str(model)) if s.role != "reference"]
    ray.init(address=two_nodes.address)
    nodes = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert set(nodes) == {TRAINER_IP, ROLLOUT_IP}
    cluster = Cluster.start(
        specs,
        num_devices=settings.num_devices,
        ray_options=RayOptions(address=two_nodes.address),
        rpc_timeout=600,
        devices_per_node=settings.devices_per_node,
        node_resources=settings.node_resources,
    )
    try:
        # pinned: each role's workers run on the node that advertises its node resource
        assert cluster["actor_train"].call_all("node_address") == [(nodes[TRAINER_IP], TRAINER_IP)]
        assert cluster["actor_infer"].call_all("node_address") == [(nodes[ROLLOUT_IP], ROLLOUT_IP)]
        sync = WeightSync(cluster["actor_train"], cluster["actor_infer"], mode="broadcast")
        metrics = sync.sync(version=1)
        assert sync.host == TRAINER_IP and sync.cross_node  # the trainer node's address
        assert metrics["sync/cross_node"] == 1.0 and metrics["sync/bytes"] > 0
        assert metrics["sync/shared_memory"] == 0.0  # across nodes: broadcast
        trainer = cluster["actor_train"].call_rank0("state_dict_for_check")
        engine = cluster["actor_infer"].call_rank0("state_dict_for_check")
        assert trainer.keys() <= engine.keys()
        assert all(torch.equal(trainer[k], engine[k]) for k in trainer)
        # partial rollout across nodes: the next sync lands while the engine generates (the
        # rollout actor takes two calls at once); the generation goes on under version 2
        infer = cluster["actor_infer"]
        long = GenerationRequest(
            request_id="long",
            prompt_ids=[5, 6, 7],
            sampling=SamplingParams(n=4, max_new_tokens=1500, ignore_eos=True, seed=1),
        )
        pending = infer.submit("generate", [long])
        _wait_for_first_tokens(infer)  # not a fixed sleep: a loaded machine starts late
        sync.sync(version=2)
        for result in infer.wait(pending, "generate")[0]:
            k = result.token_versions.count(1)
            assert 1 <= k < len(result.output_ids) == 1500, k
            assert result.token_versions == [1] * k + [2] * (1500 - k)
    finally:
        cluster.shutdown()
        ray.shutdown()

    # the app on the same two nodes: the config keys alone pin the roles; a few training steps
    out = tmp_path / "app"
    overrides = {
        "output_dir": out,
        "logging_dir": out / "logs",
        "render_save_dir": out / "render",
        "checkpoint_config.output_dir": out / "ckpt",
        "pretrain": model,
        "track_with": "stdout",
        "max_steps": 2,
        "eval_steps": 2,
        "save_steps": 1000,
        "rollout_batch_size": 4,
        "train_env_manager.num_env_groups": 2,
        "train_env_manager.group_size": 2,
        "train_env_manager.num_groups_partition": "[2]",
        "val_env_manager.num_env_groups": 2,
        "val_env_manager.num_groups_partition": "[2]",
        "actor_train.training_args.per_device_train_batch_size": 2,
        "actor_train.training_args.gradient_accumulation_steps": 2,
        "agentic_app.warmup.steps": 0,
        "agentic_app.eval_before_training": "false",
        "agentic_app.check_sync_weights": "true",
        "num_nodes": 2,
        "num_gpus_per_node": 1,
        "node_resources": json.dumps(NODES),
        "actor_train.device_mapping": "[0]",
        "reference.device_mapping": "[0]",
        "actor_infer.device_mapping": "[1]",
    }
    cmd = [sys.executable, str(APP), *(f"{k}={v}" for k, v in overrides.items())]
    env = {**os.environ, "RAY_ADDRESS": two_nodes.address}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0 and "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"])
        assert r["sync/cross_node"] == 1.0  # trainer and engine on different Ray nodes
        assert r["sync/max_abs_diff"] == 0.0  # the engine holds exactly the trainer's weights
