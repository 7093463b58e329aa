// pybind11 module `_C`: raw device pointers (as Python ints), sizes, element strides, dtype codes
// and the CUDA stream handle (int). Not built against libtorch, so one binary serves every torch
// version; the Python wrapper does the checks and allocates with torch.
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "frms.h"

#ifndef FRMS_HAVE_SM80
#define FRMS_HAVE_SM80 0
#endif
#ifndef FRMS_HAVE_SM90
#define FRMS_HAVE_SM90 0
#endif
#ifndef FRMS_STREAM_WGMMA
#define FRMS_STREAM_WGMMA 0  // the decode_stream unit has its sm_90a (wgmma) kernel
#endif
#ifndef FRMS_HAVE_MMA
#define FRMS_HAVE_MMA 0
#endif
#ifndef FRMS_ARCHS
#define FRMS_ARCHS ""
#endif
#ifndef FRMS_SOURCE_HASH
#define FRMS_SOURCE_HASH ""  // _build.source_hash() of the sources this binary came from
#endif

namespace py = pybind11;

namespace {
inline const void* cptr(std::uintptr_t p) { return reinterpret_cast<const void*>(p); }
inline void* mptr(std::uintptr_t p) { return reinterpret_cast<void*>(p); }

void check(int status, const char* what) {
  if (status == 0) return;
  std::string msg = std::string("fused_rmsnorm ") + what + ": ";
  if (status == FRMS_ERR_BAD_ARG)
    msg += "unsupported arguments (sizes must be multiples of 8 elements and rows 16-byte aligned; SM90 GEMM: "
           "config 0.." + std::to_string(FRMS_SM90_NUM_CONFIGS - 1) +
           ", raster 0..2, swizzle 0|1|2|4|8, splits >= 1 and > 1 only for the stream-K config)";
  else if (status == FRMS_ERR_CUTLASS)
    msg += "CUTLASS failed to initialise or launch the GEMM";
  else if (status == FRMS_ERR_NOT_BUILT)
    msg += "this kernel was not compiled into the extension";
  else if (status == FRMS_ERR_VARIANT)
    msg += "this (steps, ldpolicy, wload) variant is compiled only for M <= 16 (a --light build: bf16, M <= 8); "
           "wload > 0 needs steps 4 and ldpolicy 0";
  else if (status == FRMS_ERR_WORKSPACE)
    msg += "this GEMM config needs a workspace of gemm_sm90_workspace() bytes (stream-K); none or too small passed";
  else if (status == FRMS_ERR_UNSUPPORTED)
    msg += "a K split across CTAs (ksplit > 1) needs thread-block clusters, wload 2 / 3 cp.async.bulk: an sm_90 "
           "device and a 9.0 build";
  else
    msg += std::string("CUDA error ") + cudaGetErrorName(cudaError_t(status)) + ": " +
           cudaGetErrorString(cudaError_t(status));
  throw std::runtime_error(msg);
}

#if FRMS_HAVE_SM90
using Sm90Entry = int (*)(const FrmsSm90Args*, std::size_t*);
int sm90_bad_config(const FrmsSm90Args*, std::size_t*) { return FRMS_ERR_BAD_ARG; }
Sm90Entry sm90_entry(int config) {
  static const Sm90Entry table[FRMS_SM90_NUM_CONFIGS] = {
      frms_gemm_sm90_cfg0, frms_gemm_sm90_cfg1, frms_gemm_sm90_cfg2, frms_gemm_sm90_cfg3,
      frms_gemm_sm90_cfg4, frms_gemm_sm90_cfg5, frms_gemm_sm90_cfg6, frms_gemm_sm90_cfg7,
      frms_gemm_sm90_cfg8, frms_gemm_sm90_cfg9, frms_gemm_sm90_cfg10, frms_gemm_sm90_cfg11,
      frms_gemm_sm90_cfg12, frms_gemm_sm90_cfg13, frms_gemm_sm90_cfg14};
  return config >= 0 && config < FRMS_SM90_NUM_CONFIGS ? table[config] : sm90_bad_config;
}
#endif

std::vector<std::string> compiled_archs() {
  std::vector<std::string> out;
  std::string s = FRMS_ARCHS, cur;
  for (char c : s) {
    if (c == ';') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}
}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fused_rmsnorm CUDA kernels (raw-pointer interface, no libtorch)";

