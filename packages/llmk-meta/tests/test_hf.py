"""patch_model on a tiny randomly initialised transformers LlamaForCausalLM (built from a config: no downloads).

Tolerances: CPU float32 logits within 1e-4 (abs) of the unpatched model; GPU fp16/bf16 within a few
hundredths relative to the logits' scale; int8 (W8A8 on o_proj/down_proj) within a relative
error of 5% of the logits' RMS. Greedy ``generate()`` must produce identical tokens.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install llmk-meta[hf])")

import llm_kernels  # noqa: E402
from llm_kernels import hf  # noqa: E402

CFG = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    initializer_range=0.1,  # wider than the 0.02 default so logits are well separated (stable greedy tokens)
)


def _tiny_llama(seed: int = 0, **over) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**CFG, **over})
    model = transformers.LlamaForCausalLM(config)
    # RMSNorm weights start at 1: make them non-trivial so folding them into the projections is tested.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    return model.eval()


def _stats() -> dict[str, int]:
    return dict(hf.ATTN_STATS)


def _delta(before: dict[str, int]) -> dict[str, int]:
    return {k: hf.ATTN_STATS.get(k, 0) - before.get(k, 0) for k in hf.ATTN_STATS}


def test_patch_model_structure_and_summary():
    model = _tiny_llama()
    out = llm_kernels.patch_model(model)
    assert out is model
    s = model._llmk_patched
    assert s["attention"] == "llm_kernels" and model.config._attn_implementation == "llm_kernels"
    assert len(s["fused_norm_linear"]) == 4 and s["skipped"] == [] and s["int8"] == []
    layer = model.model.layers[0]
    assert isinstance(layer.input_layernorm, hf.NormPassthrough)
    assert isinstance(layer.self_attn.q_proj, hf.FusedProjection)
    assert isinstance(layer.mlp.up_proj, hf.FusedProjection)
    # parameters are registered exactly once (on the fused modules), none lost or duplicated
    n_before = sum(p.numel() for p in _tiny_llama().parameters())
    assert sum(p.numel() for p in model.parameters()) == n_before
    # each fused norm+multi-linear runs ONCE per layer forward although q/k/v (gate/up) are three (two) calls
    calls = []
    for lyr in model.model.layers:
        lyr.llmk_qkv.register_forward_hook(lambda *a: calls.append("qkv"))
        lyr.llmk_gate_up.register_forward_hook(lambda *a: calls.append("gate_up"))
    with torch.no_grad():
        model(torch.randint(0, CFG["vocab_size"], (1, 5)))
    assert calls == ["qkv", "gate_up"] * CFG["num_hidden_layers"]
    # patching again is a no-op
    llm_kernels.patch_model(model)
    assert len(model._llmk_patched["fused_norm_linear"]) == 4


@pytest.mark.parametrize("attention,fused", [(True, True), (True, False), (False, True)])
def test_logits_match_unpatched_cpu_fp32(attention, fused):
    ref = _tiny_llama(seed=1)
    model = llm_kernels.patch_model(copy.deepcopy(ref), attention=attention, fused_norm_linear=fused)
    ids = torch.randint(0, CFG["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    before = _stats()
    with torch.no_grad():
        want = ref(ids).logits
        got = model(ids).logits
    assert got.shape == (2, 9, CFG["vocab_size"])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    d = _delta(before)
    assert d["kernel"] == (CFG["num_hidden_layers"] if attention else 0) and d["fallback"] == 0


def test_generate_greedy_identical_cpu():
    ref = _tiny_llama(seed=2)
    model = llm_kernels.patch_model(copy.deepcopy(ref))
    prompt = torch.randint(0, CFG["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    before = _stats()
    with torch.no_grad():
        want = ref.generate(prompt, **kw)
        got = model.generate(prompt, **kw)
    assert want.shape == (1, 12)
    assert torch.equal(got, want)
    d = _delta(before)
    # prefill + 5 decode steps (the 6th token needs no forward) through the kernel, per layer
    assert d["kernel"] >= 6 * CFG["num_hidden_layers"] and d["fallback"] == 0


def test_padding_mask_falls_back_and_stays_correct():
    """Left padding cannot be expressed by the causal kernel: SDPA runs with the real mask instead."""
    ref = _tiny_llama(seed=3)
    model = llm_kernels.patch_model(copy.deepcopy(ref))
    ids = torch.randint(0, CFG["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, :3] = 0
    before = _stats()
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
        got = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[0, 3:], want[0, 3:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)
    d = _delta(before)
    assert d["fallback"] == CFG["num_hidden_layers"] and d["kernel"] == 0
    # an all-ones mask is plain causal again: the kernel runs
    before = _stats()
    with torch.no_grad():
        model(ids, attention_mask=torch.ones_like(mask))
    assert _delta(before)["kernel"] == CFG["num_hidden_layers"]


def test_unsupported_head_dim_falls_back():
    """head_dim 12 is not a kernel size (multiples of 8): every call goes to SDPA, results unchanged."""
    ref = _tiny_llama(seed=7, hidden_size=48, num_attention_heads=4, num_key_value_heads=2)
    model = llm_kernels.patch_model(copy.deepcopy(ref))
    ids = torch.randint(0, CFG["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(7))
    before = _stats()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
    assert _delta(before) == {"kernel": 0, "fallback": CFG["num_hidden_layers"]}


def test_int8_patch_close_to_float():
    ref = _tiny_llama(seed=4)
    model = llm_kernels.patch_model(copy.deepcopy(ref), int8=True)
    s = model._llmk_patched
    # q/k/v and gate/up are fused (float); o_proj and down_proj of both layers are int8
    assert sorted(s["int8"]) == sorted(
        f"model.layers.{i}.{m}" for i in range(2) for m in ("self_attn.o_proj", "mlp.down_proj")
    )
    assert isinstance(model.model.layers[1].mlp.down_proj, llm_kernels.Int8Linear)
    ids = torch.randint(0, CFG["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = ref(ids).logits
        got = model(ids).logits
    rel = (got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()
    assert 0 < rel < 0.05, rel
    # without fusion every decoder Linear is swapped
    m2 = llm_kernels.patch_model(copy.deepcopy(ref), attention=False, fused_norm_linear=False, int8=True)
    assert len(m2._llmk_patched["int8"]) == 2 * 7


def test_non_rmsnorm_is_not_folded():
    """A norm that is not x*rsqrt(mean(x^2)+eps)*w (here Gemma-style (1+w)) must be left alone."""

    class OnePlusRMSNorm(torch.nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(dim) * 0.1)
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    ref = _tiny_llama(seed=5)
    for layer in ref.model.layers:
        layer.input_layernorm = OnePlusRMSNorm(CFG["hidden_size"])
    model = llm_kernels.patch_model(copy.deepcopy(ref))
    s = model._llmk_patched
    assert len(s["fused_norm_linear"]) == 2  # only post_attention_layernorm of each layer
    assert any("not a plain RMSNorm" in why for why in s["skipped"])
    ids = torch.randint(0, CFG["vocab_size"], (1, 5), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_logits_and_generate(dtype):
    ref = _tiny_llama(seed=6, hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=2)
    ref = ref.to("cuda", dtype)
    model = llm_kernels.patch_model(copy.deepcopy(ref))
    ids = torch.randint(0, CFG["vocab_size"], (2, 40), device="cuda")
    before = _stats()
    with torch.no_grad():
        want = ref(ids).logits.float()
        got = model(ids).logits.float()
    assert _delta(before)["kernel"] == CFG["num_hidden_layers"]
    scale = want.abs().max().item()
    tol = (2e-2 if dtype == torch.float16 else 6e-2) * max(scale, 1.0)
    torch.testing.assert_close(got, want, rtol=0, atol=tol)
    prompt = ids[:1, :12]
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(model.generate(prompt, **kw), ref.generate(prompt, **kw))
