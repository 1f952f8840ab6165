"""Decompositions the importer writes itself, for ATen operators PyTorch has none for.

Each is a function of torch tensors traced by ``run_decompositions`` (``torch_importer.decomposition_table``),
so the operators it calls are decomposed in turn:

- ``aten._trilinear`` (what ``nn.Bilinear`` and ``F.bilinear`` call) becomes one ``torch.einsum``, which torch
  lowers to permutes, reshapes and batched matrix products (no ``(N, out, in1, in2)`` intermediate);
- ``aten.grid_sampler_3d`` (``F.grid_sample`` of a volume: voxel-grid radiance fields, 3-D spatial
  transformers) becomes eight (trilinear) or one (nearest) gathers of the flattened volume, weighted; the
  gradient w.r.t. the grid comes from the weights, as ATen's;
- ``aten.upsample_bilinear2d.vec`` (``F.interpolate(mode="bilinear")``) becomes the ``.default`` overload with
  its output size and scale factors, which the importer converts to one ``image.resize2d``, where the image
  sizes are static; with a symbolic height or width, PyTorch's own decomposition (gathers and blends);
- ``aten.lstm.input`` (``nn.LSTM`` over a padded batch) becomes one ``mkldnn_rnn_layer`` per layer and direction
  (converted to one ``nn.lstm``), with the dropout between layers where eager applies it, in place of PyTorch's
  decomposition into every step's cell (2,400 operators a training step for a 2-layer LSTM over 32 steps); an
  LSTM with projections (``proj_size``) or mixed dtypes keeps PyTorch's decomposition.
"""

from __future__ import annotations

from string import ascii_letters


def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """``aten._trilinear``: each input gets unit dims at its ``expand`` positions (all three then have rank
    ``i1.dim() + len(expand1)``); the result is their broadcast product summed over ``sumdim``.
    ``unroll_dim`` only chooses ATen's loop order."""
    import torch

    rank = i1.dim() + len(expand1)

    def labels(skipped) -> str:  # the positions without a unit dim (an input's dims), or the result's
        return "".join(ascii_letters[d] for d in range(rank) if d not in set(skipped))

    spec = f"{labels(expand1)},{labels(expand2)},{labels(expand3)}->{labels(sumdim)}"
    return torch.einsum(spec, i1, i2, i3)


def _source_coordinate(c, size: int, padding_mode: int, align_corners: bool):
    """Grid coordinates in [-1, 1] as positions along an axis of ``size`` voxels, after the padding mode's
    clamp (1: border) or reflection (2: reflection, about the outer voxel centers or edges)."""
    import torch

    if align_corners:
        x = (c + 1) * ((size - 1) / 2)
        low, span = 0.0, float(size - 1)
    else:
        x = ((c + 1) * size - 1) / 2
        low, span = -0.5, float(size)
    if padding_mode == 2:
        if span <= 0:
            return torch.zeros_like(x)
        d = (x - low).abs()
        extra = torch.fmod(d, span)
        odd = torch.fmod(torch.floor(d / span), 2) != 0
        x = torch.where(odd, span + low - extra, extra + low)
    if padding_mode in (1, 2):
        x = x.clamp(0, size - 1)
    return x


def grid_sampler_3d(volume, grid, interpolation_mode: int = 0, padding_mode: int = 0, align_corners: bool = False):
    """``aten.grid_sampler_3d``: ``volume`` (N, C, D, H, W) read at ``grid`` (N, oD, oH, oW, 3) holding (x, y, z)
    in [-1, 1]; trilinear (0) or nearest (1) interpolation; voxels outside read 0 (padding 0), the border (1) or
    the reflection (2)."""
    import torch

    if interpolation_mode not in (0, 1):
        raise ValueError(f"grid_sampler_3d: interpolation mode {interpolation_mode} (bicubic is 2-D only)")
    n, c, d, h, w = volume.shape
    od, oh, ow = grid.shape[1:4]
    flat = volume.reshape(n, c, d * h * w)
    pts = [_source_coordinate(grid[..., k], size, padding_mode, align_corners) for k, size in enumerate((w, h, d))]

    def read(ix, iy, iz, weight):
        inside = (ix >= 0) & (ix <= w - 1) & (iy >= 0) & (iy <= h - 1) & (iz >= 0) & (iz <= d - 1)
        pos = torch.where(inside, (iz * h + iy) * w + ix, torch.zeros_like(ix)).to(torch.int64)
        taken = flat.gather(2, pos.reshape(n, 1, -1).expand(n, c, od * oh * ow))
        return taken * torch.where(inside, weight, torch.zeros_like(weight)).reshape(n, 1, -1)

    if interpolation_mode == 1:
        near = [p.round() for p in pts]
        out = read(*near, torch.ones_like(pts[0]))
    else:
        lo = [p.floor() for p in pts]
        frac = [p - q for p, q in zip(pts, lo)]
        out = None
        for corner in range(8):
            bits = [(corner >> k) & 1 for k in range(3)]
            idx = [q + b for q, b in zip(lo, bits)]
            weight = None
            for f, b in zip(frac, bits):
                term = f if b else 1 - f
                weight = term if weight is None else weight * term
            part = read(*idx, weight)
            out = part if out is None else out + part
    return out.reshape(n, c, od, oh, ow)


