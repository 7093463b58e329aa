"""Hopper (SM90) int8 GEMM with fused dequantization, written in Gluon (Triton's explicit-layout dialect).

Why a second TMA kernel: the plain-Triton ``_int8_gemm_tma_kernel`` (one warpgroup, 128x128x128, 3 stages)
tops out near 1290 TOPS at 4096^3 on the H200 (peak ~1979): one warpgroup both issues the loads and waits
on its wgmmas, and its epilogue stalls the tensor cores. This kernel is organised as a warp-specialized,
persistent CUTLASS-style GEMM:

* one CTA per SM walks output tiles in grouped (GROUP_M) order; a 1-warp producer partition streams the
  (A, B) K-blocks of those tiles with TMA through a ring of STAGES shared-memory stages (a "ready" and an
  "empty" mbarrier per stage) and runs ahead into the next tile while the consumers finish the current one;
* two consumer warpgroups run async wgmma (int8 x int8 -> int32, both operands K-major in shared memory),
  one in flight, and free a stage once the wgmma that read it has retired;
* cooperative mode (default): both warpgroups work on one BLOCK_M x BLOCK_N tile, BLOCK_M/2 rows each;
  ping-pong mode (SM90_PINGPONG=1): each warpgroup owns whole BLOCK_M x BLOCK_N tiles, taking every other
  tile of the CTA, so one's epilogue overlaps the other's main loop;
* epilogue: int32 -> fp32, (acc * sa[m]) * sb[n] (+ bias[n]) -> out dtype (the math order of
  ``gemm._epilogue``), or the raw int32 (OUT_INT32); written to a per-warpgroup shared-memory buffer and out by a
  TMA store (SM90_EPI_TMA, where the output's rows are 16-byte strided and the buffers fit beside the ring), so
  a warpgroup starts its next tile while the store drains (H200, 4096^3 bf16: 1445 TOPS vs 1242 with masked
  stores straight from the wgmma registers, the fallback).

A is (M, K) row-major and B the (N, K) K-major weight; TMA zero-fills rows/cols/K past the edges, so
ragged M, N, K need no masks in the main loop. Only Triton 3.6 (the API moves between releases), SM90,
int8 operands with unit inner stride and 16-byte aligned bases/strides take it (``eligible``); gemm.py
keeps its other kernels for everything else and uses this one only where a tuning entry says "SM90": 1.
"""

from __future__ import annotations

import torch
import triton

from .._common import capability, direct

try:  # Gluon ships with Triton >= 3.5; without it this kernel is simply never chosen
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # written against, and only ever compiled with, Triton 3.6: other versions keep the Triton kernels
    HAS_GLUON = triton.__version__.startswith("3.6.")
except ImportError:  # pragma: no cover - exercised only on old Triton
    HAS_GLUON = False

# Defaults of the config keys (tuning.json entries). SM90_EPI_TMA 1: the epilogue goes out through shared memory
# and a TMA store where the output's row stride and the shared memory allow (else straight from registers).
DEFAULTS = dict(
    SM90_BLOCK_M=128, SM90_BLOCK_N=256, SM90_BLOCK_K=128, SM90_STAGES=4, SM90_GROUP_M=8, SM90_PINGPONG=0, SM90_EPI_TMA=1
)
SMEM_LIMIT = 232448  # bytes of shared memory one H200 CTA may use (227 KB)
_CFG_KEYS = tuple(DEFAULTS)


def stage_bytes(block_m: int, block_n: int, block_k: int) -> int:
    return (block_m + block_n) * block_k


def epi_bytes(c: dict, out_elt: int) -> int:
    """Shared memory of the TMA-store epilogue: one (rows of a warpgroup, 128-col half) buffer per warpgroup."""
    wg_m = c["SM90_BLOCK_M"] if c["SM90_PINGPONG"] else c["SM90_BLOCK_M"] // 2
    return 2 * wg_m * min(c["SM90_BLOCK_N"], 128) * out_elt


def _acc_regs(cfg: dict) -> int:
    """int32 accumulator registers per consumer thread: the warpgroup's tile over its 128 threads."""
    bm, bn = cfg["SM90_BLOCK_M"], cfg["SM90_BLOCK_N"]
    wg_m = bm if cfg["SM90_PINGPONG"] else bm // 2
    return wg_m * bn // 128


