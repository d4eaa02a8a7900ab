"""``attnlrp``: AttnLRP (Achtibat et al., ICML 2024), attention-aware layer-wise relevance propagation.

Checked first: the authors' library ``lxt`` (2.1) patches torchvision's ViT and the
``transformers`` language models by replacing module-level functions of those libraries (a
global change, made once), and ships no rules for the ``transformers`` ViT or CLIP image
towers. So its rules are implemented here the way ``lxt``'s efficient mode does it:
**gradient x input** through a forward whose backward is modified, on a per-call copy of the
module tree that shares every parameter with the loaded model (the shared model is never
changed, so sessions running it meanwhile see nothing).

Rules (equation numbers as ``lxt`` cites the paper):

* linear layers, the patch convolution, residual additions, layer scales: LRP-epsilon with
  epsilon -> 0, which under gradient x input is the plain gradient; biases (and the
  CLS token and position embeddings, additive constants) absorb their share;
* element-wise non-linearities (GELU, quick GELU): the identity rule (Eq. 9), backward
  ``g_in = (f(x) / x) g_out`` so that ``x g_in = f(x) g_out``;
* LayerNorm: the identity rule on the normalisation, by detaching the standard deviation
  (``(x - mean(x)) / stop_grad(std(x)) * w + b`` is then linear in ``x``);
* the bilinear products of attention (``q k^T`` and ``A v``): the uniform rule (Eq. 7), half of
  the relevance to each factor (``lxt``: the gradient of query and key divided by 4, of the
  value by 2; here the attention matrix, query, key and value are each divided by 2 at the
  product that uses them: the same gradients);
* softmax: gradient x input (the paper's softmax rule, whose missing part is the softmax's
  own bias term). ``variant="cp"``: CP-LRP inside attention (Ali et al. 2022), as ``lxt`` does
  for vision models: the attention matrix is a constant (query and key detached), so ``A v``
  is linear in ``v`` and all of its relevance goes to the value.

Conservation: every rule except the softmax's passes on exactly what it receives, minus what
biases absorb. So with every bias, CLS token and position embedding zero, the map sums to the
explained logit exactly (CP-LRP), or to the logit minus the relevance the softmaxes absorbed
(AttnLRP; :func:`relevance` can return that ledger); ``tests/methods/test_attnlrp.py`` checks
both on tiny random ViTs and CLIPs.

The map: ``R[ch, y, x] = x[ch, y, x] * g[ch, y, x]`` on the normalised model input, summed over
channels, **signed**, and summed over the pixels of each patch (:func:`pool_to_grid`). Cost:
one forward with a graph and one backward (about 3 forward-equivalents).

Families: the ``transformers`` ViT, DeiT, DINOv2 and CLIP image towers (their attention runs
through ``transformers``' attention interface, where the rules go in); elsewhere a
:class:`MethodError` says so. Explained target (:mod:`vitviz.capture.targets`): a class logit,
a zero-shot label's score ``logit_scale * cos(image, text)`` with the image embedding's norm
detached (the identity rule on the normalisation, as for LayerNorm), or the difference of two.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from vitviz.capture.forward import forward_output
from vitviz.capture.targets import BoundTarget, Target, resolve_target
from vitviz.methods.base import Inputs, Method, MethodError, pool_to_grid
from vitviz.models.load import LoadedModel

__all__ = ["AttnLRP", "LrpResult", "relevance", "SUPPORTED_MODEL_TYPES", "unsupported"]

Variant = Literal["attnlrp", "cp"]
SUPPORTED_MODEL_TYPES = ("vit", "deit", "dinov2", "clip", "clip_vision_model")
_IMPLEMENTATION = {"attnlrp": "vitviz_attnlrp", "cp": "vitviz_cp_lrp"}


class _Halve(torch.autograd.Function):
    """Identity forward; backward divides the gradient by ``factor`` (the uniform rule's share)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return g / ctx.factor, None


class _IdentityRule(torch.autograd.Function):
    """``y = fn(x)`` element-wise; backward ``g_in = (y / x) g_out`` (0 where ``x = 0``)."""

    @staticmethod
    def forward(ctx, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        y = fn(x)
        ctx.save_for_backward(torch.where(x == 0, torch.zeros_like(y), y / torch.where(x == 0, 1.0, x)))
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (ratio,) = ctx.saved_tensors
        return None, ratio * g


@dataclass
class _Call:
    """This call's state (a ContextVar holds it: threads sharing the model never mix calls)."""

    variant: Variant
    ledger: list[torch.Tensor] | None
    attention_calls: int = 0
    keep: list = field(default_factory=list)


_CALL: ContextVar[_Call | None] = ContextVar("vitviz_attnlrp_call", default=None)
_REGISTER_LOCK = threading.Lock()
_REGISTERED: set[str] = set()


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention as ``transformers`` computes it (float32 softmax), with the rules of this call."""
    call = _CALL.get()
    if call is None:  # only the per-call copies use this implementation
        raise RuntimeError("AttnLRP attention ran outside an AttnLRP call")
    call.attention_calls += 1
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    if call.variant == "cp":
        query, key = query.detach(), key.detach()
    else:
        query, key = _Halve.apply(query, 2.0), _Halve.apply(key, 2.0)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if call.ledger is not None and scores.requires_grad:  # relevance the softmax absorbs: out - in
        ledger = call.ledger
        probs.register_hook(lambda g, p=probs: ledger.append((p.detach() * g).double().sum()))
        scores.register_hook(lambda g, s=scores: ledger.append(-(s.detach() * g).double().sum()))
    if call.variant == "cp":  # the attention matrix is a constant: all of the product's relevance goes to v
        out = torch.matmul(probs, value)
    else:
        out = torch.matmul(_Halve.apply(probs, 2.0), _Halve.apply(value, 2.0))
    return out.transpose(1, 2).contiguous(), probs


def _register() -> None:
    from transformers import AttentionInterface

    with _REGISTER_LOCK:
        for name in _IMPLEMENTATION.values():
            if name not in _REGISTERED:
                AttentionInterface.register(name, _attention)
                _REGISTERED.add(name)


def _layer_norm(module: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm with its standard deviation detached (identity rule on the normalisation)."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    y = (x - mean) / (var + module.eps).sqrt().detach()
    if module.weight is not None:
        y = y * module.weight
    if module.bias is not None:
        y = y + module.bias
    return y


def _is_elementwise(module: torch.nn.Module) -> bool:
    elementwise = (torch.nn.GELU, torch.nn.SiLU, torch.nn.ReLU, torch.nn.Tanh, torch.nn.Sigmoid)
    return isinstance(module, elementwise) or type(module).__module__ == "transformers.activations"


def _rule_copy(model: torch.nn.Module, variant: Variant) -> torch.nn.Module:
    """A copy of the module tree sharing every parameter and buffer, with the rules' forwards in place.

    Modules are shallow copies (their parameter dicts are the model's own); configs are deep
    copies naming the rules' attention implementation. Nothing of ``model`` changes.
    """
    name = _IMPLEMENTATION[variant]
    configs: dict[int, object] = {}

    def clone(m: torch.nn.Module) -> torch.nn.Module:
        c = copy.copy(m)
        c.__dict__["_modules"] = {k: None if v is None else clone(v) for k, v in m._modules.items()}
        cfg = m.__dict__.get("config")
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            if id(cfg) not in configs:
                new = copy.deepcopy(cfg)
                new._attn_implementation = name
                configs[id(cfg)] = new
            c.__dict__["config"] = configs[id(cfg)]
        if isinstance(m, torch.nn.LayerNorm):
            c.__dict__["forward"] = lambda x, _m=m: _layer_norm(_m, x)
        elif _is_elementwise(m):
            c.__dict__["forward"] = lambda x, _m=m: _IdentityRule.apply(type(_m).forward.__get__(_m), x)
        return c

    return clone(model)


def unsupported(loaded: LoadedModel) -> str:
    """Why AttnLRP does not apply to ``loaded`` ("" when it does)."""
    kind = getattr(loaded.config, "model_type", "?")
    if getattr(loaded.config, "use_swiglu_ffn", False):
        return f"AttnLRP has no rule here for the SwiGLU feed-forward of '{loaded.name}' (its gate is not a module)."
    if kind not in SUPPORTED_MODEL_TYPES:
        return (
            "AttnLRP is implemented for the ViT, DeiT, DINOv2 (without registers) and CLIP image towers; "
            f"'{loaded.name}' is {loaded.family.name} ({kind})."
        )
    return ""


@dataclass(frozen=True)
class LrpResult:
    """``pixels``: ``(3, h, w)`` float64 relevance of the normalised input, signed; ``target``: the explained
    value (class logit or label score); ``softmax_absorbed``: relevance the softmaxes absorbed (None unless asked;
    0 for CP-LRP); ``attention_calls``: attention layers the rules ran through."""

    pixels: np.ndarray = field(repr=False)
    target: float
    softmax_absorbed: float | None
    attention_calls: int


def _label_scores(loaded: LoadedModel, out, text: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Label scores ``(B, K)`` of the forward's output for text embeddings ``(K, D)``, the image embedding's
    norm detached (identity rule on the normalisation): ``logit_scale.exp() * <img / |img|, t / |t|> (+ bias)``."""
    model = loaded.model
    emb = loaded.family.image_embedding(model, out)
    if emb is None:
        raise MethodError(f"'{loaded.name}' gives no image embedding to compare with a label")
    unit = torch.as_tensor(np.asarray(text), dtype=emb.dtype, device=emb.device).reshape(-1, emb.shape[-1])
    unit = unit / unit.norm(dim=-1, keepdim=True)
    scale = model.logit_scale.detach().exp() if hasattr(model, "logit_scale") else 1.0
    scores = scale * (emb / emb.norm(dim=-1, keepdim=True).detach()) @ unit.T
    bias = getattr(model, "logit_bias", None)
    return scores + bias.detach() if isinstance(bias, torch.Tensor) else scores


def _text_of(loaded: LoadedModel, target: Target) -> np.ndarray:
    """``(K, D)``: the target's prompts' embeddings (the one cache of them)."""
    from vitviz.models.zeroshot import text_embeddings

    return text_embeddings(loaded, target.prompts or target.labels)


def relevance(
    loaded: LoadedModel,
    pixels: torch.Tensor,
    hw: tuple[int, int],
    *,
    target: Target | BoundTarget | int | None = None,
    label_embedding: np.ndarray | torch.Tensor | None = None,
    variant: Variant = "attnlrp",
    ledger: bool = False,
) -> LrpResult:
    """AttnLRP relevance of one normalised image ``pixels`` ``(1, 3, h, w)`` (module docstring).

    What is explained (one of): ``target`` (a class, a zero-shot label, or the difference of two:
    :class:`~vitviz.capture.targets.Target`; an int: a classifier's class), or ``label_embedding``
    ``(D,)`` (any text embedding of a zero-shot model, not only a prompt's). Label scores are computed with the image
    embedding's norm detached. ``ledger``: also add up the relevance the softmaxes absorb
    (:attr:`LrpResult.softmax_absorbed`).
    """
    why = unsupported(loaded)
    if why:
        raise MethodError(why)
    if variant not in _IMPLEMENTATION:
        raise MethodError(f"unknown AttnLRP variant {variant!r}; choose attnlrp or cp")
    if sum(t is not None for t in (target, label_embedding)) != 1:
        raise MethodError("AttnLRP explains one target: give a target (or a class index) or a label embedding")
    if isinstance(target, BoundTarget):
        target = target.target
    if target is not None:
        target = resolve_target(target)
    text = label_embedding
    if label_embedding is not None:
        target = Target.of_label(["label"], 0)
    elif target.is_label:
        target.check(loaded)
        text = _text_of(loaded, target)
    _register()
    rules = dataclasses.replace(loaded, model=_rule_copy(loaded.model, variant))
    fam = loaded.family
    call = _Call(variant=variant, ledger=[] if ledger else None)
    token = _CALL.set(call)
    try:
        x = pixels.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            out = forward_output(loaded, x, hw, model=rules.model)
            if text is None:
                scores = fam.logits(rules.model, out)
                if scores is None:
                    raise MethodError(f"'{loaded.name}' has no class logits: give a zero-shot label instead")
            else:
                scores = _label_scores(rules, out, text)
            value = target.select(scores)[0]
            value.backward()
    finally:
        _CALL.reset(token)
    if call.attention_calls == 0:
        raise MethodError(f"AttnLRP's rules never ran in '{loaded.name}': its attention bypasses the interface")
    absorbed = float(sum(t.item() for t in call.ledger)) if call.ledger is not None else None
    rel = (x.detach() * x.grad).double()[0].cpu().numpy()
    return LrpResult(rel, float(value.detach()), absorbed, call.attention_calls)


class AttnLRP(Method):
    name = "attnlrp"
    title = "AttnLRP"
    definition = (
        "AttnLRP (Achtibat et al. 2024) relevance of y_c as gradient x input with its rules "
        "(epsilon, identity for GELU and LayerNorm, uniform for attention products), signed, channels and cell pixels summed"
    )

    def __init__(self, variant: Variant = "attnlrp") -> None:
        if variant not in _IMPLEMENTATION:
            raise ValueError(f"variant must be attnlrp or cp, got {variant!r}")
        self.variant = variant
        if variant == "cp":  # a name of its own, so that both maps can sit side by side (``attnlrp_cp``)
            self.name = "attnlrp_cp"
            self.title = "AttnLRP, CP-LRP in attention (lxt's ViT recipe)"

    def unavailable(self, loaded: LoadedModel, target: Target | None = None) -> str:
        return unsupported(loaded) or super().unavailable(loaded, target)

    def describe(self, inputs: Inputs, seed: int) -> str:
        return self.definition if self.variant == "attnlrp" else f"{self.definition}; CP-LRP inside attention"

    def compute(self, inputs: Inputs, target: BoundTarget | None, seed: int) -> np.ndarray:
        r = relevance(inputs.loaded, inputs.pixels(), inputs.input_size, target=target, variant=self.variant)
        return pool_to_grid(r.pixels.sum(axis=0), inputs.grid)
