"""GPU probe: the swap-AB CUTLASS decode configs (7 = 64 W rows x 16 tokens x 128 k, 8 = 64 x 32 x 128,
9 / 10 = the same with 64-wide k-blocks, 11 = 7 computing rstd itself; ping-pong, 2-CTA
clusters) against the shipped decode choice
and F.linear, at decode batch sizes.

    python scripts/probe_rmsnorm_swapab.py OUTDIR [--budget 150] [--dry-run] [--ms 16,32]
        [--weights 4096x14336] [--variants gemm7,gemm11]

Needs the extension built in place (``python -m fused_rmsnorm._build --inplace``). For each (D, N) and
M below: F.linear on the same rotated weights, then every variant on the module path (folded W', as
``FusedRMSNormLinear`` runs) and on the functional path (``fused_rmsnorm_linear``: the GEMM configs
multiply x by g per call, decode_mma applies g in-kernel). Every variant is first checked on both
paths against an fp32 reference (max rel err <= 1e-2, no NaN); a failure is recorded and not timed.
Times: harness.time_ms (CUDA-graph replay, W rotated out of L2), median us per call. "raw_us": the GEMM
launch alone (binding call on a precomputed rstd, no PDL), to split the cost of the rstd launch from
the GEMM's.
Writes OUTDIR/probe_rmsnorm_swapab.json after every shape; prints a table last.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("tune_rmsnorm", REPO / "scripts" / "tune_rmsnorm.py")
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)
torch, op, harness = T.torch, T.op, T.harness

WEIGHTS = [(4096, 14336), (4096, 4096), (8192, 8192)]  # (D, N)
MS = [16, 32, 8, 1]
VARIANTS = {
    "gemm7": {"path": "gemm", "config": 7, "pdl": True},
    "gemm8": {"path": "gemm", "config": 8, "pdl": True},
    "gemm9": {"path": "gemm", "config": 9, "pdl": True},
    "gemm10": {"path": "gemm", "config": 10, "pdl": True},
    "gemm11": {"path": "gemm", "config": 11, "pdl": True},  # 7 with rstd from x in-kernel (fn: runs 7)
    "mma_auto": {"path": "decode_mma", "wn": 0, "ksplit": 0},
    # config 11 on a capped persistent grid ("ctas"): at N14336 its 224 W tiles on 132 CTAs leave 40 CTAs
    # with one tile and 92 with two; 112 CTAs give every CTA (both consumer warpgroups) two
    **{f"gemm11_c{c}": {"path": "gemm", "config": 11, "pdl": True, "ctas": c} for c in (112, 120, 128, 96)},
    "gemm8_c112": {"path": "gemm", "config": 8, "pdl": True, "ctas": 112},
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--budget", type=float, default=150.0, help="seconds from script start (default 150)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="token counts, comma-separated")
    ap.add_argument("--weights", default=",".join(f"{d}x{n}" for d, n in WEIGHTS), help="DxN list")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="variant names to time besides shipped")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    weights = [tuple(int(v) for v in dn.split("x")) for dn in args.weights.split(",")]
    variants = {k: VARIANTS[k] for k in args.variants.split(",")}
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"rows": [], "notes": []}
    if args.dry_run or not torch.cuda.is_available():
        print("DRY RUN: no GPU; nothing timed")
        res["notes"].append("dry run")
        (out / "probe_rmsnorm_swapab.json").write_text(json.dumps(res, indent=1))
        return 0
    gpu = T.Gpu()
    res["notes"].append(f"arch {gpu.arch}, backend {gpu.ext.kind}: {gpu.ext.reason}")
    if gpu.ext.module.num_sm90_configs() != op.SM90_NUM_CONFIGS:
        raise SystemExit("extension and ops/rmsnorm_linear.py disagree on the SM90 config count: rebuild")

    def timed(cfg, fns) -> float:
        return gpu._forced(cfg, lambda: harness.time_ms(fns, small=True, rep_ms=20) * 1e3)

    def calls(fn, x, ws) -> list:  # one closure per rotated weight copy
        return [lambda wi=wi: fn(x, wi) for wi in ws]

    def raw_gemm_us(cfg, x, ws) -> float:
        mod = gpu.ext.module
        M, D = x.shape
        N = ws[0].shape[0]
        c = int(cfg["config"])
        knobs = op.sm90_knob_args(cfg)
        rstd = torch.rand(M, device=x.device) + 0.5
        y = torch.empty(M, N, device=x.device, dtype=x.dtype)
        wsp, wsn, _keep = op._sm90_workspace(mod, 1, c, M, N, D, knobs, x.device)

        def one(wi):  # the stream is looked up per call: graph capture runs on a side stream
            s = torch.cuda.current_stream().cuda_stream
            mod.gemm_sm90(1, c, x.data_ptr(), D, wi.data_ptr(), D, rstd.data_ptr(), 0, y.data_ptr(), N, M, N, D,
                          False, s, *knobs, wsp, wsn, T.EPS, 0, op.sm90_ctas_arg(cfg))  # fmt: skip

        return harness.time_ms(calls(lambda _x, wi: one(wi), x, ws), small=True, rep_ms=20) * 1e3

    with torch.no_grad():
        for D, N in weights:
            gpu.setup(D, N)
            g, w, ws = gpu.data[(D, N)]
            for M in ms:
                if time.perf_counter() - T_START > args.budget:
                    res["notes"].append(f"budget: stopped before M{M} D{D} N{N}")
                    break
                x = gpu.x(M, D)
                ref = gpu.ref(M, D, N, x)
                row = {"shape": [M, D, N], "us": {}, "fn_us": {}, "raw_us": {}, "err": {}, "failed": []}
                row["shipped"] = op.plan(gpu.arch, M, N, D, has_gemm=True, has_mma=gpu.has_mma)
                wl = [wi.clone() for wi in ws]
                fl = calls(torch.nn.functional.linear, x, wl)
                row["us"]["F.linear"] = round(harness.time_ms(fl, small=True, rep_ms=20) * 1e3, 3)
                del wl, fl

                def module(x, wi, g=g, w=w):
                    return op._launch_ext(x, g, w, None, T.EPS, wi)

                def functional(x, wi, g=g):  # unfolded: the rotated copies stand in for W (same bytes)
                    return op._launch_ext(x, g, wi, None, T.EPS)

                for key, cfg in [("shipped", row["shipped"]), *variants.items()]:
                    try:
                        err = gpu.check(cfg, M, D, N, x, ref)
                    except Exception as e:  # noqa: BLE001 - a config the binary lacks, a launch failure
                        row["err"][key] = f"{type(e).__name__}: {e}"[:200]
                        row["failed"].append(key)
                        continue
                    row["err"][key] = err if math.isfinite(err) else str(err)
                    if not err <= T.TOL:
                        row["failed"].append(key)
                        continue
                    row["us"][key] = round(timed(cfg, calls(module, x, ws)), 3)
                    row["fn_us"][key] = round(timed(cfg, calls(functional, x, ws)), 3)
                    if cfg["path"] == "gemm":
                        try:  # a self-rstd config refuses more tokens than its tile (the module runs its twin)
                            row["raw_us"][key] = round(raw_gemm_us(cfg, x, ws), 3)
                        except RuntimeError as e:
                            row["raw_us"][key] = f"{e}"[:80]
                res["rows"].append(row)
                print(json.dumps({k: row[k] for k in ("shape", "us", "fn_us", "failed")}), flush=True)
                (out / "probe_rmsnorm_swapab.json").write_text(json.dumps(res, indent=1, default=str))
    keys = ["shipped", *variants]
    print("\nmodule us (fn us) [GEMM alone] | F.linear | " + " | ".join(keys))
    for row in res["rows"]:
        M, D, N = row["shape"]
        cells = [f"{row['us'].get(k, '-')} ({row['fn_us'].get(k, '-')}) [{row['raw_us'].get(k, '-')}]" for k in keys]
        print(f"M{M} D{D} N{N} | {row['us']['F.linear']} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
