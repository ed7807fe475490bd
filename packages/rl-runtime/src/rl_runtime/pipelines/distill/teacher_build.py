"""A small teacher made before the run (a CPU default's): a tiny model (rl_rollout.tiny_model)
trained briefly in this process on supervised examples the caller makes with its tokenizer
(`SFTExample`s: the loss on the response), saved with `save_pretrained`. Reused when a teacher
built with the same options and `key` is already there."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
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


def build_teacher(
    options: TeacherBuildOptions, examples: Callable[[Any], list], key: dict[str, Any]
) -> dict[str, float]:
    """Build and train the teacher at `options.out_dir` on `examples(tokenizer)` (a list of
    rl_runtime.step.sft_data.SFTExample); `key`: what else the examples depend on (their files,
    the seed), recorded with the options. `{teacher_build/seconds, teacher_build/loss}` (empty
    when reused)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_rollout.tiny_model import build_tiny_model
    from rl_runtime.step.sft_data import collate

    assert options.out_dir is not None
    out = Path(options.out_dir)
    params = {**asdict(options), **key}
    seed = int(key.get("seed", 0))
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
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    t = collate(examples(tok), pad)
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
