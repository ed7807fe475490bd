"""The CPU default's teacher, made before the run: a tiny model (larger than the student, the
same tokenizer) trained briefly in this process on the training prompts' answers (RLVR's
supervised demonstrations: prompt tokens masked, the answer in the reward's format), saved with
`save_pretrained`. Reused when a complete teacher with the same options is already there."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_runtime.cli.app_options import TinyModelOptions

MARKER = "distill_teacher.json"


@dataclass
class TeacherBuildOptions:
    """`<app>.teacher_build`: where to build the teacher (None: off, the teachers are given),
    its tiny model's shape, and its supervised training (`steps` of `batch_size` rows at
    `learning_rate`)."""

    out_dir: str | None = None
    tiny_model: TinyModelOptions = field(default_factory=TinyModelOptions)
    steps: int = 300
    batch_size: int = 64
    learning_rate: float = 1.0e-3
    response_template: str = "#### {answer}"

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"teacher_build.{name}={getattr(self, name)}: must be >= 1")
        if self.learning_rate <= 0:
            raise ValueError(f"teacher_build.learning_rate={self.learning_rate}: must be > 0")


def build_teacher(options: TeacherBuildOptions, plan: Any, seed: int) -> dict[str, float]:
    """Build and train the teacher at `options.out_dir` on `plan`'s (an RlvrPlan) training
    prompts; `{teacher_build/seconds, teacher_build/loss}` (empty when reused)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_rollout.tiny_model import build_tiny_model
    from rl_runtime.pipelines.rlvr.data import load_rlvr_prompts
    from rl_runtime.pipelines.rlvr.warmup import WarmupOptions, demonstrations
    from rl_runtime.step.collate import collate_trajectories

    assert options.out_dir is not None
    out = Path(options.out_dir)
    params = {**asdict(options), "train_files": list(plan.data.train_files), "seed": seed}
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == params:
        return {}
    if marker.is_file():  # built here with other options: rebuilt from random weights
        shutil.rmtree(out)
    elif out.exists() and any(out.iterdir()):
        raise ValueError(
            f"teacher_build.out_dir={out}: exists and is not a teacher this app built "
            f"(no {MARKER}); name an empty or new directory"
        )
    t0 = time.perf_counter()
    build_tiny_model(out, **asdict(options.tiny_model))  # random weights, then trained below
    tok = AutoTokenizer.from_pretrained(out)
    prompts = load_rlvr_prompts(plan, tok, seed)
    demo_options = WarmupOptions(demos=len(prompts.train.rows),
                                 response_template=options.response_template)  # fmt: skip
    demos = demonstrations(prompts.train.rows, prompts.train.ids, tok, demo_options, seed)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    t = collate_trajectories(demos, pad_token_id=pad).tensors
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=options.learning_rate, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    loss = torch.tensor(float("nan"))
    for step in range(options.steps):
        rows = torch.randperm(t["input_ids"].shape[0], generator=gen)[: options.batch_size]
        ids, att, mask = t["input_ids"][rows], t["attention_mask"][rows], t["response_mask"][rows]
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        ).view(ids.shape[0], -1)
        target = mask[:, 1:].float()  # token t+1 is predicted at position t
        loss = (nll * target).sum() / target.sum().clamp(min=1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == options.steps - 1:
            print(f"teacher {step + 1}/{options.steps} | loss={loss.item():.3f} | "
                  f"{time.perf_counter() - t0:.0f}s", flush=True)  # fmt: skip
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    marker.write_text(json.dumps(params, sort_keys=True))
    return {"teacher_build/seconds": time.perf_counter() - t0,
            "teacher_build/loss": loss.item()}  # fmt: skip
