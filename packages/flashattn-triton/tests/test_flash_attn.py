"""flash_attn_forward: forward, LSE, backward, GQA, bottom-right causal, decode path, checks, compile.

CPU tests run the Triton kernels under TRITON_INTERPRET=1 (fp16/fp32: bf16 tl.dot is wrong in the
interpreter), or the PyTorch reference path without it. GPU tests (-m gpu) use real sizes.
"""

from __future__ import annotations

import importlib.util
import math
import os
import warnings
from pathlib import Path

import flashattn_triton as fa
import pytest
import torch
from flashattn_triton._common import Backend, TuningTable, select_backend
from flashattn_triton.ops import flash_attn as F

_spec = importlib.util.spec_from_file_location("_fa_ref", Path(__file__).with_name("_ref.py"))
_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ref)
ref_attention, rand = _ref.ref_attention, _ref.rand

# log2(0) for rows that see no key is expected (LSE = -inf)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

TOL = {torch.float16: 2e-3, torch.float32: 2e-5, torch.bfloat16: 2e-2}

# (B, H, Hkv, Nq, Nk, D): odd sizes, Nq != Nk both ways, GQA, MQA, head dims not powers of two
SHAPES = [
    (1, 2, 2, 37, 37, 32),
    (2, 4, 2, 29, 53, 40),
    (1, 3, 1, 53, 29, 16),
    (1, 2, 1, 1, 45, 24),
    (1, 2, 2, 70, 70, 64),
]


def _close(got, want, tol, name):
    err = (got.double() - want).abs().max().item()
    scale = max(want.abs().max().item(), 1.0)
    assert err <= tol * scale, f"{name}: max abs err {err:.3e} > {tol * scale:.3e}"


def _close_lse(got, want, tol):
    assert torch.equal(torch.isinf(got), torch.isinf(want)), "LSE -inf rows differ"
    fin = ~torch.isinf(want)
    _close(got[fin], want[fin], tol, "lse")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_reference(shape, causal, dtype):
    B, H, Hkv, Nq, Nk, D = shape
    torch.manual_seed(hash((shape, causal)) % 1000)
    q, k, v = rand(B, H, Nq, D, dtype=dtype), rand(B, Hkv, Nk, D, dtype=dtype), rand(B, Hkv, Nk, D, dtype=dtype)
    out, lse = fa.flash_attn_forward(q, k, v, causal=causal, return_lse=True)
    want, want_lse = ref_attention(q, k, v, causal)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (B, H, Nq) and lse.dtype == torch.float32
    _close(out, want, TOL[dtype], "out")
    _close_lse(lse, want_lse, 1e-5)


def test_rows_without_keys_are_zero():
    # bottom-right causal with Nq > Nk: the first Nq - Nk queries see nothing
    q, k, v = rand(1, 2, 20, 16), rand(1, 2, 7, 16), rand(1, 2, 7, 16)
    out, lse = fa.flash_attn_forward(q, k, v, causal=True, return_lse=True)
    assert torch.all(out[:, :, :13] == 0) and torch.all(torch.isneginf(lse[:, :, :13]))
    want, _ = ref_attention(q, k, v, True)
    _close(out, want, 2e-3, "out")


def test_sm_scale_and_bnhd_layout_without_copy():
    B, N, H, D = 2, 33, 4, 32
    q4, k4, v4 = rand(B, N, H, D), rand(B, N, H, D), rand(B, N, H, D)
    q, k, v = (t.transpose(1, 2) for t in (q4, k4, v4))  # (B, H, N, D) views, non-contiguous
    assert not q.is_contiguous()
    out = fa.flash_attn_forward(q, k, v, causal=True, sm_scale=0.3)
    want, _ = ref_attention(q, k, v, True, sm_scale=0.3)
    _close(out, want, 2e-3, "out")
    assert out.stride() == q.stride()  # output keeps the (B, N, H, D) storage order


def test_poisoned_outputs_fully_written():
    if select_backend(torch.device("cpu")) != Backend.INTERPRETER:
        pytest.skip("launcher test needs TRITON_INTERPRET=1")
    B, H, Hkv, Nq, Nk, D = 1, 4, 2, 45, 39, 24
    q, k, v = rand(B, H, Nq, D), rand(B, Hkv, Nk, D), rand(B, Hkv, Nk, D)
    cfg = F.get_config("fwd", q.device, D, True, Nk, q.dtype)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, Nq), float("nan"))
    F._fwd_launch(q, k, v, out, lse, True, D**-0.5, cfg)
    want, want_lse = ref_attention(q, k, v, True)
    _close(out, want, 2e-3, "out")
    _close_lse(lse, want_lse, 1e-5)
    do = rand(B, H, Nq, D)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    bcfg = F.get_config("bwd", q.device, D, True, Nk, q.dtype)
    F._backward_launch(do, q, k, v, out, lse, None, dq, dk, dv, True, D**-0.5, bcfg)
    assert not any(torch.isnan(t).any() for t in (dq, dk, dv))
    out2 = torch.full_like(q, float("nan"))
    lse2 = torch.full((B, H, Nq), float("nan"))
    F._decode_launch(q, k, v, out2, lse2, True, D**-0.5, F.get_config("decode", q.device, D, True, Nk, q.dtype), 3)
    _close(out2, want, 2e-3, "decode out")
    _close_lse(lse2, want_lse, 1e-5)


def _grads(q, k, v, causal, do, dlse=None, impl=None):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    if impl is None:
        out, lse = fa.flash_attn_forward(q, k, v, causal=causal, return_lse=True)
    else:
        out, lse = impl(q, k, v, causal)
    loss = (out * do.to(out.dtype)).sum()
    if dlse is not None:
        loss = loss + (torch.where(torch.isinf(lse), 0.0, lse) * dlse.to(lse.dtype)).sum()
    loss.backward()
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2], (1, 2, 1, 40, 40, 24)])
def test_backward_matches_reference(shape, causal, dtype):
    B, H, Hkv, Nq, Nk, D = shape
    torch.manual_seed(7)
    q, k, v = rand(B, H, Nq, D, dtype=dtype), rand(B, Hkv, Nk, D, dtype=dtype), rand(B, Hkv, Nk, D, dtype=dtype)
    do = rand(B, H, Nq, D, dtype=dtype)
    got = _grads(q, k, v, causal, do)
    want = _grads(q, k, v, causal, do, impl=ref_attention)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.dtype == dtype
        _close(g, w, 2 * TOL[dtype], name)


