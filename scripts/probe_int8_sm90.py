"""H200 probe: the SM90 (Gluon, warp-specialized, persistent) int8 GEMM vs the shipped path and cuBLAS.

    python scripts/probe_int8_sm90.py OUTDIR [--budget 240] [--configs NAME,NAME] [--check full|none]

(1) Correctness of every SM90 config (ops/_gemm_sm90.py) first, outputs poisoned (NaN / a sentinel int):
ragged (M, N, K), one partial row block, M = 64, 4096^3 (several tiles per CTA); int32 out exact vs
float64 on the GPU, fp32 out rel err < 1e-5, bf16 < 1e-2 (its rounding), with / without bias, and the
plan's second (direct) launch bit-identical to its first. A config that fails anywhere is never timed.
(2) Timing (triton.testing.do_bench median, warmup 25, rep 100, bf16 out with per-row / per-col scales) on
2048^3, 4096^3, 8192^3 and M in {1024, 4096} x (N, K) in {(4096, 4096), (14336, 4096), (4096, 14336)}:
the shipped path (int8_gemm_dequant_fwd with today's table), each SM90 config, torch._int_mm (raw int32)
and bf16 cuBLAS (torch.matmul), all in one process; each SM90 output is compared with the shipped one.
Writes OUTDIR/probe_int8_sm90.json (after every step: a hang or a kill keeps what was done) and
OUTDIR/tuning_fragment.json (tuning.json "sm90" entries, exact M/N/K, the old entry's config plus
"SM90": 1 and the winning SM90_* keys, where the best SM90 config beats the shipped path by > 1%; merge
with scripts/apply_tuning.py); prints a table last. A watchdog ends the process (results written) if one
step hangs, e.g. a barrier bug. Budget-guarded: what is left when it runs out is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "int8-gemm" / "src"))

import int8_gemm  # noqa: E402
from int8_gemm._common.tuning import _matches  # noqa: E402
from int8_gemm.ops import _gemm_sm90 as S  # noqa: E402
from int8_gemm.ops import gemm as G  # noqa: E402

# name -> SM90 keys (c = cooperative 128xBN tile, p = ping-pong: one 128xBN tile per warpgroup; the TMA-store
# epilogue (SM90_EPI_TMA, default on) wherever the output rows and shared memory allow it, r = register stores)
CONFIGS = {
    "c256s4g8": dict(SM90_BLOCK_N=256, SM90_STAGES=4, SM90_GROUP_M=8),
    "c256s3g8": dict(SM90_BLOCK_N=256, SM90_STAGES=3, SM90_GROUP_M=8),
    "c256s4g16": dict(SM90_BLOCK_N=256, SM90_STAGES=4, SM90_GROUP_M=16),
    "c256s3g16": dict(SM90_BLOCK_N=256, SM90_STAGES=3, SM90_GROUP_M=16),
    "c256k64s8g8": dict(SM90_BLOCK_N=256, SM90_BLOCK_K=64, SM90_STAGES=8, SM90_GROUP_M=8),
    "c128s5g8": dict(SM90_BLOCK_N=128, SM90_STAGES=5, SM90_GROUP_M=8),
    "c128s6g16": dict(SM90_BLOCK_N=128, SM90_STAGES=6, SM90_GROUP_M=16),
    "p128s4g8": dict(SM90_BLOCK_N=128, SM90_STAGES=4, SM90_GROUP_M=8, SM90_PINGPONG=1),
    "p128s6g8": dict(SM90_BLOCK_N=128, SM90_STAGES=6, SM90_GROUP_M=8, SM90_PINGPONG=1),
    "p128s5g16": dict(SM90_BLOCK_N=128, SM90_STAGES=5, SM90_GROUP_M=16, SM90_PINGPONG=1),
    # the same tiles with the epilogue stored straight from registers (SM90_EPI_TMA 0)
    "c256s4g8r": dict(SM90_BLOCK_N=256, SM90_STAGES=4, SM90_GROUP_M=8, SM90_EPI_TMA=0),
    "p128s4g8r": dict(SM90_BLOCK_N=128, SM90_STAGES=4, SM90_GROUP_M=8, SM90_PINGPONG=1, SM90_EPI_TMA=0),
}
CHECK_SHAPES = [(1000, 1500, 2064), (129, 257, 4096), (4096, 4096, 4096)]  # (M = 64: the GPU test)
TIME_SHAPES = [(4096, 4096, 4096), (2048, 2048, 2048), (8192, 8192, 8192)]
TIME_SHAPES += [(m, n, k) for m in (4096, 1024) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))]
TIME_SHAPES = list(dict.fromkeys(TIME_SHAPES))
MIN_GAIN = 1.01
STEP_LIMIT_S = 120.0  # one step (a check or a timing, compiles included) longer than this: a hang


def rel(got, want) -> float:
    g, w = got.double(), want.double()
    if not torch.isfinite(g).all():
        return float("inf")
    return ((g - w).norm() / w.norm().clamp_min(1e-30)).item()


class Watchdog:
    """Ends the process (after writing what was measured) when one step runs past STEP_LIMIT_S: a kernel
    that deadlocks on its mbarriers never returns, and neither would the probe."""

    def __init__(self, dump):
        self.dump, self.step, self.t = dump, None, time.time()
        threading.Thread(target=self._run, daemon=True).start()

    def start(self, step: str) -> None:
        self.step, self.t = step, time.time()

    def done(self) -> None:
        self.step = None

    def _run(self) -> None:
        while True:
            time.sleep(2)
            if self.step is not None and time.time() - self.t > STEP_LIMIT_S:
                print(f"WATCHDOG: '{self.step}' still running after {STEP_LIMIT_S:.0f}s: writing results, exiting")
                self.dump(hung=self.step)
                os._exit(3)


def sm90_cfg(M, N, K, keys: dict) -> dict:
    """The shipped table entry for this shape plus "SM90": 1 and the config's keys (what the fragment writes)."""
    return dict(G._table_config("sm90", M, N, K, True), SM90=1, **S.resolve(keys))  # every SM90_* key spelled out


