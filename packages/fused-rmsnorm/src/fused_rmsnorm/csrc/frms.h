// Shared declarations between the CUDA translation units and the pybind11 binding.
// Every launcher is extern "C", takes raw device pointers, element strides and a stream, and
// returns a cudaError_t code as int (0 = success) so the binding can raise with a message.
#pragma once
#include <cstddef>
#include <cstdint>

// dtype codes used across the Python/C boundary (keep in sync with ops/rmsnorm_linear.py)
#define FRMS_DTYPE_F16 0
#define FRMS_DTYPE_BF16 1

// Status codes beyond cudaError_t range for argument problems caught in C++.
#define FRMS_ERR_BAD_ARG 100000
#define FRMS_ERR_CUTLASS 100001
#define FRMS_ERR_NOT_BUILT 100002
#define FRMS_ERR_UNSUPPORTED 100003  // e.g. a K split across CTAs without thread-block clusters
#define FRMS_ERR_VARIANT 100004      // a decode_mma (steps, ldpolicy) variant not compiled for this M
#define FRMS_ERR_WORKSPACE 100005    // an SM90 GEMM config needs a larger workspace than was passed

#define FRMS_SM90_NUM_CONFIGS 15     // tile configs of gemm_sm90.cu (FRMS_SM90_CFG = 0 .. 14)
#define FRMS_SM90_STREAM_K_CONFIG 6  // the one config on the stream-K scheduler (takes splits / a workspace)
// the configs that compute rstd from x themselves (rstd unused, eps used, never PDL; a must be x)
#define FRMS_SM90_IS_SELF_RSTD(c) ((c) == 11)

// Arguments of one SM90 GEMM launch: D = (A @ B^T) * rstd[:, None] (+ bias[None, :]).
struct FrmsSm90Args {
  int dtype;
  const void* a;  // (M, K), row stride lda
  int64_t lda;
  const void* b;  // (N, K), row stride ldb
  int64_t ldb;
  const float* rstd;
  const void* bias;  // nullptr: none
  void* d;           // (M, N), row stride ldd
  int64_t ldd;
  int64_t M, N, K;
  int pdl;      // launch as a programmatic dependent of the previous kernel (not with a stream-K workspace)
  int raster;   // tile scheduler raster order: 0 heuristic, 1 along M, 2 along N
  int swizzle;  // tile scheduler max swizzle size: 0 (= 1), 1, 2, 4, 8
  int splits;   // stream-K config only: > 1 = fixed split-K into this many pieces; 1 = stream-K heuristic
  void* workspace;
  size_t workspace_bytes;
  void* stream;
  float eps;  // self-rstd configs: rstd = rsqrt(mean(x^2) + eps) from a = x (rstd unused)
  int pdl_early;  // self-rstd configs as PDL secondaries: W' stages requested before the grid-dependency wait
  int max_ctas;   // > 0: the persistent grid on at most this many SMs (0: all)
  int streamed_rstd;  // epilogue spins on rstd[m] != FRMS_RSTD_POISON instead of waiting for the rstd grid
};

// rstd value bits meaning "not written yet" for the streamed protocol (-1.0f: a real rstd is never negative)
#define FRMS_RSTD_POISON 0xBF800000u

