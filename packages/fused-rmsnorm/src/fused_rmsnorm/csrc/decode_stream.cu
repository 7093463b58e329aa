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
//
// sm_90a twin (stream_wg_kernel, "wgmma" in the tuning entry, since session 30): the same ring and loads, but the
// 4 warps issue wgmma.m64n16k16 as one warpgroup straight from shared memory (no ldmatrix, no per-warp MMA
// fragments), one k-block's group kept in flight while the next one's loads are issued. That is what the Triton
// prototype above compiles to (its PTX: cp.async.cg ring, 16 x wgmma m64n16k16 per 128-wide k-block, 128-byte
// swizzled tiles). Tiles there are stored as the two 64-wide k halves of a block, each [rows][128 B] with the
// 16-byte chunks XOR-swizzled by row % 8: wgmma's canonical K-major SWIZZLE_128B layout.
//
// Both kernels keep their per-stage instruction count minimal: one warp per scheduler hides no latency, and a
// runtime k-block rotation (to spread the CTAs' reads of x over L2) or a second, evict_first copy of the load loop
// made them 1.4-2.4x slower (session 30, standalone A/B on the H200: B16 N14336 31.9 -> 52.2 us), so neither is kept.
// Likewise a runtime W' row count per CTA (session 31: 35-70% slower), which is why ROWS is a template parameter.
#include "frms.h"
#include "mma.cuh"
#include "vec.cuh"

#include <cuda_runtime.h>

#include <type_traits>

#ifndef FRMS_STREAM_WGMMA
#define FRMS_STREAM_WGMMA 0  // set by the build when this unit has an sm_90a cubin
#endif

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
  int fence;  // wgmma kernel: fence.proxy.async between each stage's cp.async writes and the wgmma reading them
  // nullptr: rstd from the x tiles (x is x itself, w is W'). Else rstd[M] from the caller (a functional call: x is
  // x * g from rstd_scale, w is W), and the sums of squares go unused
  const float* rstd;
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

// One ring stage of the mma.sync kernel: ROWS rows of W' from row n0 and the 16 token rows of x, k-block at k0, into
// shared address st (x after the W' part) by NT threads; 16 consecutive threads load one row's 256 B; rows / tokens /
// k past the end are zeros. ROWS is a compile-time constant and a multiple of NT / 16: a runtime row count, or a
// per-row test, put a branch around every cp.async and made the wgmma kernel 35-70% slower (session 31, H200).
template <typename T, int ROWS, int NT>
__device__ __forceinline__ void load_stage(const Params& p, uint32_t st, int64_t k0, int64_t n0, int tid) {
  static_assert((ROWS * kChunks) % NT == 0);
  const T* __restrict__ w = static_cast<const T*>(p.w);
  const T* __restrict__ x = static_cast<const T*>(p.x);
#pragma unroll
  for (int j = 0; j < ROWS * kChunks / NT; ++j) {
    const int i = tid + j * NT, row = i / kChunks, c = i % kChunks;
    const int64_t n = n0 + row, k = k0 + c * 8;
    const bool ok = n < p.N && k < p.K;
    cp_async16(st + swz(row, c), ok ? w + n * p.ldw + k : w, ok ? 16 : 0);
  }
#pragma unroll
  for (int j = 0; j < kTok * kChunks / NT; ++j) {
    const int i = tid + j * NT, t = i / kChunks, c = i % kChunks;
    const int64_t k = k0 + c * 8;
    const bool ok = t < p.M && k < p.K;
    cp_async16(st + ROWS * kBK * 2 + swz(t, c), ok ? x + t * p.ldx + k : x, ok ? 16 : 0);
  }
}

