"""The SM90 TMA forward (_attn_fwd_tma_kernel): host 4-D descriptors, in-kernel descriptors, warp-specialized.

CPU: the Triton interpreter emulates tensor descriptors, so all three flavours run on tiny fp16 shapes
(GQA, bottom-right causal with Nq != Nk both ways, (B, N, H, D) views, padded head dims, LSE).
GPU (-m gpu): every flavour at real sizes, fp16 + bf16, vs a float32 reference.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import flashattn_triton as fa
import pytest
import torch
from flashattn_triton.ops import flash_attn as F

_spec = importlib.util.spec_from_file_location("_fa_ref", Path(__file__).with_name("_ref.py"))
_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ref)
ref_attention, rand = _ref.ref_attention, _ref.rand

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # log2(0) for rows that see no key

FLAVOURS = {
    "host": dict(TMA=1),
    "device": dict(TMA=1, DEVICE_DESC=1),
    "ws": dict(TMA=1, WS=1),
}


def _need_interpreter():
    if F.select_backend(torch.device("cpu")) != F.Backend.INTERPRETER:
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1)")


def _run(q, k, v, causal, cfg):
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    lse = torch.full(q.shape[:3], float("nan"), device=q.device, dtype=torch.float32)
    assert F.fwd_tma_ok(q, k, v, out)
    F._fwd_launch(q, k, v, out, lse, causal, q.shape[-1] ** -0.5, cfg)
    return out, lse


def _check(out, lse, want, want_lse, tol):
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    err = (out.double() - want.double()).abs().max().item()
    assert err <= tol * max(want.abs().max().item(), 1.0), f"out err {err:.3e}"
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse)), "LSE -inf rows differ"
    fin = ~torch.isinf(want_lse)
    assert (lse[fin].double() - want_lse[fin].double()).abs().max().item() < 1e-3


# (B, H, Hkv, Nq, Nk, D, causal): GQA, Nq > Nk (rows with no key), Nq < Nk, padded D (40 -> 64, 24 -> 32)
CPU_CASES = [
    (1, 2, 1, 37, 53, 32, True),
    (1, 2, 2, 45, 29, 40, True),
    (2, 2, 1, 33, 33, 24, False),
]


@pytest.mark.parametrize("flavour", list(FLAVOURS))
@pytest.mark.parametrize("case", CPU_CASES)
def test_tma_forward_cpu_interpreter(case, flavour, monkeypatch):
    _need_interpreter()
    B, H, Hkv, Nq, Nk, D, causal = case
    torch.manual_seed(Nq * 7 + Nk)
    q = rand(B, Nq, H, D).transpose(1, 2)  # (B, N, H, D) storage viewed as (B, H, N, D): no copy
    k, v = rand(B, Hkv, Nk, D), rand(B, Nk, Hkv, D).transpose(1, 2)
    cfg = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, **FLAVOURS[flavour])
    out, lse = _run(q, k, v, causal, cfg)
    want, want_lse = ref_attention(q, k, v, causal)
    _check(out, lse, want, want_lse, 2e-3)


def test_tma_eligibility():
    q, k, v = rand(1, 2, 16, 32), rand(1, 1, 16, 32), rand(1, 1, 16, 32)
    assert F.fwd_tma_ok(q, k, v, torch.empty_like(q))
    assert not F.fwd_tma_ok(q.float(), k.float(), v.float(), torch.empty_like(q.float()))  # fp32: exact kernel
    # a head stride that is not a 16-byte multiple (head dim 36 padded in storage to 36): pointer path
    odd = rand(1, 2, 16, 36)[..., :32]
    assert not F.fwd_tma_ok(odd, k, v, torch.empty_like(q))
    # unaligned base pointer
    flat = rand(2 * 16 * 32 + 1)[1:].view(1, 2, 16, 32)
    assert not F.fwd_tma_ok(flat, k, v, torch.empty_like(q))


def test_tma_candidates_well_formed():
    for D in (32, 64, 80, 128):
        cands = F.fwd_tma_candidates(D, torch.bfloat16)
        assert cands and all(c["TMA"] == 1 and c["BLOCK_M"] == 128 and not c.get("WS") for c in cands)
    assert F.fwd_tma_candidates(256, torch.bfloat16) == []  # only a WS variant fitted D256
    assert F.fwd_tma_candidates(128, torch.float32) == []


def test_ws_only_where_enabled(monkeypatch):
    monkeypatch.delenv("FLASHATTN_TRITON_EXPERIMENTAL_WS", raising=False)
    assert F._ws_enabled(torch.device("cpu"))
    assert not F._ws_enabled(torch.device("cuda"))
    monkeypatch.setenv("FLASHATTN_TRITON_EXPERIMENTAL_WS", "1")
    assert F._ws_enabled(torch.device("cuda"))


def test_public_api_unchanged_off_table(monkeypatch):
    # a TMA config that cannot apply (fp32) silently uses the pointer kernel with the same tiles
    _need_interpreter()
    monkeypatch.setattr(
        F, "_table_config", lambda *a, **kw: dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, TMA=1, WS=1)
    )
    q, k, v = (rand(1, 2, 21, 16, dtype=torch.float32) for _ in range(3))
    out, lse = fa.flash_attn_forward(q, k, v, causal=True, return_lse=True)
    want, want_lse = ref_attention(q, k, v, True)
    _check(out, lse, want, want_lse, 2e-5)


# ---- GPU ------------------------------------------------------------------------------------


def _gpu_cfg(flavour, D):
    if flavour == "ws":
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2, TMA=1, WS=1)
    return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, **FLAVOURS[flavour])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128, 80])
@pytest.mark.parametrize("flavour", ["host", "ws", "device"])
@pytest.mark.parametrize("N", [257, 4097])
def test_gpu_tma_forward_vs_fp32(N, flavour, D, causal, dtype):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs SM90+")
    torch.manual_seed(N + D)
    B, H, Hkv = 2, 4, 2  # GQA
    q = rand(B, N, H, D, dtype=dtype, device="cuda").transpose(1, 2)  # strided (B, N, H, D) view
    k = rand(B, Hkv, N + 31, D, dtype=dtype, device="cuda")  # Nk != Nq: bottom-right causal
    v = rand(B, N + 31, Hkv, D, dtype=dtype, device="cuda").transpose(1, 2)
    out, lse = _run(q, k, v, causal, _gpu_cfg(flavour, D))
    want, want_lse = ref_attention(q, k, v, causal, dtype=torch.float32)
    rel = ((out.float() - want).norm() / want.norm()).item()
    assert rel < (2e-2 if dtype == torch.bfloat16 else 5e-3), rel
    assert (lse - want_lse).abs().max().item() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("flavour", ["host", "ws"])
def test_gpu_tma_forward_long_odd(flavour, causal):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs SM90+")
    torch.manual_seed(1)
    N, D = 8191, 128
    q, k, v = (rand(1, 2, N, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    out, lse = _run(q, k, v, causal, _gpu_cfg(flavour, D))
    want, want_lse = ref_attention(q, k, v, causal, dtype=torch.float32)
    assert ((out.float() - want).norm() / want.norm()).item() < 2e-2
    assert (lse - want_lse).abs().max().item() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_public_entry_uses_shipped_sm90_table(causal):
    # whatever the table picks (TMA or pointer), the public op must agree with SDPA where semantics match
    torch.manual_seed(2)
    q, k, v = (rand(2, 8, 2048, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    got = fa.flash_attn_forward(q, k, v, causal=causal)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert ((got.float() - want).norm() / want.norm()).item() < 2e-2
