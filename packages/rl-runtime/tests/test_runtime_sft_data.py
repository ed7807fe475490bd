"""Supervised rows -> token rows: the loss mask on a hand-built example (prompt masked, answer
and end-of-turn trained), multi-turn conversations (assistant turns only), ROLL's
prompt/query/response rows, malformed rows refused with file and row numbers, truncation."""

import json

import pytest

from rl_runtime.step.sft_data import (
    SFTDataError,
    SFTExample,
    SFTFields,
    collate,
    encode_messages,
    first_rows_problem,
    load_sft,
)

SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"


@pytest.fixture(scope="module")
def tok():
    from rl_rollout.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()


def _ids(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _trained(tok, ex: SFTExample) -> str:
    return tok.decode([t for t, m in zip(ex.token_ids, ex.loss_mask) if m])


def _context(tok, ex: SFTExample) -> str:
    return tok.decode([t for t, m in zip(ex.token_ids, ex.loss_mask) if not m])


def test_hand_built_prompt_response_example_masks_the_prompt(tmp_path, tok):
    """One row, written out by hand: the ChatML prompt (system, user, assistant header) is
    context, the answer and its <|im_end|> are trained; the ids are the pieces tokenized alone."""
    path = _write(tmp_path / "a.jsonl", [{"instruction": "add 2 and 3", "output": "5"}])
    got = load_sft([path], tok, SFTFields(template="qwen2_5")).examples[0]
    prompt = SYSTEM + "<|im_start|>user\nadd 2 and 3<|im_end|>\n<|im_start|>assistant\n"
    answer = "5<|im_end|>"
    want_ids = _ids(tok, prompt) + _ids(tok, answer)
    assert list(got.token_ids) == want_ids
    n = len(_ids(tok, prompt))
    assert list(got.loss_mask) == [False] * n + [True] * len(_ids(tok, answer))
    assert _trained(tok, got) == "5<|im_end|>"
    # the same with the tokenizer's own template (native): same text, same tokens
    native = load_sft([path], tok, SFTFields(template="native")).examples[0]
    assert native == got


def test_query_and_system_keys_build_roll_s_conversation(tmp_path, tok):
    row = {"instruction": "sum", "input": "2 3", "sys": "be brief", "output": "5"}
    path = _write(tmp_path / "a.jsonl", [row])
    fields = SFTFields(template="qwen2_5", query_key="input", system_key="sys")
    ex = load_sft([path], tok, fields).examples[0]
    assert _context(tok, ex) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nsum\n2 3<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert _trained(tok, ex) == "5<|im_end|>"


def test_multi_turn_trains_on_assistant_turns_only(tok):
    from rl_rollout.templates import get_template

    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second"},
        {"role": "tool", "content": "result 7"},
        {"role": "assistant", "content": "two"},
    ]
    ex = encode_messages(messages, get_template("native", tok), tok)
    pieces = [
        (SYSTEM + "<|im_start|>user\nfirst<|im_end|>\n<|im_start|>assistant\n", False),
        ("one<|im_end|>", True),
        ("\n<|im_start|>user\nsecond<|im_end|>\n<|im_start|>tool\nresult 7<|im_end|>\n"
         "<|im_start|>assistant\n", False),
        ("two<|im_end|>", True),
    ]  # fmt: skip
    want_ids = [t for text, _ in pieces for t in _ids(tok, text)]
    want_mask = [m for text, m in pieces for _ in _ids(tok, text)]
    assert list(ex.token_ids) == want_ids and list(ex.loss_mask) == want_mask
    assert _trained(tok, ex) == "one<|im_end|>two<|im_end|>"


