"""GSM8K/MATH local files to verl's parquet schema, read back by the RLVR loader; the CLI in
tools/ run as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rl_envs.tasks import data_spec, load_dataset
from rl_envs.tasks.convert import ConvertError, convert_file

ROOT = Path(__file__).resolve().parents[3]
GSM8K = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A shop sells 1,200 pens a day. Per 2 days?", "answer": "2 * 1200\n#### 2,400"},
]
MATH = [
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "level": "Level 1",
     "solution": "We get $\\boxed{\\frac{3}{4}}$."},
    {"problem": "Solve $x^2 = 4$ for $x > 0$.", "solution": "So $x = \\boxed{2}$."},
]  # fmt: skip


def test_gsm8k_jsonl_to_verl_parquet(tmp_path):
    src = tmp_path / "gsm8k.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in GSM8K) + "\n")
    report = convert_file(str(src), str(tmp_path / "out" / "train.parquet"))
    assert (report.kind, report.rows) == ("gsm8k", 2)
    rows = pq.read_table(report.out).to_pylist()
    assert rows[1]["data_source"] == "openai/gsm8k" and rows[1]["ability"] == "math"
    assert rows[1]["reward_model"] == {"style": "rule", "ground_truth": "2400"}
    assert rows[0]["prompt"][0]["role"] == "user"
    assert rows[0]["prompt"][0]["content"].startswith("Tom has 3 apples")
    assert rows[0]["prompt"][0]["content"].endswith('final answer after "####".')
    assert rows[0]["extra_info"]["index"] == 0 and rows[0]["extra_info"]["split"] == "train"
    loaded = load_dataset(data_spec({"file_name": report.out}))
    assert [r.ground_truth for r in loaded.rows] == ["7", "2400"]


def test_math_json_list_via_the_cli(tmp_path):
    src = tmp_path / "math.json"
    src.write_text(json.dumps(MATH))
    out = tmp_path / "math.parquet"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools/convert_math_data.py"), str(src), "-o", str(out),
         "--split", "test"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "wrote 2 math rows" in result.stdout
    rows = pq.read_table(out).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["\\frac{3}{4}", "2"]
    assert rows[0]["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert rows[0]["prompt"][0]["content"].endswith("within \\boxed{}.")
    assert rows[1]["extra_info"] == {"split": "test", "index": 1}


def test_bad_records_name_file_and_row(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(GSM8K[0]) + "\n" + json.dumps({"question": "q", "answer": "7"}))
    with pytest.raises(ConvertError, match=r"bad.jsonl: row 1: .*no '#### <final answer>'"):
        convert_file(str(src), str(tmp_path / "o.parquet"))
    src.write_text(json.dumps(MATH[0]) + "\n" + json.dumps({"problem": "p", "solution": "none"}))
    with pytest.raises(ConvertError, match=r"row 1: .*no balanced \\boxed"):
        convert_file(str(src), str(tmp_path / "o.parquet"))
    src.write_text(json.dumps({"text": "?"}))
    with pytest.raises(ConvertError, match="cannot tell GSM8K"):
        convert_file(str(src), str(tmp_path / "o.parquet"))
    assert not (tmp_path / "o.parquet").exists()


def test_malformed_inputs_are_errors_naming_the_file(tmp_path):
    """What a user may point the converter at by mistake: one line naming the file, no
    traceback, nothing written."""
    out = str(tmp_path / "o.parquet")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConvertError, match=r"folder: is a directory; give a .jsonl or .json"):
        convert_file(str(tmp_path / "folder"), out)
    (tmp_path / "latin1.jsonl").write_bytes(b'{"question": "caf\xe9", "answer": "#### 1"}\n')
    with pytest.raises(
        ConvertError,
        match=r"latin1.jsonl: line 1: invalid JSON: byte 0xe9 at offset 17 is not UTF-8",
    ):
        convert_file(str(tmp_path / "latin1.jsonl"), out)
    (tmp_path / "cut.json").write_text('[{"question": "q",')
    with pytest.raises(ConvertError, match=r"cut.json: line 1: invalid JSON: Expecting"):
        convert_file(str(tmp_path / "cut.json"), out)
    (tmp_path / "rows.csv").write_text("question,answer\n")
    with pytest.raises(ConvertError, match=r"rows.csv: use a .jsonl or .json file"):
        convert_file(str(tmp_path / "rows.csv"), out)
    (tmp_path / "other.jsonl").write_text(json.dumps({"prompt": "q", "label": "7"}))
    with pytest.raises(ConvertError, match=r"other.jsonl: row 0: .*\['label', 'prompt'\].*--kind"):
        convert_file(str(tmp_path / "other.jsonl"), out)
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [  # each ended in a RecursionError traceback from the JSON parser
        ("deep.json", "[" * 100_000 + "]" * 100_000, r"deep.json: line 1: invalid JSON: nested too deeply"),
        ("deep.jsonl", '{"question": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
         r"deep.jsonl: line 1: invalid JSON: nested too deeply"),
    ],
)  # fmt: skip
def test_json_nested_past_the_parsers_depth_is_a_convert_error(tmp_path, name, text, why):
    (tmp_path / name).write_text(text)
    with pytest.raises(ConvertError, match=why):
        convert_file(str(tmp_path / name), str(tmp_path / "o.parquet"))


def test_the_output_must_be_a_parquet_file(tmp_path):
    src = tmp_path / "gsm8k.jsonl"
    src.write_text(json.dumps(GSM8K[0]))
    (tmp_path / "out").mkdir()
    for out in (tmp_path / "rows.csv", tmp_path / "out"):
        with pytest.raises(ConvertError, match=r"the output must be a .parquet file"):
            convert_file(str(src), str(out))
    assert not (tmp_path / "rows.csv").exists()


def test_the_cli_reports_a_bad_input_in_one_line(tmp_path):
    (tmp_path / "latin1.jsonl").write_bytes(b'{"question": "caf\xe9"}\n')
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools/convert_math_data.py"), str(tmp_path / "latin1.jsonl"),
         "-o", str(tmp_path / "o.parquet")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert (
        result.stderr.startswith("error: ")
        and "latin1.jsonl: line 1: invalid JSON: byte 0xe9" in result.stderr
    )
