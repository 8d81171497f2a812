"""Input builders shared by the benchmark, the profilers, the sanitizer driver and the GPU tests.

Selection patterns are the ones docs/benchmarks.md defines:

* random:    per (kv head, token), the local block plus up to topk-1 distinct blocks drawn uniformly
             from the token's earlier causally visible blocks;
* clustered: tokens in windows of 64; per kv head each window keeps a set of topk-1 earlier blocks,
             which the next window inherits with 2 of them replaced by fresh random visible blocks;
             plus the local block.

Every selection is (Hkv, rows, topk) int32, contiguous, ascending, -1 tail padded: what
`msa_topk_select(...).transpose(0, 1).contiguous()` hands to the attention ops. Token `r` sits at
global position positions[r] and may see blocks [0, positions[r] // 128].

Torch only (numpy for the sequential clustered walk); works on CPU and CUDA tensors. Cache layouts
and cu_seqlens are in :mod:`flashmsa.testing.layouts`, NVFP4 in :mod:`flashmsa.testing.nvfp4`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

BLOCK = 128     # tokens per KV block == tokens per page
HEAD_DIM = 128  # head_dim of every MSA op


def cuda_generator(seed: int, device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def randn(shape, gen: torch.Generator, device, dtype=torch.bfloat16, scale: float = 1.0 / 3.0):
    """Gaussian data (never zeros: zeros hide unwritten outputs and run faster than real data)."""
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    return (x * scale).to(dtype)


# ---- selections ------------------------------------------------------------------------------

def _finish_selection(picked: torch.Tensor, topk: int) -> torch.Tensor:
    """picked (..., w): block ids, -1 for empty slots, w <= topk -> ascending, -1 tail, topk wide"""
    big = torch.iinfo(torch.int32).max
    x = torch.where(picked < 0, torch.full_like(picked, big), picked)
    x = torch.sort(x, dim=-1).values
    x = torch.where(x == big, torch.full_like(x, -1), x)
    if x.shape[-1] < topk:
        pad = torch.full((*x.shape[:-1], topk - x.shape[-1]), -1, dtype=x.dtype, device=x.device)
        x = torch.cat([x, pad], dim=-1)
    return x.to(torch.int32).contiguous()


def random_selection(positions: torch.Tensor, num_kv_heads: int, topk: int,
                     gen: torch.Generator) -> torch.Tensor:
    """(Hkv, rows, topk): local block + min(topk-1, local) distinct uniform earlier blocks a row."""
    device = positions.device
    local = (positions.to(torch.int64) // BLOCK)                     # (rows,)
    rows = local.numel()
    num_blocks = int(local.max().item()) + 1 if rows else 1
    out = torch.empty((num_kv_heads, rows, topk), dtype=torch.int32, device=device)
    pick = min(topk - 1, num_blocks)
    cols = torch.arange(num_blocks, device=device)
    # Chunk the rows so the (Hkv, chunk, num_blocks) random matrix stays near 64M elements.
    chunk = max(1, (1 << 26) // max(1, num_blocks * num_kv_heads))
    for r0 in range(0, rows, chunk):
        loc = local[r0:r0 + chunk]
        n = loc.numel()
        scores = torch.rand((num_kv_heads, n, num_blocks), generator=gen, device=device)
        # Only earlier blocks are candidates; the local block is added explicitly below.
        scores.masked_fill_(cols.view(1, 1, -1) >= loc.view(1, -1, 1), -1.0)
        if pick > 0:
            vals, idx = scores.topk(pick, dim=-1)
            idx = torch.where(vals >= 0, idx, torch.full_like(idx, -1))
        else:
            idx = torch.empty((num_kv_heads, n, 0), dtype=torch.int64, device=device)
        picked = torch.cat([idx, loc.view(1, -1, 1).expand(num_kv_heads, n, 1)], dim=-1)
        out[:, r0:r0 + n] = _finish_selection(picked, topk)
    return out


def clustered_selection(seq_len: int, num_kv_heads: int, topk: int, seed: int, device,
                        window: int = 64, replace: int = 2) -> torch.Tensor:
    """(Hkv, seq_len, topk) for one causal sequence at positions [0, seq_len)."""
    assert BLOCK % window == 0, "a window must sit inside one block"
    rng = np.random.default_rng(seed)
    keep = topk - 1
    num_windows = math.ceil(seq_len / window)
    sets = np.full((num_kv_heads, num_windows, keep), -1, dtype=np.int64)
    for h in range(num_kv_heads):
        current: list[int] = []
        for w in range(num_windows):
            visible = (w * window) // BLOCK  # earlier blocks [0, visible)
            if visible <= keep:
                current = list(range(visible))
            else:
                members = set(current)
                # Inherit, replacing `replace` members (or filling up to `keep`) by fresh visible
                # blocks.
                drop = replace if len(current) == keep else 0
                for idx in rng.choice(len(current), size=drop, replace=False) if drop else []:
                    members.discard(current[idx])
                while len(members) < keep:
                    members.add(int(rng.integers(0, visible)))
                current = sorted(members)
            sets[h, w, :len(current)] = current
    sets_t = torch.from_numpy(sets).to(device)                               # (Hkv, W, keep)
    token = torch.arange(seq_len, device=device)
    per_token = sets_t[:, token // window]                                    # (Hkv, S, keep)
    local = (token // BLOCK).view(1, -1, 1).expand(num_kv_heads, seq_len, 1)
    return _finish_selection(torch.cat([per_token, local], dim=-1), topk)


def check_selection(sel: torch.Tensor, positions: torch.Tensor, topk: int) -> None:
    """Asserts the invariants every pattern promises (cheap, runs on the device of sel)."""
    assert sel.dtype == torch.int32 and sel.is_contiguous() and sel.shape[-1] == topk
    local = (positions.to(torch.int64) // BLOCK).view(1, -1, 1)
    valid = sel >= 0
    # -1 only as tail padding
    assert bool((valid[..., 1:] <= valid[..., :-1]).all()), "hole in a selection"
    # strictly ascending valid prefix
    both = valid[..., 1:] & valid[..., :-1]
    assert bool(((sel[..., 1:] > sel[..., :-1]) | ~both).all()), "selection not strictly ascending"
    assert bool(((sel <= local) | ~valid).all()), "selected block beyond the causal limit"
    assert bool((sel == local).any(dim=-1).all()), "local block missing"
    expected = torch.clamp(local.view(-1) + 1, max=topk)
    assert bool((valid.sum(-1) == expected.view(1, -1)).all()), "wrong number of selected blocks"


def visible_keys(sel: torch.Tensor, positions: torch.Tensor, seqlen_k) -> int:
    """Sum over (kv head, row, selected block) of the keys the row may see in that block.

    positions: (rows,) global query positions; seqlen_k: int or (rows,) tensor of key lengths.
    """
    pos = positions.to(torch.int64).view(1, -1, 1)
    limit = torch.as_tensor(seqlen_k, device=sel.device, dtype=torch.int64)
    limit = torch.minimum(pos + 1, limit.view(1, -1, 1) if limit.ndim else limit)
    start = sel.to(torch.int64) * BLOCK
    keys = torch.clamp(limit - start, min=0, max=BLOCK)
    return int(torch.where(sel >= 0, keys, torch.zeros_like(keys)).sum().item())


def mean_union_per_tile(sel: torch.Tensor, tile: int = 8) -> float:
    """Mean size of the union of the selections of `tile` consecutive tokens (overlap measure:
    topk when neighbours agree, ~tile*(topk-1)+1 for random selections)."""
    hkv, rows, topk = sel.shape
    n = rows // tile
    if n == 0:
        return float("nan")
    x = sel[:, :n * tile].reshape(hkv, n, tile * topk).to(torch.int64)
    x = torch.sort(torch.where(x < 0, torch.full_like(x, -1), x), dim=-1).values
    distinct = torch.ones_like(x, dtype=torch.bool)
    distinct[..., 1:] = x[..., 1:] != x[..., :-1]
    count = (distinct & (x >= 0)).sum(-1)
    return float(count.float().mean().item())


# ---- decode pages ----------------------------------------------------------------------------

def decode_pages(sel: torch.Tensor, batch: int, seqlen_q: int, num_blocks: int):
    """Physical pages for a decode batch whose (Hkv, B*seqlen_q, topk) selection `sel` reads only
    its selected blocks: each (request, block) selected by any head gets its own page; the other
    page-table entries point at page 0 and are never read.

    Returns (page_table (B, num_blocks) int32, num_pages, unique (request, head, block) count).
    """
    hkv = sel.shape[0]
    device = sel.device
    s = sel.view(hkv, batch, seqlen_q * sel.shape[-1]).to(torch.int64)
    valid = s >= 0
    per_head = torch.zeros((hkv, batch, num_blocks + 1), dtype=torch.bool, device=device)
    per_head.scatter_(2, torch.where(valid, s, torch.full_like(s, num_blocks)), True)
    per_head = per_head[..., :num_blocks]
    used = per_head.any(0)                                         # (B, num_blocks)
    phys = torch.cumsum(used.view(-1).to(torch.int64), 0).view(batch, num_blocks) - 1
    page_table = torch.where(used, phys, torch.zeros_like(phys)).to(torch.int32).contiguous()
    num_pages = max(1, int(used.sum().item()))
    return page_table, num_pages, int(per_head.sum().item())


# ---- synthetic indexer data ------------------------------------------------------------------

def smooth_index_data(seq_len: int, num_q_heads: int, num_k_heads: int, gen: torch.Generator,
                      device, dtype=torch.bfloat16, q_period: int = 256):
    """Index q (S, Hq, 128) and index k (S, Hk, 128) whose top-k selections overlap between
    neighbouring tokens, as real indexers' do: each key block carries a random 'topic' direction,
    and each query follows a direction interpolated between random anchors every q_period tokens.
    """
    blocks = math.ceil(seq_len / BLOCK)
    topic = torch.randn((blocks, num_k_heads, HEAD_DIM), generator=gen, device=device)
    k = topic.repeat_interleave(BLOCK, dim=0)[:seq_len]
    k = k + 0.7 * torch.randn(k.shape, generator=gen, device=device)
    anchors = torch.randn((seq_len // q_period + 2, num_q_heads, HEAD_DIM), generator=gen,
                          device=device)
    t = torch.arange(seq_len, device=device)
    frac = ((t % q_period).float() / q_period).view(-1, 1, 1)
    q = anchors[t // q_period] * (1 - frac) + anchors[t // q_period + 1] * frac
    q = q + 0.5 * torch.randn(q.shape, generator=gen, device=device)
    return (q / 3).to(dtype), (k / 3).to(dtype)
