"""Convert a local GSM8K or MATH file to verl's parquet schema (nothing is downloaded).

    uv run python tools/convert_math_data.py gsm8k_train.jsonl -o data/gsm8k_train.parquet
    uv run python tools/convert_math_data.py math_test.json -o data/math_test.parquet \
        --kind math --split test

Input: GSM8K records ``{"question", "answer": "... #### 42"}`` or MATH records
``{"problem", "solution": "... \\boxed{x}"}``, one JSON object per line (.jsonl) or a JSON list
(.json). Output rows: ``data_source``, ``prompt`` (chat messages), ``ability``,
``reward_model.{style,ground_truth}``, ``extra_info`` (``rl_envs.tasks.convert``). A bad record
stops the conversion with its row number.
"""

from __future__ import annotations

import argparse
import sys

from rl_envs.tasks.convert import CONVERTERS, ConvertError, convert_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", help="GSM8K or MATH records (.jsonl or .json)")
    parser.add_argument("-o", "--output", required=True, help="parquet file to write")
    parser.add_argument("--kind", default="auto", choices=["auto", *sorted(CONVERTERS)])
    parser.add_argument("--split", default="train", help="extra_info.split of every row")
    args = parser.parse_args(argv)
    try:
        report = convert_file(args.input, args.output, args.kind, args.split)
    except (ConvertError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {report.rows} {report.kind} rows to {report.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
