"""KV cache layouts the ops read: flat varlen (``cu_seqlens``), paged (:func:`paginate`:
permuted physical pages of 128 tokens, garbage in rows no sequence owns) and packed
(:func:`pack_kv`: K then V in one cache, vLLM's MSA layout), plus :func:`sequences`, which reads
any of them back per sequence."""

import math
from typing import List, Optional, Sequence, Tuple

import torch

BLOCK_SIZE = 128  # tokens per KV block == tokens per page


def cu_seqlens(lengths: Sequence[int], device=None) -> torch.Tensor:
    """int32 prefix sums ``[0, l0, l0 + l1, ...]``."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(list(lengths), dtype=torch.int64).cumsum(0).to(torch.int32)
    return out.to(device)


def lengths_of(cu: torch.Tensor) -> List[int]:
    """The lengths ``[cu[1] - cu[0], ...]`` of prefix sums ``cu``."""
    c = cu.cpu().tolist()
    return [c[i + 1] - c[i] for i in range(len(c) - 1)]


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


def sequences(x: torch.Tensor, *, cu_seqlens_k=None, page_table=None, seqused_k=None
              ) -> List[torch.Tensor]:
    """Per-sequence key rows ``(seqlen_k[b], H, W)`` of a flat or paged cache, in x's dtype.

    Paged: key j of sequence b is ``x[page_table[b, j // 128], :, j % 128]``; the length is the
    cu_seqlens_k difference when given (msa_sparse_attention's precedence), else seqused_k[b],
    clamped to the page table's capacity.
    """
    out = []
    if page_table is None:
        cu = cu_seqlens_k.cpu().tolist()
        for b in range(len(cu) - 1):
            out.append(x[cu[b]:cu[b + 1]])
        return out
    table = page_table.cpu()
    if cu_seqlens_k is not None:
        lens = lengths_of(cu_seqlens_k)
    else:
        lens = seqused_k.cpu().tolist()
    for b, n in enumerate(lens):
        n = max(0, min(n, table.shape[1] * BLOCK_SIZE))
        j = torch.arange(n)
        pages = table[b, j // BLOCK_SIZE].long().to(x.device)
        out.append(x[pages, :, (j % BLOCK_SIZE).to(x.device)])  # (n, H, W)
    return out
