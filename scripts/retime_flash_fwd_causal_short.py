"""Re-time the short causal forward cases (D128 N1k / 2k, D64 N1k; the suite's B and H) against cuDNN.

    python scripts/retime_flash_fwd_causal_short.py OUT.json      # on the GPU, ~10 s

Five rounds, round-robin, do_bench medians in one process, so a one-off slow suite measurement can be told
from a real regression.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages/flashattn-triton/src"))

import flashattn_triton as fa  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton.testing as tt  # noqa: E402


def med_us(fn):
    return tt.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def main() -> None:
    cases = [(128, 1024), (128, 2048), (64, 1024)]
    data = {}
    for d, n in cases:
        b, h = 16384 // n, 2048 // d
        data[(d, n)] = [torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    rows = []
    for rnd in range(5):
        for d, n in cases:
            q, k, v = data[(d, n)]
            ours = med_us(lambda q=q, k=k, v=v: fa.flash_attn_forward(q, k, v, causal=True))
            cud = med_us(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            rows.append(dict(round=rnd, D=d, N=n, ours_us=ours, cudnn_us=cud, ratio=cud / ours))
            print(f"r{rnd} D{d} N{n} causal ours {ours:7.1f} us cudnn {cud:7.1f} us x{cud / ours:.3f}")
    Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
