"""H200 probe: flash-attention backward (split dQ kernel vs atomic dQ) and split-KV decode (pointer vs TMA).

    python scripts/probe_flash_bwd_decode.py OUTDIR [--budget 150]      # on the GPU
    python scripts/probe_flash_bwd_decode.py OUTDIR --dry-run           # CPU: tiny shapes, interpreter

1. correctness of every variant first (bf16 fwd+bwd grads vs an fp32 reference at N=1024; decode vs
   reference at B=2, L=8192); a failing variant (rel err, NaN) is never timed;
2. backward: D=128, causal F/T, N in {1k, 4k, 16k}, B*N = 16k, H = 16: our kernels (the launcher alone)
   vs SDPA FLASH (FA2) and cuDNN backward (autograd.grad on a kept graph) in the same process;
3. decode: Nq=1, H=32, Hkv=8, D=128, B in {1, 8}, L in {1k, 8k, 32k}, CUDA-graph replay, K/V caches
   rotated so they do not sit in L2; vs SDPA(enable_gqa);
4. OUTDIR/probe_bwd_decode.json (all numbers), OUTDIR/tuning_fragment.json (winners, tuning.json format),
   then a compact table and the recommended defaults.
Budget-guarded (compiles included): once the budget is spent, the rest is skipped and results still written.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages/flashattn-triton/src"))
sys.path.insert(0, str(ROOT))
DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402
from flashattn_triton.ops import flash_attn as F  # noqa: E402


def bcfg(m1, n1, w, st, atomic=False):
    return dict(BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_M2=n1, BLOCK_N2=m1, num_warps=w, num_stages=st, DQ_ATOMIC=atomic)


# Backward candidates (D=128), most promising first. Offline sm90 compile (Triton 3.6) of the dK/dV kernel:
# 64x128 w8 s3 (shipped) spills 288/652 B (full/causal); 32x128 w8 s3 0/128; 64x128 w8 s1 0/336;
# atomic variants spill more (32x128 w8 s3: 348/612; 64x64 w8 s3: 704/1316): the probe decides.
BWD_VARIANTS = {
    "split-64x128-w8s3": bcfg(64, 128, 8, 3),
    "split-32x128-w8s3": bcfg(32, 128, 8, 3),
    "split-64x128-w8s2": bcfg(64, 128, 8, 2),
    "atomic-32x128-w8s3": bcfg(32, 128, 8, 3, True),
    "atomic-64x64-w8s3": bcfg(64, 64, 8, 3, True),
    "atomic-64x128-w8s2": bcfg(64, 128, 8, 2, True),
}


def dcfg(bn, w, st, tma, waves):
    return dict(BLOCK_N=bn, num_warps=w, num_stages=st, TMA=tma, WAVES=waves)


DEC_VARIANTS = {
    "ptr-64-w4s3-x2": dcfg(64, 4, 3, False, 2),
    "tma-64-w4s4-x2": dcfg(64, 4, 4, True, 2),
    "tma-128-w4s2-x2": dcfg(128, 4, 2, True, 2),
    "tma-128-w4s3-x1": dcfg(128, 4, 3, True, 1),
    "tma-64-w8s4-x3": dcfg(64, 8, 4, True, 3),
    "tma-32-w4s4-x4": dcfg(32, 4, 4, True, 4),
    "tma-256-w8s2-x2": dcfg(256, 8, 2, True, 2),
}

BWD_BUCKETS = {1024: [0, 2048], 4096: [2049, 8192], 16384: [8193, 1 << 40]}
DEC_BUCKETS = {1024: [0, 2048], 8192: [2049, 16384], 32768: [16385, 1 << 40]}


class Budget:
    def __init__(self, seconds):
        self.t0, self.seconds = time.time(), seconds

    def left(self):
        return self.seconds - (time.time() - self.t0)

    def ok(self, reserve=0.0):
        return self.left() > reserve


def rel(got, want):
    g, w = got.float(), want.float()
    if not torch.isfinite(g).all():
        return float("inf")
    return ((g - w).norm() / w.norm().clamp_min(1e-30)).item()


def ref_fwd_bwd(q, k, v, do, causal, scale):
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    g = qf.shape[1] // kf.shape[1]
    s = qf @ kf.repeat_interleave(g, 1).transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(~F.causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    out = torch.softmax(s, -1) @ vf.repeat_interleave(g, 1)
    out.backward(do.float())
    return out.detach(), qf.grad, kf.grad, vf.grad


def time_ms(fn, gpu, graph=False, rep=40):
    if not gpu:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing as tt

    if graph:
        with torch.cuda.stream(torch.cuda.Stream()):
            return float(tt.do_bench_cudagraph(fn, rep=rep, return_mode="median"))
    return float(tt.do_bench(fn, warmup=10, rep=rep, return_mode="median"))


def bwd_run(cfg, q, k, v, out, lse, do, causal, scale):
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    F._backward_launch(do, q, k, v, out, lse, None, dq, dk, dv, causal, scale, cfg)
    return dq, dk, dv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=150.0, help="wall seconds, compiles included")
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes (logic check)")
    args = ap.parse_args()
    out_dir = Path(args.outdir)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available() and not args.dry_run
    dev = torch.device("cuda" if gpu else "cpu")
    dt = torch.bfloat16 if gpu else torch.float16
    budget = Budget(args.budget)
    res = {"env": {}, "correctness": {}, "bwd": [], "decode": [], "skipped": []}
    if gpu:
        p = torch.cuda.get_device_properties(0)
        res["env"] = dict(gpu=p.name, sms=p.multi_processor_count, torch=torch.__version__)
    import triton

    res["env"]["triton"] = triton.__version__

    # ---------------- shapes ----------------
    D = 128 if gpu else 32
    bwd_sizes = (1024, 4096, 16384) if gpu else (64,)
    tot, hd = (16384, 2048) if gpu else (64, 64)
    dec_H, dec_Hkv = (32, 8) if gpu else (8, 2)
    dec_lens = (1024, 8192, 32768) if gpu else (200,)
    dec_batches = (1, 8) if gpu else (1, 2)
    bwd_variants = dict(BWD_VARIANTS)
    dec_variants = dict(DEC_VARIANTS)
    if not gpu:  # interpreter: tiny tiles, TMA path exercised through the interpreter's descriptors
        bwd_variants = {"split-16x32": bcfg(16, 32, 4, 1), "atomic-16x32": bcfg(16, 32, 4, 1, True)}
        dec_variants = {"ptr-16": dcfg(16, 4, 1, False, 2), "tma-16": dcfg(16, 4, 1, True, 2)}
        F._decode_tma_ok = lambda t: True

    # ---------------- 1. correctness ----------------
    torch.manual_seed(0)
    ok_bwd, ok_dec = {}, {}
    nchk = 1024 if gpu else 40
    for causal in (False, True):
        q, k, v, do = (torch.randn(1, 4, nchk, D, device=dev, dtype=dt) for _ in range(4))
        scale = D**-0.5
        want = ref_fwd_bwd(q, k, v, do, causal, scale)
        out, lse = F._forward_impl(q, k, v, causal, scale, force_decode=False)
        for name, cfg in bwd_variants.items():
            if not budget.ok(20):
                res["skipped"].append(f"check {name}")
                continue
            try:
                got = bwd_run(cfg, q, k, v, out, lse, do, causal, scale)
                errs = [rel(g, w) for g, w in zip(got, want[1:])]
                good = max(errs) < (3e-2 if gpu else 1e-2)
            except Exception as e:  # compile failure (shared memory, registers)
                errs, good = [repr(e)[:200]], False
            res["correctness"][f"bwd {name} causal={causal}"] = dict(rel_err_dq_dk_dv=errs, ok=good)
            ok_bwd[name] = ok_bwd.get(name, True) and good
    B, L = (2, 8192) if gpu else (2, 200)
    q = torch.randn(B, dec_H, 1, D, device=dev, dtype=dt)
    k, v = (torch.randn(B, dec_Hkv, L, D, device=dev, dtype=dt) for _ in range(2))
    want = ref_fwd_bwd(q, k, v, torch.zeros_like(q), False, D**-0.5)[0]
    for name, cfg in dec_variants.items():
        o, lse = torch.full_like(q, float("nan")), torch.empty(B, dec_H, 1, device=dev)
        try:
            F._decode_launch(q, k, v, o, lse, False, D**-0.5, cfg)
            err = rel(o, want)
            good = err < (1e-2 if gpu else 2e-3)
        except Exception as e:
            err, good = repr(e)[:200], False
        res["correctness"][f"decode {name}"] = dict(rel_err=err, ok=good)
        ok_dec[name] = good
    print(f"[{time.time() - budget.t0:5.1f}s] correctness done", flush=True)

    # ---------------- 2. backward timing ----------------
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for causal in (False, True):
        for N in bwd_sizes:
            B, H = tot // N, hd // D
            flops = 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
            row = dict(N=N, causal=causal, B=B, H=H, D=D, ms={}, tflops={})
            q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=dt) for _ in range(4))
            scale = D**-0.5
            out, lse = F._forward_impl(q, k, v, causal, scale, force_decode=False)
            if gpu:
                for an, be in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                        with sdpa_kernel(be):
                            o = Fn.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                        row["ms"][an] = time_ms(
                            lambda o=o, i=(qq, kk, vv), g=do: torch.autograd.grad(o, i, g, retain_graph=True),
                            gpu,
                        )
                    except RuntimeError as e:
                        res["skipped"].append(f"{an} N={N} causal={causal}: {str(e)[:80]}")
            shipped = F.get_config("bwd", dev, D, causal, N, dt)
            variants = {"shipped": shipped} | {n: c for n, c in bwd_variants.items() if ok_bwd.get(n)}
            for name, cfg in variants.items():
                if not budget.ok(45):  # keep time for decode
                    res["skipped"].append(f"bwd {name} N={N} causal={causal}")
                    continue
                try:
                    row["ms"][name] = time_ms(lambda c=cfg: bwd_run(c, q, k, v, out, lse, do, causal, scale), gpu)  # noqa: B023
                except Exception as e:
                    res["skipped"].append(f"bwd {name} N={N} causal={causal}: {repr(e)[:120]}")
            row["tflops"] = {n: flops / (ms * 1e-3) / 1e12 for n, ms in row["ms"].items()}
            row["shipped_cfg"] = shipped
            res["bwd"].append(row)
            print(f"[{time.time() - budget.t0:5.1f}s] bwd N={N} causal={causal} done", flush=True)

    # ---------------- 3. decode timing ----------------
    for B in dec_batches:
        for L in dec_lens:
            kv_bytes = 2 * B * dec_Hkv * L * D * 2
            sets = max(1, min(32, math.ceil(200e6 / kv_bytes))) if gpu else 1
            qs = [torch.randn(B, dec_H, 1, D, device=dev, dtype=dt) for _ in range(sets)]
            kvs = [tuple(torch.randn(B, dec_Hkv, L, D, device=dev, dtype=dt) for _ in range(2)) for _ in range(sets)]
            outs = [torch.empty_like(x) for x in qs]
            lses = [torch.empty(B, dec_H, 1, device=dev) for _ in range(sets)]
            row = dict(B=B, L=L, sets=sets, us={}, tbps={})

            def all_sets(fn):
                def call():
                    for i in range(sets):  # noqa: B023
                        fn(i)

                return call

            if gpu:
                sd = lambda i: Fn.scaled_dot_product_attention(qs[i], kvs[i][0], kvs[i][1], enable_gqa=True)  # noqa: B023
                row["us"]["sdpa"] = time_ms(all_sets(sd), gpu, graph=True) * 1e3 / sets
            shipped = F.get_config("decode", dev, D, False, L, dt)
            variants = {"shipped": shipped} | {n: c for n, c in dec_variants.items() if ok_dec.get(n)}
            for name, cfg in variants.items():
                if not budget.ok(3):
                    res["skipped"].append(f"decode {name} B={B} L={L}")
                    continue
                fn = lambda i, c=cfg: F._decode_launch(qs[i], kvs[i][0], kvs[i][1], outs[i], lses[i], False, D**-0.5, c)  # noqa: B023
                try:
                    fn(0)  # compile outside the graph capture
                    row["us"][name] = time_ms(all_sets(fn), gpu, graph=gpu) * 1e3 / sets
                except Exception as e:
                    res["skipped"].append(f"decode {name} B={B} L={L}: {repr(e)[:120]}")
            row["tbps"] = {n: kv_bytes / (us * 1e-6) / 1e12 for n, us in row["us"].items()}
            row["shipped_cfg"] = shipped
            res["decode"].append(row)
            print(f"[{time.time() - budget.t0:5.1f}s] decode B={B} L={L} done", flush=True)

    # ---------------- 4. winners, fragment, table ----------------
    anchors = {"fa2", "cudnn", "sdpa"}
    frag, pick_bwd, pick_dec = [], {}, {}
    for causal in (False, True):
        for N in bwd_sizes:
            row = next((r for r in res["bwd"] if r["N"] == N and r["causal"] == causal), None)
            cands = {n: ms for n, ms in (row or {}).get("ms", {}).items() if n not in anchors}
            if not cands:
                continue
            best = min(cands, key=cands.get)
            cfg = row["shipped_cfg"] if best == "shipped" else bwd_variants[best]
            pick_bwd[(N, causal)] = best
            for dts in ("bf16", "fp16"):
                match = dict(
                    kernel="bwd", head_dim=D, causal=causal, seqlen=BWD_BUCKETS.get(N, [0, 1 << 40]), dtype=dts
                )
                frag.append(dict(match=match, config=cfg))
    for L in dec_lens:
        rows = [r for r in res["decode"] if r["L"] == L]
        names = set.intersection(*[{n for n in r["us"] if n not in anchors} for r in rows]) if rows else set()
        if not names:
            continue
        # one table entry serves every batch: minimise the geometric mean of time over the batches
        score = {n: math.prod(r["us"][n] for r in rows) ** (1 / len(rows)) for n in names}
        best = min(score, key=score.get)
        cfg = rows[0]["shipped_cfg"] if best == "shipped" else dec_variants[best]
        pick_dec[L] = best
        for causal in (False, True):
            for dts in ("bf16", "fp16"):
                match = dict(
                    kernel="decode", head_dim=D, causal=causal, seqlen=DEC_BUCKETS.get(L, [0, 1 << 40]), dtype=dts
                )
                frag.append(dict(match=match, config=cfg))
    res["picks"] = dict(
        bwd={f"N{n}-{'causal' if c else 'full'}": v for (n, c), v in pick_bwd.items()},
        decode={f"L{k}": v for k, v in pick_dec.items()},
    )
    res["wall_s"] = time.time() - budget.t0
    (out_dir / "probe_bwd_decode.json").write_text(json.dumps(res, indent=1, default=str))
    (out_dir / "tuning_fragment.json").write_text(json.dumps({"sm90": frag}, indent=1))

    print("\n== correctness ==")
    for k_, v_ in res["correctness"].items():
        print(f"  {'ok ' if v_['ok'] else 'BAD'} {k_}: {v_.get('rel_err_dq_dk_dv', v_.get('rel_err'))}")
    print("\n== backward TFLOP/s (ratio vs FA2) ==")
    for row in res["bwd"]:
        fa2 = row["ms"].get("fa2")
        cells = [f"{n}={row['tflops'][n]:.0f}" + (f"({fa2 / row['ms'][n]:.2f}x)" if fa2 else "") for n in row["ms"]]
        print(f"  N={row['N']:>5} {'causal' if row['causal'] else 'full  '} " + " ".join(cells))
    print("\n== decode us / TB/s (ratio vs SDPA) ==")
    for row in res["decode"]:
        sd = row["us"].get("sdpa")
        cells = [
            f"{n}={row['us'][n]:.1f}us/{row['tbps'][n]:.2f}" + (f"({sd / row['us'][n]:.2f}x)" if sd else "")
            for n in row["us"]
        ]
        print(f"  B={row['B']} L={row['L']:>5} " + " ".join(cells))
    print("\n== recommended defaults (tuning_fragment.json) ==")
    print("  bwd:", res["picks"]["bwd"])
    print("  decode:", res["picks"]["decode"])
    if res["skipped"]:
        print(f"  skipped ({len(res['skipped'])}):", "; ".join(res["skipped"][:8]))
    print(f"  wall {res['wall_s']:.0f}s -> {out_dir}")


if __name__ == "__main__":
    main()
