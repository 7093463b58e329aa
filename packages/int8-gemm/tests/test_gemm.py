"""int8_gemm_dequant_fwd: exact int32 products, fused dequant/bias, both B layouts, split-K, errors."""

import pytest
import torch
from int8_gemm import int8_gemm_dequant_fwd, quantize_symmetric
from int8_gemm.ops import gemm as gmod


def _rand_i8(*shape, device="cpu"):
    return torch.randint(-127, 128, shape, dtype=torch.int8, device=device)


def _layouts(W):
    """B = (K, N) operands for an (N, K) weight: K-major view and row-major copy."""
    return {"kmajor": W.t(), "rowmajor": W.t().contiguous()}


def _ref_int(A, B):
    # float64 on the operands' device (BLAS / cuBLAS instead of a slow int64 matmul): exact, since
    # every partial sum of int8 products stays far below 2**53 (|sum| <= 127 * 128 * K)
    assert A.shape[1] < 2**30
    return (A.double() @ B.double()).cpu().long()


def _ref_deq(A, B, sa, sb, bias=None):
    c = _ref_int(A, B).double() * sa.cpu().double().view(-1, 1) * sb.cpu().double().view(1, -1)
    if bias is not None:
        c = c + bias.cpu().double()[None, :]
    return c


def _capture(fn):
    """Warm fn up on a side stream, then capture one call in a CUDA graph: (graph, its output)."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
    return g, out


def _poisoned_launch(monkeypatch):
    """Make every output buffer start as garbage so unwritten elements fail the comparison."""
    real_empty = torch.empty

    def empty(*args, **kw):
        t = real_empty(*args, **kw)
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype == torch.int32:
            t.fill_(-123456789)
        return t

    monkeypatch.setattr(gmod.torch, "empty", empty)


@pytest.mark.parametrize("M,N,K", [(1, 7, 33), (5, 40, 100), (33, 65, 96), (17, 31, 257)])
@pytest.mark.parametrize("layout", ["kmajor", "rowmajor"])
def test_int32_exact(M, N, K, layout, monkeypatch):
    _poisoned_launch(monkeypatch)
    torch.manual_seed(M * 1000 + N + K)
    A = _rand_i8(M, K)
    B = _layouts(_rand_i8(N, K))[layout]
    c = int8_gemm_dequant_fwd(A, B, None, None, out_dtype=torch.int32)
    assert c.dtype == torch.int32 and c.shape == (M, N)
    assert torch.equal(c.long(), _ref_int(A, B))


def test_int32_exact_strided_operands(monkeypatch):
    _poisoned_launch(monkeypatch)
    torch.manual_seed(7)
    A = _rand_i8(12, 2 * 70)[:, ::2]  # stride_ak = 2
    B = _rand_i8(3, 70, 45)[1, :, 3:40]  # a slice of a bigger buffer
    B2 = _rand_i8(37, 2, 70)[:, 0, :].t()  # neither stride is 1
    for b in (B, B2):
        c = int8_gemm_dequant_fwd(A, b, None, None, out_dtype=torch.int32)
        assert torch.equal(c.long(), _ref_int(A, b))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("split_k", [2, 3, 8])
def test_split_k_exact(split_k, fused, monkeypatch):
    """Split-K: the fused (last-arriving program reduces) and the two-kernel reduction."""
    _poisoned_launch(monkeypatch)
    torch.manual_seed(split_k)
    M, N, K = 9, 37, 230  # K not a multiple of BLOCK_K * split_k; 8 splits leave empty ones
    A, W = _rand_i8(M, K), _rand_i8(N, K)
    sa, sb = torch.rand(M) + 0.1, torch.rand(N) + 0.1
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, SPLIT_K=split_k, num_warps=4, num_stages=1)
    cfg["FUSED_REDUCE"] = fused
    if gmod.select_backend(A.device) is not gmod.Backend.INTERPRETER:
        pytest.skip("explicit kernel configs need TRITON_INTERPRET=1 on CPU")
    for _ in range(2):  # the second run proves the arrival counters were reset
        c = gmod._launch(A, W.t(), None, None, None, torch.int32, cfg)
        assert torch.equal(c.long(), _ref_int(A, W.t()))
    if fused:
        assert (gmod._COUNTERS[("cpu",)] == 0).all()
    bias = torch.randn(N)
    d = gmod._launch(A, W.t(), sa, sb, bias, torch.float32, cfg)
    torch.testing.assert_close(d.double(), _ref_deq(A, W.t(), sa, sb, bias), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("persistent,extra", [(0, {}), (1, {}), (1, {"EPI_SPLIT": 2}), (0, {"WARP_SPEC": 1})])
def test_tma_variant_exact(persistent, extra, monkeypatch):
    """The TMA-descriptor kernel (SM90 candidate in the tuning space) under the interpreter."""
    if gmod.select_backend(torch.device("cpu")) is not gmod.Backend.INTERPRETER:
        pytest.skip("explicit kernel configs need TRITON_INTERPRET=1 on CPU")
    if gmod._TensorDescriptor is None:
        pytest.skip("this Triton has no host-side TensorDescriptor")
    _poisoned_launch(monkeypatch)
    torch.manual_seed(31 + persistent)
    M, N, K = 40, 50, 80  # odd tiles: TMA zero-fills the out-of-bounds rows, cols and K tail
    A, W = _rand_i8(M, K), _rand_i8(N, K)
    sa, sb, bias = torch.rand(M) + 0.1, torch.rand(N) + 0.1, torch.randn(N)
    cfg = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, SPLIT_K=1, num_warps=4, num_stages=1, TMA=1)
    cfg["PERSISTENT"] = persistent
    cfg.update(extra)
    assert gmod._tma_ok(A, W.t())
    c = gmod._launch(A, W.t(), None, None, None, torch.int32, cfg)
    assert torch.equal(c.long(), _ref_int(A, W.t()))
    d = gmod._launch(A, W.t(), sa, sb, bias, torch.float32, cfg)
    torch.testing.assert_close(d.double(), _ref_deq(A, W.t(), sa, sb, bias), rtol=1e-5, atol=1e-3)
    # a row-major B is not TMA-eligible and falls back to the pointer kernel, still exact
    assert not gmod._tma_ok(A, W.t().contiguous())
    c2 = gmod._launch(A, W.t().contiguous(), None, None, None, torch.int32, cfg)
    assert torch.equal(c2.long(), _ref_int(A, W.t()))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("layout", ["kmajor", "rowmajor"])
def test_dequant_epilogue(out_dtype, with_bias, layout, monkeypatch):
    _poisoned_launch(monkeypatch)
    torch.manual_seed(11)
    M, N, K = 19, 45, 70
    A = _rand_i8(M, K)
    B = _layouts(_rand_i8(N, K))[layout]
    sa, sb = torch.rand(M) * 0.01 + 1e-3, torch.rand(N) * 0.01 + 1e-3
    bias = torch.randn(N) if with_bias else None
    c = int8_gemm_dequant_fwd(A, B, sa, sb, bias=bias, out_dtype=out_dtype)
    assert c.dtype == out_dtype and c.shape == (M, N)
    ref = _ref_deq(A, B, sa, sb, bias)
    tol = dict(rtol=1e-5, atol=1e-4) if out_dtype == torch.float32 else dict(rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(c.double(), ref, **tol)


def test_scale_shapes_and_scalars():
    torch.manual_seed(12)
    M, N, K = 6, 10, 40
    A, W = _rand_i8(M, K), _rand_i8(N, K)
    sa, sb = torch.rand(M) + 0.5, torch.rand(N) + 0.5
    ref = _ref_deq(A, W.t(), sa, sb)
    for a_s, b_s in [(sa, sb), (sa[:, None], sb[:, None]), (sa[:, None], sb[None, :])]:
        c = int8_gemm_dequant_fwd(A, W.t(), a_s, b_s, out_dtype=torch.float32)
        torch.testing.assert_close(c.double(), ref, rtol=1e-5, atol=1e-4)
    c = int8_gemm_dequant_fwd(A, W.t(), 0.5, torch.tensor(2.0), out_dtype=torch.float32)
    torch.testing.assert_close(c.double(), _ref_int(A, W.t()).double(), rtol=1e-6, atol=0)


def test_seed_usage_round_trip():
    """The seed's flow: quantize A per row and B per column, GEMM, compare with the float GEMM."""
    torch.manual_seed(13)
    A, B = torch.randn(33, 96), torch.randn(96, 20)
    A_q, sa = quantize_symmetric(A)
    B_q, sb = quantize_symmetric(B.T)
    c = int8_gemm_dequant_fwd(A_q, B_q.T.contiguous(), sa, sb, out_dtype=torch.float32)
    ref = A.double() @ B.double()
    # int8 quantization error: a few percent of the typical output magnitude
    assert (c.double() - ref).abs().max() < 0.05 * ref.abs().max()
    torch.testing.assert_close(c.double(), _ref_deq(A_q, B_q.T, sa, sb), rtol=1e-5, atol=1e-4)


