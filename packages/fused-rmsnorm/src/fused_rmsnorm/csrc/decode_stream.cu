// Decode (<= 16 tokens) fused RMSNorm + Linear on the modules' folded weight, sm_80+:
//   y[m, n] = rstd[m] * sum_k x[m, k] * W'[n, k]  (+ bias[n]),  rstd[m] = rsqrt(mean_k x[m, k]^2 + eps)
//
// One CTA of 4 warps per BN rows of W' (all of K, no split, so no partial sums leave the CTA), a STAGES-deep
// cp.async ring of 128-wide k-blocks of W' and of x in shared memory, fragments by ldmatrix, mma.sync m16n8k16
// with W' rows as the MMA's M and the 16 tokens as its N, and the sum of x^2 per token from the same x tiles.
// Why this shape: at B16 D4096 N14336 a Triton prototype of it (scripts/probe_gemv_stream.py, H200, session 28)
// took 30.15 us against F.linear's 30.60 and the CUTLASS swap-AB config 11's 31.48; a plain read of the same
// weight with one such program per 64 rows split twice along K ran at 28.75 us
// (scripts/probe_read_layout.py). The rows of a stage are 256 B; the 16-byte chunks of a row are XOR-swizzled
// by the row index so ldmatrix's 8-row phases hit 8 different bank groups.
#include "frms.h"
#include "mma.cuh"
#include "vec.cuh"

#include <cuda_runtime.h>

namespace {
using frms::mma16816;

constexpr int kThreads = 128;  // 4 warps
constexpr int kTok = 16;       // tokens per CTA: two n8 tiles
constexpr int kBK = 128;       // k per stage: 256-byte rows, 16 chunks of 16 B
constexpr int kChunks = kBK / 8;

struct Params {
  const void* x;
  int64_t ldx;
  const void* w;
  int64_t ldw;
  const void* bias;
  void* y;
  int64_t ldy;
  int64_t M, N, K;
  float eps;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes 0 fills zeros (rows / tokens / k past the end)
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// byte offset of (row, 16-byte chunk) in a stage's [rows][256 B] tile
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return uint32_t(row) * (kBK * 2) + uint32_t((chunk ^ (row & 7)) * 16);
}

template <typename T, int BN, int STAGES>
__global__ void __launch_bounds__(kThreads) stream_kernel(Params p) {
  constexpr int kMT = BN / 64;                       // m16 tiles per warp (each warp owns BN / 4 rows)
  constexpr int kWBytes = BN * kBK * 2;              // W' part of a stage
  constexpr int kStageBytes = kWBytes + kTok * kBK * 2;
  static_assert(BN % 64 == 0 && (BN * kChunks) % kThreads == 0);
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float rstd_s[kTok];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t n0 = int64_t(blockIdx.x) * BN;
  const int64_t M = p.M, N = p.N, K = p.K;
  const int kt_count = int((K + kBK - 1) / kBK);
  const uint32_t s0 = smem_u32(smem);
  const T* __restrict__ w = static_cast<const T*>(p.w);
  const T* __restrict__ x = static_cast<const T*>(p.x);

  auto issue = [&](int kt) {
    const uint32_t st = s0 + uint32_t(kt % STAGES) * kStageBytes;
    const int64_t k0 = int64_t(kt) * kBK;
#pragma unroll
    for (int j = 0; j < BN * kChunks / kThreads; ++j) {  // consecutive threads: consecutive 16 B of a row
      const int i = tid + j * kThreads, row = i / kChunks, c = i % kChunks;
      const int64_t n = n0 + row, k = k0 + c * 8;
      const bool ok = n < N && k < K;
      cp_async16(st + swz(row, c), ok ? w + n * p.ldw + k : w, ok ? 16 : 0);
    }
#pragma unroll
    for (int j = 0; j < kTok * kChunks / kThreads; ++j) {
      const int i = tid + j * kThreads, t = i / kChunks, c = i % kChunks;
      const int64_t k = k0 + c * 8;
      const bool ok = t < M && k < K;
      cp_async16(st + kWBytes + swz(t, c), ok ? x + t * p.ldx + k : x, ok ? 16 : 0);
    }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < kt_count) issue(s);
    cp_async_commit();  // empty groups keep the wait count uniform
  }

  float acc[kMT][2][4] = {};
  float ss = 0.f;  // this thread's part of token tid / 8's sum of squares: chunks tid % 8 and tid % 8 + 8
  const int ss_tok = tid >> 3, ss_c = tid & 7;
  // ldmatrix x4: lane l gives the row address of matrix l / 8, row l % 8
  const int q = lane >> 3, r8 = lane & 7;
  const int a_row = warp * (BN / 4) + (q & 1) * 8 + r8, a_kc = q >> 1;  // A: (rows +0/+8) x (k +0/+8)
  const int b_tok = (q >> 1) * 8 + r8, b_kc = q & 1;                    // B: (tokens +0/+8) x (k +0/+8)

