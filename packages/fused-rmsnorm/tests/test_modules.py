"""FusedRMSNormLinear / FusedRMSNormMultiLinear: fold cache + refold, from_modules, numerics."""

from __future__ import annotations

import pytest
import torch
from fused_rmsnorm import FusedRMSNormLinear, FusedRMSNormMultiLinear
from torch import nn


def ref64(x, g, w, b, eps):
    xd = x.double()
    y = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * g.double()) @ w.double().t()
    return y + b.double() if b is not None else y


def close(y, ref, tol=1e-5):
    return ((y.double() - ref).abs().max() / ref.abs().max()).item() <= tol


class HFStyleRMSNorm(nn.Module):  # the LlamaRMSNorm interface: weight + variance_epsilon
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d) + 0.5)
        self.variance_epsilon = eps

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(x.dtype)


def test_forward_and_refold_follow_parameter_changes():
    torch.manual_seed(0)
    m = FusedRMSNormLinear(24, 10, bias=True, eps=1e-6)
    with torch.no_grad():
        m.norm_weight.copy_(torch.rand(24) + 0.5)
    x = torch.randn(3, 24)
    assert close(m(x), ref64(x, m.norm_weight, m.weight, m.bias, 1e-6))
    w1 = m.folded_weight()
    assert torch.equal(w1, m.weight.detach() * m.norm_weight.detach())
    assert m.folded_weight() is w1  # cached while nothing changes

    with torch.no_grad():
        m.norm_weight.mul_(2.0)  # in-place change of g after the first call
    w2 = m.folded_weight()
    assert w2 is not w1 and torch.allclose(w2, 2 * w1)
    assert close(m(x), ref64(x, m.norm_weight, m.weight, m.bias, 1e-6))

    m.weight.data = torch.randn(10, 24)  # rebinding (new data_ptr)
    assert torch.allclose(m.folded_weight(), m.weight.detach() * m.norm_weight.detach())

    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(x).square().sum().backward()
    before = m.folded_weight().clone()
    opt.step()  # optimizer updates bump the version counter
    after = m.folded_weight()
    assert not torch.allclose(before, after)
    assert torch.allclose(after, m.weight.detach() * m.norm_weight.detach())

    m.norm_weight.data.mul_(3.0)  # .data edits bypass version tracking: refold() is the escape hatch
    m.refold()
    assert torch.allclose(m.folded_weight(), m.weight.detach() * m.norm_weight.detach())


def test_load_state_dict_triggers_refold():
    a, b = FusedRMSNormLinear(16, 8), FusedRMSNormLinear(16, 8)
    with torch.no_grad():
        b.norm_weight.uniform_(0.5, 1.5)
    old = a.folded_weight().clone()
    a.load_state_dict(b.state_dict())
    assert not torch.allclose(a.folded_weight(), old)
    assert torch.allclose(a.folded_weight(), b.folded_weight())


@pytest.mark.parametrize("norm_kind", ["torch", "hf", "torch_eps_none"])
def test_from_modules_matches_unfused(norm_kind):
    torch.manual_seed(1)
    D, N = 32, 20
    if norm_kind == "hf":
        norm = HFStyleRMSNorm(D, eps=1e-5)
    else:
        norm = nn.RMSNorm(D, eps=None if norm_kind == "torch_eps_none" else 1e-5)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
    lin = nn.Linear(D, N, bias=True)
    fused = FusedRMSNormLinear.from_modules(norm, lin)
    expect_eps = torch.finfo(torch.float32).eps if norm_kind == "torch_eps_none" else 1e-5
    assert fused.eps == pytest.approx(expect_eps)
    x = torch.randn(2, 5, D) * 4
    with torch.no_grad():
        assert torch.allclose(fused(x), lin(norm(x)), rtol=1e-4, atol=1e-5)
        assert close(fused(x), ref64(x, norm.weight, lin.weight, lin.bias, expect_eps))


def test_from_modules_rejects_mismatch():
    with pytest.raises(ValueError, match="in_features"):
        FusedRMSNormLinear.from_modules(nn.RMSNorm(16), nn.Linear(32, 8))
    with pytest.raises(ValueError, match="linears\\[1\\]"):
        FusedRMSNormMultiLinear.from_modules(nn.RMSNorm(16), [nn.Linear(16, 8), nn.Linear(12, 8)])
    with pytest.raises(ValueError, match="eps"):
        FusedRMSNormLinear(8, 8, eps=0.0)


