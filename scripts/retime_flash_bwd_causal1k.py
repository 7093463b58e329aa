"""Re-time the backward at D128 causal N1k (B16 H16, the suite's case) against FA2 and cuDNN.

    python scripts/retime_flash_bwd_causal1k.py OUT.json      # on the GPU, ~15 s

Five rounds round-robin (autograd.grad on a kept forward graph, do_bench medians, as the suite times it), a
per-kernel CUDA profile of 20 backward calls, then three rounds each right after 12 calls of the N16k full
backward (does a heavy case just before slow it down?).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages/flashattn-triton/src"))

import flashattn_triton as fa  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton.testing as tt  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402


def case(b, h, n, d, causal):
    """Backward-only closures for ours, FA2 and cuDNN (each forward graph built once and kept)."""
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)

    def grad_fn(fwd):
        out = fwd()
        return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    fns = [grad_fn(lambda: fa.flash_attn_forward(q, k, v, causal=causal))]
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        with sdpa_kernel(backend):  # the backward follows the forward's backend
            fns.append(grad_fn(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)))
    return fns


def med_us(fn):
    return tt.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def main() -> None:
    rows = []
    ours, fa2, cud = case(16, 16, 1024, 128, True)
    for rnd in range(5):
        t = [med_us(f) for f in (ours, fa2, cud)]
        rows.append(dict(kind="rr", round=rnd, ours_us=t[0], fa2_us=t[1], cudnn_us=t[2]))
        print(f"rr r{rnd}: ours {t[0]:7.1f} fa2 {t[1]:7.1f} cudnn {t[2]:7.1f}  x{t[1] / t[0]:.3f} vs fa2")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            ours()
        torch.cuda.synchronize()
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
        avg = e.device_time_total / max(e.count, 1)
        print(f"  kernel {e.key[:70]:70s} n={e.count} avg {avg:8.1f} us")
        rows.append(dict(kind="kernel", name=e.key, n=e.count, avg_us=avg))
    heavy = case(1, 16, 16384, 128, False)[0]
    for rnd in range(3):
        for _ in range(12):
            heavy()
        t, t2 = med_us(ours), med_us(fa2)
        rows.append(dict(kind="after_heavy", round=rnd, ours_us=t, fa2_us=t2))
        print(f"after heavy r{rnd}: ours {t:7.1f} fa2 {t2:7.1f} x{t2 / t:.3f}")
    Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
