"""The device-list parser accepts ROLL's forms and nothing else (no eval)."""

from __future__ import annotations

import pytest

from rl_config import ConfigError, ExperimentConfig, parse_device_list
from rl_config.ranges import DeviceListSyntaxError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("list(range(0,2))", [0, 1]),
        ("list(range(4))", [0, 1, 2, 3]),
        (" list( range( 2 , 8 , 3 ) ) ", [2, 5]),
        ("range(1, 3)", [1, 2]),
        ("[0, 2, 5]", [0, 2, 5]),
        ("[]", []),
        ("3", [3]),
        ("list([1,2])", [1, 2]),
        ("list(range(0,2)) + [6, 7]", [0, 1, 6, 7]),
        ("list(range(8, 0, -3))", [8, 5, 2]),
        (4, [4]),
        ([1, 2], [1, 2]),
    ],
)
def test_config_range_accepts(text, expected) -> None:
    assert parse_device_list(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "list(range(0,2)).__class__",
        "eval('1')",
        "open('/etc/passwd')",
        "list(map(int, '12'))",
        "range(0, 2, 0)",
        "range(1, 2, 3, 4)",
        "range(0, 10000000)",
        "list(range(0,2)",
        "[0, 1",
        "1.5",
        "",
        "x" * 5000,
        "[True]",
        True,
        [1, "2"],
    ],
)
def test_config_range_rejects(text) -> None:
    with pytest.raises(DeviceListSyntaxError):
        parse_device_list(text)


def test_config_range_error_in_schema_names_path() -> None:
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.model_validate(
            {"pretrain": "m", "reference": {"device_mapping": "__import__('os').getcwd()"}}
        )
    (issue,) = info.value.issues
    assert issue.path == "reference.device_mapping"
    assert "never evaluated" in issue.message and "__import__" in issue.message
