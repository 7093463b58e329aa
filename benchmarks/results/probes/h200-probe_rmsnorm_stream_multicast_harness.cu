// Session 32 probe harness (not project code): the wgmma stream decode kernel with x by TMA multicast, standalone (no torch).
// Build next to csrc/ with the patch h200-probe_rmsnorm_stream_multicast.patch applied, from a copy of decode_stream.cu
// that also has the FRMS_STREAM_TRACE stamps (g_trace: %globaltimer / %smid per CTA; g_it: clock64 per k-block, CTAs 0-3):
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -DNDEBUG -I. -DFRMS_STREAM_WGMMA=1 -gencode=arch=compute_90a,code=sm_90a
// Records: benchmarks/results/logs/h200-s32-harness-stream-multicast.txt.
// standalone probe of the stream wgmma kernels: occupancy of the cluster launch, timing, per-CTA trace
#define FRMS_STREAM_TRACE 1
#include "decode_stream.cu"
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_bf16.h>

__global__ void fill_rand(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = __float2bfloat16((float(h & 0xffff) / 65536.f - 0.5f) * scale);
  }
}
static bool g_graph = false;
template <int BN, int ST, int WG, int ROWS, int CL>
void run(const char* name, const Params* ps) {
  const Params& p = ps[0];
  using T = __nv_bfloat16;
  auto kernel = stream_wg_kernel<T, BN, ST, WG, ROWS, CL>;
  constexpr size_t smem = size_t(ST) * (ROWS + kTok) * kBK * 2 + 1024;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  const unsigned ctas = unsigned((p.N + ROWS - 1) / ROWS);
  int clusters = -1;
  if (CL > 1) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3((ctas + CL - 1) / CL * CL); cfg.blockDim = dim3(128 * WG + 64); cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1]; attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = CL; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr; cfg.numAttrs = 1;
    cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    if (e) printf("occ err %s\n", cudaGetErrorString(e));
  }
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 5; ++i) launch_wg<T, BN, ST, WG, ROWS, CL>(ps[i % 4], 0);
  cudaStream_t cs; cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
  cudaGraphExec_t ge = nullptr;
  if (g_graph) {
    cudaGraph_t gr;
    cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal);
    for (int i = 0; i < 60; ++i) launch_wg<T, BN, ST, WG, ROWS, CL>(ps[i % 4], cs);
    cudaStreamEndCapture(cs, &gr);
    cudaGraphInstantiate(&ge, gr, 0);
    cudaGraphLaunch(ge, cs); cudaStreamSynchronize(cs);
  }
  cudaEventRecord(a, cs);
  if (g_graph) cudaGraphLaunch(ge, cs);
  else for (int i = 0; i < 60; ++i) launch_wg<T, BN, ST, WG, ROWS, CL>(ps[i % 4], cs);
  cudaEventRecord(b, cs); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  std::vector<uint64_t> tr(4 * 1024);
  cudaMemcpyFromSymbol(tr.data(), g_trace, sizeof(uint64_t) * 4 * 1024);
  const unsigned g = (ctas + CL - 1) / CL * CL;
  uint64_t t0 = ~0ull, t1 = 0; std::vector<double> st, du;
  for (unsigned i = 0; i < g; ++i) { t0 = std::min(t0, tr[4 * i]); t1 = std::max(t1, tr[4 * i + 1]); }
  for (unsigned i = 0; i < g; ++i) { st.push_back((tr[4 * i] - t0) * 1e-3); du.push_back((tr[4 * i + 1] - tr[4 * i]) * 1e-3); }
  std::vector<double> ss = st, dd = du; std::sort(ss.begin(), ss.end()); std::sort(dd.begin(), dd.end());
  printf("%-22s ctas %4u maxclusters %3d  %.2f us/launch (events, back to back)  span %.2f us  start p50 %.2f max %.2f  loop dur min %.2f p50 %.2f max %.2f  err %s\n",
         name, g, clusters, ms * 1000 / 60, (t1 - t0) * 1e-3, ss[g / 2], ss[g - 1], dd[0], dd[g / 2], dd[g - 1], cudaGetErrorString(cudaGetLastError()));
  if (getenv("ITER")) {
    std::vector<long long> it(4 * 128 * 6);
    cudaMemcpyFromSymbol(it.data(), g_it, sizeof(long long) * it.size());
    for (int c = 0; c < 2; ++c) {
      long long b = it[(c * 128 + 0) * 6 + 0];
      printf("  cta %d (cycles from its kt0 top): kt: top / W' landed / x landed / synced | producer j: before empty wait / issued\n", c);
      for (int j = 0; j < 32; ++j) {
        const long long* r = &it[(c * 128 + j) * 6];
        printf("   %2d: %7lld %7lld %7lld %7lld | %7lld %7lld\n", j, r[0] - b, r[1] - b, r[2] - b, r[3] - b, CL > 1 ? r[4] - b : 0, CL > 1 ? r[5] - b : 0);
      }
    }
  }
  if (getenv("DUMP")) for (unsigned i = 0; i < g; ++i) printf("  cta %u sm %llu start %.2f dur %.2f\n", i, (unsigned long long)tr[4*i+2], st[i], du[i]);
}

int main() {
  for (int mode = 0; mode < 4; ++mode) {
    g_graph = mode & 1;
    const bool rnd = mode & 2;
    const int64_t M = 16, K = 4096, N = 14336;
    void *x, *y; void* w[4];
    cudaMalloc(&x, 16 * K * 2); cudaMalloc(&y, 16 * N * 2);
    cudaMemset(x, 0x3c, 16 * K * 2);
    if (rnd) fill_rand<<<256, 256>>>((__nv_bfloat16*)x, 16 * K, 7, 4.f);
    Params ps[4];
    for (int i = 0; i < 4; ++i) {
      cudaMalloc(&w[i], N * K * 2); cudaMemset(w[i], 0x3c, N * K * 2);
      if (rnd) fill_rand<<<1024, 256>>>((__nv_bfloat16*)w[i], size_t(N) * K, 100 + i, 0.1f);
      ps[i] = Params{x, K, w[i], K, nullptr, y, N, M, N, K, 1e-6f, 0};
    }
    cudaDeviceSynchronize();
    printf("M16 K4096 N14336, W' rotated over 4 copies, %s data, %s\n", rnd ? "random" : "constant", g_graph ? "CUDA graph of 60" : "stream launches");
    run<128, 5, 2, 128, 1>("wg2 128x5 c1", ps);
    run<128, 5, 2, 128, 2>("wg2 128x5 c2", ps);
    run<128, 5, 2, 128, 4>("wg2 128x5 c4", ps);
    run<128, 5, 2, 128, 1>("wg2 128x5 c1 again", ps);
    cudaFree(x); cudaFree(y); for (int i = 0; i < 4; ++i) cudaFree(w[i]);
  }
  return 0;
}