def test_backward_through_lse():
    torch.manual_seed(3)
    q, k, v = rand(1, 4, 21, 16), rand(1, 2, 30, 16), rand(1, 2, 30, 16)
    do, dlse = rand(1, 4, 21, 16), torch.randn(1, 4, 21)
    got = _grads(q, k, v, True, do, dlse)
    want = _grads(q, k, v, True, do, dlse, impl=ref_attention)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        _close(g, w, 4e-3, name)


def test_torch_reference_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert select_backend(torch.device("cpu")) == Backend.TORCH
    torch.manual_seed(5)
    q, k, v = rand(1, 4, 19, 24), rand(1, 2, 26, 24), rand(1, 2, 26, 24)
    out, lse = fa.flash_attn_forward(q, k, v, causal=True, return_lse=True)
    want, want_lse = ref_attention(q, k, v, True)
    _close(out, want, 2e-3, "out")
    _close_lse(lse, want_lse, 1e-5)
    do, dlse = rand(1, 4, 19, 24), torch.randn(1, 4, 19)
    got = _grads(q, k, v, True, do, dlse)
    want = _grads(q, k, v, True, do, dlse, impl=ref_attention)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        _close(g, w, 4e-3, name)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,group", [(1, 4), (3, 2), (16, 1)])
def test_decode_path_selected_and_correct(monkeypatch, nq, group, causal):
    monkeypatch.setattr(F, "DECODE_MIN_NK", 64)
    Hkv, Nk, D = 2, 97, 32
    torch.manual_seed(11)
    q, k, v = rand(1, Hkv * group, nq, D), rand(1, Hkv, Nk, D), rand(1, Hkv, Nk, D)
    assert F.use_decode_path(q, k)
    assert not F.use_decode_path(rand(1, 2, 17, D), k)  # too many queries
    out, lse = fa.flash_attn_forward(q, k, v, causal=causal, return_lse=True)
    want, want_lse = ref_attention(q, k, v, causal)
    _close(out, want, 2e-3, "out")
    _close_lse(lse, want_lse, 1e-5)
    # gradients still flow (the backward uses the LSE the decode combine wrote)
    do = rand(*q.shape)
    want = _grads(q, k, v, causal, do, impl=ref_attention)
    for name, g, w in zip(("dq", "dk", "dv"), _grads(q, k, v, causal, do), want):
        _close(g, w, 4e-3, name)


@pytest.mark.parametrize("atomic", [False, True, 2])
@pytest.mark.parametrize("shape,causal", [((1, 4, 2, 45, 39, 24), True), ((2, 2, 1, 29, 53, 32), False)])
def test_backward_dq_modes_match_reference(shape, causal, atomic):
    """Separate dQ kernel vs dQ accumulated atomically by the dK/dV kernel: same gradients (incl. dLSE, GQA).
    2 (TMA reduce-add) has no interpreter form: on CPU it must fall back to the scalar atomics."""
    if select_backend(torch.device("cpu")) != Backend.INTERPRETER:
        pytest.skip("launcher test needs TRITON_INTERPRET=1")
    B, H, Hkv, Nq, Nk, D = shape
    torch.manual_seed(13)
    q, k, v, do = rand(B, H, Nq, D), rand(B, Hkv, Nk, D), rand(B, Hkv, Nk, D), rand(B, H, Nq, D)
    dlse = torch.randn(B, H, Nq)
    out, lse = F._forward_impl(q, k, v, causal, D**-0.5, force_decode=False)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    cfg = dict(F.get_config("bwd", q.device, D, causal, Nk, q.dtype), DQ_ATOMIC=atomic)
    F._backward_launch(do, q, k, v, out, lse, dlse, dq, dk, dv, causal, D**-0.5, cfg)
    want = F._torch_backward(do, q, k, v, out, lse, dlse, causal, D**-0.5)
    for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        _close(g, w.double(), 4e-3, name)


@pytest.mark.parametrize("mode", ["off32", "off64", "tma", "tma-one-loop"])
def test_backward_dkdv_load_paths(monkeypatch, mode):
    """dK/dV kernel's Q/dO loads: 32-bit offsets (default), the 64-bit fallback, TMA descriptors (TMA=1;
    head dim 24 < BLOCK_D and a ragged last query block exercise the descriptor zero-fill), and the single
    masked causal loop (ONE_LOOP=1)."""
    if select_backend(torch.device("cpu")) != Backend.INTERPRETER:
        pytest.skip("launcher test needs TRITON_INTERPRET=1")
    if mode == "off64":
        monkeypatch.setattr(F, "_OFF32_LIMIT", 0)
    B, H, Hkv, Nq, Nk, D = 1, 4, 2, 45, 39, 24
    torch.manual_seed(19)
    q, k, v, do = rand(B, H, Nq, D), rand(B, Hkv, Nk, D), rand(B, Hkv, Nk, D), rand(B, H, Nq, D)
    dlse = torch.randn(B, H, Nq)
    out, lse = F._forward_impl(q, k, v, True, D**-0.5, force_decode=False)
    assert "tma" not in mode or F._tma_ok(q, do)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    cfg = dict(BLOCK_M1=16, BLOCK_N1=16, BLOCK_M2=16, BLOCK_N2=16, num_warps=4, num_stages=1)
    cfg.update(TMA=int("tma" in mode), ONE_LOOP=int("one-loop" in mode))
    F._backward_launch(do, q, k, v, out, lse, dlse, dq, dk, dv, True, D**-0.5, cfg)
    want = F._torch_backward(do, q, k, v, out, lse, dlse, True, D**-0.5)
    for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        _close(g, w.double(), 4e-3, name)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "mode", ["fused", "fused-dq-first", "fused-tma-one-loop", "split-knobs", "split-lpt", "fused-lpt", "fused-sm90dkdv"]
)
def test_backward_fused_and_split_knobs(mode, causal):
    """FUSED=1/2: dK/dV and dQ programs in one launch (either order, pointer or TMA Q/dO loads), and the
    split launch with its own dQ warps/stages and register caps (launch options the interpreter ignores);
    GQA, Nq != Nk, ragged blocks, dQ tiles decoupled from the dK/dV tiles, dLSE. LPT=3 (causal program
    order) over B*H = 8 / B*Hkv = 4 pairs: full and partial groups; a lost block would stay NaN. SM90_DKDV off
    Hopper (here: CPU) keeps the portable launch it is set on."""
    if select_backend(torch.device("cpu")) != Backend.INTERPRETER:
        pytest.skip("launcher test needs TRITON_INTERPRET=1")
    B, H, Hkv, Nq, Nk, D = (2 if "lpt" in mode else 1), 4, 2, 37, 45, 24
    torch.manual_seed(23)
    q, k, v, do = rand(B, H, Nq, D), rand(B, Hkv, Nk, D), rand(B, Hkv, Nk, D), rand(B, H, Nq, D)
    dlse = torch.randn(B, H, Nq)
    out, lse = F._forward_impl(q, k, v, causal, D**-0.5, force_decode=False)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    cfg = dict(BLOCK_M1=16, BLOCK_N1=32, BLOCK_M2=32, BLOCK_N2=16, num_warps=4, num_stages=1)
    if mode.startswith("fused"):
        cfg.update(FUSED=2 if "dq-first" in mode else 1, TMA=int("tma" in mode), ONE_LOOP=int("one-loop" in mode))
    else:
        cfg.update(BLOCK_M2=16, num_warps2=8, num_stages2=2, maxnreg=128, maxnreg2=168)
    if "lpt" in mode:
        cfg["LPT"] = 3
    if "sm90dkdv" in mode:
        from flashattn_triton.ops import _bwd_sm90

        cfg["SM90_DKDV"] = 1
        assert not _bwd_sm90.eligible(q, k, v, do)
    assert "tma" not in mode or F._tma_ok(q, do)
    F._backward_launch(do, q, k, v, out, lse, dlse, dq, dk, dv, causal, D**-0.5, cfg)
    want = _grads(q, k, v, causal, do, dlse, impl=ref_attention)  # float64 autograd
    for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        assert g.dtype == q.dtype
        _close(g, w, 4e-3, name)


