"""H200 probe: where the flash backward's autograd path spends time beyond the kernels.

    python scripts/probe_flash_bwd_path.py OUTDIR [--budget 60] [--dry-run]

The benchmark (autograd.grad on a kept forward graph) measured our backward 0.12 ms slower at
D128 N1k causal (0.81 vs 0.69 ms) than the sweep probe's direct launcher timing, while the SDPA
anchors agreed between the two. Per case this times, same process, do_bench median:
  launch   _backward_launch with the table config (what the sweep probe timed)
  impl     _backward_impl (the custom op's body: layout checks, allocation, config lookup)
  op       torch.ops.flashattn_triton.flash_attn_bwd (custom-op dispatch)
  autograd torch.autograd.grad through flash_attn_forward (what the benchmark times)
and, for the autograd path, the host time of one call (perf_counter, synchronized before and
after the call's Python returns but not after its GPU work) and the CUDA kernels a profiler sees
(names, counts, device time). Writes OUTDIR/probe_flash_bwd_path.json, prints a table last.
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
if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from flashattn_triton.ops import flash_attn as F  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from probe_flash_bwd_decode import time_ms  # noqa: E402

CASES = [(16, 16, 1024, 128, True), (1, 16, 16384, 128, False), (4, 16, 4096, 128, True)]
DRY_CASES = [(1, 2, 40, 32, True)]


def run_case(B, H, N, D, causal, gpu, dev, dt) -> dict:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=dt) for _ in range(4))
    scale = D**-0.5
    out, lse = F._forward_impl(q, k, v, causal, scale)
    cfg = F.get_config("bwd", dev, D, causal, N, dt, None) if gpu else {}
    row = dict(case=[B, H, N, D, causal], cfg=cfg, ms={})

    def launch():
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        F._backward_launch(do, q, k, v, out, lse, None, dq, dk, dv, causal, scale, cfg)

    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    o = F.flash_attn_forward(qq, kk, vv, causal=causal)
    fns = {
        "impl": lambda: F._backward_impl(do, q, k, v, out, lse, None, causal, scale),
        "op": lambda: torch.ops.flashattn_triton.flash_attn_bwd(do, q, k, v, out, lse, None, causal, scale),
        "autograd": lambda: torch.autograd.grad(o, (qq, kk, vv), do, retain_graph=True),
    }
    if gpu:
        fns = {"launch": launch, **fns}
    for name, fn in fns.items():
        try:
            row["ms"][name] = time_ms(fn, gpu, 60)
        except Exception as e:  # noqa: BLE001
            row["ms"][name] = None
            row.setdefault("errors", {})[name] = repr(e)[:200]
    # host time of one autograd call (GPU work not awaited)
    host = []
    for _ in range(20):
        if gpu:
            torch.cuda.synchronize()
        s = time.perf_counter()
        fns["autograd"]()
        host.append((time.perf_counter() - s) * 1e3)
    row["autograd_host_ms_median"] = sorted(host)[len(host) // 2]
    if gpu:
        try:
            row["kernels"], row["cpu_top"] = profile_autograd(fns["autograd"])
        except Exception as e:  # noqa: BLE001  (profiler API drift must not lose the timings)
            row["profile_error"] = repr(e)[:200]
    return row


def profile_autograd(fn) -> tuple[dict, list]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    kern = {}
    for e in prof.key_averages():
        if e.device_type is not None and str(e.device_type).endswith("CUDA") and e.count:
            kern[e.key[:90]] = dict(count=e.count, device_ms=round(e.device_time_total / 1e3, 4))
    cpu_top = sorted(
        ((e.key[:90], round(e.cpu_time_total / 1e3, 3), e.count) for e in prof.key_averages()),
        key=lambda t: -t[1],
    )[:12]
    return kern, cpu_top


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    gpu = torch.cuda.is_available() and not args.dry_run
    dev = torch.device("cuda" if gpu else "cpu")
    dt = torch.bfloat16 if gpu else torch.float16
    out_dir = Path(args.outdir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for B, H, N, D, causal in CASES if gpu else DRY_CASES:
        if time.time() - t0 > args.budget:
            rows.append(dict(case=[B, H, N, D, causal], error="budget"))
            continue
        rows.append(run_case(B, H, N, D, causal, gpu, dev, dt))
        if gpu:
            torch.cuda.empty_cache()
    res = dict(env=dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if gpu else None), rows=rows)
    (out_dir / "probe_flash_bwd_path.json").write_text(json.dumps(res, indent=1, default=str))
    for r in rows:
        print(f"\n{r['case']} cfg={r.get('cfg')}")
        for k2, v2 in (r.get("kernels") or {}).items():
            print(f"   kernel {v2['count']:3d}x {v2['device_ms']:8.3f} ms  {k2}")
        for k2, c, n in r.get("cpu_top") or []:
            print(f"   cpu {c:8.3f} ms {n:4d}x {k2}")
        print(f"   host/autograd call: {r.get('autograd_host_ms_median', 0):.3f} ms; errors: {r.get('errors')}")
        print("   " + "  ".join(f"{k2}={v2:.3f}ms" for k2, v2 in r.get("ms", {}).items() if v2))


if __name__ == "__main__":
    main()
