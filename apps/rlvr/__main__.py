"""`uv run apps/rlvr [--config FILE] [key=value ...] [--dry-run] [--no-ray]`

With no arguments: the CPU default (configs/cpu_default.yaml) — `max 3 8 1 5 =` prompts generated
locally into parquet (held-out problems disjoint from training ones), a tiny model built locally, a short
supervised warm-up on noisy answers, then GRPO with DAPO's clip-higher, token-mean loss and
dynamic sampling; it prints held-out accuracy before and after RL with standard errors and a
trivial baseline (also written to output_dir/summary.json).
ROLL's launcher form `--config_path DIR --config_name NAME key=value` works too.
"""

from __future__ import annotations

import dataclasses
import sys
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from rlvr_app import SPEC  # noqa: E402

from rl_runtime.cli.app_main import app_main  # noqa: E402

main = partial(app_main, dataclasses.replace(SPEC, description=__doc__ or ""))

if __name__ == "__main__":
    raise SystemExit(main())
