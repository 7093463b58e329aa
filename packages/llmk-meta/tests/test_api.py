"""The issue's seed usage, run verbatim, with its results checked against float64 / exact references."""

from __future__ import annotations

import math
import textwrap

import llm_kernels
import pytest
import torch

# Verbatim from the issue (only dedented); executed as written.
SEED = textwrap.dedent(
    """\
    import llm_kernels
    out = llm_kernels.flash_attn_forward(q, k, v, causal=True)
    A_q, sa = llm_kernels.quantize_symmetric(A_fp16)
    B_q, sb = llm_kernels.quantize_symmetric(B_fp16.T)
    out = llm_kernels.int8_gemm_dequant_fwd(A_q, B_q.T.contiguous(), sa, sb)
    out = llm_kernels.fused_rmsnorm_linear(x, w_norm, w_lin)
    attn = llm_kernels.FlashAttention(causal=True)
    proj = llm_kernels.FusedRMSNormLinear(d_in=4096, d_out=4096)
    """
)


class _Recorder(dict):
    """exec() locals that remember every value bound to a name, so each ``out`` of the seed can be checked."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.history: dict[str, list] = {}

    def __setitem__(self, key, value):
        self.history.setdefault(key, []).append(value)
        super().__setitem__(key, value)


def _ref_attention(q, k, v):
    """float64 causal attention, bottom-right aligned, GQA by head groups."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    nq, nk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.arange(nk, device=q.device)[None, :] > torch.arange(nq, device=q.device)[:, None] + (nk - nq)
    return (s.masked_fill(mask, float("-inf")).softmax(-1)) @ v


def _inputs(device, dtype, *, b, h, hkv, nq, nk, d, m, n, kdim, din, dout):
    g = torch.Generator(device=device).manual_seed(1234)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dt)

    return {
        "q": rnd(b, h, nq, d),
        "k": rnd(b, hkv, nk, d),
        "v": rnd(b, hkv, nk, d),
        "A_fp16": rnd(m, kdim, dt=torch.float16),
        "B_fp16": rnd(kdim, n, dt=torch.float16),
        "x": rnd(3, din),
        "w_norm": 1.0 + 0.3 * rnd(din),
        "w_lin": rnd(dout, din) * din**-0.5,
    }


def _run_and_check(inputs, *, attn_tol, rms_tol):
    ns = _Recorder(inputs)
    exec(compile(SEED, "<seed usage>", "exec"), {"__name__": "seed"}, ns)
    attn_out, gemm_out, rms_out = ns.history["out"]

    # flash attention vs float64
    want = _ref_attention(inputs["q"], inputs["k"], inputs["v"])
    assert attn_out.shape == inputs["q"].shape and attn_out.dtype == inputs["q"].dtype
    torch.testing.assert_close(attn_out.double(), want, rtol=attn_tol, atol=attn_tol)

    # quantization: int8 codes, per-row scales, |x - q*s| <= s/2
    A, B = inputs["A_fp16"], inputs["B_fp16"]
    A_q, sa, B_q, sb = ns["A_q"], ns["sa"], ns["B_q"], ns["sb"]
    assert A_q.dtype == torch.int8 and B_q.dtype == torch.int8 and A_q.shape == A.shape and B_q.shape == B.T.shape
    assert (A.double() - A_q.double() * sa.double()).abs().le(sa.double() / 2 + 1e-6).all()
    assert (B.T.double() - B_q.double() * sb.double()).abs().le(sb.double() / 2 + 1e-6).all()
    # int8 GEMM: exact int32 product, dequantized in fp32, output fp16 (default out_dtype)
    exact = (A_q.double() @ B_q.double().T) * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    assert gemm_out.dtype == torch.float16 and gemm_out.shape == (A.shape[0], B.shape[1])
    torch.testing.assert_close(gemm_out.double(), exact, rtol=2e-3, atol=2e-3)
    # and the whole int8 path is close to the float product
    rel = (gemm_out.double() - A.double() @ B.double()).norm() / (A.double() @ B.double()).norm()
    assert rel < 0.03, rel

    # fused RMSNorm + Linear vs float64
    x, w_norm, w_lin = inputs["x"].double(), inputs["w_norm"].double(), inputs["w_lin"].double()
    want = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w_norm) @ w_lin.T
    assert rms_out.shape == (x.shape[0], w_lin.shape[0])
    torch.testing.assert_close(rms_out.double(), want, rtol=rms_tol, atol=rms_tol)

    # the modules the seed builds
    assert isinstance(ns["attn"], llm_kernels.FlashAttention) and ns["attn"].causal
    proj = ns["proj"]
    assert isinstance(proj, llm_kernels.FusedRMSNormLinear)
    assert proj.weight.shape == (4096, 4096) and proj.norm_weight.shape == (4096,)
    return ns


def test_seed_usage_cpu_tiny():
    # Odd sizes, GQA, Nq < Nk (bottom-right causal); attention in fp32 on CPU (interpreter tl.dot).
    inputs = _inputs("cpu", torch.float32, b=2, h=4, hkv=2, nq=5, nk=9, d=16, m=7, n=11, kdim=24, din=40, dout=13)
    ns = _run_and_check(inputs, attn_tol=1e-4, rms_tol=1e-4)
    # the FlashAttention module the seed built computes the same thing as the functional call
    got = ns["attn"](inputs["q"], inputs["k"], inputs["v"])
    torch.testing.assert_close(got, ns.history["out"][0])
    # and the 4096x4096 FusedRMSNormLinear runs (torch path on CPU) and matches its own parameters
    proj = ns["proj"]
    with torch.no_grad():
        proj.norm_weight.copy_(1.0 + 0.3 * torch.randn(4096))
    xx = torch.randn(2, 4096)
    with torch.no_grad():
        y = proj(xx)
    xd = xx.double()
    want = (
        xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + proj.eps) * proj.norm_weight.double()
    ) @ proj.weight.double().T
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)


def test_versions_and_exports():
    v = llm_kernels.versions()
    assert llm_kernels.__version__ == "0.1.0" == v["llm_kernels"]
    for pkg in ("flashattn_triton", "int8_gemm", "fused_rmsnorm"):
        assert v[pkg] == __import__(pkg).__version__
    assert v["torch"] == torch.__version__
    for name in llm_kernels.__all__:
        assert hasattr(llm_kernels, name), name
    # re-exports are the kernel packages' own objects, not copies
    import flashattn_triton
    import int8_gemm

    assert llm_kernels.flash_attn_forward is flashattn_triton.flash_attn_forward
    assert llm_kernels.Int8Linear is int8_gemm.Int8Linear


def test_backends_cpu():
    b = llm_kernels.backends("cpu")
    assert b["fused_rmsnorm_linear"]["backend"] == "torch"
    from flashattn_triton._common import interpreter_enabled

    assert b["flash_attn_forward"]["backend"] == ("interpreter" if interpreter_enabled() else "torch")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_seed_usage_gpu_real_shapes(dtype):
    inputs = _inputs(
        "cuda", dtype, b=2, h=32, hkv=8, nq=1024, nk=1024, d=128, m=2048, n=4096, kdim=4096, din=4096, dout=4096
    )
    inputs["x"] = torch.randn(512, 4096, device="cuda", dtype=dtype)
    tol = 2e-2 if dtype == torch.float16 else 5e-2
    ns = _run_and_check(inputs, attn_tol=tol, rms_tol=tol * 4)
    assert ns["proj"].weight.device.type == "cpu"  # the seed builds it on the default device
