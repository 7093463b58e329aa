"""int8_linear (fused dynamic quant + GEMM) and the Int8Linear module."""

import int8_gemm
import pytest
import torch
from int8_gemm import Int8Linear, int8_linear, quantize_symmetric
from torch import nn


def _ref_linear(x, w_q, w_s, bias):
    """float64 reference of the exact W8A8 math (same per-token quantization of x)."""
    x_q, sa = quantize_symmetric(x.float())
    y = (x_q.double() @ w_q.double().t()) * sa.double() * w_s.double().view(1, -1)
    if bias is not None:
        y = y + bias.double()
    return y


def test_public_api():
    assert int8_gemm.__version__ == "0.1.0"
    assert set(int8_gemm.__all__) >= {"quantize_symmetric", "int8_gemm_dequant_fwd", "int8_linear", "Int8Linear"}


@pytest.mark.parametrize("lead", [(1,), (5,), (2, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_matches_reference(lead, bias):
    torch.manual_seed(len(lead) * 10 + bias)
    K, N = 72, 40
    x = torch.randn(*lead, K, dtype=torch.float16)
    w_q = torch.randint(-127, 128, (N, K), dtype=torch.int8)
    w_s = torch.rand(N) * 1e-2 + 1e-3
    b = torch.randn(N) if bias else None
    y = int8_linear(x, w_q, w_s, b)
    assert y.dtype == torch.float16 and y.shape == (*lead, N)
    ref = _ref_linear(x.reshape(-1, K), w_q, w_s, b).view(*lead, N)
    torch.testing.assert_close(y.double(), ref, rtol=2e-3, atol=2e-3 * ref.abs().max().item())


@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("split_k", [1, 3])
def test_fused_quant_path_matches_two_kernel_path(M, split_k, monkeypatch):
    """Decode path: the GEMM quantizes x itself; results must equal quantize kernel + GEMM exactly."""
    from int8_gemm.ops import gemm as gmod
    from int8_gemm.ops import linear as lmod

    if gmod.select_backend(torch.device("cpu")) is not gmod.Backend.INTERPRETER:
        pytest.skip("the fused kernel path needs TRITON_INTERPRET=1 on CPU")
    torch.manual_seed(M * 10 + split_k)
    K, N = 200, 40  # K not a multiple of BLOCK_K
    x = torch.randn(M, K, dtype=torch.float16)
    x[0, 5] = 30.0  # outlier row
    if M > 2:
        x[1] = 0  # zero row
    w_q = torch.randint(-127, 128, (N, K), dtype=torch.int8)
    w_s = torch.rand(N) * 1e-2 + 1e-3
    b = torch.randn(N)
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, SPLIT_K=split_k, num_warps=4, num_stages=1)
    monkeypatch.setattr(gmod, "_config_for", lambda *a, **k: dict(cfg))
    monkeypatch.setattr(lmod, "FUSED_QUANT_MAX_BYTES", 32 * 1024)
    assert lmod._use_fused_quant(x)
    fused = int8_linear(x, w_q, w_s, b, out_dtype=torch.float32)
    monkeypatch.setattr(lmod, "FUSED_QUANT_MAX_BYTES", 0)
    two_kernel = int8_linear(x, w_q, w_s, b, out_dtype=torch.float32)
    assert torch.equal(fused, two_kernel)
    ref = _ref_linear(x, w_q, w_s, b)
    torch.testing.assert_close(fused.double(), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("K", [200, 4100])
def test_fused_quant_one_row_chunks(K, monkeypatch):
    """M == 1 fused quantization scans the row in unrolled chunks (several here): bit-equal to the
    quantize kernel + GEMM path."""
    from int8_gemm.ops import gemm as gmod
    from int8_gemm.ops import linear as lmod

    if gmod.select_backend(torch.device("cpu")) is not gmod.Backend.INTERPRETER:
        pytest.skip("the fused kernel path needs TRITON_INTERPRET=1 on CPU")
    monkeypatch.setattr(gmod, "_PLANS", {})
    monkeypatch.setattr(gmod, "_AMAX_CHUNK_MAX", 64)
    torch.manual_seed(K)
    x = torch.randn(1, K, dtype=torch.bfloat16)
    x[0, K - 3] = -40.0  # the absmax sits in the last, partial chunk
    w_q = torch.randint(-127, 128, (24, K), dtype=torch.int8)
    w_s = torch.rand(24) * 1e-2 + 1e-3
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, GROUP_M=1, SPLIT_K=2, num_warps=4, num_stages=1)
    monkeypatch.setattr(gmod, "_config_for", lambda *a, **k: dict(cfg))
    plan = gmod._get_plan(x, w_q.t(), None, w_s, None, torch.float32, None, True, False)
    assert plan.kw["AMAX_ONE_ROW"] and plan.kw["AMAX_NCHUNK"] == -(-K // 64)
    monkeypatch.setattr(lmod, "FUSED_QUANT_MAX_BYTES", 1 << 20)
    fused = int8_linear(x, w_q, w_s, out_dtype=torch.float32)
    monkeypatch.setattr(lmod, "FUSED_QUANT_MAX_BYTES", 0)
    assert torch.equal(fused, int8_linear(x, w_q, w_s, out_dtype=torch.float32))


def test_int8_linear_pdl_switch_cpu(monkeypatch):
    """PDL_MAX_M only applies to CUDA tensors on SM90+; on CPU the plain two-kernel path runs."""
    from int8_gemm.ops import linear as lmod

    monkeypatch.setattr(lmod, "PDL_MAX_M", 16)
    x = torch.randn(3, 64, dtype=torch.float16)
    assert not lmod._use_pdl(x)
    assert not lmod._use_pdl(x, {"PDL": 1})  # a per-shape tuning key: likewise GPU-only
    w_q = torch.randint(-127, 128, (24, 64), dtype=torch.int8)
    w_s = torch.rand(24) * 1e-2 + 1e-3
    y = int8_linear(x, w_q, w_s, out_dtype=torch.float32)
    torch.testing.assert_close(y.double(), _ref_linear(x, w_q, w_s, None), rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 4, 16])
@pytest.mark.parametrize("K", [4096, 14336])
def test_decode_modes_gpu(M, K, monkeypatch):
    """Int8Linear decode paths on the GPU (two kernels, PDL, fused quantization): identical outputs."""
    from int8_gemm.ops import linear as lmod

    torch.manual_seed(M + K)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w_q = torch.randint(-127, 128, (4096, K), dtype=torch.int8, device="cuda")
    w_s = torch.rand(4096, device="cuda") * 1e-3
    base = int8_linear(x, w_q, w_s, out_dtype=torch.float32)
    torch.testing.assert_close(base.double(), _ref_linear(x, w_q, w_s, None), rtol=1e-5, atol=1e-3)
    monkeypatch.setattr(lmod, "PDL_MAX_M", 16)
    assert torch.equal(int8_linear(x, w_q, w_s, out_dtype=torch.float32), base)
    monkeypatch.setattr(lmod, "FUSED_QUANT_MAX_BYTES", 1 << 30)
    assert torch.equal(int8_linear(x, w_q, w_s, out_dtype=torch.float32), base)


@pytest.mark.gpu
@pytest.mark.parametrize("chain", [1, 2])
@pytest.mark.parametrize("M,K", [(1, 4096), (8, 4096), (16, 4096), (1, 14336), (16, 14336)])
def test_decode_pdl_chain_gpu(chain, M, K, monkeypatch):
    """PDL across calls (PDL_CHAIN): each call's quantizer waits for the kernel before it. A CUDA graph
    of a layer stack, where every call's x is the previous call's output (and the first x is written by
    an elementwise kernel right before), must reproduce the eager chain-0 results bit for bit. (M=1 at
    K=4096 is the one-launch fused GEMV, which the switch must leave alone.)"""
    from int8_gemm.ops import linear as lmod

    torch.manual_seed(M * 31 + K + chain)
    N = K  # square layers so that outputs feed the next call
    layers = []
    for _ in range(3):
        w_q, w_s = quantize_symmetric(torch.randn(N, K, device="cuda") * 0.02)
        layers.append((w_q, w_s.view(-1) / (K**0.5 * 0.02)))
    src = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    x = torch.empty_like(src)

    def step():
        torch.add(src, 1.0, out=x)
        h = x
        for w_q, w_s in layers:
            h = int8_linear(h, w_q, w_s)
        return h

    monkeypatch.setattr(lmod, "PDL_CHAIN", 0)
    want = step()
    assert torch.isfinite(want.float()).all() and want.float().abs().max() > 0
    monkeypatch.setattr(lmod, "PDL_CHAIN", chain)
    assert torch.equal(step(), want)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up (compile) outside capture
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            got = step()
    for _ in range(3):
        got.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, want)


@pytest.mark.parametrize("bias", [True, False])
def test_int8linear_from_float(bias):
    torch.manual_seed(3)
    lin = nn.Linear(96, 33, bias=bias)
    m = Int8Linear.from_float(lin)
    assert m.weight.dtype == torch.int8 and m.weight.shape == (33, 96) and m.weight.is_contiguous()
    assert m.weight_scale.shape == (33,) and m.weight_scale.dtype == torch.float32
    # per-output-channel scales: each weight row reaches +-127
    assert (m.weight.abs().amax(dim=1) == 127).all()
    w_err = (lin.weight.double() - m.weight.double() * m.weight_scale.double()[:, None]).abs()
    assert (w_err <= m.weight_scale.double()[:, None] * (0.5 + 1e-5)).all()
    x = torch.randn(4, 7, 96, dtype=torch.float16)
    y = m(x)
    assert y.dtype == torch.float16 and y.shape == (4, 7, 33)
    ref = _ref_linear(x.reshape(-1, 96), m.weight, m.weight_scale, m.bias).view(4, 7, 33)
    torch.testing.assert_close(y.double(), ref, rtol=2e-3, atol=2e-3 * ref.abs().max().item())
    # and close to the float layer, within int8 quantization error
    fl = lin(x.float()).double()
    assert (y.double() - fl).abs().max() < 0.05 * fl.abs().max()


def test_int8linear_out_dtype_and_state_dict():
    torch.manual_seed(4)
    lin = nn.Linear(64, 16)
    m = Int8Linear.from_float(lin, out_dtype=torch.float32)
    assert m(torch.randn(3, 64, dtype=torch.float16)).dtype == torch.float32
    m2 = Int8Linear(64, 16)
    m2.load_state_dict(m.state_dict())
    assert torch.equal(m2.weight, m.weight)
    assert "in_features=64" in repr(m2)


def test_int8_linear_errors():
    w_q = torch.zeros(8, 16, dtype=torch.int8)
    w_s = torch.ones(8)
    with pytest.raises(ValueError, match="x"):
        int8_linear(torch.randn(3, 15), w_q, w_s)
    with pytest.raises(TypeError, match="w_q"):
        int8_linear(torch.randn(3, 16), w_q.float(), w_s)
    with pytest.raises(TypeError, match="x"):
        int8_linear(torch.randint(0, 3, (3, 16)), w_q, w_s)
    with pytest.raises(ValueError, match="w_scale"):
        int8_linear(torch.randn(3, 16), w_q, torch.ones(7))
    with pytest.raises(ValueError, match="bias"):
        int8_linear(torch.randn(3, 16), w_q, w_s, torch.ones(9))
    with pytest.raises(TypeError, match="linear"):
        Int8Linear.from_float(nn.Conv1d(2, 2, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 16, 32, 128, 1024])
def test_int8linear_gpu(M, dtype):
    torch.manual_seed(5)
    lin = nn.Linear(4096, 14336, device="cuda", dtype=dtype)
    m = Int8Linear.from_float(lin)
    x = torch.randn(M, 4096, device="cuda", dtype=dtype)
    y = m(x)
    assert y.dtype == dtype and y.shape == (M, 14336)
    ref = _ref_linear(x, m.weight, m.weight_scale, m.bias)
    tol = 2e-3 if dtype == torch.float16 else 1.6e-2
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())
    fl = lin(x).double()
    assert (y.double() - fl).abs().max() < 0.05 * fl.abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 2, 4])
