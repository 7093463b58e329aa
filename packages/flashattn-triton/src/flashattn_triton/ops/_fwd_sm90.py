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
* persistent CTAs walk tiles with the next tile's Q in a second buffer (SM90_Q2), and O leaves through
  the tile's consumed Q buffer by one TMA store (SM90_OTMA) instead of scalar stores from registers.

Semantics match ``_attn_fwd_kernel`` exactly (base-2 online softmax, bottom-right causal, rows
that see no key give 0 / LSE -inf). K/V tiles past Nk are zero-filled by the rank-4 TMA
descriptors (per head, never the next head's rows) and masked to -inf in the scores.
Only dense (B, H, N, D) inputs with D in {64, 128}, fp16/bf16 and TMA-compatible strides take it, on Triton 3.6;
``eligible`` says so and the caller falls back to the portable kernel otherwise.
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

    # Gluon is experimental and its API moves between releases (3.9 dropped thread_barrier): the kernel is
    # written against, and measured with, Triton 3.6; other versions keep the portable kernel.
    HAS_GLUON = triton.__version__.startswith("3.6.")
except ImportError:  # pragma: no cover - exercised only on old Triton
    HAS_GLUON = False

HEAD_DIMS = (64, 128)
WG_M = 64  # query rows per consumer warpgroup (one m64 wgmma row block)


def eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """True when the SM90 kernel can run these (B, H, N, D) tensors: CUDA SM90, fp16/bf16, D in
    HEAD_DIMS, unit last stride, 16-byte aligned base and outer strides (TMA's rules)."""
    if not HAS_GLUON or q.device.type != "cuda" or q.dim() != 4:
        return False
    if capability(q.device) != (9, 0):
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] not in HEAD_DIMS:
        return False
    return all(t.dtype == q.dtype and _tma_ok(t) for t in (q, k, v))


