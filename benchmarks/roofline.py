"""Roofline: measure this device's copy bandwidth and matmul rates once, then place every
benchmark record (achieved FLOP/s vs arithmetic intensity) against that roofline.

    python benchmarks/roofline.py [RESULTS_JSON] [--out DIR] [--ceilings ROOFLINE_JSON]

Writes <stem>-roofline.png/.svg beside the results and prints % of roofline per kernel and shape.
Without a GPU it runs as a smoke pass on tiny CPU sizes (numbers meaningless).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "benchmarks"

import torch  # noqa: E402

from . import harness  # noqa: E402


def measure_ceilings() -> dict[str, float]:
    """Copy bandwidth (bytes read + written per second) and dense matmul rates."""
    smoke = harness.smoke_mode()
    dev = "cpu" if smoke else "cuda"
    n_copy = (1 << 16) if smoke else (1 << 30)  # 1 GiB of bf16 each way on the GPU
    src = torch.randn(n_copy // 2, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t_copy = harness.time_ms(lambda: dst.copy_(src))
    copy_bps = 2 * src.numel() * src.element_size() / (t_copy * 1e-3)
    n = 64 if smoke else 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    t_mm = harness.time_ms(lambda: a @ b)
    ceilings = {"copy_bytes_per_s": copy_bps, "bf16_flops_per_s": 2 * n**3 / (t_mm * 1e-3)}
    if not smoke:
        ai = torch.randint(-127, 128, (n, n), device=dev, dtype=torch.int8)
        bi = torch.randint(-127, 128, (n, n), device=dev, dtype=torch.int8).t()
        t_i8 = harness.time_ms(lambda: torch._int_mm(ai, bi))
        ceilings["int8_ops_per_s"] = 2 * n**3 / (t_i8 * 1e-3)
    else:
        ceilings["int8_ops_per_s"] = ceilings["bf16_flops_per_s"]
    return ceilings


def roofline_rows(records: list[dict], ceilings: dict[str, float]) -> list[dict]:
    rows = []
    for r in records:
        if not r.get("flops") or not r.get("bytes") or not r.get("ms"):
            continue
        peak = ceilings["int8_ops_per_s"] if r["suite"] == "int8" else ceilings["bf16_flops_per_s"]
        ai = r["flops"] / r["bytes"]
        achieved = r["flops"] / (r["ms"] * 1e-3)
        roof = min(peak, ai * ceilings["copy_bytes_per_s"])
        rows.append(
            dict(
                suite=r["suite"],
                case=r["case"],
                impl=r["impl"],
                intensity=ai,
                achieved=achieved,
                roof=roof,
                pct=100 * achieved / roof,
                bound="memory" if ai * ceilings["copy_bytes_per_s"] < peak else "compute",
            )
        )
    return rows


def plot(rows: list[dict], ceilings: dict[str, float], stem: Path, env: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5.5))
    xs = np.logspace(-1, 4.5, 200)
    bw = ceilings["copy_bytes_per_s"]
    for key, label, style in (
        ("bf16_flops_per_s", "bf16 matmul", "-"),
        ("int8_ops_per_s", "int8 matmul", "--"),
    ):
        ax.plot(xs, np.minimum(ceilings[key], xs * bw) / 1e12, "k" + style, lw=1, label=f"roof: {label}")
    markers = {"attention": "o", "int8": "s", "rmsnorm": "^"}
    for impl in sorted({r["impl"] for r in rows}):
        sel = [r for r in rows if r["impl"] == impl]
        ax.scatter(
            [r["intensity"] for r in sel],
            [r["achieved"] / 1e12 for r in sel],
            s=14,
            marker=markers.get(sel[0]["suite"], "x"),
            label=impl,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP or int op per byte of HBM traffic)")
    ax.set_ylabel("achieved TFLOP/s (TOPS for int8)")
    ax.set_title(f"Roofline: {env.get('gpu') or 'CPU smoke'} (copy {bw / 1e12:.2f} TB/s measured)", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    out = [stem.with_name(stem.name + "-roofline.png"), stem.with_name(stem.name + "-roofline.svg")]
    for p in out:
        fig.savefig(p, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", type=Path, default=harness.RESULTS_DIR / f"{harness.gpu_slug()}.json")
    ap.add_argument("--out", type=Path, default=None, help="directory for the plot and the ceilings JSON")
    ap.add_argument(
        "--ceilings",
        type=Path,
        default=None,
        help="reuse the ceilings (and env) of a roofline JSON measured on the GPU (redraw after a CPU-side merge)",
    )
    args = ap.parse_args(argv)
    data = json.loads(args.results.read_text())
    if args.ceilings:
        prev = json.loads(args.ceilings.read_text())
        ceilings, ceil_env = prev["ceilings"], prev["env"]
    else:
        ceilings, ceil_env = measure_ceilings(), harness.env_info()
    rows = roofline_rows(data["records"], ceilings)
    out_dir = args.out or args.results.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / args.results.stem
    (stem.with_name(stem.name + "-roofline.json")).write_text(
        json.dumps({"env": ceil_env, "ceilings": ceilings, "rows": rows}, indent=1)
    )
    paths = plot(rows, ceilings, stem, data["env"])
    if harness.smoke_mode() and not args.ceilings:
        print("SMOKE PASS (no CUDA GPU): ceilings and percentages are meaningless.")
    print(
        f"ceilings: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 {ceilings['bf16_flops_per_s'] / 1e12:.0f}"
        f" TFLOP/s, int8 {ceilings['int8_ops_per_s'] / 1e12:.0f} TOPS"
    )
    print("| suite | case | impl | AI | achieved T/s | roof T/s | % of roof | bound |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['suite']} | {r['case']} | {r['impl']} | {r['intensity']:.1f} | {r['achieved'] / 1e12:.1f} |"
            f" {r['roof'] / 1e12:.1f} | {r['pct']:.0f}% | {r['bound']} |"
        )
    print("plots:", *paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
