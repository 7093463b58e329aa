// Tensor-core decode (small M) fused RMSNorm + Linear, sm_80+:
//   y[m, n] = rstd[m] * sum_k x[m, k] * g[k] * W[n, k]  (+ bias[n]),  rstd[m] = rsqrt(mean_k x[m, k]^2 + eps)
// (g == nullptr: W is the folded W' = W * g of the modules.)
//
// Roles are swapped w.r.t. a GEMM: 16 rows of W are the M dimension of mma.m16n8k16, the tokens are
// its N dimension (NT n8 tiles = 8 / 16 / 32 tokens per CTA). A decode GEMV is bound by reading W
// once, so everything is arranged around W's 16-byte loads:
// * k is permuted consistently in A and B (the reduction over k does not care about order): in a
//   32-wide step, lane (g = lane / 4, t = lane % 4) loads 8 contiguous k of W row g, of W row g + 8
//   and of token g (16 bytes each) and uses elements {0..3} as its k-slots {2t, 2t+1, 2t+8, 2t+9}
//   of a first m16n8k16 and elements {4..7} as the same slots of a second one (fragment layouts of
//   the PTX ISA / CUTLASS SM80_16x8x16: A reg0 = (row g, k 2t..2t+1), reg1 = (row g+8, same),
//   reg2 = (row g, k 2t+8..), reg3 = (row g+8, k 2t+8..); B reg0 = (k 2t..2t+1, col g), reg1 = (k
//   2t+8.., col g); C c0/c1 = (row g, col 2t / 2t+1), c2/c3 = (row g+8, ...)). Each instruction
//   reads 8 rows x 64 contiguous bytes: full 32-byte sectors.
// * memory-level parallelism: every lane keeps U steps (2 x 16 B each) of W in flight (a register
//   ring), W with an L1-no-allocate / L2-evict-first hint; x (and g) one step ahead through the
//   read-only path: a CTA's warps that share a k range read the same x lines (L1 hits), so the L2
//   traffic for x is M / BN of W's, which is why BN (16 * WN rows) grows with M.
// * the k range is split over the WK = 8 / WN warps of a CTA (partial C tiles reduced through shared
//   memory) and, when N / BN CTAs cannot fill the GPU, over the `ksplit` CTAs of a thread-block
//   cluster (sm_90): the partial tiles are reduced through distributed shared memory, each CTA of the
//   cluster finishing 1/ksplit of the outputs. Deterministic (fixed summation order), one launch, no
//   workspace. Builds without cluster support (sm_8x) run ksplit = 1.
// * rstd is computed in-kernel: the warps of column 0 (wn == 0) square the x values they load anyway
//   and the partial sums go through the same reductions as C; rstd scales the output columns.
// * g (functional path) multiplies x in fp32 before it is rounded to the MMA's 16-bit operand (one
//   rounding, like the unfused x * rstd -> bf16 -> * g); the module path passes W' and g = nullptr.
// * `wload` variants (tuning knobs, NT <= 2, the default ring depth and evict_first only), to find what
//   limits the W stream at large weights: 1 = x (and g) ride the ring too, U steps ahead instead of one
//   (an L2 round trip of x under a saturated memory system no longer stalls the next step); 2 / 3 = as 1,
//   and W is staged through shared memory by cp.async.bulk (sm_90): each warp copies its 16 rows in
//   long contiguous per-row pieces (kWSteps(wl) steps = 64 B each) into a kWStages(wl)-deep pipeline
//   of per-warp mbarriers, and reads its fragments with lds.128 (same k permutation). 2: 256-B
//   pieces x 3 stages (fits 2 CTAs / SM), 3: 512-B pieces x 3 stages (1 CTA / SM).
#include "decode_mma_config.h"
#include "frms.h"
#include "mma.cuh"
#include "vec.cuh"

#include <cooperative_groups.h>
#include <type_traits>

