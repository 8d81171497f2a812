"""Plan options: the private twins of the public ops (msa_ops._*_planned) take the public
arguments plus ``options``, which the core parses (every op's trailing ``plan`` schema argument):
an unknown option or a bad value is a ValueError naming the option, on every device. On the CPU
the reference has no plan, so valid options leave results unchanged. The GPU suites run each
schedule and kernel through the same options (test_gpu_sparse_attention.py, test_gpu_graphs.py).
"""

import inspect

import pytest
import torch

from flashmsa import msa_ops
from flashmsa.testing import reference as ref

BF16 = torch.bfloat16


def _attn_args():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(20, 4, 128, generator=gen).to(BF16)
    k = torch.randn(500, 2, 128, generator=gen).to(BF16)
    v = torch.randn(500, 2, 128, generator=gen).to(BF16)
    q2k = torch.full((2, 20, 4), -1, dtype=torch.int32)
    q2k[..., :3] = torch.tensor([0, 1, 3], dtype=torch.int32)
    return (q, k, v, q2k, ref.cu_seqlens([12, 8]), ref.cu_seqlens([300, 200]))


def _proxy_args():
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(20, 4, 128, generator=gen).to(BF16)
    k = torch.randn(500, 1, 128, generator=gen).to(BF16)
    return (q, k, ref.cu_seqlens([12, 8]), ref.cu_seqlens([300, 200]))


def _score():
    return torch.randn(2, 9, 20, generator=torch.Generator().manual_seed(5))


VALID = {
    "sparse_attention": [
        None, "", {}, dict(schedule="query_major"), dict(schedule="kv_major"),
        dict(schedule="hybrid", kv_major_kernel="mma_sync", chunk_rows=7, tile_max_waste=8),
        dict(schedule="auto", kv_major_kernel="wgmma", tile_max_waste=1.25),
        dict(schedule="hybrid", tile_kernel="tma"), dict(tile_kernel="cp_async"), dict(tile_kernel="auto"),
        "schedule=kv_major,chunk_rows=1", dict(lists="once"),
    ],
    "proxy_score": [None, dict(kernel="auto"), dict(kernel="mma_sync"), dict(kernel="sm90"),
                    dict(kernel="sm90_ss_only"), dict(kernel="decode"), dict(kernel="decode_only"),
                    dict(kernel="decode_f16"), dict(kernel="decode_f16_only"),
                    dict(kernel="sm90_f16"), dict(kernel="sm90_f16_only"),
                    dict(kernel="decode_only", decode_ilp=2), dict(decode_ilp=1),
                    "kernel=decode_f16_only,decode_ctas=4,decode_ilp=2",
                    dict(nvfp4_cvt="auto"), dict(nvfp4_cvt="byte"),
                    dict(kernel="decode_only", nvfp4_cvt="word"), "nvfp4_cvt=word,decode_ilp=2",
                    dict(decode_fp8="cta"), dict(kernel="decode_only", decode_fp8="tma"),
                    dict(decode_nvfp4="cta"), dict(kernel="decode_only", decode_nvfp4="tma"),
                    dict(decode_tma_issue="warps"), dict(decode_nvfp4="tma", decode_tma_issue="producer")],
    "topk_select": [None, dict(kernel="auto"), dict(kernel="warp_per_row"),
                    dict(kernel="warp_per_row_8"), dict(kernel="radix"), dict(kernel="by_size"),
                    dict(kernel="radix_1buf"), dict(kernel="warp_split"),
                    dict(kernel="radix_uniform"), dict(kernel="warp_digits"),
                    dict(kernel="net"), dict(kernel="net", net_lanes=2), "kernel=net,net_lanes=32",
                    dict(net_lanes="auto"), dict(net_pivot="on"), dict(net_pivot="off"),
                    "kernel=net,net_pivot=on,net_lanes=32", dict(net_pivot="auto"),
                    dict(net_pivot_mode="rank_cta"), dict(net_pivot="on", net_pivot_mode="rank_cta"),
                    dict(net_pivot_mode="sort"), dict(net_pivot="off", net_pivot_mode="auto")],
    "sparse_decode": [None, dict(kernel="auto"), dict(kernel="smem"), dict(kernel="regs"),
                      dict(mtp="union"), dict(kernel="smem", mtp="per_token"),
                      dict(kernel="regs", mtp="union"), "kernel=regs,mtp=union",
                      dict(nvfp4_cvt="auto"), dict(nvfp4_cvt="byte"),
                      dict(kernel="regs", nvfp4_cvt="word"), "kernel=regs,nvfp4_cvt=word",
                      dict(split="cluster"), dict(split="blocks"), dict(split="auto"),
                      dict(kernel="regs", split="cluster"), "mtp=per_token,split=cluster",
                      dict(kernel="wgmma"), dict(kernel="wgmma", mtp="union"), "kernel=wgmma,mtp=per_token",
                      dict(kernel="wgmma", wgmma_pipe="ahead"), dict(wgmma_pipe="inline"),
                      "wgmma_pipe=ahead", dict(kernel="wgmma", wgmma_fp8="on"), dict(wgmma_fp8="off"),
                      "kernel=wgmma,wgmma_fp8=on,wgmma_pipe=ahead", dict(wgmma_fp8="auto"),
                      dict(split_warps="8"), dict(split_warps="4"),
                      dict(split_warps="auto"), "split=blocks,split_warps=8", dict(kernel="regs", split_warps="8"),
                      dict(split_rule="waves"), dict(split_rule="ceil"), "split_rule=auto,split_warps=4",
                      dict(combine_loads="with"), dict(combine_loads="after"), "combine_loads=auto",
                      dict(combine_loads="with", split_warps="8", mtp="per_token"),
                      dict(regs_feed="tma"), dict(regs_feed="cp_async"), "kernel=regs,regs_feed=tma",
                      dict(regs_feed="auto", split="cluster")],
}


