"""Self-supervised single-grid ViTs: DINOv3, ViT-MAE, I-JEPA, AIMv2, data2vec-vision, ViT-MSN.

One stage, every block ``global`` attention over the prefix tokens and the patch
grid (rows and columns 0..P-1 the prefix, then the patches in row-major order).
Layouts, as the ``transformers`` 5.23 modeling code builds them:

* **DINOv3** (``dinov3_vit``, ``DINOv3ViTModel``; 5.23 has no classifier): CLS, k
  registers (``REG0`` .. ``REG{k-1}``, 0-based as every index), patches. No absolute position table: every
  attention layer rotates the queries and keys of the *patch* tokens (rotary
  embeddings, RoPE, from each patch's centre on the grid); CLS and the registers
  are not rotated. Any input size that is a multiple of the patch size works.
* **ViT-MAE** (``vit_mae``, ``ViTMAEModel``, or the encoder of a
  ``ViTMAEForPreTraining``, the released checkpoints' class): CLS, patches, a
  fixed 2-D sin-cos table (CLS row = 0, dropped for the position view). Its
  embeddings shuffle and mask the patches on every call (``random_masking``:
  ``argsort`` of fresh random noise, keep the first ``1 - mask_ratio``). vitviz's
  forwards keep every patch, in grid order: see :class:`VitMae`.
* **I-JEPA** (``ijepa``, ``IJepaModel`` / ``IJepaForImageClassification``):
  patches only, one learned position row per patch. The classifier reads the mean
  of all final tokens (all of them patches), so the readout is the pooled query.
* **AIMv2** (``aimv2_vision_model``, ``Aimv2VisionModel``; and ``aimv2``,
  ``Aimv2Model``, a two-tower model of which vitviz runs the image tower only):
  patches only. With ``use_head`` (the default) an attention-pooling head (one
  learned probe query, no query projection, per-head softmax over the patch keys)
  makes the image feature: it is captured as a last ``pool`` block (per head) and
  is the readout. Position: a learned table at the native grid (the model then
  runs at that size only), or a fixed 2-D sin-cos computed per input
  (``is_native``).
* **data2vec-vision** (``data2vec-vision``, ``Data2VecVisionModel`` /
  ``...ForImageClassification``): BEiT's layout, CLS then patches, relative
  position bias inside attention (per layer or shared), absolute embeddings only
  where the config turns them on. The classifier reads the mean of the final
  *patch* tokens (``use_mean_pooling``, the default), not CLS.
* **ViT-MSN** (``vit_msn``): ViT's layout, CLS then patches; the classifier reads CLS.

**The global map where there is no CLS token** (``docs/definitions.md#global-map``): where a model
pools with an attention head (AIMv2 with ``use_head``), the head's own attention
over the patches, one row per head (``pool`` block); where it mean-pools (I-JEPA,
AIMv2 without a head, data2vec-vision's classifier), the pooled query: the mean
of the patch tokens' rows of a block's attention. Rollout and relevance read out
the same row.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import replace
from typing import Any, Literal

import numpy as np
import torch

from vitviz.errors import CaptureError
from vitviz.models.families.base import Call, Family
from vitviz.models.families.vit import Beit, Dinov2, PlainViT, paired_sites
from vitviz.models.hooks import Site
from vitviz.record import Geometry, PositionInfo, PositionTable

__all__ = ["Dinov3", "VitMae", "IJepa", "Aimv2", "Data2VecVision", "VitMsn", "FAMILIES", "pool_with_weights"]


# --- DINOv3 ---------------------------------------------------------------------------


class Dinov3(PlainViT):
    """DINOv3: CLS, k registers, patches; rotary embeddings on the patch tokens only, no table."""

    name = "DINOv3"
    model_types = ("dinov3_vit",)
    layout = Dinov2.layout  # norm1 / norm2, scaled branches; q and k taken before the rotary embedding
    interpolate_kwarg = False  # RoPE is computed from each input's own grid

    def prefix_kinds(self, config) -> tuple[str, ...]:
        return ("CLS", *(f"REG{i}" for i in range(int(getattr(config, "num_register_tokens", 0) or 0))))

    def position_table(self, model: torch.nn.Module) -> torch.Tensor | None:
        return None

    def position_note(self, config) -> str:
        return (
            "DINOv3 has no position-embedding table: it uses rotary position embeddings (RoPE), which rotate the "
            "queries and keys of the patch tokens inside every attention layer by angles computed from each patch's "
            "row and column on the grid; the CLS token and the registers are not rotated."
        )

    def patch_weight(self, model: torch.nn.Module) -> np.ndarray:
        # DINOv3ViTModel's ``base_model`` is its encoder (base_model_prefix "model"): read the embeddings directly.
        return model.embeddings.patch_embeddings.weight.detach().float().cpu().numpy()


# --- ViT-MAE ----------------------------------------------------------------------------

# The mask ratio MAE's embeddings see inside a vitviz forward (None: the model's own config value).
_MAE_MASK_RATIO: ContextVar[float | None] = ContextVar("vitviz_mae_mask_ratio", default=None)


class _MaskRatioView:
    """What a ViT-MAE embeddings module reads as its ``config``: the shared config, but ``mask_ratio`` per call.

    Inside :meth:`VitMae.forward` (a ``ContextVar`` set for that call only, so other
    threads and other callers are unaffected) ``mask_ratio`` reads 0; everywhere else
    it reads the shared config's own value. Every other attribute, read or written,
    is the shared config's: nothing is copied, nothing is written to it.
    """

    __slots__ = ("_shared",)

    def __init__(self, shared: Any) -> None:
        object.__setattr__(self, "_shared", shared)

    def __getattr__(self, name: str) -> Any:
        if name == "_shared":  # slot not set yet (copying): never recurse
            raise AttributeError(name)
        if name == "mask_ratio":
            override = _MAE_MASK_RATIO.get()
            if override is not None:
                return override
        return getattr(self._shared, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._shared, name, value)

    def __reduce__(self):
        return (_MaskRatioView, (self._shared,))

    def __repr__(self) -> str:
        return f"_MaskRatioView({self._shared!r})"


class VitMae(PlainViT):
    """ViT-MAE with every patch kept, in grid order, on every vitviz forward.

    ``ViTMAEEmbeddings.random_masking`` keeps ``int(N * (1 - config.mask_ratio))``
    patches in the order of ``argsort(noise)``, with fresh ``torch.rand`` noise when
    none is given, reading ``mask_ratio`` from the embeddings module's own ``config``
    attribute (the model's shared config object); 5.23 has no per-call argument for
    the ratio. So:

    * :meth:`model_inputs` passes ascending noise ``0, 1, ..., N - 1`` (token i is
      patch i; ``ids_restore`` is the identity);
    * at load (:meth:`sites`) the embeddings module's ``config`` attribute is replaced
      by a :class:`_MaskRatioView` of the same shared object, whose ``mask_ratio``
      reads 0 only while :meth:`forward` runs (a ``ContextVar``: per call, per thread)
      and the shared value otherwise. The shared config keeps its ``mask_ratio``
      (0.75 in the released checkpoints); a direct call of the model outside vitviz
      masks exactly as ``transformers`` does;
    * :meth:`forward` checks the output's ``mask`` and ``ids_restore`` and refuses a
      forward that dropped or reordered a patch.
    """

    name = "ViT-MAE"
    model_types = ("vit_mae",)
    interpolate_kwarg = True

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        info = super().position_info(model)
        return PositionInfo(
            tables=tuple(PositionTable("patches, fixed 2-D sin-cos", t.embeddings, t.grid) for t in info.tables),
            note=(
                "ViT-MAE's position embeddings are not learned: a fixed 2-D sin-cos table on the native grid "
                "(the CLS row, all zeros, is left out); other input sizes interpolate it bicubically."
            ),
        )

    def sites(self, model: torch.nn.Module) -> list[Site]:
        emb = model.base_model.embeddings
        if not isinstance(emb.config, _MaskRatioView):
            emb.config = _MaskRatioView(emb.config)
        return super().sites(model)

    def model_inputs(self, loaded, pixels: torch.Tensor, hw: tuple[int, int]) -> dict:
        p = self.patch_size(loaded.config)
        n = (hw[0] // p) * (hw[1] // p)
        noise = torch.arange(n, dtype=torch.float32, device=pixels.device).expand(pixels.shape[0], n)
        return {"pixel_values": pixels, "noise": noise, **self.forward_kwargs(loaded.config, hw)}

    def forward(self, model: torch.nn.Module, inputs: dict):
        """The encoder (``ViTMAEModel``; the ``vit`` of a ``ViTMAEForPreTraining``) with nothing masked.

        A pre-training checkpoint's decoder only reconstructs masked patches (none
        here; its loss would be 0 / 0): it is not run.
        """
        encoder = model.base_model
        if not isinstance(encoder.embeddings.config, _MaskRatioView):
            raise CaptureError("this ViT-MAE model was not loaded by vitviz: its forward would mask patches")
        token = _MAE_MASK_RATIO.set(0.0)
        try:
            out = encoder(**inputs)
        finally:
            _MAE_MASK_RATIO.reset(token)
        mask, restore = getattr(out, "mask", None), getattr(out, "ids_restore", None)
        if mask is not None and bool(mask.any()):
            raise CaptureError("ViT-MAE masked patches in a vitviz forward; its maps would miss them")
        if restore is not None:
            natural = torch.arange(restore.shape[1], device=restore.device)
            if not bool((restore == natural).all()):
                raise CaptureError("ViT-MAE reordered its patches in a vitviz forward; maps would be misplaced")
        return out


# --- I-JEPA and ViT-MSN -------------------------------------------------------------------


class IJepa(PlainViT):
    """I-JEPA: patches only (no CLS), one learned position row per patch; the readout is the pooled query."""

    name = "I-JEPA"
    model_types = ("ijepa",)
    interpolate_kwarg = True

    def prefix_kinds(self, config) -> tuple[str, ...]:
        return ()

    def position_prefix_rows(self, config) -> int:
        return 0

    def readout(self, config) -> Literal["pooled"]:
        return "pooled"  # IJepaForImageClassification: classifier(last_hidden_state.mean(dim=1))


class VitMsn(PlainViT):
    """ViT-MSN: ViT's layout (CLS, patches, learned table with a CLS row); the classifier reads CLS."""

    name = "ViT-MSN"
    model_types = ("vit_msn",)
    interpolate_kwarg = True


