"""hatchling build hook: compile the CUDA extension into the wheel when nvcc is available.

* FUSED_RMSNORM_BUILD=0 skips it (a pure-Python wheel whose first CUDA call JIT-compiles the
  shipped csrc/), as does a machine without nvcc (with a message).
* The arch list comes from src/fused_rmsnorm/build_config.json, overridable by
  FUSED_RMSNORM_CUDA_ARCH_LIST or TORCH_CUDA_ARCH_LIST.
* A wheel with the extension is platform-specific (pure_python False, tag inferred).
The build logic itself lives in src/fused_rmsnorm/_build.py (shared with the JIT path); it is
loaded by file path so the hook never imports the package (and torch).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _load_build_module(root: str):
    path = Path(root) / "src" / "fused_rmsnorm" / "_build.py"
    spec = importlib.util.spec_from_file_location("_fused_rmsnorm_build", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


class CustomBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return  # the sdist ships csrc/ for JIT; nothing to compile
        if os.environ.get("FUSED_RMSNORM_BUILD", "1").strip() == "0":
            self.app.display_info("fused_rmsnorm: FUSED_RMSNORM_BUILD=0, building a JIT-only wheel")
            return
        b = _load_build_module(self.root)
        if b.find_nvcc() is None:
            self.app.display_warning("fused_rmsnorm: nvcc not found, building a JIT-only wheel (no AOT extension)")
            return
        archs = b.resolve_arch_list()
        self._tmp = Path(tempfile.mkdtemp(prefix="frms_wheel_"))
        target = b.build(self._tmp, archs)
        build_data["force_include"][str(target)] = f"fused_rmsnorm/{target.name}"
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