// rstd of every token into rstd_s from the per-thread sums of squares (kTpt consecutive threads per token), then
// the block barrier that makes it visible to the epilogue
template <int kTpt>
__device__ __forceinline__ void finish_rstd(float ss, int tok, int part, const Params& p, float* rstd_s) {
#pragma unroll
  for (int off = 1; off < kTpt; off <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if (part == 0) rstd_s[tok] = !p.rstd ? rsqrtf(ss / float(p.K) + p.eps) : tok < p.M ? p.rstd[tok] : 0.f;
  __syncthreads();
}

// y for the 16 W' rows r0.. of one accumulator tile in the m16n8 C-fragment layout of both MMAs:
// c[j][2 h + e] = (row r0 + g + 8 h, token 8 j + 2 t + e), g = lane / 4, t = lane % 4; rows from r_end (N, or the
// end of the CTA's rows) and tokens past M are not written
template <typename T>
__device__ __forceinline__ void store_rows16(const Params& p, int64_t r0, int64_t r_end, const float (&c)[2][4],
                                             const float* rstd_s, int lane) {
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  const T* bias = static_cast<const T*>(p.bias);
  T* y = static_cast<T*>(p.y);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = r0 + g + h * 8;
    if (n >= r_end) continue;
    const float bn = bias ? frms::to_float<T>(bias[n]) : 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = j * 8 + t2 + e;
        if (tok < p.M) y[tok * p.ldy + n] = frms::from_float<T>(c[j][2 * h + e] * rstd_s[tok] + bn);
      }
    }
  }
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
  const int64_t K = p.K;
  const int kt_count = int((K + kBK - 1) / kBK);
  const uint32_t s0 = smem_u32(smem);
  auto issue = [&](int kt) {
    load_stage<T, BN, kThreads>(p, s0 + uint32_t(kt % STAGES) * kStageBytes, int64_t(kt) * kBK, n0, tid);
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

  finish_rstd<8>(ss, ss_tok, ss_c, p, rstd_s);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) store_rows16<T>(p, n0 + warp * (BN / 4) + mt * 16, p.N, acc[mt], rstd_s, lane);
}

// ------------------------------------------------------------------------------ sm_90a: wgmma from shared memory

// wgmma shared-memory descriptor of a K-major SWIZZLE_128B tile, as two 32-bit words: the low word is the start
// address >> 4 (the leading byte offset above it is unused for this layout), the high word the same for every tile:
// 8-row groups 1024 B apart (stride byte offset) and swizzle mode 1. Tiles start 1024-byte aligned, so a k16 step
// inside a 64-wide half is +32 bytes on the start address (the swizzle applies to the address bits), and every
// descriptor of a stage is the stage's low word plus a constant: one uniform add each.
[[maybe_unused]] constexpr uint32_t kDescHi = (1024u >> 4) | (1u << 30);

template <typename T>
__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[8], uint32_t a_lo, uint32_t b_lo) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, 1, 0;\nmov.b64 da, {%8, %10};\nmov.b64 db, {%9, %10};\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, da, db, p, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a_lo), "r"(b_lo), "r"(kDescHi));
  } else {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, 1, 0;\nmov.b64 da, {%8, %10};\nmov.b64 db, {%9, %10};\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, da, db, p, 1, 1, 0, 0;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a_lo), "r"(b_lo), "r"(kDescHi));
  }
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}

