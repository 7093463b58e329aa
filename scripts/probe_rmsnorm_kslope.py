"""GPU probe: is the prefill GEMM's gap to cuBLAS a per-call cost or a per-k-tile cost?

    python scripts/probe_rmsnorm_kslope.py OUTDIR [--first-only] [--unscaled 12,13]   # timing sweep, writes
        OUTDIR/probe_rmsnorm_kslope.json (--first-only: the M1024 N2048 sweep only; --unscaled: probe configs
        that skip the rstd scale, checked against x @ W'^T instead)
    ncu --nvtx --nvtx-include "prof/" ... python scripts/probe_rmsnorm_kslope.py --ncu   # one call per case

At fixed M x N the K loop is the only thing that grows with K, so fitting t = a + b*K over a sweep of K splits
each kernel's time into a per-call part a (launch ramp, prologue, epilogue, tail) and a per-k-tile part b
(mainloop throughput). Variants, bf16, same weights: F.linear (cuBLAS); the SM90 CUTLASS configs 1 (128x128
ping-pong) and 4 (128x128 cooperative, 2-CTA cluster) launched alone on a precomputed rstd (no PDL, no rstd
kernel); the module path (rstd kernel + the shipped config under PDL; one module copy per W copy). Each
variant is checked against an fp32 reference first (max rel err <= 1e-2, no NaN). Times: harness.time_ms
(CUDA-graph replay, W rotated out of L2), median us per call. Prints the fit per (shape, variant) last.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
# appended, not prepended: a PYTHONPATH entry (e.g. a probe build of fused_rmsnorm with its _C) wins
sys.path += [str(d) for d in sorted((REPO / "packages").glob("*/src"))]

import harness  # noqa: E402
from fused_rmsnorm import FusedRMSNormLinear, backend  # noqa: E402
from fused_rmsnorm.ops import rmsnorm_linear as op  # noqa: E402

EPS = 1e-6
L2_BYTES = 50 * 2**20
SWEEPS = {  # (M, N): K values
    (1024, 2048): [128, 256, 512, 1024, 2048, 4096, 8192],
    (512, 4096): [256, 1024, 2048, 4096, 8192],
}
# SM90 configs launched alone on a precomputed rstd; a probe build with more configs (12..15: the one-wave
# 128x128 variants of benchmarks/results/probes/h200-probe_rmsnorm_kslope.patch) adds those
ALONE = (1, 4) + tuple(range(12, op.SM90_NUM_CONFIGS))
NCU_CASES = [(1024, 2048, 2048), (1024, 2048, 256)]  # (M, N, K); probe configs at the first only


def setup(M, N, K, dev):
    gen = torch.Generator(device=dev).manual_seed(M * 7 + N * 3 + K)
    x = (torch.randn(M, K, device=dev, generator=gen) * 2 + 0.3).bfloat16()
    x[::7] *= 64  # rows far apart in scale: a row-scale bug shows
    mod = FusedRMSNormLinear(K, N, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        mod.norm_weight.uniform_(0.5, 1.5, generator=gen)
        mod.weight.normal_(0.0, K**-0.5, generator=gen)
    wf = op.fold_weight(mod.norm_weight, mod.weight)
    copies = min(16, max(1, math.ceil(2.5 * L2_BYTES / (N * K * 2))))
    wfs = [wf] + [wf.clone() for _ in range(copies - 1)]
    ws = [mod.weight] + [mod.weight.clone() for _ in range(copies - 1)]
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + EPS)
    ref = (xf * rstd[:, None]) @ wf.float().t()
    return x, mod, wfs, ws, rstd.contiguous(), ref


def alone_fn(cfg, x, wf, rstd, out):
    mod = backend.get_ext(x.device).module
    M, K = x.shape
    N = wf.shape[0]

    def run():  # the stream is read at call time: harness captures on its own stream
        mod.gemm_sm90(
            1, cfg, x.data_ptr(), x.stride(0), wf.data_ptr(), wf.stride(0), rstd.data_ptr(), 0,
            out.data_ptr(), out.stride(0), M, N, K, False, torch.cuda.current_stream().cuda_stream,
            0, 1, 1, 0, 0, EPS, 0,
        )  # fmt: skip
        return out

    return run


def variants(M, N, K, dev):
    x, mod, wfs, ws, rstd, ref = setup(M, N, K, dev)
    out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    v = {"F.linear": (lambda w=ws[0]: F.linear(x, w), [lambda w=w: F.linear(x, w) for w in ws])}
    for c in ALONE:
        v[f"cfg{c} alone"] = (alone_fn(c, x, wfs[0], rstd, out), [alone_fn(c, x, w, rstd, out) for w in wfs])
    mods = [mod] + [copy.deepcopy(mod) for _ in range(len(ws) - 1)]  # each folds and caches its own W'
    v["module"] = (lambda: mod(x), [lambda m=m: m(x) for m in mods])
    return x, mod, ref, v


def relerr(y, ref):
    y = y.float()
    if not torch.isfinite(y).all():
        return float("inf")
    return ((y - ref).abs().max() / ref.abs().max()).item()


def where() -> str:
    import fused_rmsnorm

    e = backend.get_ext(torch.device("cuda"))
    return f"fused_rmsnorm from {Path(fused_rmsnorm.__file__).parent}, backend {e.kind}, sm90 gemm {e.has_gemm_sm90}"


def sweep(out_dir: Path, unscaled: set[int], first_only: bool) -> int:
    dev = torch.device("cuda")
    print(where(), flush=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    res.update({"cuda": torch.version.cuda, "rows": []})
    fits = []
    with torch.no_grad():
        for (M, N), ks in list(SWEEPS.items())[: 1 if first_only else None]:
            per = {}
            for K in ks:
                x, mod, ref, v = variants(M, N, K, dev)
                ref_lin = x.float() @ mod.weight.float().t()
                ref_raw = x.float() @ op.fold_weight(mod.norm_weight, mod.weight).float().t()  # no rstd scale
                row = {"M": M, "N": N, "K": K, "us": {}, "err": {}}
                for name, (one, rot) in v.items():
                    try:
                        y = one()
                    except RuntimeError as exc:  # a config this build lacks: record, go on
                        row["err"][name] = str(exc)
                        print(f"FAIL M{M} N{N} K{K} {name}: {exc}", flush=True)
                        continue
                    torch.cuda.synchronize()
                    c = int(name[3:].split()[0]) if name.startswith("cfg") else -1
                    e = relerr(y, ref_lin if name == "F.linear" else ref_raw if c in unscaled else ref)
                    row["err"][name] = e
                    if not e <= 1e-2:
                        print(f"FAIL M{M} N{N} K{K} {name}: rel err {e}", flush=True)
                        continue
                    for f in rot:  # first calls (the module copies fold W' here), outside the graphs
                        f()
                    t = harness.time_ms(rot, small=True, rep_ms=30) * 1e3
                    row["us"][name] = round(t, 3)
                    per.setdefault(name, []).append((K, t))
                res["rows"].append(row)
                print(f"M{M} N{N} K{K}: " + "  ".join(f"{k} {t:.2f}" for k, t in row["us"].items()), flush=True)
            for name, pts in per.items():
                pts = [(k, t) for k, t in pts if k >= 512]
                n = len(pts)
                if n < 2:
                    continue
                mk = sum(k for k, _ in pts) / n
                mt = sum(t for _, t in pts) / n
                b = sum((k - mk) * (t - mt) for k, t in pts) / sum((k - mk) ** 2 for k, _ in pts)
                a = mt - b * mk
                fits.append({"M": M, "N": N, "variant": name, "a_us": round(a, 3), "b_us_per_1k": round(b * 1e3, 4)})
    res["fits"] = fits
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probe_rmsnorm_kslope.json").write_text(json.dumps(res, indent=1))
    print("fit t = a + b*K over K >= 512 (b in us per 1024 of K):")
    for f in fits:
        base = next((g for g in fits if (g["M"], g["N"], g["variant"]) == (f["M"], f["N"], "F.linear")), f)
        print(
            f"  M{f['M']} N{f['N']} {f['variant']:12s} a {f['a_us']:6.2f} us  b {f['b_us_per_1k'] * 1.024:7.3f}"
            f"  (b / cuBLAS b {f['b_us_per_1k'] / base['b_us_per_1k']:.3f})"
        )
    return 0


def ncu_cases() -> int:
    dev = torch.device("cuda")
    print(where(), flush=True)
    i = 0
    with torch.no_grad():
        for M, N, K in NCU_CASES:
            x, mod, ref, v = variants(M, N, K, dev)
            for name, (one, _rot) in v.items():
                if name == "module" or (K != NCU_CASES[0][2] and name[3:5].isdigit()):
                    continue
                try:
                    one()
                except RuntimeError as exc:
                    print(f"skip M{M} N{N} K{K} {name}: {exc}", flush=True)
                    continue
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push("prof")
                one()
                torch.cuda.nvtx.range_pop()
                torch.cuda.synchronize()
                print(f"case {i} M{M} N{N} K{K} {name}", flush=True)
                i += 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path, nargs="?")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument(
        "--unscaled",
        default="",
        help="probe configs (comma list) that skip the rstd scale: checked "
        "against x @ W'^T instead (timing-only variants)",
    )
    ap.add_argument("--first-only", action="store_true", help="only the M1024 N2048 sweep")
    a = ap.parse_args()
    if a.ncu:
        return ncu_cases()
    if a.out_dir is None:
        ap.error("OUTDIR is required for the timing sweep")
    return sweep(a.out_dir, {int(c) for c in a.unscaled.split(",") if c}, a.first_only)


if __name__ == "__main__":
    sys.exit(main())
