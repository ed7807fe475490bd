"""Dataset rows (parquet/jsonl, malformed rows), single-turn envs, Countdown, tool use."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_envs import make_env
from rl_envs.tasks import CountdownEnv, SingleTurnEnv, ToolEnv, generate_countdown, load_rows
from rl_envs.tasks.data import RowKeys, write_parquet_rows

pytestmark = pytest.mark.xdist_group("dist")  # starts sandbox worker processes

GOOD = {
    "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
    "data_source": "openai/gsm8k",
    "reward_model": {"ground_truth": "5", "style": "rule"},
    "extra_info": {"split": "train", "index": 0},
}


def _verl_row(content, truth="5"):
    return {**GOOD, "prompt": [{"role": "user", "content": content}],
            "reward_model": {"ground_truth": truth, "style": "rule"}}  # fmt: skip


def test_parquet_malformed_rows_are_rejected_with_row_numbers(tmp_path):
    rows = [
        GOOD,  # 0
        _verl_row("What is 1 + 1?", truth=None),  # 1 missing ground truth
        _verl_row(None),  # 2 missing content
        _verl_row("q" * 40_000),  # 3 overlong
        _verl_row("z" * (10 * 1024 * 1024)),  # 4 a 10 MB string
        _verl_row("What is 4 + 4?", truth="8"),  # 5
    ]
    path = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    report = load_rows(str(path))
    assert [r.index for r in report.rows] == [0, 5]
    assert report.rows[1].ground_truth == "8" and report.rows[1].question == "What is 4 + 4?"
    errors = {e.row: e for e in report.rejected}
    assert sorted(errors) == [1, 2, 3, 4]
    assert errors[1].field == "reward_model.ground_truth" and errors[1].reason == "missing"
    assert errors[2].field == "prompt[0].content"
    assert "overlong" in errors[3].reason and "overlong" in errors[4].reason
    assert "row 4" in report.summary()


def test_parquet_plain_schema_nan_and_wrong_type(tmp_path):
    path = tmp_path / "plain.parquet"
    table = pa.table({"prompt": ["a?", "b?", "c?"], "answer": [42.0, float("nan"), 7.5]})
    pq.write_table(table, path)
    report = load_rows(str(path))
    assert [(r.index, r.ground_truth) for r in report.rows] == [(0, "42"), (2, "7.5")]
    assert [(e.row, e.field, e.reason) for e in report.rejected] == [(1, "answer", "is nan")]
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"prompt": [1, 2], "answer": ["x", "y"]}), wrong)
    report = load_rows(str(wrong))
    assert not report.rows and {(e.row, e.field) for e in report.rejected} == {
        (0, "prompt"),
        (1, "prompt"),
    }
    assert all("wrong type int" in e.reason for e in report.rejected)


def test_jsonl_rows_including_bad_json(tmp_path):
    path = tmp_path / "rows.jsonl"
    lines = [json.dumps({"prompt": "x?", "answer": "1"}), "{not json", json.dumps({"prompt": "y?"}),
             json.dumps({"prompt": "z?", "answer": ["list"]}), json.dumps([1, 2])]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    report = load_rows(str(path))
    assert [r.index for r in report.rows] == [0]
    assert [(e.row, e.field) for e in report.rejected] == [
        (1, "<json>"), (2, "reward_model.ground_truth"), (3, "answer"), (4, "<row>")]  # fmt: skip
    with pytest.raises(ValueError, match="unsupported"):
        load_rows(__file__)


def test_jsonl_decode_failures_are_rows_naming_their_line(tmp_path):
    """Blank lines count toward the line number; a line that is not UTF-8, or nests deeper than
    the parser recurses (in the line, its messages string or its test_cases string), is a
    rejected row naming file and line, never an exception."""
    good = json.dumps({"prompt": "x?", "answer": "1"})
    deep = "[" * 50_000  # far deeper than the parser recurses, shorter than a prompt may be
    path = tmp_path / "rows.jsonl"
    path.write_bytes(
        "\n".join([
            good,  # line 1
            "",
            "   ",
            json.dumps({"prompt": 5, "answer": "1"}),  # line 4
            deep,  # line 5
            "",
            json.dumps({"messages": deep, "answer": "1"}),  # line 7
            json.dumps({"prompt": "x", "test_cases": deep, "case_type": "assert"}),  # line 8
        ]).encode()
        + b'\n{"prompt": "caf\xe9?", "answer": "1"}\n'  # line 9: Latin-1, not UTF-8
        + good.encode()  # line 10
    )  # fmt: skip
    report = load_rows(str(path), keys=RowKeys(messages="messages"))
    assert [(r.index, r.line) for r in report.rows] == [(0, 1), (6, 10)]
    rejected = [(e.row, e.line, e.field) for e in report.rejected]
    assert rejected == [(1, 4, "prompt"), (2, 5, "<json>"), (3, 7, "messages"),
                        (4, 8, "test_cases"), (5, 9, "<json>")]  # fmt: skip
    reasons = [e.reason for e in report.rejected]
    assert "nested too deeply" in reasons[1] and "nested too deeply" in reasons[2]
    assert "nested too deeply" in reasons[3] and "byte 0xe9 at offset 15 is not UTF-8" in reasons[4]
    assert str(report.rejected[0]).startswith(f"{path}: row 1: field 'prompt': ")
    assert str(report.rejected[0]).endswith("(line 4)")
    # a .json file: a list decodes as before (no lines); JSON lines with the same bad lines too
    as_json = tmp_path / "rows.json"
    as_json.write_bytes(path.read_bytes())
    assert [(e.row, e.line) for e in load_rows(str(as_json)).rejected][-1] == (5, 9)
    as_json.write_text(json.dumps([json.loads(good), {"prompt": 5}]))
    assert [(e.row, e.line) for e in load_rows(str(as_json)).rejected] == [(1, None)]
    as_json.write_text(deep)
    assert [(e.row, e.line, e.field) for e in load_rows(str(as_json)).rejected] == [
        (0, 1, "<json>")
    ]


def test_parquet_writes_are_atomic_and_leave_nothing_on_failure(tmp_path, monkeypatch):
    """A write cut short (the disk fills: pyarrow has written part of the file, then fails)
    keeps the file that was there and leaves no temporary file beside it; so does a write
    whose rename fails (a directory where the file goes)."""
    path = tmp_path / "rows.parquet"
    write_parquet_rows(path, [{"prompt": "1+1", "answer": "2"}])

    def disk_full(table, where):
        with open(where, "wb") as handle:
            handle.write(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(pq, "write_table", disk_full)
        with pytest.raises(OSError, match="No space left"):
            write_parquet_rows(path, [{"prompt": "2+2", "answer": "4"}])
    assert pq.read_table(path).to_pylist() == [{"prompt": "1+1", "answer": "2"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.parquet"]
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    with pytest.raises(OSError):
        write_parquet_rows(tmp_path / "taken", [{"prompt": "2+2", "answer": "4"}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.parquet", "taken"]
    write_parquet_rows(path, [{"prompt": "2+2", "answer": "4"}] * 3)
    assert pq.read_table(path).column("answer").to_pylist() == ["4", "4", "4"]


def test_single_turn_env_grades_in_sandbox(tmp_path, math_pool):
    path = tmp_path / "math.jsonl"
    rows = [{"prompt": "Half of one?", "answer": "\\frac{1}{2}", "data_source": "lighteval/MATH"},
            {"prompt": "2+2?", "answer": "4", "data_source": "openai/gsm8k"}]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = make_env("single_turn", path=str(path), pool=math_pool, format_penalty=-0.5)
    assert isinstance(env, SingleTurnEnv)
    obs, info = env.reset(seed=0)
    assert obs == "Half of one?" and info["messages"][0]["role"] == "user"
    _, reward, terminated, truncated, info = env.step(r"It is \boxed{0.5}")
    assert reward == 1.0 and terminated and not truncated and info["success"]
    env.reset(seed=1)
    _, reward, _, _, info = env.step("I do not know")
    assert reward == -0.5 and not info["format_ok"] and not info["success"]


def test_countdown_generation_solvable_and_env(math_pool):
    for seed in range(30):
        task = generate_countdown(seed)
        assert task == generate_countdown(seed)
        from rl_envs import arith

        assert arith.evaluate(task["solution"]) == task["target"]
        assert sorted(arith.numbers_in(task["solution"])) == sorted(task["numbers"])
    env = CountdownEnv(pool=math_pool)
    obs, _ = env.reset(seed=3)
    task = generate_countdown(3)
    assert str(task["target"]) in obs
    _, reward, terminated, _, info = env.step(
        f"<think>ok</think><answer>{task['solution']}</answer>"
    )
    assert reward == 1.0 and terminated and info["success"]


def test_tool_env_calculator_python_and_answer(math_pool):
    env = ToolEnv(pool=math_pool, tool_timeout_s=1.0)
    obs, _ = env.reset(seed=1)
    expression = obs.removeprefix("What is ").removesuffix("?")
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    out, reward, terminated, _, info = env.step(f"<tool_call>{call}</tool_call>")
    value = json.loads(out.removeprefix("<tool_response>").removesuffix("</tool_response>"))[
        "content"
    ]
    assert (
        info["tool_call"] == {"name": "calculator", "ok": True} and reward == 0.0 and not terminated
    )
    code = json.dumps({"name": "python", "arguments": {"code": f"print({expression})"}})
    out, _, _, _, info = env.step(f"<tool_call>{code}</tool_call>")
    assert value in out and info["tool_call"]["ok"]
    _, reward, terminated, _, info = env.step(f"<answer>{value}</answer>")
    assert reward == 1.0 and terminated and info["success"]


def test_tool_env_bad_calls_and_timeouts(math_pool):
    env = ToolEnv(pool=math_pool, tool_timeout_s=0.5, max_steps=5)
    env.reset(seed=2)
    _, reward, _, _, info = env.step("<tool_call>{not json}</tool_call>")
    assert reward == -0.1 and not info["format_ok"]
    _, reward, _, _, info = env.step('<tool_call>{"name": "shell", "arguments": {}}</tool_call>')
    assert reward == -0.1 and not info["action_is_valid"]
    hang = json.dumps({"name": "python", "arguments": {"code": "while True: pass"}})
    out, _, _, _, info = env.step(f"<tool_call>{hang}</tool_call>")
    assert "timeout" in out and not info["tool_call"]["ok"] and env.tool_stats["timeouts"] == 1
    evil = json.dumps(
        {"name": "calculator", "arguments": {"expression": "__import__('os').getcwd()"}}
    )
    out, _, _, _, info = env.step(f"<tool_call>{evil}</tool_call>")
    assert "error" in out and not info["tool_call"]["ok"]
    _, _, terminated, truncated, _ = env.step("no protocol at all")
    assert truncated and not terminated


def test_countdown_refuses_options_it_would_ignore_and_lists_the_ones_it_takes():
    """CountdownEnv passed unknown options on to SingleTurnEnv's row-loading options, which
    only read `path`: `num_numbrs=3` (a typo) was dropped silently."""
    from rl_envs.registry import env_options, make_env

    with pytest.raises(TypeError, match="unexpected keyword argument 'num_numbrs'"):
        make_env("countdown", num_numbrs=3)
    assert {"num_numbers", "max_number", "system_prompt", "success_reward"} <= set(
        env_options("countdown")
    )
    assert "render_save_dir" in env_options("SimpleSokoban")  # a tag: its env type's options
    assert "render_save_dir" not in env_options("tool_use")
