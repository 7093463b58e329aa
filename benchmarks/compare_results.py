"""Do two benchmark runs agree? Compare results JSONs record by record (same suite, case, impl).

    python benchmarks/compare_results.py BASE.json NEW.json [--tol 0.05] [--impl-only NAME ...]
                                          [--md OUT.md]

For every record present in both runs it prints the time ratio NEW/BASE and the change of the
ours-vs-anchor ratio; then, per suite, the median and the spread of |log time ratio|. Times of a
kernel that did not change between the runs should agree within noise (a few percent on an
H200 for large shapes; CUDA-graph timed decode shapes drift more in relative terms). The exit code
is 0 unless --fail-over TOL is given and the median drift of any suite exceeds TOL.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def _key(r: dict) -> tuple[str, str, str]:
    return r["suite"], r["case"], r["impl"]


def load(path: Path) -> tuple[dict, dict[tuple[str, str, str], dict]]:
    d = json.loads(Path(path).read_text())
    return d.get("env", {}), {_key(r): r for r in d["records"] if r.get("ms")}


def compare(base: dict, new: dict, tol: float) -> tuple[list[dict], dict[str, dict]]:
    rows = []
    for k in sorted(base.keys() & new.keys()):
        b, n = base[k], new[k]
        t = n["ms"] / b["ms"]
        row = {"suite": k[0], "case": k[1], "impl": k[2], "base_ms": b["ms"], "new_ms": n["ms"], "time_ratio": t}
        if b.get("ratio_vs_anchor") and n.get("ratio_vs_anchor") and b.get("anchor") != k[2]:
            row["base_vs_anchor"] = b["ratio_vs_anchor"]
            row["new_vs_anchor"] = n["ratio_vs_anchor"]
        row["outside_tol"] = abs(math.log(t)) > math.log1p(tol)
        rows.append(row)
    per_suite: dict[str, dict] = {}
    for s in sorted({r["suite"] for r in rows}):
        d = [abs(math.log(r["time_ratio"])) for r in rows if r["suite"] == s]
        per_suite[s] = {
            "records": len(d),
            "median_drift": math.expm1(statistics.median(d)),
            "p90_drift": math.expm1(sorted(d)[int(0.9 * (len(d) - 1))]),
            "outside_tol": sum(r["outside_tol"] for r in rows if r["suite"] == s),
        }
    return rows, per_suite


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--tol", type=float, default=0.05, help="relative time change counted as outside noise")
    ap.add_argument("--impl-only", nargs="*", default=None, help="compare only these impl names")
    ap.add_argument("--fail-over", type=float, default=None, help="exit 1 if a suite's median drift exceeds this")
    ap.add_argument("--md", type=Path, default=None, help="also write the per-record table as markdown")
    args = ap.parse_args(argv)
    env_b, base = load(args.base)
    env_n, new = load(args.new)
    if args.impl_only:
        base = {k: v for k, v in base.items() if k[2] in args.impl_only}
    rows, per_suite = compare(base, new, args.tol)
    print(f"base: {args.base} ({env_b.get('gpu')}, {env_b.get('time_utc')}, triton {env_b.get('triton')})")
    print(f"new:  {args.new} ({env_n.get('gpu')}, {env_n.get('time_utc')}, triton {env_n.get('triton')})")
    lines = [
        "| suite | case | impl | base ms | new ms | new/base | vs anchor base → new |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        va = f"{r['base_vs_anchor']:.2f}x → {r['new_vs_anchor']:.2f}x" if "base_vs_anchor" in r else ""
        flag = " *" if r["outside_tol"] else ""
        lines.append(
            f"| {r['suite']} | {r['case']} | {r['impl']} | {r['base_ms']:.4f} | {r['new_ms']:.4f} "
            f"| {r['time_ratio']:.3f}{flag} | {va} |"
        )
    if args.md:
        args.md.write_text("\n".join(lines) + "\n")
    print(f"\n{len(rows)} records in both runs; '*' = time moved more than {args.tol:.0%}\n")
    print("| suite | records | median drift | p90 drift | outside tol |\n|---|---:|---:|---:|---:|")
    for s, v in per_suite.items():
        print(f"| {s} | {v['records']} | {v['median_drift']:.1%} | {v['p90_drift']:.1%} | {v['outside_tol']} |")
    if args.fail_over is not None and any(v["median_drift"] > args.fail_over for v in per_suite.values()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