def test_gemm_errors():
    A, B = _rand_i8(4, 8), _rand_i8(8, 5)
    sa, sb = torch.ones(4), torch.ones(5)
    with pytest.raises(TypeError, match="A_q"):
        int8_gemm_dequant_fwd(A.float(), B, sa, sb)
    with pytest.raises(TypeError, match="B_q"):
        int8_gemm_dequant_fwd(A, B.to(torch.int32), sa, sb)
    with pytest.raises(ValueError, match="B_q"):
        int8_gemm_dequant_fwd(A, _rand_i8(9, 5), sa, sb)
    with pytest.raises(ValueError, match="A_q"):
        int8_gemm_dequant_fwd(A[0], B, sa, sb)
    with pytest.raises(ValueError, match="sa"):
        int8_gemm_dequant_fwd(A, B, torch.ones(3), sb)
    with pytest.raises(ValueError, match="sb"):
        int8_gemm_dequant_fwd(A, B, sa, torch.ones(5, 2))
    with pytest.raises(TypeError, match="sb"):
        int8_gemm_dequant_fwd(A, B, sa, torch.ones(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="bias"):
        int8_gemm_dequant_fwd(A, B, sa, sb, bias=torch.ones(4))
    with pytest.raises(TypeError, match="out_dtype"):
        int8_gemm_dequant_fwd(A, B, sa, sb, out_dtype=torch.int8)
    with pytest.raises(ValueError, match="int32"):
        int8_gemm_dequant_fwd(A, B, sa, sb, out_dtype=torch.int32)
    with pytest.raises(ValueError, match="sa"):
        int8_gemm_dequant_fwd(A, B, None, sb)
    meta = torch.empty(4, 8, dtype=torch.int8, device="meta")
    with pytest.raises(ValueError, match="B_q"):
        int8_gemm_dequant_fwd(meta, B, sa, sb)


def test_tuning_table_covers_arches():
    for arch in ("sm90", "sm86", "cpu"):
        for M in (1, 16, 17, 100, 1024, 5000):
            cfg = gmod._table().lookup(arch, M=M, N=4096, K=4096, b_kmajor=True)
            assert {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages"} <= cfg.keys()
    assert gmod._table().lookup("sm86", M=512, N=1, K=1)["BLOCK_M"] == 64
    assert gmod._table().lookup("sm86", M=2048, N=1, K=1)["BLOCK_M"] == 128


# ------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "M,N,K", [(1, 4096, 4096), (16, 14336, 4096), (33, 4096, 14336), (1000, 1000, 1000), (4096, 4096, 4096)]
)
@pytest.mark.parametrize("layout", ["kmajor", "rowmajor"])
def test_int32_exact_gpu(M, N, K, layout):
    torch.manual_seed(21)
    A = _rand_i8(M, K, device="cuda")
    B = _layouts(_rand_i8(N, K, device="cuda"))[layout]
    c = int8_gemm_dequant_fwd(A, B, None, None, out_dtype=torch.int32)
    ref = (A.double() @ B.double()).long()  # exact: |sum| < 2**53
    assert torch.equal(c.long(), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (16, 4096, 14336), (127, 515, 999), (2048, 2048, 2048)])
def test_dequant_gpu(M, N, K, out_dtype):
    torch.manual_seed(22)
    A, W = _rand_i8(M, K, device="cuda"), _rand_i8(N, K, device="cuda")
    sa = torch.rand(M, device="cuda") * 1e-3 + 1e-4
    sb = torch.rand(N, device="cuda") * 1e-3 + 1e-4
    bias = torch.randn(N, device="cuda", dtype=out_dtype)
    c = int8_gemm_dequant_fwd(A, W.t(), sa, sb, bias=bias, out_dtype=out_dtype)
    ref = (A.double() @ W.double().t()) * sa.double()[:, None] * sb.double()[None, :] + bias.double()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[out_dtype]
    torch.testing.assert_close(c.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("split_k", [1, 2, 4, 7, 16])
def test_split_k_gpu(split_k, fused):
    torch.manual_seed(23)
    M, N, K = 16, 1000, 5000
    A, W = _rand_i8(M, K, device="cuda"), _rand_i8(N, K, device="cuda")
    cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, SPLIT_K=split_k, num_warps=4, num_stages=3)
    cfg["FUSED_REDUCE"] = fused
    ref = (A.double() @ W.double().t()).long()
    for _ in range(20):  # repeated launches: a counter left non-zero or a race would show up
        c = gmod._launch(A, W.t(), None, None, None, torch.int32, cfg)
        assert torch.equal(c.long(), ref)


class _Forbidden:
    def __getitem__(self, grid):
        raise AssertionError("the two-kernel split-K reduction ran; the fused one was expected")


@pytest.mark.gpu
def test_split_k_cuda_graph_gpu(monkeypatch):
    """Decode path under CUDA-graph replay (how it is benchmarked and served): the fused split-K
    reduction must be used inside the capture too (torch.cuda.graph captures on its own stream)."""
    torch.manual_seed(24)
    A, W = _rand_i8(1, 4096, device="cuda"), _rand_i8(4096, 4096, device="cuda")
    sa, sb = torch.rand(1, device="cuda") * 1e-3, torch.rand(4096, device="cuda") * 1e-3
    cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_M=1, SPLIT_K=4, num_warps=4, num_stages=4)
    f = lambda: gmod._launch(A, W.t(), sa, sb, None, torch.bfloat16, cfg)
    ref = f().clone()
    monkeypatch.setattr(gmod, "_splitk_reduce_kernel", _Forbidden())
    g, out = _capture(f)
    for _ in range(10):
        A.random_(-127, 128)
        g.replay()
        torch.testing.assert_close(out, f(), rtol=0, atol=0)
    assert not torch.equal(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [0, 1, 2])
@pytest.mark.parametrize("M,N,K", [(4096, 4096, 4096), (1000, 1000, 1008), (129, 14336, 4096)])
def test_tma_variant_gpu(M, N, K, persistent):
    torch.manual_seed(25)
    A, W = _rand_i8(M, K, device="cuda"), _rand_i8(N, K, device="cuda")
    cfg = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_M=8, SPLIT_K=1, num_warps=8, num_stages=3, TMA=1)
    cfg["PERSISTENT"] = persistent
    assert gmod._tma_ok(A, W.t())
    c = gmod._launch(A, W.t(), None, None, None, torch.int32, cfg)
    assert torch.equal(c.long(), (A.double() @ W.double().t()).long())


@pytest.mark.gpu
def test_device_mismatch_gpu():
    A = _rand_i8(4, 8, device="cuda")
    with pytest.raises(ValueError, match="B_q"):
        int8_gemm_dequant_fwd(A, _rand_i8(8, 5), torch.ones(4, device="cuda"), torch.ones(5, device="cuda"))
    with pytest.raises(ValueError, match="sb"):
        int8_gemm_dequant_fwd(A, _rand_i8(8, 5, device="cuda"), torch.ones(4, device="cuda"), torch.ones(5))