namespace {
namespace cg = cooperative_groups;
using frms::mma16816;
using frms::pack2;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxKsplit = 16;  // cluster size; > 8 needs the non-portable cluster attribute

struct Params {
  const void* x;
  int64_t ldx;
  const void* g;  // nullptr: W already holds the norm weight
  const void* w;
  int64_t ldw;
  const void* bias;
  void* y;
  int64_t ldy;
  int64_t M, N, K;
  float eps;
  int wn;      // warps along N (1, 2, 4, 8): BN = 16 * wn rows per CTA, WK = 8 / wn warps along K
  int ksplit;  // CTAs along K (= cluster size along grid y), 1 .. kMaxKsplit
};

// W: read exactly once -> keep it out of L1 and first in line for L2 eviction (an L2 cache policy
// made once per thread with createpolicy; the .L2::evict_first qualifier itself is 256-bit-load only).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
// kEF == false: the plain read-only load (default L1 / L2 caching), a tuning alternative.
template <bool kEF>
__device__ __forceinline__ uint4 ld_w(const void* p, uint64_t pol) {
  if (!kEF) return frms::ld_cached(p);
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(pol));
  return v;
}

// ---- wload 2 / 3: per-warp shared-memory staging of W (cp.async.bulk + mbarrier, sm_90)
__host__ __device__ constexpr int kWSteps(int wl) { return wl == 2 ? 4 : wl == 3 ? 8 : 0; }  // 64-B steps / stage
__host__ __device__ constexpr int kWStages(int wl) { return wl >= 2 ? 3 : 0; }                // pipeline depth
// Bytes of one warp's stage: 16 rows of kWSteps * 64 B; row r starts at r * S + ((r + 1) / 2) * 64, so
// rows 2q and 2q + 1 (one quarter-warp of an lds.128: lanes 8q .. 8q + 7 read 64 B of each) are 64 B
// apart modulo 128: conflict-free.
__host__ __device__ constexpr int wstage_bytes(int wl) { return 16 * kWSteps(wl) * 64 + 8 * 64; }
__host__ __device__ constexpr size_t wstage_smem(int wl) {
  return wl >= 2 ? size_t(kWarps) * kWStages(wl) * wstage_bytes(wl) : 0;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ constexpr int wrow_off(int wl, int r) { return r * kWSteps(wl) * 64 + ((r + 1) >> 1) * 64; }
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
// 1-D bulk copy global -> this CTA's shared memory, completion counted on `bar` (bytes % 16 == 0).
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(pol)
      : "memory");
}
// a plain load: ordered after mbar_wait (a "memory" clobber), the compiler emits LDS.128
__device__ __forceinline__ uint4 lds128(const unsigned char* p) { return *reinterpret_cast<const uint4*>(p); }
#endif

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Address of `p` in the shared memory of cluster CTA `rank` (the CTA's own when not clustered).
__device__ __forceinline__ float* cluster_smem(float* p, int rank, int ksplit) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (ksplit > 1) return cg::this_cluster().map_shared_rank(p, rank);
#endif
  return p;
}

__device__ __forceinline__ void cluster_or_cta_sync(int ksplit) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (ksplit > 1) {
    cg::this_cluster().sync();  // also a CTA barrier; release/acquire for shared memory
    return;
  }
#endif
  __syncthreads();
}

// U: steps of W in flight per lane (U * 32 bytes). NT: n8 token tiles. kG: scale x by g in-kernel.
// kEF: W loads with L1::no_allocate + L2 evict_first (else plain ld.global.nc). WL: the `wload`
// variant (0 = W ring + x one step ahead; 1 = x in the ring too; 2 / 3 = 1 + W staged in smem).
template <typename T, int NT, int U, bool kG, bool kEF, int WL>
__global__ void __launch_bounds__(kThreads, 2) decode_mma_kernel(const Params p) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  constexpr int TOK = 8 * NT;
  static_assert(U % 2 == 0, "the x double buffer needs an even ring depth");
  constexpr bool kGonW = kG && NT >= 2;  // where g is applied: W side (NT >= 2) or x side (NT == 1)
  constexpr bool kXring = WL >= 1;       // x / g loaded U steps ahead, in the ring
  constexpr bool kXpf = !kXring && NT < 4;  // else prefetch x one step ahead (registers permitting)
  constexpr bool kWsm = WL >= 2;         // W through shared memory (cp.async.bulk)
  constexpr int SPS = kWsm ? kWSteps(WL) : U, NS = kWsm ? kWStages(WL) : 1;
  static_assert(!kWsm || SPS % U == 0, "a stage holds whole ring turns");
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
  if (p.ksplit > 1 || kWsm) __trap();  // the host never asks for these without sm_90 support
