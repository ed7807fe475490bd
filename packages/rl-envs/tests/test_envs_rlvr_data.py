"""RLVR data: verl parquet and ROLL jsonl, malformed rows named by file and row, domains, the
overlong filter, domain mixing and a sampler that resumes mid-epoch with the next unseen rows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_envs.rewards import reward_router_spec
from rl_envs.tasks import (
    DataError,
    EpochSampler,
    PromptSampler,
    TaskRow,
    data_spec,
    domain_quotas,
    filter_overlong_prompts,
    load_dataset,
)


def _verl(i: int, source: str = "openai/gsm8k") -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        "extra_info": {"split": "train", "index": i},
    }


def _roll(i: int, tag: str, **extra) -> dict:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"q{i}"}]
    return {"id": f"r{i}", "tag": tag, "messages": json.dumps(messages), "ground_truth": str(i),
            "prompt": f"q{i}", **extra}  # fmt: skip


def _jsonl(path, rows) -> str:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_verl_parquet_and_roll_jsonl_load_with_domains(tmp_path):
    parquet = tmp_path / "gsm8k.parquet"
    pq.write_table(pa.Table.from_pylist([_verl(i) for i in range(3)]), parquet)
    code = {"test_cases": json.dumps([{"assert_code": "assert f(1) == 2"}]), "case_type": "assert"}
    roll = _jsonl(tmp_path / "roll.jsonl", [_roll(0, "deepmath_103k"), _roll(1, "KodCode", **code)])
    spec = reward_router_spec(
        {
            "math_rule": {
                "worker_cls": "roll.x.MathRuleRewardWorker",
                "tag_included": ["deepmath_103k", "openai/gsm8k"],
            },
            "code_sandbox": {"tag_included": ["KodCode"]},
        }
    )
    dataset = load_dataset(
        data_spec(
            {"file_name": [str(parquet), roll], "messages": "messages", "tag": "tag"},
            tag_to_domain=spec.tag_to_domain(),
            default_domain=spec.default_domain,
        )
    )
    assert dataset.per_file == {str(parquet): 3, roll: 2}
    verl_row, roll_row, code_row = dataset.rows[0], dataset.rows[3], dataset.rows[4]
    assert verl_row.prompt == [{"role": "user", "content": "What is 0 + 1?"}]
    assert verl_row.ground_truth == "1" and verl_row.domain == "math_rule"
    assert verl_row.columns["ability"] == "math" and verl_row.extra_info["index"] == 0
    assert roll_row.prompt[0] == {"role": "system", "content": "Be brief."}  # messages win
    assert (roll_row.tag, roll_row.row_id, roll_row.domain) == ("deepmath_103k", "r0", "math_rule")
    assert code_row.domain == "code_sandbox" and code_row.columns["case_type"] == "assert"
    assert dataset.domains() == {"math_rule": 4, "code_sandbox": 1}
    # ROLL names JSON-lines files .json too
    as_json = tmp_path / "roll.json"
    as_json.write_text(Path(roll).read_text())
    assert len(load_dataset(data_spec({"file_name": str(as_json)})).rows) == 2
    # ROLL's prompt column (text) when no messages key is configured
    text = load_dataset(data_spec({"file_name": roll, "prompt": "prompt"})).rows[0]
    assert text.prompt == [{"role": "user", "content": "q0"}] and not text.is_chat
    assert text.prompt_text == "q0"


def test_malformed_rows_are_rejected_naming_file_row_and_field(tmp_path):
    rows = [
        _roll(0, "math"),  # 0 fine
        {"id": "x", "tag": "math", "ground_truth": "1"},  # 1 no prompt, no messages
        {**_roll(2, "math"), "ground_truth": ["2"]},  # 2 ground truth of the wrong type
        {**_roll(3, "math"), "messages": "[{not json"},  # 3 messages not JSON
        {**_roll(4, "math"), "messages": json.dumps([{"role": "user"}])},  # 4 no content
        {**_roll(5, "math"), "ground_truth": None},  # 5 no ground truth, no tests
        {**_roll(6, "code"), "test_cases": json.dumps([{"nope": 1}]), "case_type": "assert"},
        {**_roll(7, "code"), "test_cases": "[]", "case_type": "assert"},  # 7 empty tests
        {**_roll(8, "code"), "test_cases": json.dumps(["assert 1"]), "case_type": "text"},
        {**_roll(9, "math"), "ground_truth": float("inf")},  # 9 not finite
        {**_roll(10, "math"), "extra_info": "oops"},  # 10 extra_info not a dict
        {**_roll(11, "math"), "messages": "[]"},  # 11 no messages (said "wrong type list")
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows).replace("Infinity", "1e999") + "\n")
    spec = data_spec({"file_name": str(path), "messages": "messages", "prompt": "question"})
    with pytest.raises(DataError) as err:
        load_dataset(spec)
    text = str(err.value)
    assert text.startswith("11 malformed rows")
    expected = {
        1: ("question", "missing"),
        2: ("ground_truth", "wrong type list"),
        3: ("messages", "not a JSON list"),
        4: ("messages[0].content", "missing"),
        5: ("ground_truth", "missing"),
        6: ("test_cases", "test 0: needs assert_code"),
        7: ("test_cases", "non-empty list"),
        8: ("test_cases", "case_type 'text' is not supported"),
        9: ("ground_truth", "is inf"),
        10: ("extra_info", "wrong type str"),
        11: ("messages", "empty: a list of no messages"),
    }
    for row, (field, reason) in expected.items():
        line = next(t for t in text.splitlines() if f"row {row}:" in t)
        assert line.startswith(f"{path}: row {row}: field {field!r}"), line
        assert reason in line, line
    skipped = load_dataset(data_spec({"file_name": str(path), "messages": "messages"},
                                     on_bad_row="skip"))  # fmt: skip
    assert [r.index for r in skipped.rows] == [0] and len(skipped.rejected) == 11
    assert skipped.rejected[0].source == str(path)


def test_image_inputs_are_an_error_naming_row_and_field_even_when_skipping(tmp_path):
    """Text-only loading: a row with images is refused (never dropped, never read as text)."""
    image_part = [{"type": "image"}, {"type": "text", "text": "What angle?"}]
    rows = [
        _roll(0, "math", images=[]),  # an empty image column is fine
        _roll(1, "math"),
        _roll(2, "math", images=[{"path": "a.png"}]),
        {**_roll(3, "math"), "messages": json.dumps([{"role": "user", "content": image_part}])},
    ]
    path = _jsonl(tmp_path / "vl.jsonl", rows)
    with pytest.raises(DataError) as err:
        load_dataset(data_spec({"file_name": path, "messages": "messages"}, on_bad_row="skip"))
    lines = str(err.value).splitlines()
    assert lines[0] == "2 rows cannot be used:"
    assert lines[1].startswith(f"{path}: row 2: field 'images': images input: multimodal")
    assert lines[2].startswith(f"{path}: row 3: field 'messages[0].content': image/video content")
    ok = load_dataset(data_spec({"file_name": _jsonl(tmp_path / "t.jsonl", rows[:2]),
                                 "messages": "messages"}))  # fmt: skip
    assert len(ok.rows) == 2


def test_rows_of_no_domain_and_missing_files_are_errors(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [_roll(0, "known"), _roll(1, "stray")])
    spec = data_spec(
        {"file_name": path, "messages": "messages"}, tag_to_domain={"known": "code_sandbox"}
    )
    with pytest.raises(DataError, match=r"row 1: field 'tag': tag 'stray' is in no rewards"):
        load_dataset(spec)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_dataset(data_spec({"file_name": [path, str(tmp_path / "missing.jsonl")]}))
    with pytest.raises(DataError, match="file_name"):
        data_spec({"file_name": None})


@pytest.mark.parametrize(
    ("name", "data", "why"),
    [  # pyarrow's ArrowInvalid and a bare ValueError escaped the apps' data-error handling
        ("d.parquet", b"PAR1 not parquet", "d.parquet: not a readable parquet file"),
        ("d.json", b'{"rows": []}', "d.json: expected a JSON list of rows"),
        ("d.csv", b"prompt\n1 + 1\n", "d.csv: unsupported dataset format"),
    ],
)
def test_a_file_that_is_no_table_is_a_data_error_naming_it(tmp_path, name, data, why):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError, match=why):
        load_dataset(data_spec({"file_name": str(path)}))


def _row(i: int, domain: str | None = None, words: int = 1) -> TaskRow:
    content = " ".join(["w"] * words)
    return TaskRow(i, [{"role": "user", "content": content}], str(i), "src", domain=domain)


class _WhitespaceTokenizer:
    """A tokenizer-like object: one token per word plus 3 for the chat template."""

    chat_template = "x"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and tokenize
        return list(range(sum(len(m["content"].split()) for m in messages) + 3))


def test_filter_overlong_prompts_counts_what_it_drops():
    from rl_envs.tasks import chat_token_counter

    rows = [_row(0, words=2), _row(1, words=8), _row(2, words=5), _row(3, words=9)]
    kept, report = filter_overlong_prompts(rows, chat_token_counter(_WhitespaceTokenizer()), 8)
    assert [r.index for r in kept] == [0, 2]  # 5 and 8 tokens
    assert (report.kept, report.dropped, report.longest) == (2, 2, 12)
    assert report.dropped_rows == (("", 1), ("", 3))


def test_sampler_resumes_mid_epoch_with_the_next_unseen_prompts():
    rows = [_row(i) for i in range(10)]
    straight = PromptSampler(rows, seed=7)
    batches = [[r.index for r in straight.next_batch(3)] for _ in range(7)]
    first_epoch = batches[0] + batches[1] + batches[2] + batches[3][:1]
    assert sorted(first_epoch) == list(range(10))  # one epoch: every prompt once
    assert first_epoch != list(range(10))  # shuffled
    second_epoch = batches[3][1:] + batches[4] + batches[5] + batches[6][:2]
    assert sorted(second_epoch) == list(range(10)) and second_epoch != first_epoch

    interrupted = PromptSampler(rows, seed=7)
    for _ in range(2):
        interrupted.next_batch(3)  # 6 of 10 prompts of epoch 0 seen
    state = json.loads(json.dumps(interrupted.state_dict()))  # what a checkpoint holds
    assert state["domains"]["__all__"]["epoch"] == 0
    assert state["domains"]["__all__"]["position"] == 6
    resumed = PromptSampler(rows, seed=7)
    resumed.load_state_dict(state)
    rest = [[r.index for r in resumed.next_batch(3)] for _ in range(5)]
    assert rest == batches[2:]
    unseen = set(range(10)) - set(batches[0] + batches[1])
    assert set(rest[0] + rest[1][:1]) == unseen  # the next prompts are the unseen ones

    other_seed = PromptSampler(rows, seed=8)
    with pytest.raises(ValueError, match="seed"):
        other_seed.load_state_dict(state)
    with pytest.raises(ValueError, match="size"):
        PromptSampler(rows[:9], seed=7).load_state_dict(state)


def test_domain_probs_below_1_leave_the_remainder_to_the_last_domain(caplog):
    """ROLL gives the last domain the rest of a batch, so probabilities summing to 0.9 run there;
    they were refused here. Now they run as in ROLL, with a warning; nonsense is still refused."""
    from rl_envs.tasks.sampler import check_domain_probs, remainder_note

    rows = [_row(i, "a") for i in range(10)] + [_row(10 + i, "b") for i in range(10)]
    probs = {"a": 0.5, "b": 0.4}
    assert check_domain_probs(probs) == pytest.approx(0.9)
    assert remainder_note(probs) == (
        "domain_interleave_probs sums to 0.9, not 1: the last domain 'b' takes the remainder of "
        "each batch (0.5 of it, not 0.4), as ROLL does"
    )
    with caplog.at_level("WARNING"):
        sampler = PromptSampler(rows, seed=1, domain_interleave_probs=probs)
    assert "sums to 0.9" in caplog.text
    assert [r.domain for r in sampler.next_batch(10)] == ["a"] * 5 + ["b"] * 5
    assert remainder_note({"a": 0.5, "b": 0.5}) == ""
    for bad, message in [({"a": 0.6, "b": 0.6}, "at most 1, got 1.2"), ({"a": 0, "b": 0}, "all be 0"),
                         ({"a": -0.1, "b": 1.0}, ">= 0"), ({"a": float("nan")}, ">= 0"),
                         ({"a": True}, ">= 0")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            check_domain_probs(bad)


def test_domain_mixing_follows_roll_quotas_and_is_deterministic():
    rows = [_row(i, "math_rule") for i in range(20)] + [_row(20 + i, "code") for i in range(5)]
    rows += [_row(40, "ifeval")]
    probs = {"math_rule": 0.7, "code": 0.3}
    assert domain_quotas(probs, 8) == {"math_rule": 5, "code": 3}
    assert domain_quotas({"a": 0.5, "b": 0.25, "c": 0.25}, 3) == {"a": 1, "b": 0, "c": 2}
    sampler = PromptSampler(rows, seed=1, domain_interleave_probs=probs)
    assert sampler.unsampled == {"ifeval": 1}
    batch = sampler.next_batch(8)
    assert [r.domain for r in batch] == ["math_rule"] * 5 + ["code"] * 3
    again = PromptSampler(rows, seed=1, domain_interleave_probs=probs)
    assert [r.index for r in again.next_batch(8)] == [r.index for r in batch]
    assert [r.index for r in PromptSampler(rows, 2, probs).next_batch(8)] != [
        r.index for r in batch
    ]
    # the code domain (5 rows, 3 per batch) wraps into its second epoch independently
    second = sampler.next_batch(8)
    codes = [r.index for r in batch + second if r.domain == "code"]
    assert sorted(codes[:5]) == list(range(20, 25))
    assert sampler.samplers["code"].epoch == 1 and sampler.samplers["math_rule"].epoch == 0
    refill = sampler.draw(2, "code")
    assert all(r.domain == "code" for r in refill)
    with pytest.raises(ValueError, match="sum to at most 1"):
        PromptSampler(rows, 1, {"math_rule": 0.7, "code": 0.4})
    with pytest.raises(ValueError, match="no rows"):
        PromptSampler(rows, 1, {"math_rule": 0.5, "llm_judge": 0.5})


def test_epoch_sampler_state_roundtrip_at_epoch_boundary():
    a = EpochSampler(4, seed=3)
    first = a.take(4)
    state = a.state_dict()
    b = EpochSampler(4, seed=3)
    b.load_state_dict(state)
    assert a.take(6) == b.take(6) and sorted(first) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="out of range"):
        b.load_state_dict({**state, "position": 9})


def test_a_file_without_a_usable_row_says_why_in_one_line(tmp_path):
    """A parquet whose prompt column is missing: the error gives the reason and the columns the
    file has, once (not only row by row)."""
    rows = [{k: v for k, v in _verl(i).items() if k != "prompt"} for i in range(5)]
    path = tmp_path / "no_prompt.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DataError) as info:  # skipping bad rows (as apps/rlvr does) leaves none
        load_dataset(data_spec({"file_name": str(path)}, on_bad_row="skip"))
    (line,) = str(info.value).splitlines()
    assert line == (
        f"no usable rows in [{str(path)!r}]: all 5 rows rejected; field 'prompt': missing (no "
        "column 'prompt'; columns: ['ability', 'data_source', 'extra_info', 'reward_model']) "
        "(5 rows)"
    )


def test_require_files_names_the_key_and_every_missing_file(tmp_path):
    from rl_envs.tasks import require_files

    here = _jsonl(tmp_path / "here.jsonl", [_roll(0, "t")])
    require_files("actor_train.data_args.file_name", [here])  # present: nothing raised
    with pytest.raises(FileNotFoundError) as info:
        require_files("validation.data_args.file_name", [here, "a.jsonl", "b.parquet"])
    assert str(info.value) == (
        "validation.data_args.file_name: dataset file not found: a.jsonl, b.parquet"
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_a_named_pipe_as_a_data_file_is_refused_by_name(tmp_path, suffix):
    """It blocked for ever waiting for a writer."""
    import threading

    from rl_envs.tasks.data import DataFileError, read_records

    fifo = tmp_path / f"rows{suffix}"
    os.mkfifo(fifo)
    box: dict = {}

    def read() -> None:
        try:
            read_records(str(fifo))
        except Exception as exc:
            box["error"] = exc

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():  # unblock the reader the old code left waiting
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a named pipe blocked")
    assert isinstance(box.get("error"), DataFileError), box
    assert str(fifo) in str(box["error"]) and "named pipe" in str(box["error"])
