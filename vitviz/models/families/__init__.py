"""One small adapter per supported model family, in a registry keyed by ``model_type``.

An adapter answers the questions capture needs and the model does not state in
one place: which prefix tokens precede the patches, where the absolute position
embeddings live (and which of their rows belong to prefix tokens), and whether
the forward pass wants ``interpolate_pos_encoding=True`` for other input sizes.
"""

from __future__ import annotations

import numpy as np
import torch

from vitviz.errors import UnsupportedModelError

__all__ = ["Family", "FAMILIES", "family_for", "supported_model_types"]


class Family:
    """ViT layout (google/vit-*, facebook/dino-*): CLS then patches, one position row per token."""

    name = "ViT"
    model_types: tuple[str, ...] = ("vit",)
    interpolate_kwarg = True  # forward takes ``interpolate_pos_encoding``

    def prefix_kinds(self, config) -> tuple[str, ...]:
        return ("CLS",)

    def position_prefix_rows(self, config) -> int:
        """How many leading rows of the position table belong to prefix tokens."""
        return 1

    def position_note(self, config) -> str:
        return ""

    def position_table(self, base_model: torch.nn.Module, config) -> torch.Tensor | None:
        return getattr(base_model.embeddings, "position_embeddings", None)

    def patch_position_embeddings(self, base_model: torch.nn.Module, config) -> np.ndarray | None:
        """Position embeddings of the patch tokens on the native grid: ``(N_native, D)`` float32, or None."""
        table = self.position_table(base_model, config)
        if table is None:
            return None
        rows = table.detach().float().cpu().numpy().reshape(-1, table.shape[-1])
        return rows[self.position_prefix_rows(config) :]

    def patch_weight(self, base_model: torch.nn.Module) -> np.ndarray:
        """Patch projection weight ``(D, C, p, p)`` float32."""
        return base_model.embeddings.patch_embeddings.projection.weight.detach().float().cpu().numpy()


class DeiT(Family):
    """DeiT (facebook/deit-*): CLS, distillation token, patches; both prefix tokens have position rows."""

    name = "DeiT"
    model_types = ("deit",)

    def prefix_kinds(self, config) -> tuple[str, ...]:
        return ("CLS", "DIST")

    def position_prefix_rows(self, config) -> int:
        return 2


class Dinov2(Family):
    """DINOv2 (facebook/dinov2-*): interpolates its 37 x 37 position grid to any input by itself."""

    name = "DINOv2"
    model_types = ("dinov2",)
    interpolate_kwarg = False


class Dinov2Registers(Dinov2):
    """DINOv2 with registers: CLS, k registers (no position rows), patches."""

    name = "DINOv2 with registers"
    model_types = ("dinov2_with_registers",)

    def prefix_kinds(self, config) -> tuple[str, ...]:
        return ("CLS", *(f"REG{i + 1}" for i in range(config.num_register_tokens)))


class Beit(Family):
    """BEiT: relative position bias by default, so usually no absolute position embeddings."""

    name = "BEiT"
    model_types = ("beit",)

    def position_table(self, base_model: torch.nn.Module, config) -> torch.Tensor | None:
        if not getattr(config, "use_absolute_position_embeddings", False):
            return None
        return super().position_table(base_model, config)

    def position_note(self, config) -> str:
        if getattr(config, "use_absolute_position_embeddings", False):
            return ""
        return "BEiT encodes position with a relative position bias inside attention; it has no absolute position embeddings."


FAMILIES: tuple[Family, ...] = (Family(), DeiT(), Dinov2(), Dinov2Registers(), Beit())
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def supported_model_types() -> tuple[str, ...]:
    return tuple(_BY_TYPE)


def family_for(config) -> Family:
    """The adapter for a ``transformers`` config, or :class:`UnsupportedModelError` naming the family."""
    model_type = getattr(config, "model_type", None)
    if model_type in _BY_TYPE:
        return _BY_TYPE[model_type]
    names = ", ".join(f.name for f in FAMILIES)
    raise UnsupportedModelError(
        f"'{model_type}' models are not supported: vitviz explains plain Vision Transformers "
        f"({names}; model types {', '.join(supported_model_types())}). "
        "Choose a ViT-family checkpoint such as google/vit-base-patch16-224 or the bundled 'demo' model."
    )
