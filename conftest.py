"""Repo-wide pytest setup: the ``gpu`` marker skips, with a reason, where no CUDA GPU is present."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run scripts/gpu_run.sh or `nox -s gpu` on a CUDA machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_gluon_launch(monkeypatch):
    """CPU stand-ins for a Gluon kernel module's launch path (``_fwd_sm90``, ``_gemm_sm90``), so the
    tests of its launch plan run without a GPU or Gluon: ``install(mod, kernel_attr, fn)`` replaces the
    kernel by a fake whose ``[grid](...)`` records a normal launch and returns a compiled kernel whose
    ``run`` records direct launches (``fn`` gives the kernel's signature), fakes TensorDescriptor and
    gl's layouts/dtypes, enables direct launch with empty hook chains, a 132-SM device 0 on stream 77,
    and clears the plan cache. Returns ``{"normal": [(grid, args, kw)], "direct": [run args]}``."""

    def install(mod, kernel_attr, fn):
        calls = {"normal": [], "direct": []}

        class FakeCompiled:
            function, packed_metadata = 5, ("md",)

            def run(self, *a):
                calls["direct"].append(a)

        class FakeKernel:
            def __init__(self):
                self.fn = fn

            def __getitem__(self, grid):
                def go(*args, **kw):
                    calls["normal"].append((grid, args, kw))
                    return FakeCompiled()

                return go

        class FakeDesc:
            def __init__(self, base, shape, strides, block, layout):
                self.base, self.shape, self.strides, self.block, self.layout = base, shape, strides, block, layout

        class FakeGl:
            int8, int32, bfloat16, float16, float32 = "i8", "i32", "bf16", "fp16", "fp32"

            class NVMMASharedLayout:
                @staticmethod
                def get_default_for(block, dt):
                    return ("layout", tuple(block), dt)

        props = type("P", (), {"multi_processor_count": 132})()
        monkeypatch.setattr(mod, kernel_attr, FakeKernel(), raising=False)
        monkeypatch.setattr(mod, "TensorDescriptor", FakeDesc, raising=False)
        monkeypatch.setattr(mod, "gl", FakeGl, raising=False)
        monkeypatch.setattr(mod.direct, "ENABLED", True)
        chain = type("HookChain", (), {"calls": []})  # Triton's launch hook chains, empty (no profiler)
        hooks = type("R", (), {"launch_enter_hook": chain(), "launch_exit_hook": chain()})
        monkeypatch.setattr(mod.direct, "_knobs", type("K", (), {"runtime": hooks}))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
        monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: 77, raising=False)
        monkeypatch.setattr(mod, "_PLANS", {})
        return calls

    def first_launches(calls, n_desc: int = 3):
        """(grid, normal args, normal kwargs, direct args) of the first normal and first direct launch,
        after checking that the direct one ran the captured function on the same grid and stream and that
        its descriptor stand-ins carry the normal launch's bases, shapes and strides."""
        grid, nargs, kw = calls["normal"][0]
        d = calls["direct"][0]
        assert d[:7] == (grid[0], 1, 1, 77, 5, ("md",), None)
        dargs = d[9:]
        for nd, dd in zip(nargs[:n_desc], dargs[:n_desc]):
            assert dd.base is nd.base and list(dd.shape) == list(nd.shape) and list(dd.strides) == list(nd.strides)
            assert dd.padding == "zero"
        return grid, nargs, kw, dargs

    install.first_launches = first_launches
    return install
