"""H200 probe: Int8Linear decode (M <= 16) with the GEMM launched as a programmatic dependent
launch (PDL) of the activation quantizer, with and without the L2 weight prefetch.

    python scripts/probe_int8_pdl.py OUTDIR [--budget 60] [--dry-run]

The session-2 probe timed PDL only together with "PREFETCH": 1, which on its own cost ~1.4 us;
this one separates the two. Modes per shape (table config unless named): module (Int8Linear,
shipped path), two (quantize kernel + GEMM), pdl (same, GEMM as a PDL launch), pdl+pf (and the
weight-slab prefetch). CUDA-graph replay with rotated weight copies (probe_int8.bench); every
mode is checked against float64 first. Writes OUTDIR/probe_int8_pdl.json and, for shapes where
PDL beats the shipped path by > 2%, OUTDIR/fragment_sm90.json (the shipped config + "PDL": 1);
prints a table last. The M=1 GEMV row uses the table's GEMV config (PDL_WAIT in the GEMV kernel).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("probe_int8", REPO / "scripts" / "probe_int8.py")
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)  # handles --dry-run (TRITON_INTERPRET) and sys.path
torch, G = P.torch, P.G


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    budget = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 60.0
    gpu = torch.cuda.is_available() and not P.DRY
    dev = torch.device("cuda" if gpu else "cpu")
    shapes = [(16, n, k) for n, k in P.LLM_NK] + [(1, 4096, 14336)] if gpu else [(3, 40, 96)]
    t0 = time.time()
    res: dict = {}
    frag: list = []
    for shape in shapes:
        if time.time() - t0 > budget:
            res[str(shape)] = "skipped for budget"
            continue
        M, N, K = shape
        sh = P.Shape(M, N, K, dev, gpu)
        table = G._config_for(M, N, K, dev, True)
        tc = {k: v for k, v in table.items() if k not in ("PREFETCH", "PDL", "FUSED_QUANT")}
        modes = {
            "module": (None, "module"),
            "two": (tc, "two"),
            "pdl": (tc, "pdl"),
        }
        if not tc.get("GEMV"):  # the L2 weight prefetch exists in the tensor-core kernel only
            modes["pdl+pf"] = (dict(tc, PREFETCH=1), "pdl")
        row = {"table_cfg": table}
        if gpu:
            import torch.nn.functional as F

            xs = sh.x.to(torch.bfloat16)
            wb = [(w.to(torch.bfloat16) * 0.01).contiguous() for w in sh.w]
            row["bf16 F.linear"] = P.bench([lambda w=w, xs=xs: F.linear(xs, w) for w in wb], True, gpu) * 1e3
            del wb
        for name, (cfg, mode) in modes.items():
            try:
                ok, err = P.check(sh, cfg, mode, gpu)
                us = P.bench(sh.fns(cfg, mode), True, gpu) * 1e3 if ok else None
                row[name] = {"ok": ok, "rel_err": err, "us": us}
            except Exception as e:  # noqa: BLE001 - record and go on
                row[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
        res[str(shape)] = row
        print(shape, json.dumps(row), flush=True)
        us = {k: v.get("us") for k, v in row.items() if isinstance(v, dict) and v.get("us")}
        if gpu and "pdl" in us and "module" in us and us["pdl"] < 0.98 * min(us["module"], us.get("two", 1e9)):
            frag.append(
                {
                    "match": {"M": [1, 1] if M == 1 else [9, 16], "N": N, "K": K},
                    "config": dict(tc, PDL=1),
                    "_measured": f"pdl {us['pdl']:.2f} us vs module {us['module']:.2f} us",
                }
            )
    if frag:  # merge with scripts/apply_tuning.py (same match as the shipped entries: replaced in place)
        (out / "fragment_sm90.json").write_text(json.dumps(frag, indent=1))
    (out / "probe_int8_pdl.json").write_text(json.dumps({"env": P.__dict__.get("ENV", None), "results": res}, indent=1))
    print(f"{'shape':<22}" + "".join(f"{k:>14}" for k in ("bf16 F.linear", "module", "two", "pdl", "pdl+pf")))
    for s, row in res.items():
        if isinstance(row, str):
            print(f"{s:<22} {row}")
            continue
        cells = []
        for k in ("bf16 F.linear", "module", "two", "pdl", "pdl+pf"):
            v = row.get(k)
            v = v if isinstance(v, (float, type(None))) else v.get("us")
            cells.append(f"{v:14.2f}" if v else f"{'-':>14}")
        print(f"{s:<22}" + "".join(cells))


if __name__ == "__main__":
    main()