def test_a_template_that_rewrites_earlier_turns_is_refused_by_row(tmp_path, tok):
    """A template that renders a past assistant turn unlike its generation (here: a tokenizer
    template that drops earlier assistant turns) cannot give a faithful mask: the row is refused."""
    import copy

    tok2 = copy.deepcopy(tok)
    tok2.chat_template = (
        "{%- for m in messages %}{%- if m['role'] != 'assistant' or loop.last %}"
        "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    rows = [{"messages": msgs}, {"messages": msgs + msgs}]
    path = _write(tmp_path / "m.jsonl", rows)
    with pytest.raises(SFTDataError, match=r"1 malformed row\(s\): row 1: template 'native'"):
        load_sft([path], tok2, SFTFields())


def test_malformed_rows_are_refused_with_file_row_and_line(tmp_path, tok):
    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps(good) + "\n"
        + "{not json\n"
        + json.dumps({"messages": [{"role": "user", "content": "no answer"}]}) + "\n"
        + json.dumps({"instruction": "q"}) + "\n"
        + json.dumps({"messages": [{"role": "wizard", "content": "x"},
                                   {"role": "assistant", "content": "y"}]}) + "\n"
        + json.dumps({"instruction": "q", "output": "   "}) + "\n"
        + json.dumps([1, 2]) + "\n"
    )  # fmt: skip
    with pytest.raises(SFTDataError) as err:
        load_sft([str(path)], tok, SFTFields())
    msg = str(err.value)
    assert msg.startswith(f"{path}: 6 malformed row(s)")
    assert "row 1: not JSON (line 2)" in msg
    assert "row 2: 'messages' (line 3): no assistant message" in msg
    assert (
        "row 3: 'output' (line 4): missing, expected text; the row's keys are ['instruction']"
        in msg
    )
    assert "row 4: 'messages[0].role' (line 5): unknown role 'wizard'" in msg
    assert "row 5: 'output' (line 6): empty" in msg
    assert "row 6: 'row' (line 7): wrong type list" in msg
    assert "row 0" not in msg
    assert "row 3" in (first_rows_problem(str(path), SFTFields(), 4) or "")


def test_parquet_rows_and_messages_as_json_string(tmp_path, tok):
    from rl_envs.tasks.data import write_parquet_rows

    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    path = tmp_path / "d.parquet"
    write_parquet_rows(path, [{"messages": json.dumps(msgs)}, {"messages": json.dumps(msgs)}])
    got = load_sft([str(path)], tok, SFTFields())
    assert got.counts["rows"] == 2 and len(got.examples) == 2
    assert _trained(tok, got.examples[0]) == "yo<|im_end|>"


def test_too_long_rows_keep_their_start_or_are_dropped(tmp_path, tok):
    long_prompt = "word " * 80
    rows = [{"instruction": "hi", "output": "one two three four five six"},
            {"instruction": long_prompt, "output": "x"}]  # fmt: skip
    path = _write(tmp_path / "a.jsonl", rows)
    full = load_sft([path], tok, SFTFields(sequence_length=4096)).examples[0]
    first_trained = full.loss_mask.index(True)
    got = load_sft([path], tok, SFTFields(sequence_length=first_trained + 2))
    assert got.counts == {"rows": 2, "examples": 2, "truncated": 1, "dropped_too_long": 1,
                          "trained_tokens": 2}  # fmt: skip
    assert got.examples[0].token_ids == full.token_ids[: first_trained + 2]


def test_collate_right_pads_with_the_mask_aligned(tok):
    a = SFTExample((5, 6, 7), (False, True, True))
    b = SFTExample((8, 9), (False, True))
    t = collate([a, b], pad_token_id=0)
    assert t["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert t["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert t["response_mask"].tolist() == [[False, True, True], [False, True, False]]


@pytest.mark.parametrize("max_length", [None, 5])
def test_warm_up_rows_from_trajectories_collate_as_trajectories_do(max_length):
    """The warm-ups' demonstrations as SFT rows (examples_from_trajectories, then collate) give
    the tensors collate_trajectories gave them before: ids, attention and the trained mask,
    a failed demonstration trained on nowhere, long ones cut on the right."""
    import torch

    from rl_config.records import Trajectory
    from rl_runtime.step.collate import collate_trajectories
    from rl_runtime.step.sft_data import collate, examples_from_trajectories

    def traj(ids: list[int], prompt: int, failed: bool = False) -> Trajectory:
        return Trajectory(traj_id=f"t{len(ids)}", group_id="g", tag="x", env_seed=0,
                          token_ids=ids, prompt_length=prompt,
                          response_mask=[i >= prompt for i in range(len(ids))],
                          rollout_log_probs=[0.0] * len(ids), failed=failed)  # fmt: skip

    trajs = [traj([5, 6, 7, 8, 9, 10, 11], 3), traj([5, 6, 9], 2), traj([4, 3, 2, 1], 1, True)]
    old = collate_trajectories(trajs, pad_token_id=0, max_length=max_length).tensors
    new = collate(examples_from_trajectories(trajs, max_length), 0)
    for key in ("input_ids", "attention_mask", "response_mask"):
        assert torch.equal(new[key], old[key]), key
        assert new[key].dtype == old[key].dtype, key
    assert int(new["response_mask"][2].sum()) == 0
