"""The GRPO benchmark's model: a ~4.0M-parameter Qwen2 with a character-level vocabulary of 99.

The model TRL's GRPO step was measured with: Qwen2 architecture, hidden 256, 4 layers,
intermediate 1024, 4 heads, 2 KV heads, tied embeddings. The vocabulary is 3 special tokens
(Qwen2.5's `<|endoftext|>` = pad, `<|im_start|>`, `<|im_end|>` = eos) plus the 96 characters
printable ASCII and newline, one token each (a byte-level BPE without merges, so that the
tokenizer transformers builds for model_type qwen2 encodes exactly one token per character; other
characters have no token and are dropped). Built locally and saved with
`save_pretrained` (nothing is downloaded), like `rl_rollout.tiny_model`, and loadable by plain
transformers (TRL's side of the benchmark runs in another environment).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "CHARS",
    "SPECIAL_TOKENS",
    "build_char_model",
    "build_char_tokenizer",
    "parameter_count",
]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
_MARKER = "char_model.json"


def build_char_tokenizer():
    """A Qwen2-style byte-level BPE tokenizer with no merges: one token per character of `CHARS`
    (99 tokens in all). Qwen2's own normaliser and pre-tokeniser, as `rl_rollout.tiny_model`
    uses, because transformers rebuilds them for model_type qwen2 on load."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rl_rollout.tiny_model import QWEN2_PRETOKENIZE_REGEX

    as_byte_level = {" ": "\u0120", "\n": "\u010a"}  # ByteLevel's stand-ins for space, newline
    tokens = SPECIAL_TOKENS + [as_byte_level.get(c, c) for c in CHARS]
    tok = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=[],
            unk_token=None,
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    fast.padding_side = "left"
    return fast


def build_char_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 256,
    num_layers: int = 4,
    intermediate_size: int = 1024,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
    max_position_embeddings: int = 1024,
) -> Path:
    """Build (or reuse, if built with the same parameters) the model + tokenizer in ``out_dir``.

    Deterministic for a seed; written to a sibling temp dir and renamed into place. Returns the
    directory."""
    out = Path(out_dir)
    params = {
        "format": 1,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "intermediate_size": intermediate_size,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "seed": seed,
        "max_position_embeddings": max_position_embeddings,
    }
    marker = out / _MARKER
    if marker.is_file() and json.loads(marker.read_text()) == params:
        return out

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_char_tokenizer()
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_sliding_window=False,
    )
    config.dtype = torch.float32
    saved = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    finally:
        torch.random.set_rng_state(saved)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=True
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps(params, sort_keys=True))
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def parameter_count(model_dir: str | Path) -> int:
    """Distinct parameters in the saved weights (tied embeddings are stored, and counted, once)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(Path(model_dir) / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            n = 1
            for dim in f.get_slice(name).get_shape():
                n *= int(dim)
            total += n
    return total
