import pytest

from rl_runtime.placement import plan_placement


def test_seed000_layout_is_disaggregated():
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
        (
            {"actor_infer": [0, 1], "actor_train": [0, 1]},
            {"devices_per_worker": {"actor_infer": 2}},
            "colocated roles must use one device",
        ),
    ],
)
def test_invalid_maps_name_the_role(maps, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_placement(maps, num_devices=4, **kwargs)


def test_describe_mentions_every_role():
    plan = plan_placement({"actor_train": [0], "actor_infer": [0]}, num_devices=1)
    text = plan.describe()
    assert "actor_train" in text and "colocated with actor_infer" in text