#endif
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int n_wn = p.wn, n_wk = kWarps / p.wn;
  const int wn = warp % n_wn, wk = warp / n_wn;
  const int BN = 16 * n_wn, RS = BN + 4;  // RS: padded smem row stride (conflict-free fragment stores)
  const int64_t n0 = int64_t(blockIdx.x) * BN;
  const int64_t m0 = int64_t(blockIdx.z) * TOK;
  const int ks = p.ksplit, rank = blockIdx.y;  // cluster dims (1, ks, 1): rank in cluster == blockIdx.y

  // This warp's k range, in 32-wide steps: steps spread evenly over ks * WK warp ranges.
  const int64_t steps = (p.K + 31) / 32;
  const int64_t nr = int64_t(ks) * n_wk, r = int64_t(rank) * n_wk + wk;
  const int64_t base = steps / nr, rem = steps % nr;
  const int64_t s_beg = r * base + (r < rem ? r : rem);
  const int cnt = int(base + (r < rem ? 1 : 0));

  const int kt = 8 * t;  // this lane's k offset inside a step
  // Steps entirely inside K: every one but possibly the last step of K, which the warp that owns it
  // runs after the loop with lane masks. The loop needs no masks and no zero fills.
  const int cnt_full = int(min64(cnt, max64(0, p.K / 32 - s_beg)));
  const bool has_tail = cnt_full < cnt;                      // warp-uniform
  const bool tail_ok = (s_beg + cnt_full) * 32 + kt < p.K;  // this lane's 8 k of that step are in K
  // Rows of W beyond N and tokens beyond M read a valid row instead (row N-1 / token M-1): their
  // outputs are never stored and MMA rows / columns are independent, so they need no mask either.
  const T* W = static_cast<const T*>(p.w);
  const int64_t row0 = n0 + wn * 16 + g;
  const T* pa = W + min64(row0, p.N - 1) * p.ldw + kt + s_beg * 32;
  const T* pb = W + min64(row0 + 8, p.N - 1) * p.ldw + kt + s_beg * 32;
  const T* X = static_cast<const T*>(p.x);
  // x rows of the NT token tiles: one pointer + 32-bit row offsets (registers; the host checks that
  // 32 rows of x span < 2^31 elements)
  const int64_t xrow0 = min64(m0 + g, p.M - 1);
  const T* px0 = X + xrow0 * p.ldx + kt + s_beg * 32;
  int xoff[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) xoff[j] = int((min64(m0 + 8 * j + g, p.M - 1) - xrow0) * p.ldx);
  const T* pg = kG ? static_cast<const T*>(p.g) + kt + s_beg * 32 : nullptr;
  const bool do_ss = wn == 0;  // warp-uniform: one warp column squares x

  float acc[NT][4];
  float ss[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    ss[j] = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  }

  // One 32-wide step: W rows (a: g, b: g + 8), x of the NT token tiles, g (if kG).
  auto compute = [&](uint4 a, uint4 b, const uint4 (&xs)[NT], const uint4& gv, auto ss_tag) {
    constexpr bool kSS = decltype(ss_tag)::value;
    float gf[8];
    if (kG) frms::unpack8<T>(gv, gf);
    if (kGonW) {  // g on the W side: 16 products per step, fewer than 8 * NT on the x side
      float f[8];
      frms::unpack8<T>(a, f);
      a = make_uint4(pack2<T>(f[0] * gf[0], f[1] * gf[1]), pack2<T>(f[2] * gf[2], f[3] * gf[3]),
                     pack2<T>(f[4] * gf[4], f[5] * gf[5]), pack2<T>(f[6] * gf[6], f[7] * gf[7]));
      frms::unpack8<T>(b, f);
      b = make_uint4(pack2<T>(f[0] * gf[0], f[1] * gf[1]), pack2<T>(f[2] * gf[2], f[3] * gf[3]),
                     pack2<T>(f[4] * gf[4], f[5] * gf[5]), pack2<T>(f[6] * gf[6], f[7] * gf[7]));
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      uint4 xb = xs[j];
      if ((kG && !kGonW) || kSS) {
        float f[8];
        frms::unpack8<T>(xs[j], f);
        if (kSS) {
#pragma unroll
          for (int e = 0; e < 8; ++e) ss[j] = fmaf(f[e], f[e], ss[j]);
        }
        if (kG && !kGonW)
          xb = make_uint4(pack2<T>(f[0] * gf[0], f[1] * gf[1]), pack2<T>(f[2] * gf[2], f[3] * gf[3]),
                          pack2<T>(f[4] * gf[4], f[5] * gf[5]), pack2<T>(f[6] * gf[6], f[7] * gf[7]));
      }
      // elements 0..3 of the lane's 8 are k-slots {2t, 2t+1, 2t+8, 2t+9} of MMA 1, 4..7 of MMA 2
      mma16816<T>(acc[j], a.x, b.x, a.y, b.y, xb.x, xb.y);
      mma16816<T>(acc[j], a.z, b.z, a.w, b.w, xb.z, xb.w);
    }
  };

  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const uint64_t pol = kEF ? evict_first_policy() : 0;
  uint4 wa[U], wb[U];   // ring: slot u holds step i with i % U == u
  // x / g: with kXpf double-buffered one step ahead (slot i % 2; U is even, so i % 2 == u % 2),
  // else loaded at the start of each step (NT = 4: registers; its 8 warp columns share x in L1).
  // kXring: x / g of step i in slot i % U, loaded with W.
  constexpr int XS = kXring ? U : (kXpf ? 2 : 1);
  uint4 xr[XS][NT], gr[XS];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    wa[u] = wb[u] = zero;
    if (!kWsm && u < cnt_full) {
      wa[u] = ld_w<kEF>(pa + 32 * u, pol);
      wb[u] = ld_w<kEF>(pb + 32 * u, pol);
    }
  }
