"""fused_rmsnorm_linear: CPU (PyTorch path) numerics vs float64, checks, planning, backend plumbing;
GPU tests (marked gpu) run the CUDA extension (AOT or JIT, chosen by FUSED_RMSNORM_BACKEND)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings

import fused_rmsnorm
import pytest
import torch
from fused_rmsnorm import _build, backend
from fused_rmsnorm.ops.rmsnorm_linear import (
    SM90_NUM_CONFIGS,
    SM90_SWAP_CONFIGS,
    fold_weight,
    fused_rmsnorm_linear,
    plan,
)


def ref64(x, g, w, b, eps):
    xd = x.double()
    r = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    y = (xd * r * g.double()) @ w.double().t()
    return y + b.double() if b is not None else y


def rel_err(y, ref):
    return ((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


@pytest.fixture(autouse=True)
def _clean_backend(monkeypatch):
    monkeypatch.delenv("FUSED_RMSNORM_BACKEND", raising=False)
    backend.reset()
    yield
    backend.reset()


# ---------------------------------------------------------------------------------------- CPU numerics

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,N", [((3, 5, 48), 37), ((7, 40), 24), ((40,), 9), ((2, 1, 3, 16), 8)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_cpu_matches_float64(dtype, shape, N, with_bias):
    torch.manual_seed(0)
    D = shape[-1]
    x = (torch.randn(shape) * 3 + 0.5).to(dtype)
    g = (torch.rand(D) * 2 - 0.5).to(dtype)
    w = (torch.randn(N, D) / D**0.5).to(dtype)
    b = torch.randn(N).to(dtype) if with_bias else None
    y = fused_rmsnorm_linear(x, g, w, b, eps=1e-5)
    assert y.shape == (*shape[:-1], N) and y.dtype == dtype
    assert torch.isfinite(y).all()
    assert rel_err(y, ref64(x, g, w, b, 1e-5)) <= TOL[dtype]


def test_cpu_eps_matters_and_strided_input():
    torch.manual_seed(1)
    x = torch.randn(6, 64)[:, ::2] * 1e-3  # non-contiguous, tiny values: eps dominates the rstd
    g, w = torch.randn(32), torch.randn(11, 32)
    y1 = fused_rmsnorm_linear(x, g, w, eps=1e-6)
    y2 = fused_rmsnorm_linear(x, g, w, eps=1e-2)
    assert rel_err(y1, ref64(x, g, w, None, 1e-6)) < 1e-5
    assert rel_err(y2, ref64(x, g, w, None, 1e-2)) < 1e-5
    assert not torch.allclose(y1, y2)


def test_cpu_empty_rows():
    y = fused_rmsnorm_linear(torch.randn(0, 16), torch.randn(16), torch.randn(5, 16))
    assert y.shape == (0, 5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fold_weight_rounds_once(dtype):
    torch.manual_seed(5)
    g, w = torch.randn(24).to(dtype), torch.randn(7, 24).to(dtype)
    want = (w.double() * g.double()).to(dtype)  # exact product, one rounding
    assert torch.equal(fold_weight(g, w), want)


def test_autograd_matches_float64():
    torch.manual_seed(2)
    x = torch.randn(4, 3, 16, dtype=torch.float32, requires_grad=True)
    g = torch.randn(16, requires_grad=True)
    w = torch.randn(10, 16, requires_grad=True)
    b = torch.randn(10, requires_grad=True)
    gy = torch.randn(4, 3, 10)
    fused_rmsnorm_linear(x, g, w, b, eps=1e-6).backward(gy)
    leaves = [t.detach().double().requires_grad_() for t in (x, g, w, b)]
    ref64(*leaves, 1e-6).backward(gy.double())
    for got, want in zip((x, g, w, b), leaves):
        assert rel_err(got.grad, want.grad) < 1e-5


def test_opcheck_custom_op():
    torch.manual_seed(3)
    args = (torch.randn(3, 16), torch.randn(16), torch.randn(8, 16), torch.randn(8), 1e-6, None)
    torch.library.opcheck(torch.ops.fused_rmsnorm.rmsnorm_linear.default, args)


def test_torch_compile_no_graph_break():
    torch.manual_seed(4)
    x, g, w = torch.randn(5, 32), torch.randn(32), torch.randn(12, 32)
    f = torch.compile(lambda a: fused_rmsnorm_linear(a, g, w) * 2, fullgraph=True, backend="eager")
    assert rel_err(f(x), 2 * ref64(x, g, w, None, 1e-6)) < 1e-5


# ----------------------------------------------------------------------------------------------- errors


def test_errors_name_the_argument():
    x, g, w = torch.randn(2, 16), torch.randn(16), torch.randn(4, 16)
    with pytest.raises(TypeError, match="w_norm.*float16.*x.*float32"):
        fused_rmsnorm_linear(x, g.half(), w)
    with pytest.raises(TypeError, match="w_lin"):
        fused_rmsnorm_linear(x, g, w.bfloat16())
    with pytest.raises(ValueError, match="w_norm"):
        fused_rmsnorm_linear(x, torch.randn(15), w)
    with pytest.raises(ValueError, match="w_lin.*D=16"):
        fused_rmsnorm_linear(x, g, torch.randn(4, 12))
    with pytest.raises(ValueError, match="w_lin"):
        fused_rmsnorm_linear(x, g, torch.randn(16))
    with pytest.raises(ValueError, match="bias"):
        fused_rmsnorm_linear(x, g, w, torch.randn(5))
    with pytest.raises(TypeError, match="x"):
        fused_rmsnorm_linear(x.to(torch.int32), g, w)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fused_rmsnorm_linear([1.0], g, w)
    for eps in (0.0, -1e-6, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps"):
            fused_rmsnorm_linear(x, g, w, eps=eps)
    with pytest.raises(ValueError, match="w_lin is on meta"):
        fused_rmsnorm_linear(x, g, torch.empty(4, 16, device="meta"))


def test_extension_path_rejects_cpu_tensors(monkeypatch):
    monkeypatch.setenv("FUSED_RMSNORM_BACKEND", "aot")
    x, g, w = torch.randn(2, 16).half(), torch.randn(16).half(), torch.randn(4, 16).half()
    with pytest.raises(ValueError, match="x is on cpu.*CUDA extension path needs CUDA tensors"):
        fused_rmsnorm_linear(x, g, w)
    monkeypatch.setenv("FUSED_RMSNORM_BACKEND", "bogus")
    with pytest.raises(ValueError, match="FUSED_RMSNORM_BACKEND"):
        fused_rmsnorm_linear(x, g, w)


# --------------------------------------------------------------------------------------------- planning


def test_plan_sm90():
    from fused_rmsnorm.ops import rmsnorm_linear

    # decode shapes (module path) go to the wgmma stream kernel (session 41: rows "auto" for N >= 1024, since
    # session 43 N >= 512, since session 47 N >= 256 from K 2048, else the tensor-core decode kernel; since
    # session 49 the CUDA-core GEMV up to N 384 at <= 2 tokens, 3..4 up to N 256 and K 4096; since session 50, with
    # its one-wave K split, up to N 2048, K 8192 and 2^23 weights at <= 2 tokens and N 512 at 3..4; since session
    # 51 up to 1.5 x 2^22 weights at <= 2 tokens and also N 1024 at K <= 1024 at 3..4), 17..32 tokens of large
    # weights to the swap-AB CUTLASS tiles, larger M to the CUTLASS GEMMs
    for M, N in ((1, 4096), (8, 4096)):
        p = plan("sm90", M, N, 4096, has_gemm=True)
        assert p["path"] == "stream" and p["rows"] == 40, (M, p)
    p = plan("sm90", 8, 128, 4096, has_gemm=True)
    assert p["path"] == "decode_mma" and p["wn"] == 0 and p["ksplit"] == 0, p
    gemv = {"path": "decode", "ksplit": 0, "grid_blocks": 0}
    cases = ((1, 128, 4096), (2, 384, 16384), (4, 256, 4096), (3, 256, 1024), (1, 400, 4096), (2, 1536, 4096),
             (1, 768, 8192), (1, 512, 1024), (3, 300, 2048), (4, 512, 4096), (3, 1024, 1024),
             (4, 513, 512))  # fmt: skip
    for M, N, K in cases:  # module and functional alike
        for folded in (True, False):
            assert plan("sm90", M, N, K, has_gemm=True, folded=folded) == gemv, (M, N, K, folded)
    # beyond the measured K; 4 tokens at D8192 N256 / D16384 N384 (H100 s49: 6.27 / 13.38 us against the stream
    # kernel's ~6.15 / 8.78: each W chunk reads 4 x chunks through L1, whose share of K no longer fits there);
    # W beyond 2^23 elements or rows of 16384 at N >= 512 (H100 s50: D2048 N4096 9.17 against 8.47, D16384 N512
    # 10.04 against 9.91), and at 2^23 on the H200 (s51: M1 / M2 D4096 N2048 8.04 / 8.39 against 7.86 / 7.94, D8192
    # N1024 8.44 / 8.64 against 8.23 / 8.28; the H100 had gained ~0.4 us there in s50); 3-4 tokens beyond N 512 from
    # K 2048 (H200 s51: M4 D2048 N640 4.81 against 4.52, M3 D2048 N2048 6.81 against 6.24); 5+ tokens
    for M, N, K in ((1, 256, 32768), (4, 256, 8192), (4, 384, 16384), (5, 256, 2048), (4, 640, 2048),
                    (1, 4096, 2048), (2, 2048, 8192), (1, 512, 16384), (2, 2056, 1024), (1, 2048, 4096),
                    (2, 1024, 8192), (4, 1025, 1024), (3, 1024, 2048)):  # fmt: skip
        assert plan("sm90", M, N, K, has_gemm=True)["path"] == "stream", (M, N, K)
    # functional calls there: the GEMV up to 2^23 weights at 2 tokens, and at 3-4 tokens below N 1024 up to K 2048,
    # N 1024 up to K 8192 and N 512-640 from K 7168 (no rstd_scale launch before it: H200 s51 M3 D2048 N1024 4.97 us
    # against the split stream kernel's 7.78, M4 D8192 N512 7.92 against 9.51); decode_mma where it won or tied
    # (M4 D4096 N640 6.19 against the GEMV's 6.86, M4 D2048 N1536 6.30 against 7.20, M3 D4096 N768 6.45 against 6.41)
    for M, N, K in ((2, 2048, 4096), (2, 1024, 8192), (4, 768, 2048), (3, 1024, 2048), (4, 1024, 8192), (4, 512, 8192)):
        assert plan("sm90", M, N, K, has_gemm=True, folded=False) == gemv, (M, N, K)
    for M, N, K in ((4, 640, 4096), (4, 1536, 2048), (3, 768, 4096), (3, 2048, 4096), (4, 1025, 1024)):
        assert plan("sm90", M, N, K, has_gemm=True, folded=False)["path"] == "decode_mma", (M, N, K)
    # one-token functional calls from K 2048 below 2^24 weights (no rstd_scale launch, no ring: H100 s49 D4096
    # N1024 7.11 us against the split stream kernel's 9.36, 2048^2 6.82 against decode_mma's 7.78); module calls
    # of those shapes beyond the module entries keep the stream kernel
    for N, K in ((4096, 2048), (2048, 4096 + 8), (512, 16384), (1024, 16383)):
        assert plan("sm90", 1, N, K, has_gemm=True, folded=False) == gemv, (N, K)
        assert plan("sm90", 1, N, K, has_gemm=True)["path"] == "stream", (N, K)
    for M, N, K in ((1, 4096, 4096), (2, 4096, 2048), (2, 1024, 16384)):
        assert plan("sm90", M, N, K, has_gemm=True, folded=False)["path"] != "decode", (M, N, K)
    # session 12: at N14336 9..16 tokens take the swap-AB 64x16 tile computing rstd itself, on 112 CTAs (session
    # 26: its 224 W tiles two per CTA); session 29: the cp.async-ring "stream" kernel at 1..8 tokens of N14336 and
    # 1..16 of 8192^2 and 5120^2; session 30: its wgmma twin with two warpgroups at 1..16 tokens of N14336;
    # session 31: at 5120^2 the one-warpgroup wgmma kernel on 40 W' rows per CTA (128 CTAs); session 38: N14336 on
    # 112 W' rows per CTA (128 CTAs)
    wg2 = {"path": "stream", "wgmma": True, "bn": 128, "stages": 5, "warpgroups": 2, "rows": 112}
    cases = {(16, 14336, 4096): wg2, (9, 14336, 4096): wg2, (8, 14336, 4096): wg2, (1, 14336, 4096): wg2,
             (1, 8192, 8192): {"path": "stream", "bn": 64, "stages": 6},
             (16, 8192, 8192): {"path": "stream", "bn": 64, "stages": 6},
             (16, 5120, 5120): {"path": "stream", "wgmma": True, "bn": 64, "stages": 8, "rows": 40}}  # fmt: skip
    for (M, N, K), want in cases.items():
        assert plan("sm90", M, N, K, has_gemm=True) == want, (M, N, K)
        # functional calls (no folded W'): the GEMM would pay a per-call x * g, so they take decode_mma, or the
        # stream kernel on W after rstd_scale where both H100 and H200 measured it faster (session 39: 9-16 tokens,
        # and 5120^2); never an "fn" key left inside
        p = plan("sm90", M, N, K, has_gemm=True, folded=False)
        fn_stream = M > 8 or N == 5120
        assert p == want if fn_stream else (p["path"] == "decode_mma" and "fn" not in p), (M, N, K, p)
        # a binary without the tensor-core decode kernels runs the CUDA-core GEMV for a stream entry
        if want["path"] == "stream":
            assert plan("sm90", M, N, K, has_gemm=True, has_mma=False)["path"] == "decode", (M, N, K)
    for M, N in ((17, 4096), (32, 14336)):  # swap-AB 64x32 tiles up to 32 tokens
        p = plan("sm90", M, N, 4096, has_gemm=True)
        assert p["path"] == "gemm" and p["config"] == 8, (M, p)
    p = plan("sm90", 33, 4096, 4096, has_gemm=True)
    assert p["path"] == "gemm" and p["config"] == 2
    # session 23: one-wave grids take the non-persistent kernel (it fits beside the rstd kernel's CTAs),
    # only where its grid is the measured one; one row tile less goes to the next entry (at 2048^2 the T128 rule)
    for M, N, K, cfg, tile_m, below in ((1024, 2048, 2048, 12, 128, 12), (512, 4096, 4096, 13, 128, 12),
                                        (128, 8192, 8192, 14, 64, 2)):  # fmt: skip
        for m in (M, M - tile_m + 1):
            assert plan("sm90", m, N, K, has_gemm=True) == {"path": "gemm", "config": cfg, "pdl": True}, (m, N)
        assert plan("sm90", M - tile_m, N, K, has_gemm=True)["config"] == below, (M, N)
    # 4096^2: no 2-CTA-cluster-along-M config at M 257..1152 but M 385..512 (slow at odd row-tile counts), and
    # (session 24) config 1 at M 1153..4095 but M 1664..2048 and 3712..4095
    ms = (257, 384, 513, 768, 1023, 1025, 1152, 1280, 1663, 1664, 2048, 2049, 3072, 3711, 3712, 4095, 4096)
    assert [plan("sm90", m, 4096, 4096, has_gemm=True)["config"] for m in ms] == [
        12, 12, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0]  # fmt: skip
    assert [plan("sm90", m, 4096, 4096, has_gemm=True).get("swizzle", 1) for m in (1664, 3712, 4096)] == [8, 8, 1]
    # 8192^2: stream-K (config 6) at the row-tile counts it won at (5, 7 and 9 tiles of 128 rows)
    ms = (512, 513, 640, 641, 768, 769, 896, 897, 1024, 1025, 1152, 1153)
    assert [plan("sm90", m, 8192, 8192, has_gemm=True)["config"] for m in ms] == [1, 6, 6, 1, 1, 6, 6, 1, 0, 6, 6, 1]
    # (session 27) config 0 with swizzle 4 on the 32 x 32 grid of 128x256 tiles only (it lost at M3584 and M4608)
    got = [plan("sm90", m, 8192, 8192, has_gemm=True) for m in (3968, 3969, 4000, 4096, 4097)]
    assert [(p["config"], p.get("swizzle", 1)) for p in got] == [(0, 1), (0, 4), (0, 4), (0, 4), (1, 1)], got
    # the MN rule's rows: config 0, or config 1 where the rounds model (WAVE_C1) says so
    for (M, N, K), c in {(1536, 6144, 4096): 1, (2304, 6144, 4096): 1, (1536, 28672, 4096): 0, (2304, 10240, 8192): 0,
                         (1280, 8192, 8192): 1, (1536, 8192, 8192): 0, (4096, 14336, 4096): 0}.items():  # fmt: skip
        assert plan("sm90", M, N, K, has_gemm=True)["config"] == c, (M, N, K)
        assert rmsnorm_linear.wave_prefers_128x128(M, N, 132) == (c == 1), (M, N, K)
    assert plan("sm90", 1536, 6144, 4096, has_gemm=True, sms=144)["config"] == 0  # rounds 2 vs 4 on 144 SMs
    # any other grid of 100..132 tiles of 128 x 128 at M >= 257 (T128) takes config 12; fewer tiles do not
    for M, N, K in ((768, 2816, 2048), (4096, 512, 1024), (300, 5120, 5120), (1536, 1280, 2048)):
        assert plan("sm90", M, N, K, has_gemm=True)["config"] == 12, (M, N, K)
    for M, N, K in ((300, 3072, 5120), (256, 6144, 4096), (2048, 2048, 2048)):  # 72 and 96 tiles; M <= 256; 256
        assert plan("sm90", M, N, K, has_gemm=True)["config"] != 12, (M, N, K)
    p = plan("sm90", 4096, 4096, 4096, has_gemm=True)
    assert p["path"] == "gemm" and p["config"] == 0


_CFG_MAIN = r"""
#include <cstdio>
#include "decode_mma_config.h"
int main(int argc, char** argv) {
  long long M, N, K; int tok, clusters, sms, per_sm, wn, ks;
  while (std::scanf("%lld %lld %lld %d %d %d %d %d %d", &M, &N, &K, &tok, &clusters, &sms, &per_sm, &wn, &ks) == 9) {
    frms::decode_mma_auto_config(M, N, K, tok, clusters != 0, sms, per_sm, wn, ks);
    std::printf("%d %d\n", wn, ks);
  }
  return 0;
}
"""


def test_decode_mma_auto_config(tmp_path):
    # the kernel's host-side (wn, ksplit) heuristic (plain C++ header) vs the H200 winners of the
    # 2026-11-29 CUDA-graph probe: one wave of 2 CTAs x 132 SMs, clusters only when N / 16 < SMs
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    csrc = os.path.join(os.path.dirname(fused_rmsnorm.__file__), "csrc")
    (tmp_path / "t.cpp").write_text(_CFG_MAIN)
    exe = tmp_path / "t"
    subprocess.run([cxx, "-std=c++17", "-O1", "-I", csrc, str(tmp_path / "t.cpp"), "-o", str(exe)], check=True)
    cases = []  # (M, N, K, tok, clusters, sms, per_sm, wn_in, ks_in) -> (wn, ks)
    tok = lambda m: 8 if m <= 8 else 16 if m <= 16 else 32  # noqa: E731
    want = {}
    for M in (1, 2, 4, 8, 16, 32):
        want[(M, 4096, 4096, tok(M), 1, 132, 2, 0, 0)] = (1, 1)  # 256 CTAs
        want[(M, 14336, 4096, tok(M), 1, 132, 2, 0, 0)] = (4, 1)  # 224
        want[(M, 8192, 8192, tok(M), 1, 132, 2, 0, 0)] = (2, 1)  # 256
        want[(M, 2048, 2048, tok(M), 1, 132, 2, 0, 0)] = (1, 2)  # 128 x 2 (cluster)
        want[(M, 2048, 2048, tok(M), 0, 132, 2, 0, 0)] = (1, 1)  # no clusters (sm_8x / old build)
    want[(64, 4096, 4096, 32, 1, 132, 2, 0, 0)] = (2, 1)  # 2 token chunks x 128
    want[(1, 4096, 4096, 8, 1, 132, 2, 8, 0)] = (8, 8)  # fixed wn: clusters refill the wave (32 x 8)
    want[(1, 4096, 4096, 8, 1, 132, 2, 0, 2)] = (2, 2)  # fixed ks: wn for one wave (128 x 2)
    want[(1, 131072, 4096, 8, 1, 132, 2, 0, 0)] = (8, 1)  # nothing fits one wave: fewest CTAs
    want[(1, 2048, 256, 8, 1, 132, 2, 0, 0)] = (1, 1)  # K too short to split
    want[(1, 4096, 4096, 8, 1, 108, 2, 0, 0)] = (2, 1)  # A100: 216 slots
    cases = list(want)
    inp = "\n".join(" ".join(str(v) for v in c) for c in cases) + "\n"
    out = subprocess.run([str(exe)], input=inp, capture_output=True, text=True, check=True).stdout.split("\n")
    got = {c: tuple(int(v) for v in line.split()) for c, line in zip(cases, out)}
    bad = {c: (got[c], want[c]) for c in cases if got[c] != want[c]}
    assert not bad, bad


def test_plan_decode_mma_variant_keys(monkeypatch):
    from fused_rmsnorm.ops import rmsnorm_linear as op

    entry = {"path": "decode_mma", "wn": 0, "ksplit": 0, "steps": 8, "ldpolicy": "plain"}
    monkeypatch.setattr(op._TUNING, "lookup", lambda *a, **k: dict(entry))
    p = plan("sm90", 16, 4096, 4096, has_gemm=True)
    assert op.mma_variant_args(p) == (8, 1, 0)
    p = plan("sm90", 17, 4096, 4096, has_gemm=True)  # variants exist for <= 16 tokens only
    assert "steps" not in p and "ldpolicy" not in p and op.mma_variant_args(p) == (0, 0, 0)
    with pytest.raises(ValueError, match="steps"):
        op.mma_variant_args({"steps": 6})
    with pytest.raises(ValueError, match="ldpolicy"):
        op.mma_variant_args({"ldpolicy": "evict_last"})


def test_rstd_streamed():
    """The streamed rstd launch: several rounds of persistent tiles, raster along N, and a grid 4 SMs short
    that still needs no extra round; (rstd CTAs, GEMM grid cap, cluster size)."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    assert op.rstd_streamed(0, 4096, 4096, 132) == (4, 128, 2)  # B4096: 32 x 16 tiles of 128x256, 4 rounds
    assert op.rstd_streamed(1, 4100, 3080, 132) == (4, 128, 1)  # 33 x 25 tiles: 7 rounds either way
    assert op.rstd_streamed(1, 2048, 4096, 132) == (0, 0, 0)  # 16 x 32 tiles: the heuristic rasters along M
    assert op.rstd_streamed(1, 2048, 4096, 132, raster=2) == (4, 128, 1)  # ... unless told along N
    assert op.rstd_streamed(1, 2048, 4096, 132, raster=1) == (0, 0, 0)
    assert op.rstd_streamed(0, 4096, 4224, 132) == (4, 128, 2)  # 32 x 17 = 544 tiles: 5 rounds on 132 or 128
    assert op.rstd_streamed(1, 4096, 4224, 132, raster=2) == (0, 0, 0)  # 32 x 33 tiles: 8 rounds on 132, 9 on 128
    assert op.rstd_streamed(1, 1024, 1024, 132) == (0, 0, 0)  # 64 tiles: one partial round
    assert op.rstd_streamed(1, 8192, 2048, 132) == (0, 0, 0)  # N * 4 free SMs < RSTD_SIDE_WORK: rstd too slow
    assert op.rstd_streamed(6, 4096, 4096, 132) == (0, 0, 0)  # stream-K
    assert op.rstd_streamed(12, 4096, 4096, 132) == (0, 0, 0)  # non-persistent
    assert op.rstd_streamed(11, 16, 14336, 132) == (0, 0, 0)  # decode


