"""Off-policy distillation: supervised training of the student on responses it did not sample,
before (or instead of most of) the on-policy steps.

    source: data      given rows (chat `messages` or prompt/response; rl_runtime.step.sft_data:
                      loss on assistant turns only)
    source: teacher   the teacher's own samples on the training prompts (sequence-level
                      distillation, Kim & Rush 2016): `samples_per_prompt` responses per prompt,
                      sampled in this process from the first teacher's model with Hugging Face
                      `generate` (fits the small teachers of a CPU run; a large teacher's samples
                      are given data), prompt tokens kept as the rollout renders them

Then, with `loss: sft`, `steps` steps of `batch_size` rows through
rl_runtime.step.sft_warmup.supervised_warmup (actor_train's SFT loss; the schedule restarts and
the weights sync after). With `loss: kd` (token-level distillation on the teacher's logits,
ROLL's offline distill pipeline; rl_runtime.pipelines.distill.kd) the rows are the pipeline's
steps themselves (`distill_app.mode: off_policy`): each step the teacher scores a batch and the
student is trained toward its top-k distribution at every trained position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SOURCES = ("none", "data", "teacher")
LOSSES = ("sft", "kd")
#: the keys `loss: kd` reads (ROLL's offline distill names), with their defaults (ROLL's)
KD_KEYS = {"kd_objective": "forward_kl", "logits_topk": 64, "kd_temperature": 1.0,
           "teacher_temperature": 1.0, "distill_loss_weight": 0.5, "adaptive_kl_alpha": 0.5,
           "skew_lambda": 0.1, "distill_on_prompt": False}  # fmt: skip


@dataclass
class OffPolicyOptions:
    """`<app>.off_policy` (source none: off)."""

    source: str = "none"
    #: source data: the files, comma-separated (jsonl, json or parquet)
    files: str = ""
    messages_key: str | None = "messages"
    prompt_key: str = "instruction"
    response_key: str = "output"
    template: str = "native"
    sequence_length: int = 2048
    #: source teacher: responses per training prompt, prompts used at most, temperature
    samples_per_prompt: int = 1
    max_prompts: int = 1024
    temperature: float = 1.0
    steps: int = 50
    batch_size: int = 32
    learning_rate: float | None = None
    #: sft: the NLL of the rows' tokens; kd: token-level distillation on the teacher's logits
    #: (the keys below; mode off_policy)
    loss: str = "sft"
    kd_objective: str = "forward_kl"
    #: the teacher's k most likely tokens at each position, both distributions renormalised
    #: there (0: the whole vocabulary)
    logits_topk: int = 64
    kd_temperature: float = 1.0
    teacher_temperature: float = 1.0
    distill_loss_weight: float = 0.5
    adaptive_kl_alpha: float = 0.5
    skew_lambda: float = 0.1
    #: train on the prompt's tokens too (ROLL's distill_on_prompt)
    distill_on_prompt: bool = False

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"off_policy.source={self.source!r}: one of {list(SOURCES)}")
        if self.loss not in LOSSES:
            raise ValueError(f"off_policy.loss={self.loss!r}: one of {list(LOSSES)}")
        if self.loss == "kd":
            self.kd_config()  # its own checks, naming the key
            if self.logits_topk < 0:
                raise ValueError(f"off_policy.logits_topk={self.logits_topk}: must be >= 0")
            if self.teacher_temperature <= 0:
                raise ValueError(
                    f"off_policy.teacher_temperature={self.teacher_temperature}: must be > 0"
                )
        else:
            for key, default in KD_KEYS.items():
                if getattr(self, key) != default:
                    raise ValueError(
                        f"off_policy.{key}={getattr(self, key)!r}: read with loss kd only "
                        f"(loss is {self.loss})"
                    )
        if self.source == "data" and not self.file_list:
            raise ValueError("off_policy.files: source data needs the data files")
        if self.source != "data" and self.files:
            raise ValueError(f"off_policy.files: read with source data only, not {self.source}")
        for name in ("samples_per_prompt", "max_prompts", "steps", "batch_size",
                     "sequence_length"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"off_policy.{name}={getattr(self, name)}: must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"off_policy.temperature={self.temperature}: must be >= 0")

    def kd_config(self) -> Any:
        """The student's loss config (rl_runtime.step.losses.KDLossConfig); ValueError naming
        the `off_policy.` key at fault."""
        from rl_runtime.step.losses import KDLossConfig

        try:
            return KDLossConfig(objective=self.kd_objective, kd_temperature=self.kd_temperature,
                                distill_loss_weight=self.distill_loss_weight,
                                adaptive_kl_alpha=self.adaptive_kl_alpha,
                                skew_lambda=self.skew_lambda)  # fmt: skip
        except ValueError as exc:
            raise ValueError(f"off_policy.{exc}") from None

    @property
    def file_list(self) -> tuple[str, ...]:
        return tuple(f.strip() for f in self.files.split(",") if f.strip())


def given_examples(options: OffPolicyOptions, tokenizer: Any) -> tuple[list, dict[str, int]]:
    """The given rows as `SFTExample`s and their counts (rl_runtime.step.sft_data.load_sft)."""
    from rl_runtime.step.sft_data import SFTFields, load_sft

    fields = SFTFields(prompt_key=options.prompt_key, response_key=options.response_key,
                       messages_key=options.messages_key, template=options.template,
                       sequence_length=options.sequence_length)  # fmt: skip
    data = load_sft(options.file_list, tokenizer, fields)
    return data.examples, data.counts


def teacher_examples(
    options: OffPolicyOptions, teacher_path: str, prompt_ids: list[list[int]], tokenizer: Any,
    max_new_tokens: int, seed: int,
) -> list:  # fmt: skip
    """`samples_per_prompt` teacher responses to each of the first `max_prompts` prompts (token
    ids as the rollout renders them), ended by eos or `max_new_tokens`; `SFTExample`s with the
    response trained on."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl_runtime.step.sft_data import SFTExample

    model = AutoModelForCausalLM.from_pretrained(teacher_path, dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    torch.manual_seed(seed)
    out: list[SFTExample] = []
    prompts = prompt_ids[: options.max_prompts]
    for start in range(0, len(prompts), 64):
        chunk = prompts[start : start + 64]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])  # left-padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        greedy = options.temperature == 0
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                do_sample=not greedy, temperature=None if greedy else options.temperature,
                top_k=None, top_p=None, num_return_sequences=options.samples_per_prompt,
                eos_token_id=eos, pad_token_id=pad,
            )  # fmt: skip
        for row, seq in enumerate(gen[:, width:].tolist()):
            prompt = chunk[row // options.samples_per_prompt]
            response = seq[: seq.index(eos) + 1] if eos in seq else seq
            if response:
                out.append(SFTExample(tuple(prompt + response),
                                      tuple([False] * len(prompt) + [True] * len(response))))  # fmt: skip
    return out


def train_off_policy(
    ctx: Any, examples: list, options: OffPolicyOptions, pad_token_id: int
) -> dict[str, float]:
    """`options.steps` SFT steps on `examples` (rl_runtime.step.sft_warmup.supervised_warmup,
    logged as `warmup/*`); `warmup/*` totals."""
    from rl_runtime.step.sft_warmup import supervised_warmup

    if not examples:
        raise ValueError("off_policy: no example to train on (every row dropped or empty)")
    return supervised_warmup(ctx, examples, steps=options.steps, batch_size=options.batch_size,
                             learning_rate=options.learning_rate, log_every=10,
                             pad_token_id=pad_token_id)  # fmt: skip
