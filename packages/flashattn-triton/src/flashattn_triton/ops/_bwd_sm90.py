"""Hopper (SM90) dK/dV kernel of the flash_attn backward, written in Gluon (experimental, ``"SM90_DKDV": 1``).

Why: the portable ``_bwd_kernel``'s dK/dV program issues its four GEMMs per query tile from one instruction stream
and waits for each wgmma group (Nsight Compute, session 17, N = 16k causal: 54% SM throughput, 255 registers,
spills, the largest stall class the wgmma waits), so most likely its tensor pipe idles while the exponentials
and dS run.
This kernel is organised as FA3's backward:

* a 1-warp producer partition loads the CTA's 128-key K/V block once and streams the (Q, dO) tiles of every query
  head of the GQA group through a ring of STAGES buffers with TMA (mbarrier "ready" / "empty" pairs);
* two consumer partitions (one warpgroup each) own 64 keys of the block apiece and keep their dK, dV accumulators
  in registers; per query tile a warpgroup issues S^T = K Q^T and dP^T = V dO^T, forms P^T and dS^T, and adds
  P^T dO into dV and dS^T Q into dK, the P / dS operands straight from registers. The two warpgroups drift apart,
  so one's exponentials overlap the other's GEMMs.

dQ stays with the portable dQ program (PART 2). Semantics match ``_bwd_dkdv_program`` (base-2 exponentials of
the scaled scores minus LSE, bottom-right causal, rows that saw no key contribute nothing). Dense (B, H, N, D)
fp16/bf16 inputs with D in {64, 128} and TMA-legal strides only; ``eligible`` says so.
"""

from __future__ import annotations

import torch
import triton

from . import _fwd_sm90

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = triton.__version__.startswith("3.6.")  # written against and measured with Triton 3.6
except ImportError:  # pragma: no cover - old Triton
    HAS_GLUON = False

HEAD_DIMS = _fwd_sm90.HEAD_DIMS
WG_N = 64  # keys per consumer warpgroup
BLOCK_M = 64  # query rows per streamed tile


def eligible(q, k, v, do) -> bool:
    """The forward kernel's rules (SM90, fp16/bf16, D in HEAD_DIMS, TMA-legal q/k/v), and the same for dO."""
    return HAS_GLUON and _fwd_sm90.eligible(q, k, v) and do.dtype == q.dtype and _fwd_sm90._tma_ok(do)