def _call(op, options, public=False):
    if op == "sparse_attention":
        fn = msa_ops.msa_sparse_attention if public else msa_ops._sparse_attention_planned
        args, kwargs = _attn_args(), dict(causal=True, return_softmax_lse=True)
    elif op == "sparse_decode":
        fn = msa_ops.msa_sparse_decode_attention if public else msa_ops._sparse_decode_planned
        q, k, v, q2k, _, _ = _attn_args()
        args = (q[:4], k, v, q2k[:, :4].contiguous())
        kwargs = dict(cu_seqlens_k=ref.cu_seqlens([250, 200, 30, 20]), seqlen_q=1,
                      return_softmax_lse=True)
    elif op == "proxy_score":
        fn = msa_ops.msa_proxy_score if public else msa_ops._proxy_score_planned
        args, kwargs = _proxy_args(), dict(causal=True)
    else:
        fn = msa_ops.msa_topk_select if public else msa_ops._topk_select_planned
        args, kwargs = (_score(), 4), dict(force_end_blocks=1)
    if public:
        return fn(*args, **kwargs)
    return fn(*args, **kwargs, options=options)


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("op,options", [(op, o) for op, opts in VALID.items() for o in opts])
def test_valid_options_leave_cpu_results_unchanged(op, options):
    want = _as_tuple(_call(op, None, public=True))
    got = _as_tuple(_call(op, options))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("op,options,match", [
    ("sparse_attention", dict(schedule="fast"),
     "schedule must be auto, query_major, kv_major or hybrid, got 'fast'"),
    ("sparse_attention", dict(kv_major_kernel="tensor"),
     "kv_major_kernel must be auto, mma_sync, wgmma or tma, got 'tensor'"),
    ("sparse_attention", dict(chunk_rows=0), "chunk_rows must be a positive integer, got '0'"),
    ("sparse_attention", dict(chunk_rows=2.5), "chunk_rows must be a positive integer"),
    ("sparse_attention", dict(tile_max_waste=9), "tile_max_waste must be a number from 1 to 8"),
    ("sparse_attention", dict(tile_max_waste="nan"), "tile_max_waste must be a number from 1 to 8"),
    ("sparse_attention", dict(tile_max_waste="1.5x"), "tile_max_waste must be a number from 1 to 8"),
    ("sparse_attention", dict(speed=11), "unknown plan option 'speed'"),
    ("sparse_attention", dict(tile_kernel="wgmma"), "tile_kernel must be auto, cp_async or tma, got 'wgmma'"),
    ("sparse_attention", dict(tile_bound="wide"), "tile_bound must be auto, fixed or adaptive, got 'wide'"),
    ("sparse_attention", dict(kv_major_store="ldg"), "kv_major_store must be auto, stg or tma, got 'ldg'"),
    ("sparse_attention", dict(kv_major_math="fast"), "kv_major_math must be auto, precise or approx, got 'fast'"),
    # kv_major_prefetch (the next KV-major item's bytes asked of L2) was removed: bit-identical and
    # slower on the H200 (32K random 8.29 vs 7.47 ms of kernels, cec7a74).
    ("sparse_attention", dict(kv_major_prefetch="l2"), "unknown plan option 'kv_major_prefetch'"),
    # kv_major_gather (the Hopper KV-major kernel's query rows by TMA boxes) was removed: bit-identical
    # and slower on the H200 (32K random 8172 vs 7824 us with TMA stores, 73ba220).
    ("sparse_attention", dict(kv_major_gather="tma"), "unknown plan option 'kv_major_gather'"),
    # tile_pingpong (the TMA tile kernel's consumer warpgroups taking turns issuing their MMAs) was
    # removed: bit-identical and no faster on the H200 (43c70d4 / fe6e5cc).
    ("sparse_attention", dict(tile_pingpong="on"),
     r"unknown plan option 'tile_pingpong' \(options: schedule, kv_major_kernel, chunk_rows, tile_max_waste, "
     r"tile_kernel, lists, tile_bound, kv_major_store, kv_major_math\)"),
    # The KV-major combine variants were removed, and the combine option with them; so was the later
    # in-kernel combine=overlap and its combine_ctas (bit-identical but slower on the H200).
    *[("sparse_attention", dict(combine=v), "unknown plan option 'combine'")
      for v in ("auto", "separate", "fused", "prefetch", "overlap", "overlap_staged")],
    ("sparse_attention", dict(combine_ctas=8), "unknown plan option 'combine_ctas'"),
    ("sparse_attention", "schedule", "name=value"),
    ("proxy_score", dict(kernel="wgmma"),
     "kernel must be auto, mma_sync, sm90, sm90_only, sm90_ss, sm90_ss_only, decode, "
     "decode_only, decode_f16, decode_f16_only, sm90_f16 or sm90_f16_only, got 'wgmma'"),
    ("proxy_score", dict(schedule="kv_major"), "unknown plan option 'schedule'"),
    ("proxy_score", dict(decode_ilp=3), "decode_ilp must be auto, 1 or 2, got '3'"),
    ("proxy_score", dict(decode_ilp=0), "decode_ilp must be auto, 1 or 2, got '0'"),
    ("proxy_score", dict(nvfp4_cvt="half"), "nvfp4_cvt must be auto, byte or word, got 'half'"),
    ("proxy_score", dict(decode_fp8="wgmma"), "decode_fp8 must be auto, cta or tma, got 'wgmma'"),
    ("proxy_score", dict(decode_nvfp4="bulk"), "decode_nvfp4 must be auto, cta or tma, got 'bulk'"),
    ("proxy_score", dict(decode_tma_issue="lane"),
     "decode_tma_issue must be auto, producer or warps, got 'lane'"),
    # sm90_convert was removed when its closed-form fp8 converters became the only ones (faster on
    # the H200: 32K 836.8 vs 887.2 us, 73ba220).
    ("proxy_score", dict(sm90_convert="strided"), "unknown plan option 'sm90_convert'"),
    ("sparse_decode", dict(kernel="fastest"), "kernel must be auto, smem, regs or wgmma, got 'fastest'"),
    # kernel=regs8 (8 warps per CTA for fp8 K/V) was removed: slower than regs on the H200 (at 5b22cb3).
    ("sparse_decode", dict(kernel="regs8"), "kernel must be auto, smem, regs or wgmma, got 'regs8'"),
    # kernel=regs_pipe (the fp8 register kernel pipelined across blocks) was removed: not faster than
    # regs on the H200 (at 054c9ce).
    ("sparse_decode", dict(kernel="regs_pipe"), "kernel must be auto, smem, regs or wgmma, got 'regs_pipe'"),
    ("sparse_decode", dict(schedule="kv_major"), "unknown plan option 'schedule'"),
    ("sparse_decode", dict(nvfp4_cvt="prmt"), "nvfp4_cvt must be auto, byte or word, got 'prmt'"),
    ("sparse_decode", dict(split="tiles"), "split must be auto, blocks or cluster, got 'tiles'"),
    ("sparse_decode", dict(wgmma_pipe="deep"), "wgmma_pipe must be auto, inline or ahead, got 'deep'"),
    ("sparse_decode", dict(wgmma_fp8="yes"), "wgmma_fp8 must be auto, off or on, got 'yes'"),
    ("sparse_decode", dict(split="dsmem"), "split must be auto, blocks or cluster, got 'dsmem'"),
    ("sparse_decode", dict(split_warps="16"), "split_warps must be auto, 4 or 8, got '16'"),
    ("sparse_decode", dict(split_rule="floor"), "split_rule must be auto, ceil or waves, got 'floor'"),
    ("sparse_decode", dict(combine_loads="before"), "combine_loads must be auto, after or with, got 'before'"),
    ("sparse_decode", dict(regs_feed="bulk"), "regs_feed must be auto, cp_async or tma, got 'bulk'"),
    ("topk_select", dict(net_pivot="yes"), "net_pivot must be auto, off or on, got 'yes'"),
    ("topk_select", dict(net_pivot="on", net_lanes=16), "net_pivot=on runs 32 lanes per row, got net_lanes=16"),
    ("topk_select", dict(net_pivot_mode="bitonic"),
     "net_pivot_mode must be auto, sort or rank_cta, got 'bitonic'"),
    # rank (the counting in one warp a row) was removed: slower than sort (0e3ed29).
    ("topk_select", dict(net_pivot_mode="rank"), "net_pivot_mode must be auto, sort or rank_cta, got 'rank'"),
    ("topk_select", dict(net_pivot="off", net_pivot_mode="rank_cta"),
     "net_pivot_mode=rank_cta orders the pivot path, which net_pivot=off turns off"),
    # combine=in_kernel (a last-CTA tail merge) was removed: slower than the combine kernel (bff5899).
    ("sparse_decode", dict(combine="in_kernel"), "unknown plan option 'combine'"),
    # pdl (programmatic dependent launch of the decode-step kernels) was removed: no faster on the
    # H200 (49412a7), slower with an early trigger (da5ef13).
    ("sparse_decode", dict(pdl="on"), "unknown plan option 'pdl'"),
    ("proxy_score", dict(pdl="on"), "unknown plan option 'pdl'"),
    ("topk_select", dict(pdl="on"), "unknown plan option 'pdl'"),
    ("topk_select", dict(net_lanes=3), "net_lanes must be auto, 1, 2, 4, 8, 16 or 32, got '3'"),
    ("topk_select", dict(net_lanes=64), "net_lanes must be auto, 1, 2, 4, 8, 16 or 32, got '64'"),
    ("topk_select", dict(kernel="heap"),
     "kernel must be auto, warp_per_row, warp_per_row_8, radix, by_size, radix_1buf, warp_split, "
     "radix_uniform, warp_digits or net, got 'heap'"),
    # radix_lean and radix_c32 (lean radix variants) were removed: slower than radix_1buf on the
    # H200 (at 5b22cb3).
    ("topk_select", dict(kernel="radix_lean"),
     "kernel must be auto, warp_per_row, warp_per_row_8, radix, by_size, radix_1buf, warp_split, "
     "radix_uniform, warp_digits or net, got 'radix_lean'"),
    ("topk_select", dict(kernel="radix_c32"),
     "kernel must be auto, warp_per_row, warp_per_row_8, radix, by_size, radix_1buf, warp_split, "
     "radix_uniform, warp_digits or net, got 'radix_c32'"),
    # radix_coop (cooperative histograms) was removed: not faster than radix_uniform (H200 at
    # 054c9ce).
    ("topk_select", dict(kernel="radix_coop"),
     "kernel must be auto, warp_per_row, warp_per_row_8, radix, by_size, radix_1buf, warp_split, "
     "radix_uniform, warp_digits or net, got 'radix_coop'"),
])
def test_bad_options_raise_value_error_naming_the_option(op, options, match):
    with pytest.raises(ValueError, match=match):
        _call(op, options)


