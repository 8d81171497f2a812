"""flashmsa.testing itself, where it computes something: the float64 reference against brute-force
loops on tiny cases, NVFP4 quantisation round trips and its scale layout, the cache layouts read
back, the benchmark selection patterns' contract, and the CPU side of the timer."""

import math
import time

import pytest
import torch

from flashmsa.testing import inputs, layouts, nvfp4, reference, timing

# ---- reference vs brute force ------------------------------------------------------------------


def _brute_attention(q, keys, values, q2k, q_lens, causal, scale, q_offset):
    """One python loop per (row, head, key): softmax over the selected, visible keys."""
    hq, hkv = q.shape[1], q2k.shape[0]
    g = hq // hkv
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64)
    row = 0
    for b, n in enumerate(q_lens):
        sk = keys[b].shape[0]
        off = sk - n if q_offset is None else q_offset
        for i in range(n):
            for h in range(hq):
                kh = h // g
                blocks = set()
                for t in q2k[kh, row].tolist():
                    if t < 0:
                        break
                    blocks.add(t)
                logits = []
                for j in range(sk):
                    if j // 128 in blocks and (not causal or j <= off + i):
                        dot = float(torch.dot(q[row, h], keys[b][j, kh]))
                        logits.append((j, dot * scale))
                if not logits:
                    continue
                m = max(x for _, x in logits)
                z = sum(math.exp(x - m) for _, x in logits)
                lse[row, h] = m + math.log(z)
                for j, x in logits:
                    out[row, h] += math.exp(x - m) / z * values[b][j, kh].double()
            row += 1
    return out, lse


@pytest.mark.parametrize("causal,q_offset", [(True, None), (False, None), (True, 2)])
def test_reference_attention_matches_brute_force(causal, q_offset):
    q_lens, k_lens, hq, hkv, topk = [3, 2], [300, 200], 4, 2, 2
    q = torch.randn(sum(q_lens), hq, 128, dtype=torch.float64) / 3
    keys = [torch.randn(n, hkv, 128, dtype=torch.float64) / 3 for n in k_lens]
    values = [torch.randn(n, hkv, 128, dtype=torch.float64) for n in k_lens]
    q2k = torch.tensor([[[0, 2], [1, -1], [2, 0], [-1, 1], [0, 1]],
                        [[2, 1], [0, 0], [1, -1], [0, 5], [1, 0]]], dtype=torch.int32)
    assert q2k.shape == (hkv, sum(q_lens), topk)
    out, lse, _ = reference.attention(q, keys, values, q2k, [0, 3], q_lens, causal=causal,
                                      q_offset=q_offset)
    want_out, want_lse = _brute_attention(q, keys, values, q2k, q_lens, causal, 128 ** -0.5,
                                          q_offset)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    assert torch.isinf(want_lse).any() and torch.isfinite(want_lse).any()  # both kinds of row
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-10)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-10)