def test_rstd_side_ctas():
    from fused_rmsnorm.ops import rmsnorm_linear as op

    assert op.rstd_side_ctas(1, 512, 4096, 132) == 4  # 4 x 32 tiles of 128x128: 4 SMs idle
    assert op.rstd_side_ctas(2, 32, 14336, 132) == 20  # 1 x 112 tiles of 64x128
    assert op.rstd_side_ctas(1, 1024, 2048, 132) == 0  # 4 idle SMs, but N=2048: the GEMM is too short
    assert op.rstd_side_ctas(3, 128, 8192, 132) == 0  # 2-CTA clusters
    assert op.rstd_side_ctas(1, 512, 4160, 132) == 0  # 4 x 33 tiles: every SM busy
    assert op.rstd_side_ctas(0, 4096, 4096, 132) == 0  # several waves
    assert op.rstd_side_ctas(1, 512, 4096, 129) == 0  # 1 idle SM: below RSTD_SIDE_MIN
    assert op.rstd_side_ctas(6, 128, 2048, 132) == 0  # stream-K spreads over every SM


def test_plan_decode_mma_wload_key(monkeypatch):
    from fused_rmsnorm.ops import rmsnorm_linear as op

    entry = {"path": "decode_mma", "wn": 0, "ksplit": 0, "wload": 2}
    monkeypatch.setattr(op._TUNING, "lookup", lambda *a, **k: dict(entry))
    assert op.mma_variant_args(plan("sm90", 16, 4096, 4096, has_gemm=True)) == (0, 0, 2)
    assert "wload" not in plan("sm90", 17, 4096, 4096, has_gemm=True)  # <= 16 tokens only
    assert op.mma_variant_args({"wload": 3, "steps": 4}) == (4, 0, 3)
    for bad in ({"wload": 4}, {"wload": True}, {"wload": 1, "steps": 8}, {"wload": 2, "ldpolicy": "plain"}):
        with pytest.raises(ValueError, match="wload"):
            op.mma_variant_args(bad)


