"""DAT's attention blocks (Xia et al. 2022), as the authors' v1 code (LeapLabTHU/DAT, 81c67ea) computes them.

Three kinds of block, chosen per block by the configuration's ``stage_spec``:

* ``L``, :class:`LocalAttention`: attention within non-overlapping w x w windows of the
  stage map, with a Swin-style relative position bias table ``((2w - 1)^2, heads)``
  indexed by ``relative_position_index`` (a buffer in the state dict);
* ``S``, :class:`ShiftWindowAttention`: the same after rolling the map by
  ``(-s, -s)`` with ``s = ceil(w / 2)`` (Swin uses ``w // 2``), with the region mask
  ``attn_mask`` (a buffer, value -100 between regions) built for the stage map the
  model was made for;
* ``D``, :class:`DAttentionBaseline`: deformable attention. The query projection
  ``proj_q(x)`` goes, per group of ``heads // groups`` heads, through the offset network
  (depth-wise k x k conv with bias, channel LayerNorm, GELU, 1 x 1 conv to 2 channels:
  0 = y, 1 = x); offsets ``tanh(o) * (1 / Hk, 1 / Wk) * factor`` are added to the
  reference points (pixel centres ``(i + 0.5) / H * 2 - 1``, unclamped); the *block
  input* x is sampled there with ``grid_sample`` (bilinear, ``align_corners=True``,
  zero padding, (x, y) order: mixed conventions copied as they are), and only then
  projected by ``proj_k`` / ``proj_v``. Logits ``q k * head_dim ** -0.5`` plus a bias
  sampled from ``rpe_table (heads, 2H - 1, 2W - 1)`` at ``(query grid - sampled
  position) * 0.5``, softmax over the sampled keys, ``proj_out``.

Every block hands its post-softmax probabilities to ``attn_drop`` (a :class:`AttnDrop`:
dropout in training, the identity in eval), together with the sampled positions for
``D`` blocks, so that a forward hook sees the very tensor the block goes on with and
where its keys were sampled. Dropout and drop-path modules hold no parameters, so
the state-dict keys are the authors'.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "AttnDrop",
    "BlockEnd",
    "LayerNormProxy",
    "TransformerMLP",
    "LocalAttention",
    "ShiftWindowAttention",
    "DAttentionBaseline",
    "reference_points",
]


class AttnDrop(nn.Module):
    """Dropout on attention probabilities; also the place where hooks read them (and D blocks' sampled positions).

    ``forward(attn, positions=None)`` returns ``attn`` (dropped out in training only).
    ``positions`` is ``(B * groups, Hk, Wk, 2)`` in (y, x) normalised coordinates for
    deformable blocks, None for window blocks; it only travels to the hooks.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, attn: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        return F.dropout(attn, self.p, self.training)


class BlockEnd(nn.Module):
    """Marks the end of one block (after both residual adds): ``forward(x_in, x)`` returns the block output ``x``.

    A hook on it sees the block's input (the residual stream entering the block, the
    very tensor the block computed from) as its first argument and the output as its
    result, as vitviz's hooks expect of a block module.
    """

    def forward(self, x_in: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x


class LayerNormProxy(nn.Module):
    """LayerNorm over the channels of a ``(B, C, H, W)`` map (eps 1e-5, PyTorch's default)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class TransformerMLP(nn.Module):
    """``linear2(GELU(linear1(x)))`` per token; keys ``chunk.linear1``, ``chunk.linear2`` as the authors name them."""

    def __init__(self, channels: int, expansion: int, drop: float) -> None:
        super().__init__()
        self.chunk = nn.Sequential()
        self.chunk.add_module("linear1", nn.Linear(channels, channels * expansion))
        self.chunk.add_module("act", nn.GELU())
        self.chunk.add_module("drop1", nn.Dropout(drop))
        self.chunk.add_module("linear2", nn.Linear(channels * expansion, channels))
        self.chunk.add_module("drop2", nn.Dropout(drop))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.chunk(x.flatten(2).transpose(1, 2))
        return y.transpose(1, 2).reshape(b, c, h, w)


def _windows(x: torch.Tensor, w: int) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B * nW, w * w, C)``: windows row-major over the map, tokens row-major in a window."""
    b, c, h, wd = x.shape
    x = x.reshape(b, c, h // w, w, wd // w, w).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b * (h // w) * (wd // w), w * w, c)


def _unwindows(x: torch.Tensor, w: int, b: int, h: int, wd: int) -> torch.Tensor:
    """Inverse of :func:`_windows`: ``(B * nW, w * w, C)`` -> ``(B, C, H, W)``."""
    c = x.shape[-1]
    x = x.reshape(b, h // w, wd // w, w, w, c).permute(0, 5, 1, 3, 2, 4)
    return x.reshape(b, c, h, wd)


class LocalAttention(nn.Module):
    """Window attention (``L``): softmax(q k / sqrt(d) + relative bias [+ mask]) within each w x w window."""

    def __init__(self, dim: int, heads: int, window_size: int, attn_drop: float, proj_drop: float) -> None:
        super().__init__()
        self.proj_qkv = nn.Linear(dim, 3 * dim)
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.proj_out = nn.Linear(dim, dim)
        self.window_size = (window_size, window_size)
        self.attn_drop = AttnDrop(attn_drop)
        self.proj_drop = nn.Dropout(proj_drop)
        w = window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * w - 1) * (2 * w - 1), heads))
        coords = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()  # query - key
        rel[:, :, 0] += w - 1
        rel[:, :, 1] += w - 1
        rel[:, :, 0] *= 2 * w - 1
        self.register_buffer("relative_position_index", rel.sum(-1))  # persistent: the authors' keys have it

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        b, c, h, wd = x.shape
        w = self.window_size[0]
        tokens = _windows(x, w)
        q, k, v = torch.chunk(self.proj_qkv(tokens), 3, dim=2)
        q = q * self.scale
        q, k, v = (t.reshape(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attn = torch.einsum("bhmc,bhnc->bhmn", q, k)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(w * w, w * w, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nw, ww, _ = mask.shape
            attn = attn.reshape(-1, nw, self.heads, ww, ww) + mask.reshape(1, nw, 1, ww, ww)
            attn = attn.reshape(-1, self.heads, ww, ww)
        attn = self.attn_drop(attn.softmax(dim=3))
        out = torch.einsum("bhmn,bhnc->bhmc", attn, v).transpose(1, 2).reshape(tokens.shape[0], w * w, c)
        out = self.proj_drop(self.proj_out(out))
        return _unwindows(out, w, b, h, wd), None, None


class ShiftWindowAttention(LocalAttention):
    """Shifted-window attention (``S``): roll by ``(-s, -s)``, window attention with the region mask, roll back."""

    def __init__(
        self,
        dim: int,
        heads: int,
        window_size: int,
        attn_drop: float,
        proj_drop: float,
        shift_size: int,
        fmap_size: tuple[int, int],
    ) -> None:
        super().__init__(dim, heads, window_size, attn_drop, proj_drop)
        self.fmap_size = fmap_size
        self.shift_size = shift_size
        w, s = window_size, shift_size
        if not 0 < s < w:
            raise ValueError(f"shift {s} must lie strictly between 0 and the window {w}")
        img_mask = torch.zeros(*fmap_size)
        slices = (slice(0, -w), slice(-w, -s), slice(-s, None))
        cnt = 0
        for hs in slices:
            for ws in slices:
                img_mask[hs, ws] = cnt
                cnt += 1
        regions = _windows(img_mask[None, None], w)[..., 0]  # (nW, w * w)
        mask = regions.unsqueeze(1) - regions.unsqueeze(2)
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        self.register_buffer("attn_mask", mask)  # persistent: the authors' keys have it

    def forward(self, x: torch.Tensor):
        s = self.shift_size
        shifted = torch.roll(x, shifts=(-s, -s), dims=(2, 3))
        out, _, _ = super().forward(shifted, self.attn_mask)
        return torch.roll(out, shifts=(s, s), dims=(2, 3)), None, None


def reference_points(h: int, w: int, batch: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Pixel-centre reference points ``(batch, h, w, 2)`` in (y, x) order, ``(i + 0.5) / n * 2 - 1``.

    The same float operations as the authors' ``_get_ref_points`` (linspace, then divide,
    multiply, subtract), so that sampled positions agree to the bit.
    """
    ref_y, ref_x = torch.meshgrid(
        torch.linspace(0.5, h - 0.5, h, dtype=dtype, device=device),
        torch.linspace(0.5, w - 0.5, w, dtype=dtype, device=device),
        indexing="ij",
    )
    ref = torch.stack((ref_y, ref_x), -1)
    ref[..., 1].div_(w).mul_(2).sub_(1)
    ref[..., 0].div_(h).mul_(2).sub_(1)
    return ref[None].expand(batch, -1, -1, -1)


class DAttentionBaseline(nn.Module):
    """Deformable attention (``D``), see the module docstring; returns ``(y, positions, references)``.

    ``positions`` and ``references``: ``(B, groups, Hk, Wk, 2)`` in (y, x) normalised
    coordinates; feature-map pixel ``(p + 1) / 2 * (n - 1)`` (``align_corners=True``).
    """

    def __init__(
        self,
        fmap_size: tuple[int, int],
        heads: int,
        head_channels: int,
        groups: int,
        attn_drop: float,
        proj_drop: float,
        stride: int,
        offset_range_factor: float,
        use_pe: bool,
        kernel_size: int,
    ) -> None:
        super().__init__()
        self.n_head_channels = head_channels
        self.scale = head_channels**-0.5
        self.n_heads = heads
        self.q_h, self.q_w = fmap_size
        self.nc = head_channels * heads
        self.n_groups = groups
        self.n_group_channels = self.nc // groups
        self.n_group_heads = heads // groups
        self.use_pe = use_pe
        self.offset_range_factor = offset_range_factor
        kk, gc = kernel_size, self.n_group_channels
        self.conv_offset = nn.Sequential(
            nn.Conv2d(gc, gc, kk, stride, kk // 2, groups=gc),
            LayerNormProxy(gc),
            nn.GELU(),
            nn.Conv2d(gc, 2, 1, 1, 0, bias=False),
        )
        self.proj_q = nn.Conv2d(self.nc, self.nc, 1)
        self.proj_k = nn.Conv2d(self.nc, self.nc, 1)
        self.proj_v = nn.Conv2d(self.nc, self.nc, 1)
        self.proj_out = nn.Conv2d(self.nc, self.nc, 1)
        self.proj_drop = nn.Dropout(proj_drop)
        self.attn_drop = AttnDrop(attn_drop)
        if use_pe:
            self.rpe_table = nn.Parameter(torch.zeros(heads, self.q_h * 2 - 1, self.q_w * 2 - 1))
        else:
            self.rpe_table = None

    def offsets(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(positions, references)`` ``(B * groups, Hk, Wk, 2)`` (y, x) from the projected queries ``q``."""
        b = q.shape[0]
        q_off = q.reshape(b * self.n_groups, self.n_group_channels, q.shape[2], q.shape[3])
        offset = self.conv_offset(q_off)  # (B * g, 2, Hk, Wk)
        hk, wk = offset.shape[2], offset.shape[3]
        if self.offset_range_factor > 0:
            offset_range = torch.tensor([1.0 / hk, 1.0 / wk], device=q.device).reshape(1, 2, 1, 1)
            offset = offset.tanh().mul(offset_range).mul(self.offset_range_factor)
        offset = offset.permute(0, 2, 3, 1)
        reference = reference_points(hk, wk, b * self.n_groups, q.dtype, q.device)
        pos = offset + reference if self.offset_range_factor >= 0 else (offset + reference).tanh()
        return pos, reference

    def forward(self, x: torch.Tensor):
        b, c, h, w = x.shape
        q = self.proj_q(x)
        pos, reference = self.offsets(q)
        hk, wk = pos.shape[1], pos.shape[2]
        n_sample = hk * wk
        x_sampled = F.grid_sample(
            x.reshape(b * self.n_groups, self.n_group_channels, h, w),
            pos[..., (1, 0)],
            mode="bilinear",
            align_corners=True,
        ).reshape(b, c, 1, n_sample)
        q = q.reshape(b * self.n_heads, self.n_head_channels, h * w)
        k = self.proj_k(x_sampled).reshape(b * self.n_heads, self.n_head_channels, n_sample)
        v = self.proj_v(x_sampled).reshape(b * self.n_heads, self.n_head_channels, n_sample)
        attn = torch.einsum("bcm,bcn->bmn", q, k).mul(self.scale)  # (B * heads, HW, Ns)
        if self.rpe_table is not None:
            rpe = self.rpe_table[None].expand(b, -1, -1, -1)
            q_grid = reference_points(h, w, b * self.n_groups, x.dtype, x.device)
            displacement = (
                q_grid.reshape(b * self.n_groups, h * w, 2).unsqueeze(2)
                - pos.reshape(b * self.n_groups, n_sample, 2).unsqueeze(1)
            ).mul(0.5)
            bias = F.grid_sample(
                rpe.reshape(b * self.n_groups, self.n_group_heads, 2 * h - 1, 2 * w - 1),
                displacement[..., (1, 0)],
                mode="bilinear",
                align_corners=True,
            )
            attn = attn + bias.reshape(b * self.n_heads, h * w, n_sample)
        attn = self.attn_drop(F.softmax(attn, dim=2), pos)
        out = torch.einsum("bmn,bcn->bcm", attn, v).reshape(b, c, h, w)
        y = self.proj_drop(self.proj_out(out))
        return y, pos.reshape(b, self.n_groups, hk, wk, 2), reference.reshape(b, self.n_groups, hk, wk, 2)


def shift_for(window: int) -> int:
    """The authors' shift of ``S`` blocks: ``ceil(w / 2)`` (4 for windows of 7; Swin uses 3)."""
    return math.ceil(window / 2)