def upsample_bilinear2d(x, output_size, align_corners: bool, scale_factors):
    """``aten.upsample_bilinear2d.vec``: the ``.default`` overload (sizes and scales explicit) where the input's
    height and width and the output size are static ints, else PyTorch's decomposition."""
    import torch
    from torch._decomp import decomposition_table
    from torch._decomp.decompositions import upsample_compute_output_size

    size = upsample_compute_output_size(x.size(), output_size, scale_factors)
    if not all(type(d) is int for d in (*x.shape[2:], *size)):
        return decomposition_table[torch.ops.aten.upsample_bilinear2d.vec](x, output_size, align_corners, scale_factors)
    scales = scale_factors if scale_factors else (None, None)
    return torch.ops.aten.upsample_bilinear2d.default(x, list(size), align_corners, *scales)


def _one_layer_lstm(inp, hidden, params, has_biases, reverse=False):
    """One direction of one layer as ATen's oneDNN layer (``mkldnn_rnn_layer``, which the importer converts to
    ``nn.lstm``): ``(y, (h_T, c_T))`` of a (T, B, I) input and (B, H) states, ``_rnn_helper``'s layer function."""
    import torch

    w_ih, w_hh = params[0], params[1]
    b_ih, b_hh = (params[2], params[3]) if has_biases else (w_ih.new_zeros(w_ih.shape[0]), w_hh.new_zeros(w_hh.shape[0]))
    h0, c0 = hidden
    y, hy, cy, _ = torch.ops.aten.mkldnn_rnn_layer.default(inp, w_ih, w_hh, b_ih, b_hh, h0, c0, reverse, [], 2,
                                                           h0.shape[-1], 1, has_biases, False, False, False)
    return y, (hy, cy)


def lstm(input, hx, params, has_biases: bool, num_layers: int, dropout: float, train: bool, bidirectional: bool,
         batch_first: bool):
    """``aten.lstm.input``: PyTorch's layer loop (``_rnn_helper``: directions, ``batch_first``, and the dropout
    between layers as ``export_repairs.rnn_dropout_between_layers`` applies it) over one ``mkldnn_rnn_layer``
    per layer and direction; PyTorch's own decomposition for projections or mixed dtypes."""
    import torch
    from torch._decomp import decomposition_table
    from torch._decomp import decompositions as torch_decompositions

    tensors = [input, *hx, *params]
    if len(hx) != 2 or hx[0].shape[-1] != hx[1].shape[-1] or len({t.dtype for t in tensors}) != 1 \
            or not input.dtype.is_floating_point:
        return decomposition_table[torch.ops.aten.lstm.input](input, hx, params, has_biases, num_layers, dropout, train,
                                                              bidirectional, batch_first)
    params = torch_decompositions.gather_params(params, has_biases, False)
    out, finals = torch_decompositions._rnn_helper(input, list(zip(hx[0], hx[1])), params, has_biases, num_layers,
                                                   dropout, train, bidirectional, batch_first, _one_layer_lstm)
    h, c = zip(*finals)
    return out, torch.stack(h, 0), torch.stack(c, 0)


def own_decompositions() -> dict:
    """``{ATen overload: decomposition}`` for the operators above."""
    import torch

    aten = torch.ops.aten
    return {aten._trilinear.default: trilinear, aten.grid_sampler_3d.default: grid_sampler_3d,
            aten.upsample_bilinear2d.vec: upsample_bilinear2d, aten.lstm.input: lstm}


__all__ = ["own_decompositions", "trilinear", "grid_sampler_3d", "upsample_bilinear2d", "lstm"]