  for (int kt = 0; kt < kt_count; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free for the next issue
    if (kt + STAGES - 1 < kt_count) issue(kt + STAGES - 1);
    cp_async_commit();
    const uint32_t st = s0 + uint32_t(kt % STAGES) * kStageBytes;
    const uint32_t xs = st + kWBytes;
    {
      uint4 v0 = *reinterpret_cast<const uint4*>(smem + (xs - s0) + swz(ss_tok, ss_c));
      uint4 v1 = *reinterpret_cast<const uint4*>(smem + (xs - s0) + swz(ss_tok, ss_c + 8));
      float f0[8], f1[8];
      frms::unpack8<T>(v0, f0);
      frms::unpack8<T>(v1, f1);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss = fmaf(f0[e], f0[e], fmaf(f1[e], f1[e], ss));
    }
#pragma unroll
    for (int ks = 0; ks < kChunks / 2; ++ks) {  // k16 steps: chunks 2 ks, 2 ks + 1
      uint32_t b[4];
      ldmatrix_x4(b, xs + swz(b_tok, 2 * ks + b_kc));  // {nt0 k0-7, nt0 k8-15, nt1 k0-7, nt1 k8-15}
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        uint32_t a[4];
        ldmatrix_x4(a, st + swz(a_row + mt * 16, 2 * ks + a_kc));  // {rows 0-7 k0, 8-15 k0, 0-7 k8, 8-15 k8}
        mma16816<T>(acc[mt][0], a[0], a[1], a[2], a[3], b[0], b[1]);
        mma16816<T>(acc[mt][1], a[0], a[1], a[2], a[3], b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();

  ss += __shfl_xor_sync(0xffffffffu, ss, 1);
  ss += __shfl_xor_sync(0xffffffffu, ss, 2);
  ss += __shfl_xor_sync(0xffffffffu, ss, 4);
  if (ss_c == 0) rstd_s[ss_tok] = rsqrtf(ss / float(K) + p.eps);
  __syncthreads();

  // C fragment: c0 / c1 = (row g, tokens 2t, 2t + 1), c2 / c3 = (row g + 8, same tokens)
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  const T* bias = static_cast<const T*>(p.bias);
  T* y = static_cast<T*>(p.y);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + warp * (BN / 4) + mt * 16 + g + h * 8;
      if (n >= N) continue;
      const float bn = bias ? frms::to_float<T>(bias[n]) : 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = nt * 8 + t2 + e;
          if (tok < M) y[tok * p.ldy + n] = frms::from_float<T>(acc[mt][nt][h * 2 + e] * rstd_s[tok] + bn);
        }
      }
    }
  }
}

template <typename T, int BN, int STAGES>
int launch(const Params& p, cudaStream_t stream) {
  constexpr size_t smem = size_t(STAGES) * (BN + kTok) * kBK * 2;
  static bool attr_set[frms::kMaxDevices] = {};
  const int dev = frms::current_device();
  if (!attr_set[dev]) {  // > 48 KB of dynamic shared memory needs the opt-in (per device)
    cudaError_t e = cudaFuncSetAttribute(stream_kernel<T, BN, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(smem));
    if (e != cudaSuccess) return int(e);
    attr_set[dev] = true;
  }
  const dim3 grid(unsigned((p.N + BN - 1) / BN));
  stream_kernel<T, BN, STAGES><<<grid, kThreads, smem, stream>>>(p);
  return int(cudaGetLastError());
}

template <typename T>
int dispatch(const Params& p, int bn, int stages, cudaStream_t stream) {
  if (bn == 128 && stages == 4) return launch<T, 128, 4>(p, stream);
  if (bn == 128 && stages == 3) return launch<T, 128, 3>(p, stream);
  if (bn == 64 && stages == 4) return launch<T, 64, 4>(p, stream);
  if (bn == 64 && stages == 6) return launch<T, 64, 6>(p, stream);
  return FRMS_ERR_BAD_ARG;
}
}  // namespace

extern "C" int frms_decode_stream(int dtype, const void* x, int64_t ldx, const void* w, int64_t ldw, const void* bias,
                                  void* y, int64_t ldy, int64_t M, int64_t N, int64_t K, float eps, int bn, int stages,
                                  void* stream) {
  // 16-byte cp.async chunks: K, the row strides and the bases must all be 16-byte granular
  if (M < 1 || M > kTok || N < 1 || K < 8 || K % 8 != 0 || ldx % 8 != 0 || ldw % 8 != 0 || !(eps > 0.f))
    return FRMS_ERR_BAD_ARG;
  if (!frms::aligned16(x) || !frms::aligned16(w) || ldx < K || ldw < K || ldy < N) return FRMS_ERR_BAD_ARG;
  const Params p{x, ldx, w, ldw, bias, y, ldy, M, N, K, eps};
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == FRMS_DTYPE_BF16) return dispatch<__nv_bfloat16>(p, bn, stages, s);
  if (dtype == FRMS_DTYPE_F16) return dispatch<__half>(p, bn, stages, s);
  return FRMS_ERR_BAD_ARG;
}
