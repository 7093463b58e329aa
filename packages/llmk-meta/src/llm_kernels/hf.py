"""``patch_model``: run a transformers Llama-family model on the llm-kernel-lib kernels.

Three independent rewrites, each keeping transformers' own ``LlamaDecoderLayer`` / ``LlamaAttention`` /
``LlamaMLP`` forward code valid (nothing of transformers is monkeypatched):

* ``attention``: registers ``"llm_kernels"`` in transformers' ``AttentionInterface`` (and a matching
  mask builder in ``AttentionMaskInterface``) and switches the model to it. The mask builder returns
  ``None`` whenever the mask is plain causal (bottom-right aligned, which is what the kernel does), so
  prefill and decode both run the kernel with ``causal=True``. Anything the kernel cannot express
  (padding, packed sequences, static-cache slots, sliding windows, dropout, softcap, sinks) is sent to
  transformers' SDPA path with the real mask, so results stay correct; :data:`ATTN_STATS` counts both.
* ``fused_norm_linear``: each decoder layer's ``input_layernorm`` is folded into q/k/v and
  ``post_attention_layernorm`` into gate/up: the norm becomes a passthrough and the projections
  become views (:class:`FusedProjection`) over one ``FusedRMSNormMultiLinear`` whose outputs are
  computed once per input tensor and handed out to each view.
* ``int8``: every remaining ``nn.Linear`` inside the decoder layers (all of them when the norms are
  not fused; o_proj and down_proj when they are) becomes ``Int8Linear.from_float``. ``lm_head`` and
  embeddings stay in floating point.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

ATTN_IMPL = "llm_kernels"
#: How often the patched attention ran our kernel vs transformers' SDPA fallback (and why), process-wide.
ATTN_STATS: dict[str, int] = {"kernel": 0, "fallback": 0}


# --------------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------------


def _count(key: str) -> None:
    ATTN_STATS[key] = ATTN_STATS.get(key, 0) + 1


def _is_bottom_right_causal(mask: torch.Tensor) -> bool:
    """True when the boolean ``(B, 1|H, q, kv)`` mask is exactly the bottom-right causal pattern."""
    q, kv = mask.shape[-2], mask.shape[-1]
    if q > kv:
        return False
    rows = torch.arange(q, device=mask.device)[:, None]
    cols = torch.arange(kv, device=mask.device)[None, :]
    return bool(torch.equal(mask, (cols <= rows + (kv - q)).expand_as(mask)))


def _llmk_mask(*args, **kwargs):
    """Mask builder registered for ``llm_kernels``: SDPA's boolean mask, or ``None`` when it is plain causal.

    SDPA's own shortcut (return ``None`` and rely on ``is_causal``) assumes top-left alignment, which
    is wrong for our bottom-right kernel with static caches, so the mask is always built and checked.
    """
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    mask = sdpa_mask(*args, **kwargs)
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and _is_bottom_right_causal(mask):
        return None
    return mask


def llm_kernels_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``query`` (B, H, Nq, D), ``key``/``value`` (B, Hkv, Nk, D) after the
    cache update -> ``((B, Nq, H, D), None)``."""
    from flashattn_triton import flash_attn_forward

    unsupported = (
        attention_mask is not None
        or (dropout and module.training)
        or kwargs.get("sliding_window") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("s_aux") is not None
        or query.shape[-1] != key.shape[-1]
        or query.shape[-1] != value.shape[-1]
        or query.shape[-1] % 8  # the kernel takes head dims that are multiples of 8 up to 256
        or query.shape[-1] > 256
    )
    if unsupported:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        _count("fallback")
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    _count("kernel")
    out = flash_attn_forward(query, key, value, causal=bool(is_causal), sm_scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> bool:
    """Register ``llm_kernels`` with transformers' attention (and mask) registries; False if they are missing."""
    try:
        from transformers import AttentionInterface
    except ImportError:
        return False
    AttentionInterface.register(ATTN_IMPL, llm_kernels_attention)
    try:
        from transformers.masking_utils import AttentionMaskInterface

        AttentionMaskInterface.register(ATTN_IMPL, _llmk_mask)
    except ImportError:  # older transformers build the mask themselves; a real mask means the SDPA fallback
        pass
    return True


def _set_attn_implementation(model: nn.Module, name: str) -> None:
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter(name)
    else:  # transformers without the setter: the config attribute is what the attention layers read
        model.config._attn_implementation = name
    if getattr(model.config, "_attn_implementation", None) != name:
        raise RuntimeError(f"transformers did not accept attn_implementation={name!r}")


# --------------------------------------------------------------------------------------------
# RMSNorm folding
# --------------------------------------------------------------------------------------------


class NormPassthrough(nn.Module):
    """Stands where a decoder layer's RMSNorm was: the norm now runs inside the fused projections."""

    def __init__(self, folded_into: str):
        super().__init__()
        self.folded_into = folded_into

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"folded into {self.folded_into}"


class _FusedGroup:
    """Computes the fused module once per input tensor and hands each output to its view.

    The outputs are kept until every view has taken its own (then dropped), keyed on the input's
    identity and version counter, so an in-place change of the input or a new input recomputes.
    """

    def __init__(self, fused: nn.Module, n: int):
        self.fused = fused
        self.n = n
        self._clear()

    def _clear(self) -> None:
        self._x: torch.Tensor | None = None
        self._version = -1
        self._outs: tuple[torch.Tensor, ...] | None = None
        self._pending: set[int] = set()

    def get(self, x: torch.Tensor, i: int) -> torch.Tensor:
        if self._outs is None or self._x is not x or self._version != x._version or i not in self._pending:
            self._outs = tuple(self.fused(x))
            self._x, self._version = x, x._version
            self._pending = set(range(self.n))
        out = self._outs[i]
        self._pending.discard(i)
        if not self._pending:
            self._clear()
        return out


class FusedProjection(nn.Module):
    """Replaces one ``nn.Linear`` (q_proj, gate_proj ...) by output ``index`` of a shared fused norm+multi-linear.

    The fused module itself is registered once, on the decoder layer (``llmk_qkv`` / ``llmk_gate_up``);
    this view only keeps a plain reference so parameters are neither duplicated nor double-counted.
    """

    def __init__(self, group: _FusedGroup, index: int, in_features: int, out_features: int):
        super().__init__()
        self._group = group
        self.index = index
        self.in_features = in_features
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._group.get(x, self.index)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, output={self.index}"


def _norm_eps(norm: nn.Module) -> float | None:
    for attr in ("variance_epsilon", "eps"):
        eps = getattr(norm, attr, None)
        if isinstance(eps, (int, float)):
            return float(eps)
    return None


def _is_plain_rmsnorm(norm: nn.Module) -> bool:
    """Probe ``norm`` numerically: it must compute ``x * rsqrt(mean(x^2) + eps) * weight`` (Llama's RMSNorm).

    Guards against look-alikes that would fold wrongly (Gemma's ``(1 + weight)``, LayerNorm, ...).
    """
    w = getattr(norm, "weight", None)
    eps = _norm_eps(norm)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or eps is None or getattr(norm, "bias", None) is not None:
        return False
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, w.shape[0], generator=gen, dtype=torch.float32).to(device=w.device)
    try:
        with torch.no_grad():
            got = norm(x.to(w.dtype)).float()
    except Exception:
        return False
    xr = x.to(w.dtype).float()
    want = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    tol = 1e-4 if w.dtype == torch.float32 else 3e-2
    return got.shape == want.shape and torch.allclose(got, want, rtol=tol, atol=tol)