[[maybe_unused]] __device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Thread-block cluster helpers for the K split (sm_90). A launch without a cluster is a cluster of one CTA.
[[maybe_unused]] __device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
[[maybe_unused]] __device__ __forceinline__ uint32_t cluster_size() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}
[[maybe_unused]] __device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// this CTA's shared address in the shared memory of the cluster's CTA `rank`
[[maybe_unused]] __device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
[[maybe_unused]] __device__ __forceinline__ void st_cluster128(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

[[maybe_unused]] __device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// A stage of the wgmma kernel holds a 128-wide k-block as two 64-wide halves, each [ROWS + 16][128 B]: the CTA's ROWS
// rows of W', then the 16 token rows of x, 16-byte chunks XOR-swizzled by row % 8 (wgmma's K-major SWIZZLE_128B
// layout; ROWS % 8 == 0 keeps x's tile 1024-aligned): row r, 16-byte chunk c (0..15) at byte
// (c / 8) * half + 128 r + 16 ((c % 8) ^ (r % 8)), x's token t being row ROWS + t.
__host__ __device__ constexpr int wg_half_bytes(int rows) { return (rows + kTok) * 128; }

// How much the wgmma ring reads past its last stage: with ROWS + 16 < BN the last m64 tile's rows past x run into the
// next half / stage, and past the last one by (BN - ROWS - 16) rows (their accumulator rows are not used)
__host__ __device__ constexpr int wg_overrun(int bn, int rows) { return bn > rows + kTok ? (bn - rows - kTok) * 128 : 0; }

// WG warpgroups per CTA, each owning BN / WG rows of W' (kMT m64 tiles). WG 1: the next stage's loads go out
// once this warpgroup's wgmma of the previous k-block retired (STAGES - 1 blocks in flight). WG 2: a warpgroup
// cannot see the other's wgmma retire, so the loads go out after the top barrier into the slot of k-block kt - 2,
// which both retired one iteration earlier (STAGES - 2 in flight; twice the warps to hide each one's latency).
// ROWS <= BN: the W' rows a CTA owns and loads (session 31). Fewer than BN put more CTAs on the SMs (5120: 128 CTAs of
// 40 rows instead of 80 of 64); the last m64 tile's rows from ROWS on then read x's rows of the stage (and past them
// the next ones), which reach only those rows of the accumulator, and those are not stored.
//
// Lean loop (session 40): one warp per scheduler issues everything, and the session 39 kernel spent ~268 SASS
// instructions per k-block (ncu on the H100: issue slots 27% busy at 2.9 cycles per instruction), most of them
// recomputing each cp.async's row, chunk, bounds and swizzle, and each descriptor's mask and shift. On the H200,
// whose HBM wants ~1.4x the H100's bytes per SM per cycle, that instruction stream set the pace at 5120^2 (1.10x
// F.linear; parity on the H100). Now every address is fixed per thread before the loop (a thread's chunks of a
// stage share one k column and sit kNT / 16 rows apart, so their shared addresses differ by constants), a full
// k-block moves pointers only, and the descriptors are uniform adds. With ROWS + 16 <= BN ("Gram"), x's rows sit
// inside the last m64 tile, so the same wgmma also computes x·xᵀ into accumulator rows ROWS.. ROWS + 15: token t's
// sum of squares is row ROWS + t, column t (fp32 sums of exact bf16 / fp16 products), and the per-k-block sum of
// squares from shared memory goes away.
//
// K split (session 43): launched as clusters of S CTAs (S > 1), the cluster owns the CTA's ROWS rows and its rank r
// streams only k-blocks [r kts, (r + 1) kts), kts = ceil(k-blocks / S); the ranks > 0 then add their accumulators
// (and sums of squares) into rank 0's idle ring through distributed shared memory and exit, and rank 0 stores y.
// Narrow W' (N 1024: 26 CTAs of 40 rows) thus covers S times as many SMs; the main loop is unchanged.
template <typename T, int BN, int STAGES, int WG, int ROWS>
__global__ void __launch_bounds__(128 * WG) stream_wg_kernel(Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kNT = 128 * WG;          // threads
  constexpr int kMT = BN / 64 / WG;      // m64 tiles per warpgroup: wgmma's M is 64 W' rows
  static_assert(ROWS <= BN && ROWS + 32 >= BN && ROWS % 8 == 0);
  constexpr int kHalf = wg_half_bytes(ROWS);
  constexpr int kStageBytes = 2 * kHalf;  // a multiple of 1024: every tile stays 1024-aligned
  constexpr bool kGram = ROWS + kTok <= BN;
  constexpr int kStep = kNT / 16;        // rows between one thread's chunks (8 or 16: same row % 8, same swizzle)
  constexpr int kJW = ROWS / kStep, kJX = kTok / kStep;  // a thread's chunks of W' and of x per stage
  constexpr int kTpt = kNT / kTok;       // threads per token in the shared-memory sum of squares (not kGram)
  static_assert(kMT >= 1 && BN % (64 * WG) == 0 && ROWS % kStep == 0 && kTok % kStep == 0 && kHalf % 1024 == 0);
  static_assert(WG == 1 || STAGES >= 3);
  extern __shared__ unsigned char smem[];
  __shared__ float rstd_s[kTok];

  // wg: a constant 0 for one warpgroup (the compiler cannot know tid < 128; session 30: 72 -> 96 registers and
  // up to 7% slower when it was computed)
  const int tid = threadIdx.x, lane = tid & 31, warp = WG == 1 ? tid >> 5 : (tid >> 5) & 3, wg = WG == 1 ? 0 : tid >> 7;
  const uint32_t rank = cluster_rank(), nr = cluster_size();  // the K split: 0, 1 without a cluster
  const int64_t n0 = int64_t(blockIdx.x / nr) * ROWS;
  const int kt_all = int((p.K + kBK - 1) / kBK), kts = (kt_all + int(nr) - 1) / int(nr);
  const int64_t kb = int64_t(min(kt_all, int(rank) * kts)) * kBK;  // this CTA's first k
  const int64_t K = max(int64_t(0), min(p.K - kb, int64_t(kts) * kBK));  // its k extent (0: no k-block left)
  const int kt_count = int((K + kBK - 1) / kBK), kt_full = int(K / kBK);
  const bool fence = p.fence != 0;
  const uint32_t s0 = (smem_u32(smem) + 1023u) & ~1023u;  // the launch adds 1 KB of slack for this

  // This thread's copy plan: chunk c (k + 8 c) of rows r0 + kStep j of W' and tokens r0 + kStep e of x. Rows past N
  // and tokens past M read the CTA's first row / token 0 (always in bounds) with 0 source bytes, i.e. zeros.
  const int c = tid & 15, r0 = tid >> 4;
  const uint32_t dst0 = uint32_t(c >> 3) * kHalf + uint32_t(r0) * 128 + uint32_t(((c & 7) ^ (r0 & 7)) * 16);
  const T* wsrc[kJW];
  int wsz[kJW];
#pragma unroll
  for (int j = 0; j < kJW; ++j) {
    const int64_t n = n0 + r0 + kStep * j;
    wsrc[j] = static_cast<const T*>(p.w) + (n < p.N ? n : n0) * p.ldw + kb + c * 8;
    wsz[j] = n < p.N ? 16 : 0;
  }
  const T* xsrc[kJX];
  int xsz[kJX];
#pragma unroll
  for (int e = 0; e < kJX; ++e) {
    const int t = r0 + kStep * e;
    xsrc[e] = static_cast<const T*>(p.x) + (t < p.M ? t : 0) * p.ldx + kb + c * 8;
    xsz[e] = t < p.M ? 16 : 0;
  }
  auto issue = [&](int kt) {
    const uint32_t d = s0 + uint32_t(kt % STAGES) * kStageBytes + dst0;
    const int64_t k0 = int64_t(kt) * kBK;
    if (kt < kt_full) {
#pragma unroll
      for (int j = 0; j < kJW; ++j) cp_async16(d + kStep * 128 * j, wsrc[j] + k0, wsz[j]);
#pragma unroll
      for (int e = 0; e < kJX; ++e) cp_async16(d + (ROWS + kStep * e) * 128, xsrc[e] + k0, xsz[e]);
    } else {  // the partial last k-block: chunks at or past K are zeros, read from k = 0
      const bool ok = k0 + c * 8 < K;
#pragma unroll
      for (int j = 0; j < kJW; ++j) cp_async16(d + kStep * 128 * j, ok ? wsrc[j] + k0 : wsrc[j], ok ? wsz[j] : 0);
#pragma unroll
      for (int e = 0; e < kJX; ++e)
        cp_async16(d + (ROWS + kStep * e) * 128, ok ? xsrc[e] + k0 : xsrc[e], ok ? xsz[e] : 0);
    }
  };
  constexpr int kAhead = WG == 1 ? STAGES - 1 : STAGES - 2;  // k-blocks in flight

#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < kt_count) issue(s);
    cp_async_commit();
  }

  float acc[kMT][8];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[mt][e] = 0.f;
  float ss = 0.f;  // not kGram: token tid / kTpt, chunks tid % kTpt + kTpt e
  const int ss_tok = int(unsigned(tid) / kTpt), ss_c = int(unsigned(tid) % kTpt);
  const uint32_t a_wg = uint32_t(wg * kMT) * (64 * 128 / 16);  // this warpgroup's first tile, in descriptor units

  for (int kt = 0; kt < kt_count; ++kt) {
    cp_async_wait<kAhead - 1>();
    // this thread's cp.async writes, made visible to the async proxy that wgmma reads shared memory through
    if (fence) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();  // stage kt landed for every thread; every thread's sums of stage kt - 1 are done
    if constexpr (WG > 1) {
      if (kt + kAhead < kt_count) issue(kt + kAhead);  // the slot of k-block kt - 2
      cp_async_commit();
    }
    const uint32_t st = s0 + uint32_t(kt % STAGES) * kStageBytes;
    const uint32_t lo = st >> 4;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int e = 0; e < 8; ++e) fence_operand(acc[mt][e]);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {  // k16 steps of the 64-wide half: +32 B
          const uint32_t a = lo + a_wg + uint32_t((h * kHalf + mt * 64 * 128 + ks * 32) >> 4);
          const uint32_t b = lo + uint32_t((h * kHalf + ROWS * 128 + ks * 32) >> 4);
          wgmma_m64n16k16<T>(acc[mt], a, b);
        }
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    wgmma_wait<1>();  // this warpgroup's k-block kt - 1 is done
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int e = 0; e < 8; ++e) fence_operand(acc[mt][e]);
    if constexpr (WG == 1) {
      if (kt + kAhead < kt_count) issue(kt + kAhead);  // the slot of k-block kt - 1
      cp_async_commit();
    }
    if constexpr (!kGram) {
      constexpr int kE = kChunks / kTpt;  // chunks per thread: loads first, then the sums
      float f[kE][8];
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        const int ch = ss_c + kTpt * e;
        frms::unpack8<T>(lds128(st + uint32_t((ch >> 3) * kHalf + (ROWS + ss_tok) * 128 + ((ch & 7) ^ (ss_tok & 7)) * 16)),
                         f[e]);
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        float t = ss;
#pragma unroll
        for (int e = kE - 1; e >= 0; --e) t = fmaf(f[e][q], f[e][q], t);
        ss = t;
      }
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int e = 0; e < 8; ++e) fence_operand(acc[mt][e]);
  cp_async_wait<0>();

  if (nr > 1) {
    // Rank r > 0's partials go to rank 0's ring at (r - 1) * kRed: acc as v4 pairs, then ss, each [kNT] wide.
    // The first barrier: every CTA is past its loop (rank 0's ring is idle); the second: the partials landed.
    constexpr int kVec = kMT * 2 + (kGram ? 0 : 1), kRed = kVec * kNT * 16;
    static_assert(7 * kRed <= STAGES * kStageBytes, "a cluster of 8 reduces in rank 0's ring");
    cluster_sync();
    if (rank != 0) {
      const uint32_t dst = map_to_rank(s0 + (rank - 1) * kRed + tid * 16, 0);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int q = 0; q < 2; ++q)
          st_cluster128(dst + (mt * 2 + q) * kNT * 16, acc[mt][4 * q], acc[mt][4 * q + 1], acc[mt][4 * q + 2],
                        acc[mt][4 * q + 3]);
      if constexpr (!kGram) st_cluster128(dst + kMT * 2 * kNT * 16, ss, 0.f, 0.f, 0.f);
    }
    cluster_sync();
    if (rank != 0) return;
    for (uint32_t r = 1; r < nr; ++r) {
      const uint32_t src = s0 + (r - 1) * kRed + tid * 16;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const uint4 v = lds128(src + (mt * 2 + q) * kNT * 16);
          acc[mt][4 * q] += __uint_as_float(v.x);
          acc[mt][4 * q + 1] += __uint_as_float(v.y);
          acc[mt][4 * q + 2] += __uint_as_float(v.z);
          acc[mt][4 * q + 3] += __uint_as_float(v.w);
        }
      if constexpr (!kGram) ss += __uint_as_float(lds128(src + kMT * 2 * kNT * 16).x);
    }
  }

  if constexpr (kGram) {
    // x·xᵀ sits in the last tile's rows kX0.. kX0 + 15 (m64n16 C fragments: warp w rows 16 w + g + 8 h, value 4 j + 2 h
    // + e at token 8 j + 2 (lane % 4) + e); the diagonal holds the sums of squares
    constexpr int kX0 = ROWS - (BN - 64);
    if (wg == WG - 1) {
      const int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int tok = j * 8 + t2 + e;
            if (warp * 16 + g + h * 8 - kX0 == tok)
              rstd_s[tok] = !p.rstd ? rsqrtf(acc[kMT - 1][4 * j + 2 * h + e] / float(p.K) + p.eps)
                            : tok < p.M ? p.rstd[tok] : 0.f;
          }
    }
    __syncthreads();
  } else {
    finish_rstd<kTpt>(ss, ss_tok, ss_c, p, rstd_s);
  }
  const int64_t r_end = ROWS == BN || n0 + ROWS > p.N ? p.N : n0 + ROWS;
  // m64n16 accumulator: warp w of a warpgroup holds rows 16 w .. 16 w + 15 of its m64 tile, in the m16n8
  // C-fragment layout per 8 tokens (value 4 j + 2 h + e)
  if constexpr (WG == 2) {
    // y through shared memory (the ring is idle now): [16 tokens][ROWS + 8] (padded: the 4 tokens of a store
    // land in different banks), then each token's ROWS outputs leave as 16-byte stores instead of 2-byte ones.
    // Session 31, H200, B16 D4096 N14336 (2 warpgroups, 128 x 5): 30.78 us against 31.02 with the direct stores
    // (F.linear 30.80), M1 / M8 unchanged; not measured for one warpgroup, which keeps the direct stores.
    constexpr int kLd = ROWS + 8;
    T* ys = reinterpret_cast<T*>(smem + (s0 - smem_u32(smem)));
    const T* bias = static_cast<const T*>(p.bias);
    const int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = (wg * kMT + mt) * 64 + warp * 16 + g + h * 8;  // the CTA's row
        if (r >= ROWS) continue;  // past the CTA's rows (ROWS < BN): not its outputs
        const int64_t n = n0 + r;
        const float bn = bias && n < p.N ? frms::to_float<T>(bias[n]) : 0.f;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int tok = j * 8 + t2 + e;
            ys[tok * kLd + r] = frms::from_float<T>(acc[mt][4 * j + 2 * h + e] * rstd_s[tok] + bn);
          }
      }
    }
    __syncthreads();
    T* y = static_cast<T*>(p.y);
    const bool vec = p.ldy % 8 == 0 && (reinterpret_cast<uintptr_t>(y) & 15) == 0;
    for (int i = tid; i < kTok * (ROWS / 8); i += kNT) {
      const int tok = i / (ROWS / 8), r = (i % (ROWS / 8)) * 8;
      const int64_t n = n0 + r;
      if (tok >= p.M || n >= r_end) continue;
      const T* src = ys + tok * kLd + r;
      T* dst = y + tok * p.ldy + n;
      if (vec && n + 8 <= r_end) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      } else {
        for (int e = 0; e < 8 && n + e < r_end; ++e) dst[e] = src[e];
      }
    }
  } else {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
      store_rows16<T>(p, n0 + (wg * kMT + mt) * 64 + warp * 16, r_end,
                      *reinterpret_cast<const float(*)[2][4]>(acc[mt]), rstd_s, lane);
  }