def test_tma_eligibility():
    # the one rule behind the TMA loads of the backward and the decode path
    q, k = rand(1, 2, 16, 32), rand(1, 1, 16, 32)
    assert F._tma_ok(q, k)
    assert not F._tma_ok(q.float(), k.float())  # fp32: exact pointer loads
    # a head stride that is not a 16-byte multiple (head dim 36 in storage, 32 used)
    assert not F._tma_ok(rand(1, 2, 16, 36)[..., :32], k)
    # unaligned base pointer
    assert not F._tma_ok(rand(2 * 16 * 32 + 1)[1:].view(1, 2, 16, 32), k)
    assert not F._tma_ok(q[0])  # rank 3
    assert not F._decode_tma_ok(q)  # decode takes TMA on CUDA devices only


@pytest.mark.parametrize("causal", [False, True])
def test_decode_tma_path_matches_pointer_path(monkeypatch, causal):
    """The TMA (tensor-descriptor) decode loop, run through the interpreter: ragged last split, GQA, Nq > 1."""
    if select_backend(torch.device("cpu")) != Backend.INTERPRETER:
        pytest.skip("launcher test needs TRITON_INTERPRET=1")
    monkeypatch.setattr(F, "_decode_tma_ok", lambda t: True)
    B, H, Hkv, Nq, Nk, D = 2, 4, 2, 2, 83, 32
    torch.manual_seed(17)
    q, k, v = rand(B, H, Nq, D), rand(B, Hkv, Nk, D), rand(B, Hkv, Nk, D)
    want, want_lse = ref_attention(q, k, v, causal)
    out, lse = torch.full_like(q, float("nan")), torch.full((B, H, Nq), float("nan"))
    cfg = dict(BLOCK_N=16, num_warps=4, num_stages=1, TMA=True, WAVES=1)
    F._decode_launch(q, k, v, out, lse, causal, D**-0.5, cfg, 3)
    _close(out, want, 2e-3, "decode out")
    _close_lse(lse, want_lse, 1e-5)


def test_decode_num_splits_fills_whole_waves():
    dev = torch.device("cpu")
    sms = F.num_sms(dev)
    for bh in (1, 8, 64, 3 * sms + 1):
        s = F.decode_num_splits(dev, bh, 1 << 20, 64)
        assert s >= 1
        # the most splits whose programs fit in two waves: one more would start a partial third wave
        assert bh * s <= 2 * sms or s == 1
        assert bh * (s + 1) > 2 * sms or s == 256
    assert F.decode_num_splits(dev, 8, 64, 64) == 1  # never split below one tile per split


def test_tuning_table_covers_every_supported_shape():
    table = TuningTable.from_json(Path(F.__file__).resolve().parent.parent / "tuning.json")
    assert {"sm90", "sm86", "cpu"} <= set(table.table)
    for arch in ("sm90", "sm86", "sm89", "sm100", "cpu"):
        for kernel in ("fwd", "bwd", "decode"):
            for d in range(8, 257, 8):
                for dtype in (torch.float16, torch.bfloat16, torch.float32):
                    for causal in (False, True):
                        cfg = F._table_config(kernel, arch, d, causal, 4096, dtype)
                        assert cfg["num_warps"] in (1, 2, 4, 8) and cfg["num_stages"] >= 1
    for kernel in ("fwd", "bwd", "decode"):
        assert F.candidate_configs(kernel, 128, torch.bfloat16)
        assert all(c.get("BLOCK_N", 64) <= 64 for c in F.candidate_configs(kernel, 256, torch.bfloat16))


def test_autotune_flag_is_ignored_off_gpu(monkeypatch):
    monkeypatch.setenv("FLASHATTN_TRITON_AUTOTUNE", "1")
    assert F.autotune_enabled()
    called = []
    cfg = F.get_config("fwd", torch.device("cpu"), 64, False, 100, torch.float16, launch=called.append)
    assert cfg == F._table_config("fwd", "cpu", 64, False, 100, torch.float16) and not called


@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        (dict(q=rand(1, 2, 8, 16, dtype=torch.float64)), TypeError, "q"),
        (dict(k=rand(1, 2, 8, 16, dtype=torch.float32)), TypeError, "k"),
        (dict(v=rand(1, 2, 8)), ValueError, "v"),
        (dict(q=[1.0]), TypeError, "q"),
        (dict(k=rand(2, 2, 8, 16), v=rand(2, 2, 8, 16)), ValueError, "batch"),
        (dict(q=rand(1, 3, 8, 16)), ValueError, "multiple"),
        (dict(q=rand(1, 2, 8, 12), k=rand(1, 2, 8, 12), v=rand(1, 2, 8, 12)), ValueError, "head dim"),
        (dict(q=rand(1, 2, 8, 264), k=rand(1, 2, 8, 264), v=rand(1, 2, 8, 264)), ValueError, "head dim"),
        (dict(k=rand(1, 2, 8, 24), v=rand(1, 2, 8, 24)), ValueError, "head dim"),
        (dict(v=rand(1, 2, 9, 16)), ValueError, "same shape"),
        (dict(v=torch.empty(1, 2, 8, 16, dtype=torch.float16, device="meta")), ValueError, "v"),
        (dict(sm_scale="x"), TypeError, "sm_scale"),
    ],
)
def test_bad_inputs_name_the_argument(kwargs, exc, word):
    args = dict(q=rand(1, 2, 8, 16), k=rand(1, 2, 8, 16), v=rand(1, 2, 8, 16))
    args.update(kwargs)
    with pytest.raises(exc, match=word):
        fa.flash_attn_forward(**args)


