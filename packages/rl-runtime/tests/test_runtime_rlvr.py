"""The RLVR pipeline's data: prompts tokenized, held out, cut and counted; overlong prompts
dropped or truncated as asked."""

from __future__ import annotations

import json

import pytest
from rlvr_helpers import SEED, _lengths, _plan

from rl_rollout.templates import get_template
from rl_runtime.pipelines.rlvr.data import RowSampler, load_rlvr_prompts


def test_prompts_are_tokenized_held_out_cut_and_the_sampler_seeded(arith, tok, capsys):
    prompts = load_rlvr_prompts(_plan([arith[0]], arith[1]), tok, SEED)
    assert len(prompts.train.rows) == 81 and len(prompts.val.rows) == 5  # val_batch_size
    assert [r.index for r in prompts.train.rows] == list(range(81))
    assert [len(i) for i in prompts.train.ids] == _lengths(tok, prompts.train.rows)
    assert prompts.metrics == {"data/train_prompts": 81.0, "data/rejected_rows": 0.0,
                               "data/filtered_overlong_prompts": 0.0,
                               "data/val_rejected_rows": 0.0,
                               "data/val_filtered_overlong_prompts": 0.0}  # fmt: skip
    expected = RowSampler(prompts.train.rows, SEED, None)
    assert [prompts.sampler.next(4) for _ in range(3)] == [expected.next(4) for _ in range(3)]
    assert capsys.readouterr().out == ""


def test_rejected_rows_and_overlong_prompts_are_counted_and_printed(arith, tok, tmp_path, capsys):
    """A second training file: one prompt longer than every arithmetic prompt, one broken row."""
    long_row = {"prompt": [{"role": "user", "content": "1+1= " * 30}],
                "reward_model": {"ground_truth": "2"}}  # fmt: skip
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps(long_row) + "\n{not json\n")
    limit = max(_lengths(tok, load_rlvr_prompts(_plan([arith[0]], None), tok, SEED).train.rows))
    capsys.readouterr()
    prompts = load_rlvr_prompts(_plan([arith[0], str(extra)], None, prompt_length=limit), tok, 0)
    assert prompts.metrics == {"data/train_prompts": 81.0, "data/rejected_rows": 1.0,
                               "data/filtered_overlong_prompts": 1.0}  # fmt: skip
    assert len(prompts.train.rows) == 81 and not prompts.val.rows
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("warning: rejected ") and "row 1" in out[0]
    assert out[1] == f"filtered 1 prompts longer than prompt_length={limit}"


def test_overlong_held_out_prompts_are_counted_and_printed(arith, tok, tmp_path, capsys):
    """Held-out prompts longer than prompt_length were dropped without a word: the evaluation
    measured the short prompts only. Two of three held-out prompts here are too long."""

    def row(text: str) -> str:
        return json.dumps({"prompt": [{"role": "user", "content": text}],
                           "reward_model": {"ground_truth": "2"}})  # fmt: skip

    val = tmp_path / "val.jsonl"
    val.write_text("\n".join([row("1+1="), row("1+1= " * 30), row("2+2= " * 40)]) + "\n")
    limit = max(_lengths(tok, load_rlvr_prompts(_plan([arith[0]], None), tok, SEED).train.rows))
    capsys.readouterr()
    prompts = load_rlvr_prompts(_plan([arith[0]], str(val), prompt_length=limit), tok, SEED)
    assert len(prompts.val.rows) == 1
    assert prompts.metrics["data/val_filtered_overlong_prompts"] == 2.0
    assert prompts.metrics["data/val_rejected_rows"] == 0.0
    assert capsys.readouterr().out == (
        f"filtered 2 held-out prompts longer than prompt_length={limit}\n"
    )


def test_truncate_prompt_keeps_the_side_verl_keeps():
    from rl_runtime.pipelines.rlvr.data import truncate_prompt

    ids = [1, 2, 3, 4, 5, 6, 7]
    assert truncate_prompt(ids, 4, "left") == [4, 5, 6, 7]
    assert truncate_prompt(ids, 4, "right") == [1, 2, 3, 4]
    assert truncate_prompt(ids, 5, "middle") == [1, 2, 5, 6, 7]  # 5 // 2 first, 3 last
    assert truncate_prompt(ids, 7, "left") == ids and truncate_prompt(ids, 9, "middle") == ids
    with pytest.raises(ValueError, match="prompt_truncation='drop'"):
        truncate_prompt(ids, 4, "drop")


@pytest.mark.parametrize("how", ["left", "right"])
def test_overlong_prompts_are_truncated_not_dropped_when_asked(arith, tok, tmp_path, how, capsys):
    """prompt_truncation=left|right (verl's data.truncation): a prompt longer than prompt_length
    is kept, cut to its last (left) or first (right) prompt_length tokens, and counted; the
    default drops it (the other test above)."""
    long_row = {"prompt": [{"role": "user", "content": "1+1= " * 30}],
                "reward_model": {"ground_truth": "2"}}  # fmt: skip
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps(long_row) + "\n")
    limit = max(_lengths(tok, load_rlvr_prompts(_plan([arith[0]], None), tok, SEED).train.rows))
    capsys.readouterr()
    plan = _plan([arith[0], str(extra)], None, prompt_length=limit, prompt_truncation=how)
    prompts = load_rlvr_prompts(plan, tok, 0)
    assert prompts.metrics == {"data/train_prompts": 82.0, "data/rejected_rows": 0.0,
                               "data/filtered_overlong_prompts": 0.0,
                               "data/truncated_prompts": 1.0}  # fmt: skip
    (full,) = [
        tok(get_template("native", tok).prefix(long_row["prompt"]), add_special_tokens=False)[
            "input_ids"
        ]
    ]
    assert len(full) > limit and prompts.train.rows[-1].prompt == long_row["prompt"]
    expected = full[-limit:] if how == "left" else full[:limit]
    assert prompts.train.ids[-1] == expected and len(prompts.train.ids[-1]) == limit
    assert capsys.readouterr().out == (
        f"truncated 1 prompts to prompt_length={limit} tokens (prompt_truncation={how})\n"
    )
