"""flashmsa.integrations.vllm against a float64 torch implementation of vLLM's MiniMax-M3 ops in
vLLM's own layouts (one paged K|V cache, the index-K cache, [H, total_q, blocks] scores, block
tables, prefix lengths), on the CPU and, where there is one, on the GPU; and patch() on a fake vLLM
module tree."""
import math
import sys
import types

import pytest
import torch

from conftest import DEVICES, dispatched_ops
from flashmsa import NotSupportedError
from flashmsa.integrations import vllm as fv

BLK = 128
D = 128


# ---- float64 reference in vLLM's layouts -----------------------------------------------------------

def gather_keys(cache, block_table, b, length):
    """Rows [0, length) of sequence b from a paged cache (num_blocks, ..., 128, W): (length, ..., W)."""
    nb = math.ceil(length / BLK)
    pages = [cache[int(block_table[b, t])] for t in range(nb)]
    if cache.dim() == 4:  # (num_blocks, H, 128, W) -> tokens first
        pages = [p.transpose(0, 1) for p in pages]
    return torch.cat(pages)[:length].double() if pages else cache.new_zeros((0,)).double()


def ref_index_score(idx_q, cache, block_table, cu, seq_lens, positions_of, columns):
    """score[h, r, t] = max over keys j of block t with j <= pos(r), j < seq_len of idx_q . k."""
    H, T = idx_q.shape[1], idx_q.shape[0]
    out = torch.full((H, T, columns), float("-inf"), dtype=torch.float64)
    for b in range(len(seq_lens)):
        L = int(seq_lens[b])
        keys = gather_keys(cache, block_table, b, L)  # (L, D)
        for r in range(int(cu[b]), int(cu[b + 1])):
            vis = min(positions_of(b, r) + 1, L)
            if vis <= 0:
                continue
            logits = idx_q[r].double() @ keys[:vis].T  # (H, vis)
            for t in range(math.ceil(vis / BLK)):
                out[:, r, t] = logits[:, t * BLK:(t + 1) * BLK].amax(-1)
    return out