#pragma unroll
  for (int q = 0; q < XS; ++q) {
#pragma unroll
    for (int j = 0; j < NT; ++j) xr[q][j] = zero;
    gr[q] = zero;
    if (kXring && q < cnt_full) {
#pragma unroll
      for (int j = 0; j < NT; ++j) xr[q][j] = frms::ld_cached(px0 + xoff[j] + 32 * q);
      if (kG) gr[q] = frms::ld_cached(pg + 32 * q);
    }
  }
  if (kXpf && 0 < cnt_full) {
#pragma unroll
    for (int j = 0; j < NT; ++j) xr[0][j] = frms::ld_cached(px0 + xoff[j]);
    if (kG) gr[0] = frms::ld_cached(pg);
  }

  // Step i from ring slot u: (pre)fetch x / g, compute, refill the slot with step i + U. Offsets are
  // relative to the pointers, which advance by U steps per ring turn; slots past the warp's range
  // keep stale data and are never consumed.
  auto step = [&](const int i, const int u, auto ss_tag) {
    if (kXring) {  // W of step i from the ring (or smem: wa / wb filled by the caller), x from slot u
      compute(wa[u], wb[u], xr[u], gr[u], ss_tag);
      if (i + U < cnt_full) {
        if (!kWsm) {
          wa[u] = ld_w<kEF>(pa + 32 * (u + U), pol);
          wb[u] = ld_w<kEF>(pb + 32 * (u + U), pol);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) xr[u][j] = frms::ld_cached(px0 + xoff[j] + 32 * (u + U));
        if (kG) gr[u] = frms::ld_cached(pg + 32 * (u + U));
      }
      return;
    }
    const int cur = kXpf ? (u & 1) : 0;
    if (kXpf) {
      if (i + 1 < cnt_full) {
#pragma unroll
        for (int j = 0; j < NT; ++j) xr[cur ^ 1][j] = frms::ld_cached(px0 + xoff[j] + 32 * (u + 1));
        if (kG) gr[cur ^ 1] = frms::ld_cached(pg + 32 * (u + 1));
      }
    } else {
#pragma unroll
      for (int j = 0; j < NT; ++j) xr[0][j] = frms::ld_cached(px0 + xoff[j] + 32 * u);
      if (kG) gr[0] = frms::ld_cached(pg + 32 * u);
    }
    compute(wa[u], wb[u], xr[cur], gr[cur], ss_tag);
    if (i + U < cnt_full) {
      wa[u] = ld_w<kEF>(pa + 32 * (u + U), pol);
      wb[u] = ld_w<kEF>(pb + 32 * (u + U), pol);
    }
  };

  // The warps that square x (wn == 0) run their own copy of the loop, so the others carry no
  // per-step branch or if-converted squares.
  // kWsm: this warp's stages of W in shared memory (after the reduction area is no longer aliased:
  // it is, the loop finishes before the reduction writes, see the barrier there), one mbarrier each.
  // Stage q holds steps [q * SPS, q * SPS + SPS) of the warp's full steps; lane r < 16 copies row r.
  unsigned char* wst = reinterpret_cast<unsigned char*>(smem4) + size_t(warp) * NS * (kWsm ? wstage_bytes(WL) : 0);
  __shared__ uint64_t wbar_s[kWsm ? kWarps * NS : 1];
  uint64_t* wbar = wbar_s + (kWsm ? warp * NS : 0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int nstage = (cnt_full + SPS - 1) / SPS;
  const T* wrow = W + min64(n0 + wn * 16 + (lane & 15), p.N - 1) * p.ldw + s_beg * 32;  // lanes 0..15
  auto issue = [&](int q) {  // whole warp; fills stage q % NS
    const int nsteps = min(SPS, cnt_full - q * SPS);
    uint64_t* bar = wbar + q % NS;
    if (lane == 0) mbar_expect_tx(bar, uint32_t(16 * 64 * nsteps));
    __syncwarp();
    if (lane < 16)
      bulk_g2s(wst + (q % NS) * wstage_bytes(WL) + wrow_off(WL, lane), wrow + int64_t(q) * SPS * 32,
               uint32_t(64 * nsteps), bar, pol);
  };
  if constexpr (kWsm) {
    if (lane == 0) {
      for (int q = 0; q < NS; ++q) mbar_init(wbar + q, 1);
      // make the initialised barriers visible to the async proxy (the bulk copies' complete_tx)
      asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncwarp();
    for (int q = 0; q < NS && q < nstage; ++q) issue(q);
  }
#endif

  auto run = [&](auto ss_tag) {
    int i0 = 0;
    for (; i0 < cnt_full; i0 += U) {  // ring turns; only the last one can be partial
      if constexpr (kWsm) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        const int q = i0 / SPS, o = i0 % SPS;
        if (o == 0) mbar_wait(wbar + q % NS, uint32_t((q / NS) & 1));
        const unsigned char* sb = wst + (q % NS) * wstage_bytes(WL) + 16 * t + 64 * o;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          wa[u] = lds128(sb + wrow_off(WL, g) + 64 * u);
          wb[u] = lds128(sb + wrow_off(WL, g + 8) + 64 * u);
        }
#endif
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (u == 0 || i0 + u < cnt_full) step(i0 + u, u, ss_tag);
      if constexpr (kWsm) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        const int q = i0 / SPS;
        if ((i0 + U) % SPS == 0 && q + NS < nstage) {  // the warp is done with stage q: refill it
          __syncwarp();
          issue(q + NS);
        }
#endif
      }
      pa += 32 * U;
      pb += 32 * U;
      px0 += 32 * U;
      if (kG) pg += 32 * U;
    }
    if (has_tail) {  // the partial last step of K (K % 32 != 0): lanes past K read zeros
      const int o = 32 * (cnt_full - i0);
      uint4 xs[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) xs[j] = tail_ok ? frms::ld_cached(px0 + xoff[j] + o) : zero;
      const uint4 gv = kG && tail_ok ? frms::ld_cached(pg + o) : zero;
      compute(tail_ok ? ld_w<kEF>(pa + o, pol) : zero, tail_ok ? ld_w<kEF>(pb + o, pol) : zero, xs, gv, ss_tag);
    }
  };
  if (do_ss)
    run(std::true_type{});
  else
    run(std::false_type{});

  // ---- reduction: warps of a CTA (shared memory), then the CTAs of the cluster (DSMEM)
  float* red = smem;                        // [n_wk][TOK][RS]
  float* ss_red = red + n_wk * TOK * RS;    // [n_wk][TOK]
  float* s_rstd = ss_red + n_wk * TOK;      // [TOK]
  if (kWsm) __syncthreads();  // the reduction area aliases the W stages of the other warps
  {
    float* rw = red + wk * TOK * RS + wn * 16;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int tok = 8 * j + 2 * t;
      rw[tok * RS + g] = acc[j][0];
      rw[(tok + 1) * RS + g] = acc[j][1];
      rw[tok * RS + g + 8] = acc[j][2];
      rw[(tok + 1) * RS + g + 8] = acc[j][3];
    }
    if (do_ss) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        float v = ss[j];  // lanes with the same g hold the same token
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (t == 0) ss_red[wk * TOK + 8 * j + g] = v;
      }
    }
  }
  __syncthreads();
  if (n_wk > 1) {  // fold the K-warps into slice 0 (fixed order)
    for (int e = threadIdx.x; e < TOK * BN; e += kThreads) {
      const int o = (e / BN) * RS + e % BN;
      float s = red[o];
      for (int q = 1; q < n_wk; ++q) s += red[q * TOK * RS + o];
      red[o] = s;
    }
    if (threadIdx.x < TOK) {
      float s = ss_red[threadIdx.x];
      for (int q = 1; q < n_wk; ++q) s += ss_red[q * TOK + threadIdx.x];
      ss_red[threadIdx.x] = s;
    }
  }
  cluster_or_cta_sync(ks);  // every CTA's slice 0 is final and visible cluster-wide

  if (threadIdx.x < TOK) {
    float s = 0.f;
    for (int q = 0; q < ks; ++q) s += cluster_smem(ss_red, q, ks)[threadIdx.x];
    s_rstd[threadIdx.x] = rsqrtf(s / float(p.K) + p.eps);
  }
  __syncthreads();

  // outputs: groups of 4 consecutive n of one token; the cluster's CTAs take equal shares
  const int mv = int(p.M - m0 < TOK ? p.M - m0 : TOK);
  const int groups = BN / 4, items = mv * groups;
  const int per = (items + ks - 1) / ks;
  const int i_end = min(items, (rank + 1) * per);
  const T* bias = static_cast<const T*>(p.bias);
  T* Y = static_cast<T*>(p.y);
  for (int it = rank * per + int(threadIdx.x); it < i_end; it += kThreads) {
    const int tok = it / groups, c = (it % groups) * 4;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    for (int q = 0; q < ks; ++q) {
      const float4 u = *reinterpret_cast<const float4*>(cluster_smem(red, q, ks) + tok * RS + c);
      v[0] += u.x;
      v[1] += u.y;
      v[2] += u.z;
      v[3] += u.w;
    }
    const float rs = s_rstd[tok];
    T* yr = Y + (m0 + tok) * p.ldy;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t n = n0 + c + e;
      if (n < p.N) {
        const float b = bias ? frms::to_float<T>(bias[n]) : 0.f;
        yr[n] = frms::from_float<T>(fmaf(v[e], rs, b));
      }
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (ks > 1) cg::this_cluster().sync();  // keep this CTA's shared memory alive for the others' reads
#endif
}