def resolve(cfg: dict) -> dict:
    """The SM90_* keys of cfg with defaults filled in; ValueError for a configuration that cannot be built
    (wgmma / TMA shape rules, shared memory, an accumulator that would not fit the register budget)."""
    c = {k: int(cfg.get(k, v)) for k, v in DEFAULTS.items()}
    bm, bn, bk, st = c["SM90_BLOCK_M"], c["SM90_BLOCK_N"], c["SM90_BLOCK_K"], c["SM90_STAGES"]
    wg_m = bm if c["SM90_PINGPONG"] else bm // 2
    # BLOCK_K: the TMA box's inner extent must fit the 128-byte swizzle (int8: <= 128)
    if wg_m not in (64, 128) or bn not in (64, 128, 256) or bk not in (64, 128) or st < 2 or c["SM90_GROUP_M"] < 1:
        raise ValueError(f"unsupported SM90 int8 GEMM tiles {c}")
    if st * stage_bytes(bm, bn, bk) + 1024 > SMEM_LIMIT:
        raise ValueError(f"SM90 int8 GEMM config {c} needs more than {SMEM_LIMIT} bytes of shared memory")
    if _acc_regs(c) > 128:
        raise ValueError(f"SM90 int8 GEMM config {c}: the accumulator alone would exceed 128 registers a thread")
    return c


def eligible(A: torch.Tensor, Bnk: torch.Tensor, check_ptr: bool = True) -> bool:
    """True when the SM90 kernel can run A (M, K) and the (N, K) weight Bnk: Triton 3.6 with Gluon, CUDA
    capability (9, 0), int8, unit inner stride, 16-byte aligned row strides and (check_ptr) bases, which
    are TMA's rules. check_ptr=False: the part a launch plan pins (everything but the bases, ``aligned``)."""
    if not HAS_GLUON or A.device.type != "cuda" or A.dim() != 2 or Bnk.dim() != 2:
        return False
    if A.shape[1] != Bnk.shape[1] or A.shape[1] == 0 or capability(A.device) != (9, 0):
        return False
    for t in (A, Bnk):
        if t.dtype != torch.int8 or t.stride(1) != 1 or t.stride(0) % 16:
            return False
    return aligned(A, Bnk) if check_ptr else True


def aligned(A: torch.Tensor, Bnk: torch.Tensor) -> bool:
    """The per-call part of ``eligible``: 16-byte aligned bases."""
    return A.data_ptr() % 16 == 0 and Bnk.data_ptr() % 16 == 0