#else
  __trap();  // launched only on sm_90 devices from a binary with sm_90a code (frms_decode_stream checks)
#endif
}

// Kernels that need more than 48 KB of dynamic shared memory: the opt-in, once per device and kernel
template <typename Kern>
int opt_in_smem(Kern kernel, size_t smem, bool (&done)[frms::kMaxDevices]) {
  const int dev = frms::current_device();
  if (!done[dev]) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return int(e);
    done[dev] = true;
  }
  return 0;
}

template <typename T, int BN, int STAGES>
int launch(const Params& p, cudaStream_t stream) {
  constexpr size_t smem = size_t(STAGES) * (BN + kTok) * kBK * 2;
  static bool attr_set[frms::kMaxDevices] = {};
  if (int e = opt_in_smem(stream_kernel<T, BN, STAGES>, smem, attr_set)) return e;
  const dim3 grid(unsigned((p.N + BN - 1) / BN));
  stream_kernel<T, BN, STAGES><<<grid, kThreads, smem, stream>>>(p);
  return int(cudaGetLastError());
}

// The wgmma kernel exists only in an sm_90a cubin (FRMS_STREAM_WGMMA: the build compiled this unit for 9.0a), which
// runs only on a compute-capability 9.0 device.
inline bool wgmma_device() {
  static signed char ok[frms::kMaxDevices];  // 0 unknown, 1 yes, -1 no
  const int dev = frms::current_device();
  if (ok[dev] == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    ok[dev] = FRMS_STREAM_WGMMA && major == 9 && minor == 0 ? 1 : -1;
  }
  return ok[dev] > 0;
}

