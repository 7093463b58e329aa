"""GPU probe: rstd from one-warp CTAs that fit beside the SM90 GEMM's CTAs (the "lean" launch).

    python scripts/probe_rmsnorm_lean.py OUTDIR     (needs a build whose rstd() takes ctas < 0 = the lean
        launch of -ctas one-warp CTAs and whose ops module has RSTD_LEAN; probe build of
        benchmarks/results/probes/h200-probe_rmsnorm_lean_bulk.patch)

A GEMM CTA (384 threads x 168 registers) leaves 1024 registers and ~20-26 KB of shared memory of an SM free. The
wide rstd kernel's CTAs need more, so on the module path the PDL-launched GEMM starts on an SM only when the rstd
CTA there retires. The lean kernel's CTAs are one 32-register warp each, streaming their rows through a 16 KB
cp.async.bulk ring: they fit beside the GEMM, which then starts everywhere at once and waits for rstd only in
its epilogue. Checks first: the lean rstd against the wide kernel's bits (several D, M, strides, both dtypes) and
the module's output with and without it; then interleaved timing rounds of the module path, lean off / on,
with F.linear on the same weights (CUDA graphs, weight sets rotated out of L2). Prints a table last.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "scripts"))
sys.path += [str(d) for d in sorted((REPO / "packages").glob("*/src"))]  # a PYTHONPATH probe build wins

from fused_rmsnorm.ops import rmsnorm_linear as op  # noqa: E402
from rmsnorm_probe_cases import checked_row, module_copies, start  # noqa: E402

SHAPES = [  # (M, D, N)
    (1024, 2048, 2048),
    (512, 4096, 4096),
    (128, 8192, 8192),
    (256, 4096, 4096),
    (2048, 2048, 2048),
    (1024, 4096, 4096),
    (1024, 4096, 14336),
    (64, 4096, 4096),
    (300, 5120, 5120),
]
BITS = [(M, D, ld) for D in (2048, 2056, 4096, 5120, 8192, 16392) for M, ld in ((1, 0), (3, 8), (300, 0), (1024, 0))]
ROUNDS = 3
L2_BYTES = 60 * 2**20
EPS = 1e-6
CODES = {torch.float16: 0, torch.bfloat16: 1}


def check_bits(mod_c, dev) -> list:
    rows = []
    for dt in (torch.bfloat16, torch.float16):
        for M, D, pad in BITS:
            x = (torch.randn(M, D + pad, device=dev) * 3).to(dt)[:, :D]
            x[::5] *= 50
            outs = []
            for ctas in (0, 132, -132, -7):
                r = torch.full((M,), float("nan"), device=dev)
                mod_c.rstd(CODES[dt], x.data_ptr(), x.stride(0), r.data_ptr(), M, D, EPS,
                           torch.cuda.current_stream().cuda_stream, ctas)  # fmt: skip
                outs.append(r)
            torch.cuda.synchronize()
            ref = torch.rsqrt(x.double().pow(2).mean(-1) + EPS)
            same = all(torch.equal(outs[0], o) for o in outs[1:])
            err = ((outs[2].double() - ref).abs() / ref).max().item()
            rows.append({"dtype": str(dt), "M": M, "D": D, "ld": x.stride(0), "bit_identical": same, "max_rel": err})
            if not same or not err < 1e-5:
                print(f"BITS FAIL {rows[-1]}", flush=True)
    return rows


def measure(M: int, D: int, N: int, dev) -> dict:
    x, mods = module_copies(M, D, N, dev, L2_BYTES)
    mod = mods[0]

    def module(m, lean):
        def run():
            op.RSTD_LEAN = lean
            try:
                return m(x)
            finally:
                op.RSTD_LEAN = False

        return run

    fns = {
        "F.linear": [lambda m=m: F.linear(x, m.weight) for m in mods],
        "module": [module(m, False) for m in mods],
        "module lean": [module(m, True) for m in mods],
    }
    outs = {k: v[0]().clone() for k, v in fns.items()}
    torch.cuda.synchronize()
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * mod.norm_weight.float()) @ (
        mods[0].weight.float().t()
    )
    same = {"module lean": bool(torch.equal(outs["module"], outs["module lean"]))}
    return checked_row(M, D, N, op.plan(op.arch_key(dev), M, N, D, has_gemm=True), fns, outs, ref, ROUNDS, same)


def main() -> int:
    out_dir, dev, ext, res = start(__doc__)
    with torch.no_grad():
        res["bits"] = check_bits(ext.module, dev)
        bits_ok = all(r["bit_identical"] and r["max_rel"] < 1e-5 for r in res["bits"])
        print(f"rstd bits: {len(res['bits'])} cases, all identical and accurate: {bits_ok}", flush=True)
        res["rows"] = [measure(M, D, N, dev) for M, D, N in SHAPES] if bits_ok else []
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probe_rmsnorm_lean.json").write_text(json.dumps(res, indent=1))
    print(f"{'M x D x N':>18} {'config':>6} {'F.linear':>9} {'module':>9} {'lean':>9}  ratio off / lean")
    for r in res["rows"]:
        md = r["median"]
        if len(md) < 3:
            print(f"{r['M']:>6}x{r['D']:>5}x{r['N']:>5} FAILED {r['rel_err']} identical {r['bit_identical']}")
            continue
        fl = md["F.linear"]
        print(
            f"{r['M']:>6}x{r['D']:>5}x{r['N']:>5} {r['plan'].get('config', '-'):>6} {fl:9.2f} {md['module']:9.2f} "
            f"{md['module lean']:9.2f}  {md['module'] / fl:.3f} / {md['module lean'] / fl:.3f}"
        )
    return 0 if bits_ok else 1


if __name__ == "__main__":
    sys.exit(main())