// ------------------------------------------------------------------------------------------ host

using frms::current_device;
using frms::kMaxDevices;

inline int device_sms(int dev) {
  static int cache[kMaxDevices] = {};
  if (cache[dev] == 0) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    cache[dev] = n > 0 ? n : 1;
  }
  return cache[dev];
}

// Cluster split needs an sm_90 device AND kernel code compiled for compute_90+ (a PTX build for an
// older arch JIT-compiled on Hopper has no cluster reduction in it).
template <typename K>
bool cluster_capable(K kernel, int dev) {
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major >= 9 && a.ptxVersion >= 90;
}

// Default W steps in flight per lane: 4 x 2 x 16 B (4 KB per warp; 64 KB per SM at 2 CTAs). Even:
// the x double buffer's parity follows the ring slot. Tuning variants (NT <= 2 only, where the
// registers allow; see frms_decode_mma): 8 steps, and/or plain W loads instead of evict_first.
constexpr int kRing = 4;
constexpr int kRingDeep = 8;

template <typename T, int NT, int U, bool kEF, bool kG, int WL = 0>
int launch(Params p, cudaStream_t s) {
  constexpr int TOK = 8 * NT;
  auto kernel = decode_mma_kernel<T, NT, U, kG, kEF, WL>;
  const int dev = current_device();
  static signed char capable[kMaxDevices];  // 0 unknown, 1 yes, -1 no
  if (capable[dev] == 0) capable[dev] = cluster_capable(kernel, dev) ? 1 : -1;
  const bool clusters = capable[dev] > 0;
  if (WL >= 2 && !clusters) return FRMS_ERR_UNSUPPORTED;  // cp.async.bulk: sm_90 code on an sm_90 device
  // W stages (wload 2 / 3) share the dynamic smem with the reduction area (used after the loop)
  constexpr size_t kStage = wstage_smem(WL);
  auto smem_of = [&](size_t red) { return red > kStage ? red : kStage; };
  static signed char opted[kMaxDevices];  // > 48 KB of dynamic smem needs the opt-in
  if (kStage > 48 * 1024 && opted[dev] == 0) {
    opted[dev] = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kStage)) == cudaSuccess
                     ? 1
                     : -1;
    cudaGetLastError();
  }
  if (kStage > 48 * 1024 && opted[dev] < 0) return FRMS_ERR_UNSUPPORTED;
  // resident CTAs per SM of this instantiation (registers bound it: 2 at __launch_bounds__(256, 2));
  // the smem of wn = 1 (the largest) is the conservative size
  static signed char per_sm[kMaxDevices];
  if (per_sm[dev] == 0) {
    int n = 0;
    const size_t smem1 = smem_of(sizeof(float) * size_t(kWarps * TOK * (16 + 4) + kWarps * TOK + TOK));
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem1) != cudaSuccess || n <= 0) {
      cudaGetLastError();
      n = 2;
    }
    per_sm[dev] = static_cast<signed char>(n < 32 ? n : 32);
  }
  frms::decode_mma_auto_config(p.M, p.N, p.K, TOK, clusters, device_sms(dev), per_sm[dev], p.wn, p.ksplit);
  if (p.wn != 1 && p.wn != 2 && p.wn != 4 && p.wn != 8) return FRMS_ERR_BAD_ARG;
  if (p.ksplit < 1 || p.ksplit > kMaxKsplit) return FRMS_ERR_BAD_ARG;
  if (p.ksplit > 1 && !clusters) return FRMS_ERR_UNSUPPORTED;
  const int64_t bn = 16 * p.wn;
  const int64_t gx = (p.N + bn - 1) / bn, gz = (p.M + TOK - 1) / TOK;
  if (gx > 0x7fffffff || gz > 65535) return FRMS_ERR_BAD_ARG;
  if (int64_t(TOK) * p.ldx >= (int64_t(1) << 31)) return FRMS_ERR_BAD_ARG;  // 32-bit x row offsets
  const int wk = kWarps / p.wn;
  const size_t smem = smem_of(sizeof(float) * size_t(wk * TOK * (bn + 4) + wk * TOK + TOK));

  if (p.ksplit > 8) {
    static signed char nonportable[kMaxDevices];
    if (nonportable[dev] == 0) {
      nonportable[dev] =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess ? 1 : -1;
      cudaGetLastError();
    }
    if (nonportable[dev] < 0) return FRMS_ERR_UNSUPPORTED;
  }
  return frms::launch_clustered(kernel, dim3(unsigned(gx), unsigned(p.ksplit), unsigned(gz)), dim3(kThreads, 1, 1),
                                smem, s, dim3(1, unsigned(p.ksplit), 1), p);
}

