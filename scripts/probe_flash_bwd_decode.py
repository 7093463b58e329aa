"""H200 probe: flash-attention backward, old vs new dK/dV kernel (32-bit offsets, TMA Q/dO loads, one causal loop).

    python scripts/probe_flash_bwd_decode.py OUTDIR [--budget 100]      # on the GPU (~100 s, compiles included)
    python scripts/probe_flash_bwd_decode.py OUTDIR --dry-run           # CPU: tiny shapes, interpreter

Groups run bar-critical first: D128 causal N16k, full N16k, causal/full N4k, D64 N4k, then D128 N1k.
Per group: (1) correctness of every variant (bf16 grads vs an fp32 reference, B=1 H=16 N=2048, same kernel
specializations as the timed N4k/N16k) -- a failing variant (rel err, NaN) is never timed; (2) our launcher vs
SDPA FLASH (FA2) and cuDNN backward (autograd.grad on a kept graph), do_bench medians, same process.
Variants: "old" = the shipped config with 64-bit offsets (the kernel before this change), "new" = shipped config
(32-bit offsets), "tma" = + TMA Q/dO loads, "tma1" = + one causal loop, and (D128, N >= 4k) two more TMA tiles.
Writes OUTDIR/probe_bwd.json (all numbers) and OUTDIR/tuning_fragment.json (per-bucket winners, tuning.json
format), prints a compact table last. Budget-guarded: when the budget is spent the rest is skipped, results written.
(Decode and atomic-dQ were settled by the previous run of this probe.)
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
DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402
from flashattn_triton.ops import flash_attn as F  # noqa: E402

BUCKETS = {1024: [0, 2048], 4096: [2049, 8192], 16384: [8193, 1 << 40]}


def bcfg(m1, n1, w, st, tma=0, one=0):
    return dict(BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_M2=n1, BLOCK_N2=m1, num_warps=w, num_stages=st, TMA=tma, ONE_LOOP=one)


def variants_for(shipped: dict, causal: bool, gpu: bool, explore: bool) -> dict:
    base = {k: v for k, v in shipped.items() if k not in ("TMA", "ONE_LOOP", "DQ_ATOMIC")}
    v = {
        "old": dict(base, TMA=0, ONE_LOOP=0, _OFF64=1),
        "new": dict(base, TMA=0, ONE_LOOP=0),
        "tma": dict(base, TMA=1, ONE_LOOP=0),
    }
    if causal:
        v["tma1"] = dict(base, TMA=1, ONE_LOOP=1)
    extra = {"tma-64x128-w8s3": bcfg(64, 128, 8, 3, 1), "tma-64x128-w8s2": bcfg(64, 128, 8, 2, 1)}
    if not gpu:
        extra = {"tma-16x32": bcfg(16, 32, 4, 1, 1)}
    if not explore:  # extra tiles only where the bar is tight (each costs compiles)
        extra = {}
    for name, c in extra.items():
        c = dict(c, ONE_LOOP=int(causal))
        if c not in v.values():
            v[name] = c
    return v


class Budget:
    def __init__(self, seconds):
        self.t0, self.seconds = time.time(), seconds

    def ok(self, reserve=0.0):
        return self.seconds - (time.time() - self.t0) > reserve


def rel(got, want):
    g, w = got.float(), want.float()
    if not torch.isfinite(g).all():
        return float("inf")
    return ((g - w).norm() / w.norm().clamp_min(1e-30)).item()


def ref_grads(q, k, v, do, causal, scale):
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    s = qf @ kf.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(~F.causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    (torch.softmax(s, -1) @ vf).backward(do.float())
    return qf.grad, kf.grad, vf.grad


def time_ms(fn, gpu, rep=30):
    if not gpu:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing as tt

    return float(tt.do_bench(fn, warmup=5, rep=rep, return_mode="median"))


def anchor_bwd_ms(ms: dict, skipped: list, q, k, v, do, causal, tag, rep=30) -> None:
    """SDPA FLASH (FA2) and cuDNN backward times into ms["fa2"] / ms["cudnn"]: autograd.grad replayed
    on a kept forward graph, do_bench median; a backend that refuses the shape is noted in skipped."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for an, be in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(be):
                o = Fn.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            ms[an] = time_ms(lambda o=o, i=(qq, kk, vv): torch.autograd.grad(o, i, do, retain_graph=True), True, rep)
            del o, qq, kk, vv
        except RuntimeError as e:
            skipped.append(f"{an} {tag}: {str(e)[:80]}")


def bwd_run(cfg, q, k, v, out, lse, do, causal, scale):
    """Our backward launcher alone; "_OFF64" forces the 64-bit offset path (the pre-change kernel)."""
    cfg = dict(cfg)
    off64 = cfg.pop("_OFF64", 0)
    limit = F._OFF32_LIMIT
    F._OFF32_LIMIT = 0 if off64 else limit
    try:
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        F._backward_launch(do, q, k, v, out, lse, None, dq, dk, dv, causal, scale, cfg)
    finally:
        F._OFF32_LIMIT = limit
    return dq, dk, dv


