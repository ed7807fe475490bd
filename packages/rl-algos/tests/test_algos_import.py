"""``import rl_algos`` pulls in torch and nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    "transformers",
    "ray",
    "deepspeed",
    "vllm",
    "pandas",
    "scipy",
    "msgspec",
    "pydantic",
    "yaml",
)


def test_import_rl_algos_is_torch_only() -> None:
    code = (
        "import sys, json\n"
        "import torch\n"
        "base = set(sys.modules)\n"
        "import rl_algos, rl_algos.advantages, rl_algos.losses, rl_algos.logprobs, rl_algos.rewards\n"
        "import rl_algos.kl_control, rl_algos.correction, rl_algos.aggregate\n"
        "print(json.dumps(sorted(set(sys.modules) - base)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    added = json.loads(out.stdout.strip().splitlines()[-1])
    tops = {m.split(".")[0] for m in added}
    assert tops <= {"rl_algos", "importlib_metadata"} | set(sys.stdlib_module_names), tops
    heavy = ",".join(HEAVY)
    code2 = (
        "import sys, rl_algos\n"
        f"heavy = set('{heavy}'.split(','))\n"
        "print(','.join(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out2 = subprocess.run([sys.executable, "-c", code2], capture_output=True, text=True, check=True)
    assert out2.stdout.strip() == ""


def test_source_never_imports_numpy() -> None:
    import pathlib

    import rl_algos

    src = pathlib.Path(rl_algos.__file__).parent
    for path in src.glob("*.py"):
        text = path.read_text()
        assert "import numpy" not in text and "from numpy" not in text, path
