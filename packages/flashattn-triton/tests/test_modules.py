"""FlashAttention nn.Module: same numbers as the function, gradients flow, repr."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import flashattn_triton as fa
import pytest
import torch

_spec = importlib.util.spec_from_file_location("_fa_ref", Path(__file__).with_name("_ref.py"))
_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ref)


@pytest.mark.parametrize("causal", [False, True])
def test_module_matches_reference_and_backprops(causal):
    torch.manual_seed(0)
    m = fa.FlashAttention(causal=causal, sm_scale=0.2)
    q = _ref.rand(2, 4, 13, 16, requires_grad=True)
    k, v = _ref.rand(2, 2, 19, 16), _ref.rand(2, 2, 19, 16)
    out = m(q, k, v)
    want, _ = _ref.ref_attention(q.detach(), k, v, causal, sm_scale=0.2)
    assert (out.double() - want).abs().max().item() < 2e-3
    out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0
    assert f"causal={causal}" in repr(m)


def test_public_api():
    assert fa.__version__ == "0.1.0"
    assert set(fa.__all__) >= {"FlashAttention", "flash_attn_forward", "flash_attn_varlen_forward", "__version__"}