def poison(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-123456789)


def check(name: str, keys: dict, dev) -> tuple[bool, list]:
    """Every output kind on every CHECK_SHAPE, outputs poisoned; also first launch == direct launch."""
    errs, good = [], True
    real_empty = torch.empty

    def empty(*a, **kw):  # _launch allocates the output with torch.empty: poison it
        return poison(real_empty(*a, **kw))

    for M, N, K in CHECK_SHAPES:
        torch.manual_seed(M + N + K)
        A = torch.randint(-127, 128, (M, K), dtype=torch.int8, device=dev)
        W = torch.randint(-127, 128, (N, K), dtype=torch.int8, device=dev)
        sa = torch.rand(M, device=dev) * 1e-3 + 1e-4
        sb = torch.rand(N, device=dev) * 1e-3 + 1e-4
        bias = torch.randn(N, device=dev, dtype=torch.bfloat16)
        exact = A.double() @ W.double().t()
        cfg = sm90_cfg(M, N, K, keys)
        assert G._get_plan(A, W.t(), sa, sb, None, torch.float32, cfg, False, False).kind == "sm90"
        for out_dtype, b, tol in ((torch.int32, None, 0.0), (torch.bfloat16, bias, 1e-2), (torch.float32, None, 1e-5)):
            s1, s2 = (None, None) if out_dtype == torch.int32 else (sa, sb)
            G.torch.empty = empty
            try:
                got = G._launch(A, W.t(), s1, s2, b, out_dtype, cfg)
                again = G._launch(A, W.t(), s1, s2, b, out_dtype, cfg)
            finally:
                G.torch.empty = real_empty
            torch.cuda.synchronize()
            if out_dtype == torch.int32:
                err = 0.0 if torch.equal(got.double(), exact) else float("inf")
            else:
                want = exact * sa.double()[:, None] * sb.double()[None, :]
                if b is not None:
                    want = want + b.double()[None, :]
                err = rel(got, want)
            same = torch.equal(got, again)
            ok = err <= tol and same
            good &= ok
            errs.append(dict(shape=(M, N, K), out=str(out_dtype)[6:], bias=b is not None, rel=err, direct_same=same,
                             ok=ok))  # fmt: skip
    bad = [p.dl.error for p in S._PLANS.values() if p.dl.state == -1]
    if bad:
        errs.append(dict(direct_launch_errors=bad))
        good = False
    return good, errs


