"""Preference rows -> token rows: malformed rows refused with row numbers, the truncation rule,
chat template once with prompt tokens masked, KTO rows, and the paired layout."""

import json

import pytest

from rl_runtime.pipelines.dpo.compose import PreferenceData
from rl_runtime.pipelines.dpo.data import PreferenceDataError, collate, load_preferences


@pytest.fixture(scope="module")
def tok():
    from rl_rollout.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()


def _plan(**kw) -> PreferenceData:
    base = dict(
        train_files=(), eval_files=(), prompt_key="prompt", messages_key=None,
        chosen_key="chosen", rejected_key="rejected", label_key="label",
        completion_key="completion", template="native", sequence_length=256,
        truncation_mode="keep_start",
    )  # fmt: skip
    return PreferenceData(**{**base, **kw})


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_malformed_rows_are_refused_with_their_row_numbers(tmp_path, tok):
    rows = [
        {"prompt": "a", "chosen": "1", "rejected": "2"},
        {"prompt": "b", "rejected": "2"},  # missing chosen
        {"prompt": "c", "chosen": "1", "rejected": "  "},  # empty rejected
        {"prompt": "d", "chosen": "same", "rejected": "same"},  # identical pair
        {"prompt": "e", "chosen": "1", "rejected": "2"},
    ]
    path = _write(tmp_path / "p.jsonl", rows)
    with pytest.raises(PreferenceDataError) as err:
        load_preferences([path], tok, _plan(), paired=True)
    msg = str(err.value)
    assert "3 malformed row(s)" in msg and path in msg
    assert "row 1: missing 'chosen' (chosen_key)" in msg
    assert "row 2: empty 'rejected'" in msg
    assert "row 3: identical 'chosen' and 'rejected'" in msg
    assert "row 0" not in msg and "row 4" not in msg
    assert "no row is usable" not in msg


def test_a_key_no_row_has_is_named_with_the_config_key_and_the_rows_keys(tmp_path, tok):
    """`chosen_key: foo` on rows that say `chosen`: every row is refused; the message names the
    config key and the keys the rows do have."""
    rows = [{"prompt": p, "chosen": "1", "rejected": "2"} for p in "abc"]
    path = _write(tmp_path / "p.jsonl", rows)
    with pytest.raises(PreferenceDataError) as err:
        load_preferences([path], tok, _plan(chosen_key="foo"), paired=True)
    msg = str(err.value)
    assert "row 0: missing 'foo' (chosen_key)" in msg
    assert msg.endswith(
        "no row is usable, the first row's keys are ['chosen', 'prompt', 'rejected']"
    )


