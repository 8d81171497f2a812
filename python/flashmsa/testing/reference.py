"""The float64 torch reference of the MSA ops (docs/semantics.md), for the tests.

Written from the semantics, not from flashmsa's C++ reference or kernels: plain per-sequence loops,
dense masked attention, a sort-based top-k. Inputs are taken as the values the ops read (dequantised
to float64 by the helpers here), so a test compares like with like.
"""

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .layouts import BLOCK_SIZE as BLOCK
from .layouts import cu_seqlens, lengths_of, sequences  # noqa: F401  (the tests' ref.cu_seqlens)
from .nvfp4 import HEAD_DIM, dequantize_nvfp4


def f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def nvfp4_dequant(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 values of NVFP4 ``data (..., 64)`` (no global scale), computed on the CPU and
    returned on data's device."""
    return dequantize_nvfp4(data.cpu(), scales.cpu(), dtype=torch.float64).to(data.device)


# ---- stage 1 -----------------------------------------------------------------------------------

def q_offsets(q_offset, seqlens_q: Sequence[int], seqlens_k: Sequence[int]) -> List[int]:
    if q_offset is None:
        return [k - q for q, k in zip(seqlens_q, seqlens_k)]
    if isinstance(q_offset, int):
        return [q_offset] * len(seqlens_q)
    return [int(v) for v in q_offset.cpu().tolist()]


def proxy_score(q: torch.Tensor, keys: List[torch.Tensor], cu_q: torch.Tensor, *, causal: bool,
                max_k_tiles: int, q_offset=None, reduce_heads: bool = False) -> torch.Tensor:
    """``(Hq | 1, max_k_tiles, total_q)`` float64: per block, the max over visible keys of the
    unscaled logit; -inf where a block has no visible key."""
    total_q, hq, _ = q.shape
    hkv = keys[0].shape[1] if keys else 1
    g = hq // hkv
    sq = lengths_of(cu_q)
    sk = [k.shape[0] for k in keys]
    offs = q_offsets(q_offset, sq, sk)
    out = torch.full((hq, max_k_tiles, total_q), float("-inf"), dtype=torch.float64)
    starts = cu_q.cpu().tolist()
    for b in range(len(sq)):
        if sq[b] == 0 or sk[b] == 0:
            continue
        qb = f64(q[starts[b]:starts[b + 1]]).cpu()  # (sq, Hq, 128)
        kb = f64(keys[b]).cpu()  # (sk, Hkv, 128)
        kx = kb.repeat_interleave(g, dim=1)  # (sk, Hq, 128)
        s = torch.einsum("ihd,jhd->hij", qb, kx)  # (Hq, sq, sk)
        if causal:
            i = torch.arange(sq[b])[:, None]
            j = torch.arange(sk[b])[None, :]
            s = s.masked_fill(j > offs[b] + i, float("-inf"))
        nb = math.ceil(sk[b] / BLOCK)
        pad = torch.full((hq, sq[b], nb * BLOCK - sk[b]), float("-inf"), dtype=torch.float64)
        blocks = torch.cat([s, pad], dim=2).reshape(hq, sq[b], nb, BLOCK).amax(-1)  # (Hq, sq, nb)
        t = min(nb, max_k_tiles)
        out[:, :t, starts[b]:starts[b + 1]] = blocks[:, :, :t].transpose(1, 2)
    if reduce_heads:
        out = out.amax(0, keepdim=True)
    return out


# ---- stage 2 -----------------------------------------------------------------------------------

def order_keys(score: torch.Tensor) -> np.ndarray:
    """docs/semantics.md#topk-order ordering key (smaller is better) of float32 scores."""
    bits = score.cpu().contiguous().numpy().view(np.uint32).astype(np.int64)
    return np.where(bits & 0x80000000, bits, (~bits) & 0x7FFFFFFF)


def topk_select(score: torch.Tensor, topk: int, num_valid_pages=None, force_begin: int = 0,
                force_end: int = 0) -> torch.Tensor:
    """``(S, H, topk)`` int32: per row the forced blocks plus the best of the middle range,
    ascending, -1 tail padded (docs/semantics.md#topk-select, #d3: ties to the lower block)."""
    h, p, s = score.shape
    keys = order_keys(score.float())  # (H, P, S)
    if num_valid_pages is None:
        nvps = [p] * s
    elif isinstance(num_valid_pages, int):
        nvps = [num_valid_pages] * s
    else:
        nvps = num_valid_pages.cpu().tolist()
    out = torch.full((s, h, topk), -1, dtype=torch.int32)
    for si in range(s):
        nvp = max(0, min(nvps[si], p))
        fb = min(force_begin, nvp)
        fe = min(force_end, nvp - fb)
        forced = list(range(fb)) + list(range(nvp - fe, nvp))
        mid = np.arange(fb, nvp - fe)
        target = topk - fb - fe
        for hi in range(h):
            k = keys[hi, mid, si]
            chosen = mid[np.lexsort((mid, k))][:target].tolist()
            sel = sorted(forced + chosen)
            out[si, hi, :len(sel)] = torch.tensor(sel, dtype=torch.int32)
    return out


# ---- stage 3 -----------------------------------------------------------------------------------

def selected_blocks(lst: Sequence[int], nb: int) -> List[int]:
    """docs/semantics.md#d5: entries before the first negative, ids in [0, nb), each once."""
    used = []
    for t in lst:
        if t < 0:
            break
        if t < nb and t not in used:
            used.append(t)
    return used


def attention(q: torch.Tensor, keys: List[torch.Tensor], values: List[torch.Tensor],
              q2k: torch.Tensor, q_starts: Sequence[int], q_lens: Sequence[int], *,
              causal: bool, softmax_scale: Optional[float] = None, q_offset=None,
              out_scale: float = 1.0, temperature: float = 1.0
              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact sparse attention in float64 (docs/semantics.md#sparse-attention): returns
    ``(out, lse, lse_t)`` with out ``(total_q, Hq, 128)``, lse / lse_t ``(total_q, Hq)`` natural
    log; rows with no visible selected key give 0 / -inf / -inf (D8). ``keys`` / ``values`` are
    per-sequence float64 ``(seqlen_k, Hkv, 128)``."""
    total_q, hq, _ = q.shape
    hkv = q2k.shape[0]
    g = hq // hkv
    scale = HEAD_DIM ** -0.5 if softmax_scale is None else softmax_scale
    sk = [k.shape[0] for k in keys]
    offs = q_offsets(q_offset, q_lens, sk)
    out = torch.zeros(total_q, hq, HEAD_DIM, dtype=torch.float64)
    lse = torch.full((total_q, hq), float("-inf"), dtype=torch.float64)
    lse_t = torch.full((total_q, hq), float("-inf"), dtype=torch.float64)
    lists = q2k.cpu().tolist()
    for b in range(len(q_lens)):
        n, start = q_lens[b], q_starts[b]
        if n == 0:
            continue
        nb = math.ceil(sk[b] / BLOCK)
        kb, vb = f64(keys[b]).cpu(), f64(values[b]).cpu()
        i = torch.arange(n)[:, None]
        j = torch.arange(sk[b])[None, :]
        visible = (j <= offs[b] + i) if causal else torch.ones(n, sk[b], dtype=torch.bool)
        for kh in range(hkv):
            block_mask = torch.zeros(n, max(nb, 1), dtype=torch.bool)
            for r in range(n):
                for t in selected_blocks(lists[kh][start + r], nb):
                    block_mask[r, t] = True
            mask = block_mask.repeat_interleave(BLOCK, dim=1)[:, :sk[b]] & visible  # (n, sk)
            qh = f64(q[start:start + n, kh * g:(kh + 1) * g]).cpu()  # (n, G, 128)
            logits = torch.einsum("igd,jd->gij", qh, kb[:, kh]) * scale  # (G, n, sk)
            logits = logits.masked_fill(~mask, float("-inf"))
            l = torch.logsumexp(logits, dim=-1)  # (G, n); -inf for empty rows
            lt = torch.logsumexp(logits * temperature, dim=-1)
            p = torch.exp(logits - torch.where(torch.isfinite(l), l, 0.0)[..., None])
            o = torch.einsum("gij,jd->igd", p, vb[:, kh]) * out_scale  # (n, G, 128)
            out[start:start + n, kh * g:(kh + 1) * g] = o
            lse[start:start + n, kh * g:(kh + 1) * g] = l.T
            lse_t[start:start + n, kh * g:(kh + 1) * g] = lt.T
    return out, lse, lse_t


# ---- comparisons -------------------------------------------------------------------------------

def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, atol: float, rtol: float = 0.0,
                 rel_l2: Optional[float] = None, what: str = "output"):
    """Same -inf/NaN pattern exactly, finite values within atol + rtol * |expected|, and
    optionally a whole-tensor relative L2 bound."""
    a = actual.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    assert not torch.isnan(a).any(), f"{what}: {int(torch.isnan(a).sum())} NaN elements"
    same_inf = (torch.isinf(a) == torch.isinf(e)) & (torch.sign(a) == torch.sign(e)) | \
        ~(torch.isinf(a) | torch.isinf(e))
    assert same_inf.all(), f"{what}: -inf/inf pattern differs at {int((~same_inf).sum())} elements"
    fin = torch.isfinite(e)
    err = (a[fin] - e[fin]).abs()
    bound = atol + rtol * e[fin].abs()
    if err.numel():
        worst = int(torch.argmax(err - bound))
        assert bool((err <= bound).all()), (
            f"{what}: max |err| {float(err.max()):.3e} (worst {float(err[worst]):.3e} vs bound "
            f"{float(bound[worst]):.3e}); {int((err > bound).sum())} of {err.numel()} out of "
            f"tolerance")
    if rel_l2 is not None and err.numel():
        denom = float(e[fin].norm())
        rel = float((a[fin] - e[fin]).norm()) / max(denom, 1e-30)
        assert rel <= rel_l2, f"{what}: relative L2 error {rel:.3e} > {rel_l2:.1e}"
