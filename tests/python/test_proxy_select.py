"""flashmsa's extension op proxy_score_select (a decode step's msa_proxy_score and
msa_topk_select in one call) on the CPU: the same scores and indices as the two ops called in
turn, on every layout and option the pair takes, and the argument checks of the pair
(docs/semantics.md#proxy-score-select). Its GPU form (one kernel, the proxy's select tail) is
tests/python/test_gpu_proxy_select.py."""

import pytest
import torch

from flashmsa import msa_ops
from flashmsa.testing import paginate
from flashmsa.testing import reference as ref

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


def _inputs(seqs_k, tokens=1, hq=4, hkv=1, k_dtype=BF16, paged=False, lead=0, tail=0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    b = len(seqs_k)
    q = torch.randn((lead + b * tokens + tail, hq, 128), generator=gen).to(BF16)
    k = torch.randn((sum(seqs_k), hkv, 128), generator=gen).to(k_dtype)
    cu_q = torch.arange(b + 1, dtype=torch.int32) * tokens + lead
    args = dict(q=q, cu_seqlens_q=cu_q)
    if paged:
        cache, table, used = paginate(k, list(seqs_k), generator=gen)
        args.update(k=cache, page_table=table, seqused_k=used)
    else:
        args.update(k=k, cu_seqlens_k=ref.cu_seqlens(list(seqs_k)))
    return args


CASES = {
    "decode_flat": (dict(seqs_k=[300, 1000, 129]), dict(topk=4, force_begin_blocks=1, force_end_blocks=1)),
    "decode_paged_fp8": (dict(seqs_k=[2000, 5, 640], k_dtype=FP8, paged=True), dict(topk=8, force_end_blocks=1)),
    "mtp": (dict(seqs_k=[900, 1300], tokens=4), dict(topk=6, force_end_blocks=2)),
    "two_kv_heads": (dict(seqs_k=[700, 256], hq=8, hkv=2), dict(topk=3)),
    "uncovered_rows": (dict(seqs_k=[500, 900], tail=3), dict(topk=5, force_begin_blocks=1)),
}


@pytest.mark.parametrize("nvp", ["none", "int", "tensor"])
@pytest.mark.parametrize("name", list(CASES))
def test_equals_the_two_ops(name, nvp):
    shape, select = CASES[name]
    args = _inputs(**shape)
    total_q = args["q"].shape[0]
    if nvp == "int":
        select = dict(select, num_valid_pages=3)
    elif nvp == "tensor":
        select = dict(select, num_valid_pages=torch.randint(-1, 12, (total_q,), dtype=torch.int32))
    scores, indices = msa_ops.proxy_score_select(**args, **select)
    want = msa_ops.msa_proxy_score(**args)
    assert torch.equal(scores.isnan(), want.isnan())
    assert torch.equal(scores.nan_to_num(0.0), want.nan_to_num(0.0))
    topk_args = {key: value for key, value in select.items()}
    assert torch.equal(indices, msa_ops.msa_topk_select(want, **topk_args))


def test_writes_the_given_outputs_in_their_layouts():
    args = _inputs([700, 400])
    scores = torch.full((4, 6, 2), float("nan"))
    head_major = torch.full((4, 2, 5), -7, dtype=torch.int32)
    got = msa_ops.proxy_score_select(**args, topk=5, force_end_blocks=1, output=scores,
                                     indices=head_major.transpose(0, 1), max_k_tiles=6,
                                     arrivals=torch.zeros(3, dtype=torch.int32))
    assert got[0] is scores
    assert got[1].data_ptr() == head_major.data_ptr()
    want = msa_ops.msa_topk_select(msa_ops.msa_proxy_score(**args, max_k_tiles=6), 5,
                                   force_end_blocks=1)
    assert torch.equal(head_major.transpose(0, 1), want)


def _error(match, **changes):
    args = _inputs([700, 400])
    call = dict(args, topk=4, force_end_blocks=1)
    call.update(changes)
    with pytest.raises(ValueError, match=match):
        msa_ops.proxy_score_select(**call)


def test_arrivals_checked():
    _error("arrivals must be a 1-D int32 tensor of at least len\\(cu_seqlens_q\\) = 3",
           arrivals=torch.zeros(3, dtype=torch.float32))
    _error("arrivals must be a 1-D int32 tensor of at least len\\(cu_seqlens_q\\) = 3",
           arrivals=torch.zeros(2, dtype=torch.int32))
    _error("arrivals must be a 1-D int32", arrivals=torch.zeros(2, 2, dtype=torch.int32))
    _error("arrivals must be contiguous", arrivals=torch.zeros(8, dtype=torch.int32)[::2])


def test_arrivals_and_indices_share_no_memory_with_the_inputs():
    args = _inputs([700, 400])
    # The scores' own storage as the counters, q's as the selection.
    scores = torch.empty(4, 6, 2)
    with pytest.raises(ValueError, match="arrivals"):
        msa_ops.proxy_score_select(**args, topk=4, force_end_blocks=1, output=scores,
                                   arrivals=scores.view(torch.int32).reshape(-1)[:3])
    q_words = args["q"].view(torch.int32)  # (2, 4, 64) int32 over q's bytes
    with pytest.raises(ValueError, match="indices"):
        msa_ops.proxy_score_select(**args, topk=4, force_end_blocks=1, indices=q_words[..., :4])
    # The visible block counts in the scores' storage: the select tail would read them while other
    # CTAs write the scores (the standalone top-k, which only reads both, allows it).
    with pytest.raises(ValueError, match="output must not share memory with num_valid_pages"):
        msa_ops.proxy_score_select(**args, topk=4, force_end_blocks=1, output=scores,
                                   num_valid_pages=scores.view(torch.int32).reshape(-1)[:2])


def test_top_k_arguments_checked_as_the_top_k_checks_them():
    _error("topk", topk=0)
    _error("force_begin_blocks", force_begin_blocks=5)
    _error("num_valid_pages", num_valid_pages=0)


def test_devices_checked():
    args = _inputs([700, 400])
    with pytest.raises(ValueError, match="arrivals"):
        msa_ops.proxy_score_select(**args, topk=4, force_end_blocks=1,
                                   arrivals=torch.zeros(3, dtype=torch.int32, device="meta"))


def test_describe_names_the_path():
    args = _inputs([700, 400])
    q, k = args["q"], args["k"]
    text = torch.ops.flashmsa.proxy_score_select_describe(
        q, k, args["cu_seqlens_q"], args["cu_seqlens_k"], None, None, True, 1, 6, None, None,
        False, torch.empty(4, 6, 2), 4, None, None, 0, 1, torch.empty(2, 4, 4, dtype=torch.int32),
        None, "")
    assert "the selection: msa_topk_select after it (CPU tensors)" in text