def test_torch_compile_fullgraph_no_graph_break():
    q, k, v = rand(1, 4, 17, 16, requires_grad=True), rand(1, 2, 17, 16), rand(1, 2, 17, 16)

    def block(q, k, v):
        return fa.flash_attn_forward(q * 2, k, v, causal=True).float().sum()

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(q, k, v)
    got.backward()
    g1 = q.grad.clone()
    q.grad = None
    want = block(q, k, v)
    want.backward()
    assert math.isclose(got.item(), want.item(), rel_tol=1e-4)
    _close(g1, q.grad.double(), 1e-3, "dq")


def test_eager_calls_skip_the_op_dispatcher(monkeypatch):
    """Eager: the autograd backward runs the implementation directly with dlse=None (no zero-filled
    LSE gradient) and a no-grad forward skips the forward op; under a Python dispatch mode (what
    tracing and FlopCounterMode use) both go through the registered ops. Gradients match either way."""
    calls = {"fwd_op": 0, "bwd_op": 0, "dlse": []}
    fwd_op, bwd_op, bwd_impl = F.flash_attn_fwd_op, F.flash_attn_bwd_op, F._backward_impl

    def spy_fwd(*a):
        calls["fwd_op"] += 1
        return fwd_op(*a)

    def spy_bwd(*a):
        calls["bwd_op"] += 1
        return bwd_op(*a)

    def spy_impl(do, q, k, v, out, lse, dlse, *rest):
        calls["dlse"].append(dlse)
        return bwd_impl(do, q, k, v, out, lse, dlse, *rest)

    monkeypatch.setattr(F, "flash_attn_bwd_op", spy_bwd)
    monkeypatch.setattr(F, "_backward_impl", spy_impl)
    q, k, v = rand(1, 2, 13, 16, requires_grad=True), rand(1, 1, 13, 16), rand(1, 1, 13, 16)
    do = rand(1, 2, 13, 16)
    fa.flash_attn_forward(q, k, v, causal=True).backward(do)
    assert calls["bwd_op"] == 0 and calls["dlse"] == [None]
    g_eager = q.grad.clone()
    q.grad = None
    with torch.utils.flop_counter.FlopCounterMode(display=False):
        fa.flash_attn_forward(q, k, v, causal=True).backward(do)
    assert calls["bwd_op"] == 1
    _close(q.grad.double(), g_eager.double(), 1e-6, "dq via the op")

    monkeypatch.setattr(F, "flash_attn_fwd_op", spy_fwd)
    with torch.no_grad():
        out = fa.flash_attn_forward(q, k, v, causal=True)
    assert calls["fwd_op"] == 0
    with torch.utils.flop_counter.FlopCounterMode(display=False), torch.no_grad():
        out2 = fa.flash_attn_forward(q, k, v, causal=True)
    assert calls["fwd_op"] == 1
    assert torch.equal(out, out2)


def test_custom_op_passes_opcheck():
    q, k, v = rand(1, 2, 9, 16), rand(1, 1, 11, 16), rand(1, 1, 11, 16)
    torch.library.opcheck(
        torch.ops.flashattn_triton.flash_attn_fwd.default,
        (q, k, v, True, 0.25),
        test_utils=("test_schema", "test_faketensor"),
    )


# ------------------------------------------------------------------------------------------ GPU