def _fuse(layer: nn.Module, norm_name: str, owner: nn.Module, proj_names: list[str], fused_name: str) -> str | None:
    """Fold ``layer.<norm_name>`` into ``owner.<proj_names>``; return None on success, else why it was skipped."""
    from fused_rmsnorm import FusedRMSNormMultiLinear

    norm = getattr(layer, norm_name, None)
    projs = [getattr(owner, p, None) for p in proj_names]
    if isinstance(norm, NormPassthrough):
        return "already fused"
    if norm is None or not all(type(p) is nn.Linear for p in projs):
        return "not a norm followed by nn.Linear projections"
    if not _is_plain_rmsnorm(norm):
        return f"{type(norm).__name__} is not a plain RMSNorm (x * rsqrt(mean(x^2)+eps) * w)"
    fused = FusedRMSNormMultiLinear.from_modules(norm, projs)
    group = _FusedGroup(fused, len(projs))
    layer.add_module(fused_name, fused)
    for i, (name, p) in enumerate(zip(proj_names, projs)):
        setattr(owner, name, FusedProjection(group, i, p.in_features, p.out_features))
    setattr(layer, norm_name, NormPassthrough(f"{fused_name} ({', '.join(proj_names)})"))
    return None


def _decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Llama-style pre-norm decoder layers: input_layernorm -> self_attn(q/k/v), post_attention_layernorm -> mlp.

    Layers that also carry ``pre_feedforward_layernorm``/``post_feedforward_layernorm`` (Gemma 2/3,
    OLMo 2) use ``post_attention_layernorm`` on the attention *output*, so folding it would be wrong:
    those are excluded.
    """
    out = []
    for name, m in model.named_modules():
        attn = getattr(m, "self_attn", None)
        if (
            attn is not None
            and hasattr(m, "input_layernorm")
            and hasattr(m, "post_attention_layernorm")
            and hasattr(m, "mlp")
            and all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
            and not hasattr(m, "pre_feedforward_layernorm")
            and not hasattr(m, "post_feedforward_layernorm")
        ):
            out.append((name, m))
    return out


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------


def patch_model(model: nn.Module, attention: bool = True, fused_norm_linear: bool = True, int8: bool = False):
    """Route a transformers Llama-family model through the llm-kernel-lib kernels, in place; returns ``model``.

    What was done is recorded in ``model._llmk_patched`` (a dict): the attention implementation
    set (or why not), the fused norms per layer, the Linear layers swapped to int8 and anything skipped.
    Patching an already patched model only does what is still left to do.
    """
    summary: dict[str, Any] = getattr(model, "_llmk_patched", None) or {
        "attention": None,
        "fused_norm_linear": [],
        "int8": [],
        "skipped": [],
    }
    layers = _decoder_layers(model)
    if not layers:
        summary["skipped"].append("no Llama-style decoder layers found (input_layernorm + self_attn.q/k/v_proj + mlp)")

    if attention:
        config = getattr(model, "config", None)
        if config is None:
            summary["skipped"].append("attention: model has no transformers config")
        elif not register_attention():
            summary["skipped"].append("attention: this transformers has no AttentionInterface (needs >= 4.48)")
        else:
            previous = getattr(config, "_attn_implementation", None)
            try:
                _set_attn_implementation(model, ATTN_IMPL)
                summary["attention"] = ATTN_IMPL
                summary.setdefault("previous_attn_implementation", previous)
            except Exception as e:  # keep the model usable on its previous implementation
                summary["skipped"].append(f"attention: {type(e).__name__}: {e}")
                log.warning("llm_kernels: attention not patched: %s", e)

    if fused_norm_linear:
        for name, layer in layers:
            for norm_name, owner, projs, fused_name in (
                ("input_layernorm", layer.self_attn, ["q_proj", "k_proj", "v_proj"], "llmk_qkv"),
                ("post_attention_layernorm", layer.mlp, ["gate_proj", "up_proj"], "llmk_gate_up"),
            ):
                why = _fuse(layer, norm_name, owner, projs, fused_name)
                entry = f"{name}.{norm_name} -> {'/'.join(projs)}"
                if why is None:
                    summary["fused_norm_linear"].append(entry)
                elif why != "already fused":
                    summary["skipped"].append(f"fuse {entry}: {why}")

    if int8:
        from int8_gemm import Int8Linear

        for name, layer in layers:
            for sub_name, sub in list(layer.named_modules()):
                if sub_name.startswith("llmk_"):  # inside our fused norm+linear modules: they stay float
                    continue
                for child_name, child in list(sub.named_children()):
                    if type(child) is nn.Linear:
                        setattr(sub, child_name, Int8Linear.from_float(child))
                        summary["int8"].append(".".join(p for p in (name, sub_name, child_name) if p))

    model._llmk_patched = summary
    return model