# --- AIMv2 -------------------------------------------------------------------------------

# Inside Aimv2.forward: the pooling head's probabilities per head module (None outside vitviz's forwards).
_AIMV2_HEAD: ContextVar[dict | None] = ContextVar("vitviz_aimv2_head", default=None)
_EXPLICIT_ATTR = "_vitviz_explicit_pool"


def pool_with_weights(head: torch.nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``Aimv2AttentionPoolingHead`` written out: its output ``(B, D)`` and its probabilities ``(B, H, 1, N)``.

    The head's probe is its ``cls_token`` split into heads (no query projection);
    keys and values are ``k_proj`` / ``v_proj`` of the final tokens; the softmax is
    scaled by ``head_dim ** -0.5`` (``scaled_dot_product_attention``'s default);
    the per-head outputs are concatenated, averaged over the one query, projected.
    """
    b, n, d = hidden.shape
    heads = head.num_heads
    hd = d // heads
    key = head.k_proj(hidden).reshape(b, n, heads, hd).permute(0, 2, 1, 3)
    value = head.v_proj(hidden).reshape(b, n, heads, hd).permute(0, 2, 1, 3)
    query = head.cls_token.expand(b, -1, -1).reshape(b, 1, heads, hd).permute(0, 2, 1, 3)
    scores = (query @ key.transpose(-1, -2)) * hd**-0.5
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = (probs @ value).transpose(1, 2).reshape(b, 1, d).mean(dim=1)
    return head.output_proj(out), probs


def _explicit_pool_hook(module: torch.nn.Module, args: tuple, output: torch.Tensor):
    """Inside a vitviz forward, the head's output recomputed with explicit probabilities (kept for the site)."""
    store = _AIMV2_HEAD.get()
    if store is None:
        return None  # any other caller: the model's own fused-kernel head, untouched
    out, probs = pool_with_weights(module, args[0])
    store[module] = probs
    return out


class Aimv2(PlainViT):
    """AIMv2's image tower: patches only, optionally an attention-pooling head (a ``pool`` block, the readout).

    The head calls ``F.scaled_dot_product_attention``, which returns no weights. At
    load, :meth:`sites` registers one more forward hook on the head (before vitviz's
    own hooks): inside :meth:`forward` only (a ``ContextVar``), it recomputes the
    head with explicit probabilities (:func:`pool_with_weights`) and returns that
    output, so the probabilities the record keeps are the very tensor the image
    feature is computed from (relevance gets its gradient); outside vitviz's
    forwards the hook returns nothing and the model is exactly ``transformers``'.

    One grid of global attention: the plain ``(L, H, T, T)`` stack holds the layers
    (the capture keeps the head's ``(H, N)`` block out of it).
    """

    name = "AIMv2"
    model_types = ("aimv2_vision_model", "aimv2")
    layout = replace(
        PlainViT.layout,
        projection=("attention.out_proj",),
        mlp=("ffn",),
        mlp_output=("ffn.down_proj",),
        norms=(("rms_norm1",), ("rms_norm2",)),
    )
    interpolate_kwarg = False  # Aimv2VisionModel.forward has no such argument (its **kwargs swallow it unread)

    # --- the image tower and its config -------------------------------------------------
    @staticmethod
    def vision_config(config: Any) -> Any:
        """The image tower's config: ``vision_config`` of a two-tower ``aimv2`` config, else the config itself."""
        return config.vision_config if getattr(config, "model_type", "") == "aimv2" else config

    @staticmethod
    def tower(model: torch.nn.Module) -> torch.nn.Module:
        """The image tower: ``vision_model`` of a two-tower ``Aimv2Model``, else the model itself."""
        return model.vision_model if getattr(model.config, "model_type", "") == "aimv2" else model

    def patch_size(self, config) -> int:
        return super().patch_size(self.vision_config(config))

    def prefix_kinds(self, config) -> tuple[str, ...]:
        return ()

    def readout(self, config) -> Literal["head", "pooled"]:
        return "head" if self.vision_config(config).use_head else "pooled"

    def native_grid(self, config) -> tuple[int, int]:
        vc = self.vision_config(config)
        g = int(vc.image_size) // self.patch_size(config)
        return g, g

    def size_problem(self, config, hw: tuple[int, int]) -> str:
        vc = self.vision_config(config)
        if vc.is_native:
            return ""
        gh, gw = self.native_grid(config)
        p = self.patch_size(config)
        if hw != (gh * p, gw * p):
            return (
                f"This AIMv2 model runs only at {gw * p} x {gh * p} px: its learned position table has one row per "
                f"patch of its {gh} x {gw} grid and transformers cannot interpolate it. Choose {gw * p} px."
            )
        return ""

    # --- model-level arrays ---------------------------------------------------------------
    def patch_weight(self, model: torch.nn.Module) -> np.ndarray:
        return self.tower(model).embeddings.patch_embed.weight.detach().float().cpu().numpy()

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        tower = self.tower(model)
        emb = tower.embeddings
        grid = self.native_grid(model.config)
        if not tower.config.is_native:
            rows = emb.position_embedding.weight.detach().float().cpu().numpy()
            if rows.shape[0] != grid[0] * grid[1]:
                raise ValueError(f"{rows.shape[0]} position embeddings do not fill the native {grid} grid")
            return PositionInfo(tables=(PositionTable("patches", rows, grid),))
        # is_native: a fixed 2-D sin-cos added per input; read what the embeddings add at the native size.
        p = self.patch_size(model.config)
        weight = emb.patch_embed.weight
        zeros = torch.zeros(1, weight.shape[1], grid[0] * p, grid[1] * p, dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            added = emb(zeros) - emb.rms_norm(emb.patch_embed(zeros).flatten(2).transpose(1, 2))
        rows = added[0].float().cpu().numpy()
        return PositionInfo(
            tables=(PositionTable("patches, fixed 2-D sin-cos", rows, grid),),
            note="This AIMv2 model's position embeddings are not learned: a fixed 2-D sin-cos computed for each "
            "input's grid (shown here on the native grid).",
        )

    # --- capture ----------------------------------------------------------------------------
    def sites(self, model: torch.nn.Module) -> list[Site]:
        tower = self.tower(model)
        sites = paired_sites(tower)
        if tower.use_head:
            head = tower.head
            if not getattr(head, _EXPLICIT_ATTR, False):
                head.register_forward_hook(_explicit_pool_hook)
                setattr(head, _EXPLICIT_ATTR, True)
            sites.append(Site(index=len(sites), stage=0, attention=head, block=head, extra="pool"))
        return sites

    def forward(self, model: torch.nn.Module, inputs: dict):
        token = _AIMV2_HEAD.set({})
        try:
            if self.tower(model) is not model:
                return model.get_image_features(**inputs)  # image tower + visual projection
            return model(**inputs)
        finally:
            _AIMV2_HEAD.reset(token)

    def logits(self, model: torch.nn.Module, out) -> torch.Tensor | None:
        return None

    def image_embedding(self, model: torch.nn.Module, out) -> torch.Tensor | None:
        """Two-tower ``aimv2``: what ``get_image_features`` returns (the projected, unnormalised head output)."""
        return out.pooler_output if self.tower(model) is not model else None

    def probs(self, call: Call, site: Site, module, args, kwargs, output):
        if site.extra == "pool":
            store = _AIMV2_HEAD.get()
            return None if store is None else store.get(module)
        return output[1]

    def geometry(self, call, site, module, args, kwargs, output, raw) -> Geometry:
        if site.extra != "pool":
            return super().geometry(call, site, module, args, kwargs, output, raw)
        p = self.patch_size(call.config)
        grid = (call.input_size[0] // p, call.input_size[1] // p)
        if raw.shape[-1] != grid[0] * grid[1] or raw.shape[-2] != 1:
            raise RuntimeError(f"expected the probe's row over {grid[0]} x {grid[1]} patches, got {tuple(raw.shape)}")
        return Geometry(stage=0, kind="pool", num_heads=raw.shape[1], grid=grid)

    def tokens(self, call, site, module, args, kwargs, output):
        """Layers as ViT; the head's row of token norms: the final tokens it reads (after the last RMSNorm),
        which it leaves as they are."""
        if site.extra == "pool":
            inp = args[0] if args else kwargs["hidden_states"]
            return inp, inp
        return super().tokens(call, site, module, args, kwargs, output)

    def attention_numel(self, config, hw: tuple[int, int]) -> int:
        vc = self.vision_config(config)
        p = self.patch_size(config)
        n = (hw[0] // p) * (hw[1] // p)
        heads = vc.num_attention_heads
        return vc.num_hidden_layers * heads * n * n + (heads * n if vc.use_head else 0)


# --- data2vec-vision -----------------------------------------------------------------------


class Data2VecVision(Beit):
    """data2vec-vision: BEiT's layout and position scheme; sites at each self-attention's dropout.

    ``Data2VecVisionSelfAttention`` (5.23) predates ``_can_record_outputs`` and
    returns its probabilities only when ``output_attentions`` is passed down; its
    ``dropout`` module's output is the probability tensor the forward multiplies
    with the values, so the site is that module and no flag is needed.
    """

    name = "data2vec-vision"
    model_types = ("data2vec-vision",)
    # The pre-5.x layout: self-attention with its own dropout on the probabilities, intermediate + output.
    layout = replace(
        Beit.layout,
        projection=("attention.output.dense",),
        q=("attention.attention.query",),
        k=("attention.attention.key",),
        v=("attention.attention.value",),
        pattern=("attention.attention.dropout",),
        caller=(),
        mlp=("output",),  # Data2VecVisionOutput: the MLP's second Linear and dropout, no residual inside
        mlp_output=("output.dense",),
    )
    interpolate_kwarg = False  # absolute tables are always interpolated; the relative bias follows the input's grid

    def readout(self, config) -> Literal["cls", "pooled"]:
        return "pooled" if getattr(config, "use_mean_pooling", True) else "cls"

    def position_note(self, config) -> str:
        shared = getattr(config, "use_shared_relative_position_bias", False)
        per_layer = getattr(config, "use_relative_position_bias", False)
        absolute = getattr(config, "use_absolute_position_embeddings", False)
        if shared or per_layer:
            where = "one bias shared by all layers" if shared and not per_layer else "a bias in every layer"
            if shared and per_layer:
                where = "a shared bias plus one in every layer"
            tail = (
                "; it also has absolute position embeddings (shown here)."
                if absolute
                else "; it has no absolute position embeddings."
            )
            return (
                f"data2vec-vision, like BEiT, encodes position with a relative position bias added to the attention "
                f"logits ({where}){tail}"
            )
        if absolute:
            return ""
        return (
            "This data2vec-vision model has no position information: its config turns off absolute position "
            "embeddings and both relative position biases."
        )

    def position_info(self, model: torch.nn.Module) -> PositionInfo:
        info = super().position_info(model)
        return PositionInfo(tables=info.tables, note=self.position_note(model.config))

    def sites(self, model: torch.nn.Module) -> list[Site]:
        layers = list(model.base_model.encoder.layer)
        sites = []
        for i, layer in enumerate(layers):
            attn = layer.attention.attention
            if type(attn).__name__ != "Data2VecVisionSelfAttention":
                raise RuntimeError(f"expected eager Data2VecVisionSelfAttention, found {type(attn).__name__}")
            sites.append(Site(index=i, stage=0, attention=attn.dropout, block=layer))
        return sites

    def probs(self, call: Call, site: Site, module, args, kwargs, output):
        """The dropout's output: the softmax probabilities (relative bias included) the forward goes on with."""
        return output


FAMILIES: tuple[Family, ...] = (Dinov3(), VitMae(), IJepa(), Aimv2(), Data2VecVision(), VitMsn())