def test_plan_stream_entry_and_fallbacks(monkeypatch):
    """A "stream" entry (decode on the folded W' only): kept for a module call of <= 16 tokens; a functional
    call takes the entry's "fn" config, or decode_mma's default without one; > 16 tokens decode_mma; no
    tensor-core kernels the CUDA-core decode kernel. Its (bn, stages) must be a compiled pair."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    entry = {"path": "stream", "bn": 64, "stages": 6}
    monkeypatch.setattr(op._TUNING, "lookup", lambda *a, **k: dict(entry))
    p = plan("sm90", 16, 14336, 4096, has_gemm=True)
    assert p == {"path": "stream", "bn": 64, "stages": 6} and op.stream_args(p) == (64, 6, 0, 0, 64)
    assert plan("sm90", 16, 14336, 4096, has_gemm=True, folded=False) == {"path": "decode_mma", "wn": 0, "ksplit": 0}
    assert plan("sm90", 17, 14336, 4096, has_gemm=True)["path"] == "decode_mma"
    assert plan("sm90", 8, 14336, 4096, has_gemm=True, has_mma=False)["path"] == "decode"
    entry["fn"] = {"path": "decode_mma", "wn": 8, "ksplit": 2, "wload": 1}
    assert plan("sm90", 16, 14336, 4096, has_gemm=True, folded=False)["wn"] == 8
    entry["fn"] = {"path": "stream", "bn": 128, "stages": 4}  # a functional stream entry (x * g from rstd_scale)
    assert plan("sm90", 16, 14336, 4096, has_gemm=True, folded=False) == {"path": "stream", "bn": 128, "stages": 4}
    assert plan("sm90", 17, 14336, 4096, has_gemm=True, folded=False)["path"] == "decode_mma"
    assert op.stream_args({"path": "stream"}) == (*op.STREAM_VARIANTS[0], 0, 0, op.STREAM_VARIANTS[0][0])
    for bad in ({"bn": 96}, {"bn": 128, "stages": 6}, {"stages": True}, {"wgmma": 1}, {"proxy_fence": True},
                {"wgmma": True, "bn": 128, "stages": 3}, {"wgmma": True, "proxy_fence": 1}, {"warpgroups": 2},
                {"wgmma": True, "bn": 64, "stages": 5, "warpgroups": 2}, {"bn": 128, "rows": 112},
                {"wgmma": True, "bn": 128, "stages": 5, "warpgroups": 2, "rows": 96},
                {"wgmma": True, "bn": 64, "stages": 4, "rows": 72}, {"wgmma": True, "bn": 64, "rows": True},
                {"wgmma": True, "bn": 128, "stages": 7, "warpgroups": 2},
                {"wgmma": True, "bn": 64, "stages": 12}, {"split": 2}, {"wgmma": True, "split": 3},
                {"wgmma": True, "split": True}, {"wgmma": True, "split": 16}):  # fmt: skip
        with pytest.raises(ValueError, match="stream config"):
            op.stream_args(bad)
    for s in (1, 2, 4, 8):  # the split reaches the wgmma kernel only
        assert op.stream_split({"wgmma": True, "split": s}, 1) == s and op.stream_split({"split": s}, 0) == 1
    assert op.stream_split({"wgmma": True}, 2) == 1


def test_stream_args_wgmma():
    """The wgmma twin has its own (bn, stages) pairs and the optional proxy fence; without an sm_90a kernel (or
    on another GPU) a wgmma entry runs the mma.sync kernel of the same bn, without the fence."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    cfg = {"path": "stream", "wgmma": True, "bn": 128, "stages": 6, "warpgroups": 2, "proxy_fence": True}
    assert op.stream_args(cfg) == (128, 6, 2, 1, 128)
    assert op.stream_args(cfg, wgmma_ok=False) == (128, 4, 0, 0, 128)
    assert op.stream_args({**cfg, "stages": 5, "rows": 112}) == (128, 5, 2, 1, 112)
    assert op.stream_args({**cfg, "stages": 5, "rows": 112}, wgmma_ok=False) == (128, 4, 0, 0, 128)  # bn rows
    with pytest.raises(ValueError, match="stream config"):  # 112 rows is compiled for 5 and 6 stages only
        op.stream_args({**cfg, "stages": 4, "rows": 112})
    assert op.stream_args({"wgmma": True, "bn": 64, "stages": 5}, wgmma_ok=False) == (64, 6, 0, 0, 64)
    d = op.STREAM_WG_VARIANTS[0]
    assert op.stream_args({"wgmma": True}) == (*d[:3], 0, d[3])
    for bn, st, wg, rows in op.STREAM_WG_VARIANTS:
        assert op.stream_args({"wgmma": True, "bn": bn, "stages": st, "warpgroups": wg, "rows": rows}) == (
            bn, st, wg, 0, rows)  # fmt: skip
        # the kernel's ring (csrc/decode_stream.cu launch_wg: + 1 KB to align it, + what the last tile reads past
        # it) within an H100 / H200 CTA's 227 KB opt-in, less the static part; rows past ROWS read the stage's next
        # rows (ROWS >= bn - 32); 16 rows per warpgroup and load step (ROWS * 16 B chunks a multiple of the threads)
        overrun = max(0, bn - rows - 16) * 128
        assert st * (rows + 16) * 256 + 1024 + overrun <= 226 * 1024 and bn - 32 <= rows <= bn
        assert rows * 16 % (128 * wg) == 0


