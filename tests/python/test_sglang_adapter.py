"""flashmsa.integrations.sglang against a float64 torch implementation of SGLang's MiniMax-M3 MSA
attention hook in SGLang's own layouts (slot-major K / V caches of 128-slot pages, req_to_token,
slot ids, [Hkv, tokens, topk] selections), on the CPU and, where there is one, on the GPU (the
decode plan also inside a CUDA graph); and patch() / register() on a fake SGLang module tree."""
import math
import sys
import types

import pytest
import torch

from conftest import DEVICES, dispatched_ops
from flashmsa import NotSupportedError
from flashmsa.integrations import sglang as fs

BLK = 128
D = 128


# ---- problem in SGLang's layouts -------------------------------------------------------------------

def make_problem(device, seq_lens, q_lens, hkv=2, g=4, kv_dtype=torch.bfloat16, seed=0,
                 topk=4):
    """Requests b = 0.. in req_to_token rows slot_ids[b] (not in order), each holding seq_lens[b]
    tokens in whole 128-slot pages of the slot-major caches (pages shuffled, spare pages); the
    columns of req_to_token past a request's length hold stale slots of other pages. Queries: the
    last q_lens[b] tokens. Selections: random sets of each row's visible blocks, ascending,
    -1 padded."""
    gen = torch.Generator().manual_seed(seed)
    B = len(seq_lens)
    pages_per = [math.ceil(s / BLK) for s in seq_lens]
    num_pages = sum(pages_per) + 3
    perm = torch.randperm(num_pages, generator=gen)
    max_kv_len = max(seq_lens) + 200  # not a multiple of 128: the page table's last column clamps
    max_reqs = B + 2
    slot_ids = torch.randperm(max_reqs, generator=gen)[:B]
    req_to_token = torch.randint(0, num_pages * BLK, (max_reqs, max_kv_len), generator=gen,
                                 dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages_per):
        for t in range(n):
            page = int(perm[used + t])
            cols = torch.arange(t * BLK, min((t + 1) * BLK, max_kv_len))
            req_to_token[slot_ids[b], cols] = (page * BLK + cols % BLK).to(torch.int32)
        used += n
    k_cache = (torch.randn((num_pages * BLK, hkv, D), generator=gen) / 3).to(kv_dtype)
    v_cache = (torch.randn((num_pages * BLK, hkv, D), generator=gen)).to(kv_dtype)
    total_q = sum(q_lens)
    q = torch.randn((total_q, hkv * g, D), generator=gen).to(torch.bfloat16)
    idx_q = torch.randn((total_q, 4, D), generator=gen).to(torch.bfloat16)  # M3: 4 index heads
    idx_k = torch.randn((num_pages * BLK, 1, D), generator=gen).to(torch.bfloat16)  # over one
    prefix = [s - n for s, n in zip(seq_lens, q_lens)]
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    topk_idx = torch.full((hkv, total_q, topk), -1, dtype=torch.int32)
    for b in range(B):
        for i in range(q_lens[b]):
            r, visible = cu[b] + i, (prefix[b] + i) // BLK + 1
            for kh in range(hkv):
                n = int(torch.randint(1, min(topk, visible) + 1, (1,), generator=gen))
                chosen = sorted(torch.randperm(visible, generator=gen)[:n].tolist())
                topk_idx[kh, r, :n] = torch.tensor(chosen, dtype=torch.int32)
    to = dict(device=device)
    return dict(q=q.to(**to), k_cache=k_cache.to(**to), v_cache=v_cache.to(**to),
                idx_q=idx_q.to(**to), idx_k=idx_k.to(**to),
                topk_idx=topk_idx.to(**to), req_to_token=req_to_token.to(**to),
                slot_ids=slot_ids.to(**to),  # int64, as SGLang's req_pool_indices
                cu=torch.tensor(cu, dtype=torch.int32, device=device),
                seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
                prefix_lens=torch.tensor(prefix, dtype=torch.int32, device=device),
                rows=[[(cu[b] + i, prefix[b] + i) for i in range(q_lens[b])] for b in range(B)])