def test_renamed_keys_chat_template_once_and_prompt_masked(tmp_path, tok):
    rows = [{"q": "What is 2+2?", "good": "4", "bad": "5"}]
    path = _write(tmp_path / "p.jsonl", rows)
    data = load_preferences(
        [path], tok, _plan(prompt_key="q", chosen_key="good", rejected_key="bad"), paired=True
    )
    (ex,) = data.examples
    text = tok.decode(list(ex.prompt))
    assert text.count("<|im_start|>assistant") == 1 and text.count("What is 2+2?") == 1
    assert list(ex.chosen) == tok("4", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    t = collate(data.examples, 0, [7])
    assert t["input_ids"].shape[0] == 2  # chosen row, rejected row
    assert t["pair_side"].tolist() == [0, 1] and t["pair_id"].tolist() == [7, 7]
    n_prompt = len(ex.prompt)
    assert not t["response_mask"][:, :n_prompt].any()
    assert t["response_mask"][0].sum() == len(ex.chosen)


def test_messages_prompt_and_message_responses(tmp_path, tok):
    rows = [{
        "messages": [{"role": "user", "content": "hi"}],
        "chosen": [{"role": "assistant", "content": "hello"}],
        "rejected": [{"role": "assistant", "content": "go away"}],
    }]  # fmt: skip
    path = _write(tmp_path / "p.jsonl", rows)
    (ex,) = load_preferences([path], tok, _plan(messages_key="messages"), paired=True).examples
    assert tok.decode(list(ex.chosen), skip_special_tokens=True) == "hello"


def test_truncation_rule_is_counted(tmp_path, tok):
    long = "word " * 200
    rows = [
        {"prompt": "p", "chosen": long, "rejected": "no"},  # cut to fit
        {"prompt": long, "chosen": "a", "rejected": "b"},  # prompt alone too long: dropped
        {"prompt": "p", "chosen": "a", "rejected": "b"},
    ]
    path = _write(tmp_path / "p.jsonl", rows)
    keep = load_preferences([path], tok, _plan(sequence_length=64), paired=True)
    assert keep.counts == {"rows": 3, "examples": 3, "truncated": 1, "dropped_too_long": 1}
    assert all(len(e.prompt) + len(e.chosen) <= 64 for e in keep.examples)
    drop = load_preferences(
        [path], tok, _plan(sequence_length=64, truncation_mode="drop"), paired=True
    )
    assert drop.counts == {"rows": 3, "examples": 3, "truncated": 0, "dropped_too_long": 2}


def test_kto_rows_unpaired_and_from_pairs(tmp_path, tok):
    rows = [
        {"prompt": "a", "completion": "yes", "label": True},
        {"prompt": "b", "chosen": "1", "rejected": "2"},
        {"prompt": "c", "completion": "no", "label": "false"},
    ]
    path = _write(tmp_path / "p.jsonl", rows)
    with pytest.raises(PreferenceDataError, match="row 2: 'label' must be true or false"):
        load_preferences([path], tok, _plan(), paired=False)
    path = _write(tmp_path / "q.jsonl", rows[:2])
    data = load_preferences([path], tok, _plan(), paired=False)
    assert [e.desirable for e in data.examples] == [True, True, False]
    assert data.counts == {"rows": 2, "examples": 3, "truncated": 0, "dropped_too_long": 0}
    # a KTO pair row whose chosen side is too long: one of its two examples dropped, counted
    # in examples (the unit of truncated / dropped_too_long), not in rows
    long = _write(tmp_path / "l.jsonl", [{"prompt": "b", "chosen": "word " * 200, "rejected": "2"}])
    cut = load_preferences([long], tok, _plan(sequence_length=64, truncation_mode="drop"),
                           paired=False)  # fmt: skip
    assert cut.counts == {"rows": 1, "examples": 2, "truncated": 0, "dropped_too_long": 1}
    assert [e.desirable for e in cut.examples] == [False]
    with pytest.raises(PreferenceDataError, match="needs loss_type kto"):
        load_preferences([path], tok, _plan(), paired=True)


def test_parquet_rows(tmp_path, tok):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{"prompt": "a", "chosen": "1", "rejected": "2"}])
    pq.write_table(table, tmp_path / "p.parquet")
    data = load_preferences([str(tmp_path / "p.parquet")], tok, _plan(), paired=True)
    assert len(data.examples) == 1


@pytest.mark.parametrize(
    ("row", "why"),
    [  # each was a traceback from the chat template, the tokenizer or `_text` (TypeError,
        # jinja2's UndefinedError, AttributeError) instead of a refused row
        ({"prompt": 123}, "row 0: prompt 'prompt': wrong type int"),
        ({"prompt": {"role": "user"}}, "row 0: prompt 'prompt': wrong type dict"),
        ({"prompt": ["a", "b"]}, r"row 0: prompt 'prompt\[0\]': wrong type str, expected dict"),
        ({"prompt": [{"role": "user"}]}, r"row 0: prompt 'prompt\[0\].content': missing"),
    ],
)
def test_a_prompt_that_is_neither_text_nor_messages_is_a_refused_row(tmp_path, tok, row, why):
    path = _write(tmp_path / "p.jsonl", [{**row, "chosen": "1", "rejected": "2"}])
    with pytest.raises(PreferenceDataError, match=why):
        load_preferences([path], tok, _plan(), paired=True)