def test_options_must_be_a_mapping_or_text():
    with pytest.raises(TypeError, match="options must be a mapping, a str or None"):
        _call("topk_select", 3)


def test_proxy_score_fp4_takes_options():
    from flashmsa.testing import quantize_nvfp4
    q, k, cu_q, cu_k = _proxy_args()
    q4, qs, qg = quantize_nvfp4(q)
    k4, ks, kg = quantize_nvfp4(k)
    args = (q4, k4, qs, ks, qg, kg, cu_q, cu_k)
    want = msa_ops.msa_proxy_score_fp4(*args)
    assert torch.equal(msa_ops._proxy_score_fp4_planned(*args, options=dict(kernel="mma_sync")),
                       want)
    with pytest.raises(ValueError, match="unknown plan option 'chunk_rows'"):
        msa_ops._proxy_score_fp4_planned(*args, options=dict(chunk_rows=3))


@pytest.mark.parametrize("public,planned", [
    (msa_ops.msa_proxy_score, msa_ops._proxy_score_planned),
    (msa_ops.msa_proxy_score_fp4, msa_ops._proxy_score_fp4_planned),
    (msa_ops.msa_topk_select, msa_ops._topk_select_planned),
    (msa_ops.msa_sparse_attention, msa_ops._sparse_attention_planned),
    (msa_ops.msa_sparse_decode_attention, msa_ops._sparse_decode_planned),
])
def test_planned_twins_bind_the_public_arguments(public, planned):
    """A planned twin accepts exactly the public arguments (bound against the public signature)."""
    first = next(iter(inspect.signature(public).parameters))
    with pytest.raises(TypeError):
        planned(no_such_argument=1)
    with pytest.raises(TypeError):
        planned(**{first: None, "no_such_argument": 1})


def test_workspace_query_takes_the_plan():
    """The workspace query of msa_sparse_attention plans with the same options (0 on the CPU)."""
    q, k, v, q2k, cu_q, cu_k = _attn_args()
    out = torch.empty_like(q)
    args = (q, k, v, q2k, cu_q, cu_k, True, None, None, None, None, None, None, None, None, None,
            1.0, out, None, None, None)
    ops = torch.ops.flashmsa
    assert ops.sparse_attention_workspace_size(*args, "schedule=kv_major") == 0
    with pytest.raises(ValueError, match="schedule must be"):
        ops.sparse_attention_workspace_size(*args, "schedule=none")
