"""Host cost of one flashattn-triton forward call on a GPU, next to its GPU time (H200 probe).

For each shape (bf16, B*N = 16k, H*D = 2048, as in the benchmark suite) it measures, in one process:
* host us/call: the mean wall time of 200 back-to-back calls with no synchronisation (the launch queue
  is deep enough that this is pure host time), for the public ``flash_attn_forward``, for the launch
  step alone (``_fwd_launch`` on preallocated outputs) and for SDPA;
* GPU ms: ``triton.testing.do_bench`` medians of the same calls (what the suite reports);
each with the SM90 kernel's direct launch (``_common/direct.py``) on and off, and for the portable
kernel. Writes ``host_overhead_flash.json`` into OUTDIR and prints a table.
"""

# ruff: noqa: B023  (the lambdas run inside their loop iteration)
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as TF

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages" / "flashattn-triton" / "src"))

import flashattn_triton as fa  # noqa: E402
from flashattn_triton.ops import _fwd_sm90 as S  # noqa: E402
from flashattn_triton.ops import flash_attn as F  # noqa: E402

SHAPES = [(128, 1024, False), (128, 1024, True), (128, 2048, True), (64, 1024, False), (64, 1024, True)]


def host_us(fn, n=200) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def gpu_ms(fn) -> float:
    import triton.testing as tt

    return float(tt.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    args = ap.parse_args()
    out_dir = Path(args.outdir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dt = torch.bfloat16
    rows = []
    for D, N, causal in SHAPES:
        B, H = 16384 // N, 2048 // D
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(3))
        scale = D**-0.5
        cfg = F.get_config("fwd", q.device, D, causal, N, dt)
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
        sm90 = dict(cfg, SM90=1) if not cfg.get("SM90") else cfg
        portable = {kk: vv for kk, vv in cfg.items() if not kk.startswith("SM90")}
        cases = {
            "api (shipped cfg)": lambda: fa.flash_attn_forward(q, k, v, causal=causal),
            "launch sm90": lambda: F._fwd_launch(q, k, v, o, lse, causal, scale, sm90),
            "launch portable": lambda: F._fwd_launch(q, k, v, o, lse, causal, scale, portable),
            "sdpa": lambda: TF.scaled_dot_product_attention(q, k, v, is_causal=causal),
        }
        with torch.inference_mode():
            for name, fn in cases.items():
                for on in (True, False) if name != "sdpa" else (True,):
                    S.direct.ENABLED = on
                    S._PLANS.clear()
                    try:
                        h, g = host_us(fn), gpu_ms(fn)
                    except Exception as e:  # noqa: BLE001  report, keep going
                        rows.append(dict(D=D, N=N, causal=causal, case=name, direct=on, error=repr(e)[:200]))
                        continue
                    rows.append(dict(D=D, N=N, causal=causal, case=name, direct=on, host_us=h, gpu_ms=g,
                                     sm90=bool(cfg.get("SM90"))))  # fmt: skip
        S.direct.ENABLED = True
    errs = [d.dl.error for d in S._PLANS.values() if d.dl.error]
    (out_dir / "host_overhead_flash.json").write_text(
        json.dumps(dict(rows=rows, direct_errors=errs, torch=torch.__version__), indent=1)
    )
    print(f"{'shape':>16} {'case':>18} {'direct':>6} {'host us':>8} {'ms':>8}")
    for r in rows:
        shp = f"D{r['D']} N{r['N']} {'c' if r['causal'] else 'f'}"
        if "error" in r:
            print(f"{shp:>16} {r['case']:>18} {r['direct']!s:>6} ERROR {r['error']}")
        else:
            print(f"{shp:>16} {r['case']:>18} {r['direct']!s:>6} {r['host_us']:8.1f} {r['gpu_ms']:8.4f}")
    if errs:
        print("direct errors:", errs)


if __name__ == "__main__":
    main()