@pytest.mark.gpu
def test_torch_compile_no_graph_break():
    A, W = _rand_i8(64, 256, device="cuda"), _rand_i8(128, 256, device="cuda")
    sa, sb = torch.rand(64, device="cuda"), torch.rand(128, device="cuda")
    f = torch.compile(lambda a, w, x, y: int8_gemm_dequant_fwd(a, w.t(), x, y), fullgraph=True)
    torch.testing.assert_close(f(A, W, sa, sb), int8_gemm_dequant_fwd(A, W.t(), sa, sb))


def test_custom_op_registration():
    """Fake kernels + schema are consistent, and torch.compile traces the op without graph breaks."""
    from int8_gemm.ops import linear as lmod
    from int8_gemm.ops import quantize as qmod

    torch.manual_seed(41)
    A, W = _rand_i8(5, 64), _rand_i8(24, 64)
    sa, sb = torch.rand(5), torch.rand(24)
    torch.library.opcheck(gmod._gemm_dequant_op, (A, W.t(), sa, sb, None, torch.float16))
    torch.library.opcheck(gmod._gemm_dequant_op, (A, W.t(), None, None, None, torch.int32))
    torch.library.opcheck(qmod._quantize_rows_op, (torch.randn(5, 64),))
    torch.library.opcheck(lmod._int8_linear_op, (torch.randn(5, 64), W, sb, torch.randn(24), torch.float32))
    f = torch.compile(lambda a, w, x, y: int8_gemm_dequant_fwd(a, w.t(), x, y), fullgraph=True, backend="aot_eager")
    assert torch.equal(f(A, W, sa, sb), int8_gemm_dequant_fwd(A, W.t(), sa, sb))


@pytest.mark.gpu
def test_opt_in_autotune_gpu(monkeypatch):
    """INT8_GEMM_AUTOTUNE=1 benchmarks the candidates once per key, caches the winner, stays exact."""
    monkeypatch.setenv("INT8_GEMM_AUTOTUNE", "1")
    monkeypatch.setattr(gmod, "_AUTOTUNE_CACHE", {})
    A, W = _rand_i8(40, 512, device="cuda"), _rand_i8(520, 512, device="cuda")
    c = int8_gemm_dequant_fwd(A, W.t(), None, None, out_dtype=torch.int32)
    assert torch.equal(c.long(), (A.double() @ W.double().t()).long())
    (key, cfg), *_ = gmod._AUTOTUNE_CACHE.items()
    assert key[1] == gmod.m_bucket(40) and cfg in gmod.candidate_configs(40, key[0])


def test_launch_plan_cached_per_shape(monkeypatch):
    """The config is looked up once per shape key; a new shape, layout or config gets its own plan."""
    if gmod.select_backend(torch.device("cpu")) is not gmod.Backend.INTERPRETER:
        pytest.skip("needs TRITON_INTERPRET=1 on CPU")
    _poisoned_launch(monkeypatch)
    monkeypatch.setattr(gmod, "_PLANS", {})
    calls = []
    real = gmod._config_for

    def counting(*a, **k):
        calls.append(a[:3])
        return real(*a, **k)

    monkeypatch.setattr(gmod, "_config_for", counting)
    torch.manual_seed(51)
    for M, N, K in [(3, 40, 70), (3, 40, 70), (21, 40, 70), (3, 40, 70)]:
        A, W = _rand_i8(M, K), _rand_i8(N, K)
        sa, sb = torch.rand(M) + 0.1, torch.rand(N) + 0.1
        d = int8_gemm_dequant_fwd(A, W.t(), sa, sb, out_dtype=torch.float32)
        torch.testing.assert_close(d.double(), _ref_deq(A, W.t(), sa, sb), rtol=1e-5, atol=1e-3)
        c = int8_gemm_dequant_fwd(A, W.t().contiguous(), None, None, out_dtype=torch.int32)  # other layout
        assert torch.equal(c.long(), _ref_int(A, W.t()))
    assert calls == [(3, 40, 70), (3, 40, 70), (21, 40, 70), (21, 40, 70)]  # 2 layouts x 2 shapes
    # explicit configs are keyed by value: a different config on the same shape is not a stale plan
    A, W = _rand_i8(9, 70), _rand_i8(37, 70)
    for sk in (1, 3, 1):
        cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, SPLIT_K=sk, num_warps=4, num_stages=1)
        c = gmod._launch(A, W.t(), None, None, None, torch.int32, cfg)
        assert torch.equal(c.long(), _ref_int(A, W.t()))
        assert gmod._get_plan(A, W.t(), None, None, None, torch.int32, cfg, False, False).split_k == sk


def test_decode_options_ignored_off_gpu(monkeypatch):
    """PREFETCH (inline PTX) and pdl have no interpreter form: on CPU they are dropped, results exact."""
    if gmod.select_backend(torch.device("cpu")) is not gmod.Backend.INTERPRETER:
        pytest.skip("needs TRITON_INTERPRET=1 on CPU")
    _poisoned_launch(monkeypatch)
    torch.manual_seed(52)
    A, W = _rand_i8(1, 300), _rand_i8(45, 300)
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, GROUP_M=1, SPLIT_K=2, num_warps=4, num_stages=1, PREFETCH=1)
    p = gmod._get_plan(A, W.t(), None, None, None, torch.int32, cfg, False, True)
    assert "PF_LINES" not in p.kw and "PDL_WAIT" not in p.kw and "launch_pdl" not in p.kw
    c = gmod._launch(A, W.t(), None, None, None, torch.int32, cfg, pdl=True)
    assert torch.equal(c.long(), _ref_int(A, W.t()))


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,split_k", [(1, 4096, 4096, 4), (16, 1000, 5000, 3), (5, 4096, 14336, 1)])
def test_prefetch_and_pdl_gpu(M, N, K, split_k):
    """L2 prefetch of the weight slab and the PDL launch (after the quantizer): exact, also under
    CUDA-graph replay."""
    from int8_gemm.ops import quantize as qmod

    torch.manual_seed(53)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    W = _rand_i8(N, K, device="cuda")
    sb = torch.rand(N, device="cuda") * 1e-3
    cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_M=1, SPLIT_K=split_k, num_warps=4, num_stages=4)
    cfg["PREFETCH"] = 1

    def run(pdl):
        q, s = qmod._launch_quantize_rows(x, pdl=pdl)
        return gmod._launch(q, W.t(), s, sb, None, torch.float32, cfg, pdl=pdl), q, s

    ref_out, q, s = run(False)
    exact = (q.double() @ W.double().t()) * s.double()[:, None] * sb.double()[None, :]
    torch.testing.assert_close(ref_out.double(), exact, rtol=1e-6, atol=1e-6 * exact.abs().max().item())
    assert torch.equal(run(True)[0], ref_out)
    g, out = _capture(lambda: run(True)[0])
    for _ in range(5):
        x.normal_()
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, run(False)[0], rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------
# Direct launch of the cached compiled kernel (llmk_common/direct.py)
# ----------------------------------------------------------------------------------------------


class _FakeCompiled:
    function = 7
    packed_metadata = ("md",)

    def __init__(self, fail):
        self.fail, self.calls = fail, []

    def run(self, *a):
        if self.fail:
            raise RuntimeError("launcher signature changed")
        self.calls.append(a)


class _FakeJit:
    """fn[grid](*args, **kw) records a normal launch and returns the 'compiled kernel'."""

    def __init__(self, fail):
        self.k, self.normal = _FakeCompiled(fail), 0

        def fn(a, b, X: int = 3, Y: int = 4):
            pass

        self.fn = fn

    def __getitem__(self, grid):
        def go(*args, **kw):
            self.normal += 1
            return self.k

        return go


