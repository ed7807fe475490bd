"""The benchmark model shared by tools/bench/dpo_step.py and grpo_step.py.

`build_trl_bench_model(dir)`: Qwen2 architecture, hidden 256, 4 layers, intermediate 1024, 4
heads, 2 KV heads, tied embeddings, a character-level tokenizer of 99 tokens (95 printable ASCII
characters + pad, eos, bos, unk): about 4.0M parameters. Built locally (no hub), deterministic,
saved with `save_pretrained`, so TRL and this stack load the very same files.
"""

from __future__ import annotations

import string
from pathlib import Path

CHARS = [c for c in string.printable if c.isprintable()]  # 95: space .. ~
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]


def char_tokenizer():
    """A `PreTrainedTokenizerFast` with one token per printable ASCII character (99 tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
    )


def build_trl_bench_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Build (or rebuild) the ~4.0M-parameter benchmark model + tokenizer in `out_dir`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    tok = char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        use_sliding_window=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