template <typename T, int BN, int STAGES, int WG, int ROWS = BN>
int launch_wg(const Params& p, int split, cudaStream_t stream) {
  if (!wgmma_device()) return FRMS_ERR_NOT_BUILT;
  // + 1 KB of slack to align the ring, + what the last tile reads past it
  constexpr size_t smem = size_t(STAGES) * 2 * wg_half_bytes(ROWS) + 1024 + wg_overrun(BN, ROWS);
  static_assert(smem <= 226 * 1024);  // an H100 / H200 CTA's 227 KB opt-in, less the static part
  static bool attr_set[frms::kMaxDevices] = {};
  if (int e = opt_in_smem(stream_wg_kernel<T, BN, STAGES, WG, ROWS>, smem, attr_set)) return e;
  const unsigned tiles = unsigned((p.N + ROWS - 1) / ROWS);
  if (split == 1) {
    stream_wg_kernel<T, BN, STAGES, WG, ROWS><<<tiles, 128 * WG, smem, stream>>>(p);
    return int(cudaGetLastError());
  }
  // the K split: clusters of `split` CTAs along x (portable sizes <= 8), one per ROWS rows
  return frms::launch_clustered(stream_wg_kernel<T, BN, STAGES, WG, ROWS>, dim3(tiles * unsigned(split)),
                                dim3(128 * WG), smem, stream, dim3(unsigned(split)), p);
}