@pytest.mark.parametrize("fail", [False, True])
def test_direct_launch_state_machine(fail, monkeypatch):
    """First call normal + capture; then direct (constexpr tail in signature order, 3-D grid), or on a
    failing first direct launch the normal path for good; a different alignment key goes normal."""
    from int8_gemm._common import direct as _direct

    monkeypatch.setattr(_direct, "ENABLED", True)
    monkeypatch.setattr(
        _direct,
        "_knobs",
        type(
            "K",
            (),
            {
                "runtime": type(
                    "R",
                    (),
                    {
                        "launch_enter_hook": type("H", (), {"calls": []})(),
                        "launch_exit_hook": type("H", (), {"calls": []})(),
                    },
                )
            },
        ),
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: 99, raising=False)
    fj, d = _FakeJit(fail), _direct.Direct()
    for _ in range(4):
        _direct.launch(d, fj, (5, 2), ("A", "B"), dict(Y=9, num_warps=4), (0,))
    if fail:
        assert fj.normal == 4 and d.state == _direct._OFF and "launcher" in d.error
    else:
        assert fj.normal == 1 and d.state == _direct._PROVEN
        assert len(fj.k.calls) == 3
        assert fj.k.calls[0][:5] == (5, 2, 1, 99, 7) and fj.k.calls[0][9:] == ("A", "B", 3, 9)
        _direct.launch(d, fj, (5, 2), ("A", "B"), dict(Y=9, num_warps=4), (8,))  # misaligned: normal path
        assert fj.normal == 2 and len(fj.k.calls) == 3
        monkeypatch.setattr(_direct, "ENABLED", False)  # kill switch
        _direct.launch(d, fj, (5, 2), ("A", "B"), dict(Y=9, num_warps=4), (0,))
        assert fj.normal == 3


def _direct_cases():
    t = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, SPLIT_K=1, num_warps=4, num_stages=3)
    sk = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, SPLIT_K=4, num_warps=4, num_stages=3)
    return {
        "table": (1000, 1000, 1008, None),
        "tma": (1024, 4096, 4096, dict(t, TMA=1)),
        "tma_persistent_epi2": (1000, 1000, 1008, dict(t, TMA=1, PERSISTENT=1, EPI_SPLIT=2, BLOCK_N=256, num_warps=8)),
        "splitk_fused": (16, 1000, 5000, sk),
        "splitk_two_kernel": (16, 1000, 5000, dict(sk, FUSED_REDUCE=False)),
        "pointer": (200, 300, 1000, dict(t, BLOCK_M=64)),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(_direct_cases()))
def test_direct_launch_matches_normal_gpu(case, monkeypatch):
    """Direct and normal launch give bit-identical outputs (eager, misaligned operand, CUDA graph)."""
    from int8_gemm._common import direct as _direct
    from int8_gemm.ops import quantize as qmod

    M, N, K, cfg = _direct_cases()[case]
    torch.manual_seed(26)
    A, W = _rand_i8(M, K, device="cuda"), _rand_i8(N, K, device="cuda")
    sa = torch.rand(M, device="cuda") * 1e-3 + 1e-4
    sb = torch.rand(N, device="cuda") * 1e-3 + 1e-4
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)

    def f(a):
        y = gmod._launch(a, W.t(), sa, sb, bias, torch.bfloat16, cfg)
        q, s = qmod._launch_quantize_rows(x)
        return y, q, s

    def fresh():
        gmod._PLANS.clear()
        qmod._QPLANS.clear()

    monkeypatch.setattr(_direct, "ENABLED", False)
    fresh()
    ref = [t.clone() for t in f(A)]
    ref_deq = (A.double() @ W.double().t()) * sa.double()[:, None] * sb.double()[None, :] + bias.double()
    torch.testing.assert_close(ref[0].double(), ref_deq, rtol=1.6e-2, atol=1.6e-2 * ref_deq.abs().max().item())
    monkeypatch.setattr(_direct, "ENABLED", True)
    fresh()
    for _ in range(3):  # capture, first direct launch, proven direct launch
        for o, r in zip(f(A), ref):
            assert torch.equal(o, r)
    states = [p.dl.state for p in gmod._PLANS.values()] + [p[2].state for p in qmod._QPLANS.values()]
    assert states and all(s == _direct._PROVEN for s in states), states
    # same shape and strides, 1-byte-misaligned base: the alignment guard must take the normal path
    buf = torch.empty(M * K + 16, dtype=torch.int8, device="cuda")
    A_mis = buf[1 : 1 + M * K].view(M, K)
    A_mis.copy_(A)
    assert torch.equal(f(A_mis)[0], ref[0])
    # CUDA graph: capture the direct launches, replay on new inputs, compare with the normal path
    g, outs = _capture(lambda: f(A))
    for _ in range(3):
        A.random_(-127, 128)
        x.normal_()
        g.replay()
        torch.cuda.synchronize()
        monkeypatch.setattr(_direct, "ENABLED", False)
        exp = f(A)
        monkeypatch.setattr(_direct, "ENABLED", True)
        for o, r in zip(outs, exp):
            assert torch.equal(o, r)


# ----------------------------------------------------------------------------------------------
# Decode GEMV ("GEMV": 1): byte-wise and dp4a, split-K, fused per-token quantization
# ----------------------------------------------------------------------------------------------


def _gemv_cfg(dp4a, split_k, bn=16, bk=32, **kw):
    return dict(GEMV=1, DP4A=dp4a, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=1, SPLIT_K=split_k,
                num_warps=4, num_stages=1, **kw)  # fmt: skip


def _tc_cfg(M):
    """The tensor-core (tl.dot) kernel for the same small M: a GEMV result must match it bit for bit."""
    return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_M=1, SPLIT_K=1, num_warps=4, num_stages=4)


def _need_interp():
    if gmod.select_backend(torch.device("cpu")) is not gmod.Backend.INTERPRETER:
        pytest.skip("explicit kernel configs need TRITON_INTERPRET=1 on CPU")


@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("dp4a,split_k", [(0, 1), (1, 3), (1, 1)])
def test_gemv_exact(M, dp4a, split_k, monkeypatch):
    """int32 products exact; dequant (+bias, fp16/bf16) identical to the torch reference math."""
    _need_interp()
    _poisoned_launch(monkeypatch)
    torch.manual_seed(M * 10 + split_k + dp4a)
    N, K = 37, 100  # odd N (wrapped edge rows), K not a multiple of BLOCK_K * split
    A, W = _rand_i8(M, K), _rand_i8(N, K)
    cfg = _gemv_cfg(dp4a, split_k)
    p = gmod._get_plan(A, W.t(), None, None, None, torch.int32, cfg, False, False)
    assert p.kind == "gemv" and p.kw.get("DP4A", False) == bool(dp4a) and p.split_k == split_k
    c = gmod._launch(A, W.t(), None, None, None, torch.int32, cfg)
    assert torch.equal(c.long(), _ref_int(A, W.t()))
    sa, sb = torch.rand(M) + 0.1, torch.rand(N) + 0.1
    std = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, SPLIT_K=1, num_warps=4, num_stages=1)
    for out_dtype, bias in ((torch.float16, torch.randn(N, dtype=torch.float16)), (torch.bfloat16, None)):
        d = gmod._launch(A, W.t(), sa, sb, bias, out_dtype, cfg)
        # same epilogue math as the tensor-core kernel: bit-identical outputs
        assert torch.equal(d, gmod._launch(A, W.t(), sa, sb, bias, out_dtype, std))
        d32 = gmod._launch(A, W.t(), sa, sb, bias, torch.float32, cfg)
        assert torch.equal(d32, gmod._gemm_torch(A, W.t(), sa, sb, bias, torch.float32))


def test_gemv_dp4a_falls_back_when_unaligned(monkeypatch):
    """K % 4 != 0 or an unaligned weight base: the byte-wise GEMV, still exact."""
    _need_interp()
    _poisoned_launch(monkeypatch)
    torch.manual_seed(5)
    A, W = _rand_i8(2, 99), _rand_i8(21, 99)
    cfg = _gemv_cfg(1, 2)
    assert not gmod._get_plan(A, W.t(), None, None, None, torch.int32, cfg, False, False).kw.get("DP4A")
    assert torch.equal(gmod._launch(A, W.t(), None, None, None, torch.int32, cfg).long(), _ref_int(A, W.t()))
    Wb = _rand_i8(21 * 100 + 1)[1:].view(21, 100)  # base 1 byte off: word loads impossible
    A2 = _rand_i8(2, 100)
    assert torch.equal(gmod._launch(A2, Wb.t(), None, None, None, torch.int32, cfg).long(), _ref_int(A2, Wb.t()))


