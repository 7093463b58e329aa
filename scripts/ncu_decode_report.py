"""Turn scripts/ncu_decode.sh's CSV into OUTDIR/ncu_decode.json and a table (see ncu_decode.py).

python scripts/ncu_decode_report.py OUTDIR
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

COLS = {  # metric -> (short name, scale to the printed unit)
    "gpu__time_duration.sum": "us",
    "dram__bytes_read.sum": "dram_MB",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "lts__t_bytes.sum": "l2_MB",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "launch__registers_per_thread": "regs",
    "launch__shared_mem_per_block_dynamic": "smem_dyn",  # MB like the byte counts
    "launch__shared_mem_per_block_static": "smem_st",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occ_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
}
# ncu prints each metric in a unit of its choosing (second CSV row); normalise to us / MB
UNIT = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "byte": 1e-6,
        "byte/block": 1e-6, "Kbyte": 1e-3, "Kbyte/block": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}  # fmt: skip


def parse(csv_path: Path) -> list[dict]:
    lines = [ln for ln in csv_path.read_text().splitlines() if ln.startswith('"')]
    rows = list(csv.reader(lines))
    head, units, data = rows[0], rows[1], rows[2:]
    out = []
    for r in data:
        rec = {"kernel": r[head.index("Kernel Name")]}
        for metric, short in COLS.items():
            if metric not in head:
                continue
            i = head.index(metric)
            v = r[i].replace(",", "")
            try:
                x = float(v)
            except ValueError:
                rec[short] = v
                continue
            rec[short] = (
                x * UNIT.get(units[i], 1.0) if short in ("us", "dram_MB", "l2_MB", "smem_dyn", "smem_st") else x
            )
        out.append(rec)
    return out


def main() -> int:
    w = Path(sys.argv[1])
    kernels = parse(w / "ncu_decode.csv")
    labels = [ln.split(" ", 2)[2] for ln in (w / "ncu_decode.cases").read_text().splitlines() if ln.startswith("case ")]
    cases: list[dict] = []
    for k in kernels:
        if "spin" in k["kernel"]:  # torch.cuda._sleep: the next case starts
            cases.append({"case": labels[len(cases)] if len(cases) < len(labels) else f"#{len(cases)}", "kernels": []})
        elif cases:
            cases[-1]["kernels"].append(k)
    (w / "ncu_decode.json").write_text(json.dumps(cases, indent=1) + "\n")
    print(f"{'case':<34}{'kernel':<44}{'grid':>7}{'blk':>5}{'regs':>5}{'smem':>7}{'us':>8}{'DRAM MB':>9}"
          f"{'TB/s':>6}{'dram%':>6}{'L2 MB':>8}")  # fmt: skip
    for c in cases:
        for k in c["kernels"]:
            us = k.get("us", float("nan"))
            mb = k.get("dram_MB", float("nan"))
            smem = ((k.get("smem_dyn") or 0) + (k.get("smem_st") or 0)) * 1e6  # bytes
            print(f"{c['case'][:33]:<34}{k['kernel'][:43]:<44}{k.get('grid', 0):>7.0f}{k.get('block', 0):>5.0f}"
                  f"{k.get('regs', 0):>5.0f}{smem / 1024:>6.0f}K{us:>8.2f}{mb:>9.1f}{mb / us:>6.2f}"
                  f"{k.get('dram_pct', 0):>6.1f}{k.get('l2_MB', 0):>8.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