def bench_ms(fn) -> float:
    import triton.testing as tt

    return float(tt.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def winners(timings: list) -> tuple[list, list]:
    """Per shape: the fastest correct SM90 config vs the shipped path; fragment entries where it wins by > 1%."""
    fragment, table = [], []
    for t in timings:
        M, N, K = t["shape"]
        cands = {k: v for k, v in t.get("sm90", {}).items() if "ms" in v and v.get("same_as_shipped", False)}
        if "shipped_ms" not in t or not cands:
            continue
        name = min(cands, key=lambda k: cands[k]["ms"])
        best = cands[name]
        ratio = t["shipped_ms"] / best["ms"]
        table.append(dict(shape=(M, N, K), shipped_tops=t["shipped_tops"], best=name, best_tops=best["tops"],
                          ratio=ratio, int_mm_tops=t.get("int_mm_tops"), bf16_tflops=t.get("bf16_tflops")))  # fmt: skip
        if ratio > MIN_GAIN:
            key = dict(M=M, N=N, K=K, b_kmajor=True)
            old_match = next((e["match"] for e in G._table().table["sm90"] if _matches(e["match"], key)), None)
            note = (f"{best['tops']:.0f} TOPS vs shipped {t['shipped_tops']:.0f} ({ratio:.3f}x; {name}; "
                    f"_int_mm {t.get('int_mm_tops', 0):.0f})")  # fmt: skip
            fragment.append({"match": {"M": M, "N": N, "K": K}, "config": sm90_cfg(M, N, K, CONFIGS[name]),
                             "_measured": note, "_old_match": old_match})  # fmt: skip
    return fragment, table


def time_shape(M, N, K, names, res, dog, dump, t0, deadline, dev) -> None:
    """Anchors (shipped path, _int_mm, bf16 cuBLAS) and every correct SM90 config at one shape (bf16 out)."""
    torch.manual_seed(1)
    A = torch.randint(-127, 128, (M, K), dtype=torch.int8, device=dev)
    W = torch.randint(-127, 128, (N, K), dtype=torch.int8, device=dev)
    sa = torch.rand(M, device=dev) * 1e-3 + 1e-4
    sb = torch.rand(N, device=dev) * 1e-3 + 1e-4
    ops = 2 * M * N * K
    rec = dict(shape=(M, N, K), shipped_cfg=G._config_for(M, N, K, dev, True), sm90={})
    res["timings"].append(rec)
    dog.start(f"anchors {M}x{N}x{K}")
    shipped = int8_gemm.int8_gemm_dequant_fwd(A, W.t(), sa, sb, out_dtype=torch.bfloat16)
    rec["shipped_ms"] = bench_ms(lambda: int8_gemm.int8_gemm_dequant_fwd(A, W.t(), sa, sb, out_dtype=torch.bfloat16))
    rec["shipped_tops"] = ops / rec["shipped_ms"] / 1e9
    rec["int_mm_ms"] = bench_ms(lambda: torch._int_mm(A, W.t()))
    rec["int_mm_tops"] = ops / rec["int_mm_ms"] / 1e9
    Ab, Wb = A.to(torch.bfloat16), W.to(torch.bfloat16)
    rec["bf16_ms"] = bench_ms(lambda: torch.matmul(Ab, Wb.t()))
    rec["bf16_tflops"] = ops / rec["bf16_ms"] / 1e9
    dog.done()
    print(f"[{time.time() - t0:6.1f}s] {M}x{N}x{K}: shipped {rec['shipped_tops']:.0f} TOPS, _int_mm "
          f"{rec['int_mm_tops']:.0f}, bf16 {rec['bf16_tflops']:.0f} TFLOPS", flush=True)  # fmt: skip
    for n in names:
        if time.time() > deadline:
            res["skipped"].append(f"{n} at {M}x{N}x{K}")
            continue
        cfg = sm90_cfg(M, N, K, CONFIGS[n])
        dog.start(f"time {n} {M}x{N}x{K}")
        try:
            out = G._launch(A, W.t(), sa, sb, None, torch.bfloat16, cfg)
            diff = (out.float() - shipped.float()).abs().max().item()
            scale = shipped.float().abs().max().item()
            ms = bench_ms(lambda cfg=cfg: G._launch(A, W.t(), sa, sb, None, torch.bfloat16, cfg))
            # the same exact int32 products and fp32 dequant: at most a bf16 rounding step apart
            rec["sm90"][n] = dict(ms=ms, tops=ops / ms / 1e9, max_diff_vs_shipped=diff,
                                  same_as_shipped=bool(diff <= 2**-7 * scale))  # fmt: skip
        except Exception as e:
            rec["sm90"][n] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
        dog.done()
        r = rec["sm90"][n]
        if "ms" in r:
            print(f"    {n:12s} {r['tops']:7.0f} TOPS  {rec['shipped_ms'] / r['ms']:.3f}x shipped"
                  f"{'' if r['same_as_shipped'] else '  OUTPUT DIFFERS'}", flush=True)  # fmt: skip
        else:
            print(f"    {n:12s} ERROR {r['error']}", flush=True)
        dump()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=240.0, help="wall seconds; no new timing starts past it")
    ap.add_argument("--configs", default="", help="comma-separated subset of CONFIGS (default: all)")
    ap.add_argument("--check", default="full", choices=("full", "none"), help="none: time without the check")
    args = ap.parse_args()
    t0 = time.time()
    out_dir = Path(args.outdir)
    out_dir.mkdir(parents=True, exist_ok=True)
    import triton

    dev = torch.device("cuda")
    p = torch.cuda.get_device_properties(0)
    names = [n for n in (args.configs.split(",") if args.configs else CONFIGS) if n]
    res = dict(
        env=dict(gpu=p.name, sms=p.multi_processor_count, torch=torch.__version__, cuda=torch.version.cuda,
                 triton=triton.__version__, has_gluon=S.HAS_GLUON, capability=list(torch.cuda.get_device_capability())),
        configs={n: CONFIGS[n] for n in names}, correctness={}, timings=[], skipped=[],
    )  # fmt: skip

    def dump(hung=None):
        if hung:
            res["hung"] = hung
        res["wall_s"] = time.time() - t0
        fragment, table = winners(res["timings"])
        res["summary"] = table
        (out_dir / "probe_int8_sm90.json").write_text(json.dumps(res, indent=1, default=str))
        (out_dir / "tuning_fragment.json").write_text("[\n" + ",\n".join("  " + json.dumps(e) for e in fragment)
                                                      + ("\n" if fragment else "") + "]\n")  # fmt: skip
        return table

    dog = Watchdog(dump)
    print(f"probe_int8_sm90: {p.name}, torch {torch.__version__}, triton {triton.__version__}, "
          f"gluon {S.HAS_GLUON}, budget {args.budget:.0f}s", flush=True)  # fmt: skip
    if not S.HAS_GLUON or torch.cuda.get_device_capability() != (9, 0):
        res["error"] = "needs Triton 3.6 (Gluon) on an SM90 GPU"
        dump()
        print(res["error"])
        return
    ok = {}
    for n in names:
        if args.check == "none":
            ok[n] = True
            continue
        dog.start(f"check {n}")
        try:
            good, errs = check(n, CONFIGS[n], dev)
        except Exception as e:  # a compile error, a bad config
            good, errs = False, [f"{type(e).__name__}: {str(e)[:400]}"]
        dog.done()
        ok[n] = good
        res["correctness"][n] = dict(ok=good, errs=errs)
        worst = max((e.get("rel", 0) for e in errs if isinstance(e, dict)), default=0)
        print(f"[{time.time() - t0:6.1f}s] check {n}: {'ok' if good else 'BAD'} (worst rel {worst:.2e})", flush=True)
        dump()

    for M, N, K in TIME_SHAPES:
        if time.time() - t0 > args.budget:
            res["skipped"].append(f"shape {M}x{N}x{K}")
            continue
        time_shape(M, N, K, [n for n in names if ok.get(n)], res, dog, dump, t0, t0 + args.budget, dev)
        torch.cuda.empty_cache()
    table = dump()
    print("\n| M N K | shipped TOPS | best SM90 TOPS | config | ratio | _int_mm TOPS | bf16 TFLOPS |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for t in table:
        print(f"| {' '.join(map(str, t['shape']))} | {t['shipped_tops']:.0f} | {t['best_tops']:.0f} | {t['best']} | "
              f"{t['ratio']:.3f} | {t['int_mm_tops']:.0f} | {t['bf16_tflops']:.0f} |")  # fmt: skip
    n_frag = len(json.loads((out_dir / "tuning_fragment.json").read_text()))
    print(f"\nwrote {out_dir / 'probe_int8_sm90.json'} and tuning_fragment.json ({n_frag} entries) "
          f"in {time.time() - t0:.0f}s")  # fmt: skip


if __name__ == "__main__":
    main()
