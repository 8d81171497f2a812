"""Hostile but valid inputs, and bad inputs whose error must come before any large allocation
(issue 14's crashes and silent errors). Each test fails without its fix:

* an empty ``(B, 0)`` page table selects the paged layout by shape (it has no data pointer): the
  proxy used to read it as flat (segfault on the CPU, illegal address on the GPU), the attention
  ops named the wrong layout;
* block ``2^24 - 1`` of a ``2^31 - 1``-key paged sequence: ``blocks * 128`` products in int32
  turned the whole proxy row into -inf;
* the default ``max_k_tiles`` of the paged proxy comes from lengths clamped to the page table, and
  no argument makes the wrapper allocate an output larger than the inputs describe before the core
  has checked it;
* tensors with no elements are contiguous (torch's rule), so zero-row calls work;
* "not supported by flashmsa" is one class, caught as ValueError and as NotImplementedError.
"""

import pytest
import torch

from conftest import ALL_DEVICES as DEVICES  # [cpu] too in the GPU run: validation-like, cheap
from flashmsa import _outputs, msa_ops
from flashmsa.errors import NotSupportedError
from flashmsa.testing import reference as ref

BF16 = torch.bfloat16
I32 = torch.int32


def i32(*values, device="cpu"):
    return torch.tensor(values, dtype=I32, device=device)


# ---- empty page tables --------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduce_heads", [False, True])
def test_proxy_empty_page_table(device, reduce_heads):
    q = torch.randn(10, 4, 128, dtype=BF16, device=device)
    k = torch.randn(3, 1, 128, 128, dtype=BF16, device=device)
    out = msa_ops.msa_proxy_score(q, k, i32(0, 10, device=device),
                                  page_table=torch.zeros(1, 0, dtype=I32, device=device),
                                  seqused_k=i32(0, device=device), reduce_heads=reduce_heads)
    assert out.shape == (1 if reduce_heads else 4, 1, 10)
    assert bool((out == float("-inf")).all())


