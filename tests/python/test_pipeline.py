"""End to end: proxy score -> top-k -> sparse attention (prefill) and -> decode, from raw tensors,
as vLLM serves MiniMax-M3 (docs/semantics.md#pipeline): per-KV-head selection, per-token valid-page
counts, the local block forced; and the shared selection path (reduce_heads + expand)."""

import math

import pytest
import torch

from flashmsa.testing import reference as ref
from conftest import DEVICES
from flashmsa import msa_ops
from flashmsa.testing import paginate

BF16 = torch.bfloat16
OUT_TOL = dict(atol=4e-3, rtol=2e-2, rel_l2=1e-2)


def _positions(seqs_q, seqs_k):
    return torch.cat([torch.arange(sk - sq, sk) for sq, sk in zip(seqs_q, seqs_k)]).to(torch.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True], ids=["flat", "paged"])
def test_prefill_pipeline(device, paged):
    seqs_q, seqs_k = [200, 57], [4096, 1000]
    hq, hkv, topk = 8, 2, 16
    total_q, total_k = sum(seqs_q), sum(seqs_k)
    q = (torch.randn(total_q, hq, 128) / 3).to(BF16)
    k = (torch.randn(total_k, hkv, 128) / 3).to(BF16)
    v = (torch.randn(total_k, hkv, 128) / 3).to(BF16)
    index_q = torch.randn(total_q, hkv, 128).to(BF16)  # one index head per KV head (M3 / vLLM)
    index_k = torch.randn(total_k, 1, 128).to(BF16)
    cu_q, cu_k = ref.cu_seqlens(seqs_q, device), ref.cu_seqlens(seqs_k, device)
    pos = _positions(seqs_q, seqs_k)
    nvp = (pos // 128 + 1).to(device)
    max_k_tiles = math.ceil(max(seqs_k) / 128)
    if paged:
        cache, table, used = paginate(torch.cat([k, v, index_k], 1), seqs_k)
        kc, vc, ic = (cache[:, s].contiguous().to(device) for s in
                      (slice(0, hkv), slice(hkv, 2 * hkv), slice(2 * hkv, None)))
        layout = dict(page_table=table.to(device), seqused_k=used.to(device))
        scores = msa_ops.msa_proxy_score(index_q.to(device), ic, cu_q, **layout)
    else:
        kc, vc, ic = k.to(device), v.to(device), index_k.to(device)
        layout = dict(cu_seqlens_k=cu_k)
        scores = msa_ops.msa_proxy_score(index_q.to(device), ic, cu_q, cu_k)
    assert scores.shape == (hkv, max_k_tiles, total_q)
    sel = msa_ops.msa_topk_select(scores, topk, nvp, force_end_blocks=1)
    q2k = sel.transpose(0, 1).contiguous()
    out = msa_ops.msa_sparse_attention(q.to(device), kc, vc, q2k, cu_q, causal=True, **layout)

    # Stage by stage against the float64 reference.
    keys_idx = ref.sequences(index_k, cu_seqlens_k=cu_k.cpu())
    exp_scores = ref.proxy_score(index_q, keys_idx, cu_q.cpu(), causal=True,
                                 max_k_tiles=max_k_tiles)
    ref.assert_close(scores, exp_scores, atol=2e-3, rtol=1e-4, what="scores")
    assert torch.equal(sel.cpu(), ref.topk_select(scores.cpu(), topk, nvp.cpu(), 0, 1))
    sel_cpu = sel.cpu()
    for r in range(total_q):
        chosen = sel_cpu[r][sel_cpu[r] >= 0]
        assert bool((chosen * 128 <= pos[r]).all()), "a block starting after the query"
        assert int(pos[r]) // 128 in chosen.tolist(), "the local block must be selected"
    keys = ref.sequences(k, cu_seqlens_k=cu_k.cpu())
    values = ref.sequences(v, cu_seqlens_k=cu_k.cpu())
    exp = ref.attention(q, keys, values, q2k.cpu(), [0, seqs_q[0]], seqs_q, causal=True)[0]
    ref.assert_close(out, exp, **OUT_TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_full_selection_equals_dense_attention(device):
    """With every block selected, sparse attention is dense causal attention (torch SDPA, fp64)."""
    s, hq, hkv = 1000, 8, 2
    q = (torch.randn(s, hq, 128) / 3).to(BF16)
    k = (torch.randn(s, hkv, 128) / 3).to(BF16)
    v = (torch.randn(s, hkv, 128) / 3).to(BF16)
    nb = math.ceil(s / 128)
    q2k = torch.arange(nb, dtype=torch.int32).expand(hkv, s, nb).contiguous()
    cu = ref.cu_seqlens([s], device)
    out = msa_ops.msa_sparse_attention(q.to(device), k.to(device), v.to(device), q2k.to(device),
                                       cu, cu, causal=True)
    g = hq // hkv
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(0, 1), k.double().repeat_interleave(g, 1).transpose(0, 1),
        v.double().repeat_interleave(g, 1).transpose(0, 1), is_causal=True).transpose(0, 1)
    ref.assert_close(out, dense, **OUT_TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_shared_selection_pipeline(device):
    """reduce_heads=True: one selection over all index heads, broadcast to every KV head."""
    sq, sk, hq, hkv, hidx = 64, 2048, 16, 4, 4
    index_q = torch.randn(sq, hidx, 128).to(BF16).to(device)
    index_k = torch.randn(sk, 1, 128).to(BF16).to(device)
    cu_q, cu_k = ref.cu_seqlens([sq], device), ref.cu_seqlens([sk], device)
    per_head = msa_ops.msa_proxy_score(index_q, index_k, cu_q, cu_k)
    shared = msa_ops.msa_proxy_score(index_q, index_k, cu_q, cu_k, reduce_heads=True)
    assert torch.equal(shared, per_head.amax(0, keepdim=True))
    sel = msa_ops.msa_topk_select(shared, 16, None, force_end_blocks=1)
    q2k = sel.permute(1, 0, 2).expand(hkv, sq, 16).contiguous()
    q = (torch.randn(sq, hq, 128) / 3).to(BF16)
    k = (torch.randn(sk, hkv, 128) / 3).to(BF16)
    v = (torch.randn(sk, hkv, 128) / 3).to(BF16)
    out = msa_ops.msa_sparse_attention(q.to(device), k.to(device), v.to(device), q2k, cu_q, cu_k,
                                       causal=True)
    exp = ref.attention(q, [k.double()], [v.double()], q2k.cpu(), [0], [sq], causal=True)[0]
    ref.assert_close(out, exp, **OUT_TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_needles_are_selected(device):
    """Keys planted to match a later query's index query are in that query's selection."""
    s, hidx = 3000, 2
    index_q = torch.randn(s, hidx, 128)
    index_k = torch.randn(s, 1, 128)
    needles = [(2900, 3), (2500, 10), (1700, 0), (900, 5)]  # (query position, block)
    for p, block in needles:
        u = torch.randn(128)
        index_q[p] = u
        index_k[block * 128 + 17, 0] = u
    cu = ref.cu_seqlens([s], device)
    scores = msa_ops.msa_proxy_score(index_q.to(BF16).to(device), index_k.to(BF16).to(device),
                                     cu, cu)
    nvp = (torch.arange(s, dtype=torch.int32) // 128 + 1).to(device)
    sel = msa_ops.msa_topk_select(scores, 16, nvp, force_end_blocks=1).cpu()
    for p, block in needles:
        for h in range(hidx):
            assert block in sel[p, h].tolist(), (p, block, h)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_pipeline(device):
    """One MTP decode step (2 tokens per request) on a paged cache: proxy over the decode rows,
    per-token top-k, sparse decode; against the float64 reference."""
    batch, sq, hq, hkv = 4, 2, 16, 2
    seqs_k = [1500, 300, 4096, 129]
    total_q = batch * sq
    k = (torch.randn(sum(seqs_k), hkv, 128) / 3).to(BF16)
    v = (torch.randn(sum(seqs_k), hkv, 128) / 3).to(BF16)
    index_k = torch.randn(sum(seqs_k), 1, 128).to(BF16)
    cache, table, used = paginate(torch.cat([k, v, index_k], 1), seqs_k)
    kc, vc, ic = (cache[:, sl].contiguous().to(device) for sl in
                  (slice(0, hkv), slice(hkv, 2 * hkv), slice(2 * hkv, None)))
    table, used = table.to(device), used.to(device)
    q = (torch.randn(total_q, hq, 128) / 3).to(BF16)
    index_q = torch.randn(total_q, hkv, 128).to(BF16)
    cu_q = torch.arange(0, total_q + 1, sq, dtype=torch.int32, device=device)
    max_k_tiles = math.ceil(max(seqs_k) / 128)
    scores = msa_ops.msa_proxy_score(index_q.to(device), ic, cu_q, page_table=table,
                                     seqused_k=used, max_seqlen_q=sq, max_k_tiles=max_k_tiles)
    pos = _positions([sq] * batch, seqs_k)
    sel = msa_ops.msa_topk_select(scores, 16, (pos // 128 + 1).to(device), force_end_blocks=1)
    q2k = sel.transpose(0, 1).contiguous()
    out, lse = msa_ops.msa_sparse_decode_attention(q.to(device), kc, vc, q2k, page_table=table,
                                                   seqused_k=used, seqlen_q=sq,
                                                   return_softmax_lse=True)
    cu_k = ref.cu_seqlens(seqs_k)
    exp_out, exp_lse, _ = ref.attention(q, ref.sequences(k, cu_seqlens_k=cu_k),
                                        ref.sequences(v, cu_seqlens_k=cu_k), q2k.cpu(),
                                        [b * sq for b in range(batch)], [sq] * batch, causal=True)
    ref.assert_close(out, exp_out, **OUT_TOL)
    ref.assert_close(lse, exp_lse, atol=2e-3)