def test_reference_proxy_score_matches_brute_force():
    q_lens, k_lens = [2, 3], [260, 130]
    q = torch.randn(sum(q_lens), 2, 128)
    keys = [torch.randn(n, 1, 128) for n in k_lens]
    cu_q = layouts.cu_seqlens(q_lens)
    got = reference.proxy_score(q, keys, cu_q, causal=True, max_k_tiles=3)
    want = torch.full((2, 3, 5), float("-inf"), dtype=torch.float64)
    row = 0
    for b, n in enumerate(q_lens):
        for i in range(n):
            for h in range(2):
                for j in range(k_lens[b]):
                    if j <= k_lens[b] - n + i:
                        s = float((q[row, h].double() * keys[b][j, 0].double()).sum())
                        want[h, j // 128, row] = max(float(want[h, j // 128, row]), s)
            row += 1
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_reference_topk_select_matches_brute_force():
    h, p, s, topk = 2, 12, 5, 4
    score = torch.randn(h, p, s)
    score[0, 3, 1] = score[0, 5, 1]  # a tie: the lower block wins
    nvp = [12, 7, 1, 3, 9]
    got = reference.topk_select(score, topk, torch.tensor(nvp), force_begin=1, force_end=1)
    for t in range(s):
        for hh in range(h):
            n = nvp[t]
            forced = {0, n - 1} if n >= 2 else {0}
            middle = sorted(range(1, n - 1), key=lambda blk: (-float(score[hh, blk, t]), blk))
            want = sorted(forced | set(middle[:topk - len(forced)]))
            want += [-1] * (topk - len(want))
            assert got[t, hh].tolist() == want, (t, hh)


# ---- NVFP4 -------------------------------------------------------------------------------------

def test_nvfp4_round_trip_of_representable_values():
    """Values that are e2m1 codes times an e4m3 block scale with the block's largest magnitude 6
    come back exactly (global scale 1)."""
    rows = 300
    codes = torch.randint(0, 16, (rows, 128))
    codes[:, ::16] = 7  # magnitude 6 in every block: the scale is exactly the block's amax / 6
    table = torch.tensor(nvfp4.E2M1_MAGNITUDES + tuple(-m for m in nvfp4.E2M1_MAGNITUDES))
    block_scale = torch.tensor([0.5, 1.0, 2.0, 0.25, 1.5, 3.0, 0.125, 8.0]).repeat(rows, 1)
    x = table[codes] * block_scale.repeat_interleave(16, dim=1)
    data, scales, dequant_scale = nvfp4.quantize_nvfp4(x.view(3, 100, 128), global_scale=1.0)
    assert data.shape == (3, 100, 64) and data.dtype == torch.uint8 and dequant_scale == 1.0
    assert scales.numel() == nvfp4.nvfp4_scale_bytes(rows) == 384 * 8
    back = nvfp4.dequantize_nvfp4(data, scales)
    assert torch.equal(back.view(rows, 128), x)
    # The even element sits in the low nibble.
    assert torch.equal((data.view(rows, 64) & 0xF).long() % 8, codes[:, 0::2] % 8)
    assert torch.equal(reference.nvfp4_dequant(data, scales).float(), back)


def test_nvfp4_quantize_error_and_global_scale():
    x = torch.randn(40, 2, 128)
    data, scales, gs = nvfp4.quantize_nvfp4(x)
    assert gs == pytest.approx(x.abs().max().item() / (448 * 6))
    back = nvfp4.dequantize_nvfp4(data, scales, gs)
    block_max = x.view(-1, 8, 16).abs().amax(-1, keepdim=True)
    err = (back.view(-1, 8, 16) - x.view(-1, 8, 16)).abs()
    # e2m1 steps are at most 2 (between 4 and 6) on a 6-per-amax grid, plus e4m3 scale rounding.
    assert bool((err <= block_max * (1 / 6 + 1 / 16)).all())
    with pytest.raises(ValueError, match="128"):
        nvfp4.quantize_nvfp4(torch.zeros(3, 64))


def test_nvfp4_codes_are_the_nearest_magnitude_ties_down():
    """quantize_nvfp4 picks each code as the nearest e2m1 magnitude with ties to the smaller one
    (the first minimum of |value - magnitude|), NaN and +-inf as code 0: values on and around
    every midpoint, both signs, huge and tiny blocks."""
    mags = torch.tensor(nvfp4.E2M1_MAGNITUDES)
    mids = (mags[1:] + mags[:-1]) / 2
    around = torch.cat([mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1),
                        mags, torch.rand(4000) * 6.5])
    x = torch.cat([around, -around])
    x = torch.cat([x, torch.zeros(-x.numel() % 15)]).view(-1, 15)
    # every block holds 6 (its scale is exactly 1 at global scale 1) and 15 of the values
    blocks = torch.cat([torch.full((x.shape[0], 1), 6.0), x], 1)
    x = torch.cat([blocks.reshape(-1), torch.zeros(-blocks.numel() % 128)]).view(-1, 128)
    x[0, 1:4] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    x = torch.cat([x, torch.randn(64, 128) * 1e4, torch.randn(64, 128) * 1e-4])
    data, scales, _ = nvfp4.quantize_nvfp4(x, global_scale=1.0)
    # the codes as argmin of the distances computes them, from the stored scales
    sf = nvfp4.dequantize_nvfp4(torch.full_like(data, 0x22), scales)  # code 2: magnitude 1.0
    scaled = torch.where(sf > 0, x / torch.where(sf > 0, sf, 1.0), 0.0)
    want = (scaled.abs().unsqueeze(-1) - mags).abs().argmin(-1)
    want = want | ((scaled < 0) & (want > 0)).long() * 8
    got = torch.stack([data & 0xF, data >> 4], -1).reshape(want.shape).long()
    assert torch.equal(got, want)


