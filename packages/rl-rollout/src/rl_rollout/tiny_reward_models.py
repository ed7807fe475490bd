"""Tiny reward models built locally from the tiny policy (rl_rollout.tiny_model), for tests and
CPU examples of model rewards (no hub download):

* ``build_tiny_reward_model(out_dir, seed)``: a ``Qwen2ForSequenceClassification`` with one label
  (a reward model: one score per sequence), the tiny model's body and tokenizer, a score head
  drawn from `seed`.
* ``build_scripted_judge(out_dir, verdict)``: a tiny ``Qwen2ForCausalLM`` that answers any chat
  (rendered with its tokenizer's chat template) with ``verdict`` and then ends its turn, sampled
  or greedy: its layers add nothing to the residual stream, so each next token is a function of
  the last one, wired as a chain generation prompt -> verdict's tokens -> end of turn. A
  generative judge whose verdict is known in advance (a random tiny model's is unreadable).
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path
from typing import Any

from rl_rollout.tiny_model import build_tiny_model


def build_tiny_reward_model(out_dir: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """A one-label sequence-classification model with the tiny model's body, saved (safetensors)
    with its tokenizer in `out_dir` (replaced). Returns the path."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForSequenceClassification
    from transformers.utils import logging as hf_logging

    out = Path(out_dir)
    base = build_tiny_model(out.parent / f".{out.name}-base", seed=seed)
    rng = torch.random.get_rng_state()
    torch.manual_seed(seed + 1)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the score head is missing from the base: drawn here
    try:
        model = Qwen2ForSequenceClassification.from_pretrained(base, num_labels=1)
        torch.nn.init.normal_(model.score.weight, std=0.5)
    finally:
        torch.random.set_rng_state(rng)
        hf_logging.set_verbosity(verbosity)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model.config.pad_token_id = tokenizer.pad_token_id
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def build_scripted_judge(
    out_dir: str | os.PathLike[str],
    verdict: str = "yes",
    *,
    seed: int = 0,
    or_verdict: str | None = None,
) -> Path:
    """A tiny causal model that answers every chat with `verdict` (see module docstring), saved
    with its tokenizer in `out_dir` (replaced). With `or_verdict`, its first token is as likely
    as `verdict`'s: sampled, the judge says either, half the time each (greedy, the one of the
    lower token id). ValueError when the verdicts' tokens repeat or include the generation
    prompt's last token (chains of distinct tokens are needed)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    base = build_tiny_model(out.parent / f".{out.name}-base", seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    chat = [{"role": "user", "content": "x"}]
    prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    trigger = tokenizer(prompt, add_special_tokens=False)["input_ids"][-1]
    verdicts = [verdict] if or_verdict is None else [verdict, or_verdict]
    tokens = [tokenizer(v, add_special_tokens=False)["input_ids"] for v in verdicts]
    # transitions token -> next: the trigger branches to each verdict, each verdict ends the turn
    chains = [[trigger, *t, tokenizer.eos_token_id] for t in tokens]
    inner = [trigger] + [token for t in tokens for token in t]
    if len(set(inner)) != len(inner):
        raise ValueError(f"verdicts {verdicts}: their tokens {tokens} repeat or end the prompt")
    dim = {token: k for k, token in enumerate(inner)}  # one embedding dimension per token
    config = Qwen2Config.from_pretrained(base)
    config.tie_word_embeddings = False
    model: Any = Qwen2ForCausalLM(config).float()
    hidden = config.hidden_size
    if len(inner) > hidden:
        raise ValueError(f"verdicts {verdicts}: {len(inner) - 1} tokens, more than {hidden - 1}")
    with torch.no_grad():
        for layer in model.model.layers:  # every layer adds 0 to the residual stream
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for chain in chains:
            for token, nxt in itertools.pairwise(chain):
                k = dim[token]
                model.model.embed_tokens.weight[token, k] = 1.0  # RMSNorm makes it sqrt(hidden)
                model.lm_head.weight[nxt, k] = 20.0
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