@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("dp4a,split_k", [(0, 1), (1, 3)])
def test_gemv_fused_quant_bit_identical(M, dp4a, split_k, monkeypatch):
    """The GEMV quantizing x itself == quantize_symmetric + GEMM, bit for bit (zero row included)."""
    _need_interp()
    _poisoned_launch(monkeypatch)
    torch.manual_seed(M + 100 * dp4a + split_k)
    N, K = 37, 100
    W = _rand_i8(N, K)
    x = torch.randn(M, K, dtype=torch.float16) * 3
    if M > 1:
        x[1] = 0  # zero row: scale MIN_ABSMAX / 127, codes 0
    sb, bias = torch.rand(N) + 0.1, torch.randn(N, dtype=torch.float16)
    cfg = _gemv_cfg(dp4a, split_k)
    xq, sa = quantize_symmetric(x)
    for out_dtype in (torch.float16, torch.bfloat16):
        two = gmod._launch(xq, W.t(), sa.view(-1), sb, bias, out_dtype, cfg)
        fused = gmod._launch(x, W.t(), None, sb, bias, out_dtype, cfg, quant_a=True)
        assert torch.equal(fused, two)
    d32 = gmod._launch(x, W.t(), None, sb, bias, torch.float32, cfg, quant_a=True)
    assert torch.equal(d32, gmod._gemm_torch(xq, W.t(), sa.view(-1), sb, bias, torch.float32))


def test_int8_linear_fused_quant_from_config(monkeypatch):
    """A tuning entry with GEMV + FUSED_QUANT makes int8_linear one launch (no quantize kernel)."""
    _need_interp()
    from int8_gemm import int8_linear
    from int8_gemm.ops import linear as lmod

    torch.manual_seed(77)
    M, N, K = 3, 37, 100
    x, W = torch.randn(M, K, dtype=torch.float16), _rand_i8(N, K)
    sb, bias = torch.rand(N) + 0.1, torch.randn(N, dtype=torch.float16)
    two = int8_linear(x, W, sb, bias)  # shipped table: quantize kernel + GEMM
    cfg = _gemv_cfg(1, 2, FUSED_QUANT=1)
    monkeypatch.setattr(gmod, "_config_for", lambda *a: cfg)

    def no_quant(*a, **k):
        raise AssertionError("the quantize kernel ran; fused quantization was expected")

    monkeypatch.setattr(lmod, "_launch_quantize_rows", no_quant)
    fused = int8_linear(x, W, sb, bias)
    assert torch.equal(fused, two)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("N,K", [(4096, 4096), (4096, 14336), (14336, 4096), (1001, 3000)])
@pytest.mark.parametrize("dp4a", [0, 1])
def test_gemv_gpu(M, N, K, dp4a):
    torch.manual_seed(M + N + K)
    dev = "cuda"
    W = _rand_i8(N, K, device=dev)
    x = torch.randn(M, K, dtype=torch.bfloat16, device=dev)
    sb = torch.rand(N, device=dev) * 1e-3
    bias = torch.randn(N, dtype=torch.bfloat16, device=dev)
    cfg = _gemv_cfg(dp4a, 0, bn=16, bk=512)
    xq, sa = quantize_symmetric(x)
    c = gmod._launch(xq, W.t(), None, None, None, torch.int32, cfg)
    assert torch.equal(c.cpu().long(), _ref_int(xq, W.t())), "GEMV int32 products are not exact"
    two = gmod._launch(xq, W.t(), sa.view(-1), sb, bias, torch.bfloat16, cfg)
    ref = gmod._gemm_torch(xq, W.t(), sa.view(-1), sb, bias, torch.float32)
    assert (two.float() - ref).norm() / ref.norm() < 1e-2
    # Same int32 products and the same epilogue source as the tensor-core kernel; each compiled kernel
    # may contract acc * sa * sb + bias into FMAs differently, so agreement is to one bf16 ulp.
    tc = gmod._launch(xq, W.t(), sa.view(-1), sb, bias, torch.bfloat16, _tc_cfg(M))
    torch.testing.assert_close(two, tc, rtol=2**-7, atol=1e-6)
    # fused quantization: the same x_q and scales as quantize_symmetric, so the same products
    fused = gmod._launch(x, W.t(), None, sb, bias, torch.bfloat16, cfg, quant_a=True)
    torch.testing.assert_close(fused, two, rtol=2**-7, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16])
def test_gemv_fused_quant_cuda_graph_gpu(M):
    """One-launch decode (fused quant, split-K last-arrival reduction) under CUDA-graph replay."""
    torch.manual_seed(M)
    W = _rand_i8(4096, 4096, device="cuda")
    x = torch.randn(M, 4096, dtype=torch.bfloat16, device="cuda")
    sb = torch.rand(4096, device="cuda") * 1e-3
    cfg = _gemv_cfg(1, 4, bn=16, bk=512)
    f = lambda: gmod._launch(x, W.t(), None, sb, None, torch.bfloat16, cfg, quant_a=True)
    ref = f().clone()
    g, out = _capture(f)
    for _ in range(5):
        x.normal_()
        g.replay()
        xq, sa = quantize_symmetric(x)
        torch.testing.assert_close(
            out, gmod._launch(xq, W.t(), sa.view(-1), sb, None, torch.bfloat16, cfg), rtol=0, atol=0
        )
    assert not torch.equal(out, ref)


# ----------------------------------------------------------------------------------------------
# Swap-AB decode kernel (C^T = W . x^T, TMA + wgmma on SM90; "SWAP_AB": 1 configs)
# ----------------------------------------------------------------------------------------------


def _swap_cfg(split_k=1, bn=64, bk=64, **kw):
    return dict(SWAP_AB=1, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=1, SPLIT_K=split_k,
                num_warps=4, num_stages=3, **kw)  # fmt: skip


@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("K,split_k", [(96, 1), (1000, 3)])
def test_swapab_exact(M, K, split_k, monkeypatch):
    """int32 products exact (odd N: zero-filled weight rows; K tail; M < 16: zero-filled tokens);
    dequant + bias vs float64, and bit-identical to the pointer kernel's epilogue math."""
    _need_interp()
    if gmod._TensorDescriptor is None:
        pytest.skip("this Triton has no host-side TensorDescriptor")
    _poisoned_launch(monkeypatch)
    torch.manual_seed(M * 10 + K)
    N = 200
    A, W = _rand_i8(M, K), _rand_i8(N, K)
    cfg = _swap_cfg(split_k, bn=64, bk=128 if K > 500 else 32)
    p = gmod._get_plan(A, W.t(), None, None, None, torch.int32, cfg, False, False)
    assert p.kind == "swapab" and p.split_k == split_k and p.fused == (split_k > 1)
    for _ in range(2):  # the second run proves the split-K arrival counters were reset
        c = gmod._launch(A, W.t(), None, None, None, torch.int32, cfg)
        assert torch.equal(c.long(), _ref_int(A, W.t()))
    sa, sb, bias = torch.rand(M) + 0.1, torch.rand(N) + 0.1, torch.randn(N)
    d = gmod._launch(A, W.t(), sa, sb, bias, torch.float32, cfg)
    torch.testing.assert_close(d.double(), _ref_deq(A, W.t(), sa, sb, bias), rtol=1e-5, atol=1e-3)
    assert torch.equal(d, gmod._gemm_torch(A, W.t(), sa, sb, bias, torch.float32))
    h = gmod._launch(A, W.t(), sa, sb, None, torch.float16, cfg)
    std = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, SPLIT_K=1, num_warps=4, num_stages=1)
    assert torch.equal(h, gmod._launch(A, W.t(), sa, sb, None, torch.float16, std))


