#!/usr/bin/env python
"""Attention ablation: head layout {MHA, GQA, MQA} x implementation {naive, flash} x sequence length.

A small byte-level decoder LM (d_model=256, 4 layers, 8 query heads, pre-RMSNorm, RoPE, 4x GELU MLP)
is trained for the same number of steps, from the same init, on the same batches, with the same AdamW
schedule, for every variant. Reported per (layout, impl, length): validation perplexity, peak GPU
memory (``torch.cuda.max_memory_allocated``, reset before each run) and training tokens/s measured
after warm-up steps. Longer lengths run only a few timed steps (memory / throughput, no PPL) to show
where the materialised N x N attention matrix runs out of memory and flash does not.

Data: the Python standard library's own ``.py`` files (sorted paths, bytes concatenated; the last 10%
of bytes are the validation split). Nothing is downloaded.

    python experiments/attention_ablation.py               # GPU: full grid; CPU: the tiny config
    python experiments/attention_ablation.py --cpu-tiny    # tiny config (CI test of the script)
    python experiments/attention_ablation.py --out DIR     # write results (and README copy) to DIR
    python experiments/attention_ablation.py --render-only experiments/results/attention_ablation.json

Outputs: attention_ablation.{md,json,png} in ``--out`` (default experiments/results/) and the table
section of experiments/README.md (or DIR/README.md when --out is given) between the ablation markers.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "experiments" / "results"
DEFAULT_README = ROOT / "experiments" / "README.md"
STEM = "attention_ablation"
MARK_START, MARK_END = "<!-- ablation:start -->", "<!-- ablation:end -->"
VOCAB = 256  # byte-level tokens
KV_HEADS = {"mha": None, "gqa": 2, "mqa": 1}  # None: as many KV heads as query heads
IMPLS = ("naive", "flash")


@dataclasses.dataclass
class Config:
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    mlp_ratio: int = 4
    rope: bool = True
    layouts: tuple[str, ...] = ("mha", "gqa", "mqa")
    impls: tuple[str, ...] = IMPLS
    lengths: tuple[int, ...] = (512, 1024, 2048)  # trained for `steps`, PPL reported
    long_lengths: tuple[int, ...] = (4096, 8192, 16384, 32768)  # timed steps only
    steps: int = 100
    warmup: int = 10  # steps excluded from the tokens/s timing (also the LR warm-up)
    long_warmup: int = 2
    long_steps: int = 4  # timed steps at the long lengths
    tokens_per_step: int = 16384  # batch = tokens_per_step // seq_len (at least 1)
    val_batches: int = 8
    noise_seeds: int = 2  # extra seeds of (first layout, naive, first length): seed-to-seed PPL spread
    lr: float = 2e-3
    weight_decay: float = 0.1
    seed: int = 0
    dtype: str = "bf16"  # bf16: autocast with fp32 master weights; fp32: no autocast
    corpus_mib: float | None = None  # cap on corpus size (None: all of the stdlib's .py files)
    mode: str = "full"


def tiny_config() -> Config:
    # Sized for the Triton interpreter on a loaded 2-core CI box (each flash fwd+bwd call costs ~1 s there):
    # 4 query heads (GQA keeps 2 KV heads, MQA 1), head_dim 16 keeps tl.dot shapes legal, fp32 so naive and
    # flash losses can be compared tightly.
    return Config(
        d_model=64,
        n_layers=1,
        n_heads=4,
        lengths=(32,),
        long_lengths=(64,),
        steps=3,
        warmup=1,
        long_warmup=0,  # CPU timings mean nothing; one step exercises the timed-only path
        long_steps=1,
        tokens_per_step=64,
        val_batches=1,
        noise_seeds=0,
        dtype="fp32",
        corpus_mib=0.5,
        mode="cpu-tiny",
    )


# ----------------------------------------------------------------------------------------------- data


def load_corpus(max_mib: float | None) -> tuple[torch.Tensor, dict[str, Any]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        (p for p in stdlib.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.parts)),
        key=lambda p: p.relative_to(stdlib).as_posix(),
    )
    cap = None if max_mib is None else int(max_mib * 2**20)
    chunks, total, used = [], 0, 0
    for p in files:
        try:
            b = p.read_bytes()
        except OSError:
            continue
        if cap is not None and total + len(b) > cap:
            b = b[: cap - total]
        chunks.append(b)
        total += len(b)
        used += 1
        if cap is not None and total >= cap:
            break
    data = b"".join(chunks)
    if len(data) < 2**16:
        raise RuntimeError(f"stdlib corpus at {stdlib} is too small ({len(data)} bytes)")
    info = {
        "source": "Python standard library .py files (sorted relative paths, bytes concatenated)",
        "stdlib": str(stdlib),
        "python": platform.python_version(),
        "files": used,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest()[:16],
        "split": "last 10% of bytes = validation",
    }
    return torch.frombuffer(bytearray(data), dtype=torch.uint8), info


def train_batches(train: torch.Tensor, steps: int, batch: int, seq_len: int, seed: int) -> torch.Tensor:
    """(steps, batch, seq_len + 1) uint8 windows; depends only on (seed, seq_len), so every variant sees the same."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + seq_len)
    starts = torch.randint(0, train.numel() - seq_len - 1, (steps * batch,), generator=g)
    idx = starts[:, None] + torch.arange(seq_len + 1)
    return train[idx].view(steps, batch, seq_len + 1)