// The (U, kEF) instances compiled for NT tiles: the default (kRing, evict_first) for every NT; for
// NT <= 2 also plain loads and the deep ring. The deep ring of NT = 2 with g in-kernel (functional
// path) would spill (ptxas: 128 registers + 56 B of spills), so that combination runs kRing: steps is
// a performance hint, never a correctness one. FRMS_MMA_LIGHT (CI compile check): the variants for
// bf16 and 8 tokens only (every template path still compiles once).
#ifdef FRMS_MMA_LIGHT
template <typename T, int NT>
constexpr bool kVariants = std::is_same<T, __nv_bfloat16>::value && NT == 1;
#else
template <typename T, int NT>
constexpr bool kVariants = true;
#endif

// wload 1..3 (see the header): NT <= 2, kRing, evict_first only (ldpolicy must be 0, steps 4).
template <typename T, int NT, bool kG>
int launch_variant(const Params& p, int steps, bool ef, int wload, cudaStream_t s) {
  if (wload != 0) {
    if constexpr (NT <= 2 && kVariants<T, NT>) {
      if (steps != kRing || !ef) return FRMS_ERR_VARIANT;
      if (wload == 1) return launch<T, NT, kRing, true, kG, 1>(p, s);
      if (wload == 2) return launch<T, NT, kRing, true, kG, 2>(p, s);
      if (wload == 3) return launch<T, NT, kRing, true, kG, 3>(p, s);
    }
    return FRMS_ERR_VARIANT;
  }
  if (steps == kRing && ef) return launch<T, NT, kRing, true, kG>(p, s);
  if constexpr (NT <= 2 && kVariants<T, NT>) {
    if constexpr (NT == 1 || !kG) {
      if (steps == kRingDeep)
        return ef ? launch<T, NT, kRingDeep, true, kG>(p, s) : launch<T, NT, kRingDeep, false, kG>(p, s);
    }
    return ef ? launch<T, NT, kRing, true, kG>(p, s) : launch<T, NT, kRing, false, kG>(p, s);
  }
  return FRMS_ERR_VARIANT;
}