def test_swapab_two_kernel_reduction_and_fallbacks(monkeypatch):
    """FUSED_REDUCE false (partials + _splitk_reduce_kernel); calls the swap-AB kernel cannot take
    (M > 16, row-major B, fused quantization, odd-strided x) run the pointer kernel, still exact."""
    _need_interp()
    if gmod._TensorDescriptor is None:
        pytest.skip("this Triton has no host-side TensorDescriptor")
    _poisoned_launch(monkeypatch)
    torch.manual_seed(3)
    N, K = 70, 160
    W = _rand_i8(N, K)
    cfg = _swap_cfg(2, bk=32, FUSED_REDUCE=False)
    A = _rand_i8(7, K)
    p = gmod._get_plan(A, W.t(), None, None, None, torch.int32, cfg, False, False)
    assert p.kind == "swapab" and not p.fused and p.reduce_grid is not None
    sa, sb = torch.rand(7) + 0.1, torch.rand(N) + 0.1
    d = gmod._launch(A, W.t(), sa, sb, None, torch.float32, cfg)
    torch.testing.assert_close(d.double(), _ref_deq(A, W.t(), sa, sb), rtol=1e-5, atol=1e-3)
    A17 = _rand_i8(17, K)
    assert gmod._get_plan(A17, W.t(), None, None, None, torch.int32, cfg, False, False).kind == "std"
    assert torch.equal(gmod._launch(A17, W.t(), None, None, None, torch.int32, cfg).long(), _ref_int(A17, W.t()))
    Wr = W.t().contiguous()
    assert gmod._get_plan(A, Wr, None, None, None, torch.int32, cfg, False, False).kind == "std"
    assert torch.equal(gmod._launch(A, Wr, None, None, None, torch.int32, cfg).long(), _ref_int(A, Wr))
    x = torch.randn(3, K)
    assert gmod._get_plan(x, W.t(), None, sb, None, torch.float32, cfg, True, False).kind == "std"
    A_odd = _rand_i8(3, K + 8)[:, 3 : K + 3]  # row stride K + 8 is fine, the base is 3 bytes off
    assert not gmod._swapab_tma_ok(A_odd, W.t())
    assert torch.equal(gmod._launch(A_odd, W.t(), None, None, None, torch.int32, cfg).long(), _ref_int(A_odd, W.t()))


def test_int8_linear_swapab_from_config(monkeypatch):
    """A "SWAP_AB": 1 tuning entry routes int8_linear's GEMM through the swap-AB kernel."""
    _need_interp()
    if gmod._TensorDescriptor is None:
        pytest.skip("this Triton has no host-side TensorDescriptor")
    from int8_gemm import int8_linear

    torch.manual_seed(78)
    M, N, K = 4, 90, 128
    x, W = torch.randn(M, K, dtype=torch.float16), _rand_i8(N, K)
    sb, bias = torch.rand(N) + 0.1, torch.randn(N, dtype=torch.float16)
    ref = int8_linear(x, W, sb, bias)  # shipped table path
    cfg = _swap_cfg(2, bk=32)
    monkeypatch.setattr(gmod, "_config_for", lambda *a: cfg)
    seen = []
    real = gmod._int8_gemm_swapab_kernel
    monkeypatch.setattr(gmod, "_int8_gemm_swapab_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: (seen.append(grid), real[grid])[1], "fn": real.fn})())  # fmt: skip
    out = int8_linear(x, W, sb, bias)
    assert seen, "the swap-AB kernel did not run"
    assert torch.equal(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 16])