// rows: W' rows per CTA (0 = bn; the wgmma kernel's ROWS). Of session 31's row-count variants only those that won or
// tied on the H200 were kept (64x8 on 40 rows, 128x5 on 112; 64x4 / 64x12 on 40, 128x6 / 128x7 on 112 and 64x8
// on 64 rows lost: benchmarks/results/logs/h200-s31-r3-probe_rmsnorm_stream-rows.log); 64x8 on 64 rows and 128x6 on
// 112 are back for session 40's lean loop, which needs fewer instructions per stage and so may gain from deeper rings,
// and 32 rows (8 or 12 stages) put 4096 rows of W' on 128 CTAs.
template <typename T>
int dispatch(const Params& p, int bn, int stages, int wgmma, int rows, int split, cudaStream_t stream) {
  if (rows == 0) rows = bn;
  if (wgmma == 1) {  // one warpgroup
    if (bn == 128 && stages == 4 && rows == 128) return launch_wg<T, 128, 4, 1>(p, split, stream);
    if (bn == 128 && stages == 5 && rows == 128) return launch_wg<T, 128, 5, 1>(p, split, stream);
    if (bn == 64 && stages == 4 && rows == 64) return launch_wg<T, 64, 4, 1>(p, split, stream);
    if (bn == 64 && stages == 5 && rows == 64) return launch_wg<T, 64, 5, 1>(p, split, stream);
    if (bn == 64 && stages == 6 && rows == 64) return launch_wg<T, 64, 6, 1>(p, split, stream);
    if (bn == 64 && stages == 8 && rows == 64) return launch_wg<T, 64, 8, 1>(p, split, stream);
    if (bn == 64 && stages == 8 && rows == 40) return launch_wg<T, 64, 8, 1, 40>(p, split, stream);
    if (bn == 64 && stages == 8 && rows == 32) return launch_wg<T, 64, 8, 1, 32>(p, split, stream);
    if (bn == 64 && stages == 12 && rows == 32) return launch_wg<T, 64, 12, 1, 32>(p, split, stream);
    return FRMS_ERR_BAD_ARG;
  }
  if (wgmma == 2) {  // two warpgroups, 64 W' rows each
    if (bn == 128 && stages == 5 && rows == 128) return launch_wg<T, 128, 5, 2>(p, split, stream);
    if (bn == 128 && stages == 6 && rows == 128) return launch_wg<T, 128, 6, 2>(p, split, stream);
    if (bn == 128 && stages == 5 && rows == 112) return launch_wg<T, 128, 5, 2, 112>(p, split, stream);
    if (bn == 128 && stages == 6 && rows == 112) return launch_wg<T, 128, 6, 2, 112>(p, split, stream);
    return FRMS_ERR_BAD_ARG;
  }
  if (wgmma != 0 || rows != bn || split != 1) return FRMS_ERR_BAD_ARG;
  if (bn == 128 && stages == 4) return launch<T, 128, 4>(p, stream);
  if (bn == 128 && stages == 3) return launch<T, 128, 3>(p, stream);
  if (bn == 64 && stages == 4) return launch<T, 64, 4>(p, stream);
  if (bn == 64 && stages == 6) return launch<T, 64, 6>(p, stream);
  return FRMS_ERR_BAD_ARG;
}
}  // namespace

