"""Shared setup of the fused-rmsnorm module-path probes (probe_rmsnorm_warm.py, _lean.py, _basic.py)."""

from __future__ import annotations

import copy
import math

import torch

ROUNDS = 3  # interleaved timing rounds per probe row
L2_BYTES = 60 * 2**20  # H200 L2, rounded up: weight copies rotate past it
EPS = 1e-6


def row_scaled_x(M: int, D: int, dev, generator=None) -> torch.Tensor:
    """The probes' bf16 x: randn * 2 + 0.3, every 7th row x64 (rows far apart in scale, so a row-scale bug shows)."""
    x = (torch.randn(M, D, device=dev, generator=generator) * 2 + 0.3).bfloat16()
    x[::7] *= 64
    return x


def module_copies(M: int, D: int, N: int, dev, l2_bytes: int) -> tuple[torch.Tensor, list]:
    """(x, modules): bf16 x with rows far apart in scale (a row-scale bug shows) and enough
    FusedRMSNormLinear copies with distinct weights that rotating through them keeps W out of L2."""
    from fused_rmsnorm import FusedRMSNormLinear

    gen = torch.Generator(device=dev).manual_seed(M + D + N)
    x = row_scaled_x(M, D, dev, gen)
    mod = FusedRMSNormLinear(D, N, device=dev, dtype=torch.bfloat16)
    mod.norm_weight.uniform_(0.5, 1.5, generator=gen)
    mod.weight.normal_(0.0, D**-0.5, generator=gen)
    n = max(2, min(16, math.ceil(2 * l2_bytes / (N * D * 2))))
    mods = [mod] + [copy.deepcopy(mod) for _ in range(n - 1)]
    for m in mods:
        m.weight.add_(torch.randn_like(m.weight) * 1e-3)  # distinct weight sets
    return x, mods


def flagged_call(m, x, box: list, on, off):
    """A callable running m(x) with box[0] = on (a probe's switch, read where the op launches), then off again."""

    def run():
        box[0] = on
        try:
            return m(x)
        finally:
            box[0] = off

    return run


def time_rounds(fns: dict, rounds: int, run: bool = True) -> dict:
    """Median-per-round microseconds of each variant's rotated callables, variants interleaved within each
    round (CUDA-graph timing); every callable runs once first (first calls fold W' outside the graphs).
    run=False (a failed correctness check): empty lists."""
    import harness

    for fl in fns.values():
        for f in fl:
            f()
    t = {k: [] for k in fns}
    for _ in range(rounds if run else 0):
        for k, fl in fns.items():
            t[k].append(harness.time_ms(fl, small=True, rep_ms=40) * 1e3)
    return t


def checked_row(M: int, D: int, N: int, plan: dict, fns: dict, outs: dict, ref, rounds: int, same: dict) -> dict:
    """The row a probe writes for one shape: relative error of every output but F.linear's against ref, and
    timing rounds only when all are <= 1e-2 and every bit-identity flag in `same` holds; printed as well."""
    import json
    import statistics

    err = {k: ((o.float() - ref).norm() / ref.norm()).item() for k, o in outs.items() if k != "F.linear"}
    ok = all(e <= 1e-2 for e in err.values()) and all(same.values())
    t = time_rounds(fns, rounds, run=ok)
    row = {"M": M, "D": D, "N": N, "plan": plan, "rel_err": err, "bit_identical": same, "us": t}
    row["median"] = {k: round(statistics.median(v), 3) for k, v in t.items() if v}
    print(f"M{M} D{D} N{N} {plan}: ok {ok} {json.dumps(same)} " + json.dumps(row["median"]), flush=True)
    return row


def start(doc: str | None = None):
    """(out_dir, device, extension, results dict with the GPU / torch / Triton / CUDA versions) of a probe run;
    prints which fused_rmsnorm binary is loaded (a PYTHONPATH probe build must win)."""
    import argparse
    from pathlib import Path

    import triton
    from fused_rmsnorm import backend

    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("out_dir", type=Path)
    a = ap.parse_args()
    dev = torch.device("cuda")
    ext = backend.get_ext(dev)
    print(f"backend {ext.kind} {getattr(ext.module, '__file__', '')}", flush=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    res["cuda"] = torch.version.cuda
    return a.out_dir, dev, ext, res


def finish(out_dir, name: str, res: dict, tag=lambda r: f"cfg {r['plan'].get('config', '-')}") -> int:
    """Write res as OUTDIR/<name>.json and print one line per row (us, and the ratio to F.linear); 1 if a row's
    correctness check failed (it has no timings), else 0. tag(row): the text after the shape."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(res, indent=1))
    ok = True
    for r in res["rows"]:
        md, shape = r["median"], f"M{r['M']} D{r['D']} N{r['N']}"
        if not md:
            ok = False
            print(f"{shape} FAILED {r['rel_err']}")
            continue
        fl = md["F.linear"]
        cells = " ".join(f"{k} {v:.2f} ({v / fl:.3f})" for k, v in md.items() if k != "F.linear")
        print(f"{shape} {tag(r)}: F.linear {fl:.2f} | {cells}")
    return 0 if ok else 1