if HAS_GLUON:
    _WG_M = gl.constexpr(WG_M)

    @gluon.jit
    def _tile(t, lpt_g, NUM_M, H, GROUP, Nq, Nk, NUM_CONS: gl.constexpr, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr):  # fmt: skip
        """Tile t -> (b, h, kv head, first row, unmasked key blocks, key blocks). Heads outermost so the CTAs
        running at once share K/V in L2; causal tiles of a head go longest rows first (tail balance).
        lpt_g > 0 (causal; divides B*H): heads in groups of lpt_g and, within a group, every head's longest
        row block before any shorter one, so the last tiles handed out are short ones (longest processing
        time first) while the K/V of only lpt_g heads is live in L2."""
        BLOCK_M: gl.constexpr = NUM_CONS * _WG_M
        pid_bh = t // NUM_M
        pid_m = t % NUM_M
        if CAUSAL:
            if lpt_g > 0:
                per_group = lpt_g * NUM_M
                r = t % per_group
                pid_bh = (t // per_group) * lpt_g + r % lpt_g
                pid_m = NUM_M - 1 - r // lpt_g
            else:
                pid_m = NUM_M - 1 - pid_m
        b = pid_bh // H
        h = pid_bh % H
        start_m = pid_m * BLOCK_M
        diag = Nk - Nq
        # key blocks [0, n_full) need no mask, [n_full, n_blocks) do (the split of _causal_ranges)
        full_k = Nk // BLOCK_N
        if CAUSAL:
            n_full = gl.minimum(gl.maximum((start_m + diag + 1) // BLOCK_N, 0), full_k)
            hi = gl.minimum(start_m + BLOCK_M + diag, Nk)
        else:
            n_full = full_k
            hi = Nk
        # at least one block so every consumer has a tile to pipeline (rows that see nothing stay 0 / -inf)
        n_blocks = gl.maximum(gl.maximum(gl.cdiv(hi, BLOCK_N), n_full), 1)
        return b, h, h // GROUP, start_m, n_full, n_blocks

    @gluon.jit
    def _producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty, v_empty,
                  n_tiles, lpt_g, NUM_M, H, GROUP, Nq, Nk, NUM_CONS: gl.constexpr, STAGES: gl.constexpr,
                  BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, QBUF: gl.constexpr, KSTAGES: gl.constexpr):  # fmt: skip
        it = 0  # key blocks loaded so far by this CTA: ring slot and phase run on across tiles
        tc = 0
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            b, h, hk, start_m, n_full, n_blocks = _tile(t, lpt_g, NUM_M, H, GROUP, Nq, Nk, NUM_CONS, BLOCK_N, CAUSAL)
            # a fresh barrier completes parity 1 at once, so first uses of q_empty / the ring never wait.
            # QBUF 2: tile t+1's Q goes to the other buffer right behind tile t's last K/V issue, so it is in
            # shared memory before the consumers finish tile t (QBUF 1: it waits for tile t's last QK^T)
            qb = tc % QBUF
            mbarrier.wait(q_empty.index(qb), ((tc // QBUF) & 1) ^ 1)
            mbarrier.expect(q_bar.index(qb), NUM_CONS * desc_q.block_type.nbytes)
            for c in gl.static_range(NUM_CONS):
                tma.async_copy_global_to_shared(
                    desc_q, [b, h, start_m + c * _WG_M, 0], q_bar.index(qb), q_smem.index(qb * NUM_CONS + c)
                )
            for i in range(n_blocks):
                s = it % STAGES
                ph = ((it // STAGES) & 1) ^ 1
                sk = it % KSTAGES  # the K ring may be shallower: K is freed right after its QK^T, V after its P V
                mbarrier.wait(k_empty.index(sk), ((it // KSTAGES) & 1) ^ 1)
                mbarrier.expect(k_bar.index(sk), desc_k.block_type.nbytes)
                tma.async_copy_global_to_shared(desc_k, [b, hk, i * BLOCK_N, 0], k_bar.index(sk), k_smem.index(sk))
                mbarrier.wait(v_empty.index(s), ph)
                mbarrier.expect(v_bar.index(s), desc_v.block_type.nbytes)
                tma.async_copy_global_to_shared(desc_v, [b, hk, i * BLOCK_N, 0], v_bar.index(s), v_smem.index(s))
                it += 1
            tc += 1

    @gluon.jit
    def _release(bar):
        # every warp of the warpgroup is past its wgmma wait before one thread frees the buffer
        gl.thread_barrier()
        mbarrier.arrive(bar)

    @gluon.jit
    def _turn_wait(turn, g, PP: gl.constexpr, WG: gl.constexpr):
        # ping-pong: the consumer warpgroups issue their wgmma groups in strict round-robin, so one
        # warpgroup's softmax runs while the next one's GEMMs keep the tensor cores busy (FA3's schedule).
        # A fresh barrier completes parity 1 at once: warpgroup 0 goes first.
        if PP:
            if WG == 0:
                mbarrier.wait(turn.index(WG), (g & 1) ^ 1)
            else:
                mbarrier.wait(turn.index(WG), g & 1)

    @gluon.jit
    def _turn_pass(turn, PP: gl.constexpr, WG: gl.constexpr, NUM_CONS: gl.constexpr):
        if PP:
            mbarrier.arrive(turn.index((WG + 1) % NUM_CONS))

    @gluon.jit
    def _softmax_step(s, m_i, l_i, row, kv0, seqlen_k, diag, qk_scale, MASKED: gl.constexpr, CAUSAL: gl.constexpr,
                      BLOCK_N: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr, P_DTYPE: gl.constexpr):  # fmt: skip
        """Online-softmax update for one score tile: (P as the P V operand, alpha, m_new, l_new), base 2."""
        if MASKED:
            if CAUSAL:
                # one compare per score against a compile-time column offset: the last key each row sees,
                # relative to this tile, is a per-row value. Materialised key indices spilled the
                # three-consumer kernel (304 bytes at 160 registers); this form measured 1-8% faster on the
                # H200 at D64/D128 causal (session 14). Non-causal keeps the old form: the new one compiled
                # a different, 3-7% slower steady-state loop at D64 there, although it never ran (N % 128 == 0).
                lim = gl.minimum(gl.zeros_like(row) + (seqlen_k - 1 - kv0), row + (diag - kv0))
                cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
                ok = gl.expand_dims(cols, 0) <= gl.expand_dims(lim, 1)
            else:
                cols = kv0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
                ok = gl.expand_dims(cols < seqlen_k, 0)
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
    def _consumer(q_smem, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty, v_empty, turn, O, LSE,
                  sob, soh, som, slb, slh, n_tiles, lpt_g, NUM_M, H, GROUP, Nq, Nk, qk_scale, desc_o,
                  HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  NUM_CONS: gl.constexpr, PP: gl.constexpr, WG: gl.constexpr, QBUF: gl.constexpr,
                  KSTAGES: gl.constexpr, OTMA: gl.constexpr, HALF: gl.constexpr):  # fmt: skip
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
        )
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        s_zero = gl.zeros([_WG_M, BLOCK_N], gl.float32, layout=s_layout)
        HALF_N: gl.constexpr = BLOCK_N // 2
        if HALF:  # the score tile of a half key block (see the tail below)
            h_layout: gl.constexpr = gl.NVMMADistributedLayout(
                version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF_N, 16]
            )
            h_zero = gl.zeros([_WG_M, HALF_N], gl.float32, layout=h_layout)
        diag = Nk - Nq
        full_k = Nk // BLOCK_N
        it = 0  # key blocks consumed so far: the producer's ring position
        tc = 0
        g = 0  # wgmma issue groups so far (ping-pong turns; n_blocks + 1 per tile in every warpgroup)
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            b, h, hk, start_m, n_full, n_blocks = _tile(t, lpt_g, NUM_M, H, GROUP, Nq, Nk, NUM_CONS, BLOCK_N, CAUSAL)
            row0 = start_m + WG * _WG_M
            row = row0 + gl.arange(0, _WG_M, layout=row_s)
            m_i = gl.full([_WG_M], float("-inf"), gl.float32, layout=row_s)
            l_i = gl.zeros([_WG_M], gl.float32, layout=row_s)
            acc = gl.zeros([_WG_M, HEAD_DIM], gl.float32, layout=o_layout)
            qb = tc % QBUF
            mbarrier.wait(q_bar.index(qb), (tc // QBUF) & 1)
            q = q_smem.index(qb * NUM_CONS + WG).reshape([_WG_M, HEAD_DIM])
            if HALF:
                # causal: this warpgroup's 64 rows see keys [0, hi_w), often fewer blocks than the tile's (the
                # three-consumer tile, Nk - Nq not a block multiple) and often only the first half of the last
                # one (BLOCK_N = 128 = the two-consumer tile: warpgroup 0 on the diagonal). It computes n_run
                # full blocks, then that half block by a BLOCK_N / 2 wide QK^T and P V, and only waits for and
                # releases the tile's remaining blocks (the other warpgroups need them). A half first block
                # keeps the full-width path (the prologue needs one full block).
                hi_w = gl.minimum(row0 + _WG_M + diag, Nk)
                nb_w = gl.maximum(gl.cdiv(hi_w, BLOCK_N), 1)
                half = (nb_w > 1) & (hi_w - (nb_w - 1) * BLOCK_N <= HALF_N)
                n_run = nb_w - half.to(gl.int32)
                n_fw = gl.minimum(gl.maximum((row0 + diag + 1) // BLOCK_N, 0), full_k)  # unmasked for all 64 rows
            else:
                n_run = n_blocks
                n_fw = n_full

            # prologue: S(0) and its softmax
            s0 = it % KSTAGES
            mbarrier.wait(k_bar.index(s0), (it // KSTAGES) & 1)
            k0 = k_smem.index(s0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
            _turn_wait(turn, g, PP, WG)
            s_tok = warpgroup_mma(q, k0, s_zero, use_acc=False, is_async=True)
            _turn_pass(turn, PP, WG, NUM_CONS)
            g += 1
            s_cur = warpgroup_mma_wait(0, deps=[s_tok, q, k0])[0]
            _release(k_empty.index(s0))
            if OTMA:
                # no wgmma is in flight here: the previous tile's O store has read its Q buffer (only the issuing
                # thread's wait counts; _release's barrier holds the others), so the producer may refill it
                tma.store_wait(0)
                if tc > 0:
                    _release(q_empty.index((tc - 1) % QBUF))
            if n_fw > 0:
                p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, row, 0, Nk, diag, qk_scale, False, CAUSAL,
                                                   BLOCK_N, s_layout, o_layout, dtype)  # fmt: skip
            else:
                p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, row, 0, Nk, diag, qk_scale, True, CAUSAL,
                                                   BLOCK_N, s_layout, o_layout, dtype)  # fmt: skip

            # steady state: issue S(i), then O += P(i-1) V(i-1); softmax(i) overlaps the P V wgmma
            for i in range(1, n_run):
                sc = (it + i) % KSTAGES
                sp = (it + i - 1) % STAGES
                mbarrier.wait(k_bar.index(sc), ((it + i) // KSTAGES) & 1)
                ki = k_smem.index(sc).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
                vp = v_smem.index(sp).reshape([BLOCK_N, HEAD_DIM])
                if PP:  # both GEMMs of the step in this warpgroup's turn
                    mbarrier.wait(v_bar.index(sp), ((it + i - 1) // STAGES) & 1)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                    _turn_wait(turn, g, PP, WG)
                    s_tok = warpgroup_mma(q, ki, s_zero, use_acc=False, is_async=True)
                    acc_tok = warpgroup_mma(p, vp, acc, is_async=True)
                    _turn_pass(turn, PP, WG, NUM_CONS)
                    g += 1
                else:  # S(i) first, before V(i-1) is waited for
                    s_tok = warpgroup_mma(q, ki, s_zero, use_acc=False, is_async=True)
                    mbarrier.wait(v_bar.index(sp), ((it + i - 1) // STAGES) & 1)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                    acc_tok = warpgroup_mma(p, vp, acc, is_async=True)
                s_cur = warpgroup_mma_wait(1, deps=[s_tok, q, ki])[0]
                _release(k_empty.index(sc))
                if i < n_fw:
                    p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, row, i * BLOCK_N, Nk, diag, qk_scale,
                                                       False, CAUSAL, BLOCK_N, s_layout, o_layout, dtype)  # fmt: skip
                else:
                    p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, row, i * BLOCK_N, Nk, diag, qk_scale,
                                                       True, CAUSAL, BLOCK_N, s_layout, o_layout, dtype)  # fmt: skip
                acc = warpgroup_mma_wait(0, deps=[acc_tok, vp])[0]
                _release(v_empty.index(sp))
            if HALF:
                if half:
                    # S of the half block under the last full block's P V, its softmax, then its own P V
                    j = n_run
                    sc = (it + j) % KSTAGES
                    sp = (it + j - 1) % STAGES
                    mbarrier.wait(k_bar.index(sc), ((it + j) // KSTAGES) & 1)
                    kh = k_smem.index(sc).reshape([BLOCK_N, HEAD_DIM]).slice(0, HALF_N).permute((1, 0))
                    vp = v_smem.index(sp).reshape([BLOCK_N, HEAD_DIM])
                    hs_tok = warpgroup_mma(q, kh, h_zero, use_acc=False, is_async=True)
                    mbarrier.wait(v_bar.index(sp), ((it + j - 1) // STAGES) & 1)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                    ha_tok = warpgroup_mma(p, vp, acc, is_async=True)
                    s_h = warpgroup_mma_wait(1, deps=[hs_tok, q, kh])[0]
                    _release(k_empty.index(sc))
                    # the row vectors' layout differs from the full tile's in name only (same rows per thread)
                    row_h: gl.constexpr = gl.SliceLayout(1, h_layout)
                    p_h, alpha_h, m_h, l_h = _softmax_step(s_h, gl.convert_layout(m_i, row_h), gl.convert_layout(l_i, row_h),
                                                         gl.convert_layout(row, row_h), j * BLOCK_N, Nk, diag, qk_scale,
                                                         True, CAUSAL, HALF_N, h_layout, o_layout, dtype)  # fmt: skip
                    m_i = gl.convert_layout(m_h, row_s)
                    l_i = gl.convert_layout(l_h, row_s)
                    acc = warpgroup_mma_wait(0, deps=[ha_tok, vp])[0]
                    _release(v_empty.index(sp))
                    sl = (it + j) % STAGES
                    mbarrier.wait(v_bar.index(sl), ((it + j) // STAGES) & 1)
                    vh = v_smem.index(sl).reshape([BLOCK_N, HEAD_DIM]).slice(0, HALF_N)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha_h, row_o), 1)
                    ha_tok = warpgroup_mma(p_h, vh, acc, is_async=True)
                    acc = warpgroup_mma_wait(0, deps=[ha_tok, vh])[0]
                    _release(v_empty.index(sl))
                else:
                    sl = (it + n_run - 1) % STAGES
                    mbarrier.wait(v_bar.index(sl), ((it + n_run - 1) // STAGES) & 1)
                    vl = v_smem.index(sl).reshape([BLOCK_N, HEAD_DIM])
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                    acc_tok = warpgroup_mma(p, vl, acc, is_async=True)
                    acc = warpgroup_mma_wait(0, deps=[acc_tok, vl])[0]
                    _release(v_empty.index(sl))
                # blocks only the other warpgroups see: wait for each load (so the producer's next expect on the
                # slot starts a fresh phase) and free it
                for j2 in range(n_run + half.to(gl.int32), n_blocks):
                    sk = (it + j2) % KSTAGES
                    mbarrier.wait(k_bar.index(sk), ((it + j2) // KSTAGES) & 1)
                    _release(k_empty.index(sk))
                    sv = (it + j2) % STAGES
                    mbarrier.wait(v_bar.index(sv), ((it + j2) // STAGES) & 1)
                    _release(v_empty.index(sv))
                if not OTMA:
                    _release(q_empty.index(qb))
            else:
                if not OTMA:  # every S wgmma of this tile is done: the producer may load the next tile's Q
                    _release(q_empty.index(qb))

                # epilogue: the last P V, then O and LSE (the producer is already streaming the next tile)
                sl = (it + n_blocks - 1) % STAGES
                mbarrier.wait(v_bar.index(sl), ((it + n_blocks - 1) // STAGES) & 1)
                vl = v_smem.index(sl).reshape([BLOCK_N, HEAD_DIM])
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                _turn_wait(turn, g, PP, WG)
                acc_tok = warpgroup_mma(p, vl, acc, is_async=True)
                _turn_pass(turn, PP, WG, NUM_CONS)
                g += 1
                acc = warpgroup_mma_wait(0, deps=[acc_tok, vl])[0]
                _release(v_empty.index(sl))
            it += n_blocks
            tc += 1

            l_safe = gl.where(l_i == 0.0, 1.0, l_i)
            out = acc / gl.expand_dims(gl.convert_layout(l_safe, row_o), 1)
            b64 = b.to(gl.int64)
            if OTMA:
                # O goes out through this tile's Q buffer (free: every S of the tile is done) and one TMA store,
                # which clips rows past Nq per head; the next tile's prologue frees the buffer for the producer
                q.store(out.to(dtype))
                fence_async_shared()  # generic-proxy writes -> visible to the TMA (async proxy)
                gl.thread_barrier()  # every warp's rows are in the buffer before the store is issued
                tma.async_copy_shared_to_global(desc_o, [b, h, row0, 0], q_smem.index(qb * NUM_CONS + WG))
            else:
                rows_o = row0 + gl.arange(0, _WG_M, layout=row_o)
                cols_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
                offs = gl.expand_dims(rows_o.to(gl.int64) * som, 1) + gl.expand_dims(cols_o, 0)
                o_base = O + b64 * sob + h.to(gl.int64) * soh
                gl.store(o_base + offs, out.to(dtype), mask=gl.expand_dims(rows_o < Nq, 1))
            lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
            gl.store(LSE + b64 * slb + h.to(gl.int64) * slh + row, lse, mask=row < Nq)
        if OTMA:
            tma.store_wait(0)  # the last O store has read shared memory before the warpgroup exits

    @gluon.jit
    def _attn_fwd_sm90_kernel(desc_q, desc_k, desc_v, O, LSE, sob, soh, som, slb, slh, H, GROUP, Nq, Nk, NUM_M,
                              n_tiles, lpt_g, qk_scale, desc_o, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                              STAGES: gl.constexpr, CAUSAL: gl.constexpr, NUM_CONS: gl.constexpr,
                              CONS_REGS: gl.constexpr, PP: gl.constexpr, QBUF: gl.constexpr,
                              KSTAGES: gl.constexpr, OTMA: gl.constexpr, HALF: gl.constexpr = False):  # fmt: skip
        # persistent: each CTA walks tiles pid, pid + grid, ...; the producer runs ahead into the next tile
        dtype: gl.constexpr = desc_q.dtype
        q_smem = gl.allocate_shared_memory(dtype, [QBUF * NUM_CONS] + desc_q.block_type.shape, desc_q.layout)
        k_smem = gl.allocate_shared_memory(dtype, [KSTAGES] + desc_k.block_type.shape, desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [QBUF, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [QBUF, 1], mbarrier.MBarrierLayout())
        k_bar = gl.allocate_shared_memory(gl.int64, [KSTAGES, 1], mbarrier.MBarrierLayout())
        v_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [KSTAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [NUM_CONS, 1], mbarrier.MBarrierLayout())
        for w in gl.static_range(NUM_CONS):
            mbarrier.init(turn.index(w), count=1)
        for qb in gl.static_range(QBUF):
            mbarrier.init(q_bar.index(qb), count=1)
            mbarrier.init(q_empty.index(qb), count=NUM_CONS)  # one arrive per consumer warpgroup
        if KSTAGES == STAGES:  # the shipped kernels' init order: their SASS stays the one measured on the H200
            for s in gl.static_range(STAGES):
                mbarrier.init(k_bar.index(s), count=1)
                mbarrier.init(v_bar.index(s), count=1)
                mbarrier.init(k_empty.index(s), count=NUM_CONS)
                mbarrier.init(v_empty.index(s), count=NUM_CONS)
        else:
            for s in gl.static_range(KSTAGES):
                mbarrier.init(k_bar.index(s), count=1)
                mbarrier.init(k_empty.index(s), count=NUM_CONS)
            for s in gl.static_range(STAGES):
                mbarrier.init(v_bar.index(s), count=1)
                mbarrier.init(v_empty.index(s), count=NUM_CONS)
        # (partition arguments are spelled out: Gluon keeps constexprs only in literal argument tuples)
        if NUM_CONS == 2:
            gl.warp_specialize(
                [
                    (_consumer, (q_smem, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty, v_empty, turn, O,
                                 LSE, sob, soh, som, slb, slh, n_tiles, lpt_g, NUM_M, H, GROUP, Nq, Nk, qk_scale,
                                 desc_o, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, NUM_CONS, PP, 0, QBUF, KSTAGES, OTMA, HALF)),
                    (_consumer, (q_smem, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty, v_empty, turn, O,
                                 LSE, sob, soh, som, slb, slh, n_tiles, lpt_g, NUM_M, H, GROUP, Nq, Nk, qk_scale,
                                 desc_o, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, NUM_CONS, PP, 1, QBUF, KSTAGES, OTMA, HALF)),
                    (_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar,
                                 k_empty, v_empty, n_tiles, lpt_g, NUM_M, H, GROUP, Nq, Nk, NUM_CONS, STAGES, BLOCK_N,
                                 CAUSAL, QBUF, KSTAGES)),
                ],
                [4, 1],
                [CONS_REGS, 24],
            )  # fmt: skip
        else:
            gl.warp_specialize(
                [
                    (_consumer, (q_smem, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty, v_empty, turn, O,
                                 LSE, sob, soh, som, slb, slh, n_tiles, lpt_g, NUM_M, H, GROUP, Nq, Nk, qk_scale,
                                 desc_o, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, NUM_CONS, PP, 0, QBUF, KSTAGES, OTMA, HALF)),
                    (_consumer, (q_smem, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty, v_empty, turn, O,
                                 LSE, sob, soh, som, slb, slh, n_tiles, lpt_g, NUM_M, H, GROUP, Nq, Nk, qk_scale,
                                 desc_o, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, NUM_CONS, PP, 1, QBUF, KSTAGES, OTMA, HALF)),
                    (_consumer, (q_smem, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar, k_empty, v_empty, turn, O,
                                 LSE, sob, soh, som, slb, slh, n_tiles, lpt_g, NUM_M, H, GROUP, Nq, Nk, qk_scale,
                                 desc_o, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, NUM_CONS, PP, 2, QBUF, KSTAGES, OTMA, HALF)),
                    (_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, q_empty, k_bar, v_bar,
                                 k_empty, v_empty, n_tiles, lpt_g, NUM_M, H, GROUP, Nq, Nk, NUM_CONS, STAGES, BLOCK_N,
                                 CAUSAL, QBUF, KSTAGES)),
                ],
                [4, 4, 1],
                [CONS_REGS, CONS_REGS, 24],
            )  # fmt: skip


class _Plan:
    """Everything about one launch that the shapes, strides, dtype and config pin: grid, constexprs,
    descriptor block shapes and layouts, and the direct-launch state (``_common/direct.py``). Through
    ``kernel[grid]`` a call of this kernel cost more host time than a 1k-token forward's GPU time
    (session 5: >= 0.35 ms per call in the eager benchmark vs 0.21-0.31 ms of kernel)."""

    __slots__ = ("grid", "kw", "blocks", "layouts", "ints", "dl")

    def __init__(self, q, k, out, causal: bool, cfg: dict) -> None:
        B, H, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        bn = cfg.get("SM90_BLOCK_N", 128)
        cons = cfg.get("SM90_CONS", 2)
        num_m = triton.cdiv(Nq, cons * WG_M)
        n_tiles = num_m * B * H
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        self.grid = (min(n_tiles, sms) if cfg.get("SM90_PERSIST", 1) else n_tiles,)
        self.ints = (H, H // Hkv, Nq, Nk, num_m, n_tiles, _lpt_group(B * H, cfg.get("SM90_LPT", 0)) if causal else 0)
        gdt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
        self.blocks = ([1, 1, WG_M, D], [1, 1, bn, D], [1, 1, bn, D])
        self.layouts = tuple(gl.NVMMASharedLayout.get_default_for(b, gdt) for b in self.blocks)
        self.kw = dict(
            HEAD_DIM=D,
            BLOCK_N=bn,
            STAGES=cfg.get("SM90_STAGES", 3),
            CAUSAL=bool(causal),
            NUM_CONS=cons,
            # 512 registers per thread slot across the warpgroups; the default partition takes what is left
            CONS_REGS=240 if cons == 2 else 160,
            PP=bool(cfg.get("SM90_PP", 0)),
            QBUF=2 if cfg.get("SM90_Q2", 0) else 1,
            KSTAGES=cfg.get("SM90_KSTAGES", cfg.get("SM90_STAGES", 3)),
            # the O store through the consumed Q buffer needs the second one (the producer refills a buffer only
            # after the next tile's prologue) and TMA-legal strides for out; otherwise the register stores
            OTMA=bool(cfg.get("SM90_OTMA", 0)) and _tma_ok(out),
            # causal only: each warpgroup runs just the key blocks its own rows see, the last one at half width
            HALF=bool(cfg.get("SM90_HALF", 0)) and bool(causal),
            num_warps=4,
        )
        if self.kw["OTMA"] and self.kw["QBUF"] != 2:
            raise ValueError("SM90_OTMA needs SM90_Q2: with one Q buffer the next tile's Q would wait for this O store")
        if self.kw["HALF"] and self.kw["PP"]:
            raise ValueError("SM90_HALF does not combine with SM90_PP: the warpgroups' wgmma turns would differ")
        self.dl = direct.Direct()


def _tma_ok(t: torch.Tensor) -> bool:
    """TMA's rules for a (B, H, N, D) tensor: unit last stride, 16-byte aligned base and outer strides."""
    return (
        t.stride(3) == 1 and t.data_ptr() % 16 == 0 and all((st * t.element_size()) % 16 == 0 for st in t.stride()[:3])
    )


def _lpt_group(bh: int, want: int) -> int:
    """The largest head-group size <= want that divides bh (0: plain head-major order)."""
    g = min(int(want), bh)
    while g > 1 and bh % g:
        g -= 1
    return g if want else 0


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 1024
_CFG_KEYS = (
    "SM90_BLOCK_N",
    "SM90_CONS",
    "SM90_STAGES",
    "SM90_PERSIST",
    "SM90_LPT",
    "SM90_PP",
    "SM90_Q2",
    "SM90_KSTAGES",
    "SM90_OTMA",
    "SM90_HALF",
)


def launch(q, k, v, out, lse, causal: bool, sm_scale: float, cfg: dict) -> None:
    """Run the SM90 forward on eligible (B, H, N, D) tensors into ``out`` (q's layout) and ``lse`` (B, H, Nq).
    Config keys (the fwd entries of tuning.json): SM90_BLOCK_N (key tile, 64 or 128), SM90_STAGES (K/V ring),
    SM90_CONS (consumer warpgroups of 64 query rows: 2, or 3 with a smaller register budget each), SM90_PERSIST
    (1: one CTA per SM walking tiles, the producer running ahead into the next tile; 0: one CTA per tile, which
    the hardware hands out dynamically -- better balanced for causal tiles of unequal cost), SM90_LPT (causal:
    head groups of this size, longest row blocks of a group first; see ``_tile``), SM90_PP (1: the consumer
    warpgroups issue their wgmma in round-robin turns), SM90_Q2 (1: two Q buffers, so the next tile's Q is loaded
    while this tile runs; at D128 only with SM90_KSTAGES 2), SM90_KSTAGES (K ring depth, default SM90_STAGES: K is
    released after its QK^T, V only after its P V, so K can do with fewer slots), SM90_OTMA (1, with SM90_Q2: O is
    staged in the tile's consumed Q buffer and written by one TMA store instead of 32-64 register stores a thread),
    SM90_HALF (1, causal, not with SM90_PP: a consumer warpgroup skips the key blocks none of its rows see and runs a
    last block its rows see only the first half of at half width; ``_consumer``)."""
    key = (q.shape, k.shape, q.stride(), k.stride(), v.stride(), out.stride(), out.data_ptr() % 16 == 0,
           lse.stride(), q.dtype, q.device, bool(causal), *(cfg.get(c) for c in _CFG_KEYS))  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:  # e.g. a server seeing every sequence length: bounded, rebuilt on demand
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(q, k, out, causal, cfg)
    qs, ks, vs = list(q.shape), list(k.shape), list(v.shape)
    qst, kst, vst = list(q.stride()), list(k.stride()), list(v.stride())
    so, sl = out.stride(), lse.stride()
    tail = (out, lse, so[0], so[1], so[2], sl[0], sl[1], *plan.ints, sm_scale * 1.4426950408889634)
    bq, bk, bv = plan.blocks
    lq, lk, lv = plan.layouts

    otma = plan.kw["OTMA"]  # without it desc_o is never read: q's descriptor stands in for it

    def normal_args():
        dq = TensorDescriptor(q, qs, qst, bq, lq)
        do = TensorDescriptor(out, list(out.shape), list(so), bq, lq) if otma else dq
        return (dq, TensorDescriptor(k, ks, kst, bk, lk), TensorDescriptor(v, vs, vst, bv, lv), *tail, do)

    # the launcher only reads base/shape/strides/padding; blocks and layouts are compiled into the plan's kernel
    dq = direct.Desc(q, qs, qst)
    do = direct.Desc(out, list(out.shape), list(so)) if otma else dq
    args = (dq, direct.Desc(k, ks, kst), direct.Desc(v, vs, vst), *tail, do)
    align = (out.data_ptr() % 16 == 0, lse.data_ptr() % 16 == 0)
    direct.launch(plan.dl, _attn_fwd_sm90_kernel, plan.grid, args, plan.kw, align, normal_args)
