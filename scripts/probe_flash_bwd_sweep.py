"""H200 probe: flash-attention backward D128 bf16 -- the new launch knobs and a pruned tile sweep vs FA2 / cuDNN.

    python scripts/probe_flash_bwd_sweep.py OUTDIR [--budget 150]      # on the GPU (compiles included)
    python scripts/probe_flash_bwd_sweep.py OUTDIR --dry-run           # CPU: tiny shapes, interpreter

Groups (B*N = 16k tokens, H = 16), bar-critical first: N16k full, N16k causal, N1k causal, then N4k causal,
N4k full, N1k full. Knobs (config keys of _backward_launch; absent = shipped behaviour):
  FUSED=1/2          dK/dV and dQ programs in one launch (1: dK/dV programs first, 2: dQ programs first)
  num_warps2/num_stages2, BLOCK_M2/BLOCK_N2   the dQ kernel's own warps/stages/tiles (decoupled from dK/dV)
  maxnreg/maxnreg2   ptxas register cap of the dK/dV (or fused) / dQ launch
  --set dqtma        DQ_ATOMIC 2 (dQ by one TMA reduce-add per tile, no dQ kernel) vs scalar atomics (1)
  --set c16k         N16k causal only: TMA loads, with and without the fused launch
  --set dkdv         SM90_DKDV: dK/dV from the warp-specialized Gluon kernel, dQ from the PART 2 launch
Per group: (1) correctness of every variant (bf16 grads vs an fp32 reference, B=1 H=16 N=2048, same kernel
specializations as the timed shapes; cached per (causal, config)) -- a failing variant is never timed;
(2) shipped config first, then the variants, vs SDPA FLASH (FA2) and cuDNN backward (autograd.grad on a kept
graph), do_bench medians, same process. Budget: each group gets a share of what is left (compiles are the cost:
~5-10 s per new bwd config; the N4k groups and N1k full reuse the N16k kernels); when it runs out the rest is
skipped and the results are still written.
Writes OUTDIR/probe_bwd_sweep.json (all numbers) and OUTDIR/tuning_fragment.json (bf16 + fp16 entries for the
buckets whose winner is > 1% faster than the shipped config, tuning.json format); prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages/flashattn-triton/src"))
sys.path.insert(0, str(ROOT / "scripts"))
DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from flashattn_triton.ops import flash_attn as F  # noqa: E402
from probe_flash_bwd_decode import BUCKETS, anchor_bwd_ms, bwd_run, ref_grads, rel, setup, time_ms  # noqa: E402

# (name, config overrides on top of the shipped config); order = priority (the budget may cut the tail)
BIG = [  # N >= 4k and N1k full: shipped dK/dV 64x128, dQ 128x64, 8 warps, 3 stages (+TMA when full)
    ("fused1", dict(FUSED=1)),
    ("fused2", dict(FUSED=2)),
    ("dq-64x64-w4s2", dict(BLOCK_M2=64, BLOCK_N2=64, num_warps2=4, num_stages2=2)),  # 96 KB smem: 2 CTAs/SM
    ("dq-s2", dict(num_stages2=2)),
    ("dq-64x64-w4s3", dict(BLOCK_M2=64, BLOCK_N2=64, num_warps2=4, num_stages2=3)),
    ("dq-128x32-s4", dict(BLOCK_N2=32, num_stages2=4)),
    ("dq-64x128-w4s2", dict(BLOCK_M2=64, BLOCK_N2=128, num_warps2=4, num_stages2=2)),
    ("fused1-dq-64x64", dict(FUSED=1, BLOCK_M2=64, BLOCK_N2=64)),
    ("dq-128x128-s2", dict(BLOCK_N2=128, num_stages2=2)),
]  # maxnreg: not swept -- offline sm_90, a 240 cap on the 64x128 w8s3 dK/dV kernel raises its spills (48 -> 92 B)
SMALL_CAUSAL = [  # N1k causal: shipped dK/dV 32x64, dQ 64x32, 4 warps, 4 stages, TMA, one causal loop
    ("fused1", dict(FUSED=1)),
    ("fused2", dict(FUSED=2)),
    ("dq-64x64", dict(BLOCK_N2=64)),
    ("dq-64x64-s3", dict(BLOCK_N2=64, num_stages2=3)),
    ("fused1-dq-64x64", dict(FUSED=1, BLOCK_N2=64)),
    ("dq-128x64-w8s3", dict(BLOCK_M2=128, BLOCK_N2=64, num_warps2=8, num_stages2=3)),
    ("dkdv-64x64-s3", dict(BLOCK_M1=64, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=64, num_stages=3)),
    ("dkdv-32x128-s3", dict(BLOCK_N1=128, BLOCK_M2=128, num_stages=3, num_warps2=8)),
    ("fused1-dkdv-64x64-s3", dict(FUSED=1, BLOCK_M1=64, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=64, num_stages=3)),
    ("big-w8s3", dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64, num_warps=8, num_stages=3)),
    ("big-w8s3-fused1", dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64, num_warps=8, num_stages=3, FUSED=1)),
]
DRY_VARIANTS = [
    ("fused1", dict(FUSED=1)),
    ("fused2-tma", dict(FUSED=2, TMA=1)),
    ("dq-knobs", dict(BLOCK_M2=16, num_warps2=8, num_stages2=2, maxnreg=128, maxnreg2=168)),
]
# (causal, N, share of the remaining budget): N16k full/causal and N1k causal compile most of the kernels
GROUPS = [
    (False, 16384, 0.3),
    (True, 16384, 0.4),
    (True, 1024, 0.7),
    (True, 4096, 0.4),
    (False, 4096, 0.5),
    (False, 1024, 1.0),
]


# --set lpt: causal groups only, the program order knob (LPT (batch, head) pairs per block-major group)
LPT_SET = [
    ("lpt2", dict(LPT=2)),
    ("lpt4", dict(LPT=4)),
    ("lpt8", dict(LPT=8)),
    ("lpt16", dict(LPT=16)),
    ("fused1-lpt4", dict(FUSED=1, LPT=4)),
    ("fused1-lpt16", dict(FUSED=1, LPT=16)),
]
# --set dqtma: the atomic-dQ backward (5 GEMMs, no dQ kernel) with one TMA reduce-add per dQ tile (DQ_ATOMIC 2),
# against the same with scalar atomics (1); every split/fused knob of the shipped config is dropped
DQTMA_SET = [
    ("a2-64x128-w8s2-tma", dict(BLOCK_M1=64, BLOCK_N1=128, num_warps=8, num_stages=2, TMA=1, DQ_ATOMIC=2)),
    ("a2-32x128-w8s3-tma", dict(BLOCK_M1=32, BLOCK_N1=128, num_warps=8, num_stages=3, TMA=1, DQ_ATOMIC=2)),
    ("a2-64x64-w8s3-tma", dict(BLOCK_M1=64, BLOCK_N1=64, num_warps=8, num_stages=3, TMA=1, DQ_ATOMIC=2)),
    ("a2-64x128-w8s3-tma", dict(BLOCK_M1=64, BLOCK_N1=128, num_warps=8, num_stages=3, TMA=1, DQ_ATOMIC=2)),
    ("a1-64x128-w8s2-tma", dict(BLOCK_M1=64, BLOCK_N1=128, num_warps=8, num_stages=2, TMA=1, DQ_ATOMIC=1)),
]
# --set c16k: N16k causal only -- the TMA loads of the N16k full entry, whose dK/dV kernel Nsight Compute found
# without spills where the shipped pointer-load causal one spills (session 17, h200-ncu_bwd-s17.txt)
C16K_SET = [
    ("tma", dict(TMA=1)),
    ("tma-fused1", dict(TMA=1, FUSED=1)),
    ("tma-fused2", dict(TMA=1, FUSED=2)),
    ("tma-fused1-lpt4", dict(TMA=1, FUSED=1, LPT=4)),
]
# --set dkdv: dK/dV from the warp-specialized Gluon kernel (ops/_bwd_sm90.py), dQ from the shipped PART 2 launch
DKDV_SET = [
    ("dkdv-s2", dict(SM90_DKDV=1, SM90_DKDV_STAGES=2)),
    ("dkdv-s3", dict(SM90_DKDV=1, SM90_DKDV_STAGES=3)),
]
VARIANT_SET = "tiles"


def variants_for(shipped: dict, causal: bool, n: int, gpu: bool) -> dict:
    base = dict(shipped)
    if not gpu:
        base = dict(BLOCK_M1=16, BLOCK_N1=32, BLOCK_M2=32, BLOCK_N2=16, num_warps=4, num_stages=1, TMA=int(causal))
        table = DRY_VARIANTS if VARIANT_SET != "lpt" else LPT_SET[:2]
    elif VARIANT_SET in ("lpt", "c16k", "dkdv"):
        out = {"shipped": base}
        sets = dict(lpt=LPT_SET, c16k=C16K_SET, dkdv=DKDV_SET)
        out.update((name, dict(base, **over)) for name, over in sets[VARIANT_SET])
        return out
    elif VARIANT_SET == "dqtma":
        out = {"shipped": base}
        plain = {k: v for k, v in base.items() if k not in ("FUSED", "ONE_LOOP", "num_warps2", "num_stages2")}
        out.update((name, dict(plain, **over)) for name, over in DQTMA_SET)
        return out
    else:
        table = SMALL_CAUSAL if (causal and n <= 2048) else BIG
    out = {"shipped": base}
    if gpu and causal and not base.get("TMA"):  # N >= 4k causal ships pointer loads: fused + TMA + one loop
        table = table[:2] + [("fused1-tma1", dict(FUSED=1, TMA=1, ONE_LOOP=1))] + table[2:]
    for name, over in table:
        cfg = dict(base, **over)
        if cfg not in out.values():
            out[name] = cfg
    return out


def _shape(gpu: bool) -> tuple[int, int, int]:
    """(D, tokens B*N, H*D) of the timed shapes and the correctness / compile shape B=1, N=nchk."""
    return (128, 16384, 2048) if gpu else (32, 64, 64)


def _worker(task):
    """Compile phase (spawned process): one backward launch at the correctness shape -- the same kernel
    specializations (ints divisible by 16) as the timed shapes, so the main process hits the disk cache."""
    idx, (causal, cfg) = task
    t0 = time.time()
    try:
        gpu = torch.cuda.is_available() and not DRY
        dev, dt = (torch.device("cuda"), torch.bfloat16) if gpu else (torch.device("cpu"), torch.float16)
        D, _, hd = _shape(gpu)
        n = 2048 if gpu else 40
        q, k, v, do, out = (torch.randn(1, hd // D, n, D, device=dev, dtype=dt) for _ in range(5))
        lse = torch.randn(1, hd // D, n, device=dev) + 5
        bwd_run(cfg, q, k, v, out, lse, do, causal, D**-0.5)
        if gpu:
            torch.cuda.synchronize()
        return idx, True, "", time.time() - t0
    except Exception as e:
        return idx, False, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", time.time() - t0


def clean(cfg: dict) -> dict:
    """Config as tuning.json stores it: no zero-valued switches, no dQ keys equal to the dK/dV ones."""
    out = {k: v for k, v in cfg.items() if not (k in ("TMA", "ONE_LOOP", "FUSED", "maxnreg", "maxnreg2") and not v)}
    for k2, k1 in (("num_warps2", "num_warps"), ("num_stages2", "num_stages")):
        if k2 in out and out[k2] == out[k1]:
            del out[k2]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=150.0, help="wall seconds, compiles included")
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes (logic check)")
    ap.add_argument("--workers", type=int, default=min(10, max(1, (os.cpu_count() or 4) - 4)))
    ap.add_argument("--compile-share", type=float, default=0.45, help="budget share of the parallel compile phase")
    ap.add_argument(
        "--set",
        default="tiles",
        choices=("tiles", "lpt", "dqtma", "c16k", "dkdv"),
        help="variant set (lpt: causal order; dqtma: TMA-reduce atomic dQ; c16k: TMA loads at N16k causal; "
        "dkdv: the Gluon dK/dV kernel)",
    )
    args = ap.parse_args()
    out_dir, gpu, dev, dt, budget, res = setup(args)

    D, tot, hd = _shape(gpu)
    nchk = 2048 if gpu else 40
    global VARIANT_SET
    VARIANT_SET = args.set
    groups = GROUPS if gpu else [(False, 64, 0.5), (True, 32, 1.0)]
    if args.set == "lpt":  # the order only matters where causal blocks differ in work
        groups = [g for g in groups if g[0]]
    if args.set == "c16k" and gpu:
        groups = [(True, 16384, 1.0)]
    # ---- parallel compile phase: every (causal, config) of every group, in priority order ----
    tasks = []
    for causal, N, _ in groups:
        for cfg in variants_for(F.get_config("bwd", dev, D, causal, N, dt), causal, N, gpu).values():
            if (causal, cfg) not in tasks:
                tasks.append((causal, cfg))
    if args.workers > 0:
        from probe_int8 import compile_phase

        t_c = time.time()
        st = compile_phase(
            tasks,
            budget.t0 + args.budget * args.compile_share,
            args.workers,
            worker=_worker,
            describe=lambda t: f"causal={t[0]} {t[1]}",
        )
        res["compile"] = dict(
            tasks=len(tasks),
            done=len(st),
            failed=[str(tasks[i]) for i, s_ in st.items() if not s_[0]],
            wall_s=time.time() - t_c,
            max_task_s=max((s_[2] for s_ in st.values()), default=0.0),
        )
        print(f"[{time.time() - budget.t0:5.1f}s] compile phase: {len(st)}/{len(tasks)} configs", flush=True)
    checked: dict[str, bool] = {}  # json(causal, config) -> correct
    for gi, (causal, N, share) in enumerate(groups):
        left = args.budget - (time.time() - budget.t0)
        g_end = time.time() + max(left - 5, 0) * share  # this group's deadline (timing included)
        if left < 10:
            res["skipped"].append(f"group N={N} causal={causal}")
            continue
        scale = D**-0.5
        shipped = F.get_config("bwd", dev, D, causal, N, dt)
        variants = variants_for(shipped, causal, N, gpu)
        row = dict(N=N, causal=causal, D=D, ms={}, tflops={}, shipped_cfg=shipped, cfgs=variants, errs={})
        B, H = tot // N, hd // D
        row.update(B=B, H=H)
        torch.manual_seed(0)
        qc, kc, vc, doc = (torch.randn(1, hd // D, nchk, D, device=dev, dtype=dt) for _ in range(4))
        want = ref_grads(qc, kc, vc, doc, causal, scale)
        outc, lsec = F._forward_impl(qc, kc, vc, causal, scale, force_decode=False)
        q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=dt) for _ in range(4))
        out, lse = F._forward_impl(q, k, v, causal, scale, force_decode=False)
        rep = 150 if N >= 16384 else 60  # ms of do_bench repetitions: >= ~10 runs even at N16k full
        if gpu:
            anchor_bwd_ms(row["ms"], res["skipped"], q, k, v, do, causal, f"N={N} causal={causal}", rep)
        for vi, (name, cfg) in enumerate(variants.items()):
            # the shipped config always runs (the baseline); the others only inside this group's deadline
            if vi and (time.time() > g_end or not budget.ok(6)):
                res["skipped"].append(f"{name} N={N} causal={causal}")
                continue
            key = json.dumps([causal, cfg], sort_keys=True)
            if key not in checked:
                try:
                    got = bwd_run(cfg, qc, kc, vc, outc, lsec, doc, causal, scale)
                    errs = [rel(g, w) for g, w in zip(got, want)]
                    good = max(errs) < (3e-2 if gpu else 1e-2)
                except Exception as e:  # compile failure (shared memory, registers)
                    errs, good = [repr(e)[:200]], False
                res["correctness"][f"causal={causal} {name} {cfg}"] = dict(rel_err_dq_dk_dv=errs, ok=good)
                checked[key] = good
                row["errs"][name] = errs
            if not checked[key]:
                continue
            try:
                row["ms"][name] = time_ms(lambda c=cfg: bwd_run(c, q, k, v, out, lse, do, causal, scale), gpu, rep)  # noqa: B023
            except Exception as e:
                res["skipped"].append(f"{name} N={N} causal={causal}: {repr(e)[:120]}")
        # the shipped config again, last: the picks must beat the better of the two (drift / noise guard)
        if "shipped" in row["ms"]:
            c0 = variants["shipped"]
            row["ms"]["shipped#2"] = time_ms(lambda: bwd_run(c0, q, k, v, out, lse, do, causal, scale), gpu, rep)  # noqa: B023
        flops = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
        row["tflops"] = {n: flops / (ms * 1e-3) / 1e12 for n, ms in row["ms"].items()}
        res["bwd"].append(row)
        print(
            f"[{time.time() - budget.t0:5.1f}s] group {gi}: N={N} causal={causal} ({len(row['ms'])} timed)", flush=True
        )

    # ---- winners (> 1% faster than shipped) -> tuning fragment, bf16 + fp16 entries ----
    frag, picks = [], {}
    for row in res["bwd"]:
        ours = {n: ms for n, ms in row["ms"].items() if n not in ("fa2", "cudnn", "shipped#2")}
        if "shipped" not in ours:
            continue
        best = min(ours, key=ours.get)
        gain = min(ours["shipped"], row["ms"].get("shipped#2", float("inf"))) / ours[best] - 1
        tag = f"D{row['D']}-N{row['N']}-{'causal' if row['causal'] else 'full'}"
        picks[tag] = dict(best=best, gain_vs_shipped=round(gain, 4))
        if best == "shipped" or gain <= 0.01:
            continue
        for dts in ("bf16", "fp16"):
            match = dict(
                kernel="bwd",
                head_dim=row["D"],
                causal=row["causal"],
                seqlen=BUCKETS.get(row["N"], [0, 2048]),
                dtype=dts,
            )
            frag.append(dict(match=match, config=clean(row["cfgs"][best])))
    res["picks"] = picks
    res["wall_s"] = time.time() - budget.t0
    (out_dir / "probe_bwd_sweep.json").write_text(json.dumps(res, indent=1, default=str))
    (out_dir / "tuning_fragment.json").write_text(json.dumps({"sm90": frag}, indent=1))

    bad = [k_ for k_, v_ in res["correctness"].items() if not v_["ok"]]
    print(f"\n== correctness: {len(res['correctness']) - len(bad)} ok, {len(bad)} failed ==")
    for k_ in bad:
        print(f"  BAD {k_.split(' {')[0]}: {res['correctness'][k_]['rel_err_dq_dk_dv']}")
    if res["skipped"]:
        print(f"  skipped ({len(res['skipped'])}):", "; ".join(res["skipped"][:12]))
    print("\n== picks (tuning_fragment.json: only > 1% over shipped) ==", json.dumps(picks))
    print(f"  wall {res['wall_s']:.0f}s -> {out_dir}")
    print("\n== backward: ms, TFLOP/s, ratio vs FA2 (bar >= 1.30x) ==")
    for row in res["bwd"]:
        fa2 = row["ms"].get("fa2")
        print(f"  D{row['D']} N={row['N']} {'causal' if row['causal'] else 'full'} B={row['B']} H={row['H']}")
        for n, ms in sorted(row["ms"].items(), key=lambda kv: kv[1]):
            ratio = f" {fa2 / ms:.3f}x" if fa2 else ""
            print(f"    {n:<22} {ms:8.3f} ms {row['tflops'][n]:6.0f} TF/s{ratio}")


if __name__ == "__main__":
    main()
