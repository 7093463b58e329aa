"""H200 probe: the SM90 (Gluon, warp-specialized) attention forward vs the portable kernel, cuDNN and FA2.

    python scripts/probe_flash_fwd_sm90.py OUTDIR [--budget 180] [--check full|new|none] [--causal-only | --full-only]
                                              [--only V1+V2] [--skip V3+V4] [--n 1024,2048] [--dims 64]
                                              [--overlay SM90_KEY=V[+KEY2=V2]]... [--old-module PATH]
                                              [--rounds R] [--no-portable]

(1) Correctness of every SM90 variant on odd shapes (ragged N, Nq != Nk both ways with bottom-right causal,
GQA, a (B, N, H, D) view, single rows), bf16 and fp16, outputs poisoned with NaN first: rel err of out and
LSE vs an fp32 reference; a variant that fails anywhere is never timed or picked.
(2) Timing on the benchmark shapes (B*N = 16k tokens, H*D = 2048; D64/D128, N 1k-16k, causal and not):
the shipped config, the SM90 variants, SDPA cuDNN and FA2 -- do_bench medians in one process.
Writes OUTDIR/probe_fwd_sm90.json and OUTDIR/tuning_fragment.json (per seqlen bucket, the SM90 variant
with the best geometric-mean time if it beats the portable kernel by > 1%, else the portable kernel;
tuning.json format); prints a
table last. Budget-guarded: what is left when it runs out is skipped and the results are still written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages/flashattn-triton/src"))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402
from flashattn_triton.ops import _fwd_sm90 as S  # noqa: E402
from flashattn_triton.ops import flash_attn as F  # noqa: E402
from probe_flash_bwd_decode import BUCKETS, Budget, rel  # noqa: E402

BUCKET_OF = {1024: 1024, 2048: 1024, 4096: 4096, 8192: 4096, 16384: 16384}  # N -> BUCKETS key
VARIANTS = {  # name -> SM90 config keys (C3 = three consumer warpgroups, np = one CTA per tile)
    "p128s3": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3),
    "np128s3": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_PERSIST=0),
    "p3c64s4": dict(SM90=1, SM90_BLOCK_N=64, SM90_STAGES=4, SM90_CONS=3),
    "p128s4": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4),
    "np128s4": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_PERSIST=0),
    "p3c128s4": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_CONS=3),
    # causal: heads in groups of G, longest row blocks of the group first (SM90_LPT)
    "np128s3g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_PERSIST=0, SM90_LPT=8),
    "np128s3g32": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_PERSIST=0, SM90_LPT=32),
    "p128s3g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_LPT=8),
    "np128s4g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_PERSIST=0, SM90_LPT=8),
    "np128s4g32": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_PERSIST=0, SM90_LPT=32),
    # ping-pong: the consumer warpgroups take turns issuing their wgmma (SM90_PP)
    "p128s3pp": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_PP=1),
    "np128s3pp": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_PERSIST=0, SM90_PP=1),
    "np128s3ppg8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_PERSIST=0, SM90_PP=1, SM90_LPT=8),
    "p128s4pp": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_PP=1),
    "p3c128s4pp": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_CONS=3, SM90_PP=1),
    "np128s4ppg8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_PERSIST=0, SM90_PP=1, SM90_LPT=8),
    # causal: 64-key tiles halve the masked work on the diagonal (deeper rings fit)
    "np64s6": dict(SM90=1, SM90_BLOCK_N=64, SM90_STAGES=6, SM90_PERSIST=0),
    "np64s6g8": dict(SM90=1, SM90_BLOCK_N=64, SM90_STAGES=6, SM90_PERSIST=0, SM90_LPT=8),
    # session 14: three consumers for causal D64 (the masked step no longer spills at 160 registers) and two
    # Q buffers (q2: the next tile's Q is loaded while this tile runs; at D128 only with the 2-deep K ring below)
    "p3c128s4g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_CONS=3, SM90_LPT=8),
    "np3c128s4g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_CONS=3, SM90_PERSIST=0, SM90_LPT=8),
    "p128s4q2": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_Q2=1),
    "p3c128s4q2": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_CONS=3, SM90_Q2=1),
    "p128s4q2g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_Q2=1, SM90_LPT=8),
    "p3c128s4q2g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_CONS=3, SM90_Q2=1, SM90_LPT=8),
    # D128: a 2-deep K ring (K is freed right after its QK^T) makes room for the second Q buffer
    "p128k2s3": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_KSTAGES=2),
    "p128k2s4": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_KSTAGES=2),
    "p128k2s3q2": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_KSTAGES=2, SM90_Q2=1),
    "p128k2s3q2g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_KSTAGES=2, SM90_Q2=1, SM90_LPT=8),
    # session 15: two Q buffers with ping-pong turns (D128 causal 2k); O through the consumed Q buffer and one TMA
    # store (o*: SM90_OTMA, needs SM90_Q2)
    "p128k2s3q2pp": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_KSTAGES=2, SM90_Q2=1, SM90_PP=1),
    "p128s3q2g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_Q2=1, SM90_LPT=8),
    "o128k2s3q2": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_KSTAGES=2, SM90_Q2=1, SM90_OTMA=1),
    "o128k2s3q2g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_KSTAGES=2, SM90_Q2=1, SM90_OTMA=1, SM90_LPT=8),
    "o128s4q2": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_Q2=1, SM90_OTMA=1),
    "o3c128s4q2": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_CONS=3, SM90_Q2=1, SM90_OTMA=1),
    "o128s3q2g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_Q2=1, SM90_OTMA=1, SM90_LPT=8),
    "o128s4q2g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_Q2=1, SM90_OTMA=1, SM90_LPT=8),
    "o128s3q2g16": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_Q2=1, SM90_OTMA=1, SM90_LPT=16),
    "o128s3q2g4": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_Q2=1, SM90_OTMA=1, SM90_LPT=4),
    # session 17, causal: each consumer warpgroup runs only its own rows' key blocks, the last at half width
    "h128s3q2g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_Q2=1, SM90_OTMA=1, SM90_LPT=8, SM90_HALF=1),
    "h128s3q2g4": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_Q2=1, SM90_OTMA=1, SM90_LPT=4, SM90_HALF=1),
    "h3c128s4q2g8": dict(
        SM90=1, SM90_BLOCK_N=128, SM90_STAGES=4, SM90_CONS=3, SM90_Q2=1, SM90_OTMA=1, SM90_LPT=8, SM90_HALF=1
    ),
    "h128k2s3q2g8": dict(
        SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_KSTAGES=2, SM90_Q2=1, SM90_OTMA=1, SM90_LPT=8, SM90_HALF=1
    ),
    "h128k2s3q2": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_KSTAGES=2, SM90_Q2=1, SM90_OTMA=1, SM90_HALF=1),
    "nh128s3g8": dict(SM90=1, SM90_BLOCK_N=128, SM90_STAGES=3, SM90_PERSIST=0, SM90_LPT=8, SM90_HALF=1),
}
DIMS = {"p3c64s4": (128,), "p128s4": (64,), "np128s4": (64,), "p3c128s4": (64,)}  # D128: shared memory
DIMS.update({n: (64,) for n in ("np128s4g8", "np128s4g32", "p128s4pp", "p3c128s4pp", "np128s4ppg8")})
DIMS.update({n: (64,) for n in ("p3c128s4g8", "np3c128s4g8", "p128s4q2", "p3c128s4q2", "p128s4q2g8", "p3c128s4q2g8")})
DIMS.update({n: (128,) for n in ("o128k2s3q2", "o128k2s3q2g8")})
DIMS.update({n: (64,) for n in ("p128s3q2g8", "o128s4q2", "o3c128s4q2", "o128s3q2g8", "o128s4q2g8", "o128s3q2g16")})
DIMS["o128s3q2g4"] = (64,)
DIMS.update({n: (64,) for n in ("h128s3q2g8", "h128s3q2g4", "h3c128s4q2g8")})
DIMS.update({n: (128,) for n in ("h128k2s3q2g8", "h128k2s3q2")})
CAUSAL_ONLY = {n for n, c in VARIANTS.items() if c.get("SM90_LPT") or c.get("SM90_HALF")} | {
    "np64s6"
}  # LPT: causal tiles only
# --check new: the variants added last. Session 7 (2026-12-01) also probed a consumer that software-pipelines
# tiles across their boundary (next tile's S(0) issued behind the last P V, optional second Q buffer): its best
# variant 1-14% slower than the shipped tables at N 1k-4k, and wrong on a ragged shape; not kept (see
# benchmarks/results/probes/h200-probe_fwd_sm90-xt.json and the .patch beside it), nor was the polynomial
# exp2 measured with --overlay SM90_EXP_POLY=n (h200-probe_fwd_sm90-exppoly.*). Session 15 measured a branch-free
# form (the previous tile's last P V issued behind the next tile's first QK^T, under its softmax; two Q buffers):
# 2-8% slower than the same config without it at D128 full, worse elsewhere (h200-probe_fwd_sm90-s15-xt.*).
NEW = {n for n, c in VARIANTS.items() if c.get("SM90_HALF")}  # session 17: per-warpgroup key blocks, half last block
# (B, H, Hkv, Nq, Nk, bnhd): ragged, Nq < Nk, Nq > Nk (rows with no key when causal), GQA, BNHD view, tiny
CHECK_SHAPES = [
    (1, 3, 3, 77, 300, False),
    (1, 2, 2, 300, 77, False),
    (4, 16, 4, 513, 513, False),  # 320 tiles: several per CTA
    (1, 4, 1, 129, 1100, True),
    (2, 4, 2, 700, 764, False),  # Nk - Nq = 64: a warpgroup's last block is a whole one fewer, or a half one
    (1, 2, 2, 1, 1, False),
]


def ref_fwd(q, k, v, causal, scale):
    """fp32 reference (out, natural-log LSE); rows without keys give 0 / -inf."""
    g = q.shape[1] // k.shape[1]
    qf, kf, vf = q.float(), k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
    s = qf @ kf.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(~F.causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return p @ vf, lse


def run(cfg, q, k, v, causal, scale, poison=False):
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    if poison:
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    F._fwd_launch(q, k, v, out, lse, causal, scale, cfg)
    return out, lse


def check(cfg, dt, D) -> tuple[bool, list]:
    errs = []
    for B, H, Hkv, nq, nk, bnhd in CHECK_SHAPES:
        for causal in (False, True):
            torch.manual_seed(nq * 7 + nk)
            if bnhd:
                q = torch.randn(B, nq, H, D, device="cuda", dtype=dt).transpose(1, 2)
                k, v = (torch.randn(B, nk, Hkv, D, device="cuda", dtype=dt).transpose(1, 2) for _ in range(2))
            else:
                q = torch.randn(B, H, nq, D, device="cuda", dtype=dt)
                k, v = (torch.randn(B, Hkv, nk, D, device="cuda", dtype=dt) for _ in range(2))
            assert S.eligible(q, k, v), (B, H, nq, nk, bnhd)
            scale = D**-0.5
            out, lse = run(cfg, q, k, v, causal, scale, poison=True)
            want, wlse = ref_fwd(q, k, v, causal, scale)
            e_o = rel(out, want)
            fin = torch.isfinite(wlse)
            lse_ok = bool((lse[~fin] == float("-inf")).all()) if (~fin).any() else True
            e_l = rel(lse[fin], wlse[fin]) if fin.any() else 0.0
            errs.append(dict(shape=(B, H, Hkv, nq, nk, bnhd), causal=causal, out=e_o, lse=e_l, lse_inf_ok=lse_ok))
    good = all(e["out"] < 2e-2 and e["lse"] < 1e-3 and e["lse_inf_ok"] for e in errs)
    return good, errs


def time_ms(fn, rep=40):
    import triton.testing as tt

    return float(tt.do_bench(fn, warmup=10, rep=rep, return_mode="median"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=180.0)
    ap.add_argument(
        "--check",
        default="full",
        choices=("full", "new", "none"),
        help="none: time only (variants checked before); new: check only the variants in NEW",
    )
    ap.add_argument("--causal-only", action="store_true", help="time the causal buckets only")
    ap.add_argument("--full-only", action="store_true", help="time the non-causal buckets only")
    ap.add_argument("--skip", default="", help="variant names not to time, separated by commas or +")
    ap.add_argument("--only", default="", help="time (and check) only these variants, separated by commas or +")
    ap.add_argument("--n", default="16384,4096,1024,8192,2048", help="sequence lengths to time, in order")
    ap.add_argument(
        "--overlay",
        action="append",
        default=[],
        help="also time the shipped config with these keys set, e.g. SM90_EXP_POLY=4 (repeatable; + joins keys)",
    )
    ap.add_argument("--dims", default="128,64", help="head dims to time")
    ap.add_argument("--rounds", type=int, default=1, help="time every variant this many times round-robin")
    ap.add_argument("--no-portable", action="store_true", help="do not time the portable kernel")
    ap.add_argument(
        "--old-module",
        default="",
        help="path of an earlier _fwd_sm90.py (e.g. from git show): also time the shipped config through it",
    )
    args = ap.parse_args()
    skip = set(filter(None, args.skip.replace("+", ",").split(",")))
    only = set(filter(None, args.only.replace("+", ",").split(",")))
    if only:
        skip |= set(VARIANTS) - only
    n_list = [int(n) for n in args.n.split(",")]
    old = None
    if args.old_module:
        import importlib.util

        spec = importlib.util.spec_from_file_location("flashattn_triton.ops._fwd_sm90_old", args.old_module)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    dims = [int(d) for d in args.dims.split(",")]
    overlays = {f"shipped+{o}": {kv.split("=")[0]: int(kv.split("=")[1]) for kv in o.split("+")} for o in args.overlay}
    out_dir = Path(args.outdir)
    out_dir.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    import triton

    p = torch.cuda.get_device_properties(0)
    res = dict(
        env=dict(gpu=p.name, torch=torch.__version__, triton=triton.__version__), correctness={}, fwd=[], skipped=[]
    )
    dev = torch.device("cuda")
    ok = {}
    for D in [d for d in (128, 64) if d in dims] if args.check != "none" else ():  # only the dims timed
        for dt in (torch.bfloat16,):  # fp16: the GPU tests
            for name, cfg in VARIANTS.items():
                if D not in DIMS.get(name, (64, 128)) or (args.check == "new" and name not in NEW) or name in skip:
                    continue
                try:
                    good, errs = check(cfg, dt, D)
                except Exception as e:
                    good, errs = False, [repr(e)[:300]]
                res["correctness"][f"D{D} {str(dt)[6:]} {name}"] = dict(ok=good, errs=errs)
                ok[(D, name)] = ok.get((D, name), True) and good
                print(
                    f"[{time.time() - budget.t0:5.1f}s] check D{D} {dt} {name}: {'ok' if good else 'BAD'}", flush=True
                )
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for D in dims:
        for causal in (True,) if args.causal_only else (False,) if args.full_only else (False, True):
            for N in n_list:
                if not budget.ok(6):
                    res["skipped"].append(f"D{D} N{N} causal={causal}")
                    continue
                B, H = 16384 // N, 2048 // D
                q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
                scale = D**-0.5
                shipped = F.get_config("fwd", dev, D, causal, N, torch.bfloat16)
                row = dict(D=D, N=N, causal=causal, B=B, H=H, shipped=shipped, ms={})
                fns = {}  # name -> call; timed round-robin --rounds times, median kept (the clocks drift)
                for an, be in (("cudnn", SDPBackend.CUDNN_ATTENTION),):  # FA2: the benchmark suite

                    def sd(be=be):
                        with sdpa_kernel(be):
                            return Fn.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: B023

                    try:
                        sd()
                        fns[an] = sd
                    except RuntimeError as e:
                        res["skipped"].append(f"{an} D{D} N{N}: {str(e)[:80]}")
                base = {kk: vv for kk, vv in shipped.items() if not kk.startswith("SM90")}
                if not args.no_portable:
                    fns["portable"] = lambda: run(base, q, k, v, causal, scale)  # noqa: B023
                fns["shipped"] = lambda: run(shipped, q, k, v, causal, scale)  # noqa: B023
                if old is not None:

                    def through_old():
                        F._fwd_sm90 = old
                        try:
                            return run(shipped, q, k, v, causal, scale)  # noqa: B023
                        finally:
                            F._fwd_sm90 = S

                    fns["shipped@old"] = through_old
                for oname, over in overlays.items():
                    fns[oname] = lambda o=over: run(dict(shipped, **o), q, k, v, causal, scale)  # noqa: B023
                for name, over in VARIANTS.items():
                    if (name in CAUSAL_ONLY and not causal) or name in skip:
                        continue
                    checked_before = args.check == "none" or (args.check == "new" and name not in NEW)
                    if D in DIMS.get(name, (64, 128)) and ok.get((D, name), checked_before):
                        fns[name] = lambda o=over: run(dict(base, **o), q, k, v, causal, scale)  # noqa: B023
                samples = {n: [] for n in fns}
                for _ in range(args.rounds):
                    for n, fn in fns.items():
                        samples[n].append(time_ms(fn))
                row["ms"] = {n: sorted(t)[len(t) // 2] for n, t in samples.items()}
                if args.rounds > 1:
                    row["samples_ms"] = samples
                flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
                row["tflops"] = {n: flops / (ms * 1e-3) / 1e12 for n, ms in row["ms"].items()}
                res["fwd"].append(row)
                print(f"[{time.time() - budget.t0:5.1f}s] D{D} N{N} causal={causal} " + " ".join(
                    f"{n}={t:.0f}" for n, t in row["tflops"].items()), flush=True)  # fmt: skip
    # per (D, causal, bucket): best SM90 variant by geometric-mean time, if it beats the portable kernel by > 1%
    frag, picks = [], {}
    groups: dict = {}
    for row in res["fwd"]:
        groups.setdefault((row["D"], row["causal"], BUCKET_OF[row["N"]]), []).append(row)
    for (D, causal, bk), rows in groups.items():
        names = [n for n in ["portable", "shipped", *VARIANTS] if all(n in r["ms"] for r in rows)]
        if not names:
            continue
        gm = {n: math.exp(sum(math.log(r["ms"][n]) for r in rows) / len(rows)) for n in names}
        best = min(gm, key=gm.get)
        picks[f"D{D}-{'causal' if causal else 'full'}-{bk}"] = dict(best=best, geomean_ms=gm)
        if best != "portable" and "portable" in gm and gm[best] >= 0.99 * gm["portable"]:
            best = "portable"  # within noise: keep the portable kernel
        # every timed bucket gets an entry, so a bucket where the portable kernel wins drops the SM90 keys
        base = {kk: vv for kk, vv in rows[0]["shipped"].items() if not kk.startswith("SM90")}
        if best == "shipped":
            continue  # the table already holds it
        for dts in ("bf16", "fp16"):
            match = dict(kernel="fwd", head_dim=D, causal=causal, seqlen=BUCKETS[bk], dtype=dts)
            frag.append(dict(match=match, config=dict(base, **VARIANTS.get(best, {}))))
    res["picks"] = picks
    res["wall_s"] = time.time() - budget.t0
    (out_dir / "probe_fwd_sm90.json").write_text(json.dumps(res, indent=1, default=str))
    (out_dir / "tuning_fragment.json").write_text(json.dumps({"sm90": frag}, indent=1))
    print("\n== correctness ==")
    for k_, v_ in res["correctness"].items():
        worst = max((e["out"] for e in v_["errs"] if isinstance(e, dict)), default=float("nan"))
        print(
            f"  {'ok ' if v_['ok'] else 'BAD'} {k_}: worst out rel err {worst:.2e}"
            + ("" if v_["ok"] else f" {v_['errs'][:2]}")
        )
    print("\n== forward TFLOP/s (ratio vs cuDNN) ==")
    for row in res["fwd"]:
        c = row["ms"].get("cudnn")
        cells = [f"{n}={row['tflops'][n]:.0f}" + (f"({c / row['ms'][n]:.2f})" if c else "") for n in row["ms"]]
        print(f"  D{row['D']} N={row['N']:>5} {'causal' if row['causal'] else 'full  '} " + " ".join(cells))
    print("\n== picks ==", {k_: v_["best"] for k_, v_ in picks.items()})
    if res["skipped"]:
        print(f"  skipped ({len(res['skipped'])}):", "; ".join(res["skipped"][:8]))
    print(f"  wall {res['wall_s']:.0f}s -> {out_dir}")


if __name__ == "__main__":
    main()