@pytest.mark.parametrize("N,K", [(4096, 4096), (14336, 4096), (4096, 14336), (1000, 1008)])
@pytest.mark.parametrize("bn,bk,stages,split_k", [(64, 256, 6, 0), (128, 512, 3, 4)])
def test_swapab_gpu(M, N, K, bn, bk, stages, split_k):
    """SM90 swap-AB decode at LLM shapes: int32 exact, dequant vs float64, PDL launch after the
    quantizer equal to the plain launch, also under CUDA-graph replay."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("swap-AB kernel is SM90+")
    from int8_gemm.ops import quantize as qmod

    torch.manual_seed(M + N + K)
    W = _rand_i8(N, K, device="cuda")
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    sb = torch.rand(N, device="cuda") * 1e-3
    cfg = _swap_cfg(split_k, bn=bn, bk=bk)
    cfg["num_stages"] = stages
    xq, sa = quantize_symmetric(x)
    sa = sa.view(-1)
    assert gmod._get_plan(xq, W.t(), None, None, None, torch.int32, cfg, False, False).kind == "swapab"
    c = gmod._launch(xq, W.t(), None, None, None, torch.int32, cfg)
    assert torch.equal(c.double(), xq.double() @ W.double().t()), "swap-AB int32 products are not exact"
    d = gmod._launch(xq, W.t(), sa, sb, None, torch.float32, cfg)
    exact = (xq.double() @ W.double().t()) * sa.double()[:, None] * sb.double()[None, :]
    torch.testing.assert_close(d.double(), exact, rtol=1e-6, atol=1e-6 * exact.abs().max().item())

    def run(pdl):
        q, s = qmod._launch_quantize_rows(x, pdl=pdl)
        return gmod._launch(q, W.t(), s, sb, None, torch.bfloat16, cfg, pdl=pdl)

    ref = run(False)
    assert torch.equal(run(True), ref)
    g, out = _capture(lambda: run(True))
    for _ in range(3):
        x.normal_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, run(False))


# ----------------------------------------------------------------------------------------------
# SM90 warp-specialized persistent Gluon kernel (ops/_gemm_sm90.py, Triton 3.6)
# ----------------------------------------------------------------------------------------------

_SM90_BASE = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, SPLIT_K=1, num_warps=4, num_stages=3, TMA=1)


def _sm90_cfg(bn=256, stages=4, group_m=8, pingpong=0, bk=128):
    """A tuning entry as the probe writes it: the old TMA config plus "SM90": 1 and the SM90_* keys."""
    return dict(_SM90_BASE, SM90=1, SM90_BLOCK_N=bn, SM90_BLOCK_K=bk, SM90_STAGES=stages, SM90_GROUP_M=group_m,
                SM90_PINGPONG=pingpong)  # fmt: skip


@pytest.mark.parametrize(
    "bn,stages,pingpong,out,bias,aligned,epi_tma",
    [
        (256, 4, 0, "bf16", True, True, True),  # the 128x256 cooperative tile, TMA-store epilogue
        (256, 4, 0, "bf16", True, True, False),  # ... stores from registers
        (256, 4, 0, "fp32", True, False, False),  # ragged N: no 16-divisibility, clamped scale / bias loads
        (256, 3, 0, "i32", False, True, True),  # OUT_INT32 (its TMA buffers fit beside 3 stages)
        (128, 5, 0, "fp16", False, True, True),
        (128, 4, 1, "bf16", True, True, True),  # ping-pong: one 128x128 tile per warpgroup
        (128, 6, 1, "fp16", True, False, False),
    ],
)
def test_sm90_gemm_compiles_offline_without_spills(bn, stages, pingpong, out, bias, aligned, epi_tma):
    """No GPU needed: the Gluon GEMM compiles for sm_90a with Triton's own ptxas, fits one H200 CTA's shared
    memory, sets the warpgroup register budgets and spills nothing (aligned: the 16-divisible pointers and
    sizes Triton specializes on at launch; not aligned: none of them, e.g. N = 1500)."""
    import os
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    import triton
    from int8_gemm.ops import _gemm_sm90 as S

    if not S.HAS_GLUON:
        pytest.skip(f"the Gluon GEMM targets Triton 3.6 (this is {triton.__version__}); tests_matrix covers 3.6")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        # (kernels interpreted earlier in the process leave Triton's language patched: Gluon codegen then fails)
        pytest.skip("TRITON_INTERPRET=1 turns the kernel into interpreted functions: compile with TRITON_INTERPRET=0")
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    c = S.resolve(_sm90_cfg(bn=bn, stages=stages, pingpong=pingpong))
    wg_m = c["SM90_BLOCK_M"] // (1 if pingpong else 2)

    def desc(rows, cols, dt=gl.int8, name="i8"):
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], dt)
        return f"tensordesc<{name}[{rows}, {cols}],{layout!r}>"

    odt = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp32": gl.float32, "i32": gl.int32}[out]
    c_desc = desc(wg_m, min(bn, 128), odt, out) if epi_tma else desc(wg_m, 128)  # else A's stands in
    if epi_tma:  # what the plan checks before it picks the TMA-store epilogue
        smem = stages * S.stage_bytes(128, bn, 128) + S.epi_bytes(c, odt.primitive_bitwidth // 8)
        assert smem + 1024 <= S.SMEM_LIMIT
    fn = S._int8_gemm_sm90_kernel
    sig = {"a_desc": desc(wg_m, 128), "b_desc": desc(bn, 128), "c_desc": c_desc, "C": f"*{out}", "SA": "*fp32"}
    sig.update(SB="*fp32", BIAS="*bf16", M="i32", N="i32", K="i32", stride_cm="i32")
    const = dict(S.kernel_constexprs(c, bias, out == "i32", aligned, epi_tma), stride_sa=1, stride_sb=1)
    sig.update({n: "constexpr" for n in const})
    names = ("C", "SA", "SB", "BIAS", "M", "N", "K", "stride_cm") if aligned else ()
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}
    k = triton.compile(
        GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}
    )
    assert k.metadata.shared <= S.SMEM_LIMIT
    assert k.metadata.shared >= stages * S.stage_bytes(c["SM90_BLOCK_M"], bn, 128)
    ptx = k.asm["ptx"]
    assert "wgmma.mma_async" in ptx and ".s8.s8" in ptx and "cp.async.bulk.tensor" in ptx
    assert ("cp.async.bulk.tensor.2d.global.shared" in ptx) == epi_tma  # the TMA store
    regs = sorted({int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
    assert 232 in regs and 40 in regs, regs  # consumer warpgroups / producer budgets
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        cmd = [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", str(path), "-o", str(Path(tmp) / "k.o")]
        err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    assert int(re.search(r"(\d+) bytes spill stores", err).group(1)) == 0, err


def test_sm90_config_rules():
    from int8_gemm.ops import _gemm_sm90 as S

    assert S.resolve({"SM90": 1}) == S.DEFAULTS | {}
    assert S.resolve(_sm90_cfg(bn=128, stages=6))["SM90_STAGES"] == 6
    for bad in (
        _sm90_cfg(bn=256, stages=5),  # 5 x 48 KB of shared memory
        _sm90_cfg(bn=256, pingpong=1),  # a 128x256 int32 accumulator per warpgroup: 256 registers
        _sm90_cfg(bn=96),
        _sm90_cfg(bk=256),  # the TMA box's inner extent must fit the 128-byte swizzle
        _sm90_cfg(stages=1),
    ):
        with pytest.raises(ValueError):
            S.resolve(bad)
    A = torch.zeros(256, 128, dtype=torch.int8)
    assert not S.eligible(A, A)  # CPU tensors never take the Gluon kernel
    if S.HAS_GLUON and torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        g = A.cuda()
        assert S.eligible(g, g)
        assert not S.eligible(g[:, 8:], g[:, 8:])  # row stride fine, base 8 bytes off
        assert S.eligible(g[:, 8:], g[:, 8:], check_ptr=False)
        assert not S.eligible(g.t(), g)  # M-major A
        assert not S.eligible(g[:, :100].contiguous(), g[:, :100].contiguous())  # 100-byte rows


def test_sm90_dispatch_and_fallbacks(monkeypatch):
    """No GPU needed: an "SM90": 1 entry takes the SM90 launch with the (N, K) weight, the normalized scales
    and the bias; misaligned bases fall back to the entry's other kernel; without eligibility (CPU, Triton
    != 3.6, row-major B) the SM90 keys are ignored."""
    from int8_gemm.ops import _gemm_sm90 as S

    if gmod.select_backend(torch.device("cpu")) is not gmod.Backend.INTERPRETER:
        pytest.skip("needs TRITON_INTERPRET=1 on CPU")
    _poisoned_launch(monkeypatch)
    monkeypatch.setattr(gmod, "_PLANS", {})
    torch.manual_seed(61)
    M, N, K = 40, 48, 96
    A, W = _rand_i8(M, K), _rand_i8(N, K)
    sa, sb, bias = torch.rand(M) + 0.1, torch.rand(N) + 0.1, torch.randn(N)
    cfg = dict(_sm90_cfg(bn=128, stages=3), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_stages=1)
    # not eligible on CPU: the entry's TMA kernel, exact
    assert gmod._get_plan(A, W.t(), sa, sb, bias, torch.float32, cfg, False, False).kind == "tma"
    d = gmod._launch(A, W.t(), sa, sb, bias, torch.float32, cfg)
    torch.testing.assert_close(d.double(), _ref_deq(A, W.t(), sa, sb, bias), rtol=1e-5, atol=1e-3)

    calls = []
    monkeypatch.setattr(gmod, "_PLANS", {})
    monkeypatch.setattr(S, "eligible", lambda a, b, check_ptr=True: a.dtype == torch.int8 and b.stride(1) == 1)
    monkeypatch.setattr(S, "launch", lambda *a: calls.append(a))
    out = gmod._launch(A, W.t(), sa, sb, bias, torch.float32, cfg)
    (a, b, s1, s2, bi, o, i32, c), = calls  # fmt: skip
    assert a is A and b.shape == (N, K) and b.data_ptr() == W.data_ptr() and b.stride() == W.stride()
    assert s1 is sa and s2 is sb and bi is bias and o is out and not i32 and c == cfg
    gmod._launch(A, W.t(), None, None, None, torch.int32, cfg)
    assert calls[-1][2] is None and calls[-1][3] is None and calls[-1][6] is True
    assert gmod._get_plan(A, W.t(), None, None, None, torch.int32, cfg, False, False).kind == "sm90"
    # quant_a / pdl / a row-major B are not the SM90 kernel's
    assert gmod._get_plan(A, W.t(), sa, sb, None, torch.float32, cfg, False, True).kind != "sm90"
    assert gmod._get_plan(A, W.t().contiguous(), sa, sb, None, torch.float32, cfg, False, False).kind != "sm90"
    # a misaligned base (not in the plan key): the same entry without its SM90 keys, still exact
    buf = _rand_i8(M * K + 1)
    Am = buf[1:].view(M, K)
    n = len(calls)
    c2 = gmod._launch(Am, W.t(), None, None, None, torch.int32, cfg)
    assert len(calls) == n and torch.equal(c2.long(), _ref_int(Am, W.t()))
    # a bad SM90 entry fails when the plan is made
    with pytest.raises(ValueError):
        gmod._launch(A, W.t(), sa, sb, None, torch.float32, dict(cfg, SM90_BLOCK_N=96))


def test_sm90_launch_plan_direct_args(fake_gluon_launch):
    """No GPU needed: the SM90 GEMM plan's first call goes through ``kernel[grid]`` with real tensor
    descriptors; later calls launch the captured kernel directly with ``Desc`` stand-ins carrying the same
    base/shape/strides, the same scalars and the constexpr tail in signature order, on the same grid."""
    from int8_gemm.ops import _gemm_sm90 as S

    def fn(a_desc, b_desc, c_desc, C, SA, SB, BIAS, M, N, K, stride_cm, stride_sa, stride_sb, BLOCK_M,
           BLOCK_N, BLOCK_K, GROUP_M, STAGES, A_BOXES, HAS_BIAS, OUT_INT32, EVEN_N, EPI_TMA, CONS_REGS,
           PROD_REGS):  # fmt: skip
        pass

    calls = fake_gluon_launch(S, "_int8_gemm_sm90_kernel", fn)
    M, N, K = 1000, 1500, 2064
    A = torch.zeros(M, K + 16, dtype=torch.int8)[:, :K]  # a padded-row view
    W = torch.zeros(N, K, dtype=torch.int8)
    sa, sb, bias = torch.ones(M), torch.ones(1).expand(N), torch.zeros(N, dtype=torch.bfloat16)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    cfg = _sm90_cfg(bn=256, stages=4, group_m=16)
    for _ in range(3):
        S.launch(A, W, sa, sb, bias, out, False, cfg)
    assert len(calls["normal"]) == 1 and len(calls["direct"]) == 2
    grid, nargs, kw, dargs = fake_gluon_launch.first_launches(calls)
    assert grid == (min(132, 8 * 6),)
    # N = 1500 bf16 rows are 3000 bytes, not a TMA stride: register epilogue, A's descriptor as the unused c_desc
    assert [d.block for d in nargs[:2]] == [[64, 128], [256, 128]] and nargs[2] is nargs[0]
    assert [d.layout for d in nargs[:2]] == [("layout", (64, 128), "i8"), ("layout", (256, 128), "i8")]
    assert [d.base for d in nargs[:2]] == [A, W] and [d.strides for d in nargs[:2]] == [[K + 16, 1], [K, 1]]
    assert kw == dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_M=16, STAGES=4, A_BOXES=2, HAS_BIAS=True,
                      OUT_INT32=False, EVEN_N=False, EPI_TMA=False, CONS_REGS=232, PROD_REGS=40,
                      num_warps=4)  # fmt: skip
    assert dargs[3] is out and dargs[4] is sa and dargs[5] is sb and dargs[6] is bias and dargs[7:13] == nargs[7:]
    assert dargs[7:13] == (M, N, K, N, 1, 0)  # stride_sa 1, stride_sb 0 (a scalar scale)
    assert dargs[13:] == (128, 256, 128, 16, 4, 2, True, False, False, False, 232, 40)  # the constexpr tail
    # int32 out, ping-pong: another plan (normal launch first again); the scale pointers are the output
    o32 = torch.empty(M, N, dtype=torch.int32)
    S.launch(A, W, None, None, None, o32, True, _sm90_cfg(bn=128, pingpong=1))
    grid, nargs, kw = calls["normal"][1]
    assert [d.block for d in nargs[:2]] == [[128, 128], [128, 128]]
    assert nargs[3:7] == (o32, o32, o32, o32) and nargs[11:13] == (0, 0)
    assert kw["A_BOXES"] == 1 and kw["OUT_INT32"] and not kw["HAS_BIAS"]
    # 16-byte rows (N = 1024): the TMA-store epilogue, its descriptor over the output in (64, 128) boxes
    N2 = 1024
    o2 = torch.empty(M, N2, dtype=torch.bfloat16)
    for _ in range(2):
        S.launch(A, W[:N2], sa[:M], sb[:N2], None, o2, False, cfg)
    grid, nargs, kw = calls["normal"][2]
    assert kw["EPI_TMA"] and kw["EVEN_N"] and len(calls["direct"]) == 3
    c_desc = nargs[2]
    assert c_desc.base is o2 and c_desc.shape == [M, N2] and c_desc.strides == [N2, 1] and c_desc.block == [64, 128]
    assert c_desc.layout == ("layout", (64, 128), "bf16")
    dd = calls["direct"][2][9:][2]
    assert dd.base is o2 and list(dd.shape) == [M, N2] and list(dd.strides) == [N2, 1]
    # fp32 out: its two (64, 128) buffers (64 KB) do not fit beside four 48 KB stages -> register epilogue
    S.launch(A, W[:N2], sa[:M], sb[:N2], None, torch.empty(M, N2), False, cfg)
    assert not calls["normal"][3][2]["EPI_TMA"]
    S.launch(A, W[:N2], sa[:M], sb[:N2], None, torch.empty(M, N2), False, dict(cfg, SM90_STAGES=3))
    assert calls["normal"][4][2]["EPI_TMA"]
    S.launch(A, W[:N2], sa[:M], sb[:N2], None, o2, False, dict(cfg, SM90_EPI_TMA=0))  # switched off
    assert not calls["normal"][5][2]["EPI_TMA"]


def _sm90_ref(A, W, sa, sb, bias, out_dtype):
    """Exact int32 products (float64 matmul on the GPU), dequantized in fp32 in the kernel's order."""
    acc = (A.double() @ W.double().t()).to(torch.int64)
    if out_dtype == torch.int32:
        return acc.to(torch.int32)
    c = acc.float() * sa[:, None] * sb[None, :]
    if bias is not None:
        c = c + bias.float()[None, :]
    return c.to(out_dtype)


