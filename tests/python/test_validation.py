"""Every validation error of docs/semantics.md#validation (with #d4, #d7, #d9): the right Python
exception class (FlashInfer's: ValueError for bad values, TypeError for a wrong Python type,
NotSupportedError, both a ValueError and a NotImplementedError, for what flashmsa does not
support), a message naming the argument, raised before anything is written or any output sized by
a bad argument is allocated."""

import dataclasses
import re
from typing import Callable, Type

import pytest
import torch

from conftest import requires_cuda
from flashmsa import msa_ops
from flashmsa.errors import NotSupportedError
from flashmsa.testing import pack_kv, paginate
from flashmsa.testing import reference as ref

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


# ---- valid baselines (one call per op), which the cases then break -----------------------------

def proxy_args():
    return dict(q=torch.randn(10, 4, 128, dtype=BF16), k=torch.randn(300, 1, 128, dtype=BF16),
                cu_seqlens_q=ref.cu_seqlens([10]), cu_seqlens_k=ref.cu_seqlens([300]))


def proxy_paged_args():
    k = torch.randn(300, 1, 128, dtype=BF16)
    cache, table, used = paginate(k, [300])
    return dict(q=torch.randn(10, 4, 128, dtype=BF16), k=cache, cu_seqlens_q=ref.cu_seqlens([10]),
                page_table=table, seqused_k=used)


def topk_args():
    return dict(max_score=torch.randn(2, 10, 5), topk=16)


def attn_args():
    q2k = torch.arange(3, dtype=torch.int32).repeat(2, 20, 1)
    return dict(q=torch.randn(20, 4, 128, dtype=BF16), k=torch.randn(300, 2, 128, dtype=BF16),
                v=torch.randn(300, 2, 128, dtype=BF16),
                q2k_indices=torch.cat([q2k, torch.full((2, 20, 13), -1, dtype=torch.int32)], -1),
                cu_seqlens_q=ref.cu_seqlens([20]), cu_seqlens_k=ref.cu_seqlens([300]))


def attn_paged_args():
    a = attn_args()
    cache, table, used = paginate(torch.cat([a["k"], a["v"]], 1), [300])
    a.update(k=cache[:, :2].contiguous(), v=cache[:, 2:].contiguous(), page_table=table,
             seqused_k=used)
    del a["cu_seqlens_k"]
    return a


