"""y = Linear(RMSNorm(x)) = ((x * rstd) * g) @ W^T (+ bias), rstd = 1 / sqrt(mean(x^2) + eps).

CUDA tensors (fp16 / bf16) go to the CUDA extension (see ``backend.py`` for AOT -> JIT -> torch):
* small M, sm_80+ (``path == "decode_mma"`` in tuning.json): one tensor-core kernel streams W once
  (W rows as the MMA's M, tokens as its N), computes rstd itself and scales the output columns;
  g comes from the modules' folded W' or, for a functional call, is applied in-kernel;
* small M, older GPUs (``path == "decode"``): the CUDA-core GEMV kernel, same fusion;
* larger M: g is folded into the weight (W' = W * g; per call here, cached by the modules), a tiny
  kernel computes rstd[M] in fp32 and a CUTLASS tensor-core GEMM applies it as a per-row scale in
  its epilogue (SM90: TMA warp-specialized, launched with programmatic dependent launch after the
  rstd kernel; SM80/86/89: mma.sync). Other archs: rstd kernel + torch matmul + row scale.
CPU tensors (and fp32) use the PyTorch reference path (``select_backend(..., has_interpreter=False)``).

Strides: x may have any leading dims and strides; it is viewed/copied to (M, D) with unit inner
stride and 16-byte aligned rows (a copy only when needed). Weights likewise.
"""

from __future__ import annotations

import functools
import math
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import backend as _backend
from .._common import Backend, TuningTable, arch_key, check_same_device, check_tensor, num_sms, select_backend
from .._common.shapes import cdiv

_DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1}
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TUNING_PATH = Path(__file__).resolve().parent.parent / "tuning.json"
_TUNING = TuningTable.from_json(_TUNING_PATH)


# ------------------------------------------------------------------------------------------ checks