_SM90_GPU_CFGS = {
    "coop_bn256_s4_g8": _sm90_cfg(bn=256, stages=4, group_m=8),
    "coop_bn128_s5_g16": _sm90_cfg(bn=128, stages=5, group_m=16),
    "pingpong_bn128_s4": _sm90_cfg(bn=128, stages=4, pingpong=1),
    "coop_bn256_s4_register_epilogue": dict(_sm90_cfg(bn=256, stages=4), SM90_EPI_TMA=0),
}


@pytest.mark.gpu
@pytest.mark.parametrize("cfg_name", list(_SM90_GPU_CFGS))
@pytest.mark.parametrize("M,N,K", [(1000, 1500, 2064), (4096, 4096, 4096), (129, 257, 4096), (64, 4096, 4096)])
def test_gpu_sm90_gemm_matches_reference(M, N, K, cfg_name, monkeypatch):
    """The Hopper Gluon GEMM against an exact int32 reference, dequantized in fp32: ragged M/N/K, a single
    partial row block, out bf16/fp16/fp32 (with/without bias, a scalar sb) and raw int32, poisoned outputs.
    The plan's second call (direct launch with Desc stand-ins) gives the same bits as its first (kernel[grid]).
    4096^2 is 128 or 256 tiles: several per CTA on 132 SMs (the persistent loop, the ring across tiles).
    N = 4096 / 257 / 1500 cover both epilogues (a TMA store where the output rows are 16-byte strided and its
    buffers fit beside the ring, else stores from registers)."""
    from int8_gemm.ops import _gemm_sm90 as S

    if torch.cuda.get_device_capability() != (9, 0) or not S.HAS_GLUON:
        pytest.skip("the Gluon GEMM is built for SM90 with Triton 3.6 only")
    _poisoned_launch(monkeypatch)
    # only this test's plans below: earlier tests leave plans launched once (captured, not yet direct)
    monkeypatch.setattr(S, "_PLANS", {})
    cfg = _SM90_GPU_CFGS[cfg_name]
    torch.manual_seed(M + N + K)
    A, W = _rand_i8(M, K, device="cuda"), _rand_i8(N, K, device="cuda")
    sa = torch.rand(M, device="cuda") * 1e-3 + 1e-4
    sb_vec = torch.rand(N, device="cuda") * 1e-3 + 1e-4
    sb_scalar = torch.full((1,), 3e-4, device="cuda").expand(N)
    bias_bf16 = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    assert S.eligible(A, W)
    assert gmod._get_plan(A, W.t(), None, None, None, torch.int32, cfg, False, False).kind == "sm90"
    cases = [
        (torch.int32, None, None, None),
        (torch.bfloat16, sa, sb_vec, bias_bf16),
        (torch.float16, sa, sb_scalar, None),
        (torch.float32, sa, sb_vec, bias_bf16.float()),
        (torch.float32, sa, sb_vec, None),
    ]
    for out_dtype, s1, s2, bias in cases:
        got = gmod._launch(A, W.t(), s1, s2, bias, out_dtype, cfg)
        want = _sm90_ref(A, W, s1, s2, bias, out_dtype)
        if out_dtype == torch.int32:
            assert torch.equal(got, want), f"{out_dtype}: int32 products are not exact"
        else:
            assert torch.isfinite(got).all(), f"{out_dtype}: unwritten (NaN-poisoned) outputs"
            # fp32: FMA contraction at most; 16-bit: one rounding step of the output dtype
            rtol = {torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-10}[out_dtype]
            atol = rtol * want.float().abs().max().item() * 1e-2
            torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)
        again = gmod._launch(A, W.t(), s1, s2, bias, out_dtype, cfg)
        assert torch.equal(again, got), f"{out_dtype}: the direct launch differs from the first"
    if S.direct.ENABLED:
        # no plan fell back to kernel[grid] for good (a failed first direct launch turns it off)
        assert not [p.dl.error for p in S._PLANS.values() if p.dl.state == -1]
        assert all(p.dl.state == 2 for p in S._PLANS.values() if p.kw["BLOCK_N"] == cfg["SM90_BLOCK_N"])


def test_sm_at_least_reads_arch_keys():
    assert gmod._sm_at_least("sm90", 90) and gmod._sm_at_least("sm100", 90)
    assert not gmod._sm_at_least("sm86", 90) and not gmod._sm_at_least("cpu", 90)
    assert not gmod._sm_at_least("smx", 90)
