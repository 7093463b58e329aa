"""Probe the flash-attention FORWARD variants on the local GPU (H200) against SDPA cuDNN / FLASH (FA2).

    python scripts/probe_flash_fwd.py OUTDIR                 # GPU run, ~150 s budget incl. compiles
    python scripts/probe_flash_fwd.py OUTDIR --budget 150
    python scripts/probe_flash_fwd.py OUTDIR --dry-run       # no GPU: interpreter, tiny shapes (logic check)
    python scripts/probe_flash_fwd.py OUTDIR --sass          # no GPU: compile every variant for sm90, print
                                                             # registers / spills / HGMMA / UTMALDG / setmaxnreg

Shapes: D in {64, 128} x causal x N in {1k, 4k, 16k}, B*N = 16k, H*D = 2048, bf16. Per (D, causal) each
variant is first checked against a float32 reference (GQA, strided (B, N, H, D) view, odd N; NaN or
rel err > 2e-2 fails and the variant is not timed), then every shape times the passing variants and
both SDPA anchors in this process (do_bench median). Writes OUTDIR/probe_flash_fwd.json (all numbers)
and OUTDIR/tuning_fwd_sm90.json: the winners as fwd entries of tuning.json (bf16 + fp16, the shipped
seqlen buckets) ready to replace the sm90 fwd entries there. Budget-guarded: no new compile after
80% of --budget, no new timing after 95%; results are written whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages/flashattn-triton/src"))
DRY = "--dry-run" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from flashattn_triton.ops import flash_attn as F  # noqa: E402

BUCKETS = {1024: [0, 2048], 4096: [2049, 8192], 16384: [8193, 1 << 40]}


def variants(D: int) -> dict[str, dict | None]:
    """Pruned set (<= 6 per shape). None = the shipped pointer-kernel config for the shape."""
    ws = dict(TMA=1, WS=1, num_warps=4, BLOCK_M=128)
    host = dict(TMA=1, num_warps=8, BLOCK_M=128)
    if D <= 64:
        return {
            "ptr-shipped": None,
            "tma-128x64-w8s3": dict(host, BLOCK_N=64, num_stages=3),
            "tma-128x128-w8s3": dict(host, BLOCK_N=128, num_stages=3),
            "ws-128x64-s3": dict(ws, BLOCK_N=64, num_stages=3),
            "ws-128x128-s2": dict(ws, BLOCK_N=128, num_stages=2),
            "ws-128x128-s3": dict(ws, BLOCK_N=128, num_stages=3),
        }
    return {
        "ptr-shipped": None,
        "tma-128x64-w8s3": dict(host, BLOCK_N=64, num_stages=3),
        "tma-128x128-w8s2": dict(host, BLOCK_N=128, num_stages=2),
        "ws-128x64-s2": dict(ws, BLOCK_N=64, num_stages=2),
        "ws-128x64-s3": dict(ws, BLOCK_N=64, num_stages=3),
        "ws-128x128-s2": dict(ws, BLOCK_N=128, num_stages=2),
    }


def cfg_for(name, cfg, D, causal, N, dtype, arch):
    if cfg is None:
        c = dict(F._table_config("fwd", arch, D, causal, N, dtype))
        c.pop("TMA", None), c.pop("WS", None)  # the pointer baseline even if the table already says TMA
        return c
    return dict(cfg)


# ---- offline SASS report ---------------------------------------------------------------------


def sass_report() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, str(ROOT / "scripts"))
    import re
    import subprocess
    import tempfile

    from int8_sass import cuobjdump, summarize

    def resources(cubin):
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(cubin)
        out = subprocess.run([cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        os.unlink(f.name)
        return {k: int(m.group(1)) for k in ("REG", "STACK", "LOCAL") if (m := re.search(rf"{k}:(\d+)", out))}

    print(f"triton {triton.__version__}, target sm_90a (offline compile, no launch)")
    for D in (64, 128):
        for causal in (False, True):
            for name, cfg in variants(D).items():
                c = cfg_for(name, cfg, D, causal, 4096, torch.bfloat16, "sm90")
                bd = F._block_d(D)
                if c.get("TMA"):
                    fn = F._attn_fwd_tma_kernel
                    host = not c.get("WS")
                    sig = {n: "i32" for n in fn.arg_names}
                    for n, rows in (("Q", c["BLOCK_M"]), ("K", c["BLOCK_N"]), ("V", c["BLOCK_N"]), ("O", c["BLOCK_M"])):
                        sig[n] = f"tensordesc<bf16[1, 1, {rows}, {bd}]>" if host else "*bf16"
                    consts = dict(HOST_DESC=host, WARP_SPEC=bool(c.get("WS")))
                else:
                    fn = F._attn_fwd_kernel
                    sig = {n: "i32" for n in fn.arg_names} | {n: "*bf16" for n in "QKVO"}
                    sig |= {"cu_q": "*i32", "cu_k": "*i32"}
                    consts = dict(VARLEN=False, DOT_PREC="tf32")
                sig |= {"LSE": "*fp32", "qk_scale": "fp32"}
                consts |= dict(HEAD_DIM=D, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_D=bd, CAUSAL=causal)
                sig |= {k: "constexpr" for k in consts}
                div = [n for n in fn.arg_names if n.startswith("s") or n in "QKVO" or n == "LSE"]
                div = [n for n in div if sig[n] != "fp32" and not sig[n].startswith("tensordesc")]
                attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div}
                label = f"D{D} c{int(causal)} {name:18s}"
                try:
                    k = triton.compile(
                        ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                        target=GPUTarget("cuda", 90, 32),
                        options=dict(num_warps=c["num_warps"], num_stages=c["num_stages"]),
                    )
                except Exception as e:  # report and go on
                    print(f"{label} COMPILE FAILED: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    continue
                hits, total, _ = summarize(k.asm["cubin"])
                res = resources(k.asm["cubin"])
                nreg = sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", k.asm["ptx"])))
                ws_parts = "ttg.warp_specialize" in k.asm["ttgir"]
                print(
                    f"{label} regs={res.get('REG')} stack={res.get('STACK')} local={res.get('LOCAL')} "
                    f"smem={k.metadata.shared} {json.dumps(hits)} sass={total} ws={ws_parts} "
                    f"setmaxnreg={','.join(a + b for a, b in nreg) or '-'}",
                    flush=True,
                )


# ---- GPU probe -------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget", type=float, default=150.0, help="wall seconds, compiles included")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: tiny shapes under the interpreter")
    ap.add_argument("--sass", action="store_true", help="no GPU: offline sm90 compile report")
    args = ap.parse_args()
    if args.sass:
        sass_report()
        return
    t0 = time.time()
    gpu = torch.cuda.is_available() and not args.dry_run
    dev = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float16  # bf16 tl.dot is wrong in the interpreter
    arch = F.arch_key(dev) if gpu else "sm90"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = (1024, 4096, 16384) if gpu else (64,)
    tokens, hd = (16384, 2048) if gpu else (128, 128)
    env = dict(torch=torch.__version__, triton=__import__("triton").__version__, arch=arch, dry_run=not gpu)
    if gpu:
        env["gpu"] = torch.cuda.get_device_name(0)
    results: dict = dict(env=env, budget_s=args.budget, checks=[], rows=[], winners=[], notes=[])

    def left() -> float:
        return args.budget - (time.time() - t0)

    def bench(fn) -> float:
        if gpu:
            from triton.testing import do_bench

            return do_bench(fn, warmup=10, rep=30, return_mode="median")
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    def sdpa(backend_name):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        be = getattr(SDPBackend, backend_name)

        def run(q, k, v, causal):
            if not gpu:  # dry run: plain math SDPA, just to exercise the plumbing
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            with sdpa_kernel([be]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run

    anchors = {"sdpa-cudnn": sdpa("CUDNN_ATTENTION"), "sdpa-flash": sdpa("FLASH_ATTENTION")}

    def check(cfg, D, causal) -> tuple[bool, str]:
        """GQA, (B, N, H, D) strided q, odd N, Nk != Nq, vs float32 math."""
        torch.manual_seed(D + causal)
        nq, nk = (1000, 1031) if gpu else (45, 53)
        q = torch.randn(1, nq, 4, D, device=dev).to(dtype).transpose(1, 2)
        k = torch.randn(1, 2, nk, D, device=dev).to(dtype)
        v = torch.randn(1, nk, 2, D, device=dev).to(dtype).transpose(1, 2)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((1, 4, nq), float("nan"), device=dev)
        scale = D**-0.5
        F._fwd_launch(q, k, v, out, lse, causal, scale, cfg)
        want, want_lse = F._torch_forward(q.float(), k.float(), v.float(), causal, scale)
        if torch.isnan(out).any() or torch.isnan(lse).any():
            return False, "NaN in output"
        rel = ((out.float() - want).norm() / want.norm()).item()
        lse_err = (lse - want_lse).abs().max().item()
        ok = rel < (2e-2 if dtype == torch.bfloat16 else 5e-3) and lse_err < 1e-2
        return ok, f"rel={rel:.2e} lse_err={lse_err:.2e}"

    try:
        for D in (64, 128):
            for causal in (False, True):
                vs = variants(D)
                passing = {}
                for name, cfg in vs.items():
                    c = cfg_for(name, cfg, D, causal, sizes[0], dtype, arch)
                    if c.get("TMA") and left() < 0.2 * args.budget:
                        results["checks"].append(dict(D=D, causal=causal, variant=name, status="skipped: budget"))
                        continue
                    t = time.time()
                    try:
                        ok, msg = check(c, D, causal)
                    except Exception as e:
                        ok, msg = False, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                    results["checks"].append(
                        dict(D=D, causal=causal, variant=name, ok=ok, msg=msg, seconds=round(time.time() - t, 1))
                    )
                    print(f"check D{D} c{int(causal)} {name:18s} {'ok  ' if ok else 'FAIL'} {msg} "
                          f"({time.time() - t:.1f}s)", flush=True)  # fmt: skip
                    if ok:
                        passing[name] = cfg
                for N in sizes:
                    B, H = max(1, tokens // N), max(1, hd // D)
                    q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=dtype) for _ in range(3))
                    out = torch.empty_like(q)
                    lse = torch.empty(B, H, N, device=dev, dtype=torch.float32)
                    scale = D**-0.5
                    flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
                    shape = dict(D=D, causal=causal, N=N, B=B, H=H)
                    timed = {}
                    for name, fn in anchors.items():
                        try:
                            timed[name] = (bench(lambda fn=fn, a=(q, k, v, causal): fn(*a)), None)
                        except Exception as e:
                            results["notes"].append(f"{name} D{D} c{causal} N{N}: {type(e).__name__}: {e}"[:300])
                    for name, cfg in passing.items():
                        if left() < 0.05 * args.budget:
                            results["notes"].append(f"budget: D{D} c{causal} N{N} {name} not timed")
                            continue
                        c = cfg_for(name, cfg, D, causal, N, dtype, arch)
                        try:
                            run = lambda c=c, a=(q, k, v, out, lse, causal, scale): F._fwd_launch(*a, c)  # noqa: E731
                            timed[name] = (bench(run), c)
                        except Exception as e:
                            results["notes"].append(f"{name} D{D} c{causal} N{N}: {type(e).__name__}: {e}"[:300])
                    cud = timed.get("sdpa-cudnn", (None,))[0]
                    fa2 = timed.get("sdpa-flash", (None,))[0]
                    for name, (ms, c) in timed.items():
                        results["rows"].append(
                            dict(shape, variant=name, config=c, ms=ms, tflops=flops / (ms * 1e-3) / 1e12,
                                 vs_cudnn=(cud / ms) if cud else None, vs_fa2=(fa2 / ms) if fa2 else None)
                        )  # fmt: skip
                    ours = {n: t for n, t in timed.items() if not n.startswith("sdpa")}
                    if ours:
                        best = min(ours, key=lambda n: ours[n][0])
                        results["winners"].append(dict(shape, variant=best, config=ours[best][1], ms=ours[best][0]))
                    print(f"  D{D} c{int(causal)} N{N}: {len(timed)} timed, {left():.0f}s left", flush=True)
    except Exception:
        results["notes"].append("aborted: " + traceback.format_exc()[-1500:])
        traceback.print_exc()
    finally:
        results["wall_s"] = round(time.time() - t0, 1)
        (out_dir / "probe_flash_fwd.json").write_text(json.dumps(results, indent=1) + "\n")
        frag = []
        for w in results["winners"]:
            for dt in ("bf16", "fp16"):
                frag.append({
                    "match": {"kernel": "fwd", "head_dim": w["D"], "causal": w["causal"],
                              "seqlen": BUCKETS.get(w["N"], [0, 1 << 40]), "dtype": dt},
                    "config": w["config"],
                })  # fmt: skip
        (out_dir / "tuning_fwd_sm90.json").write_text(json.dumps({"sm90": frag}, indent=1) + "\n")
        print_table(results)
        print(f"wrote {out_dir}/probe_flash_fwd.json and tuning_fwd_sm90.json in {results['wall_s']}s")


def print_table(results) -> None:
    rows = results["rows"]
    by_shape: dict = {}
    for r in rows:
        by_shape.setdefault((r["D"], r["causal"], r["N"]), {})[r["variant"]] = r
    names = sorted({r["variant"] for r in rows}, key=lambda n: (n.startswith("sdpa"), n))
    print("\nTFLOP/s (x = ratio vs sdpa-cudnn); best = fastest of ours")
    print(f"{'shape':14s} " + " ".join(f"{n[-12:]:>12s}" for n in names) + "  best (vs cuDNN / vs FA2)")
    for (D, c, N), d in sorted(by_shape.items()):
        cells = []
        for n in names:
            r = d.get(n)
            cells.append(f"{r['tflops']:5.0f} {r['vs_cudnn'] or 0:4.2f}x".rjust(12) if r else "-".rjust(12))
        ours = {n: r for n, r in d.items() if not n.startswith("sdpa")}
        best = min(ours.values(), key=lambda r: r["ms"]) if ours else None
        tail = f"  {best['variant']} ({best['vs_cudnn'] or 0:.2f}x / {best['vs_fa2'] or 0:.2f}x)" if best else ""
        print(f"D{D:<3d} c{int(c)} N{N:<6d} " + " ".join(cells) + tail)
    for n in results["notes"]:
        print("note:", n)


if __name__ == "__main__":
    main()
