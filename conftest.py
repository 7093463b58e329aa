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
