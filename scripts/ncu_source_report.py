"""Summarise Nsight Compute reports of the attention forward (``scripts/ncu_flash_fwd.py``).

    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SRC.csv
    ncu -i REPORT.ncu-rep --page details --csv > DETAILS.csv
    python scripts/ncu_source_report.py SRC.csv DETAILS.csv [--top 12] [--per-tile N]

Per profiled kernel: duration, SM / tensor-pipe throughput and the scheduler's issue rate (details page);
the warp-state samples by stall reason and the instructions holding the most samples (source page). When
two kernels share one binary (same config, two shapes), it also lists the instructions whose share of the
samples grew most from the second to the first, which is where a short sequence spends its extra time.
``--per-tile N``: the share of the working warps' samples (warps parked at the exit barrier, NOPs run fewer
than 300 times, left out) held by the instructions executed exactly N times in every kernel, e.g. N = 4 warps
x tiles for what runs once per tile in one consumer warpgroup.
"""

from __future__ import annotations

import argparse
import csv
import io
import re

KEYS = ("Duration", "Compute (SM) Throughput", "Issue Slots Busy", "No Eligible", "Registers Per Thread")


def _kernels(path: str) -> list[list[dict]]:
    parts = open(path).read().split('"Kernel Name"')[1:]
    return [list(csv.DictReader(io.StringIO(p.split("\n", 1)[1]))) for p in parts]


def _n(row: dict) -> int:
    return int(row["Warp Stall Sampling (All Samples)"] or 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("source_csv")
    ap.add_argument("details_csv")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--per-tile", type=int, default=0)
    args = ap.parse_args()
    details = list(csv.DictReader(open(args.details_csv)))
    ks = _kernels(args.source_csv)
    stalls = [c for c in ks[0][0] if c.startswith("stall_") and "Not Issued" not in c]
    for i, rows in enumerate(ks):
        mine = [r for r in details if r["ID"] == str(i)]
        print(f"== kernel {i}: {mine[0]['Kernel Name'] if mine else '?'}")
        for r in mine:
            if r["Metric Name"] in KEYS:
                print(f"   {r['Metric Name']}: {r['Metric Value']} {r['Metric Unit']}")
            if r["Rule Name"] == "HighPipeUtilization":
                m = re.match(r"(\w+) is the highest-utilized pipeline \(([\d.]+)%\)", r["Rule Description"])
                if m:
                    print(f"   highest pipe: {m.group(1)} {m.group(2)}% of elapsed cycles")
        tot = sum(map(_n, rows)) or 1
        agg = sorted(((sum(int(r[s] or 0) for r in rows), s[6:]) for s in stalls), reverse=True)
        print("   stall samples: " + ", ".join(f"{s} {100 * v / tot:.1f}%" for v, s in agg if v / tot > 0.01))
        for j, r in sorted(enumerate(rows), key=lambda x: -_n(x[1]))[: args.top]:
            why = sorted(((int(r[s] or 0), s[6:]) for s in stalls), reverse=True)[0][1]
            src = r["Source"].strip()[:64]
            print(f"   [{j:5d}] {100 * _n(r) / tot:5.1f}% x{r['Instructions Executed']:>7} {why:9s} {src}")
    if len(ks) == 2 and len(ks[0]) == len(ks[1]):
        a, b = ks
        ta, tb = sum(map(_n, a)) or 1, sum(map(_n, b)) or 1
        grow = sorted(((_n(x) / ta - _n(y) / tb, j, x, y) for j, (x, y) in enumerate(zip(a, b))), reverse=True)
        print("== share of samples grown from kernel 1 to kernel 0 (same binary)")
        for d, j, x, y in grow[: args.top]:
            runs = f"x{x['Instructions Executed']}/x{y['Instructions Executed']}"
            print(f"   [{j:5d}] +{100 * d:4.2f} pp ({runs}) {x['Source'].strip()[:64]}")
    if args.per_tile and all(len(k) == len(ks[0]) for k in ks):
        once = [j for j in range(len(ks[0])) if all(k[j]["Instructions Executed"] == str(args.per_tile) for k in ks)]
        print(f"== {len(once)} instructions executed exactly {args.per_tile} times in every kernel")
        for i, rows in enumerate(ks):
            idle = sum(_n(r) for r in rows if r["Source"].strip() == "NOP" and int(r["Instructions Executed"]) < 300)
            work = (sum(map(_n, rows)) - idle) or 1
            print(f"   kernel {i}: {100 * sum(_n(rows[j]) for j in once) / work:.1f}% of the working warps' samples")


if __name__ == "__main__":
    main()