def test_stream_auto_rows(monkeypatch):
    """ "rows": "auto": a compiled wgmma variant chosen from N and the SM count (the H100 sweep's winners at 132
    SMs), resolved by plan for module and functional ("fn") entries alike; the real sm90 table sends <= 16
    tokens at N >= 1024 to it and smaller N to decode_mma."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    ns = (1024, 2048, 4096, 5120, 6144, 10240, 11008, 14336, 28672)
    rows = {n: op.stream_auto(n, 4096, 132, splits=(1,))["rows"] for n in ns}  # session 41's rule: no split
    assert rows == {1024: 40, 2048: 40, 4096: 40, 5120: 40, 6144: 64, 10240: 40, 11008: 112, 14336: 112, 28672: 112}
    assert op.stream_auto(5120, 4096, 114, splits=(1,))["rows"] == 64  # 128 CTAs of 40 rows: 2 rounds on 114 SMs
    # the K split only where the W' rows leave half the SMs idle (N 1024: 26 CTAs of 40 rows, split 4 puts 104 on
    # 132; N 2048: 52, split 2), one-warpgroup variants only, clusters on at most 80% of the SMs
    assert {n: op.stream_auto(n, 4096, 132)["split"] for n in ns} == {n: {1024: 4, 2048: 2}.get(n, 1) for n in ns}
    assert op.stream_auto(2048, 2048, 132)["split"] == 1  # 16 k-blocks: the reduction costs what split 2 saves
    assert op.stream_auto(1536, 4096, 132)["rows"] == 64
    # split 8 (its reduction costs more) from about K 5000 at N 512: 104 CTAs, inside the 80% rule at 132 SMs only
    assert [op.stream_auto(512, k, 132)["split"] for k in (4096, 6144, 8192, 16384)] == [4, 8, 8, 8]
    assert op.stream_auto(512, 8192, 114)["split"] == 4 and op.stream_auto(768, 16384, 132)["split"] == 4
    # clusters of 8 on at most half the SMs reduce for less: N 256 (7 clusters) takes split 8 from K 4096, N 384
    # (10 clusters) keeps split 4 there, and 16 k-blocks stay on split 4
    assert [op.stream_auto(n, k, 132)["split"] for n, k in ((256, 4096), (384, 4096), (256, 2048))] == [8, 4, 4]
    assert op.stream_auto(256, 4096, 100)["split"] == 4  # 56 CTAs are more than half of 100 SMs
    assert {n: op.stream_auto(n, 4096, 132)["rows"] for n in ns} == rows  # the same rows as unsplit at 132 SMs
    assert op.stream_auto(1024, 8192, 132) == {"bn": 64, "stages": 8, "warpgroups": 1, "rows": 40, "split": 4}
    for n in range(1, 70000, 997):
        for sms in (78, 114, 132):
            for k in (256, 4096, 16384):
                c = op.stream_auto(n, k, sms)
                assert (c["bn"], c["stages"], c["warpgroups"], c["rows"]) in op.STREAM_WG_VARIANTS
                tiles = op.cdiv(n, c["rows"])
                assert c["split"] == 1 or (
                    c["warpgroups"] == 1 and 2 * tiles <= sms and 5 * tiles * c["split"] <= 4 * sms
                )
    entry = {"path": "stream", "wgmma": True, "rows": "auto", "fn": {"path": "stream", "wgmma": True, "rows": "auto"}}
    monkeypatch.setattr(op._TUNING, "lookup", lambda *a, **k: {**entry, "fn": dict(entry["fn"])})
    want = {"path": "stream", "wgmma": True, "bn": 128, "stages": 6, "warpgroups": 2, "rows": 112, "split": 1}
    for folded in (True, False):
        p = plan("sm90", 16, 14336, 4096, has_gemm=True, folded=folded, sms=132)
        assert p == want and op.stream_args(p) == (128, 6, 2, 0, 112)
    monkeypatch.undo()
    p = plan("sm90", 8, 4096, 4096, has_gemm=True, sms=132)
    assert p == {"path": "stream", "wgmma": True, "bn": 64, "stages": 8, "warpgroups": 1, "rows": 40, "split": 1}
    # functional calls: decode_mma below 2^25 weights (rstd_scale's extra launch costs more than the kernels
    # differ), the stream kernel on x * g above (H100 session 41: 0.93-1.10x F.linear against 1.06-1.22x)
    assert plan("sm90", 8, 4096, 4096, has_gemm=True, folded=False, sms=132)["path"] == "decode_mma"
    assert plan("sm90", 1, 4096, 4096, has_gemm=True, folded=False, sms=132)["wload"] == 1
    assert plan("sm90", 8, 4096, 14336, has_gemm=True, folded=False, sms=132)["rows"] == 40
    # and at N 1024, where the K split makes the stream kernel 20-25% faster than decode_mma (H200 session 43)
    # (1-4 tokens up to K 8192: the CUDA-core GEMV since sessions 49 / 50 / 51)
    for M, K in ((5, 4096), (16, 4096), (16, 8192), (4, 16384)):
        p = plan("sm90", M, 1024, K, has_gemm=True, folded=False, sms=132)
        assert (p["path"], p["rows"], p["split"]) == ("stream", 40, 4), (M, K)
    assert plan("sm90", 3, 2048, 2048, has_gemm=True, folded=False, sms=132)["path"] == "decode_mma"
    assert plan("sm90", 2, 2048, 2048, has_gemm=True, folded=False, sms=132)["path"] == "decode"
    assert plan("sm90", 8, 28672, 4096, has_gemm=True, folded=False, sms=132)["rows"] == 112
    # since session 43 the module's catch-all stream entry starts at N 512 (the K split: H100 run 3, D8192 N512 M1
    # 7.25 us against decode_mma's 11.35), since session 47 at N 256 from K 2048 (split 4 or 8: H100 N256 / N384
    # at D2048-16384 4-25% faster than decode_mma); below, decode_mma
    p = plan("sm90", 8, 512, 4096, has_gemm=True, sms=132)
    assert (p["path"], p["rows"], p["split"]) == ("stream", 40, 4)
    for M, N, K, split in ((5, 256, 2048, 4), (16, 384, 4096, 4), (8, 256, 8192, 8), (16, 511, 16384, 8)):
        p = plan("sm90", M, N, K, has_gemm=True, sms=132)
        assert (p["path"], p["rows"], p["split"]) == ("stream", 40, split), (M, N, K)
        assert plan("sm90", M, N, K, has_gemm=True, folded=False, sms=132)["path"] == "decode_mma"
    for N, K in ((255, 4096), (128, 8192), (384, 1024)):
        assert plan("sm90", 8, N, K, has_gemm=True, sms=132)["path"] == "decode_mma", (N, K)
    # functional calls at N 512..640: the split stream kernel from K 7168 (H100 session 45, D8192 N512 M1 9.73 us
    # against decode_mma's 12.08), decode_mma at K 6144 (7.66 against 8.94) and N 768 (D8192: 9.49 against 10.59)
    # (1-2 tokens up to K 8192 and 2^23 weights: the CUDA-core GEMV since session 50)
    # (3-4 tokens at N 512..640 from K 7168 up to K 8192: the CUDA-core GEMV since session 51)
    for M, N, K in ((3, 512, 16384), (16, 640, 16384), (5, 512, 8192)):
        assert plan("sm90", M, N, K, has_gemm=True, folded=False, sms=132)["path"] == "stream", (M, N, K)
    for M, N, K in ((8, 512, 4096), (3, 512, 6144), (3, 768, 8192), (2, 1000, 16384)):
        assert plan("sm90", M, N, K, has_gemm=True, folded=False, sms=132)["path"] == "decode_mma", (M, N, K)
    assert plan("sm90", 17, 4096, 4096, has_gemm=True, sms=132)["path"] == "gemm"


def test_plan_decode_mma_fallbacks():
    # a binary / GPU without the tensor-core kernel runs the CUDA-core decode kernel instead
    assert plan("sm90", 8, 4096, 4096, has_gemm=True, has_mma=False)["path"] == "decode"
    assert plan("sm86", 16, 4096, 4096, has_gemm=True)["path"] == "decode_mma"
    assert plan("sm86", 16, 4096, 4096, has_gemm=True)["ksplit"] == 1  # no clusters before sm_90
    assert plan("sm75", 4, 4096, 4096, has_gemm=False, has_mma=False)["path"] == "decode"
    assert plan("sm86", 33, 4096, 4096, has_gemm=True)["path"] == "gemm"


def test_plan_without_gemm_and_arch_fallback():
    assert plan("sm75", 512, 4096, 4096, has_gemm=False)["path"] == "torch_gemm"
    assert plan("sm70", 48, 4096, 4096, has_gemm=False)["path"] == "decode"
    assert plan("sm89", 512, 4096, 4096, has_gemm=True) == plan("sm86", 512, 4096, 4096, has_gemm=True)
    assert plan("cpu", 4, 8, 8, has_gemm=False)["path"] == "torch"
    assert plan("sm90", 512, 1001, 4096, has_gemm=True)["path"] == "torch_gemm"


def test_backend_arch_helpers():
    assert backend.device_arch((9, 0)) == "9.0a" and backend.device_arch((8, 6)) == "8.6"
    assert backend.covers(["8.0", "9.0a"], (8, 9))
    assert backend.covers(["8.0", "9.0a"], (9, 0))
    assert not backend.covers(["8.6"], (8, 0))
    assert not backend.covers(["8.6"], (7, 5))
    assert backend.covers(["8.0", "9.0a"], (12, 0))  # PTX of the newest arch


def test_backend_info_cpu():
    info = fused_rmsnorm.backend_info()
    assert info["package"] == "fused_rmsnorm"
    assert "torch" in info["cpu"]
    if not torch.cuda.is_available():
        assert info["decode"] == "torch" and info["prefill"] == "torch" and info["reason"] == "no CUDA device"


class _FakeAot:
    """Stands in for fused_rmsnorm._C: an sm90 binary that says which sources it was built from."""

    def __init__(self, source_hash):
        self._hash = source_hash

    def compiled_archs(self):
        return ["9.0a"]

    def source_hash(self):
        return self._hash

    def has_sm90_gemm(self):
        return True

    has_sm80_gemm = has_sm90_gemm

    def cuda_version(self):
        return 13000


def test_aot_staleness_names_a_binary_from_other_sources(monkeypatch):
    here = _build.source_hash()
    assert len(here) == 64 and here == _build.source_hash()
    assert backend.aot_staleness(_FakeAot(here)) is None
    assert backend.aot_staleness(_FakeAot("")) is None  # unknown: not flagged
    assert backend.aot_staleness(object()) is None  # a module from before source_hash existed
    msg = backend.aot_staleness(_FakeAot("0" * 64))
    assert "000000000000" in msg and here[:12] in msg and "--inplace" in msg

    backend.reset()
    monkeypatch.setitem(sys.modules, "fused_rmsnorm._C", _FakeAot("0" * 64))  # what import_module returns
    with pytest.warns(RuntimeWarning, match="other sources.*using it anyway"):
        ext = backend._try_aot((9, 0))
    assert ext.kind == "aot" and "STALE" in ext.reason and ext.archs == ["9.0a"]
    backend.reset()
    monkeypatch.setitem(sys.modules, "fused_rmsnorm._C", _FakeAot(here))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a binary of the installed sources warns nothing
        ext = backend._try_aot((9, 0))
    assert ext.kind == "aot" and "STALE" not in ext.reason
    info = fused_rmsnorm.backend_info()
    assert info["aot"]["present"] and info["aot"]["source_hash"] == here and info["aot"]["stale"] is False
    backend.reset()


def test_arch_list_resolution(monkeypatch):
    monkeypatch.delenv("FUSED_RMSNORM_CUDA_ARCH_LIST", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert _build.resolve_arch_list() == ["8.0", "8.6", "8.9", "9.0a"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.0 8.6+PTX")
    assert _build.resolve_arch_list() == ["7.0", "8.6+PTX"]
    monkeypatch.setenv("FUSED_RMSNORM_CUDA_ARCH_LIST", "9.0a")
    assert _build.resolve_arch_list() == ["9.0a"]
    assert _build.resolve_arch_list("8.9,9.0A") == ["8.9", "9.0a"]
    with pytest.raises(_build.BuildError, match="sm86"):
        _build.resolve_arch_list("sm86")


# ------------------------------------------------------------------------------------------------- GPU

GPU_D = [2048, 4096, 8192, 5120]
GPU_M = [1, 3, 16, 64, 512, 4096]


def _gpu_case(M, D, N, dtype, bias=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(M, D, device="cuda", generator=gen) * 2 + 0.3).to(dtype)
    g = (torch.rand(D, device="cuda", generator=gen) + 0.5).to(dtype)
    w = (torch.randn(N, D, device="cuda", generator=gen) / D**0.5).to(dtype)
    b = torch.randn(N, device="cuda", generator=gen).to(dtype) if bias else None
    return x, g, w, b


def _ref32(x, g, w, b, eps):
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * g.float()) @ w.float().t()
    return y + b.float() if b is not None else y


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", GPU_D)
@pytest.mark.parametrize("M", GPU_M)
def test_gpu_vs_fp32(M, D, dtype):
    N = 4096 if D != 2048 else 2048
    x, g, w, _ = _gpu_case(M, D, N, dtype)
    y = fused_rmsnorm_linear(x, g, w, eps=1e-6)
    torch.cuda.synchronize()
    assert y.shape == (M, N) and torch.isfinite(y).all()
    assert rel_err(y, _ref32(x, g, w, None, 1e-6).double()) <= 1e-2
    kind = backend.get_ext(x.device).kind
    want = os.environ.get("FUSED_RMSNORM_BACKEND", "auto")
    if want in ("aot", "jit"):
        assert kind == want


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 5, 9, 40, 300])
def test_gpu_bias_odd_sizes_strided_leading_dims(M, dtype):
    D = 1032  # D % 8 == 0 but not a tile multiple
    N_gemm = 1001 if M <= 16 else 1000  # decode takes any N; the GEMM needs N % 8 == 0
    x, g, w, b = _gpu_case(M, D, N_gemm, dtype, bias=True, seed=M)
    xs = torch.cat([x, x], dim=1)[:, :D].reshape(1, M, D)  # strided rows, extra leading dim
    y = fused_rmsnorm_linear(xs, g, w, b, eps=1e-5)
    torch.cuda.synchronize()
    assert y.shape == (1, M, N_gemm)
    assert rel_err(y[0], _ref32(x, g, w, b, 1e-5).double()) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 7, 1000])
@pytest.mark.parametrize("ctas", [1, 3, 132])
@pytest.mark.parametrize("D", [2048, 2056, 8192, 16392])
def test_gpu_rstd_side_matches_wide(M, ctas, D):
    """The 32-warp side launch (ctas > 0, the SM90 PDL prefill path) sums each row in the same lane and
    warp order as the 8-warp one: bit-identical, and within fp32 rounding of a float64 reference; rows
    past the grid are reached by the grid stride. D picks the warps per row (2048: 1, 2056: 2 with a
    partial last sweep, 8192: 4, 16392: 8 with a second batch of loads per lane)."""
    ext = backend.get_ext(torch.device("cuda"))
    if ext.kind == "torch":
        pytest.skip("no extension")
    m = ext.module
    x = _gpu_case(M, D, 8, torch.bfloat16, seed=M + ctas + D)[0]
    x[M // 2] = 0  # an all-zero row: rstd = 1 / sqrt(eps), finite
    s = torch.cuda.current_stream().cuda_stream
    wide = torch.full((M,), float("nan"), device="cuda")
    side = torch.full((M,), float("nan"), device="cuda")
    m.rstd(1, x.data_ptr(), D, wide.data_ptr(), M, D, 1e-6, s)
    m.rstd(1, x.data_ptr(), D, side.data_ptr(), M, D, 1e-6, s, ctas)
    torch.cuda.synchronize()
    assert torch.equal(wide, side)
    ref = torch.rsqrt(x.double().pow(2).mean(-1) + 1e-6)
    assert ((side.double() - ref).abs() / ref).max() < 1e-5


@pytest.mark.gpu
def test_gpu_rstd_side_only_when_a_is_x(monkeypatch):
    """The side rstd launch (idle SMs of a config-1 GEMM: 4 of 132 at M512 N4096) is used by the module
    path (A = x, W' folded) but not by the functional call that scales x by g (M < N); both correct."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    m = _sm90_ext_or_skip()
    M, D, N = 512, 256, 4096
    x, g, w, _ = _gpu_case(M, D, N, torch.bfloat16, seed=11)
    monkeypatch.setattr(op, "plan", lambda *a, **k: {"path": "gemm", "config": 1, "pdl": True})
    monkeypatch.setattr(op, "num_sms", lambda dev: 132)
    seen = []
    real, real_scale = m.rstd, m.rstd_scale
    monkeypatch.setattr(m, "rstd", lambda *a: (seen.append(a[8] if len(a) > 8 else 0), real(*a))[1])
    monkeypatch.setattr(m, "rstd_scale", lambda *a: (seen.append("scale"), real_scale(*a))[1])
    ref = _ref32(x, g, w, None, 1e-6).double()
    assert rel_err(op.fused_rmsnorm_linear_folded(x, g, w, fold_weight(g, w)), ref) <= 1e-2
    assert rel_err(fused_rmsnorm_linear(x, g, w), ref) <= 1e-2
    assert seen == [op.rstd_side_ctas(1, M, N, 132), "scale"] and seen[0] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 7, 1000])
