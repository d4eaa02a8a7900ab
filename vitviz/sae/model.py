"""A sparse autoencoder (SAE) on one named point's activations, in SAELens' conventions.

References: SAELens (``sae_lens/saes/``: the parameter names, ``cfg.json`` + ``sae_weights.safetensors``),
Gao et al. 2024 "Scaling and evaluating sparse autoencoders" (TopK), Bricken et al. 2023 (the decoder's unit-norm
rows, the dashboard). A width ``d_in`` activation ``x`` (one token) is encoded into ``d_sae`` feature activations:

* input normalisation (``normalize_activations``, applied per token and undone after decoding):
  ``none``; ``layer_norm`` (``(x - mean(x)) / (std(x) + 1e-5)``, ``std`` with Bessel's correction, as SAELens and
  ViT-Prisma compute it); ``constant_norm_rescale`` (``x * sqrt(d_in) / ||x||``);
* ``pre = (x - b_dec) @ W_enc + b_enc`` when ``apply_b_dec_to_input`` (SAELens' and ViT-Prisma's default), else
  ``x @ W_enc + b_enc`` (saev);
* the activation: ``relu``: ``ReLU(pre)``; ``topk``: the ``k`` largest entries of ``pre`` kept, ReLU applied to
  them (``topk_relu``; saev's TopK keeps them as they are), every other entry 0; ``jumprelu``: ``ReLU(pre)`` where
  ``pre > threshold`` (per feature), else 0;
* decoding: ``x_hat = f @ W_dec + b_dec`` (then the normalisation undone with the input's own statistics).

Shapes: ``W_enc (d_in, d_sae)``, ``b_enc (d_sae,)``, ``W_dec (d_sae, d_in)``, ``b_dec (d_in,)``, ``threshold
(d_sae,)`` (jumprelu only). A feature's direction in the activation space is its decoder row ``W_dec[i]``.

The module holds no per-call state (SAELens keeps the normalisation's statistics on the module between
``encode`` and ``decode``; here :meth:`SparseAutoencoder.encode_with_stats` returns them), so one loaded SAE may
serve many threads at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import torch

from vitviz.errors import VitvizError

__all__ = [
    "SAEError",
    "SAEConfig",
    "SparseAutoencoder",
    "Activation",
    "Normalisation",
    "Tokens",
    "CFG_FILE",
    "WEIGHTS_FILE",
    "SAELENS_FORMAT_VERSION",
    "save_sae",
]

Activation = Literal["topk", "relu", "jumprelu"]
Normalisation = Literal["none", "layer_norm", "constant_norm_rescale"]
Tokens = Literal["patches", "all"]
ACTIVATIONS: tuple[str, ...] = ("topk", "relu", "jumprelu")
NORMALISATIONS: tuple[str, ...] = ("none", "layer_norm", "constant_norm_rescale")
CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
# The SAELens config layout vitviz writes (its 6.x ``cfg.json``: ``architecture``, ``metadata`` with ``hook_name``);
# SAELens reads a folder without this version as an older layout and renames its keys.
SAELENS_FORMAT_VERSION = "6.0.0"
LN_EPS = 1e-5  # SAELens' and ViT-Prisma's layer_norm normalisation


class SAEError(VitvizError):
    """An SAE that cannot be read or does not fit the model; the message says why and what to do."""


@dataclass(frozen=True)
class SAEConfig:
    """What an SAE is: its shapes and encoding (SAELens' fields), and where vitviz reads it (vitviz's own).

    ``point``: the vitviz point it reads (``blocks.2.out``); ``model``: the model it was trained on (as given to
    vitviz: ``demo``, a folder, a hub id; None: unknown); ``tokens``: what it was trained on (``patches``: patch
    tokens only; ``all``: every token, prefix tokens included; None: unknown); ``source``: the format it was read
    from (``vitviz``, ``saelens``, ``prisma``, ``saev``); ``hook_name``: the name the checkpoint gave its point
    (TransformerLens' where it had one); ``notes``: what reading it assumed, for display.
    """

    d_in: int
    d_sae: int
    activation: Activation = "topk"
    k: int | None = 32  # topk: features kept per token
    topk_relu: bool = True  # topk: ReLU on the kept values (SAELens, Gao et al.); saev keeps them as they are
    apply_b_dec_to_input: bool = True
    normalize_activations: Normalisation = "none"
    point: str | None = None
    model: str | None = None
    tokens: Tokens | None = None
    source: str = "vitviz"
    hook_name: str | None = None
    notes: tuple[str, ...] = ()
    training: Mapping[str, Any] = field(default_factory=dict)  # how a vitviz SAE was trained (seed, steps, ...)

    def __post_init__(self) -> None:
        for name in ("d_in", "d_sae"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SAEError(f"an SAE's {name} must be a positive integer, got {v!r}")
        if self.activation not in ACTIVATIONS:
            raise SAEError(f"unknown SAE activation {self.activation!r}: vitviz reads {', '.join(ACTIVATIONS)}")
        if self.activation == "topk":
            k = self.k
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.d_sae:
                raise SAEError(f"a TopK SAE needs k in 1..d_sae ({self.d_sae}), got {k!r}")
        if self.normalize_activations not in NORMALISATIONS:
            raise SAEError(
                f"unknown input normalisation {self.normalize_activations!r}: vitviz applies "
                f"{', '.join(NORMALISATIONS)}"
            )
        if self.tokens not in (None, "patches", "all"):
            raise SAEError(f"an SAE's tokens are 'patches' or 'all', got {self.tokens!r}")

    @property
    def expansion(self) -> float:
        return self.d_sae / self.d_in

    def describe(self) -> str:
        """One line for display: ``TopK (k = 32), 1536 features on blocks.2.out (96 wide), patch tokens``."""
        act = {"topk": f"TopK (k = {self.k})", "relu": "ReLU", "jumprelu": "JumpReLU"}[self.activation]
        where = f" on {self.point}" if self.point else ""
        toks = {"patches": ", patch tokens", "all": ", every token", None: ""}[self.tokens]
        norm = "" if self.normalize_activations == "none" else f", inputs normalised ({self.normalize_activations})"
        return f"{act}, {self.d_sae} features{where} ({self.d_in} wide){toks}{norm}"

    # --- cfg.json ------------------------------------------------------------------------------------------

    def to_cfg(self) -> dict[str, Any]:
        """SAELens' ``cfg.json`` (its 6.x layout) plus vitviz's own keys (``vitviz_*``)."""
        from vitviz.models.points import TRANSFORMER_LENS_NAMES

        hook = self.hook_name
        if hook is None and self.point is not None:
            stem, part = _split_point(self.point)
            if stem is not None and part in TRANSFORMER_LENS_NAMES:
                hook = f"{stem}.{TRANSFORMER_LENS_NAMES[part]}"
        cfg: dict[str, Any] = {
            "architecture": self.activation if self.activation != "relu" else "standard",
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "dtype": "float32",
            "device": "cpu",
            "apply_b_dec_to_input": self.apply_b_dec_to_input,
            "normalize_activations": self.normalize_activations,
            "reshape_activations": "none",
            "metadata": {
                "sae_lens_version": SAELENS_FORMAT_VERSION,
                "model_name": self.model,
                "hook_name": hook,
                "hook_head_index": None,
            },
        }
        if self.activation == "topk":
            cfg["k"] = self.k
            cfg["rescale_acts_by_decoder_norm"] = False
        cfg.update(
            {
                "vitviz_point": self.point,
                "vitviz_model": self.model,
                "vitviz_tokens": self.tokens,
                "vitviz_normalisation": self.normalize_activations,
                "vitviz_topk_relu": self.topk_relu,
                "vitviz_training": dict(self.training),
            }
        )
        return cfg

    def with_(self, **changes: Any) -> SAEConfig:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["training"] = dict(self.training)
        return d


def _split_point(point: str) -> tuple[str | None, str]:
    """``blocks.2.attn.z`` -> (``blocks.2``, ``attn.z``); ``embed.out`` -> (None, ``embed.out``)."""
    parts = point.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if parts[i - 1] == "blocks" and parts[i].isdigit():
            return ".".join(parts[: i + 1]), ".".join(parts[i + 1 :])
    return None, point


class SparseAutoencoder(torch.nn.Module):
    """The SAE of :class:`SAEConfig` (module docstring for the arithmetic). Parameters in float32 on the CPU until
    moved; ``encode``/``decode`` accept any leading shape ``(..., d_in)`` / ``(..., d_sae)``."""

    def __init__(self, cfg: SAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.W_enc = torch.nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae))
        self.b_enc = torch.nn.Parameter(torch.zeros(cfg.d_sae))
        self.W_dec = torch.nn.Parameter(torch.zeros(cfg.d_sae, cfg.d_in))
        self.b_dec = torch.nn.Parameter(torch.zeros(cfg.d_in))
        if cfg.activation == "jumprelu":
            self.threshold = torch.nn.Parameter(torch.zeros(cfg.d_sae))

    @property
    def d_in(self) -> int:
        return self.cfg.d_in

    @property
    def d_sae(self) -> int:
        return self.cfg.d_sae

    @property
    def point(self) -> str | None:
        return self.cfg.point

    # --- normalisation ----------------------------------------------------------------------------------

    def normalise(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """``x`` ``(..., d_in)`` normalised per token as the config says, and the statistics that undo it
        (``(shift, scale)``, each ``(..., 1)``; None without normalisation): ``x = x_n * scale + shift``."""
        how = self.cfg.normalize_activations
        if how == "none":
            return x, None
        if how == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            centred = x - mu
            std = centred.std(dim=-1, keepdim=True)  # Bessel's correction, as SAELens and ViT-Prisma
            # SAELens divides by (std + eps) and multiplies back by std alone: the round trip scales by
            # std / (std + eps), which the error term absorbs; kept as SAELens has it.
            return centred / (std + LN_EPS), (mu, std)
        coeff = math.sqrt(self.d_in) / x.norm(dim=-1, keepdim=True)  # constant_norm_rescale
        return x * coeff, (torch.zeros_like(coeff), 1.0 / coeff)

    @staticmethod
    def denormalise(y: torch.Tensor, stats: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        if stats is None:
            return y
        shift, scale = stats
        return y * scale + shift

    # --- the encoder and decoder ------------------------------------------------------------------------

    def pre_activations(self, x_normalised: torch.Tensor) -> torch.Tensor:
        """``pre = (x - b_dec) W_enc + b_enc`` (without ``- b_dec`` unless ``apply_b_dec_to_input``) of an
        already normalised input ``(..., d_in)`` -> ``(..., d_sae)``."""
        sae_in = x_normalised - self.b_dec if self.cfg.apply_b_dec_to_input else x_normalised
        return sae_in @ self.W_enc + self.b_enc

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        """The activation function on pre-activations ``(..., d_sae)``."""
        act = self.cfg.activation
        if act == "relu":
            return torch.relu(pre)
        if act == "jumprelu":
            return torch.relu(pre) * (pre > self.threshold).to(pre.dtype)
        values, idx = torch.topk(pre, self.cfg.k, dim=-1, sorted=False)
        if self.cfg.topk_relu:
            values = torch.relu(values)
        return torch.zeros_like(pre).scatter(-1, idx, values)

    def encode_with_stats(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """Feature activations ``(..., d_sae)`` of ``x`` ``(..., d_in)`` and the normalisation's statistics."""
        self._check_width(x)
        xn, stats = self.normalise(x.to(self.W_enc.dtype))
        return self.activate(self.pre_activations(xn)), stats

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations ``(..., d_sae)`` of activations ``x`` ``(..., d_in)``."""
        return self.encode_with_stats(x)[0]

    def decode(self, f: torch.Tensor, stats: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``f @ W_dec + b_dec`` ``(..., d_in)``, the normalisation undone with ``stats`` (from
        :meth:`encode_with_stats` of the same input; needed when the SAE normalises its inputs)."""
        if self.cfg.normalize_activations != "none" and stats is None:
            raise SAEError(
                f"this SAE normalises its inputs ({self.cfg.normalize_activations}): decode needs the statistics "
                "encode_with_stats returned for the same input"
            )
        return self.denormalise(f @ self.W_dec + self.b_dec, stats)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction ``x_hat`` ``(..., d_in)`` of ``x``."""
        f, stats = self.encode_with_stats(x)
        return self.decode(f, stats)

    def _check_width(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.d_in:
            where = f" ({self.cfg.point})" if self.cfg.point else ""
            raise SAEError(
                f"this SAE reads activations {self.d_in} wide{where}; got {x.shape[-1]} wide: it was trained on "
                "another model or point"
            )

    # --- training helpers --------------------------------------------------------------------------------

    @torch.no_grad()
    def normalise_decoder(self) -> None:
        """Decoder rows to unit norm (a zero row stays zero)."""
        norms = self.W_dec.norm(dim=1, keepdim=True)
        self.W_dec.div_(torch.where(norms > 0, norms, torch.ones_like(norms)))

    @torch.no_grad()
    def remove_parallel_gradient(self) -> None:
        """Remove each decoder row's gradient component along the row (the step then keeps rows near unit norm:
        Bricken et al. 2023's advice, as SAELens, ViT-Prisma and saev do)."""
        g = self.W_dec.grad
        if g is None:
            return
        w = self.W_dec
        norm_sq = (w * w).sum(dim=1, keepdim=True)
        along = (g * w).sum(dim=1, keepdim=True) / torch.where(norm_sq > 0, norm_sq, torch.ones_like(norm_sq))
        g.sub_(along * w)

    def state(self) -> dict[str, torch.Tensor]:
        """The weights under SAELens' names (what ``sae_weights.safetensors`` holds), contiguous float32."""
        return {k: v.detach().to(torch.float32).contiguous() for k, v in self.state_dict().items()}


def save_sae(sae: SparseAutoencoder, folder: str | Path) -> Path:
    """Write ``folder/cfg.json`` and ``folder/sae_weights.safetensors`` (SAELens' layout, so the folder is also a
    SAELens SAE; vitviz's own keys travel in ``cfg.json``). Returns the folder."""
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (WEIGHTS_FILE + ".tmp")
    save_file(sae.state(), str(tmp), metadata={"format": "pt"})
    tmp.chmod(0o644)  # safetensors writes owner-only; the folder is shared (the bundled SAE ships in the package)
    tmp.replace(out / WEIGHTS_FILE)
    text = json.dumps(sae.cfg.to_cfg(), indent=2, sort_keys=True) + "\n"
    (out / (CFG_FILE + ".tmp")).write_text(text)
    (out / (CFG_FILE + ".tmp")).replace(out / CFG_FILE)
    return out


def config_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(SAEConfig))
