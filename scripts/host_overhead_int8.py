"""Python host cost per call of the int8 public API, kernel launches stubbed (CPU, no GPU needed).

    python scripts/host_overhead_int8.py [--dispatcher] [--triton [--no-direct]]

Default: the Triton kernels' ``__getitem__`` is replaced by a no-op launcher and the backend is
forced to the GPU branch, so what is timed is exactly our wrapper: checks, scale normalisation,
config lookup, output/workspace allocation and argument preparation (CPU tensors stand in for
CUDA ones; allocation of a CPU tensor costs about what the CUDA caching allocator does).

--triton: stub at the lowest level instead. Triton's runtime runs for real (JITFunction.run:
binding, specialization, cache key, TensorDescriptor handling, or our direct launch of the cached
kernel, llmk_common/direct.py) against a fake CUDA driver; only compilation (a fake CompiledKernel) and
the C launcher (a no-op ``run``) are stubbed. --no-direct: INT8_GEMM_DIRECT_LAUNCH=0.
Run it with the GPU machine's Triton first on PYTHONPATH (PYTHONPATH=/work/tri36) to match it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "int8-gemm" / "src"))

import int8_gemm  # noqa: E402
from int8_gemm import _common  # noqa: E402
from int8_gemm.ops import gemm as G  # noqa: E402
from int8_gemm.ops import linear as L  # noqa: E402
from int8_gemm.ops import quantize as Q  # noqa: E402


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *a, **k: None


def stub(dispatcher: bool, triton_rt: bool = False) -> None:
    for mod in (G, L, Q):
        if hasattr(mod, "select_backend"):
            mod.select_backend = lambda device, **k: _common.Backend.GPU
        if hasattr(mod, "use_registered_op") and dispatcher:
            mod.use_registered_op = lambda *t: True
    if triton_rt:
        stub_triton()
    else:
        for name in dir(G):
            if name.startswith("_") and name.endswith("_kernel"):
                setattr(G, name, _NoLaunch())
        Q._quantize_rows_kernel = _NoLaunch()
    # CPU malloc of a multi-MB tensor page-faults; the CUDA caching allocator does not. Reuse
    # buffers per (shape, dtype) so allocation costs what a cache hit costs.
    real_empty, pool = torch.empty, {}

    def empty(*shape, dtype=None, device=None, **kw):
        shp = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        key = (shp, dtype)
        if key not in pool:
            pool[key] = real_empty(shp, dtype=dtype, device=device, **kw)
        return pool[key].as_strided(pool[key].shape, pool[key].stride())

    torch.empty = empty
    getattr(G._arch, "cache_clear", lambda: None)()  # memoized in some versions
    G._arch = lambda device: "sm90"
    G.num_sms = lambda device, default=4: 132
    if hasattr(G, "_plan_cache"):
        G._plan_cache.clear()


class _FakeKernel:
    """Stands in for a CompiledKernel: the launcher is a no-op taking the real argument list."""

    function = 0
    packed_metadata = ()

    @staticmethod
    def run(*args):
        return None

    def launch_metadata(self, *a):
        return None


def stub_triton() -> None:
    """Fake CUDA driver + fake compile: everything of Triton's launch path but the C launcher."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver as drv
    from triton.runtime.jit import JITFunction

    class FakeDriver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def __getattr__(self, name):
            raise AttributeError(name)

    drv.set_active(FakeDriver())

    def fake_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        k = _FakeKernel()
        self.device_caches[device][0][key] = k
        return k

    JITFunction._do_compile = fake_compile
    torch._C._cuda_getDevice = lambda: 0
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    torch.cuda.is_available = lambda: True
    torch.cuda.current_device = lambda: 0
    torch.cuda.is_current_stream_capturing = lambda: False
    counters = torch.zeros(8, 8192, dtype=torch.int32)
    G._tile_counters = lambda device, n: counters[0]
    print(f"triton {triton.__version__} runtime, fake driver", flush=True)


def per_call_us(fn, n=3000) -> float:
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dispatcher", action="store_true", help="force the torch.library custom-op path")
    ap.add_argument("--triton", action="store_true", help="Triton's runtime for real, only the C launcher stubbed")
    ap.add_argument("--no-direct", action="store_true", help="with --triton: the normal kernel[grid] path")
    args = ap.parse_args()
    if args.no_direct:
        from int8_gemm._common import direct as _direct

        _direct.ENABLED = False
    elif args.triton:
        from int8_gemm._common import direct as _direct

        _direct.ENABLED = True
    stub(args.dispatcher, args.triton)
    torch.manual_seed(0)
    rows = []
    for M, N, K in ((2048, 2048, 2048), (1, 4096, 4096), (16, 4096, 14336), (1024, 4096, 4096), (1024, 14336, 4096)):
        a = torch.randint(-127, 128, (M, K), dtype=torch.int8)
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8)
        sa, sb = torch.rand(M), torch.rand(N)
        lin = int8_gemm.Int8Linear(K, N, bias=False)
        lin.weight.copy_(w)
        x = torch.randn(M, K, dtype=torch.bfloat16)
        g = per_call_us(lambda: int8_gemm.int8_gemm_dequant_fwd(a, w.t(), sa, sb, out_dtype=torch.bfloat16))  # noqa: B023
        e = per_call_us(lambda: lin(x))  # noqa: B023
        rows.append((M, N, K, g, e))
    mode = "Triton runtime, C launcher stubbed" if args.triton else "launches stubbed"
    if args.triton:
        mode += ", direct launch " + ("off" if args.no_direct else "on")
    print(f"host cost per call (us, {mode}{', custom-op dispatcher' if args.dispatcher else ''})")
    print("     M      N      K  int8_gemm_dequant_fwd  Int8Linear.forward")
    for M, N, K, g, e in rows:
        print(f"{M:>6} {N:>6} {K:>6}  {g:21.1f}  {e:18.1f}")


if __name__ == "__main__":
    main()