if HAS_GLUON:
    _WG_N = gl.constexpr(WG_N)
    _BM = gl.constexpr(BLOCK_M)

    @gluon.jit
    def _range(pid, NUM_N, Hkv, Nq, Nk, CAUSAL: gl.constexpr):
        """Program -> (b, kv head, first key, first query tile row, first unmasked tile row, end row)."""
        BLOCK_N: gl.constexpr = 2 * _WG_N
        pid_bk = pid // NUM_N
        pid_n = pid % NUM_N
        b = pid_bk // Hkv
        hk = pid_bk % Hkv
        start_n = pid_n * BLOCK_N
        diag = Nk - Nq
        if CAUSAL:
            # the first query row that sees key start_n is start_n - diag; rows from mid on see the whole block
            lo = gl.maximum(((start_n - diag) // _BM) * _BM, 0)
            mid = gl.cdiv(start_n + BLOCK_N - 1 - diag, _BM) * _BM
            mid = gl.minimum(gl.maximum(mid, lo), gl.cdiv(Nq, _BM) * _BM)
        else:
            lo = start_n * 0
            mid = lo
        hi = gl.cdiv(Nq, _BM) * _BM
        return b, hk, start_n, lo, mid, hi

    @gluon.jit
    def _producer(desc_q, desc_k, desc_v, desc_do, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty,
                  NUM_N, Hkv, GROUP, Nq, Nk, STAGES: gl.constexpr, CAUSAL: gl.constexpr):  # fmt: skip
        b, hk, start_n, lo, mid, hi = _range(gl.program_id(0), NUM_N, Hkv, Nq, Nk, CAUSAL)
        mbarrier.expect(kv_bar, 2 * (desc_k.block_type.nbytes + desc_v.block_type.nbytes))
        for w in gl.static_range(2):
            tma.async_copy_global_to_shared(desc_k, [b, hk, start_n + w * _WG_N, 0], kv_bar, k_smem.index(w))
            tma.async_copy_global_to_shared(desc_v, [b, hk, start_n + w * _WG_N, 0], kv_bar, v_smem.index(w))
        it = 0
        for g in range(GROUP):
            h = hk * GROUP + g
            for m in range(lo, hi, _BM):
                s = it % STAGES
                # a fresh barrier completes parity 1 at once: the first pass over the ring never waits
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), desc_q.block_type.nbytes + desc_do.block_type.nbytes)
                tma.async_copy_global_to_shared(desc_q, [b, h, m, 0], ready.index(s), q_smem.index(s))
                tma.async_copy_global_to_shared(desc_do, [b, h, m, 0], ready.index(s), do_smem.index(s))
                it += 1

    _release = _fwd_sm90._release  # the forward's: the warpgroup's barrier, then one arrive

    @gluon.jit
    def _consumer(k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty, LSE, DELTA, DK, DV, sdkb, sdkh, sdkn,
                  sdvb, sdvh, sdvn, slb, slh, NUM_N, Hkv, GROUP, Nq, Nk, sm_scale, qk2, HEAD_DIM: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr, WG: gl.constexpr):  # fmt: skip
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _BM, 16]
        )
        a_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
        )
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=a_layout, k_width=2)
        b, hk, start_n, lo, mid, hi = _range(gl.program_id(0), NUM_N, Hkv, Nq, Nk, CAUSAL)
        diag = Nk - Nq
        n0 = start_n + WG * _WG_N
        keys = n0 + gl.arange(0, _WG_N, layout=row_s)
        s_zero = gl.zeros([_WG_N, _BM], gl.float32, layout=s_layout)
        dk = gl.zeros([_WG_N, HEAD_DIM], gl.float32, layout=a_layout)
        dv = gl.zeros([_WG_N, HEAD_DIM], gl.float32, layout=a_layout)
        mbarrier.wait(kv_bar, 0)
        kw = k_smem.index(WG).reshape([_WG_N, HEAD_DIM])
        vw = v_smem.index(WG).reshape([_WG_N, HEAD_DIM])
        b64 = b.to(gl.int64)
        inv_qk2 = 1.0 / qk2
        it = 0
        for g in range(GROUP):
            h = (hk * GROUP + g).to(gl.int64)
            l_base = LSE + b64 * slb + h * slh
            d_base = DELTA + b64 * slb + h * slh
            for m in range(lo, hi, _BM):
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                qs = q_smem.index(s).reshape([_BM, HEAD_DIM])
                dos = do_smem.index(s).reshape([_BM, HEAD_DIM])
                rows = m + gl.arange(0, _BM, layout=col_s)
                r_ok = rows < Nq
                # rows past the end, and rows that saw no key (LSE -inf), get +inf: P = 0 there
                lse2 = gl.load(l_base + rows, mask=r_ok, other=float("inf")) * 1.4426950408889634
                lse2 = gl.where(lse2 == float("-inf"), float("inf"), lse2)
                delta = gl.load(d_base + rows, mask=r_ok, other=0.0)
                # the accumulators start at -LSE / scale and -delta, so neither row vector stays live across
                # the GEMMs (at D128 they would not fit the 240 registers): P^T = exp2(acc * scale), dS^T = P^T * acc
                st_tok = warpgroup_mma(
                    kw, qs.permute((1, 0)), s_zero - gl.expand_dims(lse2 * inv_qk2, 0), is_async=True
                )
                dpt_tok = warpgroup_mma(vw, dos.permute((1, 0)), s_zero - gl.expand_dims(delta, 0), is_async=True)
                st = warpgroup_mma_wait(1, deps=[st_tok, kw, qs])[0]
                pt = gl.exp2(st * qk2)
                if CAUSAL:
                    if m < mid:  # key k sees query rows >= k - diag
                        pt = gl.where(gl.expand_dims(rows, 0) + diag >= gl.expand_dims(keys, 1), pt, 0.0)
                p_op = gl.convert_layout(pt.to(dtype), op_layout)
                dv_tok = warpgroup_mma(p_op, dos, dv, is_async=True)
                dpt = warpgroup_mma_wait(1, deps=[dpt_tok, vw, dos])[0]
                dst = pt * dpt
                ds_op = gl.convert_layout(dst.to(dtype), op_layout)
                dk_tok = warpgroup_mma(ds_op, qs, dk, is_async=True)
                res = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, dos, qs])
                dv = res[0]
                dk = res[1]
                _release(empty.index(s))
                it += 1
        dk = dk * sm_scale
        rows_o = n0 + gl.arange(0, _WG_N, layout=gl.SliceLayout(1, a_layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, a_layout))
        ok = gl.expand_dims(rows_o < Nk, 1)
        hk64 = hk.to(gl.int64)
        r64 = gl.expand_dims(rows_o.to(gl.int64), 1)
        gl.store(DK + b64 * sdkb + hk64 * sdkh + r64 * sdkn + gl.expand_dims(cols, 0), dk.to(dtype), mask=ok)
        gl.store(DV + b64 * sdvb + hk64 * sdvh + r64 * sdvn + gl.expand_dims(cols, 0), dv.to(dtype), mask=ok)

    @gluon.jit
    def _bwd_dkdv_sm90_kernel(desc_q, desc_k, desc_v, desc_do, LSE, DELTA, DK, DV, sdkb, sdkh, sdkn, sdvb, sdvh,
                              sdvn, slb, slh, NUM_N, Hkv, GROUP, Nq, Nk, sm_scale, qk2, HEAD_DIM: gl.constexpr,
                              STAGES: gl.constexpr, CAUSAL: gl.constexpr):  # fmt: skip
        dtype: gl.constexpr = desc_q.dtype
        k_smem = gl.allocate_shared_memory(dtype, [2] + desc_k.block_type.shape, desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2] + desc_v.block_type.shape, desc_v.layout)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_q.block_type.shape, desc_q.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_do.block_type.shape, desc_do.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=2)  # one arrive per consumer warpgroup
        gl.warp_specialize(
            [
                (_consumer, (k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty, LSE, DELTA, DK, DV, sdkb, sdkh,
                             sdkn, sdvb, sdvh, sdvn, slb, slh, NUM_N, Hkv, GROUP, Nq, Nk, sm_scale, qk2, HEAD_DIM,
                             STAGES, CAUSAL, 0)),
                (_consumer, (k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty, LSE, DELTA, DK, DV, sdkb, sdkh,
                             sdkn, sdvb, sdvh, sdvn, slb, slh, NUM_N, Hkv, GROUP, Nq, Nk, sm_scale, qk2, HEAD_DIM,
                             STAGES, CAUSAL, 1)),
                (_producer, (desc_q, desc_k, desc_v, desc_do, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty,
                             NUM_N, Hkv, GROUP, Nq, Nk, STAGES, CAUSAL)),
            ],
            [4, 1],
            [240, 24],
        )  # fmt: skip


def launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal: bool, sm_scale: float, cfg: dict) -> None:
    """dK, dV of eligible (B, H, N, D) tensors into ``dk`` / ``dv`` (any strides, unit last); ``lse`` / ``delta``
    (B, H, Nq) with equal strides. Config: SM90_DKDV_STAGES (the (Q, dO) ring, default 2)."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    num_n = triton.cdiv(Nk, 2 * WG_N)
    gdt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
    bq, bk = [1, 1, BLOCK_M, D], [1, 1, WG_N, D]
    lq, lk = (gl.NVMMASharedLayout.get_default_for(b, gdt) for b in (bq, bk))
    descs = (
        TensorDescriptor(q, list(q.shape), list(q.stride()), bq, lq),
        TensorDescriptor(k, list(k.shape), list(k.stride()), bk, lk),
        TensorDescriptor(v, list(v.shape), list(v.stride()), bk, lk),
        TensorDescriptor(do, list(do.shape), list(do.stride()), bq, lq),
    )
    _bwd_dkdv_sm90_kernel[(num_n * B * Hkv,)](
        *descs,
        lse,
        delta,
        dk,
        dv,
        *dk.stride()[:3],
        *dv.stride()[:3],
        *lse.stride()[:2],
        num_n,
        Hkv,
        H // Hkv,
        Nq,
        Nk,
        sm_scale,
        sm_scale * 1.4426950408889634,
        HEAD_DIM=D,
        STAGES=int(cfg.get("SM90_DKDV_STAGES", 2)),
        CAUSAL=bool(causal),
        num_warps=4,
    )