@pytest.mark.parametrize("D", [2048, 2056, 8192, 16392])
def test_gpu_rstd_scale_matches_rstd_and_torch(M, D, dtype):
    """rstd_scale (a functional call's one pass over x): rstd bit-identical to the rstd kernel's, and
    xg = x * g bit-identical to torch's x * g (one rounding of an exact product), from strided x rows
    into a poisoned buffer with its own row stride; every element written, nothing past D touched."""
    ext = backend.get_ext(torch.device("cuda"))
    if ext.kind == "torch":
        pytest.skip("no extension")
    m = ext.module
    dt = 1 if dtype == torch.bfloat16 else 0
    x_full = _gpu_case(M, D + 16, 8, dtype, seed=M + D)[0]
    x = x_full[:, :D]  # row stride D + 16
    x[M // 2] = 0  # an all-zero row: rstd = 1 / sqrt(eps), finite
    g = torch.randn(D, device="cuda", dtype=dtype)
    s = torch.cuda.current_stream().cuda_stream
    want = torch.full((M,), float("nan"), device="cuda")
    m.rstd(dt, x.data_ptr(), D + 16, want.data_ptr(), M, D, 1e-6, s)
    rstd = torch.full((M,), float("nan"), device="cuda")
    xg_buf = torch.full((M, D + 8), float("nan"), device="cuda", dtype=dtype)
    m.rstd_scale(dt, x.data_ptr(), D + 16, g.data_ptr(), xg_buf.data_ptr(), D + 8, rstd.data_ptr(), M, D, 1e-6, s)
    torch.cuda.synchronize()
    assert torch.equal(rstd, want)
    assert torch.equal(xg_buf[:, :D], x * g)
    assert xg_buf[:, D:].isnan().all()
    ref = torch.rsqrt(x.double().pow(2).mean(-1) + 1e-6)
    assert ((rstd.double() - ref).abs() / ref).max() < 1e-5


DEC_M = [1, 2, 3, 8, 16, 17, 31, 32]


def _ext_or_skip():
    ext = backend.get_ext(torch.device("cuda"))
    if ext.kind == "torch" or not ext.has_decode_mma or torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("no tensor-core decode kernel for this GPU / binary")
    return ext.module


def _poisoned(M, N, dtype):
    return torch.full((M, N), float("nan"), device="cuda", dtype=dtype)


def _raw_case(M, D, N, dtype, seed):
    """Inputs for a raw-binding call: x with a padded row stride (D + 24), g, w, bias, the float64 reference of the
    unpadded x, the binding's dtype code and the current stream."""
    x, g, w, b = _gpu_case(M, D, N, dtype, bias=True, seed=seed)
    xs = torch.cat([x, x[:, :24]], dim=1)[:, :D]
    ref = _ref32(x, g, w, b, 1e-6).double()
    return xs, g, w, b, ref, (0 if dtype == torch.float16 else 1), torch.cuda.current_stream().cuda_stream


def _check_raw(yb, N, ref, key):
    """A raw call's output (row stride N + 5, NaN-poisoned): finite and within 1e-2 of ref, nothing past N."""
    y = yb[:, :N]
    assert torch.isfinite(y).all(), key
    assert rel_err(y, ref) <= 1e-2, key
    assert torch.isnan(yb[:, N:]).all(), key  # nothing written past N


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [4096, 5120])
@pytest.mark.parametrize("M", DEC_M)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gpu_decode_mma_vs_fp32(M, D, dtype, with_bias):
    """The tensor-core decode kernel through the public API (functional: g applied in-kernel) and
    through the module path (folded W'), strided x, poisoned outputs."""
    from fused_rmsnorm import FusedRMSNormLinear

    _ext_or_skip()
    N = 1000 + 8 * M + 3  # not a multiple of any tile size
    x, g, w, b = _gpu_case(M, D, N, dtype, bias=with_bias, seed=M + D)
    xs = torch.cat([x, x[:, :72]], dim=1)[:, :D]  # row stride D + 72: strided rows
    if M <= 16:  # the shipped sm90 table routes 17..32 to the GEMM (and, since session 41, module calls of
        # N >= 1024 to the wgmma stream kernel): the module path covers those then
        want = "decode" if M <= 2 else "decode_mma"  # 1-2 tokens: the CUDA-core GEMV (sessions 49 / 50)
        assert plan("sm90", M, N, D, has_gemm=True, folded=False)["path"] == want
    y = fused_rmsnorm_linear(xs, g, w, b, eps=1e-5)
    ref = _ref32(x, g, w, b, 1e-5).double()
    assert torch.isfinite(y).all() and rel_err(y, ref) <= 1e-2
    mod = FusedRMSNormLinear(D, N, bias=with_bias, eps=1e-5, device="cuda", dtype=dtype)
    with torch.no_grad():
        mod.weight.copy_(w)
        mod.norm_weight.copy_(g)
        if with_bias:
            mod.bias.copy_(b)
        ym = mod(xs)
    assert torch.isfinite(ym).all() and rel_err(ym, ref) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 17, 32, 40])
def test_gpu_decode_mma_every_split(M, dtype):
    """Every (wn, ksplit) the kernel takes, raw binding, output poisoned with NaN, K % 32 != 0,
    ragged N, x and y row strides. ksplit > 1 (thread-block clusters) only on sm_90."""
    m = _ext_or_skip()
    D, N = 1032, 203
    xs, g, w, b, ref, dt, stream = _raw_case(M, D, N, dtype, seed=7 * M)
    splits = [0, 1, 2, 4, 8, 16] if torch.cuda.get_device_capability()[0] >= 9 else [0, 1]
    for wn in (0, 1, 2, 4, 8):
        for ks in splits:
            for gptr, wt in ((g.data_ptr(), w), (0, w * g)):
                yb = _poisoned(M, N + 5, dtype)
                m.decode_mma(dt, xs.data_ptr(), xs.stride(0), gptr, wt.data_ptr(), D, b.data_ptr(), yb.data_ptr(),
                             N + 5, M, N, D, 1e-6, wn, ks, stream)  # fmt: skip
                _check_raw(yb, N, ref, (wn, ks, gptr != 0))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 6, 17])
def test_gpu_decode_gemv_every_split(M, dtype):
    """The CUDA-core GEMV's every K split (0 = its one-wave rule, under the K-slice cap up to 4 rows: split 1 at K
    520, 2 at 1032), raw binding, a grid cap that forces a grid-stride loop, output poisoned with NaN, ragged N, x
    and y row strides, K not a multiple of 256."""
    m = _ext_or_skip()
    N = 203
    for D in (520, 1032):
        xs, g, w, b, ref, dt, stream = _raw_case(M, D, N, dtype, seed=11 * M + D)
        for ks in (0, 1, 2, 4, 8):
            for grid in (0, 3):
                yb = _poisoned(M, N + 5, dtype)
                m.decode(dt, xs.data_ptr(), xs.stride(0), g.data_ptr(), w.data_ptr(), D, b.data_ptr(), yb.data_ptr(),
                         N + 5, M, N, D, 1e-6, ks, grid, stream)  # fmt: skip
                _check_raw(yb, N, ref, (D, ks, grid))


@pytest.mark.gpu
def test_gpu_decode_mma_rejects_bad_split():
    m = _ext_or_skip()
    x, g, w, _ = _gpu_case(2, 256, 64, torch.bfloat16)
    y = torch.empty(2, 64, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.current_stream().cuda_stream
    with pytest.raises(RuntimeError, match="decode_mma"):
        m.decode_mma(1, x.data_ptr(), 256, g.data_ptr(), w.data_ptr(), 256, 0, y.data_ptr(), 64, 2, 64, 256, 1e-6, 3,
                     0, s)  # fmt: skip
    if torch.cuda.get_device_capability()[0] < 9:
        with pytest.raises(RuntimeError, match="clusters"):
            m.decode_mma(1, x.data_ptr(), 256, g.data_ptr(), w.data_ptr(), 256, 0, y.data_ptr(), 64, 2, 64, 256, 1e-6,
                         1, 2, s)  # fmt: skip


MMA_VARIANTS = [(s, pol) for s in (0, 4, 8) for pol in (0, 1)]  # (steps, ldpolicy); (0|4, 0) = default


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 8, 16])
@pytest.mark.parametrize("D", [1032, 4104])
def test_gpu_decode_mma_variants(M, D, dtype):
    """Every (steps, ldpolicy) variant x a few (wn, ksplit), raw binding, functional (g in-kernel) and
    folded W', NaN-poisoned outputs, ragged N, K % 32 != 0 (1032 = 32 * 32 + 8; 4104: long K ranges,
    so the 8-deep ring turns several times)."""
    m = _ext_or_skip()
    N = 203
    xs, g, w, b, ref, dt, stream = _raw_case(M, D, N, dtype, seed=11 * M + D)
    ks_list = [1, 4] if torch.cuda.get_device_capability()[0] >= 9 else [1]
    light = (dtype == torch.float16 or M > 8) and getattr(m, "mma_variants_light", lambda: False)()
    for steps, pol in MMA_VARIANTS:
        if light and (steps, pol) not in ((0, 0), (4, 0)):
            continue  # a --light build has the variants for bf16 and M <= 8 only
        for wn, ks in [(0, 0), (1, 1), (8, 1)] + [(2, k) for k in ks_list]:
            for gptr, wt in ((g.data_ptr(), w), (0, w * g)):
                yb = _poisoned(M, N + 5, dtype)
                m.decode_mma(dt, xs.data_ptr(), xs.stride(0), gptr, wt.data_ptr(), D, b.data_ptr(), yb.data_ptr(),
                             N + 5, M, N, D, 1e-6, wn, ks, stream, steps, pol)  # fmt: skip
                _check_raw(yb, N, ref, (steps, pol, wn, ks, gptr != 0))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("D", [2056, 4104])
def test_gpu_decode_mma_wload_variants(M, D):
    """Every wload variant (1: x in the ring; 2 / 3: W through smem by cp.async.bulk, sm_90) x a few
    (wn, ksplit): odd N = 1001, K % 32 != 0 (2056 = 64 * 32 + 8: partial last stage and the register
    tail step), functional (g in-kernel) and folded W', NaN-poisoned outputs vs the fp32 reference."""
    m = _ext_or_skip()
    sm90 = torch.cuda.get_device_capability()[0] >= 9
    light = M > 8 and getattr(m, "mma_variants_light", lambda: False)()
    if light:
        pytest.skip("a --light build has the wload variants for bf16 and M <= 8 only")
    N = 1001
    dtype = torch.bfloat16
    x, g, w, b = _gpu_case(M, D, N, dtype, bias=True, seed=13 * M + D)
    ref = _ref32(x, g, w, b, 1e-6).double()
    stream = torch.cuda.current_stream().cuda_stream
    splits = [(0, 0), (1, 1), (8, 1)] + ([(2, 4), (4, 2)] if sm90 else [])
    for wload in (1, 2, 3):
        if wload >= 2 and not sm90:
            with pytest.raises(RuntimeError, match="sm_90"):
                m.decode_mma(1, x.data_ptr(), D, g.data_ptr(), w.data_ptr(), D, 0, x.data_ptr(), N, M, N, D, 1e-6,
                             0, 0, stream, 0, 0, wload)  # fmt: skip
            continue
        for wn, ks in splits:
            for gptr, wt in ((g.data_ptr(), w), (0, w * g)):
                yb = _poisoned(M, N + 3, dtype)
                m.decode_mma(1, x.data_ptr(), D, gptr, wt.data_ptr(), D, b.data_ptr(), yb.data_ptr(), N + 3, M, N,
                             D, 1e-6, wn, ks, stream, 0, 0, wload)  # fmt: skip
                y = yb[:, :N]
                key = (wload, wn, ks, gptr != 0)
                assert torch.isfinite(y).all(), key
                assert rel_err(y, ref) <= 1e-2, key
                assert torch.isnan(yb[:, N:]).all(), key
    with pytest.raises(RuntimeError, match="variant"):  # wload needs steps 4 / evict_first
        m.decode_mma(1, x.data_ptr(), D, g.data_ptr(), w.data_ptr(), D, 0, x.data_ptr(), N, M, N, D, 1e-6, 0, 0,
                     stream, 8, 0, 1)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16])
def test_gpu_decode_mma_variant_via_plan(M, monkeypatch):
    """A tuning entry with steps / ldpolicy reaches the kernel through the public API."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    _ext_or_skip()
    D, N = 1032, 203
    x, g, w, b = _gpu_case(M, D, N, torch.bfloat16, bias=True, seed=M)
    ref = _ref32(x, g, w, b, 1e-6).double()
    cfg = {"path": "decode_mma", "wn": 0, "ksplit": 0, "steps": 8, "ldpolicy": "plain"}
    monkeypatch.setattr(op, "plan", lambda *a, **k: dict(cfg))
    y = fused_rmsnorm_linear(x, g, w, b, eps=1e-6)
    assert torch.isfinite(y).all() and rel_err(y, ref) <= 1e-2


@pytest.mark.gpu
def test_gpu_decode_mma_variant_rejected_for_large_m():
    m = _ext_or_skip()
    x, g, w, _ = _gpu_case(17, 256, 64, torch.bfloat16)
    y = torch.empty(17, 64, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.current_stream().cuda_stream
    with pytest.raises(RuntimeError, match="variant"):
        m.decode_mma(1, x.data_ptr(), 256, g.data_ptr(), w.data_ptr(), 256, 0, y.data_ptr(), 64, 17, 64, 256, 1e-6, 0,
                     0, s, 8, 0)  # fmt: skip
    with pytest.raises(RuntimeError, match="decode_mma"):
        m.decode_mma(1, x.data_ptr(), 256, g.data_ptr(), w.data_ptr(), 256, 0, y.data_ptr(), 64, 2, 64, 256, 1e-6, 0,
                     0, s, 6, 0)  # fmt: skip


def _folded_graph_replay(x, g, w, wf, b):
    """The module-path op captured in a CUDA graph, its output poisoned with NaN, then replayed: the replay's y."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = op.fused_rmsnorm_linear_folded(x, g, w, wf, b)
    yg.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return yg