def ref_attention(t, sm_scale, q_mult=1.0, k_mult=1.0, v_mult=1.0):
    """SGLang's MSA attention in float64: row r of request b at position pos, KV head kh, attends
    keys j <= pos, j < seq_len of the blocks in topk_idx[kh, r] (up to the first -1), key j at slot
    req_to_token[slot_ids[b], j]."""
    q = t["q"].cpu().double() * q_mult
    kc, vc = t["k_cache"].cpu().double() * k_mult, t["v_cache"].cpu().double() * v_mult
    r2t, idx = t["req_to_token"].cpu(), t["topk_idx"].cpu()
    T, Hq, _ = q.shape
    Hkv = kc.shape[1]
    G = Hq // Hkv
    out = torch.zeros((T, Hq, D), dtype=torch.float64)
    for b, rows in enumerate(t["rows"]):
        L, sid = int(t["seq_lens"][b]), int(t["slot_ids"][b])
        for r, pos in rows:
            for kh in range(Hkv):
                blocks = []
                for x in idx[kh, r].tolist():
                    if x < 0:
                        break
                    blocks.append(x)
                cols = sorted({j for s in blocks for j in range(s * BLK, s * BLK + BLK)
                               if j <= pos and j < L})
                slots = r2t[sid, cols].long()
                logits = q[r, kh * G:(kh + 1) * G] @ kc[slots, kh].T * sm_scale
                out[r, kh * G:(kh + 1) * G] = torch.softmax(logits, -1) @ vc[slots, kh]
    return out