def test_multi_linear_qkv_matches_separate_projections():
    torch.manual_seed(2)
    D = 48
    norm = HFStyleRMSNorm(D, eps=1e-6)
    q, k, v = nn.Linear(D, 48, bias=False), nn.Linear(D, 16, bias=True), nn.Linear(D, 16, bias=False)
    m = FusedRMSNormMultiLinear.from_modules(norm, [q, k, v])
    assert m.d_outs == [48, 16, 16] and m.weight.shape == (80, D)
    x = torch.randn(3, 7, D)
    with torch.no_grad():
        outs = m(x)
        h = norm(x)
        for got, lin in zip(outs, (q, k, v)):
            assert got.shape == (3, 7, lin.out_features)
            assert torch.allclose(got, lin(h), rtol=1e-4, atol=1e-5)
    # refold on the multi module: change g, result follows
    with torch.no_grad():
        norm.weight.mul_(0.5)
        m.norm_weight.mul_(0.5)
        assert torch.allclose(m.folded_weight(), m.weight * m.norm_weight)
        for got, lin in zip(m(x), (q, k, v)):
            assert torch.allclose(got, lin(norm(x)), rtol=1e-4, atol=1e-5)


def test_module_half_precision_cpu():
    torch.manual_seed(3)
    m = FusedRMSNormLinear(64, 24, bias=True).half()
    x = torch.randn(5, 64).half()
    assert close(m(x), ref64(x, m.norm_weight, m.weight, m.bias, 1e-6), tol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 300])
def test_gpu_module_refold(M):
    torch.manual_seed(4)
    m = FusedRMSNormLinear(1024, 512, bias=True).cuda().bfloat16()
    x = torch.randn(M, 1024, device="cuda").bfloat16()
    for scale in (1.0, -2.0):
        with torch.no_grad():
            m.norm_weight.fill_(scale)
            y = m(x)
        assert close(y, ref64(x, m.norm_weight, m.weight, m.bias, 1e-6), tol=1e-2)


@pytest.mark.gpu
def test_gpu_multi_linear():
    torch.manual_seed(5)
    m = FusedRMSNormMultiLinear(2048, [2048, 512, 512]).cuda().half()
    x = torch.randn(2, 200, 2048, device="cuda").half()
    with torch.no_grad():
        outs = m(x)
    ref = ref64(x, m.norm_weight, m.weight, None, 1e-6)
    for got, want in zip(outs, ref.split([2048, 512, 512], dim=-1)):
        assert close(got, want, tol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("early", [0, 4, 11])
@pytest.mark.parametrize("M", [5, 16])
def test_gpu_self_rstd_pdl_layer_stack(M, early, monkeypatch):
    """Config 11 as a programmatic dependent (ops/rmsnorm_linear.py SELF_RSTD_PDL): W' is requested before the
    wait for the previous kernel, x after it. A stack of layers in which each reads the previous one's output
    (a row-strided view), the first an x written by an elementwise kernel right before, must reproduce the
    PDL-off bits eagerly and in a CUDA graph; a call right after a refold (W' just written) is not PDL."""
    from fused_rmsnorm import backend
    from fused_rmsnorm.ops import rmsnorm_linear as R

    ext = backend.get_ext(torch.device("cuda"))
    if ext.kind == "torch" or not ext.has_gemm_sm90 or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("no SM90 CUTLASS GEMM for this GPU / binary")
    monkeypatch.setattr(R, "plan", lambda *a, **k: {"path": "gemm", "config": 11, "pdl": True})
    monkeypatch.setattr(R, "SELF_RSTD_PDL_EARLY", early)  # W' stages requested before the wait
    D, N = 1024, 2056
    torch.manual_seed(M)
    layers = [FusedRMSNormLinear(D, N).cuda().bfloat16() for _ in range(4)]
    for m in layers:
        with torch.no_grad():
            m.norm_weight.uniform_(0.5, 1.5)
    src = torch.randn(M, D, device="cuda").bfloat16()
    x = torch.empty_like(src)

    @torch.no_grad()
    def step():
        torch.add(src, 1.0, out=x)
        h = x
        for m in layers:
            h = m(h)[:, :D]
        return h

    monkeypatch.setattr(R, "SELF_RSTD_PDL", False)
    want = step().clone()
    assert torch.isfinite(want.float()).all() and want.float().abs().max() > 0
    monkeypatch.setattr(R, "SELF_RSTD_PDL", True)
    n0 = R.SELF_RSTD_PDL_LAUNCHES[0]
    for _ in range(3):
        assert torch.equal(step(), want)
    # the first pass with the switch on settles each W' (ordinary launches), the next two are PDL
    assert R.SELF_RSTD_PDL_LAUNCHES[0] - n0 == 2 * len(layers)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
    with torch.no_grad():  # W changes in place: the next call refolds, and that launch must not be PDL
        layers[2].weight.mul_(-1.0)
    n1 = R.SELF_RSTD_PDL_LAUNCHES[0]
    monkeypatch.setattr(R, "SELF_RSTD_PDL", False)
    flipped = step().clone()
    monkeypatch.setattr(R, "SELF_RSTD_PDL", True)
    with torch.no_grad():
        layers[2].weight.mul_(-1.0)  # back: refolds again; its first call is an ordinary launch
    assert not torch.equal(flipped, want)
    assert torch.equal(step(), want)
    assert R.SELF_RSTD_PDL_LAUNCHES[0] - n1 == len(layers) - 1
