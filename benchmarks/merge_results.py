"""Merge streamed benchmark records (one JSON object per line, see LLMK_BENCH_STREAM in
harness.py) into benchmarks' results format: <gpu-slug>.json + .md (+ ratio plots).

    python benchmarks/merge_results.py STREAM.jsonl [--out-dir DIR] [--plot]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "benchmarks"

from . import harness  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stream", type=Path)
    ap.add_argument("--out-dir", type=Path, default=harness.RESULTS_DIR)
    ap.add_argument("--plot", action="store_true")
    args = ap.parse_args(argv)
    fields = {f.name for f in harness.dataclasses.fields(harness.Record)}
    records = [
        harness.Record(**{k: v for k, v in json.loads(line).items() if k in fields})
        for line in args.stream.read_text().splitlines()
        if line.strip()
    ]
    out = harness.write_results(records, args.out_dir / f"{harness.gpu_slug()}.json")
    (args.out_dir / "merged_name").write_text(out.name)
    print(f"{out}: {len(records)} records")
    if args.plot:
        from . import plots

        for p in plots.ratio_plots(out):
            print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