@pytest.mark.parametrize("K", [4096, 14336])
def test_fused_quant_path_gpu(M, K, monkeypatch):
    from int8_gemm.ops import linear as lmod

    torch.manual_seed(6)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w_q = torch.randint(-127, 128, (4096, K), dtype=torch.int8, device="cuda")
    w_s = torch.rand(4096, device="cuda") * 1e-3
    monkeypatch.setattr(lmod, "FUSED_QUANT_MAX_BYTES", 1 << 20)
    fused = int8_linear(x, w_q, w_s, out_dtype=torch.float32)
    monkeypatch.setattr(lmod, "FUSED_QUANT_MAX_BYTES", 0)
    two_kernel = int8_linear(x, w_q, w_s, out_dtype=torch.float32)
    torch.testing.assert_close(fused, two_kernel, rtol=1e-6, atol=1e-6)  # same codes; fp32 sum order
    ref = _ref_linear(x, w_q, w_s, None)
    torch.testing.assert_close(fused.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.gpu
def test_int8linear_compile_gpu():
    lin = nn.Linear(512, 256, device="cuda", dtype=torch.bfloat16)
    m = Int8Linear.from_float(lin)
    x = torch.randn(2, 9, 512, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(m, fullgraph=True)
    torch.testing.assert_close(f(x), m(x))