def ref_index_topk(t, topk, init, local):
    """SGLang's indexer (max scores) in float64: row r at position pos, index head h scores block
    s by the max over its keys j <= pos, j < seq_len of idx_q . idx_k; the first ``init`` and the
    last ``local`` of its pos // 128 + 1 visible blocks always, then the best scores (ties to the
    lower block); ascending, -1 padded. Returns (heads, rows, topk) int32."""
    q, kc, r2t = t["idx_q"].cpu().double(), t["idx_k"].cpu().double(), t["req_to_token"].cpu()
    heads = q.shape[1]
    out = torch.full((heads, q.shape[0], topk), -1, dtype=torch.int32)
    for b, rows in enumerate(t["rows"]):
        L, sid = int(t["seq_lens"][b]), int(t["slot_ids"][b])
        keys = kc[r2t[sid, :L].long(), 0]  # (L, D)
        for r, pos in rows:
            n = pos // BLK + 1
            logits = q[r] @ keys[:min(pos + 1, L)].T  # (heads, visible keys)
            for h in range(heads):
                score = [float(logits[h, s * BLK:(s + 1) * BLK].max()) for s in range(n)]
                forced = set(range(min(init, n))) | set(range(max(0, n - local), n))
                rest = sorted((s for s in range(n) if s not in forced), key=lambda s: (-score[s], s))
                chosen = sorted(forced | set(rest[:max(topk - len(forced), 0)]))[:topk]
                out[h, r, :len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return out


def check_close(got, want, tol):
    assert not torch.isnan(got).any()
    err = (got.double().cpu() - want).abs().max().item()
    assert err < tol, err


# ---- prefill -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_prefill_matches_float64(device):
    t = make_problem(device, [700, 300, 129], [300, 300, 1])
    out = fs.msa_sparse_prefill_main(t["q"], t["k_cache"], t["v_cache"], t["topk_idx"],
                                     t["req_to_token"], t["slot_ids"], t["cu"], t["seq_lens"],
                                     t["prefix_lens"], BLK, sm_scale=0.1)
    assert out.shape == t["q"].shape and out.dtype == torch.bfloat16
    check_close(out, ref_attention(t, 0.1), 2e-2)
    # Default scale: head_dim ** -0.5; scales multiply Q, K, V.
    out = fs.msa_sparse_prefill_main(t["q"], t["k_cache"], t["v_cache"], t["topk_idx"],
                                     t["req_to_token"], t["slot_ids"], t["cu"], t["seq_lens"],
                                     t["prefix_lens"], BLK, q_scale=0.5, k_scale=1.5, v_scale=2.0)
    check_close(out, ref_attention(t, D ** -0.5, 0.5, 1.5, 2.0), 4e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_q_and_cache(device):
    """SGLang's fp8 attention-GEMM mode: e4m3 q (value / q_scale) and e4m3 K / V caches with
    scalar scales; the output is bf16."""
    t = make_problem(device, [600, 256], [100, 256], kv_dtype=torch.float8_e4m3fn, seed=3)
    t["q"] = (t["q"].float() / 2).to(torch.float8_e4m3fn)
    out = fs.msa_sparse_prefill_main(t["q"], t["k_cache"], t["v_cache"], t["topk_idx"],
                                     t["req_to_token"], t["slot_ids"], t["cu"], t["seq_lens"],
                                     t["prefix_lens"], BLK, sm_scale=0.09, q_scale=2.0,
                                     k_scale=0.7, v_scale=1.3)
    assert out.dtype == torch.bfloat16
    check_close(out, ref_attention(t, 0.09, 2.0, 0.7, 1.3), 4e-2)
    dec = make_problem(device, [600, 256, 1000], [1, 1, 1], kv_dtype=torch.float8_e4m3fn, seed=4)
    dec["q"] = dec["q"].to(torch.float8_e4m3fn)
    out = fs.msa_sparse_decode_main(dec["q"], dec["k_cache"], dec["v_cache"], dec["topk_idx"],
                                    dec["req_to_token"], dec["slot_ids"], dec["seq_lens"], BLK,
                                    sm_scale=0.1, k_scale=0.5, v_scale=3.0)
    assert out.dtype == torch.bfloat16
    check_close(out, ref_attention(dec, 0.1, 1.0, 0.5, 3.0), 8e-2)


# ---- decode ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_decode_matches_float64(device):
    t = make_problem(device, [900, 300, 128, 129], [1, 1, 1, 1], seed=5)
    want = ref_attention(t, 0.12)
    # Without the per-forward cache: page table and lengths built per call.
    out = fs.msa_sparse_decode_main(t["q"], t["k_cache"], t["v_cache"], t["topk_idx"],
                                    t["req_to_token"], t["slot_ids"], t["seq_lens"], BLK,
                                    sm_scale=0.12)
    check_close(out, want, 2e-2)
    # SGLang's serving path: a persistent plan per batch size, refreshed in place each forward.
    plan = fs.build_msa_decode_cg_plan(8, 2, BLK, 4, 4, device=torch.device(device))
    nb_max = math.ceil(2048 / BLK)  # the backend's max_context_len // 128
    buf = torch.zeros(4 * nb_max, dtype=torch.int32, device=device)
    fs.update_msa_decode_cg_meta(plan, buf, t["req_to_token"], t["slot_ids"], t["seq_lens"], BLK,
                                 4, 8, 2)
    again = fs.msa_sparse_decode_main(t["q"], t["k_cache"], t["v_cache"], t["topk_idx"],
                                      t["req_to_token"], t["slot_ids"], t["seq_lens"], BLK,
                                      sm_scale=0.12, kv_indices=buf, plan=plan)
    assert torch.equal(again, out)
    # The per-call meta (SGLang's parity-harness path) is the same pair.
    kv_indices, meta_plan = fs.build_msa_decode_meta(t["k_cache"], t["req_to_token"],
                                                     t["slot_ids"], t["seq_lens"], 8, BLK, 4)
    assert torch.equal(meta_plan.seq_lens, plan.seq_lens)
    width = kv_indices.numel() // 4
    assert torch.equal(kv_indices.view(4, width)[:, :8], buf.view(4, nb_max)[:, :8])


@pytest.mark.parametrize("device", DEVICES)
def test_decode_empty_batch(device):
    t = make_problem(device, [300], [1])
    out = fs.msa_sparse_decode_main(t["q"][:0], t["k_cache"], t["v_cache"], t["topk_idx"][:, :0],
                                    t["req_to_token"], t["slot_ids"][:0], t["seq_lens"][:0], BLK)
    assert out.shape == (0, t["q"].shape[1], D)
    plan = fs.build_msa_decode_cg_plan(8, 2, BLK, 4, 0, device=torch.device(device))
    fs.update_msa_decode_cg_meta(plan, torch.zeros(0, dtype=torch.int32, device=device),
                                 t["req_to_token"], t["slot_ids"][:0], t["seq_lens"][:0], BLK, 4,
                                 8, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA graphs)")
def test_decode_step_inside_cuda_graph():
    """SGLang's decode under CUDA graphs: the plan is built once per batch size, the layer's step
    (the indexer, then the attention over its selection) captured reading it; each forward
    rewrites the plan's lengths and page table outside the graph, and the replay selects and
    attends for the new requests bit-identically to an eager call."""
    dev = torch.device("cuda", torch.cuda.current_device())
    t = make_problem(dev, [900, 300, 700, 1200, 129, 256], [1] * 6, seed=6)
    want_sel = ref_index_topk(t, 8, 1, 2)  # row b = request b
    batches = (slice(0, 3), slice(3, 6))
    plan = fs.build_msa_decode_cg_plan(8, 2, BLK, 8, 3, device=dev)
    buf = torch.zeros(3 * 16, dtype=torch.int32, device=dev)
    # The graph's static inputs (SGLang's graph buffers), holding the first batch.
    static = dict(q=t["q"][:3].clone(), idx_q=t["idx_q"][:3].clone(),
                  slot_ids=t["slot_ids"][:3].clone(), seq_lens=t["seq_lens"][:3].clone())

    def step():
        _, sel, _ = fs.flash_decode_with_topk_idx(
            static["idx_q"], None, t["idx_k"], None, t["req_to_token"], static["seq_lens"], 2048,
            static["slot_ids"], BLK, 8, 1, 2, disable_index_value=True, page_size=BLK)
        # M3 pairs index head h with KV head h; this problem has 4 index heads over 2 KV heads:
        # the first two heads' selections serve the attention.
        sel = sel[:2]
        return fs.msa_sparse_decode_main(static["q"], t["k_cache"], t["v_cache"], sel,
                                         t["req_to_token"], static["slot_ids"],
                                         static["seq_lens"], BLK, sm_scale=0.1, kv_indices=buf,
                                         plan=plan), sel

    fs.update_msa_decode_cg_meta(plan, buf, t["req_to_token"], static["slot_ids"],
                                 static["seq_lens"], BLK, 8, 8, 2)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):  # SGLang's warm-up runs before capture
            step()
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, sel = step()
    for rows in batches:
        out.fill_(float("nan"))
        sel.fill_(-7)
        for k in static:
            static[k].copy_(t[k][rows])
        fs.update_msa_decode_cg_meta(plan, buf, t["req_to_token"], static["slot_ids"],
                                     static["seq_lens"], BLK, 8, 8, 2)
        graph.replay()
        eager_out, eager_sel = step()
        torch.cuda.synchronize(dev)
        assert torch.equal(out, eager_out) and torch.equal(sel, eager_sel)
        assert torch.equal(sel.cpu(), want_sel[:2, rows])
        problem = dict(t, topk_idx=sel, rows=[[(b, int(t["seq_lens"][rows][b]) - 1)]
                                               for b in range(3)],
                       q=static["q"], slot_ids=static["slot_ids"], seq_lens=static["seq_lens"])
        check_close(out, ref_attention(problem, 0.1), 2e-2)


# ---- the indexer ---------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_prefill_indexer_matches_float64(device):
    t = make_problem(device, [700, 300, 129], [300, 300, 1], seed=11)
    out, sel = fs.flash_prefill_with_topk_index(
        t["idx_q"], t["idx_k"], None, None, t["req_to_token"], t["slot_ids"], t["cu"],
        t["seq_lens"], t["prefix_lens"], 300, 700, 1, BLK, 6, init_blocks=1, local_blocks=2,
        sm_scale=0.088, disable_index_value=True, page_size=BLK, k_scale=0.5)
    assert out is None and sel.dtype == torch.int32 and sel.is_contiguous()
    assert torch.equal(sel.cpu(), ref_index_topk(t, 6, 1, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_decode_indexer_matches_float64(device):
    t = make_problem(device, [900, 300, 128, 129, 2000], [1] * 5, seed=12)
    out, sel, lens = fs.flash_decode_with_topk_idx(
        t["idx_q"], None, t["idx_k"], None, t["req_to_token"], t["seq_lens"], 2000,
        t["slot_ids"], BLK, 8, 1, 2, sm_scale=0.088, disable_index_value=True, page_size=BLK)
    assert out is None and lens is None
    assert torch.equal(sel.cpu(), ref_index_topk(t, 8, 1, 2))
    # An empty batch (SGLang's idle forward).
    _, sel, _ = fs.flash_decode_with_topk_idx(
        t["idx_q"][:0], None, t["idx_k"], None, t["req_to_token"], t["seq_lens"][:0], 2000,
        t["slot_ids"][:0], BLK, 8, 1, 2, disable_index_value=True, page_size=BLK)
    assert sel.shape == (4, 0, 8)


def test_decode_indexer_launches_few_kernels():
    """The decode indexer runs once per layer of every decode step (in a CUDA graph each small
    kernel costs its launch): besides the proxy score and the top-k, the page table's gather
    from req_to_token and its division, and the rows' visible block counts (an add and a
    division); seq_lens converted only where it is not int32."""
    t = make_problem("cpu", [900, 300, 129], [1] * 3, seed=13)
    for seq_lens, convert in ((t["seq_lens"].to(torch.int32), []), (t["seq_lens"], ["_to_copy"])):
        args = (t["idx_q"], None, t["idx_k"], None, t["req_to_token"], seq_lens, 900,
                t["slot_ids"], BLK, 8, 1, 2)
        kw = dict(disable_index_value=True, page_size=BLK)
        fs.flash_decode_with_topk_idx(*args, **kw)  # the constants, made once
        (_, got, _), names = dispatched_ops(lambda: fs.flash_decode_with_topk_idx(*args, **kw))
        assert torch.equal(got, ref_index_topk(t, 8, 1, 2))
        gather = names[len(convert):names.index("proxy_score")]
        assert names[:len(convert)] == convert, names
        assert names[names.index("proxy_score"):] == ["proxy_score", "add", "div",
                                                      "topk_select"], names
        assert gather == ["index", "div"], names  # slot_ids (int64) used as they are


@pytest.mark.parametrize("device", DEVICES)
def test_decode_indexer_shares_the_forward_metadata(device):
    """Called with the very tensors this forward's decode metadata was built from (SGLang's decode
    layers are), the indexer takes the plan's page table, lengths and visible block counts: only
    the proxy score and the top-k run, and the selection is the same. Any other tensors (a later
    forward's, equal in value; a batch the plan does not hold) build their own."""
    t = make_problem(device, [900, 300, 129], [1] * 3, seed=14)
    want = ref_index_topk(t, 8, 1, 2)
    slots, seq = t["slot_ids"].clone(), t["seq_lens"].clone()
    plan = fs.build_msa_decode_cg_plan(8, 2, BLK, 8, 3, device=torch.device(device))
    buf = torch.zeros(3 * 16, dtype=torch.int32, device=device)
    fs.update_msa_decode_cg_meta(plan, buf, t["req_to_token"], slots, seq, BLK, 8, 8, 2)

    def index(slot_ids, seq_lens, max_seqlen=2000):
        return fs.flash_decode_with_topk_idx(
            t["idx_q"][:slot_ids.shape[0]], None, t["idx_k"], None, t["req_to_token"], seq_lens,
            max_seqlen, slot_ids, BLK, 8, 1, 2, disable_index_value=True, page_size=BLK)[1]

    index(slots, seq)  # the constants, made once
    got, names = dispatched_ops(lambda: index(slots, seq))
    assert torch.equal(got.cpu(), want)
    assert names == ["proxy_score", "topk_select"], names
    for other in ((t["slot_ids"], seq), (slots, t["seq_lens"]), (slots, seq.clone()),
                  (slots[:2], seq[:2])):
        index(*other)  # constants of a new batch size, made once
        got, names = dispatched_ops(lambda: index(*other))
        assert torch.equal(got.cpu(), want[:, :other[0].shape[0]])
        assert names[-5:] == ["index", "div", "proxy_score", "add", "div", "topk_select"][-5:] \
            and "index" in names, names
    # A plan table narrower than the call's columns (4 pages a row, the call's 9): built apart.
    narrow = torch.zeros(3 * 4, dtype=torch.int32, device=device)
    fs.update_msa_decode_cg_meta(plan, narrow, t["req_to_token"], slots, seq, BLK, 8, 8, 2)
    got, names = dispatched_ops(lambda: index(slots, seq))
    assert torch.equal(got.cpu(), want) and "index" in names, names


@pytest.mark.parametrize("case", ["index_value", "sink", "lse", "block_size_q", "page_size",
                                  "dense_main_attn", "negative_scale"])
def test_indexer_leaves_other_calls_to_sglang(monkeypatch, case):
    """The calls flashmsa does not take run SGLang's own kernel (kept by patch()), with the same
    arguments; without it they raise NotSupportedError naming what flashmsa does not take."""
    t = make_problem("cpu", [300], [1])
    seen = []
    monkeypatch.setattr(fs, "_SGLANG_ORIGINALS", {
        "flash_prefill_with_topk_index": lambda *a, **k: seen.append(("prefill", a, k)) or "p",
        "flash_decode_with_topk_idx": lambda *a, **k: seen.append(("decode", a, k)) or "d"})
    kw = dict(disable_index_value=case != "index_value", page_size=1 if case == "page_size" else BLK,
              score_type="lse" if case == "lse" else "max",
              k_scale=-1.0 if case == "negative_scale" else None)
    sink = torch.zeros((4, D)) if case == "sink" else None
    prefill = (t["idx_q"], t["idx_k"], None, sink, t["req_to_token"], t["slot_ids"], t["cu"],
               t["seq_lens"], t["prefix_lens"], 1, 300, 16 if case == "block_size_q" else 1, BLK, 4)
    decode = (t["idx_q"], sink, t["idx_k"], None, t["req_to_token"], t["seq_lens"], 300,
              t["slot_ids"], BLK, 4, 1, 1)
    if case != "dense_main_attn":
        assert fs.flash_prefill_with_topk_index(*prefill, **kw) == "p"
        assert seen[-1][1] == prefill and seen[-1][2]["score_type"] == kw["score_type"]
    if case != "block_size_q":
        assert fs.flash_decode_with_topk_idx(*decode, **kw,
                                             use_dense_main_attn=case == "dense_main_attn") == "d"
        assert seen[-1][1] == decode and seen[-1][2]["page_size"] == kw["page_size"]
    monkeypatch.setattr(fs, "_SGLANG_ORIGINALS", {})
    with pytest.raises(NotSupportedError, match="through patch"):
        if case == "dense_main_attn":
            fs.flash_decode_with_topk_idx(*decode, **kw, use_dense_main_attn=True)
        else:
            fs.flash_prefill_with_topk_index(*prefill, **kw)


# ---- arguments -----------------------------------------------------------------------------------

def test_bad_arguments_name_them():
    t = make_problem("cpu", [300, 200], [1, 1])
    args = (t["q"], t["k_cache"], t["v_cache"], t["topk_idx"], t["req_to_token"], t["slot_ids"],
            t["seq_lens"])
    with pytest.raises(NotSupportedError, match="block_size_k"):
        fs.msa_sparse_decode_main(*args, 64)
    with pytest.raises(ValueError, match="max_slots=200 not divisible"):
        fs.msa_sparse_decode_main(t["q"], t["k_cache"][:200], t["v_cache"][:200], *args[3:], BLK)
    with pytest.raises(ValueError, match="k_cache must be contiguous"):
        k = t["k_cache"].transpose(0, 1).contiguous().transpose(0, 1)
        fs.msa_sparse_decode_main(t["q"], k, t["v_cache"], *args[3:], BLK)
    with pytest.raises(ValueError, match="v_cache must be shaped like k_cache"):
        fs.msa_sparse_decode_main(t["q"], t["k_cache"], t["v_cache"][:128], *args[3:], BLK)
    with pytest.raises(ValueError, match="slot_ids must have 2 entries"):
        fs.msa_sparse_decode_main(*args[:5], t["slot_ids"][:1], t["seq_lens"], BLK)
    plan = fs.build_msa_decode_cg_plan(8, 2, BLK, 4, 3, device=torch.device("cpu"))
    buf = torch.zeros(2 * 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="plan is for batch size 3"):
        fs.update_msa_decode_cg_meta(plan, buf, t["req_to_token"], t["slot_ids"], t["seq_lens"],
                                     BLK, 4, 8, 2)
    with pytest.raises(ValueError, match="plan must be flashmsa's decode plan for batch size 2"):
        fs.msa_sparse_decode_main(*args, BLK, kv_indices=buf, plan=plan)
    plan = fs.build_msa_decode_cg_plan(8, 2, BLK, 4, 2, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="kv_indices_buf must be a contiguous int32"):
        fs.update_msa_decode_cg_meta(plan, buf.long(), t["req_to_token"], t["slot_ids"],
                                     t["seq_lens"], BLK, 4, 8, 2)
    with pytest.raises(ValueError, match="plan must come from flashmsa"):
        fs.update_msa_decode_cg_meta((None, None, None, {}), buf, t["req_to_token"],
                                     t["slot_ids"], t["seq_lens"], BLK, 4, 8, 2)
    with pytest.raises(ValueError, match="q_scale must be finite"):
        fs.msa_sparse_decode_main(*args, BLK, q_scale=float("nan"))
    with pytest.raises(ValueError, match="req_to_token must be 2-D"):
        fs.msa_sparse_decode_main(*args[:4], t["req_to_token"][0], *args[5:], BLK)
    with pytest.raises(ValueError, match="slot_ids must be int32"):
        fs.msa_sparse_decode_main(*args[:5], t["slot_ids"].float(), t["seq_lens"], BLK)
    with pytest.raises(ValueError, match="v_cache must be a"):
        fs.msa_sparse_decode_main(t["q"], t["k_cache"], None, *args[3:], BLK)
    with pytest.raises(ValueError, match="seq_lens must have 2 entries"):
        fs.msa_sparse_decode_main(*args[:6], t["seq_lens"][:1], BLK)
    with pytest.raises(ValueError, match="topk_idx must be int32"):
        fs.msa_sparse_decode_main(t["q"], t["k_cache"], t["v_cache"], t["topk_idx"].float(),
                                  *args[4:], BLK)


def test_available_follows_build():
    from flashmsa._library import built_with_cuda

    expected = built_with_cuda() and torch.cuda.is_available() and \
        torch.cuda.get_device_capability() >= (8, 0)
    assert fs.msa_available() == expected


# ---- patch() ---------------------------------------------------------------------------------------

NAMES = fs._REPLACEMENTS[fs.MSA_MODULE]
INDEXER = {m: names for m, names in fs._INDEXER.items()}


def fake_sglang(monkeypatch, missing=None):
    """SGLang's MSA hook module and its two indexer kernel modules with stand-in functions, and
    two modules that imported some of them by name."""
    originals = {}
    modules = {}
    for module_name, names in {fs.MSA_MODULE: NAMES, **INDEXER}.items():
        parts = module_name.split(".")
        for i in range(1, len(parts)):
            name = ".".join(parts[:i])
            if name not in sys.modules or not getattr(sys.modules[name], "_fake", False):
                package = types.ModuleType(name)
                package._fake = True
                monkeypatch.setitem(sys.modules, name, package)
        module = types.ModuleType(module_name)
        module._fake = True
        for n in names:
            if n != missing:
                originals[n] = (lambda n: lambda *a, **k: ("sglang", n))(n)
                setattr(module, n, originals[n])
        monkeypatch.setitem(sys.modules, module_name, module)
        modules[module_name] = module
    user = types.ModuleType("sglang.srt.layers.attention.minimax_sparse_ops.minimax_sparse")
    user.flash_prefill_with_topk_index = originals.get("flash_prefill_with_topk_index")
    user.msa_available = originals.get("msa_available")
    user.unrelated = len
    monkeypatch.setitem(sys.modules, user.__name__, user)
    monkeypatch.setattr(fs, "_SGLANG_ORIGINALS", {})
    return modules, originals, user


@pytest.mark.parametrize("indexer", [True, False])
def test_patch_swaps_and_undoes(monkeypatch, indexer):
    modules, originals, user = fake_sglang(monkeypatch)
    handle = fs.patch(indexer=indexer)
    for module_name, names in {fs.MSA_MODULE: NAMES, **INDEXER}.items():
        for n in names:
            swapped = module_name == fs.MSA_MODULE or indexer
            assert getattr(modules[module_name], n) is (getattr(fs, n) if swapped else originals[n])
    assert user.msa_available is fs.msa_available and user.unrelated is len
    assert (user.flash_prefill_with_topk_index is fs.flash_prefill_with_topk_index) == indexer
    assert sorted(handle.replaced[fs.MSA_MODULE]) == sorted(NAMES)
    # The indexer's originals are kept for the calls flashmsa leaves to SGLang.
    assert fs._SGLANG_ORIGINALS == ({n: originals[n] for names in INDEXER.values() for n in names}
                                    if indexer else {})
    assert fs.patch(indexer=indexer).swaps == []
    handle.undo()
    for module_name, names in {fs.MSA_MODULE: NAMES, **INDEXER}.items():
        for n in names:
            assert getattr(modules[module_name], n) is originals[n]
    assert user.msa_available is originals["msa_available"]
    assert user.flash_prefill_with_topk_index is originals["flash_prefill_with_topk_index"]


@pytest.mark.parametrize("missing", ["update_msa_decode_cg_meta", "flash_decode_with_topk_idx"])
def test_patch_refuses_other_sglang(monkeypatch, missing):
    modules, originals, _ = fake_sglang(monkeypatch, missing=missing)
    with pytest.raises(AttributeError, match=missing):
        fs.patch()
    assert modules[fs.MSA_MODULE].msa_sparse_decode_main is originals["msa_sparse_decode_main"]


def test_patch_without_sglang(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(ImportError, match="MiniMax-M3"):
        fs.patch()


def test_register_follows_environment(monkeypatch):
    modules, originals, _ = fake_sglang(monkeypatch)
    monkeypatch.delenv("FLASHMSA_SGLANG", raising=False)
    fs.register()
    assert modules[fs.MSA_MODULE].msa_available is originals["msa_available"]
    monkeypatch.setenv("FLASHMSA_SGLANG", "on")
    fs.register()
    assert modules[fs.MSA_MODULE].msa_available is fs.msa_available
    assert modules[fs.PREFILL_INDEX_MODULE].flash_prefill_with_topk_index is \
        fs.flash_prefill_with_topk_index


def test_patch_indexer_only(monkeypatch):
    """attention=False (FLASHMSA_SGLANG=indexer): the indexer's entry points only; SGLang's MSA
    hook, msa_available() among it, stays SGLang's, so its MSA path stays as it was (off on Hopper
    and Ampere), e.g. for speculative decoding under CUDA graphs, which that path refuses."""
    modules, originals, user = fake_sglang(monkeypatch)
    handle = fs.patch(attention=False)
    assert fs.MSA_MODULE not in handle.replaced
    for n in NAMES:
        assert getattr(modules[fs.MSA_MODULE], n) is originals[n]
    assert user.msa_available is originals["msa_available"]
    assert user.flash_prefill_with_topk_index is fs.flash_prefill_with_topk_index
    assert modules[fs.DECODE_INDEX_MODULE].flash_decode_with_topk_idx is fs.flash_decode_with_topk_idx
    handle.undo()
    with pytest.raises(ValueError, match="nothing to swap"):
        fs.patch(indexer=False, attention=False)
    monkeypatch.setenv("FLASHMSA_SGLANG", "indexer")
    fs.register()
    assert modules[fs.MSA_MODULE].msa_available is originals["msa_available"]
    assert modules[fs.PREFILL_INDEX_MODULE].flash_prefill_with_topk_index is \
        fs.flash_prefill_with_topk_index


def test_refusals_become_sglangs_msa_unavailable(monkeypatch):
    """A call the attention functions refuse (NotSupportedError, or ValueError from flashmsa's
    checks) raises, where SGLang's msa module is loaded, an error of its MSAUnavailableError class
    too: SGLang catches that around these calls and runs its Triton attention instead. Without
    SGLang the error is flashmsa's alone."""
    modules, _, _ = fake_sglang(monkeypatch)

    class MSAUnavailableError(RuntimeError):
        pass
    modules[fs.MSA_MODULE].MSAUnavailableError = MSAUnavailableError
    bad = dict(q=torch.zeros(4, 8, 128, dtype=torch.bfloat16),
               k_cache=torch.zeros(256, 2, 128, dtype=torch.float8_e5m2),
               v_cache=torch.zeros(256, 2, 128, dtype=torch.float8_e5m2),
               topk_idx=torch.zeros(2, 4, 4, dtype=torch.int32),
               req_to_token=torch.zeros(1, 256, dtype=torch.int32),
               slot_ids=torch.zeros(1, dtype=torch.int32),
               cu_seqlens=torch.tensor([0, 4], dtype=torch.int32),
               seq_lens=torch.tensor([4], dtype=torch.int32),
               prefix_lens=torch.tensor([0], dtype=torch.int32), block_size_k=128)
    with pytest.raises(MSAUnavailableError) as info:
        fs.msa_sparse_prefill_main(**bad)
    assert isinstance(info.value, NotSupportedError) and str(info.value).startswith("flashmsa: ")
    monkeypatch.delattr(modules[fs.MSA_MODULE], "MSAUnavailableError")
    with pytest.raises(ValueError) as info:
        fs.msa_sparse_prefill_main(**bad)
    assert not isinstance(info.value, MSAUnavailableError)
