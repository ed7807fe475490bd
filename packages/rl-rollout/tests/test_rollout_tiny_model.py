from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl_rollout.tiny_model import build_tiny_model


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_loads_with_auto_classes(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    cfg = model.config
    assert cfg.hidden_size // cfg.num_attention_heads >= 64
    assert cfg.vocab_size == len(tok) <= 2048
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert cfg.eos_token_id == tok.eos_token_id
    assert tok.convert_tokens_to_ids("<|im_start|>") != tok.unk_token_id


def test_chat_template_is_qwen_style(tiny_tokenizer) -> None:
    msgs = [{"role": "user", "content": "Push the box # _ O X P. 12 + 3 = 15"}]
    text = tiny_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nPush the box # _ O X P. 12 + 3 = 15<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text
    assert ids.count(tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_saved_tokenizer_json_agrees_with_loaded_tokenizer(
    tiny_model_dir: Path, tiny_tokenizer
) -> None:
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    text = "Hello  world!\n\n  # _ O\tX 1234 √√ <|im_end|>\n<|im_start|>user x"
    assert (
        raw.encode(text, add_special_tokens=False).ids
        == tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    )


def test_deterministic_and_idempotent(tmp_path: Path, tiny_model_dir: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert _digest(again / name) == _digest(tiny_model_dir / name), name
    mtime = (again / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(again, seed=0) == again
    assert (again / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rebuilt
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert _digest(other / "model.safetensors") != _digest(again / "model.safetensors")
    # same dir, different parameters -> rebuilt
    build_tiny_model(again, seed=1)
    assert _digest(again / "model.safetensors") == _digest(other / "model.safetensors")


def test_a_link_to_a_built_model_is_reused_or_replaced_never_followed(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A link to a complete model with the same parameters is that model; a link to one with
    other parameters is replaced by a directory of its own, and the linked model stays whole
    (before, the build failed: a directory cannot replace a link)."""
    shared_files = {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()}
    same = tmp_path / "same"
    same.symlink_to(tiny_model_dir, target_is_directory=True)
    assert build_tiny_model(same, seed=0) == same and same.is_symlink()
    other = tmp_path / "other"
    other.symlink_to(tiny_model_dir, target_is_directory=True)
    built = build_tiny_model(other, hidden_size=64, num_heads=1, intermediate_size=64)
    assert built == other and not other.is_symlink()
    assert AutoModelForCausalLM.from_pretrained(other).config.hidden_size == 64
    assert {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()} == shared_files
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere", target_is_directory=True)
    assert not build_tiny_model(dangling, hidden_size=64, num_heads=1).is_symlink()


def test_rejects_small_head_dim(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="head_dim"):
        build_tiny_model(tmp_path / "bad", hidden_size=64, num_heads=2)


def test_model_distribution_is_not_flat(tiny_model_dir: Path, tiny_tokenizer) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.tensor(
        [tiny_tokenizer("the box is on the target", add_special_tokens=False)["input_ids"]]
    )
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0, -1].float(), -1)
    entropy = -(lp.exp() * lp).sum().item()
    assert entropy < torch.log(torch.tensor(float(len(tiny_tokenizer)))).item() - 0.2
