"""Re-time int8-llm benchmark cases several times in one process (H200), exactly as the suite builds
and times them (benchmarks/bench_int8.py: rotated weight copies, CUDA-graph replay for small cases).

    python scripts/retime_int8_llm.py OUTDIR [--rounds 5] [--cases M:N:K,...]

For outliers in a suite run: a case that moved between runs of the same code is re-timed here, with
the same impls and anchor, round after round. Writes OUTDIR/retime_int8_llm.json; prints a table last.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import bench_int8 as B  # noqa: E402
from benchmarks.harness import Suite  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
    spec = sys.argv[sys.argv.index("--cases") + 1] if "--cases" in sys.argv else "4096:4096:4096,16:4096:4096"
    cases = [tuple(int(v) for v in c.split(":")) for c in spec.split(",")]
    dev = torch.device("cuda")
    rows: dict[str, dict[str, list[float]]] = {}
    for r in range(rounds):
        for M, N, K in cases:
            suite = Suite("int8-llm")
            B._llm_weight(suite, [M], N, K, dev)
            for rec in suite.records:
                rows.setdefault(f"{rec.case} | {rec.impl}", []).append(rec.ms * 1e3)
        print(f"round {r} done", flush=True)
    (out / "retime_int8_llm.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "us": rows}, indent=1))
    for k, v in rows.items():
        print(f"{k:<62}" + " ".join(f"{t:8.2f}" for t in v))


if __name__ == "__main__":
    main()
