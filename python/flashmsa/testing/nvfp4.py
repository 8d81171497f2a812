"""NVFP4 in the layout the ops read: e2m1 values two per byte (the even element in the low nibble)
and e4m3 block scales, one per 16 values, in the 128x4 swizzled layout (docs/semantics.md)."""

import math
from typing import Optional, Tuple

import torch

HEAD_DIM = 128
NVFP4_SF_VEC = 16  # values per block scale
_SCALE_COLS = HEAD_DIM // NVFP4_SF_VEC  # 8 scales per 128-value row
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7; code | 8 is the negative


def _code_table() -> Tuple[int, ...]:
    """The e2m1 code of a value v, indexed by ``ceil(4 |v|)`` (at most 21), plus 22 for negative
    v: the nearest magnitude with ties to the smaller one (the midpoints between magnitudes are
    multiples of 1/4, so ``ceil(4 |v|) = k`` puts ``|v|`` in ``((k - 1) / 4, k / 4]``, above the
    midpoints ``<= (k - 1) / 4``), ``| 8`` for a negative v of nonzero code."""
    mids4 = [int(2 * (a + b)) for a, b in zip(E2M1_MAGNITUDES, E2M1_MAGNITUDES[1:])]
    pos = tuple(sum(m <= k - 1 for m in mids4) for k in range(22))
    return pos + tuple(c | 8 if c else 0 for c in pos)


_CODES = _code_table()


def nvfp4_scale_offsets(rows: int, device=None) -> torch.Tensor:
    """``(rows, 8)`` int64 byte offsets of each row's scales in the 128x4 swizzled buffer: scale
    ``c`` of row ``r`` sits at ``((r // 128) * 2 + c // 4) * 512 + (r % 32) * 16
    + ((r % 128) // 32) * 4 + c % 4``."""
    r = torch.arange(rows, device=device).unsqueeze(1)
    c = torch.arange(_SCALE_COLS, device=device).unsqueeze(0)
    col_tiles = (_SCALE_COLS + 3) // 4
    return ((r // 128) * col_tiles + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)


def nvfp4_scale_bytes(rows: int) -> int:
    """Bytes of a scale buffer for ``rows`` 128-value rows (rows padded to a multiple of 128)."""
    return math.ceil(rows / 128) * 128 * _SCALE_COLS


def quantize_nvfp4(x: torch.Tensor, global_scale: Optional[float] = None
                   ) -> Tuple[torch.Tensor, torch.Tensor, float]:
    """Quantise ``x (..., 128)`` to NVFP4.

    Returns ``(data, scales, dequant_global_scale)``: ``data (..., 64)`` uint8 with the even element
    in the low nibble; ``scales`` the flat uint8 e4m3 block scales of the rows of ``x`` taken in
    memory order (so flat caches get ``token * Hkv + head`` and paged caches
    ``(page * Hkv + head) * 128 + token``), 128x4-swizzled; and the float the ops take as
    ``k_global_scale`` / ``v_global_scale``. ``global_scale`` defaults to ``448 * 6 / amax(x)``.
    Each 16-value block of ``x * global_scale`` gets the e4m3 scale ``amax / 6`` and e2m1 codes
    rounded to the nearest magnitude.
    """
    if x.shape[-1] != HEAD_DIM:
        raise ValueError(f"x must end in {HEAD_DIM} values, got {tuple(x.shape)}")
    xf = x.float().reshape(-1, HEAD_DIM)
    rows = xf.shape[0]
    if global_scale is None:
        amax = xf.abs().max().item() if xf.numel() else 0.0
        global_scale = 448.0 * 6.0 / amax if amax > 0 else 1.0
    blocks = (xf * global_scale).reshape(rows, _SCALE_COLS, NVFP4_SF_VEC)
    sf = (blocks.abs().amax(dim=-1) / 6.0).clamp(max=448.0).to(torch.float8_e4m3fn)
    sf_f = sf.float().unsqueeze(-1)
    # Blocks of scale 0 (or NaN) divide by inf: code 0. NaN and +-inf values get code 0 too.
    scaled = (blocks / torch.where(sf_f > 0, sf_f, math.inf)).nan_to_num_(0.0, 0.0, 0.0)
    index = (scaled * 4).abs_().ceil_().clamp_(max=21)
    index += (scaled < 0) * 22.0
    code = torch.tensor(_CODES, dtype=torch.uint8, device=x.device)[index.long()]
    code = code.reshape(rows, HEAD_DIM)
    data = code[:, 0::2] | (code[:, 1::2] << 4)
    scales = torch.zeros(nvfp4_scale_bytes(rows), dtype=torch.uint8, device=x.device)
    scales[nvfp4_scale_offsets(rows, x.device).reshape(-1)] = sf.view(torch.uint8).reshape(-1)
    return data.reshape(*x.shape[:-1], HEAD_DIM // 2), scales, 1.0 / global_scale


def dequantize_nvfp4(data: torch.Tensor, scales: torch.Tensor, global_scale: float = 1.0,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of NVFP4 ``data (..., 64)`` with ``scales`` laid out as by :func:`quantize_nvfp4`,
    times ``global_scale``, computed in ``dtype`` (e2m1 * e4m3 products are exact in float32)."""
    flat = data.reshape(-1, HEAD_DIM // 2)
    rows = flat.shape[0]
    table = torch.tensor(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES), dtype=dtype,
                         device=data.device)
    byte = torch.arange(256, device=data.device)
    pairs = torch.stack([table[byte & 0xF], table[byte >> 4]], dim=-1)  # a byte's two values
    values = pairs[flat.long()].reshape(rows, _SCALE_COLS, NVFP4_SF_VEC)
    sf_bytes = scales[nvfp4_scale_offsets(rows, data.device).reshape(-1)].reshape(rows, _SCALE_COLS)
    sf = sf_bytes.view(torch.float8_e4m3fn).to(dtype).unsqueeze(-1)
    out = values * sf
    if global_scale != 1.0:
        out = out * global_scale
    return out.reshape(*data.shape[:-1], HEAD_DIM)
