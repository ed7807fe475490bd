from collections import defaultdict

import pytest

from rl_runtime.cluster.placement import NODE_RESOURCE_SHARE, plan_placement, worker_device_env


def test_roll_sokoban_layout_is_disaggregated():
    plan = plan_placement(
        {"actor_train": [0, 1], "actor_infer": [2], "reference": [3]},
        num_devices=4,
        device_kind="cuda",
        resource_name="GPU",
    )
    assert plan.roles["actor_train"].num_workers == 2
    assert not any(rp.is_colocated for rp in plan.roles.values())
    assert len(plan.groups) == 3
    train = plan.roles["actor_train"]
    assert [w.bundle_index for w in train.workers] == [0, 1]
    assert all(w.device_fraction == 1.0 for w in train.workers)
    assert plan.bundles(train.colocation_group) == [{"CPU": 1.0, "GPU": 1.0}] * 2


def test_overlapping_maps_are_colocated_with_fractional_shares():
    plan = plan_placement(
        {"actor_train": [0, 1], "actor_infer": [0, 1], "reference": [1], "critic": [2]},
        num_devices=3,
        device_kind="npu",
        resource_name="NPU",
    )
    train = plan.roles["actor_train"]
    assert set(train.colocated_with) == {"actor_infer", "reference"}
    assert plan.roles["critic"].colocated_with == ()
    # device 0 is shared by 2 roles, device 1 by 3
    assert [w.device_fraction for w in train.workers] == [pytest.approx(0.5), pytest.approx(1 / 3)]
    ref = plan.roles["reference"]
    assert ref.workers[0].bundle_index == 1
    assert plan.bundles(train.colocation_group) == [{"CPU": 1.0, "NPU": 1.0}] * 2


def test_cpu_bundles_have_no_accelerator_and_cpu_shares_add_up():
    plan = plan_placement(
        {"actor_train": [0], "actor_infer": [0]}, num_devices=1, cpu_per_bundle=0.5
    )
    assert plan.bundles(0) == [{"CPU": 0.5}]
    total = sum(w.cpus for rp in plan.roles.values() for w in rp.workers)
    assert total == pytest.approx(0.5)


def test_multi_device_workers_get_one_bundle_each():
    plan = plan_placement(
        {"actor_infer": [0, 1, 2, 3]},
        num_devices=4,
        resource_name="GPU",
        devices_per_worker={"actor_infer": 2},
    )
    infer = plan.roles["actor_infer"]
    assert [w.devices for w in infer.workers] == [(0, 1), (2, 3)]
    assert plan.bundles(0) == [{"CPU": 1.0, "GPU": 2.0}] * 2


