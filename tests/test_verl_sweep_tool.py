"""tools/verl_sweep.py's own parts on a made-up verl tree (the sweep itself needs verl's checkout):
the shim records the verl entry a script runs, through Ascend's `source` lines, `ulimit` and
`srun`, the user's paths and device replace the script's, and a dry run's verdict is read."""

from __future__ import annotations

from tools.verl_sweep import Call, capture, localise, reasons_of, scripts, write_shims

SCRIPT = """set -xeuo pipefail
source /usr/local/Ascend/ascend-toolkit/set_env.sh
ulimit -n 99999999
MODEL=${MODEL:-Qwen/Qwen2-7B}
python3 examples/data_preprocess/gsm8k.py --local_save_dir /data/gsm8k
srun --nodes=1 python3 -m verl.trainer.main_ppo data.train_files=$HOME/data/train.parquet \\
    actor_rollout_ref.model.path=$MODEL trainer.nnodes=$SLURM_JOB_NUM_NODES trainer.device=npu "$@"
"""


def test_the_shim_records_the_verl_entry_a_script_runs(tmp_path):
    tree, home = tmp_path / "verl", tmp_path / "home"
    (tree / "examples" / "grpo_trainer").mkdir(parents=True)
    (tree / "examples" / "grpo_trainer" / "run.sh").write_text(SCRIPT)
    (tree / "examples" / "grpo_trainer" / "run_megatron.sh").write_text(SCRIPT)
    home.mkdir()
    found = scripts(tree / "examples")
    assert [p.name for p in found] == ["run.sh"]  # Megatron scripts are left out
    calls = capture(found[0], tree, home, write_shims(tmp_path / "shims"))
    assert calls == [
        Call(
            "verl.trainer.main_ppo",
            [
                f"data.train_files={home}/data/train.parquet",
                "actor_rollout_ref.model.path=Qwen/Qwen2-7B",
                "trainer.nnodes=1",
                "trainer.device=npu",
            ],
        )
    ]
    paths = {"model": "/m", "rm": "/rm", "train": "/t.parquet", "test": "/v.parquet", "ckpt": "/c"}
    assert localise(calls[0].argv, paths) == [
        "data.train_files=/t.parquet",
        "actor_rollout_ref.model.path=/m",
        "trainer.nnodes=1",
        "trainer.device=cpu",
    ]


def test_a_verdict_counts_host_problems_as_planned_and_names_config_refusals():
    host = "preflight error: this host cannot run the plan above (1 problem(s)):\n  - placement: 8"
    assert reasons_of(0, "") == [] and reasons_of(1, host) == []
    refused = "config error: invalid verl command (1 error):\n  - data.truncation: verl key =x: no"
    assert reasons_of(1, refused) == ["data.truncation: verl key =x: no"]
    assert reasons_of(2, "crash: ValueError: boom\n") == ["crash: ValueError: boom"]