extern "C" {

// y[m, n] = rstd[m] * sum_k x[m, k] * g[k] * w[n, k] (+ bias[n]); rstd from x itself.
// Small-M path: W is streamed once per row chunk. Requires K % 8 == 0 and 16-byte aligned rows.
// ksplit: warps per W row (0 = auto); grid_blocks: grid cap (0 = one wave).
int frms_decode(int dtype, const void* x, int64_t ldx, const void* g, const void* w, int64_t ldw, const void* bias,
                void* y, int64_t ldy, int64_t M, int64_t N, int64_t K, float eps, int ksplit, int grid_blocks,
                void* stream);

// Same op on tensor cores (sm_80+, decode_mma.cu): W rows are the MMA's M, tokens its N.
// g == nullptr: w is already W' = W * diag(g). wn: warps along N per CTA (0 = auto; 1/2/4/8 -> 16..128
// rows per CTA); ksplit: CTAs of a thread-block cluster splitting K (0 = auto; > 1 needs sm_90).
// steps: W loads in flight per lane (0 = 4; 8 only for M <= 16); ldpolicy: W loads 0 = L1 no-allocate +
// L2 evict_first, 1 = plain read-only loads (only for M <= 16 unless steps == 4 and ldpolicy == 0).
// wload: 0 = default; 1 = x in the W ring (U steps ahead); 2 / 3 = 1 + W staged in smem by cp.async.bulk
// (256 / 512-B row pieces, 3 stages; sm_90 only). wload > 0: M <= 16, steps 4 and ldpolicy 0 only.
int frms_decode_mma(int dtype, const void* x, int64_t ldx, const void* g, const void* w, int64_t ldw,
                    const void* bias, void* y, int64_t ldy, int64_t M, int64_t N, int64_t K, float eps, int wn,
                    int ksplit, int steps, int ldpolicy, int wload, void* stream);

// Same op on the folded W' (g already in w), M <= 16, sm_80+ (decode_stream.cu): one CTA per bn rows of W'
// over all of K through a `stages`-deep cp.async ring. wgmma 0: mma.sync, (bn, stages) in {(128, 4), (128, 3),
// (64, 4), (64, 6)}; wgmma 1 / 2 (sm_90a build on a 9.0 device, else FRMS_ERR_NOT_BUILT): wgmma from shared
// memory by that many warpgroups, (bn, stages, rows) in {(128, 4 | 5, 128), (64, 4 | 5 | 6, 64), (64, 8, 40)}
// for 1 and {(128, 5 | 6, 128), (128, 5, 112)} for 2, rows = the W' rows per CTA
// (0 = bn; the mma.sync kernel takes bn only); fence 1 (wgmma only): fence.proxy.async between each stage's
// cp.async writes and the wgmma reading them. K, ldx, ldw multiples of 8; x and w 16-byte aligned.
// rstd: nullptr = from x itself (w = W'); else the caller's rstd[M] (x = x * g from frms_rstd_scale, w = W).
// split 1 | 2 | 4 | 8 (wgmma only): K split over a cluster of that many CTAs per `rows` rows, reduced on chip.
int frms_decode_stream(int dtype, const void* x, int64_t ldx, const void* w, int64_t ldw, const void* bias, void* y,
                       int64_t ldy, int64_t M, int64_t N, int64_t K, float eps, int bn, int stages, int wgmma,
                       int fence, int rows, void* stream, const float* rstd, int split);

// rstd[m] = 1 / sqrt(mean_k x[m, k]^2 + eps) in fp32; triggers Hopper PDL early.
// ctas > 0: at most that many 32-warp CTAs striding over the rows (the SMs an SM90 PDL GEMM leaves idle).
// streamed (1 or 2 = cluster size; ctas a multiple of it): poison the rows, trigger, then fill them, for an
// SM90 GEMM launched with streamed_rstd (its epilogue spins per row instead of waiting for this grid).
int frms_rstd(int dtype, const void* x, int64_t ldx, float* rstd, int64_t M, int64_t K, float eps, int ctas,
              int streamed, void* stream);

// rstd as frms_rstd (same bits) and xg[m, k] = x[m, k] * g[k] (rounded once), one pass over x, for a functional
// call's GEMM operand; no PDL trigger (the GEMM reads xg in its mainloop). K, ldx, ldxg multiples of 8; 16-byte aligned.
int frms_rstd_scale(int dtype, const void* x, int64_t ldx, const void* g, void* xg, int64_t ldxg, float* rstd,
                    int64_t M, int64_t K, float eps, void* stream);

// D = (A @ B^T) * rstd[:, None] (+ bias[None, :]); A (M, K) row stride lda, B (N, K) row stride ldb.
int frms_gemm_sm80(int dtype, int config, const void* a, int64_t lda, const void* b, int64_t ldb, const float* rstd,
                   const void* bias, void* d, int64_t ldd, int64_t M, int64_t N, int64_t K, void* stream);

// Per-config entry points for the SM90 GEMM: each tile config lives in its own translation unit
// (gemm_sm90.cu compiled once per FRMS_SM90_CFG) so the build can compile them in parallel.
// workspace_size_out != nullptr: only store the workspace bytes this call would need (nothing is
// launched; pointers unused). Otherwise launch; a config that needs a workspace (stream-K) returns
// FRMS_ERR_WORKSPACE if workspace / workspace_bytes cannot hold it.
int frms_gemm_sm90_cfg0(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg1(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg2(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg3(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg4(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg5(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg6(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg7(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg8(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg9(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg10(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg11(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg12(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg13(const FrmsSm90Args* p, size_t* workspace_size_out);
int frms_gemm_sm90_cfg14(const FrmsSm90Args* p, size_t* workspace_size_out);
}