template <typename T, bool kG>
int launch_nt(const Params& p, int steps, bool ef, int wload, cudaStream_t s) {
  const int64_t mv = p.M;  // rows per chunk: the smallest of 8 / 16 / 32 that covers M
  if (mv <= 8) return launch_variant<T, 1, kG>(p, steps, ef, wload, s);
  if (mv <= 16) return launch_variant<T, 2, kG>(p, steps, ef, wload, s);
  return launch_variant<T, 4, kG>(p, steps, ef, wload, s);
}

template <typename T>
int launch_g(const Params& p, int steps, bool ef, int wload, cudaStream_t s) {
  return p.g ? launch_nt<T, true>(p, steps, ef, wload, s) : launch_nt<T, false>(p, steps, ef, wload, s);
}
}  // namespace

extern "C" int frms_decode_mma(int dtype, const void* x, int64_t ldx, const void* g, const void* w, int64_t ldw,
                               const void* bias, void* y, int64_t ldy, int64_t M, int64_t N, int64_t K, float eps,
                               int wn, int ksplit, int steps, int ldpolicy, int wload, void* stream) {
  if (M <= 0 || N <= 0) return 0;
  if (K <= 0 || K % frms::kVec || ldx % frms::kVec || ldw % frms::kVec) return FRMS_ERR_BAD_ARG;
  if (!frms::aligned16(x) || !frms::aligned16(w) || (g && !frms::aligned16(g))) return FRMS_ERR_BAD_ARG;
  if (wn != 0 && wn != 1 && wn != 2 && wn != 4 && wn != 8) return FRMS_ERR_BAD_ARG;
  if (ksplit < 0 || ksplit > kMaxKsplit) return FRMS_ERR_BAD_ARG;
  if (steps == 0) steps = kRing;
  if (steps != kRing && steps != kRingDeep) return FRMS_ERR_BAD_ARG;
  if (ldpolicy != 0 && ldpolicy != 1) return FRMS_ERR_BAD_ARG;
  if (wload < 0 || wload > 3) return FRMS_ERR_BAD_ARG;
  Params p{x, ldx, g, w, ldw, bias, y, ldy, M, N, K, eps, wn, ksplit};
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  int st = FRMS_ERR_BAD_ARG;
  if (dtype == FRMS_DTYPE_F16)
    st = launch_g<__half>(p, steps, ldpolicy == 0, wload, s);
  else if (dtype == FRMS_DTYPE_BF16)
    st = launch_g<__nv_bfloat16>(p, steps, ldpolicy == 0, wload, s);
  return st != 0 ? st : int(cudaGetLastError());
}