def _rel(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128, 256, 80])
@pytest.mark.parametrize("N", [1000, 4096, 8192])
def test_gpu_fwd_bwd_vs_fp32(N, D, causal, dtype):
    if N == 8192 and D == 256:
        N = 4096  # keep the fp32 reference's N x N matrix small
    torch.manual_seed(0)
    dev = "cuda"
    B, H, Hkv = 1, 4, 2
    q, k, v = (rand(B, h, N, D, dtype=dtype, device=dev) for h in (H, Hkv, Hkv))
    do = rand(B, H, N, D, dtype=dtype, device=dev)
    got = _grads(q, k, v, causal, do)
    out = fa.flash_attn_forward(q, k, v, causal=causal)
    want_out, _ = ref_attention(q, k, v, causal, dtype=torch.float32)
    ref32 = lambda *a: ref_attention(*a, dtype=torch.float32)
    want = _grads(q.float(), k.float(), v.float(), causal, do.float(), impl=ref32)
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    assert _rel(out, want_out) < tol
    for g, w in zip(got, want):
        assert _rel(g, w) < 2 * tol


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_matches_sdpa_where_semantics_match(dtype):
    torch.manual_seed(1)
    q, k, v = (rand(2, 8, 1024, 128, dtype=dtype, device="cuda") for _ in range(3))
    for causal in (False, True):  # Nq == Nk: bottom-right == top-left
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert _rel(fa.flash_attn_forward(q, k, v, causal=causal), want) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("L", [1024, 8192, 32768])
@pytest.mark.parametrize("nq", [1, 4])
def test_gpu_decode_split_kv(L, nq):
    torch.manual_seed(2)
    B, H, Hkv, D = 2, 32, 8, 128
    q = rand(B, H, nq, D, dtype=torch.bfloat16, device="cuda")
    k, v = (rand(B, Hkv, L, D, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    assert F.use_decode_path(q, k)
    for causal in (False, True):
        out, lse = fa.flash_attn_forward(q, k, v, causal=causal, return_lse=True)
        want, want_lse = ref_attention(q, k, v, causal, dtype=torch.float32)
        assert _rel(out, want) < 1e-2
        assert (lse - want_lse).abs().max().item() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "mode",
    [
        *("split", "atomic", "tma", "tma-atomic", "tma-one-loop", "off64", "fused", "tma-fused", "lpt", "fused-lpt"),
        *("reduce", "tma-reduce", "tma-reduce-d80", "reduce-lpt"),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_backward_dq_modes(monkeypatch, causal, mode):
    """Every backward launch form vs an fp32 reference; "reduce": atomic dQ by one TMA reduce-add per tile
    (DQ_ATOMIC 2; N = 1000 leaves a ragged last tile for the descriptor to clip, D80 clipped columns)."""
    torch.manual_seed(4)
    if mode == "off64":
        monkeypatch.setattr(F, "_OFF32_LIMIT", 0)
    B, H, Hkv, N, D = 2, 8, 2, 1000, 80 if "d80" in mode else 128
    q, k, v, do = (rand(B, h, N, D, dtype=torch.bfloat16, device="cuda") for h in (H, Hkv, Hkv, H))
    out, lse = F._forward_impl(q, k, v, causal, D**-0.5, force_decode=False)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    atomic = 2 if "reduce" in mode else int("atomic" in mode)
    cfg = dict(F.get_config("bwd", q.device, D, causal, N, q.dtype), DQ_ATOMIC=atomic)
    cfg.update(TMA=int("tma" in mode), ONE_LOOP=int("one-loop" in mode), FUSED=int("fused" in mode))
    if "reduce" in mode:  # the probe's tile for it
        cfg.update(BLOCK_M1=64, BLOCK_N1=128, num_warps=8, num_stages=2)
    cfg["LPT"] = 3 if "lpt" in mode else 0  # 3 does not divide the head count: a partial last group
    F._backward_launch(do, q, k, v, out, lse, None, dq, dk, dv, causal, D**-0.5, cfg)
    ref32 = lambda *a: ref_attention(*a, dtype=torch.float32)
    want = _grads(q.float(), k.float(), v.float(), causal, do.float(), impl=ref32)
    for g, w in zip((dq, dk, dv), want):
        assert _rel(g, w) < 4e-2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "B,H,Hkv,nq,nk,D,dtype",
    [
        (2, 8, 2, 1000, 1000, 128, torch.bfloat16),  # GQA, ragged last key block and query tile
        (1, 4, 4, 300, 77, 128, torch.float16),  # Nq > Nk: causal rows that see no key
        (1, 4, 1, 129, 1100, 64, torch.bfloat16),  # Nq < Nk, MQA
        (2, 4, 2, 1024, 1024, 64, torch.float16),
        (1, 2, 2, 1, 1, 128, torch.bfloat16),
    ],
)
@pytest.mark.parametrize("stages", [2, 3])
def test_gpu_sm90_backward_dkdv(B, H, Hkv, nq, nk, D, dtype, stages):
    """SM90_DKDV: dK/dV from the warp-specialized Gluon kernel (dQ from the portable program) vs an fp32
    reference, gradients poisoned first, causal and not; the causal pass also backpropagates through the LSE
    (dlse folds into the delta the kernel reads)."""
    from flashattn_triton.ops import _bwd_sm90

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon backward is built for SM90 only")
    torch.manual_seed(8)
    q, do = (rand(B, H, nq, D, dtype=dtype, device="cuda") for _ in range(2))
    k, v = (rand(B, Hkv, nk, D, dtype=dtype, device="cuda") for _ in range(2))
    assert _bwd_sm90.eligible(q, k, v, do)
    for causal in (False, True):
        out, lse = F._forward_impl(q, k, v, causal, D**-0.5, force_decode=False)
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        cfg = dict(F.get_config("bwd", q.device, D, causal, max(nq, nk), dtype), SM90_DKDV=1, SM90_DKDV_STAGES=stages)
        dlse = torch.randn(B, H, nq, device="cuda") if causal else None
        F._backward_launch(do, q, k, v, out, lse, dlse, dq, dk, dv, causal, D**-0.5, cfg)
        ref32 = lambda *a: ref_attention(*a, dtype=torch.float32)
        want = _grads(q.float(), k.float(), v.float(), causal, do.float(), dlse, impl=ref32)
        for g, w in zip((dq, dk, dv), want):
            assert torch.isfinite(g).all()
            # relative to max(|ref|, 1): with one key the softmax is constant, so dQ and dK are exactly 0
            assert (g.float() - w).norm() <= 4e-2 * max(w.norm().item(), 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("L", [1000, 32768])
def test_gpu_decode_tma_and_pointer(L, tma):
    torch.manual_seed(5)
    B, H, Hkv, D = 3, 32, 8, 128
    q = rand(B, H, 1, D, dtype=torch.bfloat16, device="cuda")
    k, v = (rand(B, Hkv, L, D, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    for causal in (False, True):
        out, lse = torch.full_like(q, float("nan")), torch.empty(B, H, 1, device="cuda")
        F._decode_launch(q, k, v, out, lse, causal, D**-0.5, dict(BLOCK_N=64, num_warps=4, num_stages=3, TMA=tma))
        want, want_lse = ref_attention(q, k, v, causal, dtype=torch.float32)
        assert _rel(out, want) < 1e-2
        assert (lse - want_lse).abs().max().item() < 1e-2


@pytest.mark.gpu
def test_gpu_torch_compile_attention_block():
    torch.manual_seed(3)
    dev, dt = "cuda", torch.bfloat16
    proj = torch.nn.Linear(256, 3 * 256, device=dev, dtype=dt)
    attn = fa.FlashAttention(causal=True)

    def block(x):
        q, k, v = proj(x).view(2, 512, 3, 4, 64).unbind(2)
        return attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2).reshape(2, 512, 256)

    x = rand(2, 512, 256, dtype=dt, device=dev, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True)
    got = compiled(x)
    got.float().sum().backward()
    gx = x.grad.clone()
    x.grad = None
    want = block(x)
    want.float().sum().backward()
    assert _rel(got, want) < 1e-2 and _rel(gx, x.grad) < 1e-2


_SM90_SHAPES = [
    (2, 16, 4, 1000, 1000, False),
    (1, 3, 3, 77, 300, False),
    (1, 2, 2, 300, 77, True),
    (1, 2, 1, 1, 1, False),
]


def _check_sm90(B, H, Hkv, nq, nk, bnhd, D, dtype, cfg):
    from flashattn_triton.ops import _fwd_sm90

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon forward is built for SM90 only")
    torch.manual_seed(6)
    if bnhd:
        q = rand(B, nq, H, D, dtype=dtype, device="cuda").transpose(1, 2)
        k, v = (rand(B, nk, Hkv, D, dtype=dtype, device="cuda").transpose(1, 2) for _ in range(2))
    else:
        q = rand(B, H, nq, D, dtype=dtype, device="cuda")
        k, v = (rand(B, Hkv, nk, D, dtype=dtype, device="cuda") for _ in range(2))
    assert _fwd_sm90.eligible(q, k, v)
    cfg = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, SM90=1, **cfg)
    for causal in (False, True):
        out, lse = torch.full_like(q, float("nan")), torch.full((B, H, nq), float("nan"), device="cuda")
        F._fwd_launch(q, k, v, out, lse, causal, D**-0.5, cfg)
        want, want_lse = ref_attention(q, k, v, causal, dtype=torch.float32)
        assert torch.isfinite(out).all()
        assert _rel(out, want) < (2e-2 if dtype == torch.bfloat16 else 5e-3)
        _close_lse(lse, want_lse, 1e-3)
        # the plan's later calls launch the captured kernel directly (with Desc stand-ins): same bits
        out2, lse2 = torch.full_like(q, float("nan")), torch.full((B, H, nq), float("nan"), device="cuda")
        F._fwd_launch(q, k, v, out2, lse2, causal, D**-0.5, cfg)
        assert torch.equal(out2, out) and torch.equal(lse2, lse)
    if _fwd_sm90.direct.ENABLED:
        # no plan fell back to kernel[grid] for good (a failed first direct launch turns it off)
        assert not [p.dl.error for p in _fwd_sm90._PLANS.values() if p.dl.state == -1]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("tiles", [(128, 3, 2), (64, 4, 3)])
@pytest.mark.parametrize("B,H,Hkv,nq,nk,bnhd", _SM90_SHAPES)
def test_gpu_sm90_forward_matches_fp32(B, H, Hkv, nq, nk, bnhd, tiles, D, dtype):
    """The Hopper Gluon forward (ragged N, Nq != Nk both ways, GQA, a (B, N, H, D) view, one row; two and
    three consumer warpgroups) against an fp32 reference, outputs poisoned first; rows without keys
    (Nq > Nk, causal) give 0 and LSE -inf. B * H * row blocks (256 at N=1000) exceeds the SM count, so the
    persistent loop runs several tiles per CTA."""
    bn, stages, cons = tiles
    _check_sm90(B, H, Hkv, nq, nk, bnhd, D, dtype, dict(SM90_BLOCK_N=bn, SM90_STAGES=stages, SM90_CONS=cons))


@pytest.mark.gpu
@pytest.mark.parametrize(  # 3 warpgroups: D64 only (shared memory); 64-key tiles with a 6-deep ring
    "D,cons,persist,bn,stages", [(128, 2, 1, 128, 3), (64, 2, 0, 128, 3), (64, 3, 1, 128, 3), (128, 2, 0, 64, 6)]
)
@pytest.mark.parametrize("B,H,Hkv,nq,nk,bnhd", _SM90_SHAPES)
def test_gpu_sm90_forward_pingpong_lpt(B, H, Hkv, nq, nk, bnhd, D, cons, persist, bn, stages):
    """The same checks with the consumer warpgroups in ping-pong turns (SM90_PP, round-robin for three)
    and causal tiles in head-group LPT order (SM90_LPT: groups of 8 of the 32 heads at N=1000)."""
    cfg = dict(SM90_BLOCK_N=bn, SM90_STAGES=stages, SM90_CONS=cons, SM90_PERSIST=persist, SM90_PP=1, SM90_LPT=8)
    _check_sm90(B, H, Hkv, nq, nk, bnhd, D, torch.bfloat16, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "D,cons,lpt,dtype,stages,kst,otma",
    [
        (64, 2, 0, torch.bfloat16, 4, 4, 0),
        (64, 3, 0, torch.float16, 4, 4, 0),
        (64, 2, 8, torch.bfloat16, 4, 4, 0),
        (64, 3, 8, torch.bfloat16, 4, 4, 0),
        (128, 2, 0, torch.bfloat16, 3, 2, 0),
        (128, 2, 8, torch.float16, 3, 2, 0),
        (64, 2, 0, torch.bfloat16, 4, 4, 1),
        (64, 2, 8, torch.float16, 3, 3, 1),
        (64, 3, 0, torch.bfloat16, 4, 4, 1),
        (128, 2, 0, torch.bfloat16, 3, 2, 1),
        (128, 2, 8, torch.float16, 3, 2, 1),
    ],
)
@pytest.mark.parametrize("B,H,Hkv,nq,nk,bnhd", [(4, 16, 4, 1000, 1000, False), *_SM90_SHAPES[1:]])
def test_gpu_sm90_forward_two_q_buffers(B, H, Hkv, nq, nk, bnhd, D, cons, lpt, dtype, stages, kst, otma):
    """SM90_Q2: the next tile's Q lands in the other buffer while this tile runs (D128: with a 2-deep K
    ring, SM90_KSTAGES). At B=4, N=1000 each persistent CTA runs 3-4 tiles (384 or 512 on 132 SMs), so a
    buffer is refilled and its barrier phase wraps. SM90_OTMA: O is staged in the consumed Q buffer and
    written by one TMA store, which must clip the rows past Nq of each head (ragged N, Nq > Nk, one row) and
    follow out's strides (the BNHD view); the producer gets the buffer back only after the store has read it."""
    cfg = dict(SM90_BLOCK_N=128, SM90_STAGES=stages, SM90_KSTAGES=kst, SM90_CONS=cons, SM90_Q2=1, SM90_LPT=lpt)
    _check_sm90(B, H, Hkv, nq, nk, bnhd, D, dtype, dict(cfg, SM90_OTMA=otma))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "D,cons,lpt,persist,stages,kst,dtype",
    [
        (64, 2, 8, 1, 3, 3, torch.bfloat16),
        (64, 2, 4, 1, 3, 3, torch.float16),  # the shipped D64 causal entry up to N = 2048
        (64, 3, 8, 1, 4, 4, torch.float16),
        (64, 2, 0, 0, 3, 3, torch.float16),
        (128, 2, 8, 1, 3, 2, torch.bfloat16),
        (128, 2, 0, 1, 3, 2, torch.float16),
    ],
)
@pytest.mark.parametrize(
    "B,H,Hkv,nq,nk,bnhd", [(4, 16, 4, 1000, 1000, False), (2, 4, 2, 700, 764, False), *_SM90_SHAPES[1:]]
)
def test_gpu_sm90_forward_half_blocks(B, H, Hkv, nq, nk, bnhd, D, cons, lpt, persist, stages, kst, dtype):
    """SM90_HALF (causal): a consumer warpgroup runs only the key blocks its own 64 rows see and a last block it
    sees the first half of at half width, and only waits for and frees the tile's other blocks. Nk = Nq (warpgroup
    0's diagonal block is a half one), Nk - Nq = 64 (a whole block fewer for one warpgroup, a half one for the
    other), three warpgroups (one to two blocks fewer), Nq > Nk (rows with no key), one row; the same bits on the
    second (direct) launch, two Q buffers and the TMA-store epilogue where the config has them."""
    cfg = dict(SM90_BLOCK_N=128, SM90_STAGES=stages, SM90_KSTAGES=kst, SM90_CONS=cons, SM90_LPT=lpt, SM90_HALF=1)
    cfg.update(dict(SM90_Q2=1, SM90_OTMA=1) if persist else dict(SM90_PERSIST=0))
    _check_sm90(B, H, Hkv, nq, nk, bnhd, D, dtype, cfg)


def test_sm90_eligibility_rules():
    from flashattn_triton.ops import _fwd_sm90

    q = torch.zeros(1, 2, 8, 128, dtype=torch.float16)
    assert not _fwd_sm90.eligible(q, q, q)  # CPU tensors never take the Gluon kernel
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        g = torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16, device="cuda")
        assert _fwd_sm90.eligible(g, g, g)
        assert not _fwd_sm90.eligible(g[..., :96], g[..., :96], g[..., :96])  # D 96 is not built
        assert not _fwd_sm90.eligible(g.float(), g.float(), g.float())


def test_sm90_launch_plan_direct_args(fake_gluon_launch):
    """No GPU needed: the SM90 launch plan's first call goes through ``kernel[grid]`` with real tensor
    descriptors; later calls launch the captured kernel directly with ``Desc`` stand-ins carrying the same
    base/shape/strides, the same scalars and the constexpr tail in signature order, on the same grid."""
    from flashattn_triton.ops import _fwd_sm90

    def fn(desc_q, desc_k, desc_v, O, LSE, sob, soh, som, slb, slh, H, GROUP, Nq, Nk, NUM_M, n_tiles,
           lpt_g, qk_scale, desc_o, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, NUM_CONS, CONS_REGS, PP, QBUF, KSTAGES,
           OTMA, HALF):  # fmt: skip
        pass

    calls = fake_gluon_launch(_fwd_sm90, "_attn_fwd_sm90_kernel", fn)
    B, H, Hkv, N, D = 2, 4, 2, 300, 128
    q = torch.zeros(B, N, H, D, dtype=torch.bfloat16).transpose(1, 2)  # a BNHD view
    k, v = (torch.zeros(B, Hkv, N, D, dtype=torch.bfloat16) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(B, H, N)
    # SM90_LPT 3 -> head groups of 2: the largest size <= 3 that divides B * H = 8
    cfg = {
        "SM90": 1,
        "SM90_BLOCK_N": 128,
        "SM90_CONS": 2,
        "SM90_STAGES": 3,
        "SM90_PERSIST": 1,
        "SM90_LPT": 3,
        "SM90_PP": 1,
    }
    for _ in range(3):
        _fwd_sm90.launch(q, k, v, out, lse, True, 0.125, cfg)
    assert len(calls["normal"]) == 1 and len(calls["direct"]) == 2
    grid, nargs, kw, dargs = fake_gluon_launch.first_launches(calls)
    num_m = -(-N // 128)
    assert grid == (min(132, num_m * B * H),)
    assert [d.block for d in nargs[:3]] == [[1, 1, 64, D], [1, 1, 128, D], [1, 1, 128, D]]
    assert kw == dict(
        HEAD_DIM=D,
        BLOCK_N=128,
        STAGES=3,
        CAUSAL=True,
        NUM_CONS=2,
        CONS_REGS=240,
        PP=True,
        QBUF=1,
        KSTAGES=3,
        OTMA=False,
        HALF=False,
        num_warps=4,
    )
    assert dargs[3] is out and dargs[4] is lse and dargs[5:18] == nargs[5:18]
    assert dargs[18] is dargs[0] and nargs[18] is nargs[0]  # no TMA store: q's descriptor stands in for desc_o
    assert dargs[5:10] == (*out.stride()[:3], *lse.stride()[:2])
    assert dargs[10:17] == (H, H // Hkv, N, N, num_m, num_m * B * H, 2)
    assert abs(dargs[17] - 0.125 * 1.4426950408889634) < 1e-12
    assert dargs[19:] == (D, 128, 3, True, 2, 240, True, 1, 3, False, False)  # the constexpr tail
    # another shape is another plan: normal launch first again
    q2 = torch.zeros(B, H, N + 1, D, dtype=torch.bfloat16)
    _fwd_sm90.launch(q2, k, v, torch.empty_like(q2), torch.empty(B, H, N + 1), False, 0.125, cfg)
    assert len(calls["normal"]) == 2
    assert calls["normal"][1][1][16] == 0  # head-group order only for causal
    # the TMA-store epilogue: desc_o covers out (a BNHD view here) with Q's block; it needs two Q buffers
    calls["normal"].clear(), calls["direct"].clear()
    for _ in range(2):
        _fwd_sm90.launch(q, k, v, out, lse, False, 0.125, dict(cfg, SM90_Q2=1, SM90_OTMA=1))
    grid, nargs, kw, dargs = fake_gluon_launch.first_launches(calls)
    assert kw["OTMA"] is True and kw["QBUF"] == 2
    assert nargs[18].base is out and nargs[18].strides == list(out.stride()) and nargs[18].block == [1, 1, 64, D]
    do = dargs[18]
    assert do.base is out and list(do.shape) == list(out.shape) and list(do.strides) == list(out.stride())
    with pytest.raises(ValueError, match="SM90_OTMA needs SM90_Q2"):
        _fwd_sm90.launch(q, k, v, out, lse, False, 0.125, dict(cfg, SM90_OTMA=1))
    # per-warpgroup key blocks: causal only, and not with ping-pong turns
    with pytest.raises(ValueError, match="SM90_HALF does not combine with SM90_PP"):
        _fwd_sm90.launch(q, k, v, out, lse, True, 0.125, dict(cfg, SM90_HALF=1))
    calls["normal"].clear(), calls["direct"].clear()
    for causal in (False, True):
        _fwd_sm90.launch(q2, k, v, torch.empty_like(q2), torch.empty(B, H, N + 1), causal, 0.125,
                         dict(cfg, SM90_PP=0, SM90_HALF=1))  # fmt: skip
    assert [c[2]["HALF"] for c in calls["normal"]] == [False, True]
    assert [_fwd_sm90._lpt_group(bh, w) for bh, w in ((256, 8), (6, 4), (7, 4), (5, 0), (2, 16))] == [8, 3, 1, 0, 2]


_OFFLINE_FWD = [
    # D, BLOCK_N, stages, consumers, causal, max spill bytes, Q buffers, K stages, TMA-store epilogue, SM90_HALF
    (128, 128, 3, 2, False, 0, 1, 3, False, False),
    (128, 128, 3, 2, True, 0, 1, 3, False, False),
    (64, 128, 4, 2, True, 0, 1, 4, False, False),
    (64, 128, 4, 3, False, 32, 1, 4, False, False),
    (64, 128, 4, 3, True, 64, 1, 4, False, False),  # a few scalar spills; the masked key compare had spilled 304 bytes
    (64, 128, 4, 2, False, 0, 2, 4, False, False),
    (64, 128, 4, 3, True, 64, 2, 4, False, False),
    (128, 128, 3, 2, True, 0, 2, 2, False, False),  # D128 fits two Q buffers with a 2-deep K ring
    (128, 128, 3, 2, False, 0, 2, 2, True, False),  # O through the consumed Q buffer and a TMA store
    (64, 128, 3, 2, True, 0, 2, 3, True, False),
    # per-warpgroup key blocks with a half-width last one: the half tail's extra live values spill a little at
    # D128 and with three consumers (those configs are timed against the shipped ones before any table uses them)
    (64, 128, 3, 2, True, 0, 2, 3, True, True),
    (128, 128, 3, 2, True, 64, 2, 2, True, True),
    (64, 128, 4, 3, True, 160, 2, 4, True, True),
]


def _compile_gluon_offline(mod, kernel: str, D: int, sig: dict, const: dict) -> int:
    """Compile the Gluon kernel ``mod.<kernel>`` (defined only where Gluon is) for sm_90a with Triton's own
    ptxas (no GPU needed): checks that it fits one H200 CTA's shared memory and uses setmaxnreg, wgmma and TMA;
    returns ptxas's spill-store bytes. ``sig`` names descriptors by their block rows ("desc:64"); every
    ``const`` key becomes a constexpr."""
    import re
    import subprocess
    import tempfile

    import triton
    from flashattn_triton.ops import _fwd_sm90

    if not _fwd_sm90.HAS_GLUON:
        pytest.skip(f"the Gluon kernels target Triton 3.6 (this is {triton.__version__}); tests_matrix covers 3.6")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET=1 turns the kernel into interpreted functions: compile with TRITON_INTERPRET=0")
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    def desc(rows):
        layout = gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], gl.bfloat16)
        return f"tensordesc<bf16[1, 1, {rows}, {D}],{layout!r}>"

    sig = {n: desc(int(t[5:])) if t.startswith("desc:") else t for n, t in sig.items()}
    sig.update({n: "constexpr" for n in const})
    k = triton.compile(
        GluonASTSource(getattr(mod, kernel), sig, const), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}
    )
    assert k.metadata.shared <= 232448  # one CTA per SM on the H200
    ptx = k.asm["ptx"]
    assert "setmaxnreg" in ptx and "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        cmd = [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", str(path), "-o", str(Path(tmp) / "k.o")]
        err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    return int(re.search(r"(\d+) bytes spill stores", err).group(1))