def val_batches(val: torch.Tensor, n_batches: int, batch: int, seq_len: int) -> torch.Tensor:
    """Fixed, evenly spaced validation windows: (n_batches, batch, seq_len + 1)."""
    n = n_batches * batch
    starts = torch.linspace(0, val.numel() - seq_len - 1, n).long()
    idx = starts[:, None] + torch.arange(seq_len + 1)
    return val[idx].view(n_batches, batch, seq_len + 1)


# ---------------------------------------------------------------------------------------------- model


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """softmax(QK^T)V with the full N x N matrix materialised, K/V repeated up to the query heads."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    n = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) * sm_scale
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu_(1)
    s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(v.dtype)
    return p @ v


class Attention(nn.Module):
    def __init__(self, d: int, n_heads: int, n_kv: int, impl: str, flash_fn):
        super().__init__()
        self.h, self.hkv, self.hd = n_heads, n_kv, d // n_heads
        self.impl, self.flash_fn = impl, flash_fn
        self.qkv = nn.Linear(d, (n_heads + 2 * n_kv) * self.hd, bias=False)
        self.proj = nn.Linear(n_heads * self.hd, d, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = self.qkv(x).view(b, n, self.h + 2 * self.hkv, self.hd).transpose(1, 2)
        q, k, v = qkv.split([self.h, self.hkv, self.hkv], dim=1)  # (B, H|Hkv, N, hd) strided views
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        scale = 1.0 / math.sqrt(self.hd)
        if self.impl == "flash":
            o = self.flash_fn(q, k, v, causal=True, sm_scale=scale)
        else:
            o = naive_attention(q, k, v, scale)
        return self.proj(o.transpose(1, 2).reshape(b, n, self.h * self.hd))


def rope_tables(n: int, hd: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32, device=device) / hd))
    f = torch.outer(torch.arange(n, dtype=torch.float32, device=device), inv)
    f = torch.cat([f, f], dim=-1)
    return f.cos(), f.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Tables cast to the activation dtype so q/k stay bf16 under autocast (flash gets one dtype).
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg: Config, n_kv: int, impl: str, flash_fn):
        super().__init__()
        d = cfg.d_model
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.attn = Attention(d, cfg.n_heads, n_kv, impl, flash_fn)
        self.fc = nn.Linear(d, cfg.mlp_ratio * d, bias=False)
        self.out = nn.Linear(cfg.mlp_ratio * d, d, bias=False)

    def forward(self, x, rope):
        x = x + self.attn(self.n1(x), rope)
        return x + self.out(F.gelu(self.fc(self.n2(x)), approximate="tanh"))


class ByteLM(nn.Module):
    def __init__(self, cfg: Config, n_kv: int, impl: str, flash_fn=None):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(VOCAB, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, n_kv, impl, flash_fn) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # Residual-output projections scaled down with depth (GPT-2 style init).
                std = 0.02 / math.sqrt(2 * cfg.n_layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        rope = rope_tables(idx.shape[1], self.cfg.d_model // self.cfg.n_heads, idx.device) if self.cfg.rope else None
        for blk in self.blocks:
            x = blk(x, rope)
        return F.linear(self.norm(x), self.emb.weight)  # tied output head


# ------------------------------------------------------------------------------------------- training


def lr_at(cfg: Config, step: int, total: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, total - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_variant(
    cfg: Config,
    layout: str,
    impl: str,
    seq_len: int,
    kind: str,
    data: dict[str, torch.Tensor],
    device: torch.device,
    flash_fn,
    seed: int,
) -> dict[str, Any]:
    """One training run; kind 'train' (full steps + validation PPL), 'long' (timed steps) or 'noise'."""
    n_kv = KV_HEADS[layout] or cfg.n_heads
    batch = max(1, cfg.tokens_per_step // seq_len)
    if kind == "long":
        warmup, steps = cfg.long_warmup, cfg.long_warmup + cfg.long_steps
    else:
        warmup, steps = min(cfg.warmup, cfg.steps - 1), cfg.steps
    rec: dict[str, Any] = dict(
        layout=layout, impl=impl, seq_len=seq_len, kind=kind, seed=seed, n_heads=cfg.n_heads, n_kv_heads=n_kv
    )
    rec.update(batch=batch, tokens_per_step=batch * seq_len, steps=steps, timed_steps=steps - warmup)
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if cfg.dtype == "bf16" else contextlib.nullcontext()
    state: dict[str, Any] = {}
    t_start = time.perf_counter()
    _free(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        torch.manual_seed(seed)  # same init for naive and flash of one layout
        model = state["model"] = ByteLM(cfg, n_kv, impl, flash_fn).to(device)
        opt = state["opt"] = torch.optim.AdamW(
            model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
        )
        batches = state["batches"] = train_batches(data["train"], steps, batch, seq_len, seed).to(device)
        losses = []
        t0 = None
        for step in range(steps):
            if step == warmup:
                _sync(device)
                t0 = time.perf_counter()
            for g in opt.param_groups:
                g["lr"] = lr_at(cfg, step, steps)
            xy = batches[step].long()
            with amp:
                logits = model(xy[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), xy[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.detach())
            del logits, loss
        _sync(device)
        elapsed = time.perf_counter() - t0
        rec["tokens_per_s"] = batch * seq_len * (steps - warmup) / elapsed
        rec["train_losses"] = [float(x) for x in torch.stack(losses).float().cpu()]
        if device.type == "cuda":
            rec["peak_mem_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        if kind != "long":
            vb = val_batches(data["val"], cfg.val_batches, batch, seq_len).to(device)
            model.eval()
            per_batch = []
            with torch.no_grad():
                for i in range(vb.shape[0]):
                    xy = vb[i].long()
                    with amp:
                        logits = model(xy[:, :-1])
                    per_batch.append(F.cross_entropy(logits.float().reshape(-1, VOCAB), xy[:, 1:].reshape(-1)))
            pb = torch.stack(per_batch).float().cpu()
            rec["val_loss"] = float(pb.mean())
            rec["val_loss_sem"] = float(pb.std() / math.sqrt(len(pb))) if len(pb) > 1 else 0.0
            rec["val_ppl"] = math.exp(rec["val_loss"])
        rec["status"] = "ok"
    except torch.cuda.OutOfMemoryError:
        rec["status"] = "OOM"
        if device.type == "cuda":
            rec["peak_mem_mib_at_oom"] = torch.cuda.max_memory_allocated(device) / 2**20
    # The exception (and its frames' tensors) is gone here, so the memory can be returned.
    state.clear()
    _free(device)
    rec["wall_s"] = time.perf_counter() - t_start
    return rec


# --------------------------------------------------------------------------------------------- driver


def load_flash():
    try:
        from flashattn_triton import flash_attn_forward
    except ImportError:
        # Plain checkout without PYTHONPATH: use the package's source tree.
        sys.path.insert(0, str(ROOT / "packages" / "flashattn-triton" / "src"))
        sys.modules.pop("flashattn_triton", None)
        from flashattn_triton import flash_attn_forward
    return flash_attn_forward


def env_info(device: torch.device) -> dict[str, Any]:
    # The benchmarks' environment record (GPU, versions, driver), plus what this script adds.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.harness import env_info as bench_env_info

    info: dict[str, Any] = bench_env_info()
    info.update(device=str(device), triton_interpret=os.environ.get("TRITON_INTERPRET", ""))
    try:
        import flashattn_triton

        info["flashattn_triton"] = getattr(flashattn_triton, "__version__", None)
        from flashattn_triton._common import select_backend

        info["flash_backend"] = str(select_backend(device).value)
    except Exception as e:  # recorded, not fatal: naive-only runs need no flash package
        info.setdefault("flashattn_triton", None)
        info["flash_backend"] = f"unavailable ({type(e).__name__})"
    return info


def plan(cfg: Config) -> list[tuple[str, str, int, str, int]]:
    runs = [(lay, imp, n, "train", cfg.seed) for n in cfg.lengths for lay in cfg.layouts for imp in cfg.impls]
    if cfg.lengths and cfg.layouts:
        base_impl = "naive" if "naive" in cfg.impls else cfg.impls[0]
        runs += [(cfg.layouts[0], base_impl, cfg.lengths[0], "noise", cfg.seed + i + 1) for i in range(cfg.noise_seeds)]
    runs += [(lay, imp, n, "long", cfg.seed) for n in cfg.long_lengths for lay in cfg.layouts for imp in cfg.impls]
    return runs


def estimate_s(cfg: Config, runs) -> float:
    """Rough H200 wall time, calibrated on one measured default grid (~100 s): eager launches bound this small
    model near 1M tokens/s, and naive adds N x N work per token (~63k tokens/s at N=16384)."""
    total = 10.0  # Triton compiles + cuBLAS warm-up
    for _, impl, n, kind, _ in runs:
        steps = cfg.long_warmup + cfg.long_steps if kind == "long" else cfg.steps + cfg.val_batches // 3
        tokens = steps * max(1, cfg.tokens_per_step // n) * n
        total += 1.0 + tokens * (1.0e-6 + (0.9e-9 * n if impl == "naive" else 0.0))
    return total


def parse_list(s: str, typ=str) -> tuple:
    return tuple(typ(x) for x in s.split(",") if x.strip()) if s else ()


def build_config(args) -> tuple[Config, torch.device]:
    cuda = torch.cuda.is_available() and not args.cpu_tiny
    device = torch.device("cuda" if cuda else "cpu")
    cfg = Config() if cuda else tiny_config()
    if args.steps is not None:
        cfg.steps = args.steps
        cfg.warmup = min(cfg.warmup, max(1, args.steps // 5))
    if args.lengths is not None:
        cfg.lengths = parse_list(args.lengths, int)
    if args.long_lengths is not None:
        cfg.long_lengths = parse_list(args.long_lengths, int)
    if args.layouts is not None:
        cfg.layouts = parse_list(args.layouts)
    if args.impls is not None:
        cfg.impls = parse_list(args.impls)
    for name in ("tokens_per_step", "val_batches", "noise_seeds", "seed", "long_steps", "corpus_mib"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    if args.no_rope:
        cfg.rope = False
    bad = [x for x in cfg.layouts if x not in KV_HEADS] + [x for x in cfg.impls if x not in IMPLS]
    if bad:
        raise SystemExit(f"unknown layout/impl {bad}: layouts {list(KV_HEADS)}, impls {list(IMPLS)}")
    if cfg.steps < 2:
        raise SystemExit("--steps must be at least 2 (one warm-up step + one timed step)")
    return cfg, device


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cpu-tiny", action="store_true", help="tiny CPU configuration (automatic without CUDA)")
    ap.add_argument("--steps", type=int, help="training steps at the PPL lengths (default 100)")
    ap.add_argument("--lengths", help="comma list of PPL lengths (default 512,1024,2048)")
    ap.add_argument(
        "--long-lengths", help="comma list of timed-only lengths (default 4096,8192,16384,32768; '' = none)"
    )
    ap.add_argument("--long-steps", type=int, help="timed steps at the long lengths (default 4)")
    ap.add_argument("--layouts", help="comma list from mha,gqa,mqa")
    ap.add_argument("--impls", help="comma list from naive,flash")
    ap.add_argument("--tokens-per-step", type=int, help="tokens per optimizer step (default 16384)")
    ap.add_argument("--val-batches", type=int, help="validation batches per run (default 8)")
    ap.add_argument("--noise-seeds", type=int, help="extra seeds for the noise reference run (default 2)")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--corpus-mib", type=float, help="cap on corpus bytes (default: whole stdlib)")
    ap.add_argument("--no-rope", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="output dir (default experiments/results)")
    ap.add_argument("--readme", type=Path, default=None, help="README to update (default: see module doc)")
    ap.add_argument("--render-only", type=Path, help="re-render md/png/README from an existing JSON; no runs")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and estimate, run nothing")
    args = ap.parse_args(argv)

    out = args.out or DEFAULT_OUT
    readme = args.readme or (DEFAULT_README if args.out is None else out / "README.md")
    if args.render_only:
        result = json.loads(args.render_only.read_text())
        render_all(result, out, readme)
        return result

    cfg, device = build_config(args)
    runs = plan(cfg)
    print(
        f"[ablation] mode={cfg.mode} device={device} dtype={cfg.dtype} runs={len(runs)} "
        f"(layouts={','.join(cfg.layouts)} impls={','.join(cfg.impls)} lengths={cfg.lengths} "
        f"long={cfg.long_lengths}) steps={cfg.steps} tokens/step={cfg.tokens_per_step}",
        flush=True,
    )
    if device.type == "cuda":
        print(f"[ablation] rough estimate on an H200: ~{estimate_s(cfg, runs):.0f} s", flush=True)
    if args.dry_run:
        return {"plan": runs}

    flash_fn = None
    if "flash" in cfg.impls:
        if device.type == "cpu" and "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
            # On CPU the flash op runs its Triton kernel only under the interpreter (the device rule).
            os.environ["TRITON_INTERPRET"] = "1"
        flash_fn = load_flash()
    raw, corpus = load_corpus(cfg.corpus_mib)
    split = int(raw.numel() * 0.9)
    data = {"train": raw[:split], "val": raw[split:]}
    corpus.update(train_bytes=split, val_bytes=raw.numel() - split)

    result: dict[str, Any] = {
        "env": env_info(device),
        "config": dataclasses.asdict(cfg),
        "corpus": corpus,
        "runs": [],
    }
    t_all = time.perf_counter()
    for i, (layout, impl, n, kind, seed) in enumerate(runs):
        rec = run_variant(cfg, layout, impl, n, kind, data, device, flash_fn, seed)
        result["runs"].append(rec)
        print(f"[{i + 1}/{len(runs)} {time.perf_counter() - t_all:6.1f}s] {fmt_run(rec)}", flush=True)
    result["total_wall_s"] = time.perf_counter() - t_all
    print(f"[ablation] total {result['total_wall_s']:.1f} s", flush=True)
    render_all(result, out, readme)
    return result


def fmt_run(r: dict[str, Any]) -> str:
    head = f"{r['kind']:5s} {r['layout']}/{r['impl']:5s} N={r['seq_len']:5d} B={r['batch']:3d} seed={r['seed']}"
    if r["status"] != "ok":
        return f"{head}: {r['status']}"
    ppl = f" ppl={r['val_ppl']:.3f}" if "val_ppl" in r else ""
    mem = f" mem={r['peak_mem_mib']:.0f}MiB" if "peak_mem_mib" in r else ""
    return f"{head}: loss={r['train_losses'][-1]:.4f}{ppl}{mem} tok/s={r['tokens_per_s']:.0f} ({r['wall_s']:.1f}s)"


# ------------------------------------------------------------------------------------------ rendering


def _cell(r: dict[str, Any] | None, key: str, fmt: str) -> str:
    if r is None:
        return "-"
    if r["status"] != "ok":
        return r["status"]
    v = r.get(key)
    return "n/a" if v is None else format(v, fmt)


def _main_runs(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in result["runs"] if r["kind"] in ("train", "long")]


def _index(result):
    return {(r["layout"], r["impl"], r["seq_len"]): r for r in _main_runs(result)}


def render_tables(result: dict[str, Any]) -> str:
    env, cfg, corpus = result["env"], result["config"], result["corpus"]
    runs = _main_runs(result)
    where = (
        env.get("gpu")
        or f"CPU smoke run ({cfg['mode']}, flash backend: {env.get('flash_backend')}); timings mean nothing"
    )
    lines = [
        f"Measured on {where} | torch {env.get('torch')} | triton {env.get('triton')} | {env.get('time_utc')}.",
        f"Model: d_model={cfg['d_model']}, {cfg['n_layers']} layers, {cfg['n_heads']} query heads, "
        f"{'RoPE' if cfg['rope'] else 'no RoPE'}, {cfg['dtype']}; AdamW lr {cfg['lr']}, "
        f"{cfg['tokens_per_step']} tokens/step. Corpus: {corpus['files']} stdlib .py files of Python "
        f"{corpus['python']}, {corpus['bytes'] / 2**20:.1f} MiB (sha256 {corpus['sha256']}), last 10% = validation.",
        f"PPL rows: {cfg['steps']} steps, tokens/s after {cfg['warmup']} warm-up steps, val PPL over "
        f"{cfg['val_batches']} fixed batches. Timed-only rows (no PPL): {cfg['long_warmup']} warm-up + "
        f"{cfg['long_steps']} timed steps.",
        "",
        "| layout | KV heads | impl | seq len | batch | val PPL | peak mem (MiB) | tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    order = {k: i for i, k in enumerate(KV_HEADS)}
    impl_order = {k: i for i, k in enumerate(IMPLS)}
    for r in sorted(
        runs, key=lambda r: (r["kind"] != "train", r["seq_len"], order[r["layout"]], impl_order[r["impl"]])
    ):
        ppl = (
            _cell(r, "val_ppl", ".3f")
            if r["kind"] == "train"
            else ("timed only" if r["status"] == "ok" else r["status"])
        )
        lines.append(
            f"| {r['layout'].upper()} | {r['n_kv_heads']} | {r['impl']} | {r['seq_len']} | {r['batch']} | {ppl} | "
            f"{_cell(r, 'peak_mem_mib', ',.0f')} | {_cell(r, 'tokens_per_s', ',.0f')} |"
        )
    idx = _index(result)
    pairs = sorted(
        {
            (r["layout"], r["seq_len"])
            for r in runs
            if (r["layout"], "naive", r["seq_len"]) in idx and (r["layout"], "flash", r["seq_len"]) in idx
        },
        key=lambda p: (p[1], order[p[0]]),
    )
    if pairs:
        lines += [
            "",
            "Flash vs naive, same layout and length (PPL delta > 0: flash worse):",
            "",
            "| layout | seq len | PPL naive | PPL flash | delta PPL | memory naive / flash | speed flash / naive |",
            "|---|---|---|---|---|---|---|",
        ]
        for lay, n in pairs:
            a, b = idx[(lay, "naive", n)], idx[(lay, "flash", n)]
            ok = a["status"] == "ok" and b["status"] == "ok"
            d_ppl = f"{b['val_ppl'] - a['val_ppl']:+.3f}" if ok and "val_ppl" in a and "val_ppl" in b else "-"
            mem = (
                f"{a['peak_mem_mib'] / b['peak_mem_mib']:.1f}x"
                if ok and "peak_mem_mib" in a and "peak_mem_mib" in b
                else "-"
            )
            spd = f"{b['tokens_per_s'] / a['tokens_per_s']:.2f}x" if ok else "-"
            if not ok:
                mem = f"naive {a['status']}, flash {b['status']}"
            ppl_a, ppl_b = (
                (_cell(a, "val_ppl", ".3f"), _cell(b, "val_ppl", ".3f")) if a["kind"] == "train" else ("-", "-")
            )
            lines.append(f"| {lay.upper()} | {n} | {ppl_a} | {ppl_b} | {d_ppl} | {mem} | {spd} |")
    noise = [r for r in result["runs"] if r["kind"] == "noise" and r["status"] == "ok"]
    if noise:
        first = noise[0]
        base = idx.get((first["layout"], first["impl"], first["seq_len"]))
        ppls = [r["val_ppl"] for r in ([base] if base and base["status"] == "ok" else []) + noise]
        mean = sum(ppls) / len(ppls)
        sd = math.sqrt(sum((p - mean) ** 2 for p in ppls) / max(1, len(ppls) - 1))
        lines += [
            "",
            f"Noise reference: {first['layout'].upper()}/{first['impl']} at N={first['seq_len']} "
            f"over {len(ppls)} seeds (init and data order change): "
            f"PPL {', '.join(f'{p:.3f}' for p in ppls)} (std {sd:.3f}). "
            "A flash-vs-naive delta well inside this spread is noise.",
        ]
    return "\n".join(lines) + "\n"


def render_plot(result: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[ablation] matplotlib not installed: no plot written", flush=True)
        return False
    runs = _main_runs(result)
    fig, (ax_m, ax_t) = plt.subplots(1, 2, figsize=(12, 4.6))
    colors = {"mha": "C0", "gqa": "C1", "mqa": "C2"}
    has_mem = any("peak_mem_mib" in r for r in runs)
    ooms = []
    for lay in KV_HEADS:
        for impl in IMPLS:
            rs = sorted((r for r in runs if r["layout"] == lay and r["impl"] == impl), key=lambda r: r["seq_len"])
            if not rs:
                continue
            ok = [r for r in rs if r["status"] == "ok"]
            style = dict(color=colors[lay], ls="-" if impl == "flash" else "--", marker="o" if impl == "flash" else "s")
            label = f"{lay.upper()} {impl}"
            if has_mem:
                ax_m.plot(
                    [r["seq_len"] for r in ok], [r.get("peak_mem_mib", float("nan")) for r in ok], label=label, **style
                )
            ax_t.plot([r["seq_len"] for r in ok], [r["tokens_per_s"] for r in ok], label=label, **style)
            ooms += [(r["seq_len"], colors[lay]) for r in rs if r["status"] != "ok"]
    for ax, title in ((ax_m, "peak memory (MiB, log)"), (ax_t, "training tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
    if has_mem:
        ax_m.set_yscale("log")
    else:
        ax_m.text(0.5, 0.5, "no CUDA memory statistics on CPU", ha="center", va="center", transform=ax_m.transAxes)
    for ax in (ax_m, ax_t):
        top = ax.get_ylim()[1]
        for n, c in ooms:
            ax.scatter([n], [top], marker="x", color=c, s=60, zorder=5, clip_on=False)
        if ooms:
            ax.annotate("x = OOM", xy=(0.02, 0.95), xycoords="axes fraction", fontsize=8)
    ax_t.legend(fontsize=7, ncol=2)
    env = result["env"]
    fig.suptitle(
        f"attention ablation: {env.get('gpu') or 'CPU smoke (timings meaningless)'} | torch {env.get('torch')} | "
        f"triton {env.get('triton')} | {result['config']['tokens_per_step']} tokens/step",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


README_TEMPLATE = f"""# Experiments