extern "C" int frms_decode_stream(int dtype, const void* x, int64_t ldx, const void* w, int64_t ldw, const void* bias,
                                  void* y, int64_t ldy, int64_t M, int64_t N, int64_t K, float eps, int bn, int stages,
                                  int wgmma, int fence, int rows, void* stream, const float* rstd, int split) {
  // 16-byte cp.async chunks: K, the row strides and the bases must all be 16-byte granular
  if (M < 1 || M > kTok || N < 1 || K < 8 || K % 8 != 0 || ldx % 8 != 0 || ldw % 8 != 0 || !(eps > 0.f))
    return FRMS_ERR_BAD_ARG;
  if (!frms::aligned16(x) || !frms::aligned16(w) || ldx < K || ldw < K || ldy < N) return FRMS_ERR_BAD_ARG;
  if ((fence != 0 && fence != 1) || (split != 1 && split != 2 && split != 4 && split != 8)) return FRMS_ERR_BAD_ARG;
  const Params p{x, ldx, w, ldw, bias, y, ldy, M, N, K, eps, fence, rstd};
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == FRMS_DTYPE_BF16) return dispatch<__nv_bfloat16>(p, bn, stages, wgmma, rows, split, s);
  if (dtype == FRMS_DTYPE_F16) return dispatch<__half>(p, bn, stages, wgmma, rows, split, s);
  return FRMS_ERR_BAD_ARG;
}