  m.def(
      "decode",
      [](int dtype, std::uintptr_t x, int64_t ldx, std::uintptr_t g, std::uintptr_t w, int64_t ldw,
         std::uintptr_t bias, std::uintptr_t y, int64_t ldy, int64_t M, int64_t N, int64_t K, float eps, int ksplit,
         int grid_blocks, std::uintptr_t stream) {
        check(frms_decode(dtype, cptr(x), ldx, cptr(g), cptr(w), ldw, bias ? cptr(bias) : nullptr, mptr(y), ldy, M,
                          N, K, eps, ksplit, grid_blocks, mptr(stream)),
              "decode");
      },
      py::arg("dtype"), py::arg("x"), py::arg("ldx"), py::arg("g"), py::arg("w"), py::arg("ldw"), py::arg("bias"),
      py::arg("y"), py::arg("ldy"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("eps"), py::arg("ksplit"),
      py::arg("grid_blocks"), py::arg("stream"));

  m.def(
      "decode_mma",
      [](int dtype, std::uintptr_t x, int64_t ldx, std::uintptr_t g, std::uintptr_t w, int64_t ldw,
         std::uintptr_t bias, std::uintptr_t y, int64_t ldy, int64_t M, int64_t N, int64_t K, float eps, int wn,
         int ksplit, std::uintptr_t stream, int steps, int ldpolicy, int wload) {
#if FRMS_HAVE_MMA
        check(frms_decode_mma(dtype, cptr(x), ldx, g ? cptr(g) : nullptr, cptr(w), ldw, bias ? cptr(bias) : nullptr,
                              mptr(y), ldy, M, N, K, eps, wn, ksplit, steps, ldpolicy, wload, mptr(stream)),
              "decode_mma");
#else
        check(FRMS_ERR_NOT_BUILT, "decode_mma");
#endif
      },
      "Tensor-core decode (sm_80+). g = 0: w is the folded W' = W * g. wn / ksplit: 0 = auto. steps: W loads in "
      "flight per lane (0 = 4, or 8); ldpolicy: 0 = evict_first W loads, 1 = plain (non-defaults: M <= 16 only). "
      "wload: 0 = default, 1 = x prefetched in the W ring, 2 / 3 = 1 + W staged through smem by cp.async.bulk "
      "(sm_90; 256 / 512-B row pieces); wload > 0 needs M <= 16, steps 0|4 and ldpolicy 0.",
      py::arg("dtype"), py::arg("x"), py::arg("ldx"), py::arg("g"), py::arg("w"), py::arg("ldw"), py::arg("bias"),
      py::arg("y"), py::arg("ldy"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("eps"), py::arg("wn"),
      py::arg("ksplit"), py::arg("stream"), py::arg("steps") = 0, py::arg("ldpolicy") = 0, py::arg("wload") = 0);

  m.def(
      "decode_stream",
      [](int dtype, std::uintptr_t x, int64_t ldx, std::uintptr_t w, int64_t ldw, std::uintptr_t bias,
         std::uintptr_t y, int64_t ldy, int64_t M, int64_t N, int64_t K, float eps, int bn, int stages,
         std::uintptr_t stream, int wgmma, int fence, int rows, std::uintptr_t rstd, int split) {
#if FRMS_HAVE_MMA
        check(frms_decode_stream(dtype, cptr(x), ldx, cptr(w), ldw, bias ? cptr(bias) : nullptr, mptr(y), ldy, M, N,
                                 K, eps, bn, stages, wgmma, fence, rows, mptr(stream),
                                 reinterpret_cast<const float*>(rstd), split),
              "decode_stream");
#else
        check(FRMS_ERR_NOT_BUILT, "decode_stream");
#endif
      },
      "Decode on the folded W' = W * g (sm_80+, M <= 16): one CTA per `rows` W' rows over all of K, a cp.async ring "
      "of `stages` 128-wide k-blocks of W' and x, rstd from the same x tiles. wgmma 0: mma.sync, (bn, stages) "
      "(128, 4) | (128, 3) | (64, 4) | (64, 6), rows = bn; wgmma 1 / 2 warpgroups (has_stream_wgmma() and a 9.0 "
      "GPU): wgmma, (bn, stages, rows) (128, 4 | 5, 128) | (64, 4 | 5 | 6, 64) | (64, 8, 40) for 1, "
      "(128, 5 | 6, 128) | (128, 5, 112) for 2; rows 0 = bn; fence 1 (wgmma only): fence.proxy.async "
      "before each stage's wgmma. K, ldx, ldw multiples of 8; x and w 16-byte aligned. rstd 0: from x itself (w = "
      "W'); else the caller's fp32 rstd[M] (a functional call: x = x * g from rstd_scale, w = W). split 1 | 2 | 4 | 8 "
      "(wgmma only): K split over a thread-block cluster of that many CTAs per `rows` rows.",
      py::arg("dtype"), py::arg("x"), py::arg("ldx"), py::arg("w"), py::arg("ldw"), py::arg("bias"), py::arg("y"),
      py::arg("ldy"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("eps"), py::arg("bn") = 128,
      py::arg("stages") = 4, py::arg("stream") = 0, py::arg("wgmma") = 0, py::arg("fence") = 0, py::arg("rows") = 0,
      py::arg("rstd") = 0, py::arg("split") = 1);

  m.def(
      "rstd",
      [](int dtype, std::uintptr_t x, int64_t ldx, std::uintptr_t out, int64_t M, int64_t K, float eps,
         std::uintptr_t stream, int ctas, int streamed) {
        check(frms_rstd(dtype, cptr(x), ldx, reinterpret_cast<float*>(out), M, K, eps, ctas, streamed, mptr(stream)),
              "rstd");
      },
      "rstd[m] = rsqrt(mean(x[m]^2) + eps) in fp32. ctas: 0 = 8 rows per CTA; > 0 = at most ctas 32-warp CTAs "
      "striding over the rows (for the SMs a programmatic-dependent SM90 GEMM leaves idle). streamed: 1 | 2 (the "
      "cluster size, ctas a multiple of it) = poison the rows, trigger the dependent GEMM, then fill them, for a "
      "gemm_sm90 launched with streamed_rstd.",
      py::arg("dtype"), py::arg("x"), py::arg("ldx"), py::arg("rstd"), py::arg("M"), py::arg("K"), py::arg("eps"),
      py::arg("stream"), py::arg("ctas") = 0, py::arg("streamed") = 0);

  m.def(
      "rstd_scale",
      [](int dtype, std::uintptr_t x, int64_t ldx, std::uintptr_t g, std::uintptr_t xg, int64_t ldxg,
         std::uintptr_t out, int64_t M, int64_t K, float eps, std::uintptr_t stream) {
        check(frms_rstd_scale(dtype, cptr(x), ldx, cptr(g), mptr(xg), ldxg, reinterpret_cast<float*>(out), M, K, eps,
                              mptr(stream)),
              "rstd_scale");
      },
      "rstd as rstd() (same bits) and xg = x * g[None, :] rounded once to the dtype, in one pass over x: a "
      "functional call's GEMM operand. No PDL trigger (launch the GEMM after it without PDL).",
      py::arg("dtype"), py::arg("x"), py::arg("ldx"), py::arg("g"), py::arg("xg"), py::arg("ldxg"), py::arg("rstd"),
      py::arg("M"), py::arg("K"), py::arg("eps"), py::arg("stream"));

  m.def(
      "gemm_sm90",
      [](int dtype, int config, std::uintptr_t a, int64_t lda, std::uintptr_t b, int64_t ldb, std::uintptr_t rstd,
         std::uintptr_t bias, std::uintptr_t d, int64_t ldd, int64_t M, int64_t N, int64_t K, bool pdl,
         std::uintptr_t stream, int raster, int swizzle, int splits, std::uintptr_t workspace,
         std::size_t workspace_bytes, float eps, int pdl_early, int max_ctas, bool streamed_rstd) {
#if FRMS_HAVE_SM90
        FrmsSm90Args p{dtype, cptr(a), lda, cptr(b), ldb, reinterpret_cast<const float*>(rstd),
                       bias ? cptr(bias) : nullptr, mptr(d), ldd, M, N, K, pdl ? 1 : 0, raster, swizzle, splits,
                       workspace ? mptr(workspace) : nullptr, workspace_bytes, mptr(stream), eps, pdl_early,
                       max_ctas, streamed_rstd ? 1 : 0};
        check(sm90_entry(config)(&p, nullptr), "gemm_sm90");
#else
        check(FRMS_ERR_NOT_BUILT, "gemm_sm90");
#endif
      },
      "SM90 CUTLASS GEMM with the rstd row scale. config: tile config 0..num_sm90_configs()-1; raster: tile "
      "scheduler raster order 0 heuristic / 1 along M / 2 along N; swizzle: max swizzle 0 (=1) | 1 | 2 | 4 | 8; "
      "splits: stream-K config only, > 1 = fixed split-K; workspace: device buffer of gemm_sm90_workspace() bytes "
      "(stream-K only; the other configs need none); eps: the self-rstd configs (sm90_self_rstd_configs()) compute "
      "rstd = rsqrt(mean(a^2) + eps) from a = x themselves (rstd unused, b must be W' = W * g); pdl_early: for "
      "those with pdl, how many stages of b they request before waiting for the previous kernel (b must not be "
      "written by any kernel still in flight; 0 = none); max_ctas: > 0 = the persistent grid on at most that many "
      "SMs; streamed_rstd: the epilogue waits per row for rstd (written by rstd(streamed=...) just before) instead "
      "of for the whole rstd grid (persistent configs 0-5 only).",
      py::arg("dtype"), py::arg("config"), py::arg("a"), py::arg("lda"), py::arg("b"), py::arg("ldb"),
      py::arg("rstd"), py::arg("bias"), py::arg("d"), py::arg("ldd"), py::arg("M"), py::arg("N"), py::arg("K"),
      py::arg("pdl"), py::arg("stream"), py::arg("raster") = 0, py::arg("swizzle") = 0, py::arg("splits") = 1,
      py::arg("workspace") = 0, py::arg("workspace_bytes") = 0, py::arg("eps") = 0.f, py::arg("pdl_early") = 0,
      py::arg("max_ctas") = 0, py::arg("streamed_rstd") = false);

  m.def(
      "gemm_sm90_workspace",
      [](int dtype, int config, int64_t M, int64_t N, int64_t K, int raster, int swizzle, int splits) {
        std::size_t bytes = 0;
#if FRMS_HAVE_SM90
        FrmsSm90Args p{};
        p.dtype = dtype;
        p.M = M;
        p.N = N;
        p.K = K;
        p.lda = p.ldb = K;
        p.ldd = N;
        p.raster = raster;
        p.swizzle = swizzle;
        p.splits = splits;
        check(sm90_entry(config)(&p, &bytes), "gemm_sm90_workspace");
#else
        check(FRMS_ERR_NOT_BUILT, "gemm_sm90_workspace");
#endif
        return bytes;
      },
      "Workspace bytes gemm_sm90 needs for this (dtype, config, M, N, K, raster, swizzle, splits); 0 for every "
      "data-parallel config. Depends on the current device's SM count (cached at the first call).",
      py::arg("dtype"), py::arg("config"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("raster") = 0,
      py::arg("swizzle") = 0, py::arg("splits") = 1);

  m.def(
      "gemm_sm80",
      [](int dtype, int config, std::uintptr_t a, int64_t lda, std::uintptr_t b, int64_t ldb, std::uintptr_t rstd,
         std::uintptr_t bias, std::uintptr_t d, int64_t ldd, int64_t M, int64_t N, int64_t K, std::uintptr_t stream) {
#if FRMS_HAVE_SM80
        check(frms_gemm_sm80(dtype, config, cptr(a), lda, cptr(b), ldb, reinterpret_cast<const float*>(rstd),
                             bias ? cptr(bias) : nullptr, mptr(d), ldd, M, N, K, mptr(stream)),
              "gemm_sm80");
#else
        check(FRMS_ERR_NOT_BUILT, "gemm_sm80");
#endif
      },
      py::arg("dtype"), py::arg("config"), py::arg("a"), py::arg("lda"), py::arg("b"), py::arg("ldb"),
      py::arg("rstd"), py::arg("bias"), py::arg("d"), py::arg("ldd"), py::arg("M"), py::arg("N"), py::arg("K"),
      py::arg("stream"));

  m.def("compiled_archs", &compiled_archs, "arch list this binary was compiled for, e.g. ['8.0', '9.0a']");
  m.def("has_sm90_gemm", [] { return bool(FRMS_HAVE_SM90); });
  m.def("num_sm90_configs", [] { return int(FRMS_SM90_NUM_CONFIGS); }, "tile configs of the SM90 GEMM (0..n-1)");
  m.def("sm90_stream_k_configs", [] { return std::vector<int>{FRMS_SM90_STREAM_K_CONFIG}; }, "SM90 configs that take splits / a workspace");
  m.def(
      "sm90_self_rstd_configs",
      [] {
        std::vector<int> v;
        for (int c = 0; c < FRMS_SM90_NUM_CONFIGS; ++c)
          if (FRMS_SM90_IS_SELF_RSTD(c)) v.push_back(c);
        return v;
      },
      "SM90 configs that compute rstd from x themselves (no rstd kernel; need eps > 0, no PDL)");
  m.def("has_sm80_gemm", [] { return bool(FRMS_HAVE_SM80); });
  m.def("has_decode_mma", [] { return bool(FRMS_HAVE_MMA); });
  m.def("has_stream_wgmma", [] { return bool(FRMS_STREAM_WGMMA); });
#ifdef FRMS_MMA_LIGHT
  m.def("mma_variants_light", [] { return true; }, "decode_mma (steps, ldpolicy) variants built for bf16, M <= 8 only");
#else
  m.def("mma_variants_light", [] { return false; }, "decode_mma (steps, ldpolicy) variants built for bf16, M <= 8 only");
#endif
  m.def("cuda_version", [] { return int(CUDART_VERSION); }, "CUDA runtime version the module was built with");
  m.def("source_hash", [] { return std::string(FRMS_SOURCE_HASH); },
        "sha256 of the csrc/ + _build.py it was built from");
  m.attr("DTYPE_F16") = FRMS_DTYPE_F16;
  m.attr("DTYPE_BF16") = FRMS_DTYPE_BF16;
}