## Attention ablation: head layout x implementation x sequence length

`python experiments/attention_ablation.py` trains a small byte-level decoder LM (d_model=256, 4 layers,
8 query heads, pre-RMSNorm, RoPE, 4x MLP) on the Python standard library's own `.py` files and compares
two independent axes:

* **head layout**: MHA (8 KV heads), GQA (2 KV heads), MQA (1 KV head);
* **attention implementation**: *naive* (softmax(QK^T)V in PyTorch with the full N x N matrix
  materialised and K/V repeated to the query heads) vs *flash* (`flashattn_triton.flash_attn_forward`,
  our Triton kernel, forward and backward).

Every variant starts from the same seed, sees the same batches in the same order and uses the same AdamW
schedule; tokens per step are constant across lengths (batch = 16384 / N; batch 1 beyond N = 16384).
PPL is measured on the held-out last 10% of the corpus. Longer lengths only run a few timed steps to
measure memory and throughput.

**What grows with N for flash.** Flash attention removes only the N x N score / probability matrix. The
activations kept for the backward pass (q, k, v, the attention output, the per-row log-sum-exp, the MLP and
logits) are still O(N*d) per sequence, and the compute is still O(N^2 * d): flash saves memory and memory
traffic, not FLOPs. With tokens per step fixed, naive's N x N matrices cost O(tokens * heads * N) bytes and
grow with every doubling of N until they no longer fit; flash's activations stay roughly flat, and its
throughput falls only as fast as the O(N) attention work per token grows (at d_model=256 an eager step is
mostly kernel-launch overhead, so flash's tokens/s stays nearly flat over this range and is noisy).

**Same model, same PPL.** Flash and naive compute the same function; on the GPU they differ only in bf16
rounding, so the same head layout should reach the same validation PPL within noise (compare the
"delta PPL" column with the seed-to-seed spread below the table). That agreement is what shows the
flash backward pass trains. On CPU (fp32) the tiny test run matches naive to ~1e-6 (relative) in loss.

CPU mode: `--cpu-tiny` (automatic without CUDA) is a tiny configuration run under `TRITON_INTERPRET=1` by
`tests/test_attention_ablation.py`; it tests the script, its numbers are not results. Flags: `--steps`,
`--lengths`, `--long-lengths`, `--layouts`, `--impls`, `--tokens-per-step`, `--out DIR`,
`--render-only JSON` (regenerate the table, plot and this section from a results file).

![memory and throughput vs sequence length](results/{STEM}.png)

{MARK_START}
(not measured yet: run `python experiments/attention_ablation.py` on a CUDA GPU)
{MARK_END}
"""


def update_readme(path: Path, table: str) -> None:
    text = path.read_text() if path.exists() else README_TEMPLATE
    if MARK_START not in text or MARK_END not in text:
        text = text.rstrip("\n") + f"\n\n{MARK_START}\n{MARK_END}\n"
    head, rest = text.split(MARK_START, 1)
    _, tail = rest.split(MARK_END, 1)
    body = f"\n<!-- generated by experiments/attention_ablation.py from results/{STEM}.json; do not edit -->\n{table}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{head}{MARK_START}{body}{MARK_END}{tail}")


def render_all(result: dict[str, Any], out: Path, readme: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    table = render_tables(result)
    (out / f"{STEM}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{STEM}.md").write_text(f"# Attention ablation\n\n{table}")
    plotted = render_plot(result, out / f"{STEM}.png")
    update_readme(readme, table)
    written = [f"{STEM}.json", f"{STEM}.md"] + ([f"{STEM}.png"] if plotted else [])
    print(f"[ablation] wrote {', '.join(str(out / w) for w in written)} and {readme}", flush=True)


if __name__ == "__main__":
    main()
