"""apps/rlvr's claim on its CPU default: RL raises held-out greedy accuracy and pass@1 (the
sampled accuracy) over the warm-up by several standard errors and does not lower pass@k; with
the policy-gradient loss off (`rl_loss_coef=0`) the harness reads no gain.

Runs the app as a user does (a subprocess, the default config on Ray), with its outputs in a
temporary directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "rlvr"


def _run(out: Path, *extra: str) -> dict:
    data = out / "data"
    cmd = [sys.executable, str(APP), f"output_dir={out}", f"pretrain={out / 'tiny_model'}",
           f"rlvr_app.build_tiny_model={out / 'tiny_model'}", f"rlvr_app.arith_data.out_dir={data}",
           f"actor_train.data_args.file_name={data / 'train.parquet'}",
           f"actor_train.data_args.eval_file_name={data / 'test.parquet'}", *extra]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def shortfalls(summary: dict) -> list[str]:
    """What of the claim a run's summary.json misses (empty: it holds): greedy and pass@1 gains
    of at least `GREEDY_GAIN` / `SAMPLED_GAIN` and 3 standard errors each, pass@k not lower."""
    s = summary["summary"]
    greedy, sampled = s["gain val/greedy/accuracy"], s["gain val/accuracy"]
    passk = s["gain val/pass@k"]
    out = []
    if not (greedy["gain"] >= GREEDY_GAIN and greedy["gain_in_se"] >= 3):
        out.append(f"greedy gain {greedy}")
    if not (sampled["gain"] >= SAMPLED_GAIN and sampled["gain_in_se"] >= 3):
        out.append(f"pass@1 gain {sampled}")
    if passk["gain"] < 0:
        out.append(f"pass@k fell {passk}")
    return out


# Measured (2026-11-29, the 2-core machine, `uv run apps/rlvr` at its seed 42, Ray): greedy
# 0.142 -> 0.275 (+0.1325, 4.67 SE), pass@1 0.104 -> 0.200 (+0.0956, 5.65 SE), pass@4 0.282 ->
# 0.443 (+0.16); seed 42's warm-up is the weakest of the seeds measured (seeds 1-3: the table in
# docs/rlvr.md). The run is deterministic on one machine: the margins below the measured gains
# are for another machine's float rounding. With rl_loss_coef=0 the gradient is 0, Adam moves
# no weight, and the seeded evaluations repeat: both gains are exactly 0.
GREEDY_GAIN = 0.08
SAMPLED_GAIN = 0.06


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("rl_loss_coef", [1.0, 0.0], ids=["rl", "rl_loss_off"])
def test_rl_raises_held_out_greedy_and_pass1_and_keeps_pass_at_k(tmp_path, rl_loss_coef):
    # The control (loss off) is the same run cut to 2 of its 30 steps (the last step evaluates
    # and saves whatever the cadence) after a quarter of the warm-up: the claim it checks, that
    # the before/after evaluations read exactly 0 when no weight moves, needs steps that draw
    # samples and take optimizer steps from a policy whose samples vary, not the full run (the
    # 1000-step warm-up takes ~90 s here, 250 steps ~25 s; after those: sampled 0.033, pass@4 0.122).
    control = [] if rl_loss_coef else ["max_steps=2", "rlvr_app.warmup.steps=250"]
    summary = _run(tmp_path / "run", f"rl_loss_coef={rl_loss_coef}", *control)
    assert summary["eval_after"]["val/greedy/num_prompts"] == 400
    missed = shortfalls(summary)
    if rl_loss_coef:
        assert not missed, missed
    else:  # the weights do not move: no gain, the claim fails on both gains
        assert len(missed) == 2, missed
        # exactly 0, on a policy whose samples do vary (the zero is the harness's, not a floor's):
        # a prompt's samples are right and wrong, pass@k well above the sampled accuracy
        assert all(g["gain"] == 0.0 for k, g in summary["summary"].items() if k.startswith("gain"))
        before = summary["eval_before"]
        assert before["val/pass@k"] > 2 * before["val/accuracy"] > 0, before


def test_the_claim_misses_both_gains_of_a_run_that_did_not_move():
    def summary(greedy: float, sampled: float, passk: float) -> dict:
        def gain(g: float, se: float) -> dict:
            return {"gain": g, "se": se, "gain_in_se": round(g / se, 2), "n": 400}

        return {"summary": {"gain val/greedy/accuracy": gain(greedy, 0.028),
                            "gain val/accuracy": gain(sampled, 0.017),
                            "gain val/pass@k": gain(passk, 0.033)}}  # fmt: skip

    assert shortfalls(summary(0.1325, 0.0956, 0.16)) == []  # seed 42 as measured
    assert [m.split(" {")[0] for m in shortfalls(summary(0.0, 0.0, 0.0))] == [
        "greedy gain", "pass@1 gain"]  # fmt: skip
    assert shortfalls(summary(0.1325, 0.0956, -0.01))[0].startswith("pass@k fell")
    assert shortfalls(summary(0.07, 0.0956, 0.0))[0].startswith("greedy gain")  # under 0.08