@pytest.mark.parametrize("device", DEVICES)
def test_proxy_fp4_empty_page_table(device):
    q = torch.randint(0, 255, (10, 4, 64), dtype=torch.uint8, device=device)
    k = torch.randint(0, 255, (3, 1, 128, 64), dtype=torch.uint8, device=device)
    q_scale = torch.full((1024,), 0x38, dtype=torch.uint8, device=device)
    k_scale = torch.full((3 * 1024,), 0x38, dtype=torch.uint8, device=device)
    out = msa_ops.msa_proxy_score_fp4(q, k, q_scale, k_scale, 1.0, 1.0, i32(0, 10, device=device),
                                      page_table=torch.zeros(1, 0, dtype=I32, device=device),
                                      seqused_k=i32(300, device=device))
    assert out.shape == (4, 1, 10)
    assert bool((out == float("-inf")).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_cu_seqlens_k", [False, True])
def test_attention_empty_page_table(device, with_cu_seqlens_k):
    q = torch.randn(10, 4, 128, dtype=BF16, device=device)
    k = torch.randn(3, 1, 128, 128, dtype=BF16, device=device)
    q2k = torch.tensor([0, 1, -1, 2], dtype=I32, device=device).repeat(1, 10, 1)
    extra = dict(cu_seqlens_k=i32(0, 300, device=device)) if with_cu_seqlens_k else {}
    out, lse = msa_ops.msa_sparse_attention(
        q, k, k, q2k, i32(0, 10, device=device), causal=True,
        page_table=torch.zeros(1, 0, dtype=I32, device=device), seqused_k=i32(300, device=device),
        return_softmax_lse=True, **extra)
    assert bool((out == 0).all()) and bool((lse == float("-inf")).all())


@pytest.mark.parametrize("device", DEVICES)
def test_decode_empty_page_table(device):
    q = torch.randn(2, 8, 128, dtype=BF16, device=device)
    k = torch.randn(3, 1, 128, 128, dtype=BF16, device=device)
    q2k = torch.tensor([0, 1, -1, 2], dtype=I32, device=device).repeat(1, 2, 1)
    out, lse = msa_ops.msa_sparse_decode_attention(
        q, k, k, q2k, page_table=torch.zeros(2, 0, dtype=I32, device=device),
        seqused_k=i32(5, 300, device=device), return_softmax_lse=True)
    assert bool((out == 0).all()) and bool((lse == float("-inf")).all())


# ---- the largest lengths: no int32 products of blocks * 128 --------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_proxy_last_block_of_the_longest_sequence(device):
    """seqused_k = 2^31 - 1 over a 2^24-column page table: block 2^24 - 1 holds keys
    [2^31 - 128, 2^31 - 1), i.e. the first 127 tokens of its page. Most page ids are invalid
    (their blocks score -inf), so the reference stays cheap."""
    cols = 1 << 24
    q = torch.randn(1, 2, 128, dtype=BF16)
    k = torch.randn(2, 1, 128, 128, dtype=BF16)
    table = torch.full((1, cols), -1, dtype=I32)
    table[0, 0], table[0, 5], table[0, cols - 1] = 0, 1, 1
    out = msa_ops.msa_proxy_score(q.to(device), k.to(device), i32(0, 1, device=device),
                                  page_table=table.to(device),
                                  seqused_k=i32(2**31 - 1, device=device)).cpu()
    assert out.shape == (2, cols, 1)
    scores = torch.einsum("hd,ptd->hpt", q[0].double(), k[:, 0].double())  # (H, page, token)
    expected = {0: scores[:, 0].amax(-1), 5: scores[:, 1].amax(-1),
                cols - 1: scores[:, 1, :127].amax(-1)}
    for col, want in expected.items():
        torch.testing.assert_close(out[:, col, 0].double(), want, atol=1e-2, rtol=1e-2)
    finite = torch.isfinite(out[:, :, 0])
    assert int(finite.sum()) == 2 * len(expected)


@pytest.mark.parametrize("device", DEVICES)
def test_proxy_default_max_k_tiles_uses_clamped_paged_length(device):
    q = torch.randn(10, 4, 128, dtype=BF16, device=device)
    k = torch.randn(3, 1, 128, 128, dtype=BF16, device=device)
    table = i32(0, 1, 2, device=device).view(1, 3)
    out = msa_ops.msa_proxy_score(q, k, i32(0, 10, device=device), page_table=table,
                                  seqused_k=i32(2**31 - 1, device=device))
    assert out.shape == (4, 3, 10)
    same = msa_ops.msa_proxy_score(q, k, i32(0, 10, device=device), page_table=table,
                                   seqused_k=i32(384, device=device))
    # The right-aligned query offsets differ (2^31 - 11 vs 374): compare non-causal scores.
    a = msa_ops.msa_proxy_score(q, k, i32(0, 10, device=device), page_table=table,
                                seqused_k=i32(2**31 - 1, device=device), causal=False)
    b = msa_ops.msa_proxy_score(q, k, i32(0, 10, device=device), page_table=table,
                                seqused_k=i32(384, device=device), causal=False)
    assert same.shape == out.shape and torch.equal(a, b)


# ---- nothing large is allocated before validation -------------------------------------------------

@pytest.fixture
def allocations(monkeypatch):
    """numel of every output the ops allocate."""
    sizes = []
    real = _outputs.empty

    def recording(shape, dtype, device):
        sizes.append(int(torch.Size(shape).numel()))
        return real(shape, dtype, device)

    monkeypatch.setattr(_outputs, "empty", recording)
    return sizes


@pytest.mark.parametrize("kwargs,match", [
    (dict(cu_seqlens_k=i32(0, 2**31 - 1)), r"cu_seqlens_k\[-1\] must be <= k.shape\[0\]"),
    (dict(cu_seqlens_k=i32(0, 300), max_k_tiles=10**9), r"max_k_tiles must be <= 16777216"),
    (dict(cu_seqlens_k=i32(0, 300), max_k_tiles=2**40), r"max_k_tiles must be <= 16777216"),
    (dict(cu_seqlens_k=i32(0, 300), max_k_tiles=2**64), r"max_k_tiles \(\d+\) does not fit"),
])
def test_proxy_rejects_before_allocating(allocations, kwargs, match):
    q = torch.randn(10, 4, 128, dtype=BF16)
    k = torch.randn(300, 1, 128, dtype=BF16)
    with pytest.raises(ValueError, match=match):
        msa_ops.msa_proxy_score(q, k, i32(0, 10), **kwargs)
    # At most an output the inputs describe (3 columns of 300 keys): never 2^24 columns.
    assert max(allocations, default=0) <= 4 * 3 * 10, allocations


def test_topk_rejects_before_allocating(allocations):
    with pytest.raises(NotSupportedError, match=r"topk must be <= 64"):
        msa_ops.msa_topk_select(torch.randn(2, 10, 5), 10**12)
    assert max(allocations, default=0) == 0, allocations


# ---- zero elements ------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_zero_query_rows(device):
    q = torch.randn(0, 4, 128, dtype=BF16, device=device)
    k = torch.randn(300, 1, 128, dtype=BF16, device=device)
    cu_q, cu_k = i32(0, 0, device=device), i32(0, 300, device=device)
    score = msa_ops.msa_proxy_score(q, k, cu_q, cu_k)
    assert score.shape == (4, 3, 0)
    assert msa_ops.msa_topk_select(score, 16).shape == (0, 4, 16)
    q2k = torch.zeros(1, 0, 16, dtype=I32, device=device)
    out, lse = msa_ops.msa_sparse_attention(q, k, k, q2k, cu_q, cu_k, return_softmax_lse=True)
    assert out.shape == (0, 4, 128) and lse.shape == (0, 4)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_batch_zero(device):
    q = torch.randn(0, 8, 128, dtype=BF16, device=device)
    k = torch.randn(3, 1, 128, 128, dtype=BF16, device=device)
    out = msa_ops.msa_sparse_decode_attention(
        q, k, k, torch.zeros(1, 0, 16, dtype=I32, device=device),
        page_table=torch.zeros(0, 3, dtype=I32, device=device),
        seqused_k=torch.zeros(0, dtype=I32, device=device))
    assert out.shape == (0, 8, 128)


# ---- error classes --------------------------------------------------------------------------------

def test_not_supported_is_a_value_error_and_not_implemented():
    assert issubclass(NotSupportedError, ValueError)
    assert issubclass(NotSupportedError, NotImplementedError)
    score = torch.randn(2, 10, 5)
    for catch in (ValueError, NotImplementedError, NotSupportedError):
        with pytest.raises(catch, match=r"msa_topk_select: topk must be <= 64"):
            msa_ops.msa_topk_select(score, 65)
    q = torch.randn(20, 4, 128, dtype=BF16)
    k = torch.randn(300, 2, 128, dtype=BF16)
    q2k = torch.zeros(2, 20, 4, dtype=I32)
    with pytest.raises(ValueError, match=r"lse_temperature_scale must be > 0") as info:
        msa_ops.msa_sparse_attention(q, k, k, q2k, ref.cu_seqlens([20]), ref.cu_seqlens([300]),
                                     return_temperature_lse=True, lse_temperature_scale=0.0)
    assert isinstance(info.value, NotSupportedError)
