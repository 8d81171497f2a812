"""Helpers for tests, benchmarks and the demo: output poisoning, FP8/NVFP4 quantisation in the
layouts the ops read, and paged / packed K|V cache construction.

Nothing here computes an op's result: the tests keep their own independent torch references.
"""

import math
from typing import Optional, Sequence, Tuple

import torch

from . import _outputs

BLOCK_SIZE = 128  # tokens per KV block == tokens per page
HEAD_DIM = 128


class _PoisonScope:
    """Returned by :func:`poison_outputs`; restores the previous setting when used as a context."""

    def __init__(self, previous: bool):
        self.previous = previous

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _outputs.set_poison(self.previous)
        return False


def poison_outputs(enabled: bool = True) -> _PoisonScope:
    """Fill every output the ops allocate with NaN (float) or INT32_MIN (int32) before the op runs.

    An element the op forgets to write then shows up in comparisons instead of passing by luck
    (``torch.empty`` often hands back zeros). Works as a plain call or as a context manager::

        flashmsa.testing.poison_outputs(True)
        with flashmsa.testing.poison_outputs(): ...
    """
    return _PoisonScope(_outputs.set_poison(enabled))


def outputs_poisoned() -> bool:
    return _outputs.poisoned()


def empty(shape: Sequence[int], dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.empty``, poisoned when :func:`poison_outputs` is on (as the ops allocate)."""
    return _outputs.empty(shape, dtype, device)


# ---- NVFP4: e2m1 data (two per byte) + e4m3 block scales in the 128x4 swizzled layout ----------

_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_SF_VEC = 16  # values per block scale
_SCALE_COLS = HEAD_DIM // NVFP4_SF_VEC  # 8 scales per 128-value row


def nvfp4_scale_offsets(rows: int, device=None) -> torch.Tensor:
    """``(rows, 8)`` int64 byte offsets of each row's scales in the 128x4 swizzled buffer."""
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
    scaled = torch.where(sf_f > 0, blocks / torch.where(sf_f > 0, sf_f, 1.0), 0.0)
    mags = torch.tensor(_E2M1_MAGNITUDES, device=x.device)
    code = (scaled.abs().unsqueeze(-1) - mags).abs().argmin(dim=-1)  # nearest magnitude
    code = code | ((scaled < 0) & (code > 0)).to(code.dtype) * 8
    code = code.reshape(rows, HEAD_DIM).to(torch.uint8)
    data = code[:, 0::2] | (code[:, 1::2] << 4)
    scales = torch.zeros(nvfp4_scale_bytes(rows), dtype=torch.uint8, device=x.device)
    scales[nvfp4_scale_offsets(rows, x.device).reshape(-1)] = sf.view(torch.uint8).reshape(-1)
    return data.reshape(*x.shape[:-1], HEAD_DIM // 2), scales, 1.0 / global_scale


def dequantize_nvfp4(data: torch.Tensor, scales: torch.Tensor, global_scale: float = 1.0
                     ) -> torch.Tensor:
    """float32 values of NVFP4 ``data (..., 64)`` with ``scales`` laid out as by
    :func:`quantize_nvfp4`, times ``global_scale``."""
    flat = data.reshape(-1, HEAD_DIM // 2)
    rows = flat.shape[0]
    codes = torch.stack([flat & 0xF, flat >> 4], dim=-1).reshape(rows, HEAD_DIM).long()
    table = torch.tensor(_E2M1_MAGNITUDES + tuple(-m for m in _E2M1_MAGNITUDES),
                         device=data.device)
    sf_bytes = scales[nvfp4_scale_offsets(rows, data.device).reshape(-1)].reshape(rows, _SCALE_COLS)
    sf = sf_bytes.view(torch.float8_e4m3fn).float().repeat_interleave(NVFP4_SF_VEC, dim=1)
    return (table[codes] * sf * global_scale).reshape(*data.shape[:-1], HEAD_DIM)


# ---- paged and packed caches -------------------------------------------------------------------

def paginate(x: torch.Tensor, seqlens: Sequence[int], *,
             generator: Optional[torch.Generator] = None, extra_pages: int = 0
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scatter a flat varlen tensor ``x (total_k, H, W)`` into a paged cache.

    Returns ``(cache (num_pages, H, 128, W), page_table (B, max_pages) int32,
    seqused_k (B,) int32)`` with the sequences' blocks in randomly permuted physical pages
    (``extra_pages`` unused pages are added) and garbage in every row no sequence owns, so that
    only the page table and the lengths tell where the keys are.
    """
    device = x.device
    blocks = [math.ceil(n / BLOCK_SIZE) for n in seqlens]
    num_pages = sum(blocks) + extra_pages
    max_pages = max(max(blocks, default=0), 1)
    perm = torch.randperm(num_pages, generator=generator).tolist()
    shape = (num_pages, x.shape[1], BLOCK_SIZE, x.shape[2])
    # Rows no sequence owns hold large garbage, so reading one shows up in the results.
    if x.dtype == torch.uint8:
        cache = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
    else:
        cache = (torch.randn(shape, generator=generator) * 100).to(x.dtype)
    cache = cache.to(device)
    page_table = torch.zeros((len(seqlens), max_pages), dtype=torch.int32)
    start, used = 0, 0
    for b, n in enumerate(seqlens):
        pages = perm[used: used + blocks[b]]
        used += blocks[b]
        page_table[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        seq = x[start: start + n]
        full, rem = divmod(n, BLOCK_SIZE)
        if full:
            idx = torch.tensor(pages[:full], device=device)
            rows = seq[: full * BLOCK_SIZE].reshape(full, BLOCK_SIZE, *x.shape[1:])
            cache[idx] = rows.transpose(1, 2)
        if rem:
            cache[pages[full], :, :rem] = seq[full * BLOCK_SIZE:].transpose(0, 1)
        start += n
    seqused_k = torch.tensor(list(seqlens), dtype=torch.int32)
    return cache, page_table.to(device), seqused_k.to(device)


def pack_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, *, nhd: bool = False
            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One cache holding K then V in a ``2 * W`` content dim per token (vLLM's MSA layout).

    Returns ``(cache, k_view, v_view)`` where the views have the paged shape
    ``(P, H, 128, W)`` and read the cache in place. ``nhd=True`` stores tokens before heads
    (``cache (P, 128, H, 2W)``, views permuted to ``(P, H, 128, W)``).
    """
    w = k_cache.shape[-1]
    both = torch.cat([k_cache, v_cache], dim=-1)  # (P, H, 128, 2W)
    if nhd:
        cache = both.transpose(1, 2).contiguous()  # (P, 128, H, 2W)
        view = cache.permute(0, 2, 1, 3)
    else:
        cache = both.contiguous()
        view = cache
    return cache, view[..., :w], view[..., w:]


def cu_seqlens(lengths: Sequence[int], device=None) -> torch.Tensor:
    """int32 prefix sums ``[0, l0, l0 + l1, ...]``."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(list(lengths), dtype=torch.int64).cumsum(0).to(torch.int32)
    return out.to(device)
