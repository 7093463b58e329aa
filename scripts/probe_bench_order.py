"""GPU probe: does an impl's place in the benchmark order change its time?

    python scripts/probe_bench_order.py OUTDIR
    PROBE_ORDER_SHAPES=4096x4096x4096 PROBE_ORDER_DATA=suite,rows python scripts/probe_bench_order.py OUTDIR

Session 23's suite run timed F.linear at B4096 D4096 N4096 at 200.8 us (first in the case's order, after the
untimed warm-up and torch.compile had left the GPU idle), and session 24's probe, which interleaves rounds,
timed the same call at 216.9 us. For a few suite shapes this times F.linear, the unfused pair and the module the
way the suite did until 2026-12-02 (one after another, 100 ms each, after an idle pause), in the reverse order,
and in interleaved rounds, and logs the GPU's temperature, SM clock and power after every timing. Same
harness.time_ms and weight rotation as benchmarks/bench_rmsnorm.py. Prints a table last.

PROBE_ORDER_SHAPES (MxDxN, comma-separated) picks shapes; PROBE_ORDER_DATA (comma-separated) the x of each pass:
"suite" (randn, as benchmarks/bench_rmsnorm.py) and/or "rows" (randn * 2 + 0.3 with every 7th row x64, as
scripts/rmsnorm_probe_cases.py row_scaled_x). Session 27 (B4096, one run): module / F.linear 1.054x on the suite's x and
1.027x on the probes' x, where F.linear itself was 4% slower; the clock samples (one nvidia-smi read after each
timing, every impl at the 700 W limit) did not separate the impls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
sys.path += [str(d) for d in sorted((REPO / "packages").glob("*/src"))]

import fused_rmsnorm  # noqa: E402
from rmsnorm_probe_cases import row_scaled_x  # noqa: E402

from benchmarks import harness  # noqa: E402

SHAPES = [(4096, 4096, 4096), (1024, 2048, 2048), (16, 4096, 14336), (512, 4096, 4096)]
if os.environ.get("PROBE_ORDER_SHAPES"):
    SHAPES = [tuple(int(v) for v in t.split("x")) for t in os.environ["PROBE_ORDER_SHAPES"].split(",")]
DATA = os.environ.get("PROBE_ORDER_DATA", "suite").split(",")
IDLE_S = 5.0  # about what torch.compile of the pair leaves the GPU idle before the suite's first timing
L2_BYTES = 60 * 2**20


def gpu_state() -> dict:
    q = "temperature.gpu,clocks.sm,power.draw"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"], capture_output=True, text=True
    )
    vals = out.stdout.strip().splitlines()[0].split(", ") if out.returncode == 0 else []
    return dict(zip(("temp_c", "sm_mhz", "power_w"), vals))


def impls_for(M: int, D: int, N: int, data: str) -> dict:
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = row_scaled_x(M, D, dev) if data == "rows" else torch.randn(M, D, device=dev, dtype=dt)
    n_sets = max(2, min(8, -(-2 * L2_BYTES // (N * D * 2))))
    sets = []
    for _ in range(n_sets):
        g = (torch.rand(D, device=dev) + 0.5).to(dt)
        w = (torch.randn(N, D, device=dev) / D**0.5).to(dt)
        mod = fused_rmsnorm.FusedRMSNormLinear(D, N, eps=1e-6, device=dev, dtype=dt)
        mod.weight.copy_(w)
        mod.norm_weight.copy_(g)
        sets.append((g, w, mod))
    impls = {
        "F.linear": [lambda w=w: F.linear(x, w) for _, w, _ in sets],
        "unfused": [lambda g=g, w=w: F.linear(F.rms_norm(x, (D,), g, 1e-6), w) for g, w, _ in sets],
        "fused": [lambda mod=mod: mod(x) for _, _, mod in sets],
    }
    ref = F.linear(F.rms_norm(x.float(), (D,), sets[0][0].float(), 1e-6), sets[0][1].float())
    err = (impls["fused"][0]().float() - ref).norm() / ref.norm()
    assert err < 1e-2, f"fused rel err {err:.3g}"
    for fl in impls.values():
        for f in fl:
            f()
    torch.cuda.synchronize()
    return impls


def timed(impls: dict, name: str, rep_ms: int) -> dict:
    us = harness.time_ms(impls[name], small=True, rep_ms=rep_ms) * 1e3
    return {"impl": name, "us": round(us, 3), **gpu_state()}


def main() -> int:
    out_dir = Path(sys.argv[1])
    res = {"env": harness.env_info(), "rows": []}
    names = ["F.linear", "unfused", "fused"]
    with torch.no_grad():
        for (M, D, N), data in [(s, d) for s in SHAPES for d in DATA]:
            impls = impls_for(M, D, N, data)
            row = {"M": M, "D": D, "N": N, "data": data}
            for phase, order in (("sequential", names), ("reversed", names[::-1])):
                time.sleep(IDLE_S)
                row[phase] = [timed(impls, k, 100) for k in order]
            row["interleaved"] = []
            for r in range(6):
                for k in names if r % 2 == 0 else names[::-1]:
                    row["interleaved"].append({"round": r, **timed(impls, k, 33)})
            res["rows"].append(row)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probe_bench_order.json").write_text(json.dumps(res, indent=1))
    for row in res["rows"]:
        seq = {t["impl"]: t["us"] for t in row["sequential"]}
        rev = {t["impl"]: t["us"] for t in row["reversed"]}
        inter = {k: sorted(t["us"] for t in row["interleaved"] if t["impl"] == k) for k in names}
        med = {k: (v[2] + v[3]) / 2 for k, v in inter.items()}
        cells = " | ".join(
            f"{k} seq {seq[k]:.2f} rev {rev[k]:.2f} int {med[k]:.2f} [{inter[k][0]:.2f}-{inter[k][-1]:.2f}]"
            for k in names
        )
        ratio = " ".join(f"{p} {d['fused'] / d['F.linear']:.3f}" for p, d in (("seq", seq), ("rev", rev), ("int", med)))
        temps = [t["temp_c"] for t in row["sequential"] + row["interleaved"]]
        mhz = {k: sorted(int(t["sm_mhz"]) for t in row["interleaved"] if t["impl"] == k) for k in names}
        cells += " || MHz " + " ".join(f"{k} {v[0]}-{v[-1]}" for k, v in mhz.items() if v)
        shape = f"M{row['M']} D{row['D']} N{row['N']} x {row['data']}"
        print(f"{shape}: {cells} || fused/F.linear {ratio} || temp {min(temps)}-{max(temps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