def ref_topk(score, nvp, topk, init, local):
    """vLLM's selection as a set per (head, row): forced init / local blocks, then the best
    scores; ascending, -1 padded (flashmsa's order)."""
    H, T, _ = score.shape
    out = torch.full((H, T, topk), -1, dtype=torch.int32)
    for h in range(H):
        for r in range(T):
            n = int(nvp[r])
            if n <= 0:
                continue
            forced = set(range(min(init, n))) | set(range(max(0, n - local), n))
            rest = sorted((t for t in range(n) if t not in forced),
                          key=lambda t: (-float(score[h, r, t]), t))
            chosen = sorted(forced | set(rest[:max(topk - len(forced), 0)]))[:topk]
            out[h, r, :len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return out


def ref_attention(q, kv_cache, topk_idx, block_table, rows_of, seq_lens, sm_scale,
                  k_mult=1.0, v_mult=1.0):
    """vLLM's block-sparse GQA attention: for row r of request b at position pos, KV head kh reads
    the first min(topk, pos // 128 + 1) entries of topk_idx[kh, r], keys j <= pos, j < seq_len."""
    T, Hq, _ = q.shape
    Hkv = kv_cache.shape[1]
    G = Hq // Hkv
    out = torch.zeros((T, Hq, D), dtype=torch.float64)
    for b in range(len(seq_lens)):
        L = int(seq_lens[b])
        kv = gather_keys(kv_cache, block_table, b, L)  # (L, Hkv, 2D)
        for r, pos in rows_of(b):
            if pos < 0:
                continue
            n = min(topk_idx.shape[-1], pos // BLK + 1)
            for kh in range(Hkv):
                blocks = []
                for x in topk_idx[kh, r, :n].tolist():  # a list ends at its first -1
                    if x < 0:
                        break
                    blocks.append(x)
                cols = sorted({j for t in blocks for j in range(t * BLK, t * BLK + BLK)
                               if j <= pos and j < L})
                if not cols:
                    continue
                k = kv[cols, kh, :D] * k_mult
                v = kv[cols, kh, D:] * v_mult
                logits = q[r, kh * G:(kh + 1) * G].double() @ k.T * sm_scale
                out[r, kh * G:(kh + 1) * G] = torch.softmax(logits, -1) @ v
    return out


# ---- problem ---------------------------------------------------------------------------------------

def make_problem(device, seq_lens, q_lens, hkv=2, g=4, kv_dtype=torch.bfloat16, seed=0,
                 prefix_lens=None):
    """A paged batch in vLLM's layouts: request b holds seq_lens[b] tokens, its queries sit at
    prefix_lens[b] + i (default: the last q_lens[b] tokens, prefix_lens = seq_lens - q_lens); pages
    permuted, spare pages and table columns."""
    if prefix_lens is None:
        prefix_lens = [s - n for s, n in zip(seq_lens, q_lens)]
    gen = torch.Generator().manual_seed(seed)
    B = len(seq_lens)
    pages_per = [math.ceil(s / BLK) for s in seq_lens]
    num_blocks = sum(pages_per) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(pages_per) + 2
    block_table = torch.zeros((B, max_blocks), dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages_per):
        block_table[b, :n] = perm[used:used + n].to(torch.int32)
        used += n
    kv = (torch.randn((num_blocks, hkv, BLK, 2 * D), generator=gen) / 3).to(kv_dtype)
    index_k = torch.randn((num_blocks, BLK, D), generator=gen).to(torch.bfloat16)
    total_q = sum(q_lens)
    q = (torch.randn((total_q, hkv * g, D), generator=gen) / 3).to(torch.bfloat16)
    idx_q = torch.randn((total_q, hkv, D), generator=gen).to(torch.bfloat16)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    t = dict(kv=kv, index_k=index_k, q=q, idx_q=idx_q, block_table=block_table, cu=cu,
             seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
             prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32))
    return {k: v.to(device) for k, v in t.items()}, dict(hkv=hkv, hq=hkv * g, B=B,
                                                         total_q=total_q)


def host(t):
    return t.cpu()


# ---- prefill ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_prefill_pipeline_matches_float64(device):
    # A chunked prefill (prefix 300 of 1000), a whole 300-token prompt, a 1-token chunk, and a
    # chunk at positions 200..299 of a 500-token cache (keys past the chunk exist and are masked:
    # positions come from prefix_lens, not from seq_lens - query length).
    seq_lens, q_lens = [1000, 300, 257, 500], [700, 300, 1, 100]
    t, s = make_problem(device, seq_lens, q_lens, prefix_lens=[300, 0, 256, 200])
    topk, init, local = 4, 1, 1
    max_seq = max(seq_lens)
    score = fv.minimax_m3_index_score(t["idx_q"], t["index_k"], t["block_table"], t["cu"],
                                      t["seq_lens"], t["prefix_lens"], max(q_lens), max_seq,
                                      s["hkv"])
    columns = 16 * math.ceil(math.ceil(max_seq / BLK) / 16)
    assert score.shape == (s["hkv"], s["total_q"], columns) and score.dtype == torch.float32
    cu, pre = host(t["cu"]), host(t["prefix_lens"])

    def pos(b, r):
        return int(pre[b]) + r - int(cu[b])
    ref = ref_index_score(host(t["idx_q"]), host(t["index_k"]), host(t["block_table"]), cu,
                          host(t["seq_lens"]), pos, columns)
    got = host(score).double()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(got), finite)  # -inf exactly where no key is visible
    torch.testing.assert_close(got[finite], ref[finite], rtol=1e-5, atol=1e-3)

    sel = fv.minimax_m3_index_topk(score, t["cu"], t["prefix_lens"], max(q_lens), topk, init,
                                   local)
    assert sel.shape == (s["hkv"], s["total_q"], topk) and sel.is_contiguous()
    nvp = torch.tensor([pos(b, r) // BLK + 1 for b in range(s["B"])
                        for r in range(int(cu[b]), int(cu[b + 1]))])
    # Selection logic on the adapter's own scores (no float64 near-tie can flip a choice).
    assert torch.equal(host(sel), ref_topk(got, nvp, topk, init, local))

    output = torch.full_like(t["q"], float("nan"))
    sm_scale = D ** -0.5
    assert fv.minimax_m3_sparse_attn(t["q"], t["kv"], sel, t["block_table"], t["cu"],
                                     t["seq_lens"], t["prefix_lens"], max(q_lens), s["hkv"],
                                     sm_scale, output) is None

    def rows(b):
        return [(r, pos(b, r)) for r in range(int(cu[b]), int(cu[b + 1]))]
    expect = ref_attention(host(t["q"]), host(t["kv"]), host(sel), host(t["block_table"]), rows,
                           host(t["seq_lens"]), sm_scale)
    torch.testing.assert_close(host(output).double(), expect, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_cache_with_scalar_scales(device):
    seq_lens, q_lens = [600, 200], [100, 200]
    t, s = make_problem(device, seq_lens, q_lens, kv_dtype=torch.float8_e4m3fn, seed=3)
    cu, pre = host(t["cu"]), host(t["prefix_lens"])
    # Per row: KV head 0 reads the first and its own block, KV head 1 its own block only.
    sel = torch.full((s["hkv"], s["total_q"], 4), -1, dtype=torch.int32)
    for b in range(s["B"]):
        for r in range(int(cu[b]), int(cu[b + 1])):
            n = (int(pre[b]) + r - int(cu[b])) // BLK + 1
            first = sorted({0, n - 1})
            sel[:, r] = torch.tensor([first + [-1] * (4 - len(first)), [n - 1, -1, -1, -1]],
                                     dtype=torch.int32)
    sel = sel.to(device)
    k_scale, v_scale = (torch.tensor([x], device=device) for x in (0.5, 2.0))
    output = torch.empty_like(t["q"])
    fv.minimax_m3_sparse_attn(t["q"], t["kv"], sel, t["block_table"], t["cu"], t["seq_lens"],
                              t["prefix_lens"], max(q_lens), s["hkv"], 0.1, output,
                              k_scale=k_scale, v_scale=v_scale)

    def rows(b):
        return [(r, int(pre[b]) + r - int(cu[b])) for r in range(int(cu[b]), int(cu[b + 1]))]
    expect = ref_attention(host(t["q"]), host(t["kv"]), host(sel), host(t["block_table"]), rows,
                           host(t["seq_lens"]), 0.1, k_mult=0.5, v_mult=2.0)
    torch.testing.assert_close(host(output).double(), expect, rtol=3e-2, atol=3e-2)
    # The scales' values are read on the host once per tensor: an in-place update (a new tensor
    # version) is seen by the next call.
    k_scale.fill_(0.25)
    v_scale.fill_(4.0)
    fv.minimax_m3_sparse_attn(t["q"], t["kv"], sel, t["block_table"], t["cu"], t["seq_lens"],
                              t["prefix_lens"], max(q_lens), s["hkv"], 0.1, output,
                              k_scale=k_scale, v_scale=v_scale)
    expect = ref_attention(host(t["q"]), host(t["kv"]), host(sel), host(t["block_table"]), rows,
                           host(t["seq_lens"]), 0.1, k_mult=0.25, v_mult=4.0)
    torch.testing.assert_close(host(output).double(), expect, rtol=3e-2, atol=3e-2)
    with pytest.raises(NotSupportedError, match="k_scale"):
        fv.minimax_m3_sparse_attn(t["q"], t["kv"], sel, t["block_table"], t["cu"],
                                  t["seq_lens"], t["prefix_lens"], max(q_lens), s["hkv"], 0.1,
                                  output, k_scale=torch.ones((s["hkv"], 640), device=device),
                                  v_scale=torch.ones((s["hkv"], 640), device=device))


# ---- decode ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dql", [1, 3])
def test_decode_matches_float64(device, dql):
    seq_lens = [900, 130, 64, 0]  # the last request is a CUDA-graph padding row (seq_len 0)
    B = len(seq_lens)
    t, s = make_problem(device, [max(x, 1) for x in seq_lens], [dql] * B, seed=5 + dql)
    t["seq_lens"] = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    topk, init, local = 3, 1, 1
    sel = fv.minimax_m3_index_decode(t["idx_q"], t["index_k"], t["block_table"], t["seq_lens"],
                                     max(seq_lens), topk, init, local, s["hkv"], dql, 4)
    assert sel.shape == (s["hkv"], B * dql, topk)

    def pos(b, r):
        return seq_lens[b] - dql + (r - b * dql)
    cu = torch.arange(0, B * dql + 1, dql)
    columns = math.ceil(max(seq_lens) / BLK)
    score = ref_index_score(host(t["idx_q"]), host(t["index_k"]), host(t["block_table"]), cu,
                            seq_lens, pos, columns)
    nvp = torch.tensor([max(pos(b, r) // BLK + 1, 0) if pos(b, r) >= 0 else 0
                        for b in range(B) for r in range(b * dql, (b + 1) * dql)])
    got_sel = host(sel)
    expect_sel = ref_topk(score, nvp, topk, init, local)
    # float64 and fp32 scores may order a near-tie differently: allow none here (Gaussian data,
    # 128-dim dot products: gaps are far above fp32 rounding), but report the rows if it happens.
    assert torch.equal(got_sel, expect_sel), (got_sel - expect_sel).nonzero()[:5]

    output = torch.full_like(t["q"], float("nan"))
    sm_scale = D ** -0.5
    fv.minimax_m3_sparse_attn_decode(t["q"], t["kv"], sel, t["block_table"], t["seq_lens"],
                                     s["hkv"], sm_scale, output, dql)

    def rows(b):
        return [(r, pos(b, r)) for r in range(b * dql, (b + 1) * dql)]
    expect = ref_attention(host(t["q"]), host(t["kv"]), got_sel, host(t["block_table"]), rows,
                           seq_lens, sm_scale)
    torch.testing.assert_close(host(output).double(), expect, rtol=2e-2, atol=2e-2)
    assert torch.all(host(output)[-dql:] == 0)  # the padding request: no key, output 0

    # Ragged decode (query_start_loc): the same rows, given as offsets.
    out2 = torch.full_like(t["q"], float("nan"))
    qsl = torch.arange(0, B * dql + 1, dql, dtype=torch.int32, device=device)
    fv.minimax_m3_sparse_attn_decode(t["q"], t["kv"], sel, t["block_table"], t["seq_lens"],
                                     s["hkv"], sm_scale, out2, dql, query_start_loc=qsl,
                                     token_to_req_indices=torch.arange(B, device=device)
                                     .repeat_interleave(dql).to(torch.int32))
    torch.testing.assert_close(host(out2).double(), expect, rtol=2e-2, atol=2e-2)

    # An output the op cannot write in place (a strided view): computed apart, then copied; the
    # same values as the in-place call above.
    wide = torch.full((*t["q"].shape[:2], 2 * D), float("nan"), dtype=t["q"].dtype, device=device)
    strided = wide[..., :D]
    fv.minimax_m3_sparse_attn_decode(t["q"], t["kv"], sel, t["block_table"], t["seq_lens"],
                                     s["hkv"], sm_scale, strided, dql)
    assert torch.equal(strided, output)
    assert bool(torch.isnan(wide[..., D:]).all())  # nothing written beside the view


# ---- vLLM 0.34's buffers: out= / score_out= -------------------------------------------------------

def poisoned_topk_buffer(rows, heads, topk, device):
    """vLLM's shared top-k buffer: token-major (rows, H, topk) int32, filled with a poison value."""
    return torch.full((rows, heads, topk), 77, dtype=torch.int32, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_topk_into_vllm_buffers(device):
    seq_lens, q_lens = [700, 300], [200, 300]
    t, s = make_problem(device, seq_lens, q_lens, seed=11)
    topk, init, local = 4, 1, 1
    score = fv.minimax_m3_index_score(t["idx_q"], t["index_k"], t["block_table"], t["cu"],
                                      t["seq_lens"], t["prefix_lens"], max(q_lens),
                                      max(seq_lens), s["hkv"])
    fresh = fv.minimax_m3_index_topk(score, t["cu"], t["prefix_lens"], max(q_lens), topk, init,
                                     local)
    T, H = s["total_q"], s["hkv"]
    # As vLLM 0.34's indexer passes it: the prefill part of the transposed token-major buffer.
    nd, spare = 3, 5
    buf = poisoned_topk_buffer(nd + T + spare, H, topk, device)
    view = buf.transpose(0, 1)[:, nd:, :]
    got = fv.minimax_m3_index_topk(score, t["cu"], t["prefix_lens"], max(q_lens), topk, init,
                                   local, out=view)
    assert got.shape == (H, T, topk) and got.data_ptr() == buf[nd].data_ptr()
    assert torch.equal(host(got), host(fresh))
    assert bool((buf[:nd] == 77).all()) and bool((buf[nd + T:] == 77).all())
    # The attention reads that view as vLLM 0.34 hands it over (strided), with the results of the
    # contiguous selection.
    outs = [torch.full_like(t["q"], float("nan")) for _ in range(2)]
    for sel, out in ((fresh, outs[0]), (got, outs[1])):
        fv.minimax_m3_sparse_attn(t["q"], t["kv"], sel, t["block_table"], t["cu"], t["seq_lens"],
                                  t["prefix_lens"], max(q_lens), H, D ** -0.5, out)
    assert torch.equal(outs[0], outs[1])
    # A contiguous head-major buffer with spare rows: out[:, :T] is neither layout flashmsa
    # writes, so the result is computed apart and copied in.
    wide = torch.full((H, T + spare, topk), 77, dtype=torch.int32, device=device)
    got = fv.minimax_m3_index_topk(score, t["cu"], t["prefix_lens"], max(q_lens), topk, init,
                                   local, out=wide)
    assert got.data_ptr() == wide.data_ptr() and torch.equal(host(wide[:, :T]), host(fresh))
    assert bool((wide[:, T:] == 77).all())
    with pytest.raises(ValueError, match="out must be int32"):
        fv.minimax_m3_index_topk(score, t["cu"], t["prefix_lens"], max(q_lens), topk, init,
                                 local, out=wide[:, :T - 1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dql", [1, 2])
def test_decode_into_vllm_buffers(device, dql):
    seq_lens = [1000, 300, 129, 0]  # the last request is a CUDA-graph padding row
    B = len(seq_lens)
    t, s = make_problem(device, [max(x, 1) for x in seq_lens], [dql] * B, seed=21 + dql)
    t["seq_lens"] = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    topk, init, local = 3, 1, 2
    H, T = s["hkv"], B * dql
    args = (t["idx_q"], t["index_k"], t["block_table"], t["seq_lens"], max(seq_lens))
    fresh = fv.minimax_m3_index_decode(*args, topk, init, local, H, dql, 4)
    # vLLM 0.34: top-k into the transposed shared buffer, scores into the transposed view of a
    # token-major unified score buffer with spare columns.
    buf = poisoned_topk_buffer(T + 2, H, topk, device)
    columns = math.ceil(max(seq_lens) / BLK)
    unified = torch.full((T, H, columns + 3), 5.0, dtype=torch.float32, device=device)
    got = fv.minimax_m3_index_decode(*args, topk, init, local, H, dql, 4,
                                     out=buf.transpose(0, 1),
                                     score_out=unified.transpose(0, 1))
    assert got.data_ptr() == buf.data_ptr() and torch.equal(host(got), host(fresh))
    assert bool((buf[T:] == 77).all())
    outs = [torch.full_like(t["q"], float("nan")) for _ in range(2)]
    for sel, out in ((fresh, outs[0]), (buf[:T].transpose(0, 1), outs[1])):
        fv.minimax_m3_sparse_attn_decode(t["q"], t["kv"], sel, t["block_table"], t["seq_lens"], H,
                                         D ** -0.5, out, dql)
    assert torch.equal(outs[0], outs[1])
    scores = fv.minimax_m3_index_decode_score(*args, init, local, H, dql, 4)
    assert scores.shape == (H, T, columns)
    assert torch.equal(host(unified.transpose(0, 1)[:, :, :columns]), host(scores))
    assert bool((unified[:, :, columns:] == 5.0).all())  # columns past the blocks: not written

    def pos(b, r):
        return seq_lens[b] - dql + (r - b * dql)
    cu = torch.arange(0, T + 1, dql)
    expect = ref_index_score(host(t["idx_q"]), host(t["index_k"]), host(t["block_table"]), cu,
                             seq_lens, pos, columns)
    for r in range(T):  # vLLM's forced blocks: init 1e30, local 1e29 (local wins)
        n = max(pos(r // dql, r) // BLK + 1, 0) if pos(r // dql, r) >= 0 else 0
        for blk in range(n):
            if blk >= n - local:
                expect[:, r, blk] = 1e29
            elif blk < init:
                expect[:, r, blk] = 1e30
    got_scores = host(scores).double()
    finite = torch.isfinite(expect)
    assert torch.equal(torch.isfinite(got_scores), finite)
    torch.testing.assert_close(got_scores[finite], expect[finite], rtol=1e-5, atol=1e-3)
    with pytest.raises(ValueError, match="score_out must be float32"):
        fv.minimax_m3_index_decode_score(*args, init, local, H, dql, 4,
                                         score_out=unified.transpose(0, 1)[:, :, :columns - 1])


@pytest.mark.parametrize("device", DEVICES)
def test_attention_workspace_per_stream(device):
    """The adapter's attention calls share one workspace per (GPU, stream), so that an eager call
    allocates no scratch; another stream gets its own; none on the CPU."""
    dev = torch.device(device)
    if dev.type == "cpu":
        assert fv._workspace(dev) is None
        return
    dev = torch.device("cuda", torch.cuda.current_device())
    t, s = make_problem(dev, [900, 300], [2, 2], seed=9)
    sel = torch.randint(0, 2, (s["hkv"], 4, 4), dtype=torch.int32, device=dev)
    outs = [torch.full_like(t["q"], float("nan")) for _ in range(3)]
    fv.minimax_m3_sparse_attn_decode(t["q"], t["kv"], sel, t["block_table"], t["seq_lens"],
                                     s["hkv"], 0.1, outs[0], 2)
    first = fv._workspace(dev)
    assert first is not None and first.nbytes > 0 and fv._workspace(dev) is first
    fv.minimax_m3_sparse_attn_decode(t["q"], t["kv"], sel, t["block_table"], t["seq_lens"],
                                     s["hkv"], 0.1, outs[1], 2)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        assert fv._workspace(dev) is not first
        fv.minimax_m3_sparse_attn_decode(t["q"], t["kv"], sel, t["block_table"], t["seq_lens"],
                                         s["hkv"], 0.1, outs[2], 2)
    torch.cuda.current_stream(dev).wait_stream(side)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_decode_index_launches_few_kernels():
    """The decode indexer runs once per layer of every decode step (in a CUDA graph, each small
    kernel costs its launch): besides the proxy score and the top-k, only the two element-wise
    ops of the rows' visible block counts run; the constants they need are made once."""
    t, s = make_problem("cpu", [700, 300, 129], [2, 2, 2])
    args = (t["idx_q"], t["index_k"], t["block_table"], t["seq_lens"], 700, 3, 1, 1, s["hkv"], 2, 2)
    want = fv.minimax_m3_index_decode(*args)
    got, names = dispatched_ops(lambda: fv.minimax_m3_index_decode(*args))
    assert torch.equal(got, want)
    assert names == ["proxy_score", "add", "div", "topk_select"], names


def test_decode_index_block_counts_once_per_forward(monkeypatch):
    """Inside one vLLM forward (one ForwardContext) every decode layer's indexer gets the same
    seq_lens tensor: the layers after the first reuse the first one's block counts (only the proxy
    score and the top-k run); a new forward context, or another seq_lens tensor with the same
    values, computes them again; outside a forward (no context) every call does."""
    t, s = make_problem("cpu", [700, 300, 129], [2, 2, 2])
    args = (t["idx_q"], t["index_k"], t["block_table"], t["seq_lens"], 700, 3, 1, 1, s["hkv"], 2, 2)
    want = fv.minimax_m3_index_decode(*args)
    context = [None]

    def get_forward_context():
        assert context[0] is not None, "Forward context is not set."
        return context[0]
    monkeypatch.setitem(sys.modules, "vllm.forward_context",
                        types.SimpleNamespace(get_forward_context=get_forward_context))
    first, second = object(), object()
    for ctx, layers in ((None, ["add", "div"]), (first, ["add", "div"]), (first, []),
                        (first, []), (second, ["add", "div"]), (second, [])):
        context[0] = ctx
        got, names = dispatched_ops(lambda: fv.minimax_m3_index_decode(*args))
        assert torch.equal(got, want)
        assert names == ["proxy_score", *layers, "topk_select"], (ctx, names)
    other = (*args[:3], t["seq_lens"].clone(), *args[4:])  # the same values, another tensor
    got, names = dispatched_ops(lambda: fv.minimax_m3_index_decode(*other))
    assert torch.equal(got, want) and names == ["proxy_score", "add", "div", "topk_select"]
    # Another decode_query_len in the same forward: its own counts.
    one = (t["idx_q"][::2].contiguous(), *args[1:9], 1, 2)
    fv.minimax_m3_index_decode(*one)
    got, names = dispatched_ops(lambda: fv.minimax_m3_index_decode(*args))
    assert names == ["proxy_score", "add", "div", "topk_select"], names


def test_bad_arguments_name_them():
    t, s = make_problem("cpu", [300], [300])
    with pytest.raises(ValueError, match="num_idx_heads == num_kv_heads"):
        fv.minimax_m3_index_score(t["idx_q"], t["index_k"], t["block_table"], t["cu"],
                                  t["seq_lens"], t["prefix_lens"], 300, 300, s["hkv"] + 1)
    with pytest.raises(NotSupportedError, match="strided index-K cache"):  # without patch()
        fv.minimax_m3_index_score(t["idx_q"], t["index_k"].transpose(1, 2).contiguous()
                                  .transpose(1, 2), t["block_table"], t["cu"], t["seq_lens"],
                                  t["prefix_lens"], 300, 300, s["hkv"])
    with pytest.raises(ValueError, match="num_kv_heads"):
        fv.minimax_m3_sparse_attn(t["q"], t["kv"], torch.zeros((2, 300, 4), dtype=torch.int32),
                                  t["block_table"], t["cu"], t["seq_lens"], t["prefix_lens"],
                                  300, 3, 0.1, torch.empty_like(t["q"]))
    with pytest.raises(ValueError, match="decode_query_len"):
        fv.minimax_m3_index_decode(t["idx_q"][:2], t["index_k"], t["block_table"], t["seq_lens"],
                                   300, 4, 1, 1, s["hkv"], 3, 2)


# ---- patch() ---------------------------------------------------------------------------------------

NAMES = {fv.INDEX_TOPK_MODULE: ("minimax_m3_index_score", "minimax_m3_index_topk",
                                "minimax_m3_index_decode"),
         fv.SPARSE_ATTN_MODULE: ("minimax_m3_sparse_attn", "minimax_m3_sparse_attn_decode")}
OPTIONAL = {fv.INDEX_TOPK_MODULE: ("minimax_m3_index_decode_score",),
            fv.HOPPER_PREFILL_MODULE: ("minimax_m3_sparse_attn",)}


def fake_vllm(monkeypatch, missing=None, optional=True):
    """vllm.models.minimax_m3.common.ops.{index_topk, sparse_attn} with stand-in functions, a
    backend module that imported two of them by name, and (``optional``) vLLM 0.34's additions:
    ``minimax_m3_index_decode_score`` and Hopper's prefill module, whose function the attention
    backend binds on Hopper (``hopper_backend``)."""
    originals = {}
    for module_name in (fv.INDEX_TOPK_MODULE, fv.HOPPER_PREFILL_MODULE):
        parts = module_name.split(".")
        for i in range(1, len(parts)):
            name = ".".join(parts[:i])
            if name not in sys.modules or not getattr(sys.modules[name], "_fake", False):
                package = types.ModuleType(name)
                package._fake = True
                monkeypatch.setitem(sys.modules, name, package)
    monkeypatch.delitem(sys.modules, fv.HOPPER_PREFILL_MODULE, raising=False)
    tables = [NAMES] + ([OPTIONAL] if optional else [])
    for table in tables:
        for module_name, names in table.items():
            module = sys.modules.get(module_name)
            if module is None or not getattr(module, "_fake", False):
                module = types.ModuleType(module_name)
                module._fake = True
                monkeypatch.setitem(sys.modules, module_name, module)
            for n in names:
                if n != missing:
                    fn = (lambda m, n: lambda *a, **k: ("vllm", m, n))(module_name, n)
                    setattr(module, n, fn)
                    originals[(module_name, n)] = fn
    if not optional:  # an older vLLM: importing the Hopper module fails
        monkeypatch.setitem(sys.modules, fv.HOPPER_PREFILL_MODULE, None)
    backend = types.ModuleType("vllm.models.minimax_m3.backend")
    backend.minimax_m3_sparse_attn = originals.get((fv.SPARSE_ATTN_MODULE, "minimax_m3_sparse_attn"))
    backend.minimax_m3_index_decode = originals.get((fv.INDEX_TOPK_MODULE,
                                                     "minimax_m3_index_decode"))
    backend.unrelated = len
    monkeypatch.setitem(sys.modules, backend.__name__, backend)
    hopper_backend = types.ModuleType("vllm.models.minimax_m3.hopper_backend")
    hopper_backend.minimax_m3_sparse_attn = originals.get((fv.HOPPER_PREFILL_MODULE,
                                                           "minimax_m3_sparse_attn"))
    monkeypatch.setitem(sys.modules, hopper_backend.__name__, hopper_backend)
    return originals, backend, hopper_backend


@pytest.mark.parametrize("optional", [True, False])
def test_patch_swaps_and_undoes(monkeypatch, optional):
    originals, backend, hopper_backend = fake_vllm(monkeypatch, optional=optional)
    handle = fv.patch()
    for module_name, n in originals:
        assert getattr(sys.modules[module_name], n) is getattr(fv, n)
    assert backend.minimax_m3_sparse_attn is fv.minimax_m3_sparse_attn
    assert backend.minimax_m3_index_decode is fv.minimax_m3_index_decode
    assert backend.unrelated is len
    # vLLM 0.34 on Hopper: the attention backend bound the Hopper module's prefill function.
    assert hopper_backend.minimax_m3_sparse_attn is (fv.minimax_m3_sparse_attn if optional
                                                     else None)
    assert sorted(handle.replaced[fv.SPARSE_ATTN_MODULE]) == sorted(NAMES[fv.SPARSE_ATTN_MODULE])
    assert ("minimax_m3_index_decode_score" in handle.replaced[fv.INDEX_TOPK_MODULE]) == optional
    assert (fv.HOPPER_PREFILL_MODULE in handle.replaced) == optional
    again = fv.patch()  # already patched: nothing more to swap
    assert again.swaps == []
    handle.undo()
    for (module_name, n), original in originals.items():
        assert getattr(sys.modules[module_name], n) is original
    assert backend.minimax_m3_sparse_attn is originals[(fv.SPARSE_ATTN_MODULE,
                                                        "minimax_m3_sparse_attn")]
    if optional:
        assert hopper_backend.minimax_m3_sparse_attn is originals[(fv.HOPPER_PREFILL_MODULE,
                                                                   "minimax_m3_sparse_attn")]


def test_patch_refuses_other_vllm(monkeypatch):
    originals, _, _ = fake_vllm(monkeypatch, missing="minimax_m3_index_topk")
    with pytest.raises(AttributeError, match="minimax_m3_index_topk"):
        fv.patch()
    # Nothing was replaced.
    assert sys.modules[fv.SPARSE_ATTN_MODULE].minimax_m3_sparse_attn is \
        originals[(fv.SPARSE_ATTN_MODULE, "minimax_m3_sparse_attn")]


def test_patch_without_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(ImportError, match="MiniMax-M3"):
        fv.patch()


def test_register_follows_environment(monkeypatch):
    originals, _, _ = fake_vllm(monkeypatch)
    monkeypatch.delenv("FLASHMSA_VLLM", raising=False)
    fv.register()
    assert sys.modules[fv.SPARSE_ATTN_MODULE].minimax_m3_sparse_attn is \
        originals[(fv.SPARSE_ATTN_MODULE, "minimax_m3_sparse_attn")]
    monkeypatch.setenv("FLASHMSA_VLLM", "1")
    fv.register()
    assert sys.modules[fv.SPARSE_ATTN_MODULE].minimax_m3_sparse_attn is fv.minimax_m3_sparse_attn


# ---- calls flashmsa does not take: vLLM's own kernels --------------------------------------------

def _gapped(t: torch.Tensor) -> torch.Tensor:
    """t as a view of a larger buffer with a gap after every page (vLLM's block-outermost layouts
    and padded pages)."""
    page = t[0].numel()
    big = torch.zeros((t.shape[0], page + 64), dtype=t.dtype)
    big[:, :page] = t.reshape(t.shape[0], page)
    return big[:, :page].view(t.shape)


def test_unsupported_caches_run_vllms_kernels(monkeypatch, caplog):
    """An fp8 e5m2 K|V cache and caches with gaps between their pages, which vLLM serves and
    flashmsa's ops refuse, run the vLLM function patch() replaced (logged once per kind); called
    without patch() they raise NotSupportedError naming what flashmsa does not take."""
    t, s = make_problem("cpu", [300], [1], seed=3)
    sel = fv.minimax_m3_index_decode(t["idx_q"], t["index_k"], t["block_table"], t["seq_lens"],
                                     300, 4, 1, 1, s["hkv"], 1, 4)
    output = torch.empty_like(t["q"])
    e5m2 = t["kv"].to(torch.float8_e5m2)
    kv_gapped, index_gapped = _gapped(t["kv"]), _gapped(t["index_k"])
    assert not fv._dense(kv_gapped) and not index_gapped.is_contiguous()
    calls = {
        "minimax_m3_sparse_attn_decode": lambda kv: fv.minimax_m3_sparse_attn_decode(
            t["q"], kv, sel, t["block_table"], t["seq_lens"], s["hkv"], 0.1, output, 1),
        "minimax_m3_sparse_attn": lambda kv: fv.minimax_m3_sparse_attn(
            t["q"], kv, sel, t["block_table"], t["cu"], t["seq_lens"], t["prefix_lens"], 1,
            s["hkv"], 0.1, output),
        "minimax_m3_index_decode": lambda ik: fv.minimax_m3_index_decode(
            t["idx_q"], ik, t["block_table"], t["seq_lens"], 300, 4, 1, 1, s["hkv"], 1, 4),
        "minimax_m3_index_decode_score": lambda ik: fv.minimax_m3_index_decode_score(
            t["idx_q"], ik, t["block_table"], t["seq_lens"], 300, 1, 1, s["hkv"], 1, 4),
        "minimax_m3_index_score": lambda ik: fv.minimax_m3_index_score(
            t["idx_q"], ik, t["block_table"], t["cu"], t["seq_lens"], t["prefix_lens"], 1, 300,
            s["hkv"]),
    }
    cases = [(n, e5m2, "float8_e5m2") for n in calls if "sparse" in n]
    cases += [(n, kv_gapped, "gaps between its pages") for n in calls if "sparse" in n]
    cases += [(n, index_gapped, "strided index-K cache") for n in calls if "index" in n]
    monkeypatch.setattr(fv, "_VLLM_ORIGINALS", {})
    for name, cache, why in cases:
        with pytest.raises(NotSupportedError, match=why):
            calls[name](cache)
    originals, _, _ = fake_vllm(monkeypatch)
    # vLLM 0.34.0's parameter lists (read from its wheel), so that a fallback passing an argument
    # vLLM's function lacks fails here.
    params = {
        "minimax_m3_index_score": "idx_q, index_kv_cache, block_table, cu_seqlens_q, seq_lens, "
                                  "prefix_lens, max_query_len, max_seq_len, num_kv_heads",
        "minimax_m3_index_decode_score": "idx_q, index_kv_cache, block_table, seq_lens, "
                                         "max_seq_len, init_blocks, local_blocks, num_kv_heads, "
                                         "decode_query_len, max_decode_query_len, score_out=None",
        "minimax_m3_index_decode": "idx_q, index_kv_cache, block_table, seq_lens, max_seq_len, "
                                   "topk, init_blocks, local_blocks, num_kv_heads, "
                                   "decode_query_len, max_decode_query_len, out=None, "
                                   "score_out=None",
        "minimax_m3_sparse_attn": "q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, "
                                  "prefix_lens, max_query_len, num_kv_heads, sm_scale, output, "
                                  "k_scale=None, v_scale=None",
        "minimax_m3_sparse_attn_decode": "q, kv_cache, topk_idx, block_table, seq_lens, "
                                         "num_kv_heads, sm_scale, output, decode_query_len, "
                                         "k_scale=None, v_scale=None",
    }
    for (module_name, n) in list(originals):
        if n in params:
            scope = {}
            exec(f"def {n}({params[n]}): return ('vllm', {module_name!r}, {n!r})", scope)
            setattr(sys.modules[module_name], n, scope[n])
    handle = fv.patch()
    try:
        monkeypatch.setattr(fv, "_FALLBACKS_LOGGED", set())
        with caplog.at_level("WARNING", logger="flashmsa"):
            for name, cache, why in cases:
                module = fv.SPARSE_ATTN_MODULE if "sparse" in name else fv.INDEX_TOPK_MODULE
                assert calls[name](cache) == ("vllm", module, name), name
                calls[name](cache)  # logged once
        assert len(caplog.records) == len(cases)  # each (function, reason) once, of two calls
        # vLLM on Hopper binds the Hopper module's prefill attention: its calls fall back there.
        monkeypatch.setattr(fv, "_on_hopper", lambda t: True)
        assert calls["minimax_m3_sparse_attn"](e5m2) == (
            "vllm", fv.HOPPER_PREFILL_MODULE, "minimax_m3_sparse_attn")
        # What flashmsa takes still runs flashmsa.
        assert calls["minimax_m3_sparse_attn_decode"](t["kv"]) is None
        assert torch.isfinite(output).all()
    finally:
        handle.undo()