if HAS_GLUON:

    @gluon.jit
    def _tile_offsets(t, num_pid_m, num_pid_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
        """Tile t -> (first row, first col) in grouped order: GROUP_M row-tiles sweep the N tiles together,
        so the CTAs running at once share B tiles in L2 (the order of ``_int8_gemm_tma_kernel``)."""
        num_in_group = GROUP_M * num_pid_n
        first_m = (t // num_in_group) * GROUP_M
        group_size = gl.minimum(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + ((t % num_in_group) % group_size)
        pid_n = (t % num_in_group) // group_size
        return pid_m * BLOCK_M, pid_n * BLOCK_N

    @gluon.jit
    def _producer(a_desc, b_desc, a_smem, b_smem, ready, empty, M, N, K, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                  A_BOXES: gl.constexpr):  # fmt: skip
        """1 warp: every K-block of every tile of this CTA, in the consumers' order, into the ring."""
        WG_M: gl.constexpr = BLOCK_M // A_BOXES
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        k_tiles = gl.cdiv(K, BLOCK_K)
        nbytes: gl.constexpr = A_BOXES * a_desc.block_type.nbytes + b_desc.block_type.nbytes
        it = 0  # K-blocks loaded so far: ring slot and phase run on across tiles
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            off_m, off_n = _tile_offsets(t, num_pid_m, num_pid_n, BLOCK_M, BLOCK_N, GROUP_M)
            for ki in range(k_tiles):
                s = it % STAGES
                # a fresh barrier completes parity 1 at once: the first lap over the ring never waits
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), nbytes)
                k = ki * BLOCK_K
                for c in gl.static_range(A_BOXES):
                    tma.async_copy_global_to_shared(a_desc, [off_m + c * WG_M, k], ready.index(s),
                                                    a_smem.index(s * A_BOXES + c))  # fmt: skip
                tma.async_copy_global_to_shared(b_desc, [off_n, k], ready.index(s), b_smem.index(s))
                it += 1

    @gluon.jit
    def _release(bar):
        # every warp of the warpgroup is past its wgmma wait before one thread frees the stage
        gl.thread_barrier()
        mbarrier.arrive(bar)

    @gluon.jit
    def _epilogue(acc, c_desc, c_buf, C, SA, SB, BIAS, off_m, off_n, M, N, stride_cm, stride_sa, stride_sb,
                  WG_M: gl.constexpr, BLOCK_N: gl.constexpr, HAS_BIAS: gl.constexpr, OUT_INT32: gl.constexpr,
                  EVEN_N: gl.constexpr, EPI_TMA: gl.constexpr, acc_layout: gl.constexpr):  # fmt: skip
        """One warpgroup's (WG_M, BLOCK_N) int32 tile -> C: (acc * sa) * sb (+ bias) in fp32 like gemm._epilogue,
        or the raw int32. EPI_TMA: into c_buf and out by a TMA store (clipped at the edges by the hardware), so
        the warpgroup goes on to its next tile while the copy drains; else masked stores straight from the wgmma
        register layout with int64 offsets (unit column stride)."""
        rows = off_m + gl.arange(0, WG_M, layout=gl.SliceLayout(1, acc_layout))
        cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
        if OUT_INT32:
            val = acc
        else:
            # N % BLOCK_N == 0: plain loads (vectorized); else clamped ones rather than masked, so no per-column
            # predicates stay live (ragged N spilled with them). Rows / cols past the edge are never stored.
            if EVEN_N:
                cl = cols
            else:
                cl = gl.minimum(cols, N - 1)
            sa = gl.load(SA + gl.minimum(rows, M - 1) * stride_sa)
            sb = gl.load(SB + cl * stride_sb)
            c = acc.to(gl.float32) * gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0)
            if HAS_BIAS:
                c += gl.expand_dims(gl.load(BIAS + cl).to(gl.float32), 0)
            val = c.to(C.dtype.element_ty)
        if EPI_TMA:
            tma.store_wait(0)  # this warpgroup's previous TMA store has read c_buf (only its issuing thread knows)
            gl.thread_barrier()
            c_buf.store(val)
            fence_async_shared()  # generic-proxy writes -> visible to the TMA (async proxy)
            gl.thread_barrier()  # every warp's part is in c_buf before the store is issued
            tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_buf)
        else:
            mask = gl.expand_dims(rows < M, 1) & gl.expand_dims(cols < N, 0)
            ptrs = C + gl.expand_dims(rows.to(gl.int64) * stride_cm, 1) + gl.expand_dims(cols, 0)
            gl.store(ptrs, val, mask=mask)

    @gluon.jit
    def _consumer(a_smem, b_smem, ready, empty, turn, c_desc, c_smem, C, SA, SB, BIAS, M, N, K, stride_cm,
                  stride_sa, stride_sb, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                  GROUP_M: gl.constexpr, STAGES: gl.constexpr, A_BOXES: gl.constexpr, HAS_BIAS: gl.constexpr,
                  OUT_INT32: gl.constexpr, EVEN_N: gl.constexpr, EPI_TMA: gl.constexpr, WG: gl.constexpr):  # fmt: skip
        """One warpgroup. Cooperative (A_BOXES 2): rows [WG * BLOCK_M/2, +BLOCK_M/2) of every tile of the CTA.
        Ping-pong (A_BOXES 1): all rows of the CTA's tiles j with j % 2 == WG (the other warpgroup takes the
        rest), so the ring position of tile j is j * k_tiles. The main loops of the two then take turns
        (``turn`` barriers, as CUTLASS's ping-pong order barrier): a warpgroup waits on a ring stage only once
        every earlier K-block has been consumed, so the stage's ready barrier is never two phases behind
        (a parity wait would pass on the older phase), and one's epilogue runs during the other's main loop."""
        WG_M: gl.constexpr = BLOCK_M // A_BOXES
        # Triton's int8 wgmma lowering takes n <= 128 (its own matmul pass picks n128 for int8 too): a
        # 256-wide tile is two accumulators of 128 columns
        SUB_N: gl.constexpr = 128 if BLOCK_N > 128 else BLOCK_N
        N_SUB: gl.constexpr = BLOCK_N // SUB_N
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SUB_N, 32]
        )
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        k_tiles = gl.cdiv(K, BLOCK_K)
        nprog = gl.num_programs(0)
        if A_BOXES == 1:
            first = gl.program_id(0) + WG * nprog
            step = 2 * nprog
            row0 = 0
        else:
            first = gl.program_id(0)
            step = nprog
            row0 = WG * WG_M
        it = (first - gl.program_id(0)) // nprog * k_tiles  # ring position of this warpgroup's first tile
        skip = (step // nprog - 1) * k_tiles  # K-blocks of the other warpgroup's tile between two of ours
        zero = gl.zeros([WG_M, SUB_N], gl.int32, layout=acc_layout)
        c_buf = c_smem.index(WG)
        if A_BOXES == 1:
            if WG == 0:
                mbarrier.arrive(turn.index(0))  # the first main loop is warpgroup 0's
        jj = 0  # tiles done by this warpgroup
        for t in range(first, num_pid_m * num_pid_n, step):
            off_m, off_n = _tile_offsets(t, num_pid_m, num_pid_n, BLOCK_M, BLOCK_N, GROUP_M)
            if A_BOXES == 1:
                mbarrier.wait(turn.index(WG), jj & 1)
            if N_SUB == 1:
                acc = zero
                for ki in range(k_tiles):
                    s = it % STAGES
                    mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                    a = a_smem.index(s * A_BOXES + (WG % A_BOXES))
                    b = b_smem.index(s).permute((1, 0))
                    tok = warpgroup_mma(a, b, acc, is_async=True)
                    # keep one wgmma in flight: the one of the previous K-block has retired, free its stage
                    acc = warpgroup_mma_wait(1, deps=[tok, a, b])[0]
                    if ki > 0:
                        _release(empty.index((it - 1) % STAGES))
                    it += 1
                acc = warpgroup_mma_wait(0, deps=[acc])
                _release(empty.index((it - 1) % STAGES))
                if A_BOXES == 1:
                    mbarrier.arrive(turn.index(1 - WG))  # (after _release's barrier) the other's main loop
                # the producer is already streaming the next tile's K-blocks into the freed stages
                _epilogue(acc, c_desc, c_buf, C, SA, SB, BIAS, off_m + row0, off_n, M, N, stride_cm, stride_sa,
                          stride_sb, WG_M, SUB_N, HAS_BIAS, OUT_INT32, EVEN_N, EPI_TMA, acc_layout)  # fmt: skip
            else:
                # two (WG_M, BLOCK_N / 2) accumulators, one wgmma each per K-block: the epilogue then finishes
                # (and frees) one half before it loads the other half's scales and bias (no spills at BN 256)
                acc0 = zero
                acc1 = zero
                for ki in range(k_tiles):
                    s = it % STAGES
                    mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                    a = a_smem.index(s * A_BOXES + (WG % A_BOXES))
                    bs = b_smem.index(s)
                    b0 = bs.slice(0, SUB_N).permute((1, 0))
                    b1 = bs.slice(SUB_N, SUB_N).permute((1, 0))
                    tok0 = warpgroup_mma(a, b0, acc0, is_async=True)
                    tok1 = warpgroup_mma(a, b1, acc1, is_async=True)
                    # this K-block's two wgmmas stay in flight; the previous block's have retired
                    r = warpgroup_mma_wait(2, deps=[tok0, tok1, a, b0, b1])
                    acc0 = r[0]
                    acc1 = r[1]
                    if ki > 0:
                        _release(empty.index((it - 1) % STAGES))
                    it += 1
                r = warpgroup_mma_wait(0, deps=[acc0, acc1])
                _release(empty.index((it - 1) % STAGES))
                if A_BOXES == 1:
                    mbarrier.arrive(turn.index(1 - WG))
                _epilogue(r[0], c_desc, c_buf, C, SA, SB, BIAS, off_m + row0, off_n, M, N, stride_cm, stride_sa,
                          stride_sb, WG_M, SUB_N, HAS_BIAS, OUT_INT32, EVEN_N, EPI_TMA, acc_layout)  # fmt: skip
                _epilogue(r[1], c_desc, c_buf, C, SA, SB, BIAS, off_m + row0, off_n + SUB_N, M, N, stride_cm,
                          stride_sa, stride_sb, WG_M, SUB_N, HAS_BIAS, OUT_INT32, EVEN_N, EPI_TMA,
                          acc_layout)  # fmt: skip
            it += skip
            jj += 1
        if EPI_TMA:
            tma.store_wait(0)  # the last TMA store has completed before the warpgroup exits

    @gluon.jit
    def _int8_gemm_sm90_kernel(a_desc, b_desc, c_desc, C, SA, SB, BIAS, M, N, K, stride_cm, stride_sa, stride_sb,
                               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                               GROUP_M: gl.constexpr, STAGES: gl.constexpr, A_BOXES: gl.constexpr,
                               HAS_BIAS: gl.constexpr, OUT_INT32: gl.constexpr, EVEN_N: gl.constexpr,
                               EPI_TMA: gl.constexpr, CONS_REGS: gl.constexpr, PROD_REGS: gl.constexpr):  # fmt: skip
        """C (M, N) = dequant(A (M, K) @ B (N, K)^T). a_desc: A in (BLOCK_M / A_BOXES, BLOCK_K) boxes, b_desc:
        the weight in (BLOCK_N, BLOCK_K) boxes. A_BOXES 2: cooperative warpgroups, 1: ping-pong. c_desc: C in
        (BLOCK_M / A_BOXES, min(BLOCK_N, 128)) boxes with EPI_TMA (else any descriptor, unused)."""
        a_smem = gl.allocate_shared_memory(gl.int8, [STAGES * A_BOXES] + a_desc.block_type.shape, a_desc.layout)
        b_smem = gl.allocate_shared_memory(gl.int8, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # ping-pong only
        if EPI_TMA:
            c_smem = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)
        else:  # a stand-in that no partition touches
            c_smem = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            # cooperative: both warpgroups read every stage; ping-pong: only the tile's owner does
            mbarrier.init(empty.index(s), count=A_BOXES)
        # (partition arguments are spelled out: Gluon keeps constexprs only in literal argument tuples)
        gl.warp_specialize(
            [
                (_consumer, (a_smem, b_smem, ready, empty, turn, c_desc, c_smem, C, SA, SB, BIAS, M, N, K,
                             stride_cm, stride_sa, stride_sb, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES, A_BOXES,
                             HAS_BIAS, OUT_INT32, EVEN_N, EPI_TMA, 0)),
                (_consumer, (a_smem, b_smem, ready, empty, turn, c_desc, c_smem, C, SA, SB, BIAS, M, N, K,
                             stride_cm, stride_sa, stride_sb, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, STAGES, A_BOXES,
                             HAS_BIAS, OUT_INT32, EVEN_N, EPI_TMA, 1)),
                (_producer, (a_desc, b_desc, a_smem, b_smem, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
                             GROUP_M, STAGES, A_BOXES)),
            ],
            [4, 1],
            [CONS_REGS, PROD_REGS],
        )  # fmt: skip


def kernel_constexprs(c: dict, has_bias: bool, out_int32: bool, even_n: bool, epi_tma: bool) -> dict:
    """The kernel's constexpr arguments for resolved config keys c (see ``resolve``)."""
    return dict(
        BLOCK_M=c["SM90_BLOCK_M"],
        BLOCK_N=c["SM90_BLOCK_N"],
        BLOCK_K=c["SM90_BLOCK_K"],
        GROUP_M=c["SM90_GROUP_M"],
        STAGES=c["SM90_STAGES"],
        A_BOXES=1 if c["SM90_PINGPONG"] else 2,
        HAS_BIAS=bool(has_bias),
        OUT_INT32=bool(out_int32),
        EVEN_N=bool(even_n),
        EPI_TMA=bool(epi_tma),
        # 512 registers a thread slot over the three warpgroups (64K / 128 threads): the default
        # (first consumer) partition gets what the second consumer and the producer leave
        CONS_REGS=232,
        PROD_REGS=40,
    )


class _Plan:
    """Everything about one launch that the shapes, strides, dtypes and config pin: grid, constexprs,
    descriptor block shapes and layouts, and the direct-launch state (``_common/direct.py``)."""

    __slots__ = ("grid", "kw", "blocks", "layouts", "epi_tma", "dl")

    def __init__(self, A, Bnk, out, has_bias: bool, out_int32: bool, cfg: dict) -> None:
        M, N = A.shape[0], Bnk.shape[0]
        c = resolve(cfg)
        bm, bn, bk = c["SM90_BLOCK_M"], c["SM90_BLOCK_N"], c["SM90_BLOCK_K"]
        n_tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        sms = torch.cuda.get_device_properties(A.device).multi_processor_count
        self.grid = (max(1, min(n_tiles, sms)),)
        wg_m = bm if c["SM90_PINGPONG"] else bm // 2
        elt = out.element_size()
        # the TMA store needs a 16-byte aligned base and row stride, and its buffers must fit beside the ring
        self.epi_tma = bool(
            c["SM90_EPI_TMA"]
            and out.data_ptr() % 16 == 0
            and (out.stride(0) * elt) % 16 == 0
            and c["SM90_STAGES"] * stage_bytes(bm, bn, bk) + epi_bytes(c, elt) + 1024 <= SMEM_LIMIT
        )
        self.blocks = ([wg_m, bk], [bn, bk], [wg_m, min(bn, 128)])
        gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}.get(
            out.dtype, gl.int32
        )
        self.layouts = (
            gl.NVMMASharedLayout.get_default_for(self.blocks[0], gl.int8),
            gl.NVMMASharedLayout.get_default_for(self.blocks[1], gl.int8),
            gl.NVMMASharedLayout.get_default_for(self.blocks[2], gdt),
        )
        self.kw = dict(kernel_constexprs(c, has_bias, out_int32, N % bn == 0, self.epi_tma), num_warps=4)
        self.dl = direct.Direct()


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 1024


