"""Hopper (SM90) forward kernel of the flash_attn op, written in Gluon (Triton's explicit-layout dialect).

Why a second forward: on the H200 the portable ``_attn_fwd_kernel`` tops out near 0.77x cuDNN at D128.
Its cp.async loads end every iteration with a CTA-wide barrier, so both warpgroups run their
softmax at the same time while the tensor cores idle, and inside a warpgroup the next QK^T cannot
be issued before the softmax (Triton's pipeliner waits on it). This kernel is organised as FA3:

* a 1-warp producer partition streams K and V tiles with TMA into a ring of STAGES buffers
  (separate ready barriers for K and V, one "empty" barrier per stage);
* two consumer partitions (4 warps = one warpgroup each) own 64 query rows apiece and sync with the
  producer only through mbarriers, so they drift apart and one's softmax overlaps the other's MMAs;
* inside a consumer, S(j+1) = Q K(j+1)^T is issued asynchronously before O += P(j) V(j), and the
  softmax of tile j+1 runs while the P V wgmma is in flight (FA3's intra-warpgroup pipelining).

Semantics match ``_attn_fwd_kernel`` exactly (base-2 online softmax, bottom-right causal, rows
that see no key give 0 / LSE -inf). K/V tiles past Nk are zero-filled by the rank-4 TMA
descriptors (per head, never the next head's rows) and masked to -inf in the scores.
Only dense (B, H, N, D) inputs with D in {64, 128}, fp16/bf16 and TMA-compatible strides take it;
``eligible`` says so and the caller falls back to the portable kernel otherwise.
"""

from __future__ import annotations

import torch

try:  # Gluon ships with Triton >= 3.5; without it this kernel is simply never chosen
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = True
except ImportError:  # pragma: no cover - exercised only on old Triton
    HAS_GLUON = False

HEAD_DIMS = (64, 128)
WG_M = 64  # query rows per consumer warpgroup (one m64 wgmma row block)


def eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """True when the SM90 kernel can run these (B, H, N, D) tensors: CUDA SM90, fp16/bf16, D in
    HEAD_DIMS, unit last stride, 16-byte aligned base and outer strides (TMA's rules)."""
    if not HAS_GLUON or q.device.type != "cuda" or q.dim() != 4:
        return False
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] not in HEAD_DIMS:
        return False
    for t in (q, k, v):
        if t.dtype != q.dtype or t.stride(3) != 1 or t.data_ptr() % 16:
            return False
        if any((st * t.element_size()) % 16 for st in t.stride()[:3]):
            return False
    return True