def _stream_cfgs(ext) -> list[dict]:
    """Every compiled "stream" variant (the wgmma ones, with and without the fence, on a 9.0 GPU with them built)."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    cfgs = [{"path": "stream", "bn": bn, "stages": st} for bn, st in op.STREAM_VARIANTS]
    if torch.cuda.get_device_capability() == (9, 0) and ext.has_stream_wgmma:
        wg = [{"path": "stream", "wgmma": True, "bn": bn, "stages": st, "warpgroups": g, "rows": r}
              for bn, st, g, r in op.STREAM_WG_VARIANTS]  # fmt: skip
        cfgs += wg + [{**wg[0], "proxy_fence": True}, {**wg[-1], "proxy_fence": True}]
        cfgs += [{**c, "split": s} for c in wg for s in (2, 4, 8)]  # the K split over a cluster
    return cfgs


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("D", [136, 2056, 4104])
def test_gpu_stream_vs_fp32(M, D, dtype, monkeypatch):
    """The "stream" decode kernel, every variant of both kernels (the wgmma ones also with a K split of 2, 4, 8:
    D136 leaves ranks without a k-block, D2056 / 4104 put the partial block on an inner rank or the last): K off
    the 128-wide k-block (D136: 2 blocks, fewer
    than the ring's stages; D2056 / 4104: a partial last block), N off the row tile (1000), x rows with a
    padded stride and 100x apart in scale (an rstd given to the wrong token cannot pass), with and without
    bias, on an allocator poisoned with NaN, and a CUDA-graph replay; a functional call runs it (x * g and rstd
    from rstd_scale, then W) only where the entry's "fn" names it."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    ext = backend.get_ext(torch.device("cuda"))
    if ext.kind == "torch" or not ext.has_decode_mma:
        pytest.skip("no tensor-core decode kernels in this binary")
    N = 1000
    x, g, w, b = _gpu_case(M, D + 24, N, dtype, bias=True, seed=11 * M + D)
    x = (x.float() * torch.logspace(-1, 1, M, device="cuda")[:, None]).to(dtype)[:, :D]  # row stride D + 24
    g, w = g[:D].contiguous(), w[:, :D].contiguous()
    wf = fold_weight(g, w)
    launches = []
    real = ext.module.decode_stream
    # positional as the op passes them: the caller's rstd pointer is argument 18 (then the split)
    monkeypatch.setattr(ext.module, "decode_stream", lambda *a: (launches.append(a[18] != 0), real(*a))[1])
    for cfg in _stream_cfgs(ext):
        variant = tuple(cfg.items())
        monkeypatch.setattr(op._TUNING, "lookup", lambda *a, c=cfg, **k: dict(c, fn=dict(c)))
        for bias in (None, b):
            ref = _ref32(x, g, w, bias, 1e-6).double()
            calls = {False: lambda bias=bias: op.fused_rmsnorm_linear_folded(x, g, w, wf, bias),
                     True: lambda bias=bias: fused_rmsnorm_linear(x, g, w, bias)}  # fmt: skip
            for functional, call in calls.items():
                junk = torch.full((M * N * 4,), float("nan"), device="cuda", dtype=dtype)
                del junk
                launches.clear()
                y = call()
                torch.cuda.synchronize()
                assert launches == [functional], variant  # the caller's rstd exactly for the functional call
                errs = (y.double() - ref).norm(dim=1) / ref.norm(dim=1)
                assert y.shape == (M, N) and torch.isfinite(y).all() and errs.max() <= 1e-2, (variant, errs.max())
        yg = _folded_graph_replay(x, g, w, wf, b)
        assert torch.isfinite(yg).all() and rel_err(yg, _ref32(x, g, w, b, 1e-6).double()) <= 1e-2, variant
    monkeypatch.setattr(op._TUNING, "lookup", lambda *a, **k: {"path": "stream"})  # no "fn": not for functional calls
    assert op.plan("sm90", M, N, D, has_gemm=True, folded=False)["path"] != "stream"


@pytest.mark.gpu
def test_gpu_stream_rejects_bad_args():
    """The launcher's own checks (the Python side never passes these): more than 16 tokens, K not a multiple
    of 8, a misaligned x, an unknown (bn, stages)."""
    m = backend.get_ext(torch.device("cuda")).module
    if m is None or not m.has_decode_mma():
        pytest.skip("no tensor-core decode kernels in this binary")
    x = torch.randn(17, 264, device="cuda").bfloat16()
    w = torch.randn(64, 264, device="cuda").bfloat16()
    y = torch.empty(17, 64, device="cuda").bfloat16()
    s = torch.cuda.current_stream().cuda_stream
    ok = dict(dtype=1, x=x.data_ptr(), ldx=264, w=w.data_ptr(), ldw=264, bias=0, y=y.data_ptr(), ldy=64, M=16, N=64,
              K=264, eps=1e-6, bn=128, stages=4, stream=s)  # fmt: skip
    m.decode_stream(**ok)
    torch.cuda.synchronize()
    for bad in ({"M": 17}, {"K": 260}, {"x": x.data_ptr() + 2}, {"bn": 64, "stages": 3}, {"eps": 0.0}, {"fence": 2},
                {"wgmma": 1, "stages": 3}, {"wgmma": 3}, {"wgmma": 2, "bn": 64, "stages": 5},
                {"rows": 120}, {"split": 2}, {"wgmma": 1, "split": 3}, {"wgmma": 1, "split": 16}):  # fmt: skip
        with pytest.raises(RuntimeError, match="unsupported arguments"):
            m.decode_stream(**{**ok, **bad})
    if torch.cuda.get_device_capability() == (9, 0) and m.has_stream_wgmma():
        m.decode_stream(**{**ok, "wgmma": 2, "stages": 5, "rows": 112})
        torch.cuda.synchronize()
        for bad in ({"rows": 120}, {"rows": 136}, {"stages": 4, "rows": 112}):  # row counts not compiled
            with pytest.raises(RuntimeError, match="unsupported arguments"):
                m.decode_stream(**{**ok, "wgmma": 2, "stages": 5, **bad})
        with pytest.raises(RuntimeError, match="unsupported arguments"):
            m.decode_stream(**{**ok, "wgmma": 1, "bn": 64, "stages": 12, "rows": 64})
    else:
        with pytest.raises(RuntimeError, match="decode_stream"):  # no sm_90a kernel to run: refused, not launched
            m.decode_stream(**{**ok, "wgmma": 1})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M,D,N", [(1, 2056, 300), (2, 4104, 383), (1, 1032, 128), (2, 16376, 130), (3, 2056, 200),
                                   (4, 4088, 256), (3, 1032, 128), (4, 2056, 251), (1, 1032, 1000), (2, 4104, 1531),
                                   (1, 8184, 767), (3, 2056, 450), (4, 4088, 509), (3, 1016, 1000),
                                   (4, 1016, 777)])  # fmt: skip
def test_gpu_decode_small_n_via_table(M, D, N, dtype):
    """Where the shipped table picks the CUDA-core GEMV (sm90 since session 49: <= 4 tokens, small N; session 50
    up to N 2048 at 1-2 tokens, its one-wave rule picking split 2 or 4 at N 450-1531, 8 below; session 51 3-4 tokens
    up to N 1024 at K <= 1024, the last two cases): module (folded W' cached, the kernel reads W and g) and
    functional calls, K off a 256-wide step, N odd, x rows padded and 100x apart in scale, bias, a NaN-poisoned
    allocator and a CUDA-graph replay."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    dev = torch.device("cuda")
    if backend.get_ext(dev).kind == "torch":
        pytest.skip("no extension built for this GPU")
    x, g, w, b = _gpu_case(M, D + 24, N, dtype, bias=True, seed=7 * M + N)
    x = (x.float() * torch.logspace(-1, 1, M, device="cuda")[:, None]).to(dtype)[:, :D]  # row stride D + 24
    g, w = g[:D].contiguous(), w[:, :D].contiguous()
    wf = fold_weight(g, w)
    if op.arch_key(dev) == "sm90":
        assert op.plan("sm90", M, N, D, has_gemm=True, folded=True, sms=op.num_sms(dev))["path"] == "decode"
    ref = _ref32(x, g, w, b, 1e-6).double()
    for call in (lambda: fused_rmsnorm_linear(x, g, w, b), lambda: op.fused_rmsnorm_linear_folded(x, g, w, wf, b)):
        junk = torch.full((M * N * 4,), float("nan"), device="cuda", dtype=dtype)
        del junk
        y = call()
        torch.cuda.synchronize()
        errs = (y.double() - ref).norm(dim=1) / ref.norm(dim=1)
        assert y.shape == (M, N) and torch.isfinite(y).all() and errs.max() <= 1e-2, errs.max()
    yg = _folded_graph_replay(x, g, w, wf, b)
    assert torch.isfinite(yg).all() and rel_err(yg, ref) <= 1e-2


@pytest.mark.gpu
def test_gpu_output_fully_written():
    # the output is allocated with torch.empty: fill the caching allocator with NaN first so an
    # unwritten element would show up
    for M in (1, 7, 64, 384):
        junk = torch.full((M * 2048 * 4,), float("nan"), device="cuda", dtype=torch.float16)
        del junk
        x, g, w, _ = _gpu_case(M, 2048, 2048, torch.float16, seed=M)
        y = fused_rmsnorm_linear(x, g, w)
        assert torch.isfinite(y).all(), f"M={M}"


@pytest.mark.gpu
def test_gpu_reports_extension_backend():
    x, g, w, _ = _gpu_case(4, 256, 64, torch.bfloat16)
    fused_rmsnorm_linear(x, g, w)
    info = fused_rmsnorm.backend_info()
    assert info["cuda"] and info["decode"] in ("aot", "jit"), info
    if info["decode"] == "aot":
        assert info["aot"]["stale"] is False, info  # the binary under test was built from these sources


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    x, g, w, _ = _gpu_case(2, 4096, 4096, torch.bfloat16)
    xs = torch.randn(512, 4096, device="cuda").bfloat16()
    for inp in (x, xs):
        fused_rmsnorm_linear(inp, g, w)  # warm up / resolve backend outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = fused_rmsnorm_linear(inp, g, w)
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(y, _ref32(inp, g, w, None, 1e-6).double()) <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
def test_gpu_compute_sanitizer_memcheck(tmp_path):
    script = tmp_path / "case.py"
    script.write_text(
        "import torch\nfrom fused_rmsnorm import fused_rmsnorm_linear\n"
        "for M, D in ((1, 264), (3, 264), (72, 264), (200, 264), (200, 8200)):  # 8200: rstd with 8 warps/row\n"
        "    x = torch.randn(M, D, device='cuda').half(); g = torch.randn(D, device='cuda').half()\n"
        "    w = torch.randn(136, D, device='cuda').half(); b = torch.randn(136, device='cuda').half()\n"
        "    y = fused_rmsnorm_linear(x, g, w, b)\n"
        "import fused_rmsnorm.ops.rmsnorm_linear as op\n"
        "vs = [{'bn': bn, 'stages': st} for bn, st in op.STREAM_VARIANTS]\n"
        "if torch.cuda.get_device_capability() == (9, 0) and op._backend.get_ext(x.device).has_stream_wgmma:\n"
        "    vs += [{'bn': bn, 'stages': st, 'wgmma': True, 'warpgroups': g, 'rows': r, 'proxy_fence': st == 4}\n"
        "           for bn, st, g, r in op.STREAM_WG_VARIANTS]\n"
        "    vs += [{**v, 'split': s} for v in vs[-4:] for s in (2, 8)]  # K split: D264 leaves ranks idle\n"
        "for v in vs:  # the stream decode kernels: N = 136, a partial row tile\n"
        "    op.plan = lambda *a, v=v, **k: {'path': 'stream', **v}\n"
        "    y = op.fused_rmsnorm_linear_folded(x[:3], g, w, op.fold_weight(g, w), b)\n"
        "ext = op._backend.get_ext(x.device)\n"
        "cap = torch.cuda.get_device_capability()  # a binary without CUTLASS has no GEMM path to check\n"
        "gemm = ext.has_gemm_sm90 if cap == (9, 0) else ext.has_gemm_sm80 if cap[0] == 8 else False\n"
        "for c, M in ((7, 5), (8, 17), (11, 5), (11, 16), (1, 300), (4, 300), (12, 300), (14, 300)) if gemm else ():\n"
        "    # swap-AB decode configs, prefill ones with a partial row tile; N = 136: a partial W tile\n"
        "    op.plan = lambda *a, c=c, **k: {'path': 'gemm', 'config': c, 'pdl': True}\n"
        "    x = torch.randn(M, D, device='cuda').half()\n"
        "    y = fused_rmsnorm_linear(x, g, w, b)\n"
        "    y = op.fused_rmsnorm_linear_folded(x, g, w, op.fold_weight(g, w), b)\n"
        "if gemm:\n"
        "    op.plan = lambda *a, **k: {'path': 'gemm', 'config': 1, 'pdl': True, 'raster': 2}\n"
        "    x = torch.randn(2100, 136, device='cuda').half(); g = torch.randn(136, device='cuda').half()\n"
        "    w = torch.randn(3080, 136, device='cuda').half()  # 17 x 25 tiles: the streamed rstd launch\n"
        "    assert op.rstd_streamed(1, 2100, 3080, op.num_sms(x.device), 2)[0] > 0\n"
        "    y = op.fused_rmsnorm_linear_folded(x, g, w, op.fold_weight(g, w))\n"
        "torch.cuda.synchronize(); print('OK' if gemm else 'OK without the SM90 GEMM')\n"
    )
    res = subprocess.run(
        ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "3", "python", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ.copy(),
    )
    if "Device not supported" in res.stdout + res.stderr:  # e.g. a gVisor sandbox: the tool cannot attach
        pytest.skip("compute-sanitizer cannot attach to this GPU (Device not supported)")
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout[-4000:] + res.stderr[-4000:]
    assert "ERROR SUMMARY: 0 errors" in res.stdout


@pytest.mark.gpu
def test_gpu_jit_path_in_fresh_process(tmp_path):
    """The JIT path end to end: a fresh process forced to JIT compiles into an empty cache (about a
    minute for sm_90a on 16 cores), then runs decode and GEMM shapes; a second process reuses it."""
    code = (
        "import torch, fused_rmsnorm\n"
        "from fused_rmsnorm import fused_rmsnorm_linear\n"
        "for M in (1, 300):\n"
        "    x = torch.randn(M, 1024, device='cuda').bfloat16()\n"
        "    g = (torch.rand(1024, device='cuda') + .5).bfloat16()\n"
        "    w = (torch.randn(512, 1024, device='cuda') / 32).bfloat16()\n"
        "    y = fused_rmsnorm_linear(x, g, w).float(); xf = x.float()\n"
        "    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * g.float()) @ w.float().t()\n"
        "    err = ((y - ref).abs().max() / ref.abs().max()).item(); assert err <= 1e-2, (M, err)\n"
        "info = fused_rmsnorm.backend_info(); print('BACKEND', info['decode'], info['prefill'])\n"
    )
    env = dict(os.environ, FUSED_RMSNORM_BACKEND="jit", FUSED_RMSNORM_CACHE=str(tmp_path))
    for _ in range(2):
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1200)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "BACKEND jit" in res.stdout, res.stdout
    assert len(list(tmp_path.glob("*/_C*.so"))) == 1  # one cache entry, reused by the second process


@pytest.mark.gpu
def test_gpu_forced_torch_backend(monkeypatch):
    monkeypatch.setenv("FUSED_RMSNORM_BACKEND", "torch")
    backend.reset()
    x, g, w, b = _gpu_case(33, 512, 256, torch.float16, bias=True)
    y = fused_rmsnorm_linear(x, g, w, b)
    assert backend.get_ext(x.device).kind == "torch"
    assert rel_err(y, _ref32(x, g, w, b, 1e-6).double()) <= 1e-2


def test_gemm_operands_scale_x_or_fold_w():
    """Without a cached W', up to M < 2N rows scale x by g (an empty A for the rstd_scale pass to fill: 2 M D
    moves) instead of folding W (2 N D plus the rstd read of x); a cached W' is used as is."""
    from fused_rmsnorm.ops.rmsnorm_linear import _gemm_operands, scale_x_side

    assert scale_x_side(63, 32) and not scale_x_side(64, 32) and scale_x_side(4096, 4096)
    x, g, w = torch.randn(4, 16, dtype=torch.float64), torch.randn(16, dtype=torch.float64), torch.randn(32, 16)
    w = w.double()
    xs = x.t().contiguous().t()  # column-major: A must still come back with unit inner stride
    for xi in (x, xs, torch.randn(63, 16, dtype=torch.float64)):
        a, wf, scaled = _gemm_operands(xi, g, w, None)
        assert scaled and wf is w and a is not xi and a.shape == xi.shape and a.stride() == (16, 1)
    xl = torch.randn(64, 16, dtype=torch.float64)
    a, wf, scaled = _gemm_operands(xl, g, w, None)
    assert not scaled and a is xl and torch.equal(wf, w * g)
    torch.testing.assert_close(a @ wf.T, (xl * g) @ w.T)
    cached = w * g
    a, wf, scaled = _gemm_operands(x, g, w, cached)
    assert not scaled and a is x and wf is cached