def nvfp4(a):
    """Turn attention args into NVFP4 ones (k/v bytes plus scales)."""
    rows = a["k"].shape[0] * a["k"].shape[1]
    a.update(k=torch.randint(0, 255, (*a["k"].shape[:-1], 64), dtype=torch.uint8),
             v=torch.randint(0, 255, (*a["v"].shape[:-1], 64), dtype=torch.uint8),
             k_scale=torch.full((((rows + 127) // 128) * 1024,), 0x38, dtype=torch.uint8),
             v_scale=torch.full((((rows + 127) // 128) * 1024,), 0x38, dtype=torch.uint8))
    return a


def decode_args():
    k = torch.randn(700, 2, 128, dtype=BF16)
    cache, table, used = paginate(torch.cat([k, k], 1), [100, 200, 300, 100])
    q2k = torch.full((2, 4, 16), -1, dtype=torch.int32)
    q2k[..., 0] = 0
    return dict(q=torch.randn(4, 8, 128, dtype=BF16), k=cache[:, :2].contiguous(),
                v=cache[:, 2:].contiguous(), q2k_indices=q2k, page_table=table, seqused_k=used)


def decode_flat_args():
    a = decode_args()
    a.update(k=torch.randn(700, 2, 128, dtype=BF16), v=torch.randn(700, 2, 128, dtype=BF16),
             cu_seqlens_k=ref.cu_seqlens([100, 200, 300, 100]))
    del a["page_table"], a["seqused_k"]
    return a


OPS = {
    "proxy": (msa_ops.msa_proxy_score, proxy_args),
    "proxy_paged": (msa_ops.msa_proxy_score, proxy_paged_args),
    "topk": (msa_ops.msa_topk_select, topk_args),
    "attn": (msa_ops.msa_sparse_attention, attn_args),
    "attn_paged": (msa_ops.msa_sparse_attention, attn_paged_args),
    "attn_nvfp4": (msa_ops.msa_sparse_attention, lambda: nvfp4(attn_args())),
    "decode": (msa_ops.msa_sparse_decode_attention, decode_args),
    "decode_flat": (msa_ops.msa_sparse_decode_attention, decode_flat_args),
}


@dataclasses.dataclass
class Bad:
    name: str
    op: str
    mutate: Callable[[dict], None]
    match: str  # regex the message must contain
    exc: Type[Exception] = ValueError
    arg: str = ""  # the argument the message names as a word (default: match's first identifier)

    def __str__(self):
        return f"{self.op}-{self.name}"

    @property
    def argument(self) -> str:
        return self.arg or re.match(r"[A-Za-z_]\w*", self.match).group(0)


def setk(**kw):
    return lambda a: a.update(kw)


def cast(name, dtype):
    return lambda a: a.update({name: a[name].to(dtype)})


def drop(name):
    return lambda a: a.pop(name)


def meta(name):
    return lambda a: a.update({name: a[name].to("meta")})


def shared(**views):
    """Tensors that share memory: each value is (dtype, shape) of a view of one zeroed buffer
    (4 KB), taken from its start; views named cu_seqlens_* get the values the baselines use."""
    def mutate(a):
        buf = torch.zeros(1024, dtype=torch.int32)
        for name, (dtype, shape) in views.items():
            n = int(torch.Size(shape).numel())
            t = buf.view(dtype)[:n].view(shape)
            if name.startswith("cu_seqlens"):
                t.copy_(a[name])
            a[name] = t
    return mutate


def noncontig(name):
    return lambda a: a.update({name: a[name].transpose(0, 1).contiguous().transpose(0, 1)})


CASES = [
    # ---- msa_proxy_score (docs/semantics.md#proxy-score)
    Bad("q_float32", "proxy", cast("q", torch.float32), r"q must be bf16, fp16, or fp8"),
    Bad("q_2d", "proxy", lambda a: a.update(q=a["q"][:, 0]), r"q must be 3D"),
    Bad("head_dim_64", "proxy", lambda a: a.update(q=a["q"][..., :64].contiguous()),
        r"head_dim must be 128", arg="q"),
    Bad("heads_not_multiple", "proxy",
        lambda a: a.update(q=torch.randn(10, 3, 128, dtype=BF16),
                           k=torch.randn(300, 2, 128, dtype=BF16)),
        r"num_qo_heads must be a multiple of num_kv_heads", arg="q"),
    Bad("fp8_q_bf16_k", "proxy", cast("q", FP8), r"fp8 q requires fp8 k", arg="k"),
    Bad("k_dtype_mismatch", "proxy", cast("k", torch.float16), r"k dtype must match q"),
    Bad("q_noncontiguous", "proxy", noncontig("q"), r"q must be contiguous"),
    Bad("flat_without_cu_seqlens_k", "proxy", drop("cu_seqlens_k"),
        r"flat proxy requires cu_seqlens_k", arg="cu_seqlens_k"),
    Bad("flat_k_4d", "proxy", lambda a: a.update(k=a["k"][:256].reshape(2, 1, 128, 128)),
        r"flat k must be", arg="k"),
    Bad("cu_seqlens_q_int64", "proxy", cast("cu_seqlens_q", torch.int64),
        r"cu_seqlens_q must be 1-D int32"),
    Bad("cu_seqlens_q_beyond_q", "proxy", setk(cu_seqlens_q=ref.cu_seqlens([11])),
        r"cu_seqlens_q\[-1\] must be <= q.shape\[0\]"),
    Bad("cu_seqlens_k_decreasing", "proxy",
        setk(cu_seqlens_q=ref.cu_seqlens([5, 5]),
             cu_seqlens_k=torch.tensor([0, 200, 300], dtype=torch.int32).flip(0)),
        r"cu_seqlens_k"),
    Bad("cu_seqlens_batch_mismatch", "proxy", setk(cu_seqlens_k=ref.cu_seqlens([100, 200])),
        r"cu_seqlens_k must have batch_size \+ 1"),
    Bad("output_shape", "proxy", setk(output=torch.empty(4, 3, 11)),
        r"output must be \(4, 3, 10\)"),
    Bad("output_dtype", "proxy", setk(output=torch.empty(4, 3, 10, dtype=torch.float16)),
        r"output must be float32"),
    Bad("max_k_tiles_zero", "proxy", setk(max_k_tiles=0), r"max_k_tiles must be >= 1"),
    Bad("max_k_tiles_type", "proxy", setk(max_k_tiles=2.5), r"max_k_tiles must be an int",
        TypeError),
    Bad("max_seqlen_q_negative", "proxy", setk(max_seqlen_q=-1), r"max_seqlen_q must be >= 0"),
    Bad("q_offset_int64", "proxy", setk(q_offset=torch.tensor([3])), r"q_offset must be int32"),
    Bad("q_offset_length", "proxy", setk(q_offset=torch.tensor([3, 4], dtype=torch.int32)),
        r"q_offset"),
    Bad("q_offset_float", "proxy", setk(q_offset=1.5), r"q_offset must be None, an int", TypeError),
    Bad("q_not_tensor", "proxy", setk(q=[1, 2]), r"q must be a torch.Tensor", TypeError),
    Bad("paged_without_seqused_k", "proxy_paged", drop("seqused_k"),
        r"paged proxy requires seqused_k", arg="seqused_k"),
    Bad("paged_k_shape", "proxy_paged", lambda a: a.update(k=a["k"][:, :, :64].contiguous()),
        r"paged k must be \(num_pages, num_kv_heads, 128, 128\)", arg="k"),
    Bad("page_table_int64", "proxy_paged", cast("page_table", torch.int64),
        r"page_table must be int32"),
    Bad("page_table_rows", "proxy_paged",
        lambda a: a.update(page_table=a["page_table"].repeat(2, 1)),
        r"page_table must have batch_size"),
    Bad("seqused_k_negative", "proxy_paged", setk(seqused_k=torch.tensor([-1], dtype=torch.int32)),
        r"seqused_k\[0\] must be >= 0"),
    # ---- msa_topk_select (docs/semantics.md#topk-select, #d4)
    Bad("score_fp16", "topk", cast("max_score", torch.float16), r"max_score must be float32"),
    Bad("score_noncontiguous", "topk",
        lambda a: a.update(max_score=torch.randn(2, 5, 10).transpose(1, 2)),
        r"max_score must be contiguous"),
    Bad("score_2d", "topk", lambda a: a.update(max_score=a["max_score"][0]),
        r"max_score must be 3D"),
    Bad("topk_zero", "topk", setk(topk=0), r"topk must be >= 1"),
    Bad("topk_above_64", "topk", setk(topk=65), r"topk must be <= 64", NotSupportedError),
    Bad("topk_not_int", "topk", setk(topk="16"), r"topk must be an int", TypeError),
    Bad("force_negative", "topk", setk(force_begin_blocks=-1), r"force_begin_blocks"),
    Bad("force_over_topk", "topk", setk(topk=4, force_begin_blocks=3, force_end_blocks=2),
        r"force_begin_blocks \+ force_end_blocks \(3 \+ 2\) must be <= topk \(4\)"),
    Bad("nvp_zero", "topk", setk(num_valid_pages=0),
        r"num_valid_pages must be in \(0, max_k_tiles=10\]"),
    Bad("nvp_above_blocks", "topk", setk(num_valid_pages=11), r"num_valid_pages must be in"),
    Bad("force_over_nvp", "topk", setk(num_valid_pages=3, force_begin_blocks=2, force_end_blocks=2),
        r"must be <= num_valid_pages \(3\)", arg="num_valid_pages"),
    Bad("nvp_tensor_int64", "topk", setk(num_valid_pages=torch.ones(5, dtype=torch.int64)),
        r"num_valid_pages tensor must be 1D int32"),
    Bad("nvp_tensor_length", "topk", setk(num_valid_pages=torch.ones(4, dtype=torch.int32)),
        r"num_valid_pages tensor must have total_qo_len \(5\) entries"),
    Bad("nvp_tensor_noncontiguous", "topk",
        setk(num_valid_pages=torch.ones(10, dtype=torch.int32)[::2]),
        r"num_valid_pages tensor must be contiguous"),
    Bad("nvp_float", "topk", setk(num_valid_pages=2.0), r"num_valid_pages must be None", TypeError),
    Bad("output_shape", "topk", setk(output=torch.empty(5, 2, 8, dtype=torch.int32)),
        r"output shape must be \(5, 2, 16\)"),
    Bad("output_dtype", "topk", setk(output=torch.empty(5, 2, 16, dtype=torch.int64)),
        r"output must be int32"),
    # ---- msa_sparse_attention (docs/semantics.md#sparse-attention, #nvfp4, #packed-kv)
    Bad("q_float32", "attn", cast("q", torch.float32), r"q must be bf16/fp16"),
    Bad("q_fp8", "attn", cast("q", FP8), r"q must be bf16/fp16"),
    Bad("q_2d", "attn", lambda a: a.update(q=a["q"][:, 0]), r"q must be 3D"),
    Bad("q_5d", "attn", lambda a: a.update(q=a["q"].reshape(20, 4, 2, 8, 8)),
        r"q must have at most 4 dims"),
    Bad("head_dim_64", "attn", lambda a: a.update(q=a["q"][..., :64].contiguous()),
        r"head_dim must be 128", arg="q"),
    Bad("heads_not_multiple", "attn", lambda a: a.update(q=torch.randn(20, 3, 128, dtype=BF16)),
        r"num_qo_heads must be a multiple of num_kv_heads", arg="q"),
    Bad("q_noncontiguous", "attn", noncontig("q"), r"q must be contiguous"),
    Bad("q2k_int64", "attn", cast("q2k_indices", torch.int64), r"q2k_indices must be int32"),
    Bad("q2k_strided_rows", "attn",
        lambda a: a.update(q2k_indices=torch.cat([a["q2k_indices"]] * 2, -1)[..., ::2]),
        r"q2k_indices must have unit stride in its last dim"),
    Bad("q2k_kv_heads", "attn", lambda a: a.update(q2k_indices=a["q2k_indices"][:1]),
        r"q2k_indices must be int32 of shape \(Hkv, total_q, topk\) = \(2, 20, topk\)"),
    Bad("q2k_topk_65", "attn",
        lambda a: a.update(q2k_indices=torch.full((2, 20, 65), -1, dtype=torch.int32)),
        r"q2k_indices topk", NotSupportedError),
    Bad("fp8_k_bf16_v", "attn", cast("k", FP8), r"k and v must both be float8_e4m3fn"),
    Bad("uint8_k_bf16_v", "attn",
        lambda a: a.update(k=torch.zeros(300, 2, 64, dtype=torch.uint8)),
        r"k and v must both be packed uint8 for NVFP4"),
    Bad("k_fp16", "attn", lambda a: a.update(k=a["k"].half(), v=a["v"].half()),
        r"k/v dtype must match q"),
    Bad("flat_without_cu_seqlens_k", "attn", drop("cu_seqlens_k"),
        r"cu_seqlens_k is required for the non-paged path"),
    Bad("flat_k_4d", "attn", lambda a: a.update(k=a["k"][:256].reshape(4, 2, 64, 128),
                                                v=a["v"][:256].reshape(4, 2, 64, 128)),
        r"flat k/v must be", arg="k"),
    Bad("v_shape", "attn", lambda a: a.update(v=a["v"][:299]), r"v must have the same shape"),
    Bad("k_strided", "attn", lambda a: a.update(k=torch.randn(300, 2, 256, dtype=BF16)[..., :128]),
        r"k/v must be contiguous"),
    Bad("k_scale_for_bf16", "attn", setk(k_scale=torch.zeros(1024, dtype=torch.uint8),
                                         v_scale=torch.zeros(1024, dtype=torch.uint8)),
        r"k_scale/v_scale are NVFP4"),
    Bad("softmax_scale_nan", "attn", setk(softmax_scale=float("nan")), r"softmax_scale"),
    Bad("softmax_scale_str", "attn", setk(softmax_scale="0.1"), r"softmax_scale must be",
        TypeError),
    Bad("temperature_not_positive", "attn",
        setk(return_temperature_lse=True, lse_temperature_scale=-1.0),
        r"lse_temperature_scale must be > 0", NotSupportedError),
    Bad("workspace_type", "attn", setk(workspace=object()), r"MSASparseAttentionWorkspace",
        TypeError, arg="workspace"),
    Bad("q_offset_float", "attn", setk(q_offset=2.0), r"q_offset must be None", TypeError),
    Bad("cu_seqlens_batch_mismatch", "attn", setk(cu_seqlens_k=ref.cu_seqlens([100, 200])),
        r"cu_seqlens_k must have batch_size \+ 1"),
    Bad("paged_without_seqused_k", "attn_paged", drop("seqused_k"), r"paged KV requires seqused_k", arg="seqused_k"),
    Bad("paged_k_shape", "attn_paged",
        lambda a: a.update(k=a["k"][:, :, :64].contiguous(), v=a["v"][:, :, :64].contiguous()),
        r"paged k/v must be \(num_pages, num_kv_heads, 128, 128\)", arg="k"),
    Bad("page_table_1d", "attn_paged", lambda a: a.update(page_table=a["page_table"][0]),
        r"page_table must be int32 of shape \(batch, max_pages\)"),
    Bad("seqused_k_int64", "attn_paged", cast("seqused_k", torch.int64),
        r"seqused_k must be 1-D int32"),
    Bad("packed_views_misaligned", "attn_paged",
        lambda a: a.update(**dict(zip(("k", "v"), _misaligned_views(a)))),
        r"k/v must be contiguous, paged K and V views"),
    Bad("nvfp4_missing_scales", "attn_nvfp4", drop("v_scale"),
        r"NVFP4 KV requires k_scale and v_scale", arg="v_scale"),
    Bad("nvfp4_scale_dtype", "attn_nvfp4", cast("k_scale", torch.int32),
        r"k_scale/v_scale must be uint8"),
    Bad("nvfp4_scale_too_small", "attn_nvfp4", lambda a: a.update(k_scale=a["k_scale"][:100]),
        r"k_scale must hold the 128-row-padded swizzled scale layout"),
    # ---- msa_sparse_decode_attention (docs/semantics.md#decode)
    Bad("seqlen_q_zero", "decode", setk(seqlen_q=0), r"seqlen_q must be positive"),
    Bad("rows_not_multiple", "decode", setk(seqlen_q=3), r"seqlen_q"),
    Bad("seqlen_q_float", "decode", setk(seqlen_q=1.0), r"seqlen_q must be an int", TypeError),
    Bad("q_float32", "decode", cast("q", torch.float32), r"q must be bf16/fp16/fp8_e4m3"),
    Bad("q2k_rows", "decode", lambda a: a.update(q2k_indices=a["q2k_indices"][:, :3].contiguous()),
        r"q2k_indices must be int32 of shape \(Hkv, total_q, topk\) = \(2, 4, topk\)"),
    Bad("q2k_noncontiguous", "decode",
        lambda a: a.update(q2k_indices=a["q2k_indices"].transpose(1, 2).contiguous().transpose(1, 2)),
        r"q2k_indices must have unit stride in its last dim"),
    Bad("paged_without_seqused_k", "decode", drop("seqused_k"), r"paged decode requires seqused_k"),
    Bad("seqused_k_count", "decode", lambda a: a.update(seqused_k=a["seqused_k"][:3]),
        r"seqused_k must have batch_size"),
    Bad("page_table_rows", "decode", lambda a: a.update(page_table=a["page_table"][:2]),
        r"page_table must have batch_size = 4 rows"),
    Bad("partial_dtype_int", "decode", setk(partial_dtype=torch.int32), r"partial_dtype"),
    Bad("partial_dtype_str", "decode", setk(partial_dtype="bf16"), r"partial_dtype must be",
        TypeError),
    Bad("force_fused_int", "decode", setk(force_fused=1), r"force_fused must be", TypeError),
    Bad("workspace_type", "decode", setk(workspace="scratch"), r"MSASparseAttentionWorkspace",
        TypeError, arg="workspace"),
    Bad("flat_without_cu_seqlens_k", "decode_flat", drop("cu_seqlens_k"),
        r"flat decode requires cu_seqlens_k", arg="cu_seqlens_k"),
    Bad("cu_seqlens_k_count", "decode_flat", setk(cu_seqlens_k=ref.cu_seqlens([700])),
        r"cu_seqlens_k must have batch_size \+ 1 = 5 entries"),
    Bad("cu_seqlens_k_beyond_k", "decode_flat",
        setk(cu_seqlens_k=ref.cu_seqlens([100, 200, 300, 101])),
        r"cu_seqlens_k\[-1\] must be <= k.shape\[0\]"),
    # ---- hostile input: devices the core never sees, ints beyond int64, bools, sizes, aliasing
    Bad("q_meta", "proxy", meta("q"), r"q must be a CPU or CUDA tensor, got device meta"),
    Bad("k_meta", "proxy", meta("k"), r"k must be a CPU or CUDA tensor, got device meta"),
    Bad("page_table_meta", "proxy_paged", meta("page_table"), r"page_table must be a CPU or CUDA"),
    Bad("output_meta", "topk", setk(output=torch.empty(5, 2, 16, dtype=torch.int32, device="meta")),
        r"output must be a CPU or CUDA tensor"),
    Bad("nvp_meta", "topk", setk(num_valid_pages=torch.ones(5, dtype=torch.int32, device="meta")),
        r"num_valid_pages must be a CPU or CUDA tensor"),
    Bad("cu_seqlens_k_meta", "attn", meta("cu_seqlens_k"), r"cu_seqlens_k must be a CPU or CUDA"),
    Bad("v_meta", "attn_paged", meta("v"), r"v must be a CPU or CUDA tensor"),
    Bad("q2k_meta", "decode", meta("q2k_indices"), r"q2k_indices must be a CPU or CUDA tensor"),
    Bad("seqused_k_meta", "decode", meta("seqused_k"), r"seqused_k must be a CPU or CUDA tensor"),
    Bad("q_offset_beyond_int64", "proxy", setk(q_offset=2**70),
        r"q_offset \(1180591620717411303424\) does not fit in int64"),
    Bad("max_k_tiles_beyond_int64", "proxy", setk(max_k_tiles=2**63),
        r"max_k_tiles \(9223372036854775808\) does not fit in int64"),
    Bad("max_seqlen_q_beyond_int64", "proxy", setk(max_seqlen_q=-2**63 - 1),
        r"max_seqlen_q \(-9223372036854775809\) does not fit in int64"),
    Bad("topk_beyond_int64", "topk", setk(topk=2**64), r"topk \(18446744073709551616\) does not fit"),
    Bad("nvp_beyond_int64", "topk", setk(num_valid_pages=2**64), r"num_valid_pages \(\d+\) does"),
    Bad("force_end_beyond_int64", "topk", setk(force_end_blocks=-2**80), r"force_end_blocks \("),
    Bad("q_offset_beyond_int64", "attn", setk(q_offset=-2**63 - 1), r"q_offset \(-\d+\) does not"),
    Bad("seqlen_q_beyond_int64", "decode", setk(seqlen_q=2**63), r"seqlen_q \(\d+\) does not fit"),
    Bad("q_offset_beyond_int32", "decode", setk(q_offset=2**40), r"q_offset \(\d+\) does not fit in int32"),
    Bad("q_offset_bool", "proxy", setk(q_offset=True), r"q_offset must be None, an int", TypeError),
    Bad("q_offset_bool", "attn", setk(q_offset=False), r"q_offset must be None, an int", TypeError),
    Bad("q_offset_bool", "decode", setk(q_offset=True), r"q_offset must be None, an int", TypeError),
    Bad("max_k_tiles_huge", "proxy", setk(max_k_tiles=10**9),
        r"max_k_tiles must be <= 16777216 \(2\^31 keys / 128\), got 1000000000"),
    Bad("topk_huge", "topk", setk(topk=10**12), r"topk must be <= 64", NotSupportedError),
    Bad("output_over_q", "proxy",
        lambda a: a.update(output=a["q"].view(torch.float32).view(-1)[:120].view(4, 3, 10)),
        r"output must not share memory with q\b"),
    Bad("output_over_cu_seqlens_q", "proxy",
        shared(cu_seqlens_q=(torch.int32, (2,)), output=(torch.float32, (4, 3, 10))),
        r"output must not share memory with cu_seqlens_q"),
    Bad("output_over_seqused_k", "proxy_paged",
        shared(seqused_k=(torch.int32, (1,)), output=(torch.float32, (4, 3, 10))),
        r"output must not share memory with seqused_k"),
    Bad("output_over_score", "topk",
        lambda a: a.update(topk=4, output=a["max_score"].view(torch.int32).view(-1)[:40]
                           .view(5, 2, 4)),
        r"output must not share memory with max_score"),
    Bad("output_over_nvp", "topk",
        shared(num_valid_pages=(torch.int32, (5,)), output=(torch.int32, (5, 2, 16))),
        r"output must not share memory with num_valid_pages"),
]


def _misaligned_views(a):
    """K/V views of a packed cache whose V does not start right after K's 128 values."""
    cache = torch.cat([a["k"], torch.zeros_like(a["k"][..., :8]), a["v"]], -1)
    return cache[..., :128], cache[..., 136:]


def _names_word(message: str, word: str) -> bool:
    """Whether ``word`` occurs in message with no identifier character on either side."""
    return re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", message) is not None


def test_cases_have_unique_ids():
    ids = [str(c) for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_raises_naming_the_argument(case):
    fn, baseline = OPS[case.op]
    args = baseline()
    fn(**args)  # the baseline itself is valid
    case.mutate(args)
    with pytest.raises(case.exc, match=case.match) as info:
        fn(**args)
    err = info.value
    # FlashInfer's classes: every argument error is a ValueError or (wrong Python type) a
    # TypeError; "not supported by flashmsa" is NotSupportedError, a ValueError and a
    # NotImplementedError, so code written for FlashInfer catches it.
    assert type(err) in (ValueError, TypeError, NotSupportedError), type(err)
    if isinstance(err, NotImplementedError):
        assert isinstance(err, NotSupportedError) and isinstance(err, ValueError)
    assert _names_word(str(err), case.argument), (case.argument, str(err))
    # Errors from the core start with the op's Python name.
    if case.exc is not TypeError:
        assert re.match(r"msa_\w+: ", str(err)), str(err)


def test_packed_views_accepted():
    """The positive counterpart of the packed-view errors: both HND and NHD packed caches work."""
    a = attn_paged_args()
    for nhd in (False, True):
        _, k, v = pack_kv(a["k"], a["v"], nhd=nhd)
        msa_ops.msa_sparse_attention(**dict(a, k=k, v=v))


@pytest.mark.parametrize("op", ["proxy", "topk"])
def test_nothing_written_on_error(op):
    """D9: a failing call leaves a caller-provided output untouched."""
    fn, baseline = OPS[op]
    args = baseline()
    good = fn(**args)
    output = torch.full_like(good, 5)
    bad = dict(args, output=output)
    if op == "proxy":
        bad["q_offset"] = torch.tensor([1], dtype=torch.int64)
    else:
        bad["num_valid_pages"] = 0
    with pytest.raises(ValueError):
        fn(**bad)
    assert bool((output == 5).all())


def test_workspace_grows_and_rejects_bad_sizes():
    ws = msa_ops.MSASparseAttentionWorkspace("cpu", nbytes=16)
    assert ws.nbytes == 16 and ws.reserve(8) is ws.buffer
    assert ws.reserve(100).numel() >= 100
    with pytest.raises(ValueError, match="nbytes"):
        msa_ops.MSASparseAttentionWorkspace("cpu", nbytes=-1)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("op,name", [("proxy", "k"), ("topk", "output"), ("attn", "v"),
                                     ("attn", "cu_seqlens_k"), ("decode", "page_table")])
def test_tensors_on_different_devices(op, name):
    fn, baseline = OPS[op]
    args = {n: (t.cuda() if isinstance(t, torch.Tensor) else t) for n, t in baseline().items()}
    if name == "output":
        args["output"] = torch.empty(5, 2, 16, dtype=torch.int32)
    else:
        args[name] = args[name].cpu()
    with pytest.raises(ValueError, match=rf"{name} must be on the same device as"):
        fn(**args)