@pytest.mark.parametrize(  # every case without and with ping-pong turns, which the plan refuses with SM90_HALF
    "D,bn,stages,cons,causal,max_spill,qbuf,kst,otma,half,pp",
    [(*c, pp) for c in _OFFLINE_FWD for pp in (False, True) if not (c[-1] and pp)],
)
def test_sm90_kernel_compiles_offline_without_spills(D, bn, stages, cons, causal, max_spill, qbuf, kst, otma, half, pp):
    """No GPU needed: the Gluon forward compiles for sm_90a with Triton's own ptxas, within the shared memory
    of one H200 CTA and within a spill bound: none for two consumer warpgroups (the shipped configurations,
    two Q buffers, the 2-deep K ring, the TMA-store epilogue); the three-consumer D64 kernels, at 160 registers
    a warpgroup, spill loop scalars only (16 bytes non-causal, up to 64 causal; 160 with SM90_HALF)."""
    from flashattn_triton.ops import _fwd_sm90

    sig = {"desc_q": "desc:64", "desc_k": f"desc:{bn}", "desc_v": f"desc:{bn}", "O": "*bf16", "LSE": "*fp32"}
    sig.update({n: "i64" for n in ("sob", "soh", "som", "slb", "slh")})
    sig.update({n: "i32" for n in ("H", "GROUP", "Nq", "Nk", "NUM_M", "n_tiles", "lpt_g")})
    sig["qk_scale"] = "fp32"
    sig["desc_o"] = "desc:64"
    const = dict(
        HEAD_DIM=D,
        BLOCK_N=bn,
        STAGES=stages,
        CAUSAL=causal,
        NUM_CONS=cons,
        CONS_REGS=240 if cons == 2 else 160,
        PP=pp,
        QBUF=qbuf,
        KSTAGES=kst,
        OTMA=otma,
        HALF=half,
    )
    assert _compile_gluon_offline(_fwd_sm90, "_attn_fwd_sm90_kernel", D, sig, const) <= max_spill