def test_nvfp4_scale_offsets_swizzle():
    rows = 256
    off = nvfp4.nvfp4_scale_offsets(rows)
    assert torch.equal(off.reshape(-1).sort().values, torch.arange(rows * 8))  # a permutation
    for r, c in [(0, 0), (1, 0), (0, 5), (37, 3), (130, 7), (255, 4)]:
        want = ((r // 128) * 2 + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
        assert int(off[r, c]) == want


# ---- layouts -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.uint8])
def test_paginate_reads_back(dtype):
    lens = [300, 0, 128, 5]
    x = (torch.randn(sum(lens), 2, 16) * 10).to(dtype)
    gen = torch.Generator().manual_seed(3)
    cache, table, used = layouts.paginate(x, lens, generator=gen, extra_pages=2)
    assert cache.shape == (3 + 0 + 1 + 1 + 2, 2, 128, 16) and table.shape == (4, 3)
    assert used.tolist() == lens
    pages = table[table >= 0].tolist()
    got = layouts.sequences(cache, page_table=table, seqused_k=used)
    want = layouts.sequences(x, cu_seqlens_k=layouts.cu_seqlens(lens))
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert len(set(pages[:3])) == 3  # the first sequence's pages are distinct
    assert layouts.lengths_of(layouts.cu_seqlens(lens)) == lens


@pytest.mark.parametrize("nhd", [False, True])
def test_pack_kv_views(nhd):
    k, v = torch.randn(3, 2, 128, 8), torch.randn(3, 2, 128, 8)
    cache, kv_k, kv_v = layouts.pack_kv(k, v, nhd=nhd)
    assert torch.equal(kv_k, k) and torch.equal(kv_v, v)
    assert kv_k.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()
    assert cache.shape == ((3, 128, 2, 16) if nhd else (3, 2, 128, 16))


# ---- benchmark inputs --------------------------------------------------------------------------

@pytest.mark.parametrize("pattern", ["random", "clustered"])
def test_selection_patterns_keep_their_contract(pattern):
    s, hkv, topk = 1000, 2, 16
    pos = torch.arange(s)
    if pattern == "random":
        sel = inputs.random_selection(pos, hkv, topk, inputs.cuda_generator(1, "cpu"))
    else:
        sel = inputs.clustered_selection(s, hkv, topk, 1, "cpu")
    assert sel.shape == (hkv, s, topk)
    inputs.check_selection(sel, pos, topk)
    bad = sel.clone()
    bad[0, 500, 0] = 7  # block 7 > the local block 3 of token 500
    bad[0, 500] = bad[0, 500].sort().values
    with pytest.raises(AssertionError):
        inputs.check_selection(bad, pos, topk)


def test_visible_keys_and_decode_pages():
    sel = torch.tensor([[[0, 1, -1], [1, -1, -1]]], dtype=torch.int32)  # (1, 2 rows, 3)
    pos = torch.tensor([130, 200])
    # row 0: block 0 (128 keys) + block 1 keys 128..130 (3); row 1: block 1 keys 128..200 (73)
    assert inputs.visible_keys(sel, pos, 1000) == 128 + 3 + 73
    table, pages, unique = inputs.decode_pages(sel, batch=2, seqlen_q=1, num_blocks=4)
    assert pages == 3 and unique == 3
    assert table[0, :2].tolist() == [0, 1] and table[1, 1].item() == 2


# ---- timing ------------------------------------------------------------------------------------

def test_timer_on_cpu_runs_the_requested_repetitions():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)
        return len(calls)

    timer = timing.Timer("cpu", budget_s=0.0, max_reps=3, min_reps=3)
    t, result = timer.time(fn, return_result=True)
    assert len(calls) == 3 and result == 3 and t["reps"] == 3
    assert 2000 <= t["min_us"] <= t["median_us"] <= t["p90_us"]
    assert t["host_us"] is None and t["host_sync"] is False
    budgeted = timing.Timer("cpu", budget_s=0.05, max_reps=100, min_reps=2).time(fn)
    assert 2 <= budgeted["reps"] <= 25


def test_timer_flush_mode_is_checked():
    assert timing.Timer("cpu", budget_s=0.0, max_reps=1, flush="write").flush_mode == "write"
    assert timing.Timer("cpu", budget_s=0.0, max_reps=1).flush_mode == "read"
    with pytest.raises(ValueError, match="flush must be 'read' or 'write'"):
        timing.Timer("cpu", budget_s=0.0, max_reps=1, flush="none")


# ---- cases -------------------------------------------------------------------------------------

@pytest.mark.parametrize("table", ["ATTENTION", "DECODE", "PROXY", "TOPK"])
def test_case_lists(table):
    from flashmsa.testing import cases
    rows = getattr(cases, table)
    names = [c.name for c in rows]
    assert len(set(names)) == len(names), "a case name appears twice"
    assert all(c.checks and set(c.checks) <= set(cases.BOTH) for c in rows)
    ref, gpu = cases.cases(rows, "reference"), cases.cases(rows, "gpu")
    assert ref and gpu and len(ref) + len(gpu) >= len(rows)
    assert [c for c in rows if c in ref or c in gpu] == rows
    with pytest.raises(ValueError, match="check"):
        cases.cases(rows, "cpu")