def launch(A, Bnk, sa, sb, bias, out, out_int32: bool, cfg: dict) -> None:
    """out (M, N, unit column stride) = dequant(A (M, K) @ Bnk (N, K)^T) on eligible operands (``eligible``).
    sa / sb: fp32 vectors (stride 0 for a scalar) or None with out_int32; bias: a unit-stride (N,) vector of
    any float dtype or None. cfg: a tuning entry's config; its SM90_* keys pick the kernel (``resolve``)."""
    M, K = A.shape
    N = Bnk.shape[0]
    if out.stride(1) != 1 and N > 1:
        raise ValueError("the SM90 int8 GEMM writes rows with unit column stride")
    key = (A.shape, A.stride(), Bnk.shape, Bnk.stride(), out.dtype, out.stride(0), out.data_ptr() % 16 == 0, A.device,
           None if sa is None else sa.stride(0), None if sb is None else sb.stride(0), bias is None,
           bool(out_int32), *(cfg.get(k) for k in _CFG_KEYS))  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(A, Bnk, out, bias is not None, out_int32, cfg)
    sa_t = out if sa is None else sa  # never dereferenced when the matching constexpr flag is off
    sb_t = out if sb is None else sb
    bias_t = out if bias is None else bias
    tail = (out, sa_t, sb_t, bias_t, M, N, K, out.stride(0),
            0 if sa is None else sa.stride(0), 0 if sb is None else sb.stride(0))  # fmt: skip
    (ba, bb, bc), (la, lb, lc) = plan.blocks, plan.layouts
    ash, ast, bsh, bst = [M, K], [A.stride(0), 1], [N, K], [Bnk.stride(0), 1]
    # without the TMA-store epilogue the kernel's c_desc is unused: A's descriptor stands in
    csh, cst = ([M, N], [out.stride(0), 1]) if plan.epi_tma else (ash, ast)

    def normal_args():
        da = TensorDescriptor(A, ash, ast, ba, la)
        dc = TensorDescriptor(out, csh, cst, bc, lc) if plan.epi_tma else da
        return (da, TensorDescriptor(Bnk, bsh, bst, bb, lb), dc, *tail)

    # the launcher only reads base/shape/strides/padding; blocks and layouts are compiled into the plan's kernel
    args = (
        direct.Desc(A, ash, ast),
        direct.Desc(Bnk, bsh, bst),
        direct.Desc(out if plan.epi_tma else A, csh, cst),
        *tail,
    )
    # pointer specialization the plan key does not pin (16-byte alignment) and the bias dtype
    align = (out.data_ptr() % 16, sa_t.data_ptr() % 16, sb_t.data_ptr() % 16, bias_t.data_ptr() % 16, bias_t.dtype)
    direct.launch(plan.dl, _int8_gemm_sm90_kernel, plan.grid, args, plan.kw, align, normal_args)
