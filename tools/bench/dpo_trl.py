"""TRL's side of tools/bench/dpo_step.py; runs in a throw-away venv with TRL installed (never this
workspace's dependency):  /tmp/trl-dpo/bin/python tools/bench/dpo_trl.py --model DIR --data FILE

Times `DPOTrainer` steps (sigmoid loss, reference log-probs precomputed, one optimizer step per
32-pair batch) with a callback; prints one JSON line {"seconds_per_step": [...], "trl": version}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help="JSONL rows {prompt, chosen, rejected}")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--pairs", type=int, default=32)
    p.add_argument("--cpu", action="store_true")
    a = p.parse_args()
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    torch.manual_seed(0)
    rows = [json.loads(line) for line in Path(a.data).read_text(encoding="utf-8").splitlines()]
    total = a.steps + a.warmup
    ds = Dataset.from_list(rows * total)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out:
        cfg = DPOConfig(
            output_dir=out,
            per_device_train_batch_size=a.pairs,
            gradient_accumulation_steps=1,
            learning_rate=1e-6,
            lr_scheduler_type="constant",
            max_steps=total,
            beta=0.1,
            loss_type="sigmoid",
            precompute_ref_log_probs=True,
            max_length=1024,
            logging_steps=1000,
            save_strategy="no",
            report_to=[],
            use_cpu=a.cpu,
            bf16=False,
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = DPOTrainer(
            model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[Clock()]
        )
        trainer.train()
    print(json.dumps({"seconds_per_step": times[a.warmup :], "trl": trl.__version__}))


if __name__ == "__main__":
    main()