# ------------------------------------------------------------------------ SM90 tile configs + knobs


def test_sm90_knob_args_validation():
    """Tuning-entry keys raster / swizzle / splits reach the binding as ints; bad values name the key."""
    from fused_rmsnorm.ops.rmsnorm_linear import SM90_NUM_CONFIGS, SM90_STREAM_K_CONFIGS, sm90_knob_args

    assert sm90_knob_args({"path": "gemm", "config": 1}) == (0, 1, 1)  # CUTLASS's defaults
    assert sm90_knob_args({"config": 3, "raster": 2, "swizzle": 4}) == (2, 4, 1)
    sk = SM90_STREAM_K_CONFIGS[0]
    assert sm90_knob_args({"config": sk, "raster": 1, "splits": 3}) == (1, 1, 3)
    bad = [
        ({"config": SM90_NUM_CONFIGS}, "'config'"),
        ({"config": True}, "'config'"),
        ({"config": 1, "raster": 3}, "'raster'"),
        ({"config": 1, "swizzle": 3}, "'swizzle'"),
        ({"config": 1, "swizzle": True}, "'swizzle'"),
        ({"config": sk, "splits": 0}, "'splits'"),
        ({"config": 1, "splits": 2}, "stream-K"),
    ]
    for cfg, msg in bad:
        with pytest.raises(ValueError, match=msg):
            sm90_knob_args(cfg)


def test_sm90_ctas_arg_validation():
    """The "ctas" cap: absent = 0 (every SM); refused for stream-K (workspace sized for the full grid) and the
    non-persistent configs (grid = tiles), and for odd (not whole 2-CTA clusters) or non-int counts."""
    from fused_rmsnorm.ops.rmsnorm_linear import SM90_BASIC_CONFIGS, SM90_STREAM_K_CONFIGS, sm90_ctas_arg

    assert sm90_ctas_arg({"config": 11}) == 0
    assert sm90_ctas_arg({"config": 11, "ctas": 112}) == 112
    for cfg, msg in [
        ({"config": 11, "ctas": -2}, "'ctas'"),
        ({"config": 11, "ctas": 7}, "'ctas'"),
        ({"config": 11, "ctas": 1.5}, "'ctas'"),
        ({"config": 11, "ctas": True}, "'ctas'"),
        ({"config": SM90_STREAM_K_CONFIGS[0], "ctas": 64}, "persistent"),
        ({"config": SM90_BASIC_CONFIGS[0], "ctas": 64}, "persistent"),
    ]:
        with pytest.raises(ValueError, match=msg):
            sm90_ctas_arg(cfg)


def test_shipped_sm90_gemm_entries_are_valid():
    import json

    from fused_rmsnorm.ops import rmsnorm_linear as op
    from fused_rmsnorm.ops.rmsnorm_linear import sm90_ctas_arg, sm90_knob_args

    table = json.loads(op._TUNING_PATH.read_text())
    for e in table["sm90"]:
        if e["config"].get("path") == "gemm":
            sm90_knob_args(e["config"])
            sm90_ctas_arg(e["config"])
    assert "raster" in table["_comment"] and "swizzle" in table["_comment"]


def test_plan_passes_knob_keys(monkeypatch):
    from fused_rmsnorm.ops import rmsnorm_linear as op

    entry = {"path": "gemm", "config": 6, "pdl": True, "raster": 1, "swizzle": 2}
    monkeypatch.setattr(op._TUNING, "lookup", lambda *a, **k: dict(entry))
    p = plan("sm90", 128, 8192, 8192, has_gemm=True)
    assert p == entry and op.sm90_knob_args(p) == (1, 2, 1)


def test_sm90_configs_match_build_and_header():
    import re

    from fused_rmsnorm.ops.rmsnorm_linear import SM90_NUM_CONFIGS, SM90_STREAM_K_CONFIGS

    h = (_build.CSRC / "frms.h").read_text()
    assert int(re.search(r"#define FRMS_SM90_NUM_CONFIGS (\d+)", h).group(1)) == SM90_NUM_CONFIGS
    assert (int(re.search(r"#define FRMS_SM90_STREAM_K_CONFIG (\d+)", h).group(1)),) == SM90_STREAM_K_CONFIGS
    assert _build.SM90_CONFIGS == tuple(range(SM90_NUM_CONFIGS))
    src = (_build.CSRC / "gemm_sm90.cu").read_text()
    for c in range(SM90_NUM_CONFIGS):
        assert f"frms_gemm_sm90_cfg{c}" in src and f"FRMS_FWD_OK({c})" in src  # entry + light forwarder
    assert _build.SM90_LIGHT_CONFIGS == (2, 7, 11, 12)  # one per family: plain, swap-AB, self rstd, non-persistent
    from fused_rmsnorm.ops.rmsnorm_linear import SM90_SELF_RSTD_TWIN

    self_rstd = re.search(r"#define FRMS_SM90_IS_SELF_RSTD\(c\) (.*)", h).group(1)
    assert tuple(int(c) for c in re.findall(r"\(c\) == (\d+)", self_rstd)) == tuple(SM90_SELF_RSTD_TWIN)


def test_w_settled_tracks_tensor_and_version():
    from fused_rmsnorm.ops import rmsnorm_linear as op

    a, b = torch.zeros(4), torch.zeros(4)
    assert not op._w_settled(a) and op._w_settled(a) and op._w_settled(a)
    assert not op._w_settled(b)  # another tensor
    a.add_(1.0)  # an in-place write: not settled until a call has read it again
    assert not op._w_settled(a) and op._w_settled(a)


def _sm90_ext_or_skip():
    ext = backend.get_ext(torch.device("cuda"))
    if ext.kind == "torch" or not ext.has_gemm_sm90 or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("no SM90 CUTLASS GEMM for this GPU / binary")
    return ext.module