def check_inputs(x, w_norm, w_lin, bias, eps) -> torch.device:
    check_tensor("x", x, dtypes=_DTYPES, min_rank=1)
    check_tensor("w_norm", w_norm, dtypes=_DTYPES, rank=1)
    check_tensor("w_lin", w_lin, dtypes=_DTYPES, rank=2)
    if bias is not None:
        check_tensor("bias", bias, dtypes=_DTYPES, rank=1)
    for name, t in (("w_norm", w_norm), ("w_lin", w_lin), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has dtype {x.dtype}; they must match")
    d = x.shape[-1]
    if w_norm.shape[0] != d:
        raise ValueError(f"w_norm has shape {tuple(w_norm.shape)} but x has D={d} (last dim); expected ({d},)")
    if w_lin.shape[1] != d:
        raise ValueError(f"w_lin has shape {tuple(w_lin.shape)}: its second dim must equal D={d} of x")
    if bias is not None and bias.shape[0] != w_lin.shape[0]:
        raise ValueError(f"bias has shape {tuple(bias.shape)}; expected ({w_lin.shape[0]},) = (N,) of w_lin")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not (eps > 0) or not math.isfinite(eps):
        raise ValueError(f"eps must be a finite number > 0, got {eps}")
    return check_same_device(x=x, w_norm=w_norm, w_lin=w_lin, bias=bias)


# -------------------------------------------------------------------------------------- references


def torch_reference(x, w_norm, w_lin, bias, eps):
    """The PyTorch path: fp32 norm, matmul in fp32 on CPU (accurate, CPU-friendly) and in the input
    dtype on CUDA (the unfused F.rms_norm + F.linear a user would write)."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if x.device.type == "cpu" or x.dtype == torch.float32:
        b = bias.float() if bias is not None else None
        return F.linear(xf * rstd * w_norm.float(), w_lin.float(), b).to(x.dtype)
    h = (xf * rstd).to(x.dtype) * w_norm
    return F.linear(h, w_lin, bias)


# ---------------------------------------------------------------------------------------- planning


def wave_prefers_128x128(M: int, N: int, sms: int) -> bool:
    """The rounds model of the tuning key WAVE_C1: True where config 1's 128x128 tiles (one per SM) lose fewer
    persistent rounds than config 0's 128x256 2-CTA-cluster tiles by more than config 0's own edge. H200, session 25
    (PROBE_BASIC_SET=llm): per round of tile area config 0 was ~10% faster where both grids filled their rounds
    alike, so config 1 wins iff 0.9 * 2 * rounds(config 0) > rounds(config 1); e.g. M1536 D4096 N6144: 288
    tiles = 3 rounds of 132 against 576 = 5, measured 141.8 vs 131.1 us (F.linear 112.2)."""
    r0 = cdiv(cdiv(cdiv(M, 128), 2) * 2 * cdiv(N, 256), sms // 2 * 2)
    r1 = cdiv(cdiv(M, 128) * cdiv(N, 128), sms)
    return 1.8 * r0 > r1


def plan(
    arch: str, M: int, N: int, K: int, *, has_gemm: bool, has_mma: bool = True, folded: bool = True, sms: int = 132
) -> dict:
    """Kernel choice for one call: {"path": "stream"|"decode_mma"|"decode"|"gemm"|"torch_gemm", ...}.

    ``has_mma``: the binary has the tensor-core decode kernels and the GPU is sm_80+; without it a
    decode_mma or stream entry runs the CUDA-core decode kernel instead. ``folded``: the call has the modules'
    W' = W * g; without it (a functional call) an entry's optional "fn" config replaces it (the GEMM
    configs then pay a per-call x * g, which decode_mma does not; a "stream" entry's kernel reads W' and x,
    so a functional call runs it only where "fn" names it, after rstd_scale writes x * g and rstd, and
    otherwise decode_mma's default). ``sms``: the GPU's SM count (the WAVE_C1 key, wave_prefers_128x128).
    """
    # T128: tiles of a 128 x 128 output grid, so an entry can ask for about one wave of such tiles
    wave = int(wave_prefers_128x128(M, N, sms)) if M * N >= 2**23 else 0  # only the MN rule's rows ask
    t128 = cdiv(M, 128) * cdiv(N, 128)
    cfg = _TUNING.lookup(arch, M=M, N=N, K=K, MN=M * N, NK=N * K, T128=t128, WAVE_C1=wave, FOLDED=int(folded))
    fn = cfg.pop("fn", None)
    if fn is not None and not folded:
        cfg = dict(fn)
    if cfg.get("rows") == "auto":
        cfg.update(stream_auto(N, K, sms))
    path = cfg.get("path", "gemm")
    if path == "stream" and ((not folded and fn is None) or M > STREAM_MAX_M):
        cfg, path = {"wn": 0, "ksplit": 0}, "decode_mma"
    if path == "stream" and not has_mma:
        cfg, path = {}, "decode"
    if path == "decode_mma" and not has_mma:
        path = "decode"
    if path == "gemm" and not has_gemm:
        # no tensor-core GEMM for this arch in the binary (e.g. an SM70/75 build): the decode kernel
        # still wins for small M, otherwise torch matmul + row scale
        path = "decode" if M <= cfg.get("decode_fallback_max_rows", 64) else "torch_gemm"
    if path == "gemm" and (N % 8 or K % 8):
        path = "torch_gemm"  # TMA / cp.async need 16-byte aligned rows of W' and of the output
    if path == "decode_mma" and M > MMA_VARIANT_MAX_M:
        # the (steps, ldpolicy, wload) variants are compiled for <= 16 tokens per CTA only
        cfg.pop("steps", None)
        cfg.pop("ldpolicy", None)
        cfg.pop("wload", None)
    cfg["path"] = path
    return cfg


MMA_VARIANT_MAX_M = 16
# "stream" (csrc/decode_stream.cu): decode on the modules' W' only, one 16-token tile; "bn" W' rows per CTA and
# "stages" of the cp.async ring, the compiled pairs below (default the first). "wgmma": the sm_90a twin (wgmma
# from shared memory) with "warpgroups" 1 (default) | 2 per CTA, its compiled (bn, stages, warpgroups) below;
# optionally "proxy_fence" (fence.proxy.async between each stage's cp.async writes and its wgmma) and "rows" (W'
# rows per CTA, default bn: fewer put more CTAs on the SMs, e.g. 5120 as 128 CTAs of 40 rows instead of 80 of 64,
# and leave room for more stages); its compiled (bn, stages, warpgroups, rows) below.
STREAM_MAX_M = 16
STREAM_VARIANTS = ((128, 4), (128, 3), (64, 4), (64, 6))
STREAM_WG_VARIANTS = (
    (128, 4, 1, 128), (128, 5, 1, 128), (64, 4, 1, 64), (64, 5, 1, 64), (64, 6, 1, 64), (64, 8, 1, 64),
    (64, 8, 1, 40), (64, 8, 1, 32), (64, 12, 1, 32), (128, 5, 2, 128), (128, 6, 2, 128), (128, 5, 2, 112),
    (128, 6, 2, 112),
)  # fmt: skip


# "rows": "auto" in a wgmma stream entry (the sm90 catch-all for <= 16 tokens): of these compiled (bn, stages,
# warpgroups, rows), the one whose busiest SM streams the fewest W' rows, ceil(ceil(N / rows) / SMs) * rows, each
# weighted by its cost per row (fewer rows per CTA pay more per row: the x tile, the ring's fill and drain, and a
# CTA's own load limit). Weights fit to session 41's H100 sweep (scripts/probe_rmsnorm_stream.py, D 2048-14336, N
# 1024-28672, M 1 and 16; benchmarks/results/probes/h100-probe_rmsnorm_stream-s41-sweep.json): the rule picks
# the fastest variant or one within 2.5% of it at every shape there, at 0.90-1.01x F.linear where N >= 2048
# against decode_mma's 1.04-1.31x; first listed wins a tie.
# With the K split (session 43, "split": S CTAs of a cluster per `rows` rows, each streaming 1/S of K): the busiest
# CTA's rows * weight * ceil(k-blocks / S), plus SPLIT_COST for the cluster's on-chip reduction in the same units
# (rows * 128-wide k-blocks), against rows * weight * k-blocks per wave unsplit; S of STREAM_SPLITS. Only for the
# one-warpgroup variants, only where the unsplit grid leaves half the SMs idle, and only while the clusters take at
# most 80% of the SMs. H200 session 43 (scripts/probe_rmsnorm_stream.py, "auto sN"): 26 clusters of 4 (104 CTAs,
# N 1024) ran 0.79-0.83x F.linear against 1.07-1.51x unsplit, 52 of 2 at D4096 N2048 0.80x against 0.93x; but 28
# or 32 clusters of 4 (112 / 128 CTAs) ran 1.2-1.5x slower than unsplit (they did not all fit at once), and the
# two-warpgroup 112-row kernel split lost at N 3072 and 6144. SPLIT_COST leaves 2048² (16 k-blocks) unsplit: split
# 2 gained 1.5% there on the H200 and the H100 ran it at 6.69 us against session 41's 5.99 unsplit (run 3).
# Split 8 (session 47, H200) reduces over 8 CTAs, so its SPLIT_COST is larger: at N 512 (13 clusters, 104 CTAs)
# it tied split 4 at D4096 (5.67 vs 5.63 us) and beat it at D8192 (6.62 vs 7.16); 500 puts the switch near K 5000.
# Where the clusters of 8 take at most half the SMs it costs 450 (SPLIT_COST_SPARSE): N 256 (7 clusters) at D4096
# ran 4.63-4.68 us on split 8 against 4.87-4.97 on split 4 (H100 sessions 47 and 48, H200 session 47), while N 384
# (10 clusters) at D4096 and N 256 at D2048 kept split 4 ahead by 1-6% (H100).
STREAM_AUTO = ((64, 8, 1, 40, 1.0), (128, 6, 2, 112, 0.72), (64, 6, 1, 64, 1.1), (64, 8, 1, 32, 1.3))
STREAM_SPLITS = (1, 2, 4, 8)
SPLIT_COST = {2: 330, 4: 330, 8: 500}
SPLIT_COST_SPARSE = {8: 450}


def stream_auto(N: int, K: int, sms: int, splits: tuple[int, ...] = STREAM_SPLITS) -> dict:
    """The "rows": "auto" choice at N output features, K input features on ``sms`` SMs: {"bn", "stages",
    "warpgroups", "rows", "split"}, the split one of ``splits``."""
    kt = cdiv(K, 128)

    def cost(c):
        (_, _, wg, rows, weight), s = c
        tiles = cdiv(N, rows)
        if s == 1:
            return cdiv(tiles, sms) * rows * weight * kt
        if wg == 1 and 2 * tiles <= sms and 5 * tiles * s <= 4 * sms:
            sparse = 2 * tiles * s <= sms and s in SPLIT_COST_SPARSE
            return rows * weight * cdiv(kt, s) + (SPLIT_COST_SPARSE if sparse else SPLIT_COST)[s]
        return float("inf")

    (bn, stages, wg, rows, _), split = min(((v, s) for s in splits for v in STREAM_AUTO), key=cost)
    return {"bn": bn, "stages": stages, "warpgroups": wg, "rows": rows, "split": split}


def stream_args(cfg: dict, wgmma_ok: bool = True) -> tuple[int, int, int, int, int]:
    """(bn, stages, warpgroups (0: the mma.sync kernel), fence, rows) of a "stream" entry: optional keys "bn" and
    "stages" (a pair of STREAM_VARIANTS; with "wgmma": true, with "warpgroups" and "rows" a quadruple of
    STREAM_WG_VARIANTS), and the bool "proxy_fence" (wgmma only). wgmma_ok False (no sm_90a kernel in the binary,
    or not a 9.0 GPU): a wgmma entry runs the mma.sync kernel with the same bn (128: 4 stages, 64: 6), bn rows.
    The wgmma kernel's K split, "split" (1, 2, 4, 8), is checked here and read by ``stream_split``."""
    wg, fence = cfg.get("wgmma", False), cfg.get("proxy_fence", False)
    if not isinstance(wg, bool) or not isinstance(fence, bool) or (fence and not wg):
        raise ValueError(f"stream config 'wgmma' / 'proxy_fence' must be bools, the fence with wgmma: {cfg!r}")
    if wg:
        d = STREAM_WG_VARIANTS[0]
        bn = cfg.get("bn", d[0])
        v = (bn, cfg.get("stages", d[1]), cfg.get("warpgroups", 1), cfg.get("rows", bn))
        table = STREAM_WG_VARIANTS
    else:
        v = (cfg.get("bn", STREAM_VARIANTS[0][0]), cfg.get("stages", STREAM_VARIANTS[0][1]))
        table = STREAM_VARIANTS
    bad_key = ("warpgroups" in cfg or "rows" in cfg or "split" in cfg) and not wg
    if any(isinstance(e, bool) for e in v) or v not in table or bad_key:
        raise ValueError(f"stream config must be one of {table} (wgmma {wg}), got {v!r}")
    split = cfg.get("split", 1)
    if isinstance(split, bool) or split not in (1, 2, 4, 8):
        raise ValueError(f"stream config 'split' (K split over a cluster) must be 1, 2, 4 or 8: {cfg!r}")
    if wg and not wgmma_ok:
        return int(v[0]), 4 if v[0] == 128 else 6, 0, 0, int(v[0])
    return int(v[0]), int(v[1]), int(v[2]) if wg else 0, int(fence), int(v[3]) if wg else int(v[0])


def stream_split(cfg: dict, wgmma: int) -> int:
    """The K split of a checked "stream" entry (``stream_args``) for the kernel it runs: 1 on the mma.sync one."""
    return int(cfg.get("split", 1)) if wgmma else 1


# SM90 prefill with a PDL GEMM whose persistent grid leaves SMs idle (e.g. 128 output tiles on 132 SMs):
# rstd runs as that many 32-warp CTAs on those SMs (csrc/rstd.cu rstd_side_kernel) instead of 8-warp
# CTAs on nearly every SM, which a GEMM CTA cannot share and so has to wait out. H200, one run
# (benchmarks/results/probes/h200-probe_rmsnorm_rstd-side.json): B512 D4096 N4096 32.1 -> 30.0 us, but
# B1024 D2048 N2048 16.2 -> 16.6 (the GEMM's first epilogue then waits for rstd: a few SMs read x at
# ~0.1 TB/s each) and the cluster-2 config 3 at B128 D8192 43.8 -> 45.2 (rstd CTAs on 4 SMs can block
# 4 TPCs for 2-CTA clusters). So: no-cluster configs only, and only where the GEMM outlasts the side
# rstd by ~2x, i.e. N * idle SMs >= RSTD_SIDE_WORK (rstd ~ M*D*2 B / (idle * 0.1 TB/s) against a GEMM of
# ~2*M*N*D / 600 TFLOP/s; M and D cancel). Session 10 (faster rstd kernel,
# benchmarks/results/probes/h200-probe_rmsnorm_rstd-s10*.json): with no threshold B1024 D2048 got slower
# (16.8-17.3 vs 16.3-16.5 us); at the other 6 shapes the threshold's effect was within run-to-run noise.
RSTD_SIDE = True
RSTD_SIDE_MIN = 2
RSTD_SIDE_WORK = 12000
_SM90_TILE_NO_CLUSTER = {1: (128, 128), 2: (64, 128)}  # csrc/gemm_sm90.cu configs without clusters, not stream-K
SM90_SWAP_CONFIGS = (7, 8, 9, 10, 11)  # csrc/gemm_sm90.cu: W rows x tokens tiles (decode)
# Config 11 is 7 computing rstd from x itself (csrc/gemm_sm90.cu SelfRstdMainloop: one launch, no rstd
# kernel). That needs the GEMM's x operand to be x itself, i.e. g folded into W' (the modules); a
# functional call, whose operand is x * g, and more tokens than its 16-token tile run the twin instead.
SM90_SELF_RSTD_TWIN = {11: 7}  # csrc/frms.h FRMS_SM90_IS_SELF_RSTD
SM90_SELF_RSTD_TOKENS = {11: 16}  # one token tile (the kernel refuses more)
# Opt-in (off by default): config 11 as a programmatic dependent (PDL) of the kernel before it. It then
# triggers its own dependents at its start and requests its first SELF_RSTD_PDL_EARLY stages of W' before the
# grid-dependency wait, x (and every write) after it. H200, session 20 (scripts/probe_rmsnorm_selfrstd_pdl.py,
# M16 D4096 N14336, CUDA graph): calls back to back 31.52 -> 29.87 us (F.linear 30.13), but right after an
# elementwise kernel that does not trigger PDL (the usual case inside a model) 33.53 -> 34.94; fewer early
# stages trade one for the other (4: 30.34 / 33.95). So it pays only where the previous kernel is this op, or
# another kernel that triggers early. Reading W' early is safe only if no kernel still in flight writes it:
# W' is the modules' cache, written once by fold_weight when (re)folded, so a call gets PDL only once an
# earlier call with the switch on has read the same W' tensor at the same version (_w_settled, which only runs
# when it is on); the first such call after a (re)fold is an ordinary launch.
SELF_RSTD_PDL = False
SELF_RSTD_PDL_EARLY = 11  # W' stages requested before the wait (config 11 has 11); 0: none
SELF_RSTD_PDL_LAUNCHES = [0]  # how many such launches were PDL (tests)
_W_SEEN: dict[int, tuple[weakref.ref, int]] = {}


def _w_settled(w: torch.Tensor) -> bool:
    """True if an earlier call read this very tensor at its current version (see SELF_RSTD_PDL); records it."""
    e = _W_SEEN.get(id(w))
    if e is not None and e[0]() is w and e[1] == w._version:
        return True
    if len(_W_SEEN) > 4096:  # drop entries whose tensor is gone (ids are reused)
        for k in [k for k, (r, _) in _W_SEEN.items() if r() is None]:
            del _W_SEEN[k]
    _W_SEEN[id(w)] = (weakref.ref(w), w._version)
    return False


def rstd_side_ctas(cfg: int, M: int, N: int, sms: int) -> int:
    """SMs the SM90 GEMM config ``cfg`` leaves idle at (M, N) when the side rstd launch pays there
    (see RSTD_SIDE_WORK), else 0."""
    if not RSTD_SIDE or cfg not in _SM90_TILE_NO_CLUSTER:
        return 0
    bm, bn = _SM90_TILE_NO_CLUSTER[cfg]
    free = sms - cdiv(M, bm) * cdiv(N, bn)
    return free if free >= RSTD_SIDE_MIN and N * free >= RSTD_SIDE_WORK else 0


# SM90 prefill with several rounds of persistent tiles (e.g. B4096 D4096 N4096, config 0: 512 tiles on 132 SMs),
# where no SM is idle and so the rstd kernel ran on every SM in front of the GEMM (~8 us of ~215 at B4096).
# Streamed: the GEMM's persistent grid is capped RSTD_STREAMED_FREE SMs short, where that costs no round
# (512 tiles: 4 rounds on 132 or 128 CTAs), and rstd runs on those SMs (clusters of the GEMM's cluster size, so
# every GEMM cluster still fits) during the whole mainloop. The epilogue waits per row, not for the rstd grid
# (csrc/gemm_sm90.cu RstdScale): the first round's rows must be ready by its first epilogue. With raster
# along N the first round covers ~1/rounds of the rows, so rstd needs ~M*D*2 B / (free * ~0.1 TB/s) per
# GEMM round of ~2*M*N*D / (rounds * 600 TFLOP/s): N * free >= RSTD_SIDE_WORK, as for the side launch.
# Raster along M (the heuristic's choice when there are more N tiles than M tiles) needs every row in the
# first round, so it is not streamed. H200, session 25 (scripts/probe_rmsnorm_streamed.py, two runs), streamed vs
# rstd in front: B4096 222.8 / 223.1 vs 223.8 / 226.6 us, M8192 D4096 N4096 439.6 / 443.7 vs 450.1 / 456.8, M4096
# D8192 N8192 873.2 / 887.7 vs 880.5 / 902.0; where the rest of the ~8 us at B4096 goes was not profiled.
RSTD_STREAMED = True
RSTD_STREAMED_FREE = 4
# csrc/gemm_sm90.cu persistent data-parallel configs: (BM, BN, cluster along M)
_SM90_PERSISTENT_TILES = {0: (128, 256, 2), 1: (128, 128, 1), 2: (64, 128, 1), 3: (64, 128, 2), 4: (128, 128, 2),
                          5: (256, 128, 2)}  # fmt: skip


def rstd_streamed(cfg: int, M: int, N: int, sms: int, raster: int = 0) -> tuple[int, int, int]:
    """(rstd CTAs, GEMM grid cap, cluster size) of the streamed launch of SM90 config ``cfg`` at (M, N) on
    ``sms`` SMs (raster: the tile scheduler knob, 0 heuristic | 1 along M | 2 along N), or (0, 0, 0) where it
    does not apply (see RSTD_STREAMED)."""
    if not RSTD_STREAMED or cfg not in _SM90_PERSISTENT_TILES:
        return 0, 0, 0
    bm, bn, c = _SM90_PERSISTENT_TILES[cfg]
    mt = cdiv(cdiv(M, bm), c) * c  # M tiles, padded to whole clusters
    nt = cdiv(N, bn)
    along_n = raster == 2 or (raster == 0 and nt <= mt)  # CUTLASS: heuristic = along M iff tiles_n > tiles_m
    tiles = mt * nt
    full = sms // c * c
    cap = (sms - RSTD_STREAMED_FREE) // c * c
    if not along_n or cap <= 0 or tiles < 2 * full:
        return 0, 0, 0
    if cdiv(tiles, cap) != cdiv(tiles, full) or N * (sms - cap) < RSTD_SIDE_WORK:
        return 0, 0, 0
    return sms - cap, cap, c


_LDPOLICY = {"evict_first": 0, "plain": 1}


def mma_variant_args(cfg: dict) -> tuple[int, int, int]:
    """(steps, ldpolicy code, wload) of a decode_mma config: "steps" 4 | 8 (W loads in flight per lane,
    default 4), "ldpolicy" "evict_first" (L1 no-allocate + L2 evict_first W loads, default) | "plain",
    "wload" 0 (default) | 1 (x prefetched in the W ring) | 2 / 3 (1 + W staged through shared memory by
    cp.async.bulk, 256 / 512-B row pieces, sm_90 only); wload > 0 needs steps 4 and ldpolicy evict_first."""
    steps = int(cfg.get("steps", 0))
    if steps not in (0, 4, 8):
        raise ValueError(f"decode_mma config 'steps' must be 4 or 8, got {cfg.get('steps')!r}")
    pol = cfg.get("ldpolicy", "evict_first")
    if pol not in _LDPOLICY:
        raise ValueError(f"decode_mma config 'ldpolicy' must be one of {sorted(_LDPOLICY)}, got {pol!r}")
    wload = cfg.get("wload", 0)
    if isinstance(wload, bool) or wload not in (0, 1, 2, 3):
        raise ValueError(f"decode_mma config 'wload' must be 0, 1, 2 or 3, got {wload!r}")
    if wload and (steps not in (0, 4) or pol != "evict_first"):
        raise ValueError(f"decode_mma config 'wload' {wload} needs steps 4 and ldpolicy 'evict_first', got {cfg!r}")
    return steps, _LDPOLICY[pol], int(wload)


SM90_NUM_CONFIGS = 15  # csrc/frms.h FRMS_SM90_NUM_CONFIGS
SM90_STREAM_K_CONFIGS = (6,)  # csrc/frms.h FRMS_SM90_STREAM_K_CONFIG: the config that takes splits / a workspace
SM90_BASIC_CONFIGS = (12, 13, 14)  # the non-persistent kernel: one CTA per tile, so no CTA cap


def sm90_knob_args(cfg: dict) -> tuple[int, int, int]:
    """(raster, swizzle, splits) of an sm90 "gemm" entry: optional keys "raster" 0 heuristic (default) |
    1 along M | 2 along N (tile scheduler raster order), "swizzle" 1 (default) | 2 | 4 | 8 (max swizzle
    size), "splits" (stream-K config only) 1 (default: stream-K heuristic) | > 1 fixed split-K."""
    config = cfg.get("config", 0)
    if isinstance(config, bool) or not isinstance(config, int) or not 0 <= config < SM90_NUM_CONFIGS:
        raise ValueError(f"sm90 gemm config 'config' must be an int in 0..{SM90_NUM_CONFIGS - 1}, got {config!r}")
    raster = cfg.get("raster", 0)
    if isinstance(raster, bool) or raster not in (0, 1, 2):
        raise ValueError(f"sm90 gemm config 'raster' must be 0 (heuristic), 1 (along M) or 2 (along N), got {raster!r}")
    swizzle = cfg.get("swizzle", 1)
    if isinstance(swizzle, bool) or swizzle not in (1, 2, 4, 8):
        raise ValueError(f"sm90 gemm config 'swizzle' must be 1, 2, 4 or 8, got {swizzle!r}")
    splits = cfg.get("splits", 1)
    if isinstance(splits, bool) or not isinstance(splits, int) or not 1 <= splits <= 64:
        raise ValueError(f"sm90 gemm config 'splits' must be an int in 1..64, got {splits!r}")
    if splits > 1 and config not in SM90_STREAM_K_CONFIGS:
        raise ValueError(f"sm90 gemm config 'splits' > 1 needs a stream-K config {SM90_STREAM_K_CONFIGS}, got {cfg!r}")
    return int(raster), int(swizzle), int(splits)


def sm90_ctas_arg(cfg: dict) -> int:
    """Optional sm90 "gemm" key "ctas": a cap on the persistent grid's CTAs (0 / absent: one per SM, CUTLASS's
    default). Not for stream-K (its workspace is sized for the full grid) nor the non-persistent configs."""
    ctas = cfg.get("ctas", 0)
    if isinstance(ctas, bool) or not isinstance(ctas, int) or ctas < 0 or ctas % 2:
        # even: whole 2-CTA clusters, the largest cluster any config launches
        raise ValueError(f"sm90 gemm config 'ctas' must be an even int >= 0, got {ctas!r}")
    if ctas and (cfg.get("config", 0) in SM90_STREAM_K_CONFIGS or cfg.get("config", 0) in SM90_BASIC_CONFIGS):
        raise ValueError(f"sm90 gemm config 'ctas' needs a persistent data-parallel config, got {cfg!r}")
    return int(ctas)


@functools.lru_cache(maxsize=1024)
def _sm90_workspace_bytes(mod, dt: int, config: int, M: int, N: int, K: int, knobs: tuple[int, int, int]) -> int:
    return int(mod.gemm_sm90_workspace(dt, config, M, N, K, *knobs))


def _sm90_workspace(mod, dt, config, M, N, K, knobs, device) -> tuple[int, int, torch.Tensor | None]:
    """(pointer, bytes, tensor) of the stream-K workspace; (0, 0, None) for the data-parallel configs.

    The size query is cached per (shape, knobs); the buffer itself comes from torch's caching
    allocator on each call (no device sync, capturable in a CUDA graph, and stream-ordered, so two
    streams never share one scratch buffer as a single cached tensor would let them)."""
    if config not in SM90_STREAM_K_CONFIGS:
        return 0, 0, None
    n = _sm90_workspace_bytes(mod, dt, config, M, N, K, knobs)
    if n == 0:
        return 0, 0, None
    ws = torch.empty(n, dtype=torch.uint8, device=device)
    return ws.data_ptr(), n, ws


def _as_2d_rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """(rows, D) with unit inner stride, row stride % 8 == 0 and a 16-byte aligned base (copy if not)."""
    t2 = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
    ok = t2.stride(-1) == 1 and (t2.shape[0] <= 1 or t2.stride(0) % 8 == 0) and t2.data_ptr() % 16 == 0
    return t2 if ok else t2.contiguous()


def _ld(t: torch.Tensor) -> int:
    """Row stride to pass to the kernels (a single row's stride is meaningless: use its length)."""
    return t.stride(0) if t.shape[0] > 1 else t.shape[1]


def _vec(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    return t if (t.is_contiguous() and t.data_ptr() % 16 == 0) else t.contiguous().clone()


def fold_weight(w_norm: torch.Tensor, w_lin: torch.Tensor) -> torch.Tensor:
    """W' = W * g (column scale). The product of two fp16/bf16 values is exact in fp32, so the
    native-dtype multiply rounds once, like an fp32 multiply would, without an fp32 copy of W."""
    return w_lin * w_norm


def scale_x_side(M: int, N: int) -> bool:
    """Where a functional call (no cached W') applies g for the row-scaled GEMM: True = to x, in the rstd pass
    (rstd_scale reads x once and writes x * g: 2 M D element moves), False = to W, folded per call (2 N D, plus
    the rstd kernel's read of x, which overlaps the GEMM). x takes it up to M < 2 N."""
    return M < 2 * N


def _gemm_operands(x2, w_norm, w_lin, w_folded):
    """(A, W, scaled) for the row-scaled GEMM: A @ W^T * rstd == (x * rstd * g) @ W_lin^T.

    A cached W' (the modules) is used as is. Without one (a functional call), g goes to the side
    scale_x_side picks: x (scaled = True: the caller's rstd_scale pass writes A = x * g, A here is an
    empty buffer) or the N x D weight (folded per call).
    """
    if w_folded is not None:
        return x2, w_folded, False
    if scale_x_side(x2.shape[0], w_lin.shape[0]):
        return torch.empty_like(x2, memory_format=torch.contiguous_format), w_lin, True
    return x2, fold_weight(w_norm, w_lin), False


def _rstd_scale(mod, dt, x2, w_norm, xg, rstd, eps, stream) -> None:
    """rstd[M] and xg = x * g (unit inner stride) from one pass over x (csrc/rstd.cu rstd_scale): the operands of
    a functional call, which has no cached W'."""
    g = _vec(w_norm)
    mod.rstd_scale(dt, x2.data_ptr(), _ld(x2), g.data_ptr(), xg.data_ptr(), _ld(xg), rstd.data_ptr(), x2.shape[0],
                   x2.shape[1], float(eps), stream)  # fmt: skip


def _launch_ext(x, w_norm, w_lin, bias, eps, w_folded=None):
    """Run the CUDA extension. Raises (rather than falls back) on tensors it cannot take."""
    for name, t in (("x", x), ("w_norm", w_norm), ("w_lin", w_lin), ("bias", bias), ("w_folded", w_folded)):
        if t is not None and t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: the CUDA extension path needs CUDA tensors")
    if x.dtype not in _DTYPE_CODES:
        raise TypeError(f"x has dtype {x.dtype}: the CUDA extension supports float16 and bfloat16")
    ext = _backend.get_ext(x.device)
    if ext.kind == "torch":
        return torch_reference(x, w_norm, w_lin, bias, eps)
    D = x.shape[-1]
    N = w_lin.shape[0]
    lead = x.shape[:-1]
    if D % 8 != 0:
        _backend.warn_once(f"d{D}", f"fused_rmsnorm: D={D} is not a multiple of 8; using the PyTorch path")
        return torch_reference(x, w_norm, w_lin, bias, eps)
    x2 = _as_2d_rows(x, "x")
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out.reshape(*lead, N)
    dt = _DTYPE_CODES[x.dtype]
    stream = torch.cuda.current_stream(x.device).cuda_stream
    cap = torch.cuda.get_device_capability(x.device)
    arch = arch_key(x.device)
    has_gemm = (cap[0] == 9 and ext.has_gemm_sm90) or (cap[0] == 8 and ext.has_gemm_sm80)
    p = plan(
        arch, M, N, D, has_gemm=has_gemm, has_mma=cap[0] >= 8 and ext.has_decode_mma, folded=w_folded is not None,
        sms=num_sms(x.device),
    )  # fmt: skip
    b = _vec(bias)
    bptr = b.data_ptr() if b is not None else 0
    mod = ext.module
    if p["path"] == "stream":
        bn, stages, wgmma, fence, rows = stream_args(p, wgmma_ok=cap == (9, 0) and ext.has_stream_wgmma)
        rstd_ptr = 0
        if w_folded is not None:  # the modules' W': the kernel takes rstd from the x tiles it streams
            xs, w2 = x2, _as_2d_rows(w_folded, "w_folded")
        else:  # a functional call ("fn" entry): x * g and rstd from one pass over x, then W as is
            xs, w2 = torch.empty((M, D), dtype=x.dtype, device=x.device), _as_2d_rows(w_lin, "w_lin")
            rstd = torch.empty(M, dtype=torch.float32, device=x.device)
            _rstd_scale(mod, dt, x2, w_norm, xs, rstd, eps, stream)
            rstd_ptr = rstd.data_ptr()
        mod.decode_stream(
            dt, xs.data_ptr(), _ld(xs), w2.data_ptr(), _ld(w2), bptr, out.data_ptr(), out.stride(0), M, N, D,
            float(eps), bn, stages, stream, wgmma, fence, rows, rstd_ptr, stream_split(p, wgmma),
        )  # fmt: skip
        return out.reshape(*lead, N)
    if p["path"] == "decode_mma":
        if _ld(x2) * 32 >= 2**31:  # the kernel addresses 32 rows of x with 32-bit offsets
            x2 = x2.contiguous()
        if w_folded is not None:  # the modules' W' = W * g: no per-call work for g at all
            w2, gptr = _as_2d_rows(w_folded, "w_folded"), 0
        else:  # functional call: the kernel applies g itself (to x or to W, whichever is cheaper)
            w2, g = _as_2d_rows(w_lin, "w_lin"), _vec(w_norm)
            gptr = g.data_ptr()
        steps, ldpolicy, wload = mma_variant_args(p)
        if wload >= 2 and cap[0] < 9:
            wload = 1  # the cp.async.bulk stages need sm_90; the register path of the same variant
        mod.decode_mma(
            dt, x2.data_ptr(), _ld(x2), gptr, w2.data_ptr(), _ld(w2), bptr,
            out.data_ptr(), out.stride(0), M, N, D, float(eps), int(p.get("wn", 0)),
            int(p.get("ksplit", 0)), stream, steps, ldpolicy, wload,
        )  # fmt: skip
        return out.reshape(*lead, N)
    if p["path"] == "decode":
        w2 = _as_2d_rows(w_lin, "w_lin")
        g = _vec(w_norm)
        mod.decode(
            dt, x2.data_ptr(), _ld(x2), g.data_ptr(), w2.data_ptr(), _ld(w2), bptr,
            out.data_ptr(), out.stride(0), M, N, D, float(eps), int(p.get("ksplit", 0)),
            int(p.get("grid_blocks", 0)), stream,
        )  # fmt: skip
        return out.reshape(*lead, N)
    a, wf, scaled = _gemm_operands(x2, w_norm, w_lin, w_folded)
    wf = _as_2d_rows(wf, "w_folded")
    cfg = int(p.get("config", 0)) if p["path"] == "gemm" else -1
    if cfg in SM90_SELF_RSTD_TWIN and (cap[0] != 9 or a is not x2 or M > SM90_SELF_RSTD_TOKENS[cfg]):
        cfg = SM90_SELF_RSTD_TWIN[cfg]
    self_rstd = cap[0] == 9 and cfg in SM90_SELF_RSTD_TWIN
    # self rstd: no rstd buffer (the kernel ignores the pointer), so no allocation on the decode hot path
    rstd = None if self_rstd else torch.empty(M, dtype=torch.float32, device=x.device)
    rstd_ptr = 0 if rstd is None else rstd.data_ptr()
    # Hopper PDL GEMM with idle SMs: rstd on exactly those SMs (csrc/rstd.cu rstd_side_kernel). Only when
    # the GEMM's A is x itself: after the per-call x * g of a functional call it made the call slower
    # (H200, session 10: B512 D4096 N4096 48.9 vs 37.8 us, B256 29.5 vs 23.6; not profiled).
    side = max_ctas = streamed = 0
    if p["path"] == "gemm" and cap[0] == 9 and bool(p.get("pdl", True)) and a is x2 and not self_rstd:
        sms = num_sms(x.device)
        side = rstd_side_ctas(cfg, M, N, sms)
        if not side:
            side, max_ctas, streamed = rstd_streamed(cfg, M, N, sms, int(p.get("raster", 0)))
    if scaled:  # rstd and A = x * g in one pass over x; the GEMM reads A from its first k-block, so no PDL below
        _rstd_scale(mod, dt, x2, w_norm, a, rstd, eps, stream)
    elif not self_rstd:
        mod.rstd(dt, x2.data_ptr(), _ld(x2), rstd.data_ptr(), M, D, float(eps), stream, side, streamed)
    if p["path"] == "gemm":
        if cap[0] == 9:
            knobs = sm90_knob_args(p)
            max_ctas = max_ctas or sm90_ctas_arg(p)  # streamed rstd sets its own cap
            wsp, wsn, _ws = _sm90_workspace(mod, dt, cfg, M, N, D, knobs, x.device)
            if self_rstd:  # W' may be read before the wait only when it is the settled module cache (SELF_RSTD_PDL)
                pdl = SELF_RSTD_PDL and bool(p.get("pdl", True)) and wf is w_folded and _w_settled(wf)
                SELF_RSTD_PDL_LAUNCHES[0] += pdl
            else:
                pdl = bool(p.get("pdl", True)) and not scaled
            mod.gemm_sm90(
                dt, cfg, a.data_ptr(), _ld(a), wf.data_ptr(), _ld(wf), rstd_ptr, bptr,
                out.data_ptr(), out.stride(0), M, N, D, pdl, stream, *knobs, wsp, wsn, float(eps),
                int(SELF_RSTD_PDL_EARLY) if self_rstd and pdl else 0, max_ctas, streamed > 0,
            )  # fmt: skip
        else:
            mod.gemm_sm80(
                dt, cfg, a.data_ptr(), _ld(a), wf.data_ptr(), _ld(wf), rstd.data_ptr(), bptr,
                out.data_ptr(), out.stride(0), M, N, D, stream,
            )  # fmt: skip
        return out.reshape(*lead, N)
    # torch_gemm: no CUTLASS GEMM for this arch -> torch matmul, then the fp32 row scale
    torch.mm(a, wf.t(), out=out)
    out.mul_(rstd.to(out.dtype).unsqueeze(1))
    if b is not None:
        out.add_(b)
    return out.reshape(*lead, N)


# -------------------------------------------------------------------------------- custom op + API


@torch.library.custom_op("fused_rmsnorm::rmsnorm_linear", mutates_args=())
def _rmsnorm_linear_op(
    x: torch.Tensor,
    w_norm: torch.Tensor,
    w_lin: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    w_folded: torch.Tensor | None,
) -> torch.Tensor:
    backend = select_backend(x.device, has_interpreter=False)
    forced = _backend.forced_backend()
    if backend == Backend.GPU and x.dtype in _DTYPE_CODES and forced != "torch":
        return _launch_ext(x, w_norm, w_lin, bias, eps, w_folded)
    if forced in ("aot", "jit"):
        # an explicit request for the extension must not silently run something else
        return _launch_ext(x, w_norm, w_lin, bias, eps, w_folded)
    return torch_reference(x, w_norm, w_lin, bias, eps)


@_rmsnorm_linear_op.register_fake
def _(x, w_norm, w_lin, bias, eps, w_folded):
    return x.new_empty((*x.shape[:-1], w_lin.shape[0]))


def _setup_context(ctx, inputs, output):
    x, w_norm, w_lin, bias, eps, _w_folded = inputs
    ctx.save_for_backward(x, w_norm, w_lin, bias)
    ctx.eps = eps
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    # Training is not the target: the backward recomputes the torch path in fp32 and differentiates it.
    x, w_norm, w_lin, bias = ctx.saved_tensors
    with torch.enable_grad():
        xs = x.detach().float().requires_grad_(ctx.needs_input_grad[0])
        gs = w_norm.detach().float().requires_grad_(ctx.needs_input_grad[1])
        ws = w_lin.detach().float().requires_grad_(ctx.needs_input_grad[2])
        bs = bias.detach().float().requires_grad_(ctx.needs_input_grad[3]) if bias is not None else None
        rstd = torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + ctx.eps)
        y = F.linear(xs * rstd * gs, ws, bs)
        wrt = [t for t in (xs, gs, ws, bs) if t is not None and t.requires_grad]
        grads = iter(torch.autograd.grad(y, wrt, grad.float()) if wrt else ())
    out = []
    for t, orig in zip((xs, gs, ws, bs), (x, w_norm, w_lin, bias)):
        out.append(next(grads).to(orig.dtype) if t is not None and t.requires_grad else None)
    return (*out, None, None)


_rmsnorm_linear_op.register_autograd(_backward, setup_context=_setup_context)


def fused_rmsnorm_linear(
    x: torch.Tensor,
    w_norm: torch.Tensor,
    w_lin: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Linear(RMSNorm(x)): x (..., D), w_norm (D,), w_lin (N, D), bias (N,) -> (..., N).

    fp16/bf16 on CUDA run the fused extension; fp32 and CPU tensors the PyTorch path.
    """
    check_inputs(x, w_norm, w_lin, bias, eps)
    return _rmsnorm_linear_op(x, w_norm, w_lin, bias, float(eps), None)


def fused_rmsnorm_linear_folded(
    x: torch.Tensor,
    w_norm: torch.Tensor,
    w_lin: torch.Tensor,
    w_folded: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """As ``fused_rmsnorm_linear`` with a precomputed W' = w_lin * w_norm (the modules' cache).

    The caller guarantees ``w_folded == fold_weight(w_norm, w_lin)``; decode uses w_norm / w_lin.
    """
    check_inputs(x, w_norm, w_lin, bias, eps)
    check_tensor("w_folded", w_folded, dtypes=(x.dtype,), rank=2)
    if w_folded.shape != w_lin.shape:
        raise ValueError(f"w_folded has shape {tuple(w_folded.shape)}; expected {tuple(w_lin.shape)} like w_lin")
    return _rmsnorm_linear_op(x, w_norm, w_lin, bias, float(eps), w_folded)
