"""flash_attn_varlen_forward: packed sequences (cu_seqlens), forward + backward, per-sequence causal."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import flashattn_triton as fa
import pytest
import torch

_spec = importlib.util.spec_from_file_location("_fa_ref", Path(__file__).with_name("_ref.py"))
_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ref)
ref_attention, rand = _ref.ref_attention, _ref.rand

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _cu(lens, device="cpu"):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)


def _ref_varlen(q, k, v, lens_q, lens_k, causal):
    outs, lses, q0, k0 = [], [], 0, 0
    for lq, lk in zip(lens_q, lens_k):
        o, l = ref_attention(
            q[q0 : q0 + lq].transpose(0, 1)[None], k[k0 : k0 + lk].transpose(0, 1)[None],
            v[k0 : k0 + lk].transpose(0, 1)[None], causal,
        )  # fmt: skip
        outs.append(o[0].transpose(0, 1))
        lses.append(l[0])
        q0, k0 = q0 + lq, k0 + lk
    return torch.cat(outs), torch.cat(lses, dim=1)


CASES = [
    ([5, 17, 1, 33], [5, 17, 1, 33]),  # self-attention, odd lengths
    ([3, 20, 9], [11, 20, 30]),  # Nq <= Nk per sequence (bottom-right causal)
    ([12, 4], [7, 4]),  # Nq > Nk: rows with no visible key
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", CASES)
def test_varlen_forward_and_backward(lens, causal, dtype):
    lens_q, lens_k = lens
    H, Hkv, D = 4, 2, 24
    torch.manual_seed(sum(lens_q))
    q = rand(sum(lens_q), H, D, dtype=dtype, requires_grad=True)
    k = rand(sum(lens_k), Hkv, D, dtype=dtype, requires_grad=True)
    v = rand(sum(lens_k), Hkv, D, dtype=dtype, requires_grad=True)
    out, lse = fa.flash_attn_varlen_forward(
        q, k, v, _cu(lens_q), _cu(lens_k), max(lens_q), max(lens_k), causal=causal, return_lse=True
    )
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    want, want_lse = _ref_varlen(qd, kd, vd, lens_q, lens_k, causal)
    tol = 2e-3 if dtype == torch.float16 else 2e-5
    assert out.shape == q.shape and lse.shape == (H, q.shape[0])
    assert (out.double() - want).abs().max().item() < tol * 4
    fin = ~torch.isinf(want_lse)
    assert torch.equal(torch.isinf(lse), ~fin)
    assert (lse[fin].double() - want_lse[fin]).abs().max().item() < 1e-4
    do = rand(*q.shape, dtype=dtype)
    (out * do).sum().backward()
    (want * do.double()).sum().backward()
    for name, g, w in (("dq", q.grad, qd.grad), ("dk", k.grad, kd.grad), ("dv", v.grad, vd.grad)):
        err = (g.double() - w).abs().max().item()
        assert err < 2 * tol * max(1.0, w.abs().max().item()), f"{name}: {err}"


def test_varlen_torch_reference_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    lens_q, lens_k = [3, 9], [8, 9]
    q, k, v = rand(12, 2, 16), rand(17, 1, 16), rand(17, 1, 16)
    out = fa.flash_attn_varlen_forward(q, k, v, _cu(lens_q), _cu(lens_k), 9, 9, causal=True)
    want, _ = _ref_varlen(q, k, v, lens_q, lens_k, True)
    assert (out.double() - want).abs().max().item() < 2e-3
    # backward on the same path, LSE unused: its gradient arrives as None (the reference backward
    # has no dLSE term), and dq matches float64 autograd
    qg, qd = q.clone().requires_grad_(), q.double().requires_grad_()
    fa.flash_attn_varlen_forward(qg, k, v, _cu(lens_q), _cu(lens_k), 9, 9, causal=True).float().sum().backward()
    _ref_varlen(qd, k.double(), v.double(), lens_q, lens_k, True)[0].sum().backward()
    assert (qg.grad.double() - qd.grad).abs().max().item() < 5e-3


@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        (dict(q=rand(2, 12, 2, 16)), ValueError, "q"),
        (dict(cu_seqlens_q=torch.tensor([0.0, 12.0])), TypeError, "cu_seqlens_q"),
        (dict(cu_seqlens_k=_cu([4, 8, 5])), ValueError, "cu_seqlens"),
        (dict(max_seqlen_q=0), ValueError, "max_seqlen_q"),
        (dict(k=rand(17, 3, 16), v=rand(17, 3, 16)), ValueError, "multiple"),
        (dict(v=rand(17, 1, 16, dtype=torch.float32)), TypeError, "dtype"),
    ],
)
def test_varlen_bad_inputs(kwargs, exc, word):
    args = dict(
        q=rand(12, 2, 16), k=rand(17, 1, 16), v=rand(17, 1, 16), cu_seqlens_q=_cu([3, 9]),
        cu_seqlens_k=_cu([8, 9]), max_seqlen_q=9, max_seqlen_k=9,
    )  # fmt: skip
    args.update(kwargs)
    with pytest.raises(exc, match=word):
        fa.flash_attn_varlen_forward(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_varlen(dtype, causal):
    torch.manual_seed(4)
    lens_q, lens_k = [1, 700, 2048, 333], [1, 900, 2048, 1000]
    q = rand(sum(lens_q), 16, 128, dtype=dtype, device="cuda", requires_grad=True)
    k = rand(sum(lens_k), 4, 128, dtype=dtype, device="cuda", requires_grad=True)
    v = rand(sum(lens_k), 4, 128, dtype=dtype, device="cuda", requires_grad=True)
    cq, ck = _cu(lens_q, "cuda"), _cu(lens_k, "cuda")
    out = fa.flash_attn_varlen_forward(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    want, _ = _ref_varlen(qf, kf, vf, lens_q, lens_k, causal)
    do = rand(*q.shape, dtype=dtype, device="cuda")
    (out * do).sum().backward()
    (want * do.float()).sum().backward()
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()
    assert rel(out, want) < 2e-2
    for g, w in ((q.grad, qf.grad), (k.grad, kf.grad), (v.grad, vf.grad)):
        assert rel(g, w) < 4e-2