@pytest.mark.parametrize(
    ("maps", "kwargs", "match"),
    [
        ({"actor_train": [0, 4]}, {}, r"actor_train.device_mapping uses device 4 .* 0\.\.3"),
        ({"reference": [1, 1]}, {}, "lists device 1 twice"),
        ({"critic": []}, {}, "critic.device_mapping is empty"),
        ({"actor_infer": [0, 1, 2]}, {"devices_per_worker": {"actor_infer": 2}}, "not divisible"),
    ],
)
def test_invalid_maps_name_the_role(maps, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_placement(maps, num_devices=4, **kwargs)


def test_describe_mentions_every_role():
    plan = plan_placement({"actor_train": [0], "actor_infer": [0]}, num_devices=1)
    text = plan.describe()
    assert "actor_train" in text and "colocated with actor_infer" in text


def test_node_resources_pin_each_bundle_to_its_devices_node():
    plan = plan_placement(
        {"actor_train": [0, 1], "reference": [1], "actor_infer": [2, 3]},
        num_devices=4,
        resource_name="GPU",
        devices_per_node=2,
        node_resources=["trainer_node", "rollout_node"],
    )
    train = plan.roles["actor_train"].colocation_group
    infer = plan.roles["actor_infer"].colocation_group
    share = NODE_RESOURCE_SHARE
    assert plan.bundles(train) == [{"CPU": 1.0, "GPU": 1.0, "trainer_node": share}] * 2
    assert plan.bundles(infer) == [{"CPU": 1.0, "GPU": 1.0, "rollout_node": share}] * 2
    assert "nodes=['rollout_node']" in plan.describe()
    # without node_resources nothing is pinned (Ray may place a bundle on any node)
    free = plan_placement({"actor_infer": [2, 3]}, num_devices=4, devices_per_node=2)
    assert free.bundles(0) == [{"CPU": 1.0}] * 2


@pytest.mark.parametrize(
    ("maps", "kwargs", "match"),
    [
        ({"actor_train": [0]}, {"node_resources": ["a"]}, r"1 name\(s\) for 2 node\(s\)"),
        ({"actor_train": [0]}, {"node_resources": ["a", "b"], "devices_per_node": 3}, "dividing"),
        (
            {"actor_infer": [1, 2]},
            {"node_resources": ["a", "b"], "devices_per_worker": {"actor_infer": 2}},
            r"devices \[1, 2\] span nodes",
        ),
    ],
)
def test_bad_node_pinning_is_an_error(maps, kwargs, match):
    kwargs = {"devices_per_node": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        plan_placement(maps, num_devices=4, **kwargs)


def _mixed_plan(**kwargs):
    """ROLL's usual layout: a TP-2 engine on the devices of 1-device trainer and reference."""
    return plan_placement(
        {"actor_train": [0, 1, 2, 3], "actor_infer": [0, 1, 2, 3], "reference": [0, 1, 2, 3]},
        num_devices=4,
        devices_per_worker={"actor_infer": 2},
        **kwargs,
    )


def test_mixed_colocation_reserves_one_bundle_per_device_and_pins_to_the_first():
    plan = _mixed_plan(device_kind="cuda", resource_name="GPU")
    assert len(plan.groups) == 1 and plan.sets_visible_devices
    assert plan.bundles(0) == [{"CPU": 1.0, "GPU": 1.0}] * 4  # every device the group uses
    infer = plan.roles["actor_infer"]
    assert infer.is_colocated and set(infer.colocated_with) == {"actor_train", "reference"}
    assert [w.devices for w in infer.workers] == [(0, 1), (2, 3)]
    assert [w.bundle_index for w in infer.workers] == [0, 2]  # its first device's bundle
    assert [w.visible_devices for w in infer.workers] == [(0, 1), (2, 3)]
    # 3 roles share each device: a third of its first device (not two devices' worth)
    assert [w.device_request for w in infer.workers] == [pytest.approx(1 / 3)] * 2
    train = plan.roles["actor_train"]
    assert [w.bundle_index for w in train.workers] == [0, 1, 2, 3]
    assert [w.visible_devices for w in train.workers] == [(0,), (1,), (2,), (3,)]


@pytest.mark.parametrize(("kind", "resource"), [("cuda", "GPU"), ("npu", "NPU"), ("cpu", None)])
def test_mixed_colocation_requests_fit_every_bundle(kind, resource):
    plan = _mixed_plan(device_kind=kind, resource_name=resource, cpu_per_bundle=0.5)
    bundles = plan.bundles(0)
    device_used: dict[int, float] = defaultdict(float)
    cpu_used: dict[int, float] = defaultdict(float)
    for rp in plan.roles.values():
        for w in rp.workers:
            device_used[w.bundle_index] += w.device_request
            cpu_used[w.bundle_index] += w.cpus
    for index, bundle in enumerate(bundles):
        assert cpu_used[index] <= bundle["CPU"] + 1e-9
        if resource is not None:
            assert device_used[index] <= bundle[resource] + 1e-9
    # bundle 0 holds one worker of each role (infer pinned there): exactly full
    assert cpu_used[0] == pytest.approx(0.5)


def test_mixed_colocation_visibility_env_per_kind():
    cuda = _mixed_plan(device_kind="cuda", resource_name="GPU")
    infer = cuda.roles["actor_infer"].workers[1]
    assert worker_device_env(cuda, infer) == {
        "CUDA_VISIBLE_DEVICES": "2,3",
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
    }
    npu = _mixed_plan(device_kind="npu", resource_name="NPU")
    train = npu.roles["actor_train"].workers[3]
    assert worker_device_env(npu, train) == {
        "ASCEND_RT_VISIBLE_DEVICES": "3",
        "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1",
    }
    assert worker_device_env(_mixed_plan(), infer) == {}  # cpu: no such variable
    # every other layout keeps Ray's own assignment
    plain = plan_placement(
        {"actor_train": [0], "actor_infer": [0]}, num_devices=1, device_kind="cuda"
    )
    assert not plain.sets_visible_devices
    assert worker_device_env(plain, plain.roles["actor_infer"].workers[0]) == {}


def test_mixed_colocation_on_two_nodes_uses_node_local_ids():
    plan = plan_placement(
        {"actor_train": [0, 1, 2, 3], "actor_infer": [0, 1, 2, 3]},
        num_devices=4,
        device_kind="cuda",
        resource_name="GPU",
        devices_per_worker={"actor_infer": 2},
        devices_per_node=2,
        node_resources=["n0", "n1"],
    )
    infer = plan.roles["actor_infer"]
    assert [w.visible_devices for w in infer.workers] == [(0, 1), (0, 1)]
    assert [w.bundle_index for w in infer.workers] == [0, 2]
    share = NODE_RESOURCE_SHARE
    assert plan.bundles(0)[2:] == [{"CPU": 1.0, "GPU": 1.0, "n1": share}] * 2
    assert [w.device_request for w in infer.workers] == [0.5, 0.5]


def test_mixed_colocation_worker_across_nodes_names_the_role():
    with pytest.raises(ValueError, match=r"actor_infer: one worker's devices \[1, 2\] span nodes"):
        plan_placement(
            {"actor_train": [0, 1, 2, 3], "actor_infer": [1, 2, 0, 3]},
            num_devices=4,
            devices_per_worker={"actor_infer": 2},
            devices_per_node=2,
        )


def test_plain_layouts_request_what_they_did_before():
    lone = plan_placement(
        {"actor_infer": [0, 1, 2, 3]}, num_devices=4, devices_per_worker={"actor_infer": 2}
    )
    assert [w.device_request for w in lone.roles["actor_infer"].workers] == [2.0, 2.0]
    shared = plan_placement({"actor_train": [0, 1], "actor_infer": [0, 1]}, num_devices=2)
    assert [w.device_request for w in shared.roles["actor_infer"].workers] == [0.5, 0.5]


class SeesDevices:
    """A worker that reports what the placement gave it."""

    def __init__(self, rank, world_size, dist_env):
        import os

        self.rank = rank
        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES")

    def ready(self):
        return True

    def report(self):
        import ray

        ctx = ray.get_runtime_context()
        return self.rank, self.visible, ctx.get_placement_group_id() is not None

    def shutdown(self):
        return None


@pytest.mark.slow  # starts Ray (~20 s)
@pytest.mark.xdist_group("ray")
def test_mixed_colocation_starts_on_ray_with_virtual_devices():
    """A 2-device engine worker and 1-device trainers on the same 2 virtual devices: Ray reserves
    the group's 2 CPU bundles (0.5 CPU each, a 1-CPU Ray), every worker starts in them and sees
    its devices through CUDA_VISIBLE_DEVICES (Ray's override off), the engine both of them."""
    from rl_runtime.cluster.cluster import Cluster, RoleSpec
    from rl_runtime.cluster.ray_setup import RayOptions

    specs = [
        RoleSpec("actor_train", SeesDevices, [0, 1]),
        RoleSpec("actor_infer", SeesDevices, [0, 1], devices_per_worker=2),
    ]
    cluster = Cluster.start(
        specs,
        num_devices=2,
        device_kind="cuda",  # the variable's name; no GPU is asked of Ray (resource_name None)
        ray_options=RayOptions(num_cpus=1),
        cpu_per_bundle=0.5,
        rpc_timeout=120.0,
    )
    try:
        assert cluster.plan.bundles(0) == [{"CPU": 0.5}] * 2
        assert cluster["actor_train"].call_all("report") == [(0, "0", True), (1, "1", True)]
        assert cluster["actor_infer"].call_all("report") == [(0, "0,1", True)]
    finally:
        cluster.shutdown()


def test_resource_totals_and_shortfall_against_a_fixed_cluster():
    # actor_train on 0-1 and actor_infer on 2: three device bundles of 1.5 CPUs
    plan = plan_placement({"actor_train": [0, 1], "actor_infer": [2]}, num_devices=3,
                          cpu_per_bundle=1.5)  # fmt: skip
    assert plan.resource_totals() == {"CPU": 4.5}
    assert plan.shortfall({"CPU": 4.5}) == []
    (line,) = plan.shortfall({"CPU": 4})
    assert (
        line
        == "CPU: the placement needs 4.5 (3 device bundle(s) x cpu_per_bundle 1.5), the cluster has 4"
    )
    # colocated roles share their bundle; a device resource missing from the cluster is named
    colocated = plan_placement({"actor_train": [0], "actor_infer": [0]}, num_devices=1,
                               device_kind="cuda", resource_name="GPU")  # fmt: skip
    assert colocated.resource_totals() == {"CPU": 1.0, "GPU": 1.0}
    assert colocated.shortfall({"CPU": 2}) == ["GPU: the placement needs 1, the cluster has 0"]
