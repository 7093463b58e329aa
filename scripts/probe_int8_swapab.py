"""H200 probe: int8 decode (M <= 16) as the swap-AB TMA + wgmma kernel (ops/gemm.py
_int8_gemm_swapab_kernel, "SWAP_AB": 1 configs) vs the shipped table path and bf16 F.linear.

    python scripts/probe_int8_swapab.py OUTDIR [--budget 60] [--workers 12] [--m 16,1,8]
                                               [--nk 4096x4096,...] [--only NAME,...] [--dry-run]

1. compile: every candidate (GEMM bf16 out, GEMM int32 out, PDL e2e) and the table paths run once
   in spawned worker processes (Triton's on-disk cache), so timing loads compiled kernels.
2. per shape, M = 16 first, then M = 1, then M = 8, x the LLM (N, K): anchors bf16 F.linear, the
   table GEMM alone ("table gemm", pre-quantized x) and Int8Linear.forward ("module", the shipped
   e2e path), then per candidate: int32 products exact (vs float64 matmul, exact below 2**53) and
   dequant within 2e-2 of float64 for every mode, else it is not timed; timed modes:
   pdl (quantize kernel + swap-AB GEMM as its programmatic dependent launch), two (same, no PDL),
   gemm (the swap-AB GEMM alone). CUDA-graph replay with the weight copies rotated
   (probe_int8.bench: no L2 reuse between calls).
3. writes OUTDIR/probe_int8_swapab.json (every number) and OUTDIR/tuning_fragment_sm90.json:
   for each measured (M, N, K) the fastest correct candidate e2e mode when it beats "module" by
   > 3% (M 16 -> {"M": [9, 16]}, M 8 -> [2, 8], M 1 -> [1, 1]; "PDL": 1 when the pdl mode won).
   Merge with: python scripts/apply_tuning.py packages/int8-gemm/src/int8_gemm/tuning.json FRAG
Budget-guarded: stops timing when the budget is spent and still writes everything; prints a table.
Without a GPU: --dry-run (CPU, TRITON_INTERPRET=1, tiny shapes; --dry-compile adds the worker pool).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import probe_int8 as P  # noqa: E402  (handles --dry-run: TRITON_INTERPRET, sys.path)

torch, G = P.torch, P.G
F = P.F

GAIN = 1.03  # a fragment entry needs > 3% over the shipped Int8Linear path
M_LIST = (16, 1, 8)  # --m
NK_LIST: list[tuple[int, int]] = []  # --nk (default: probe_int8.LLM_NK)
ONLY: list[str] = []  # --only (candidate names; default: all)


def sw(bn, bk, s, sk=0, w=4):
    return dict(SWAP_AB=1, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=1, SPLIT_K=sk, num_warps=w, num_stages=s)


# sm_90a offline (scripts/int8_swapab_sass.py, Triton 3.6): all IGMMA.64x16x32.S8.S8 + UTMALDG,
# no spills, 35-68 registers; shared memory 110 KB (128x128 s6) to 221 KB (128x512 s3).
# SPLIT_K 0 = ops/gemm.py _swapab_split_k: about one wave (N=4096: 128 programs; N=14336: split 1).
CANDS = {
    "S1 64x256 s6": sw(64, 256, 6),
    "S2 128x256 s4": sw(128, 256, 4),
    "S3 128x128 s6": sw(128, 128, 6),
    "S4 64x512 s4": sw(64, 512, 4),
    "S5 128x512 s3": sw(128, 512, 3),
    # 80 KB of shared memory: two programs per SM, so twice the auto split (two co-resident waves)
    "S6 64x256 s4 2xsk": dict(sw(64, 256, 4), _split_mult=2),
    # no split: 64 programs at N=4096 each stream 256 KB of the weight, and the split-K tail (int32
    # partials to L2, the arrival atomic, the partner's partials back) leaves the critical path
    "S7 64x512 s4 sk1": sw(64, 512, 4, sk=1),
    "S8 64x256 s8 sk1": sw(64, 256, 8, sk=1),
    "S9 64x128 s12 sk1": sw(64, 128, 12, sk=1),
    "S13 64x512 s5 sk1": sw(64, 512, 5, sk=1),
    "S14 128x512 s3 sk1": sw(128, 512, 3, sk=1),
    # 32 weight rows: below wgmma's m64, Triton lowers the dot to mma.sync (IMMA.16832) on the
    # TMA-loaded tiles; N=4096 then has 128 programs with no split and no partials
    "S10 32x512 s4 sk1": sw(32, 512, 4, sk=1),
    "S11 32x512 s6 sk1": sw(32, 512, 6, sk=1),
    "S12 32x256 s8 sk1": sw(32, 256, 8, sk=1),
}
DRY_CANDS = {
    "D1 64x32 s2": sw(64, 32, 2),
    "D2 64x32 s2 sk3": sw(64, 32, 2, sk=3),
    "D3 2xsk": dict(sw(64, 32, 2), _split_mult=2),
}
MODES = ("pdl", "two", "gemm")  # priority order within a candidate


def shapes_for(gpu: bool) -> list[tuple[int, int, int]]:
    if not gpu:
        return [(3, 200, 96), (1, 200, 96)]
    return [(m, n, k) for m in M_LIST for n, k in (NK_LIST or P.LLM_NK)]


def cands(gpu: bool) -> dict:
    c = CANDS if gpu else DRY_CANDS
    return {k: v for k, v in c.items() if k in ONLY} if ONLY and gpu else c


def resolved(cfg: dict, shape, dev) -> dict:
    """The config with SPLIT_K as the plan resolved it for this shape (what a tuning entry pins);
    the probe-only "_split_mult" multiplies the automatic split."""
    M, N, K = shape
    mult = cfg.get("_split_mult", 1)
    cfg = {k: v for k, v in cfg.items() if k != "_split_mult"}
    a = torch.empty((M, K), dtype=torch.int8, device=dev)
    w = torch.empty((N, K), dtype=torch.int8, device=dev)
    p = G._get_plan(a, w.t(), None, None, None, P.OUT_DTYPE, cfg, False, False)
    if p.kind != "swapab":
        return cfg
    return dict(cfg, SPLIT_K=max(1, min(16, p.split_k * mult, -(-K // cfg["BLOCK_K"]))))


def _int32(sh, cfg):
    return G._launch(sh.a, sh.w[0].t(), None, None, None, torch.int32, cfg)


# ----------------------------------------------------------------------------------------------
# compile phase: worker processes (spawned; they import this file as __mp_main__)
# ----------------------------------------------------------------------------------------------


def _worker(task):
    idx, (shape, cfg, kinds) = task
    t0 = time.time()
    try:
        gpu = torch.cuda.is_available() and not P.DRY
        sh = P.Shape(*shape, torch.device("cuda" if gpu else "cpu"), gpu=False)  # one weight copy
        for kind in kinds:
            if kind == "int32":
                _int32(sh, cfg)
            else:
                sh.fns(cfg, kind)[0]()
        if gpu:
            torch.cuda.synchronize()
        return idx, True, "", time.time() - t0
    except Exception as e:  # noqa: BLE001
        return idx, False, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", time.time() - t0


def compile_tasks(gpu: bool, dev) -> list:
    """Swap-AB binaries do not depend on M (do_not_specialize) but on SPLIT_K, i.e. on (N, K):
    one task per candidate and resolved config; the table paths once per shape."""
    tasks = []
    shapes = shapes_for(gpu)
    seen = set()
    for shape in shapes:
        for cfg0 in cands(gpu).values():
            cfg = resolved(cfg0, shape, dev)
            key = json.dumps(cfg)
            if key not in seen:
                seen.add(key)
                tasks.append((shape, cfg, ("gemm", "int32", "pdl", "two")))
    tasks += [(shape, None, ("module", "gemm")) for shape in shapes]
    return tasks


def compile_phase(tasks, deadline, workers) -> dict:
    return P.compile_phase(
        tasks, deadline, workers, worker=_worker, describe=lambda t: f"{t[0]} {name_of(t[1])} {t[2]}"
    )


def name_of(cfg) -> str:
    if cfg is None:
        return "table"
    skip = ("SPLIT_K", "PDL", "_split_mult")
    base = {k: v for k, v in cfg.items() if k not in skip}
    for k, v in list(CANDS.items()) + list(DRY_CANDS.items()):
        if {kk: vv for kk, vv in v.items() if kk not in skip} == base:
            return k
    return json.dumps(cfg)


# ----------------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------------


def exact_int32(sh, cfg, gpu) -> bool:
    c = _int32(sh, cfg)
    ref = sh.a.double() @ sh.w[0].double().t()  # exact: |sum| < 127 * 127 * K << 2**53
    if gpu:
        torch.cuda.synchronize()
    return bool(torch.equal(c.double(), ref))


def probe_shape(shape, dev, gpu, rep, deadline, recs) -> None:
    M, N, K = shape
    sh = P.Shape(M, N, K, dev, gpu)
    table_cfg = G._config_for(M, N, K, dev, True)
    rec_base = dict(shape=list(shape))
    an = {}
    # anchors: bf16 F.linear on rotated bf16 weight copies, the table GEMM alone, Int8Linear
    if gpu:
        wbs = [(w.to(torch.bfloat16) * 0.01).contiguous() for w in sh.w]
        an["bf16 F.linear"] = P.bench([lambda w=w: F.linear(sh.x, w) for w in wbs], True, gpu, rep) * 1e3
        del wbs
    else:
        an["bf16 F.linear"] = P.bench([lambda: F.linear(sh.x.float(), sh.w[0].float())], True, gpu, rep) * 1e3
    for name, mode in (("table gemm", "gemm"), ("module", "module")):
        ok, err = P.check(sh, None, mode, gpu)
        an[name] = P.bench(sh.fns(None, mode), True, gpu, rep) * 1e3 if ok else None
        recs.append(dict(rec_base, name=name, mode=mode, cfg=table_cfg, ok=ok, rel_err=err, us=an[name]))
    recs.append(dict(rec_base, name="bf16 F.linear", mode="anchor", ok=True, us=an["bf16 F.linear"]))
    for cname, cfg0 in cands(gpu).items():
        cfg = resolved(cfg0, shape, dev)
        if time.time() > deadline:
            recs.append(dict(rec_base, name=cname, cfg=cfg, mode="-", ok=None, error="budget"))
            continue
        try:
            exact = exact_int32(sh, cfg, gpu)
        except Exception as e:  # noqa: BLE001
            recs.append(
                dict(rec_base, name=cname, cfg=cfg, mode="int32", ok=False, error=f"{type(e).__name__}: {e}"[:300])
            )
            continue
        for mode in MODES:
            r = dict(rec_base, name=cname, cfg=cfg, mode=mode, int32_exact=exact)
            if time.time() > deadline:
                recs.append(dict(r, ok=None, error="budget"))
                continue
            try:
                ok, err = P.check(sh, cfg, mode, gpu)
                r.update(ok=bool(ok and exact), rel_err=err)
                if r["ok"]:
                    r["us"] = P.bench(sh.fns(cfg, mode), True, gpu, rep) * 1e3
                    if an.get("bf16 F.linear"):
                        r["vs_bf16"] = an["bf16 F.linear"] / r["us"]
                    ref = an["table gemm"] if mode == "gemm" else an["module"]
                    if ref:
                        r["vs_table"] = ref / r["us"]
            except Exception as e:  # noqa: BLE001
                r.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
                if gpu:
                    torch.cuda.synchronize()
            recs.append(r)
    for k, v in an.items():
        if v and an.get("bf16 F.linear") and k != "bf16 F.linear":
            recs.append(dict(rec_base, name=k, mode="anchor_ratio", vs_bf16=an["bf16 F.linear"] / v))


def fragment(recs) -> list[dict]:
    """Per measured (M, N, K): the fastest correct e2e (pdl / two) candidate, if > GAIN x module."""
    by_shape: dict[tuple, dict] = {}
    for r in recs:
        s = tuple(r["shape"])
        d = by_shape.setdefault(s, {"module": None, "best": None})
        if r.get("name") == "module" and r.get("us"):
            d["module"] = r["us"]
        elif r.get("mode") in ("pdl", "two") and r.get("ok") and r.get("us"):
            if d["best"] is None or r["us"] < d["best"]["us"]:
                d["best"] = r
    out = []
    for (M, N, K), d in sorted(by_shape.items()):
        b, mod = d["best"], d["module"]
        if b is None or mod is None or mod / b["us"] <= GAIN:
            continue
        cfg = dict(b["cfg"])
        if b["mode"] == "pdl":
            cfg["PDL"] = 1
        rng = [9, 16] if M > 8 else ([2, 8] if M > 1 else [1, 1])
        note = (
            f"M={M}: {b['us']:.2f}us vs module {mod:.2f}us ({b['name']} {b['mode']}, {b.get('vs_bf16', 0):.2f}x bf16)"
        )
        out.append({"match": {"M": rng, "N": N, "K": K}, "config": cfg, "_measured": note})
    return out


def print_table(recs) -> None:
    print("\n| M N K | impl | mode | us | vs bf16 | vs table | int32 exact | rel err |")
    print("|---|---|---|---:|---:|---:|---|---:|")
    for r in recs:
        if r.get("mode") == "anchor_ratio":
            continue
        sh = " ".join(map(str, r["shape"]))
        us = f"{r['us']:.2f}" if r.get("us") else ("FAIL" if r.get("ok") is False else "skip")
        vb = f"{r['vs_bf16']:.2f}x" if r.get("vs_bf16") else ""
        vt = f"{r['vs_table']:.3f}x" if r.get("vs_table") else ""
        re_ = f"{r['rel_err']:.1e}" if isinstance(r.get("rel_err"), float) else r.get("error", "")[:60]
        print(f"| {sh} | {r['name']} | {r['mode']} | {us} | {vb} | {vt} | {r.get('int32_exact', '')} | {re_} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=60.0, help="wall seconds for the whole probe, compiles included")
    ap.add_argument("--compile-share", type=float, default=0.4, help="fraction of the budget for the compile phase")
    ap.add_argument("--workers", type=int, default=min(12, max(1, (os.cpu_count() or 4) - 2)))
    ap.add_argument("--rep", type=int, default=6, help="CUDA-graph replay ms per measurement")
    ap.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes")
    ap.add_argument("--dry-compile", action="store_true", help="with --dry-run: also run the worker pool")
    ap.add_argument("--m", default="16,1,8", help="token counts to measure, in order")
    ap.add_argument("--nk", default="", help="(N, K) shapes as NxK,... (default: the LLM shapes)")
    ap.add_argument("--only", default="", help="candidate names, comma-separated (default: all)")
    args = ap.parse_args()
    global M_LIST, NK_LIST, ONLY
    M_LIST = tuple(int(m) for m in args.m.split(","))
    NK_LIST = [tuple(int(a) for a in t.split("x")) for t in args.nk.split(",")] if args.nk else []
    ONLY = [t.strip() for t in args.only.split(",")] if args.only else []
    t0 = time.time()
    gpu = torch.cuda.is_available() and not args.dry_run
    dev = torch.device("cuda" if gpu else "cpu")
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    arch = G._arch(dev) if gpu else "cpu"
    res = {"env": {"torch": torch.__version__, "triton": __import__("triton").__version__, "arch": arch,
                   "gpu": torch.cuda.get_device_name(0) if gpu else None}, "candidates": cands(gpu)}  # fmt: skip
    tasks = compile_tasks(gpu, dev)
    print(f"probe_int8_swapab: {len(tasks)} compile tasks, budget {args.budget:.0f}s, arch {arch}", flush=True)
    if gpu or args.dry_compile:
        st = compile_phase(tasks, t0 + args.budget * args.compile_share, args.workers)
        res["compile"] = [
            dict(
                shape=t[0],
                name=name_of(t[1]),
                cfg=t[1],
                kinds=t[2],
                ok=st.get(i, (None,))[0],
                s=round(st.get(i, (0, 0, 0))[2], 1),
            )
            for i, t in enumerate(tasks)
        ]
        print(
            f"[{time.time() - t0:5.1f}s] compile phase: {sum(1 for v in st.values() if v[0])}/{len(tasks)} ok",
            flush=True,
        )
    recs: list[dict] = []
    deadline = t0 + args.budget - 4
    for shape in shapes_for(gpu):
        if time.time() > deadline:
            recs.append(dict(shape=list(shape), name="-", mode="-", ok=None, error="budget: shape not measured"))
            continue
        try:
            probe_shape(shape, dev, gpu, args.rep, deadline, recs)
        except Exception as e:  # noqa: BLE001  (an anchor failed: record, go on)
            recs.append(dict(shape=list(shape), name="-", mode="-", ok=False, error=f"{type(e).__name__}: {e}"[:300]))
        if gpu:
            torch.cuda.empty_cache()
        print(f"[{time.time() - t0:5.1f}s] {shape} done", flush=True)
    frag = fragment(recs)
    res.update(records=recs, fragment=frag, wall_s=round(time.time() - t0, 1))
    (out / "probe_int8_swapab.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "tuning_fragment_sm90.json").write_text("[\n" + ",\n".join("  " + json.dumps(e) for e in frag) + "\n]\n")
    print_table(recs)
    print(f"\n== tuning fragment: {len(frag)} entries (> {GAIN:.2f}x the shipped Int8Linear e2e) ==")
    for e in frag:
        print(f"  {json.dumps(e['match'])}: {e['_measured']}")
    print(f"wrote {out / 'probe_int8_swapab.json'} and tuning_fragment_sm90.json in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