def setup(args):
    """Output dir, GPU or dry run, device, dtype, budget and the result skeleton of a backward probe."""
    out_dir = Path(args.outdir)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available() and not args.dry_run
    dev = torch.device("cuda" if gpu else "cpu")
    dt = torch.bfloat16 if gpu else torch.float16
    res = {"env": {}, "correctness": {}, "bwd": [], "skipped": []}
    if gpu:
        p = torch.cuda.get_device_properties(0)
        res["env"] = dict(gpu=p.name, sms=p.multi_processor_count, torch=torch.__version__)
    import triton

    res["env"]["triton"] = triton.__version__
    return out_dir, gpu, dev, dt, Budget(args.budget), res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=100.0, help="wall seconds, compiles included")
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes (logic check)")
    args = ap.parse_args()
    out_dir, gpu, dev, dt, budget, res = setup(args)

    # (D, causal, N), bar-critical first; B*N = 16k tokens, H*D = 2048
    if gpu:
        groups = [(128, c, n) for n in (16384, 4096) for c in (True, False)]
        groups += [(64, True, 4096), (64, False, 4096), (128, True, 1024), (128, False, 1024)]
        tot, hd, nchk = 16384, 2048, 2048
    else:
        groups = [(32, True, 64), (32, False, 64)]
        tot, hd, nchk = 64, 64, 40
    checked: dict[tuple, dict] = {}  # (D, causal) -> {variant name: ok}
    for D, causal, N in groups:
        if not budget.ok(8):
            res["skipped"].append(f"group D{D} causal={causal} N={N}")
            continue
        scale = D**-0.5
        shipped = F.get_config("bwd", dev, D, causal, N, dt)
        variants = variants_for(shipped, causal, gpu, explore=(D >= 128 and N >= 4096) or not gpu)
        # ---- correctness (per D, causal, variant config; cached across N) ----
        ok = checked.setdefault((D, causal), {})
        todo = {n: c for n, c in variants.items() if json.dumps(c, sort_keys=True) not in ok}
        if todo:
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(1, hd // D, nchk, D, device=dev, dtype=dt) for _ in range(4))
            want = ref_grads(q, k, v, do, causal, scale)
            out, lse = F._forward_impl(q, k, v, causal, scale, force_decode=False)
            for name, cfg in todo.items():
                try:
                    errs = [rel(g, w) for g, w in zip(bwd_run(cfg, q, k, v, out, lse, do, causal, scale), want)]
                    good = max(errs) < (3e-2 if gpu else 1e-2)
                except Exception as e:  # compile failure (shared memory, registers)
                    errs, good = [repr(e)[:200]], False
                res["correctness"][f"D{D} causal={causal} {name} {cfg}"] = dict(rel_err_dq_dk_dv=errs, ok=good)
                ok[json.dumps(cfg, sort_keys=True)] = good
        # ---- timing ----
        B, H = tot // N, hd // D
        flops = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
        row = dict(N=N, causal=causal, B=B, H=H, D=D, ms={}, tflops={}, shipped_cfg=shipped, cfgs=variants)
        q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=dt) for _ in range(4))
        out, lse = F._forward_impl(q, k, v, causal, scale, force_decode=False)
        if gpu:
            anchor_bwd_ms(row["ms"], res["skipped"], q, k, v, do, causal, f"D{D} N={N} causal={causal}")
        for name, cfg in variants.items():
            if not ok.get(json.dumps(cfg, sort_keys=True)):
                continue
            if not budget.ok(4):
                res["skipped"].append(f"{name} D{D} N={N} causal={causal}")
                continue
            try:
                row["ms"][name] = time_ms(lambda c=cfg: bwd_run(c, q, k, v, out, lse, do, causal, scale), gpu)  # noqa: B023
            except Exception as e:
                res["skipped"].append(f"{name} D{D} N={N} causal={causal}: {repr(e)[:120]}")
        row["tflops"] = {n: flops / (ms * 1e-3) / 1e12 for n, ms in row["ms"].items()}
        res["bwd"].append(row)
        print(f"[{time.time() - budget.t0:5.1f}s] D{D} N={N} causal={causal} done", flush=True)

    # ---- winners -> tuning fragment (bf16 + fp16 entries per timed bucket) ----
    frag, picks = [], {}
    for row in res["bwd"]:
        cands = {n: ms for n, ms in row["ms"].items() if n not in ("fa2", "cudnn", "old")}
        if not cands:
            continue
        best = min(cands, key=cands.get)
        cfg = {k: v for k, v in row["cfgs"][best].items() if v or k not in ("TMA", "ONE_LOOP")}
        picks[f"D{row['D']}-N{row['N']}-{'causal' if row['causal'] else 'full'}"] = best
        for dts in ("bf16", "fp16"):
            match = dict(
                kernel="bwd",
                head_dim=row["D"],
                causal=row["causal"],
                seqlen=BUCKETS.get(row["N"], [0, 1 << 40]),
                dtype=dts,
            )
            frag.append(dict(match=match, config=cfg))
    res["picks"] = picks
    res["wall_s"] = time.time() - budget.t0
    (out_dir / "probe_bwd.json").write_text(json.dumps(res, indent=1, default=str))
    (out_dir / "tuning_fragment.json").write_text(json.dumps({"sm90": frag}, indent=1))

    print("\n== correctness ==")
    for k_, v_ in res["correctness"].items():
        print(f"  {'ok ' if v_['ok'] else 'BAD'} {k_.split(' {')[0]}: {v_['rel_err_dq_dk_dv']}")
    print("\n== backward TFLOP/s (ratio vs FA2; bar >= 1.30x) ==")
    for row in res["bwd"]:
        fa2 = row["ms"].get("fa2")
        cells = [f"{n}={row['tflops'][n]:.0f}" + (f"({fa2 / row['ms'][n]:.2f}x)" if fa2 else "") for n in row["ms"]]
        print(f"  D{row['D']} N={row['N']:>5} {'causal' if row['causal'] else 'full  '} " + " ".join(cells))
    print("\n== picks (tuning_fragment.json) ==", picks)
    if res["skipped"]:
        print(f"  skipped ({len(res['skipped'])}):", "; ".join(res["skipped"][:8]))
    print(f"  wall {res['wall_s']:.0f}s -> {out_dir}")


if __name__ == "__main__":
    main()