def test_messages_with_stray_entries_keep_the_assistant_text(tmp_path, tok):
    """A response list may hold entries that are not messages: they are passed over (one made
    `_text` raise AttributeError)."""
    chosen = [{"role": "assistant", "content": "yes"}, 5, "text"]
    path = _write(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": chosen, "rejected": "no"}])
    (example,) = load_preferences([path], tok, _plan(), paired=True).examples
    assert tok.decode(example.chosen[:-1]) == "yes"


@pytest.mark.parametrize(
    ("name", "data", "why"),
    [  # a JSONDecodeError, a UnicodeDecodeError and pyarrow's ArrowInvalid escaped before
        ("p.json", b"{not json", r"p.json: 1 malformed row\(s\): row 0: line 1 is not JSON"),
        ("p.jsonl", b'{"prompt": "\xff"}\n', "row 0: line 1 is not JSON: byte 0xff"),
        ("p.parquet", b"not parquet", "p.parquet: not a readable parquet file"),
    ],
)
def test_a_file_that_does_not_decode_is_a_preference_data_error(tmp_path, tok, name, data, why):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(PreferenceDataError, match=why):
        load_preferences([str(path)], tok, _plan(), paired=True)


@pytest.mark.parametrize(
    ("chosen", "why"),
    [  # the first two trained on the text "None" and "{'x': 1}"; the last two were reported as
        # "missing 'chosen'", though the row has one
        ([{"role": "assistant", "content": None}], r"row 0: 'chosen\[0\].content': missing"),
        ([{"role": "assistant", "content": {"x": 1}}], r"'chosen\[0\].content': wrong type dict"),
        (5, "row 0: 'chosen': wrong type int, expected str or messages"),
        ({"role": "assistant", "content": "x"}, "row 0: 'chosen': wrong type dict"),
    ],
)
def test_a_response_that_is_neither_text_nor_text_messages_is_a_refused_row(
    tmp_path, tok, chosen, why
):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": chosen, "rejected": "no"}])
    with pytest.raises(PreferenceDataError, match=why):
        load_preferences([path], tok, _plan(), paired=True)
    kto = [{"prompt": "q", "completion": chosen, "label": True}]
    with pytest.raises(PreferenceDataError, match=why.replace("chosen", "completion")):
        load_preferences([_write(tmp_path / "k.jsonl", kto)], tok, _plan(), paired=False)


def test_a_huge_row_is_judged_by_its_length_before_the_tokenizer(tmp_path, tok):
    """An 8 MB response or prompt took minutes in the tokenizer before any length check: it is
    known too long from its characters, and the result is the one full tokenization gives."""
    import time

    words = "the cat sat on the mat and then it ran away quickly "
    huge = words * (8_000_000 // len(words))
    rows = [
        {"prompt": "q1", "chosen": huge, "rejected": "no"},
        {"prompt": huge, "chosen": "yes", "rejected": "no"},
        {"prompt": "q3", "chosen": "yes", "rejected": "no"},
    ]
    path = _write(tmp_path / "p.jsonl", rows)
    start = time.perf_counter()
    data = load_preferences([path], tok, _plan(sequence_length=64), paired=True)
    assert time.perf_counter() - start < 10
    assert data.counts == {"rows": 3, "examples": 3, "truncated": 1, "dropped_too_long": 1}
    cut = data.examples[0]
    full = tok(words * 200, add_special_tokens=False)["input_ids"]  # enough tokens to cut
    room = 64 - len(cut.prompt)
    assert list(cut.chosen) == full[:room] and len(cut.chosen) == room
    dropped = load_preferences([path], tok, _plan(sequence_length=64, truncation_mode="drop"),
                               paired=True)  # fmt: skip
    assert dropped.counts["dropped_too_long"] == 2 and len(dropped.examples) == 1