if HAS_GLUON:
    _WG_M = gl.constexpr(WG_M)

    @gluon.jit
    def _producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, empty_bar,
                  b, h, hk, start_m, n_blocks, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):  # fmt: skip
        # both consumers' Q tiles land on one barrier
        mbarrier.expect(q_bar, 2 * desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [b, h, start_m, 0], q_bar, q_smem.index(0))
        tma.async_copy_global_to_shared(desc_q, [b, h, start_m + _WG_M, 0], q_bar, q_smem.index(1))
        for i in range(n_blocks):
            s = i % STAGES
            # a fresh barrier completes parity 1 at once, so the first pass over the ring never waits
            mbarrier.wait(empty_bar.index(s), ((i // STAGES) & 1) ^ 1)
            mbarrier.expect(k_bar.index(s), desc_k.block_type.nbytes)
            tma.async_copy_global_to_shared(desc_k, [b, hk, i * BLOCK_N, 0], k_bar.index(s), k_smem.index(s))
            mbarrier.expect(v_bar.index(s), desc_v.block_type.nbytes)
            tma.async_copy_global_to_shared(desc_v, [b, hk, i * BLOCK_N, 0], v_bar.index(s), v_smem.index(s))

    @gluon.jit
    def _softmax_step(s, m_i, l_i, row, kv0, seqlen_k, diag, qk_scale, MASKED: gl.constexpr, CAUSAL: gl.constexpr,
                      BLOCK_N: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr, P_DTYPE: gl.constexpr):  # fmt: skip
        """Online-softmax update for one score tile: (P as the P V operand, alpha, m_new, l_new), base 2."""
        if MASKED:
            cols = kv0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            ok = gl.expand_dims(cols < seqlen_k, 0)
            if CAUSAL:
                ok = ok & (gl.expand_dims(cols, 0) <= gl.expand_dims(row + diag, 1))
            s = gl.where(ok, s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 1))
            # rows with nothing visible yet keep m = -inf; shift by 0 so exp2 gives 0, not NaN
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            p = gl.exp2(s - gl.expand_dims(m_safe, 1))
            alpha = gl.exp2(m_i - m_safe)
        else:
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
            alpha = gl.exp2(m_i - m_new)
        l_new = l_i * alpha + gl.sum(p, 1)
        # P goes to the P V wgmma straight from registers: the accumulator layout of S is the A-operand one
        p_op = gl.convert_layout(p.to(P_DTYPE), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
        return p_op, alpha, m_new, l_new

    @gluon.jit
    def _consumer(q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, empty_bar, o_base, som, lse_base,
                  row0, seqlen_q, seqlen_k, diag, n_full, n_blocks, qk_scale,
                  HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  WG: gl.constexpr):  # fmt: skip
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        q = q_smem.index(WG).reshape([_WG_M, HEAD_DIM])
        row = row0 + gl.arange(0, _WG_M, layout=row_s)
        m_i = gl.full([_WG_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([_WG_M], gl.float32, layout=row_s)
        acc = gl.zeros([_WG_M, HEAD_DIM], gl.float32, layout=o_layout)
        s_zero = gl.zeros([_WG_M, BLOCK_N], gl.float32, layout=s_layout)
        mbarrier.wait(q_bar, 0)

        # prologue: S(0) and its softmax
        mbarrier.wait(k_bar.index(0), 0)
        k0 = k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s_tok = warpgroup_mma(q, k0, s_zero, use_acc=False, is_async=True)
        s_cur = warpgroup_mma_wait(0, deps=[s_tok, q, k0])[0]
        if n_full > 0:
            p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, row, 0, seqlen_k, diag, qk_scale, False, CAUSAL,
                                               BLOCK_N, s_layout, o_layout, dtype)  # fmt: skip
        else:
            p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, row, 0, seqlen_k, diag, qk_scale, True, CAUSAL,
                                               BLOCK_N, s_layout, o_layout, dtype)  # fmt: skip

        # steady state: issue S(i), then O += P(i-1) V(i-1); softmax(i) overlaps the P V wgmma
        for i in range(1, n_blocks):
            s = i % STAGES
            sp = (i - 1) % STAGES
            mbarrier.wait(k_bar.index(s), (i // STAGES) & 1)
            ki = k_smem.index(s).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
            s_tok = warpgroup_mma(q, ki, s_zero, use_acc=False, is_async=True)
            mbarrier.wait(v_bar.index(sp), ((i - 1) // STAGES) & 1)
            vp = v_smem.index(sp).reshape([BLOCK_N, HEAD_DIM])
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            acc_tok = warpgroup_mma(p, vp, acc, is_async=True)
            s_cur = warpgroup_mma_wait(1, deps=[s_tok, q, ki])[0]
            if i < n_full:
                p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, row, i * BLOCK_N, seqlen_k, diag, qk_scale,
                                                   False, CAUSAL, BLOCK_N, s_layout, o_layout, dtype)  # fmt: skip
            else:
                p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, row, i * BLOCK_N, seqlen_k, diag, qk_scale,
                                                   True, CAUSAL, BLOCK_N, s_layout, o_layout, dtype)  # fmt: skip
            acc = warpgroup_mma_wait(0, deps=[acc_tok, vp])[0]
            # all four warps are past their waits before one thread frees the stage for the producer
            gl.thread_barrier()
            mbarrier.arrive(empty_bar.index(sp))

        # epilogue: the last P V
        sl = (n_blocks - 1) % STAGES
        mbarrier.wait(v_bar.index(sl), ((n_blocks - 1) // STAGES) & 1)
        vl = v_smem.index(sl).reshape([BLOCK_N, HEAD_DIM])
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        acc_tok = warpgroup_mma(p, vl, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc_tok, vl])[0]

        l_safe = gl.where(l_i == 0.0, 1.0, l_i)
        out = acc / gl.expand_dims(gl.convert_layout(l_safe, row_o), 1)
        rows_o = row0 + gl.arange(0, _WG_M, layout=row_o)
        cols_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        offs = gl.expand_dims(rows_o.to(gl.int64) * som, 1) + gl.expand_dims(cols_o, 0)
        gl.store(o_base + offs, out.to(dtype), mask=gl.expand_dims(rows_o < seqlen_q, 1))
        lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
        gl.store(lse_base + row, lse, mask=row < seqlen_q)

    @gluon.jit
    def _attn_fwd_sm90_kernel(desc_q, desc_k, desc_v, O, LSE, sob, soh, som, slb, slh, H, GROUP, Nq, Nk, NUM_M,
                              qk_scale, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                              CAUSAL: gl.constexpr):  # fmt: skip
        BLOCK_M: gl.constexpr = 2 * _WG_M
        pid = gl.program_id(0)
        pid_bh = pid // NUM_M
        pid_m = pid % NUM_M
        if CAUSAL:
            pid_m = NUM_M - 1 - pid_m  # longest rows first: better tail balance
        b = pid_bh // H
        h = pid_bh % H
        hk = h // GROUP
        start_m = pid_m * BLOCK_M
        diag = Nk - Nq
        # key blocks [0, n_full) need no mask, [n_full, n_blocks) do (same split as _causal_ranges)
        full_k = Nk // BLOCK_N
        if CAUSAL:
            n_full = gl.minimum(gl.maximum((start_m + diag + 1) // BLOCK_N, 0), full_k)
            hi = gl.minimum(start_m + BLOCK_M + diag, Nk)
        else:
            n_full = full_k
            hi = Nk
        # at least one block so every consumer has a tile to pipeline (rows that see nothing stay 0 / -inf)
        n_blocks = gl.maximum(gl.maximum(gl.cdiv(hi, BLOCK_N), n_full), 1)

        dtype: gl.constexpr = desc_q.dtype
        q_smem = gl.allocate_shared_memory(dtype, [2] + desc_q.block_type.shape, desc_q.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(k_bar.index(s), count=1)
            mbarrier.init(v_bar.index(s), count=1)
            mbarrier.init(empty_bar.index(s), count=2)  # one arrive per consumer warpgroup

        b64 = b.to(gl.int64)
        o_base = O + b64 * sob + h.to(gl.int64) * soh
        lse_base = LSE + b64 * slb + h.to(gl.int64) * slh
        gl.warp_specialize(
            [
                (_consumer, (q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, empty_bar, o_base, som, lse_base, start_m,
                             Nq, Nk, diag, n_full, n_blocks, qk_scale, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, 0)),
                (_consumer, (q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, empty_bar, o_base, som, lse_base,
                             start_m + _WG_M, Nq, Nk, diag, n_full, n_blocks, qk_scale, HEAD_DIM, BLOCK_N, STAGES,
                             CAUSAL, 1)),
                (_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, empty_bar,
                             b, h, hk, start_m, n_blocks, STAGES, BLOCK_N)),
            ],
            [4, 1],
            [240, 24],
        )  # fmt: skip


def _desc(t: torch.Tensor, rows: int):
    block = [1, 1, rows, t.shape[-1]]
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float16 if t.dtype == torch.float16 else gl.bfloat16)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def launch(q, k, v, out, lse, causal: bool, sm_scale: float, cfg: dict) -> None:
    """Run the SM90 forward on eligible (B, H, N, D) tensors into ``out`` (q's layout) and ``lse`` (B, H, Nq).
    Config keys (the fwd entries of tuning.json): SM90_BLOCK_N (key tile, 64 or 128), SM90_STAGES (K/V ring)."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    bn = cfg.get("SM90_BLOCK_N", 128)
    num_m = (Nq + 2 * WG_M - 1) // (2 * WG_M)
    _attn_fwd_sm90_kernel[(num_m * B * H,)](
        _desc(q, WG_M),
        _desc(k, bn),
        _desc(v, bn),
        out,
        lse,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        lse.stride(0),
        lse.stride(1),
        H,
        H // Hkv,
        Nq,
        Nk,
        num_m,
        sm_scale * 1.4426950408889634,
        HEAD_DIM=D,
        BLOCK_N=bn,
        STAGES=cfg.get("SM90_STAGES", 2),
        CAUSAL=bool(causal),
        num_warps=4,
    )