@pytest.mark.parametrize(  # measured on the H200 in session 17 with these spills (D128: 48 B causal, 16 B full)
    "D,causal,stages,max_spill", [(128, True, 2, 48), (128, False, 2, 16), (128, True, 3, 48), (64, True, 2, 0)]
)
def test_sm90_dkdv_kernel_compiles_offline(D, causal, stages, max_spill):
    """No GPU needed: the Gluon dK/dV kernel (SM90_DKDV) compiles for sm_90a within one CTA's shared memory,
    its dK/dV accumulators and score tiles within the consumers' 240 registers up to a few spilled bytes (the
    accumulators start at -LSE / scale and -delta so those row vectors do not stay live: 204 B spilled before)."""
    from flashattn_triton.ops import _bwd_sm90

    sig = {n: "desc:64" for n in ("desc_q", "desc_k", "desc_v", "desc_do")}
    sig.update({"LSE": "*fp32", "DELTA": "*fp32", "DK": "*bf16", "DV": "*bf16"})
    sig.update({n: "i64" for n in ("sdkb", "sdkh", "sdkn", "sdvb", "sdvh", "sdvn", "slb", "slh")})
    sig.update({n: "i32" for n in ("NUM_N", "Hkv", "GROUP", "Nq", "Nk")})
    sig.update({"sm_scale": "fp32", "qk2": "fp32"})
    const = dict(HEAD_DIM=D, STAGES=stages, CAUSAL=causal)
    assert _compile_gluon_offline(_bwd_sm90, "_bwd_dkdv_sm90_kernel", D, sig, const) <= max_spill
