"""TRL's side of the GRPO step benchmark (tools/bench/grpo_step.py): `GRPOTrainer` on the same model,
batch and threads. TRL is not a dependency of this project: run this file with the Python of a
throw-away environment that has TRL (grpo_step.py --trl makes one), never the workspace's.

The step is TRL's as it runs on the CPU without vLLM: `transformers.generate` of 16 prompts x 4
samples (exactly 128 new tokens: `min_new_tokens`), the rewards, GRPO advantages, one forward and
backward of the loss and one optimizer step (beta=0: no KL, so no reference model;
`num_iterations=1` and `steps_per_generation=1`, so TRL skips the old log-prob pass). fp32
(`bf16=False`), gradient checkpointing off (TRL's default is on; off is faster here and does the
same work as ours), no logging backends.

Two ways to run:
- alone: `python grpo_step_trl.py --model DIR --prompts FILE` prints one JSON line per step and
  `median_s_per_step=<float>` last;
- in lockstep (`--lockstep`), driven by grpo_step.py: before each step it reads a line from stdin
  and after it writes one JSON line to stdout, so the two stacks take turns on the same cores.

JSON line per step: {"step": i, "seconds": s, "generation": s, "rollout": s} where `seconds` runs
from the trainer's step begin to its step end, `generation` is `transformers.generate` and
`rollout` all of `_generate_and_score_completions` (generation, decoding, rewards, advantages).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def digit_reward(completions: list[str], **_: object) -> list[float]:
    """The benchmark's reward (same as grpo_step.py): the share of digits in the completion."""
    return [sum(ch.isdigit() for ch in text) / max(1, len(text)) for text in completions]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True, help="JSON list of prompt strings, in order")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lockstep", action="store_true")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    with open(args.prompts, encoding="utf-8") as f:
        prompts = json.load(f)
    need = args.steps * args.prompts_per_step
    if len(prompts) < need:
        raise SystemExit(f"--prompts has {len(prompts)} prompts; {need} needed")
    batch = args.prompts_per_step * args.group
    with tempfile.TemporaryDirectory(prefix="grpo-step-trl-") as out_dir:
        config = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_generations=args.group,
            num_iterations=1,
            max_completion_length=args.new_tokens,
            generation_kwargs={"min_new_tokens": args.new_tokens},
            temperature=1.0,
            beta=0.0,
            learning_rate=args.learning_rate,
            max_steps=args.steps,
            bf16=False,
            fp16=False,
            use_cpu=True,
            gradient_checkpointing=False,
            shuffle_dataset=False,
            dataloader_num_workers=0,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            seed=args.seed,
            log_completions=False,
        )
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        tokenizer.padding_side = "left"
        dataset = Dataset.from_dict({"prompt": prompts[:need]})
        phases: dict[str, float] = {}

        class TimedGRPOTrainer(GRPOTrainer):
            def _generate_single_turn(self, *a, **kw):
                t0 = time.perf_counter()
                try:
                    return super()._generate_single_turn(*a, **kw)
                finally:
                    phases["generation"] = phases.get("generation", 0.0) + time.perf_counter() - t0

            def _generate_and_score_completions(self, *a, **kw):
                t0 = time.perf_counter()
                try:
                    return super()._generate_and_score_completions(*a, **kw)
                finally:
                    phases["rollout"] = phases.get("rollout", 0.0) + time.perf_counter() - t0

        times: list[float] = []

        class StepTimer(TrainerCallback):
            def on_step_begin(self, _args, state, control, **kwargs):
                if args.lockstep and not sys.stdin.readline():
                    raise SystemExit("grpo_step_trl: driver closed stdin")
                phases.clear()
                self.t0 = time.perf_counter()

            def on_step_end(self, _args, state, control, **kwargs):
                seconds = time.perf_counter() - self.t0
                times.append(seconds)
                record = {"step": len(times) - 1, "seconds": seconds, **phases}
                print(json.dumps(record), flush=True)

        trainer = TimedGRPOTrainer(
            model=model,
            reward_funcs=digit_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepTimer()],
        )
        print(
            json.dumps({"ready": True, "trl": trl.__version__, "torch": torch.__version__}),
            flush=True,
        )
        trainer.train()
    if not args.lockstep:
        print(f"median_s_per_step={statistics.median(times[1:] or times):.4f}")


if __name__ == "__main__":
    main()