SM90_CASES = [(c, 0, 1, 1) for c in range(SM90_NUM_CONFIGS)] + [(c, 2, 4, 1) for c in range(SM90_NUM_CONFIGS)]
SM90_CASES += [(1, 1, 8, 1), (6, 1, 2, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [300, 16])
@pytest.mark.parametrize("config,raster,swizzle,splits", SM90_CASES)
def test_gpu_sm90_every_config_and_knob(config, raster, swizzle, splits, M, dtype, monkeypatch):
    """Every SM90 tile config (stream-K included, with its torch workspace) and non-default scheduler
    knobs vs the fp32 reference at odd sizes (N, D multiples of 8 only: the TMA rule), with bias,
    functional (x * g) and module (folded W') operands, on an allocator poisoned with NaN."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    _sm90_ext_or_skip()
    D, N = 2056, 1000
    x, g, w, b = _gpu_case(M, D, N, dtype, bias=True, seed=M + config)
    ref = _ref32(x, g, w, b, 1e-6).double()
    cfg = {"path": "gemm", "config": config, "pdl": True, "raster": raster, "swizzle": swizzle}
    if splits > 1:
        cfg["splits"] = splits
    monkeypatch.setattr(op, "plan", lambda *a, **k: dict(cfg))
    for call in (lambda: fused_rmsnorm_linear(x, g, w, b), lambda: op.fused_rmsnorm_linear_folded(
            x, g, w, fold_weight(g, w), b)):  # fmt: skip
        junk = torch.full((M * N * 4,), float("nan"), device="cuda", dtype=dtype)
        del junk
        y = call()
        torch.cuda.synchronize()
        assert y.shape == (M, N) and torch.isfinite(y).all()
        assert rel_err(y, ref) <= 1e-2, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 5, 16, 17, 33])
@pytest.mark.parametrize("config", SM90_SWAP_CONFIGS)
def test_gpu_sm90_swap_ab_configs(config, M, dtype, monkeypatch):
    """The swap-AB decode configs (output written as a column-major D^T, rstd a row broadcast, bias a
    column broadcast; config 11 computes rstd in-kernel): token counts off the 16/32 tile, a partial
    last W-row tile (N = 936: 15 tiles of 64 rows, an odd count for the 2-CTA clusters), x with padded
    rows of very different scales, bias, module and functional operands, and a CUDA-graph replay."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    _sm90_ext_or_skip()
    D, N = 2056, 936
    x, g, w, b = _gpu_case(M, D + 24, N, dtype, bias=True, seed=31 * M + config)
    # rows 100x apart in scale: an rstd applied to the wrong token cannot pass
    x = (x.float() * torch.logspace(-1, 1, M, device="cuda")[:, None]).to(dtype)[:, :D]  # row stride D + 24
    g, w = g[:D].contiguous(), w[:, :D].contiguous()
    ref = _ref32(x, g, w, b, 1e-6).double()
    cfg = {"path": "gemm", "config": config, "pdl": True}
    monkeypatch.setattr(op, "plan", lambda *a, **k: dict(cfg))
    wf = fold_weight(g, w)
    for call in (lambda: fused_rmsnorm_linear(x, g, w, b), lambda: op.fused_rmsnorm_linear_folded(x, g, w, wf, b)):
        junk = torch.full((M * N * 4,), float("nan"), device="cuda", dtype=dtype)
        del junk
        y = call()
        torch.cuda.synchronize()
        assert y.shape == (M, N) and torch.isfinite(y).all()
        assert rel_err(y, ref) <= 1e-2, (cfg, M)
    yg = _folded_graph_replay(x, g, w, wf, b)
    assert torch.isfinite(yg).all() and rel_err(yg, ref) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("D", [136, 4104])
@pytest.mark.parametrize("M", [3, 16])
@pytest.mark.parametrize("ctas", [0, 2, 112])
def test_gpu_sm90_self_rstd_multi_tile(M, D, ctas, monkeypatch):
    """Self-rstd swap-AB configs with several W tiles per CTA (301 64-row tiles, the last partial, on at
    most 132 CTAs, or on the "ctas" cap: 2 CTAs run ~150 tiles each): the TMA producer's waits on the aux
    warp's reads span the first two tiles of a CTA, also when a tile has fewer k-tiles than the ring has
    stages (D = 136: 2 k-tiles)."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    _sm90_ext_or_skip()
    N = 64 * 300 + 8
    x, g, w, b = _gpu_case(M, D, N, torch.bfloat16, bias=True, seed=M + D)
    x = (x.float() * torch.logspace(-1, 1, M, device="cuda")[:, None]).to(torch.bfloat16)
    ref = _ref32(x, g, w, b, 1e-6).double()
    wf = fold_weight(g, w)
    for config in op.SM90_SELF_RSTD_TWIN:
        assert M <= op.SM90_SELF_RSTD_TOKENS[config]
        cfg = {"path": "gemm", "config": config, "pdl": True, "ctas": ctas}
        monkeypatch.setattr(op, "plan", lambda *a, c=cfg, **k: dict(c))
        for _ in range(3):  # repeated launches: the mbarriers are initialized per launch
            y = op.fused_rmsnorm_linear_folded(x, g, w, wf, b)
            torch.cuda.synchronize()
            assert torch.isfinite(y).all() and rel_err(y, ref) <= 1e-2, (config, M, D)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_sm90_prefill_multi_tile_rows(dtype, monkeypatch):
    """The unswapped, data-parallel SM90 configs (0-5, 12-14) with several tiles per CTA (M = 4100: 33 row
    tiles, the last partial; persistent ping-pong CTAs alternate tiles between their two consumer warpgroups,
    the non-persistent configs 12-14 run several waves beside the rstd kernel's CTAs). Rows are
    scaled 2^-4..2^4 at random, so a row given another row's rstd is off by that ratio, and each output row
    is checked on its own; repeated launches and CUDA graph replays."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    _sm90_ext_or_skip()
    M, D, N = 4100, 264, 1032
    x, g, w, b = _gpu_case(M, D, N, dtype, bias=True, seed=7)
    gen = torch.Generator(device="cuda").manual_seed(8)
    scale = torch.exp2(torch.rand(M, device="cuda", generator=gen) * 8 - 4)
    x = (x.float() * scale[:, None]).to(dtype)
    ref = _ref32(x, g, w, b, 1e-6).double()
    wf = fold_weight(g, w)

    def row_err(y):
        return ((y.double() - ref).norm(dim=1) / ref.norm(dim=1)).max().item()

    calls = (lambda: fused_rmsnorm_linear(x, g, w, b), lambda: op.fused_rmsnorm_linear_folded(x, g, w, wf, b))
    plain = [c for c in range(op.SM90_NUM_CONFIGS) if c not in op.SM90_STREAM_K_CONFIGS + op.SM90_SWAP_CONFIGS]
    assert plain == [0, 1, 2, 3, 4, 5, 12, 13, 14]  # stream-K (6) has its own test below
    for config in plain:
        monkeypatch.setattr(op, "plan", lambda *a, c=config, **k: {"path": "gemm", "config": c, "pdl": True})
        for _ in range(2):
            for call in calls:
                y = call()
                torch.cuda.synchronize()
                assert torch.isfinite(y).all() and row_err(y) <= 2e-2, (config, row_err(y))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            yg = op.fused_rmsnorm_linear_folded(x, g, w, wf, b)
        graph.replay()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(yg).all() and row_err(yg) <= 2e-2, (config, "graph")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_sm90_streamed_rstd(dtype, monkeypatch):
    """The streamed rstd launch (configs 0-5, raster along N, several rounds of tiles): rstd on the SMs the
    capped GEMM grid leaves free, each epilogue waiting per row. Rows scaled 2^-4..2^4 at random and checked
    one by one (an epilogue that took a poisoned or stale rstd is off by far more than 2%); the module path
    really streams (rstd launch arguments recorded); repeated launches; and CUDA graph replays with new x
    copied in between, so a replay that read the previous replay's rstd fails."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    m = _sm90_ext_or_skip()
    sms = op.num_sms(torch.device("cuda"))
    M, D, N = 4100, 264, 3080
    x, g, w, b = _gpu_case(M, D, N, dtype, bias=True, seed=9)
    gen = torch.Generator(device="cuda").manual_seed(10)

    def scaled(t):
        return (t.float() * torch.exp2(torch.rand(M, device="cuda", generator=gen) * 8 - 4)[:, None]).to(dtype)

    x = scaled(x)
    wf = fold_weight(g, w)

    def row_err(y, xx):
        ref = _ref32(xx, g, w, b, 1e-6).double()
        return ((y.double() - ref).norm(dim=1) / ref.norm(dim=1)).max().item()

    seen = []
    real = m.rstd
    monkeypatch.setattr(m, "rstd", lambda *a: (seen.append(a[8:]), real(*a))[1])
    for config in range(6):
        want = op.rstd_streamed(config, M, N, sms, 2)
        assert want[0] > 0, (config, want)
        monkeypatch.setattr(
            op, "plan", lambda *a, c=config, **k: {"path": "gemm", "config": c, "pdl": True, "raster": 2}
        )
        seen.clear()
        for _ in range(3):
            y = op.fused_rmsnorm_linear_folded(x, g, w, wf, b)
            torch.cuda.synchronize()
            assert torch.isfinite(y).all() and row_err(y, x) <= 2e-2, (config, row_err(y, x))
        assert seen == [(want[0], want[2])] * 3, (config, seen)
        xg = x.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            yg = op.fused_rmsnorm_linear_folded(xg, g, w, wf, b)
        for _ in range(2):
            xg.copy_(scaled(_gpu_case(M, D, 8, dtype, seed=len(seen))[0]))
            seen.append(None)
            yg.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.isfinite(yg).all() and row_err(yg, xg) <= 2e-2, (config, "graph")
    s = torch.cuda.current_stream().cuda_stream
    rstd = torch.empty(M, device="cuda")
    with pytest.raises(RuntimeError, match="unsupported arguments"):  # stream-K takes no streamed rstd
        m.gemm_sm90(1, 6, x.data_ptr(), D, wf.data_ptr(), D, rstd.data_ptr(), 0, y.data_ptr(), N, M, N, D, True, s,
                    streamed_rstd=True)  # fmt: skip
    with pytest.raises(RuntimeError, match="unsupported arguments"):  # ctas not a multiple of the cluster
        m.rstd(1, x.data_ptr(), D, rstd.data_ptr(), M, D, 1e-6, s, 3, 2)


@pytest.mark.gpu
def test_gpu_sm90_streamed_rstd_waits_for_late_rows():
    """The epilogue's per-row wait itself: the GEMM is launched with streamed_rstd on an rstd buffer that is all
    poison (-1.0f), and the real values arrive from another stream only after ~25 ms. The GEMM must still be
    running a few ms in (it waits) and then give the right result (a read without the wait scales rows by -1)."""
    import time

    from fused_rmsnorm.ops import rmsnorm_linear as op

    m = _sm90_ext_or_skip()
    sms = op.num_sms(torch.device("cuda"))
    M, D, N = 2048, 264, 4096  # config 1, raster N: 16 x 32 tiles, several rounds on sms - 4 CTAs
    x, g, w, _ = _gpu_case(M, D, N, torch.bfloat16, seed=12)
    wf = fold_weight(g, w)
    real = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
    rstd = torch.full((M,), -1.0, device="cuda")
    y = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        rstd.copy_(real)
    s = torch.cuda.current_stream()
    m.gemm_sm90(1, 1, x.data_ptr(), D, wf.data_ptr(), D, rstd.data_ptr(), 0, y.data_ptr(), N, M, N, D, False,
                s.cuda_stream, raster=2, max_ctas=sms - 4, streamed_rstd=True)  # fmt: skip
    done = torch.cuda.Event()
    done.record(s)
    time.sleep(0.005)
    assert not done.query(), "the GEMM finished before its rstd rows were written"
    torch.cuda.synchronize()
    assert torch.isfinite(y).all() and rel_err(y, _ref32(x, g, w, None, 1e-6).double()) <= 1e-2


@pytest.mark.gpu
def test_gpu_sm90_stream_k_workspace_and_graph(monkeypatch):
    """Stream-K needs a workspace: the binding refuses a launch without one, the data-parallel configs
    need none, and the per-call torch workspace works under CUDA-graph capture (zeroed each replay)."""
    from fused_rmsnorm.ops import rmsnorm_linear as op

    m = _sm90_ext_or_skip()
    assert m.num_sm90_configs() == op.SM90_NUM_CONFIGS
    assert tuple(m.sm90_stream_k_configs()) == op.SM90_STREAM_K_CONFIGS
    M, D, N = 128, 8192, 1024  # 8 tiles of 128x128 on 132 SMs: the K loop is split across CTAs
    for c in range(op.SM90_NUM_CONFIGS):
        need = m.gemm_sm90_workspace(1, c, M, N, D)
        assert (need > 0) == (c in op.SM90_STREAM_K_CONFIGS), (c, need)
    x, g, w, _ = _gpu_case(M, D, N, torch.bfloat16, seed=7)
    rstd = torch.ones(M, device="cuda")
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.current_stream().cuda_stream
    with pytest.raises(RuntimeError, match="workspace"):
        m.gemm_sm90(1, 6, x.data_ptr(), D, w.data_ptr(), D, rstd.data_ptr(), 0, y.data_ptr(), N, M, N, D, True, s)
    with pytest.raises(RuntimeError, match="unsupported arguments"):
        m.gemm_sm90(1, 1, x.data_ptr(), D, w.data_ptr(), D, rstd.data_ptr(), 0, y.data_ptr(), N, M, N, D, True, s,
                    splits=2)  # fmt: skip
    with pytest.raises(RuntimeError, match="unsupported arguments"):
        m.gemm_sm90(1, 99, x.data_ptr(), D, w.data_ptr(), D, rstd.data_ptr(), 0, y.data_ptr(), N, M, N, D, True, s)
    cfg = {"path": "gemm", "config": op.SM90_STREAM_K_CONFIGS[0], "pdl": True}
    monkeypatch.setattr(op, "plan", lambda *a, **k: dict(cfg))
    ref = _ref32(x, g, w, None, 1e-6).double()
    fused_rmsnorm_linear(x, g, w)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = fused_rmsnorm_linear(x, g, w)
    for _ in range(3):  # turnstile flags must be re-zeroed on every replay
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(yg).all() and rel_err(yg, ref) <= 1e-2
