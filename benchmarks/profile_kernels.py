"""Per-kernel breakdown of each op: torch.profiler (kernel names, device times, launch counts)
and, where `ncu` is on PATH, a short Nsight Compute summary (achieved DRAM bandwidth, SM
throughput, registers per thread), run with `--clock-control none` (the clocks are left alone).

    python benchmarks/profile_kernels.py [--ops attention,int8,rmsnorm] [--no-ncu] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

TORCH_KERNEL_HINTS = ("at::", "elementwise", "vectorized", "distribution", "fill", "reduce_kernel", "Memset", "copy")
NCU_METRICS = [
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "launch__registers_per_thread",
    "launch__grid_size",
]


def _cases(device: str):
    """Representative shapes per op (small on CPU, where this is only a smoke pass)."""
    gpu = device == "cuda"
    dt = torch.bfloat16 if gpu else torch.float16
    cases = {}

    def attention():
        from flashattn_triton import flash_attn_forward

        B, H, N, D = (4, 16, 4096, 128) if gpu else (1, 2, 64, 32)
        q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dt) for _ in range(3))
        return lambda: flash_attn_forward(q, k, v, causal=True)

    def int8():
        from int8_gemm import int8_gemm_dequant_fwd, quantize_symmetric

        M, N, K = (4096, 4096, 4096) if gpu else (64, 64, 64)
        a, sa = quantize_symmetric(torch.randn(M, K, device=device, dtype=torch.float16))
        w, sb = quantize_symmetric(torch.randn(N, K, device=device, dtype=torch.float16))
        return lambda: int8_gemm_dequant_fwd(a, w.t(), sa, sb)

    def rmsnorm():
        from fused_rmsnorm import fused_rmsnorm_linear

        M, D, N = (16, 4096, 4096) if gpu else (4, 64, 64)
        x = torch.randn(M, D, device=device, dtype=dt)
        g = torch.randn(D, device=device, dtype=dt)
        w = torch.randn(N, D, device=device, dtype=dt) / D**0.5
        return lambda: fused_rmsnorm_linear(x, g, w)

    cases.update(attention=attention, int8=int8, rmsnorm=rmsnorm)
    return cases


def torch_profile(fn, iters: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    fn()  # compile / warm up outside the trace
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(iters):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if torch.cuda.is_available() and dev_us <= 0:
            continue
        rows.append(dict(name=e.key, calls=e.count, device_us_total=dev_us, cpu_us_total=e.cpu_time_total))
    rows.sort(key=lambda r: -(r["device_us_total"] or r["cpu_us_total"]))
    return rows[:12]


def ncu_summary(op: str) -> list[dict] | str:
    ncu = shutil.which("ncu")
    if ncu is None or not torch.cuda.is_available():
        return "ncu not available"
    cmd = [
        ncu, "--clock-control", "none", "--csv", "--launch-count", "40",
        "--metrics", ",".join(NCU_METRICS),
        sys.executable, os.path.abspath(__file__), "--ops", op, "--no-ncu", "--iters", "1", "--child",
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    text = p.stdout[p.stdout.find('"ID"') :] if '"ID"' in p.stdout else ""
    if not text:
        return f"ncu failed (rc={p.returncode}): {(p.stderr or p.stdout)[-400:]}"
    per_kernel: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO(text)):
        name = row.get("Kernel Name", "")
        if any(h in name for h in TORCH_KERNEL_HINTS):
            continue
        d = per_kernel.setdefault(name[:80], {"kernel": name[:80]})
        d[row["Metric Name"]] = row["Metric Value"]
    return list(per_kernel.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default="attention,int8,rmsnorm")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        print("SMOKE PASS (no CUDA GPU): tiny shapes; times are CPU/interpreter times.")
    cases = _cases(device)
    report = {}
    for op in args.ops.split(","):
        fn = cases[op]()
        if args.child:  # under ncu: just run the op
            for _ in range(args.iters + 1):
                fn()
            continue
        rows = torch_profile(fn, args.iters)
        report[op] = {"torch_profiler": rows}
        print(f"== {op}: top kernels over {args.iters} calls ==")
        for r in rows:
            dev, cpu = r["device_us_total"], r["cpu_us_total"]
            print(f"  {r['calls']:5d}x  dev {dev:10.1f} us  cpu {cpu:10.1f} us  {r['name'][:90]}")
        if not args.no_ncu:
            ncu = ncu_summary(op)
            report[op]["ncu"] = ncu
            print(f"  ncu: {json.dumps(ncu)[:1500]}")
    if args.out and not args.child:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile_kernels.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
