"""The test cases of the MSA ops: one list per op, drawn from by the CPU tests and the GPU tests.

A case is data (shapes, dtypes, layout, selection kind, options) and names the checks that run it
(``checks``):

* ``"reference"``: the op against the float64 torch reference (:mod:`flashmsa.testing.reference`)
  on each device of :func:`devices` (the CPU always, CUDA where there is one): the tests in
  tests/python/test_*.py but test_gpu_*. Shapes stay small enough for the reference's loops.
* ``"gpu"``: the op on CUDA against the same op on the same data as CPU tensors (the exact C++
  reference), with the same-precision baseline tolerances: tests/python/test_gpu_*.py. Also M3
  shapes, large groups and edge cases the float64 reference would take too long on.

:func:`cases` gives a list's cases for one check. Each test builds its inputs from a case with its
own builder and seeds (the selection kinds a builder knows are listed in its test file).
"""

import dataclasses
from typing import List, Optional, Sequence, Tuple, Union

import torch

BF16, FP16, FP8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn

REFERENCE = ("reference",)
GPU = ("gpu",)
BOTH = ("reference", "gpu")


def cases(table: Sequence, check: str) -> list:
    """The cases of ``table`` that ``check`` ("reference" or "gpu") runs, in table order."""
    if check not in BOTH:
        raise ValueError(f"check must be one of {BOTH}, got {check!r}")
    return [c for c in table if check in c.checks]


def devices():
    """pytest parameters of the devices the "reference" checks run on: ``cpu`` always, ``cuda``
    marked ``cuda`` and skipped (not passed) where there is no GPU or no CUDA build."""
    import pytest

    from .._library import built_with_cuda
    has_cuda = torch.cuda.is_available() and built_with_cuda()
    skip = pytest.mark.skipif(not has_cuda,
                              reason="needs a CUDA device and a flashmsa build with CUDA kernels")
    return ["cpu", pytest.param("cuda", marks=[skip, pytest.mark.cuda])]


def _on(checks: Tuple[str, ...], group: list) -> list:
    return [dataclasses.replace(c, checks=checks) for c in group]


# ---- msa_sparse_attention ----------------------------------------------------------------------

@dataclasses.dataclass
class AttentionCase:
    name: str
    seqs_q: List[int]
    seqs_k: List[int]
    hq: int
    hkv: int
    topk: int = 16
    causal: bool = False
    dtype: torch.dtype = BF16
    kv: str = "same"            # same | fp8 | nvfp4
    layout: str = "flat"        # flat | paged | packed | packed_nhd
    selection: str = "random"   # random (sorted) or one of the builders' other kinds
    q_offset: Union[None, int, List[int]] = None
    softmax_scale: Optional[float] = None
    v_global_scale: Optional[float] = None
    temperature: Optional[float] = None  # return_temperature_lse with this scale
    invalid_pages: bool = False  # point some selected blocks' page-table entries out of the cache
    extra_rows: int = 0          # query rows past cu_seqlens_q[-1] (covered by no sequence)
    checks: Tuple[str, ...] = BOTH

    def __str__(self):
        return self.name


ATTENTION = [
    # docs/semantics.md#accuracy: FlashInfer's test_sparse_attention and friends.
    AttentionCase("spec_1_1_1_topk4", [70], [1000], 1, 1, topk=4),
    AttentionCase("spec_4_2_two_seqs", [100, 37], [2048, 700], 4, 2),
    AttentionCase("spec_2_2_causal", [130, 64], [1024, 512], 2, 2, causal=True),
    AttentionCase("spec_fp8_causal", [150, 90], [2048, 1280], 8, 2, causal=True, kv="fp8"),
    AttentionCase("temperature_causal", [80, 50], [1024, 640], 4, 2, causal=True,
                  temperature=0.7),
    *_on(REFERENCE, [
        AttentionCase("topk8_group4", [64], [4096], 8, 2, topk=8),
        AttentionCase("group16_m3", [60], [3000], 16, 1),
        AttentionCase("mha8_causal", [97, 51], [1111, 2222], 8, 8, causal=True),
        AttentionCase("group3_non_power_of_two", [40, 20], [900, 300], 6, 2, causal=True),
        AttentionCase("topk64", [30], [9000], 4, 1, topk=64, causal=True),
        AttentionCase("topk1", [50], [700], 4, 2, topk=1),
        AttentionCase("fp16", [64, 20], [1024, 640], 4, 2, causal=True, dtype=FP16),
        AttentionCase("unsorted_lists", [50, 30], [2000, 900], 4, 2, selection="unsorted"),
        AttentionCase("duplicated_ids", [50], [2000], 4, 2, causal=True, selection="duplicates"),
        AttentionCase("ids_beyond_sequence", [40, 40], [700, 1500], 4, 2,
                      selection="out_of_range"),
        AttentionCase("ids_beyond_pages", [40, 40], [700, 1500], 4, 2, layout="paged",
                      selection="out_of_range"),
        AttentionCase("hole_ends_list", [40], [2000], 4, 2, selection="holes"),
        AttentionCase("empty_rows", [60], [1500], 4, 1, causal=True, selection="some_empty"),
        AttentionCase("future_blocks_only", [1024], [1024], 2, 1, causal=True,
                      selection="last_two"),
        AttentionCase("empty_kv_sequence_g2", [10, 20], [0, 300], 2, 1, causal=True),
        AttentionCase("empty_q_sequence_g2", [0, 30], [500, 300], 2, 1, causal=True),
        AttentionCase("q_offset_int_32", [32, 32], [1000, 800], 4, 1, causal=True, q_offset=100),
        AttentionCase("q_offset_tensor_negative_32", [32, 32], [1000, 800], 4, 1, causal=True,
                      q_offset=[-50, 700]),
        AttentionCase("scales_v05", [40], [1200], 4, 2, softmax_scale=0.05, v_global_scale=0.5),
        AttentionCase("temperature_lse", [80], [1024], 4, 2, temperature=1.3),
        AttentionCase("paged_causal", [150, 90], [2048, 1280], 8, 2, causal=True, layout="paged"),
        AttentionCase("packed_hnd_g2", [60, 30], [1500, 700], 4, 2, causal=True, layout="packed"),
        AttentionCase("packed_nhd", [60, 30], [1500, 700], 4, 2, layout="packed_nhd"),
        AttentionCase("fp8_kv_fp16_q_packed", [60], [1300], 4, 2, dtype=FP16, kv="fp8",
                      layout="packed"),
        AttentionCase("nvfp4_kv", [70, 30], [1500, 640], 4, 2, causal=True, kv="nvfp4"),
        AttentionCase("nvfp4_kv_paged", [70, 30], [1500, 640], 4, 2, kv="nvfp4", layout="paged"),
    ]),
    *_on(GPU, [
        AttentionCase("spec_8_2_topk8", [200], [4096], 8, 2, topk=8),
        AttentionCase("spec_16_1", [333], [3000], 16, 1),
        AttentionCase("spec_8_8_causal", [97, 211], [1111, 2222], 8, 8, causal=True),
        AttentionCase("spec_fp16_topk32", [100, 64], [2048, 1024], 4, 2, topk=32, dtype=FP16),
        AttentionCase("spec_bf16_topk32", [100, 64], [2048, 1024], 4, 2, topk=32),
        AttentionCase("spec_lse", [80, 50], [1024, 640], 4, 2),
        AttentionCase("spec_paged", [150, 90], [2048, 1280], 8, 2, layout="paged"),
        AttentionCase("spec_fp8_fp16q", [150, 90], [2048, 1280], 8, 2, dtype=FP16, kv="fp8"),
        AttentionCase("spec_nvfp4_causal", [150, 90], [2048, 1280], 8, 2, causal=True,
                      kv="nvfp4"),
        AttentionCase("spec_nvfp4", [150, 90], [2048, 1280], 8, 2, kv="nvfp4"),
        AttentionCase("spec_fully_masked", [1024], [1024], 2, 1, causal=True,
                      selection="last_two"),
        # MiniMax-M3 (64 q / 4 kv heads, top-16, causal, local block + earlier ones).
        AttentionCase("m3_1x1024", [1024], [1024], 64, 4, causal=True, selection="causal_local"),
        AttentionCase("m3_2x512", [512, 512], [512, 512], 64, 4, causal=True,
                      selection="causal_local"),
        AttentionCase("m3_3x384_paged", [384] * 3, [384] * 3, 64, 4, causal=True,
                      selection="causal_local", layout="paged"),
        # GQA groups (any G, not only powers of two) and topk 1..64.
        AttentionCase("g1", [300], [2500], 4, 4, causal=True),
        AttentionCase("g3", [120, 45], [1900, 800], 6, 2, causal=True),
        AttentionCase("g4_topk1", [150], [1500], 8, 2, topk=1),
        AttentionCase("g16_topk33", [90], [6000], 16, 1, topk=33, causal=True, selection="full"),
        AttentionCase("g64", [70, 20], [2000, 900], 64, 1, causal=True),
        AttentionCase("g64_topk64", [40], [9000], 64, 1, topk=64, selection="full"),
        AttentionCase("g24_two_row_tiles", [50], [1500], 48, 2, causal=True),
        AttentionCase("g5_topk64_causal", [60], [8300], 10, 2, topk=64, causal=True,
                      selection="full"),
        # Lengths, offsets, rows of no sequence.
        AttentionCase("uneven_lengths", [1, 129, 0, 77, 256], [1, 300, 128, 5000, 129], 4, 2,
                      causal=True),
        AttentionCase("empty_kv_sequence", [10, 20], [0, 300], 4, 1, causal=True),
        AttentionCase("empty_q_sequence", [0, 30, 0], [500, 300, 0], 4, 1, causal=True),
        AttentionCase("seqlen_q_gt_seqlen_k", [400], [200], 4, 2, causal=True),
        AttentionCase("uncovered_rows", [30, 20], [700, 400], 4, 2, causal=True, extra_rows=13),
        AttentionCase("q_offset_int", [64, 64], [1000, 800], 4, 1, causal=True, q_offset=100),
        AttentionCase("q_offset_tensor_negative", [64, 64], [1000, 800], 4, 1, causal=True,
                      q_offset=[-50, 700]),
        AttentionCase("q_offset_beyond_keys", [40], [600], 4, 2, causal=True, q_offset=5000),
        # Index lists (D5).
        AttentionCase("unsorted", [80, 40], [2000, 900], 8, 2, causal=True, selection="unsorted"),
        AttentionCase("duplicates", [80], [2000], 8, 2, causal=True, selection="duplicates"),
        AttentionCase("out_of_range", [60, 60], [700, 1500], 4, 2, selection="out_of_range"),
        AttentionCase("out_of_range_paged", [60, 60], [700, 1500], 4, 2, layout="paged",
                      selection="out_of_range"),
        AttentionCase("holes", [60], [2000], 4, 2, selection="holes"),
        AttentionCase("some_empty_rows", [100], [1500], 4, 1, causal=True,
                      selection="some_empty"),
        # Layouts, scales, LSEs.
        AttentionCase("paged_invalid_pages", [120, 70], [1500, 1000], 8, 2, causal=True,
                      layout="paged", invalid_pages=True),
        AttentionCase("packed_hnd", [90, 30], [1500, 700], 8, 2, causal=True, layout="packed"),
        AttentionCase("packed_nhd_fp8", [90, 30], [1500, 700], 8, 2, kv="fp8",
                      layout="packed_nhd"),
        AttentionCase("nvfp4_paged_partial_page", [70, 30], [1500, 650], 8, 2, kv="nvfp4",
                      layout="paged", causal=True),
        AttentionCase("scales", [60], [1200], 4, 2, softmax_scale=0.05, v_global_scale=0.37),
        AttentionCase("fp16_scales_fp8", [60], [1200], 4, 2, dtype=FP16, kv="fp8",
                      softmax_scale=0.2, v_global_scale=2.5),
        AttentionCase("temperature_g16", [60], [3000], 16, 1, temperature=1.3),
        # Neighbouring tokens sharing their selections (the shared-selection tiles of the hybrid
        # schedule; G in {16, 32, 64} gives tiles of 8, 4, 2 tokens), with partial last tiles,
        # tiles across sequences, mixed qualifying / non-qualifying tiles, paged K/V, fp16,
        # negative scale.
        AttentionCase("m3_tile_shared", [1024, 300], [1024, 300], 64, 4, causal=True,
                      selection="tile_shared"),
        AttentionCase("m3_tile_mixed_temp", [700, 13], [1500, 13], 64, 4, causal=True,
                      selection="tile_mixed", temperature=0.8),
        AttentionCase("g32_tile_shared_paged", [256, 100], [600, 900], 64, 2, causal=True,
                      selection="tile_shared", layout="paged", softmax_scale=-0.07,
                      v_global_scale=0.6),
        AttentionCase("g16_tile_shared_fp16", [400], [2000], 16, 1, causal=True, dtype=FP16,
                      selection="tile_shared"),
        AttentionCase("g64_tile_mixed_nocausal", [90], [3000], 128, 2, selection="tile_mixed"),
        # fp8 K / V in the tile kernel (the producer dequantizes each block in place).
        AttentionCase("m3_tile_shared_fp8", [1024, 300], [1024, 300], 64, 4, causal=True,
                      selection="tile_shared", kv="fp8"),
        AttentionCase("g32_tile_mixed_fp8_paged_fp16", [256, 100], [600, 900], 64, 2,
                      causal=True, selection="tile_mixed", layout="paged", kv="fp8", dtype=FP16,
                      v_global_scale=0.6),
        # Tiles whose blocks span more than the planner's 8192-block bitmap (1M tokens): sink
        # block 0 and the local block ~8300 apart (tiles that would qualify otherwise). They must
        # go the KV-major way, with correct results.
        AttentionCase("g16_tile_span_over_1m", [16], [8300 * 128 + 5], 16, 1, causal=True,
                      selection="sink_local"),
    ]),
]


# ---- msa_proxy_score ---------------------------------------------------------------------------

@dataclasses.dataclass
class ProxyCase:
    name: str
    seqs_q: List[int]
    seqs_k: List[int]
    hq: int = 4
    hkv: int = 1
    causal: bool = True
    q_dtype: torch.dtype = BF16
    k_dtype: Optional[torch.dtype] = None     # None: q_dtype
    paged: bool = False
    invalid_pages: bool = False               # some page ids outside the cache (-> -inf blocks)
    reduce_heads: bool = False
    q_offset: Union[None, int, List[int]] = None  # list -> int32 tensor
    max_k_tiles: Optional[int] = None         # None: max_b ceil(seqlen_k / 128), at least 1
    max_seqlen_q: Optional[int] = None        # None: the true maximum; else a (too small) hint
    extra_rows: int = 0                       # q rows after cu_seqlens_q[B] (no sequence)
    nan_keys: bool = False                    # a few NaN keys (visible and masked ones)
    checks: Tuple[str, ...] = BOTH

    def __str__(self):
        return self.name


def _decode_stream(groups: int, paged: bool, offset: bool) -> ProxyCase:
    seqs_k = [700, 2048, 129, 0, 4096]
    return ProxyCase(f"decode_stream_g{groups}_{'paged' if paged else 'flat'}"
                     f"{'_qoff' if offset else ''}",
                     [1] * 5, seqs_k, hq=groups, hkv=1, paged=paged,
                     q_offset=[s // 2 for s in seqs_k] if offset else None)


PROXY = [
    ProxyCase("spec_gqa2_causal", [100, 37], [2048, 700], hq=4, hkv=2),
    ProxyCase("g3_uneven", [33, 17], [400, 900], hq=6, hkv=2),
    ProxyCase("empty_kv_sequence", [5, 3, 4], [700, 0, 129], hq=4, hkv=1),
    ProxyCase("more_queries_than_keys", [300], [200], hq=2, hkv=1),
    ProxyCase("fp8_q_fp8_k_paged", [3, 9], [1300, 500], hq=4, hkv=1, q_dtype=FP8, k_dtype=FP8,
              paged=True),
    ProxyCase("q_offset_int", [20, 20], [1000, 600], hq=4, hkv=1, q_offset=300),
    *_on(REFERENCE, [
        ProxyCase("flat_noncausal_fp16", [130, 64], [1024, 512], 2, 2, causal=False, q_dtype=FP16),
        ProxyCase("paged_three_seqs", [1, 33, 7], [300, 1111, 256], 2, 1, paged=True),
        ProxyCase("empty_q_sequence", [0, 10], [256, 300], 2, 1, paged=True),
        ProxyCase("q_offset_tensor_negative", [16, 16], [512, 512], 2, 2, q_offset=[-5, 400]),
        ProxyCase("reduce_heads", [50], [1000], 8, 2, reduce_heads=True),
        ProxyCase("padding_columns_one_seq", [40], [500], 2, 1, max_k_tiles=10),
        ProxyCase("truncated_columns_short", [40], [1000], 2, 1, max_k_tiles=3),
        ProxyCase("decode_rows", [1, 1, 1, 1], [4096, 129, 2048, 700], 4, 1, paged=True),
        ProxyCase("fp8_k", [64, 20], [1024, 333], 4, 1, k_dtype=FP8),
    ]),
    *_on(GPU, [
        # Proxy shapes of docs/semantics.md#accuracy (B, Hq, Hkv, seqs_q, seqs_k, causal).
        ProxyCase("spec_noncausal", [130, 64], [1024, 512], hq=2, hkv=2, causal=False),
        ProxyCase("spec_three_seqs", [1, 33, 7], [300, 1111, 256], hq=2, hkv=1),
        ProxyCase("spec_packed_decode_8k", [1] * 4, [8192] * 4, hq=4, hkv=1),
        ProxyCase("spec_packed_16tok", [16, 16], [4096, 4096], hq=4, hkv=1),
        ProxyCase("spec_packed_g4_8tok", [8, 8, 8], [2048] * 3, hq=8, hkv=2),
        ProxyCase("spec_packed_noncausal", [16, 16], [4096, 4096], hq=4, hkv=1, causal=False),
        ProxyCase("spec_packed_paged", [8, 3, 1], [2048, 300, 1280], hq=4, hkv=1, paged=True),
        ProxyCase("spec_packed_paged_g4", [2, 2], [1024, 640], hq=8, hkv=2, paged=True),
        *[_decode_stream(g, paged, off) for g in (1, 3, 4, 8) for paged in (False, True)
          for off in (False, True)],
        ProxyCase("spec_reduce_heads_4", [300], [4096], hq=4, hkv=1, reduce_heads=True),
        ProxyCase("spec_reduce_heads_8_2", [300], [4096], hq=8, hkv=2, reduce_heads=True),
        ProxyCase("spec_paged_fp8", [150, 90], [2048, 1280], hq=8, hkv=2, k_dtype=FP8, paged=True),
        ProxyCase("spec_q_offset_override", [256, 256], [8192, 4096], hq=2, hkv=1,
                  q_offset=[256, 128]),
        # MiniMax-M3 indexer (4 index heads over 1 index-K head) and its mixed batches.
        ProxyCase("m3_prefill_4k", [4096], [4096], hq=4, hkv=1, paged=True),
        ProxyCase("m3_chunked_prefill", [1000], [5000], hq=4, hkv=1, paged=True),
        ProxyCase("m3_mixed_prefill_decode", [777] + [1] * 8,
                  [2000] + [300 * i + 1 for i in range(8)], hq=4, hkv=1, paged=True),
        ProxyCase("m3_mtp_decode", [4] * 16, [1000 + 97 * i for i in range(16)], hq=4, hkv=1,
                  paged=True),
        ProxyCase("m3_decode_b64", [1] * 64, [128 * (i % 9) + 5 * i + 1 for i in range(64)], hq=4,
                  hkv=1, paged=True),
        ProxyCase("m3_tp4_single_head", [200], [3000], hq=1, hkv=1),
        # Group sizes: odd, non-power-of-two, above one CTA's 16 heads, MHA.
        ProxyCase("g5_noncausal", [70, 1], [333, 1000], hq=5, hkv=1, causal=False),
        ProxyCase("g16_full_heads", [40, 3], [1500, 700], hq=64, hkv=4),
        ProxyCase("g20_split_heads", [9, 30], [640, 1024], hq=20, hkv=1),
        ProxyCase("g20_reduce", [9, 30], [640, 1024], hq=40, hkv=2, reduce_heads=True),
        ProxyCase("mha_g1", [64, 65], [64, 300], hq=2, hkv=2),
        # Uneven / empty sequences, rows of no sequence.
        ProxyCase("empty_q_sequences", [0, 10, 0], [256, 300, 999], hq=2, hkv=1, paged=True),
        ProxyCase("uncovered_rows", [20, 7], [300, 600], hq=4, hkv=1, extra_rows=11),
        ProxyCase("uncovered_rows_reduce", [20], [300], hq=4, hkv=2, extra_rows=9,
                  reduce_heads=True),
        ProxyCase("uncovered_rows_many", [3, 1], [3000, 200], hq=8, hkv=2, extra_rows=5000),
        ProxyCase("seqlen_not_multiple", [129, 255], [129, 257], hq=4, hkv=1),
        # Paged: permuted pages, invalid page ids, partial last page.
        ProxyCase("paged_invalid_pages", [60, 5], [1500, 900], hq=4, hkv=1, paged=True,
                  invalid_pages=True),
        ProxyCase("paged_invalid_reduce", [60], [1500], hq=8, hkv=2, paged=True,
                  invalid_pages=True, reduce_heads=True),
        # fp8 and fp16.
        ProxyCase("fp16", [100, 50], [1000, 2000], hq=4, hkv=1, q_dtype=FP16),
        ProxyCase("fp16_q_fp8_k", [64, 20], [1024, 333], hq=4, hkv=1, q_dtype=FP16, k_dtype=FP8),
        ProxyCase("fp8_q_fp8_k_prefill", [600], [600], hq=4, hkv=1, q_dtype=FP8, k_dtype=FP8),
        # q_offset modes.
        ProxyCase("q_offset_negative_tensor", [16, 16, 8], [512, 512, 100], hq=2, hkv=2,
                  q_offset=[-5, 400, -100]),
        ProxyCase("q_offset_negative_int", [40], [512], hq=4, hkv=1, q_offset=-20),
        ProxyCase("q_offset_huge", [10], [512], hq=4, hkv=1, q_offset=2**31 - 5),
        # max_k_tiles smaller / larger than the block counts; max_seqlen_q hint too small.
        ProxyCase("padding_columns", [40, 3], [500, 100], hq=2, hkv=1, max_k_tiles=10),
        ProxyCase("truncated_columns", [300], [2000], hq=4, hkv=1, max_k_tiles=3),
        ProxyCase("truncated_columns_decode", [1] * 8, [2000] * 8, hq=4, hkv=1, max_k_tiles=5),
        ProxyCase("single_column", [100], [1000], hq=4, hkv=1, max_k_tiles=1),
        ProxyCase("max_seqlen_hint_too_small", [700, 5], [1000, 900], hq=4, hkv=1, max_seqlen_q=3),
        ProxyCase("max_seqlen_hint_too_small_noncausal", [1000], [300], hq=2, hkv=1, causal=False,
                  max_seqlen_q=17),
        # NaN keys: a visible one makes its block NaN (canonical 0x7FFFFFFF), a masked one nothing.
        ProxyCase("nan_keys", [64, 4], [600, 300], hq=4, hkv=1, nan_keys=True),
        ProxyCase("nan_keys_reduce", [64], [600], hq=8, hkv=2, nan_keys=True, reduce_heads=True),
        # >= 64K query tokens (65600 one-token sequences: large B on the grid's x dimension).
        ProxyCase("many_sequences_64k", [1] * 65600, [(37 * i) % 300 + 1 for i in range(65600)],
                  hq=4, hkv=1),
        ProxyCase("long_prefill_70k_rows", [70000], [70000], hq=1, hkv=1, causal=False,
                  max_k_tiles=4),
    ]),
]


# ---- msa_sparse_decode_attention ---------------------------------------------------------------

@dataclasses.dataclass
class DecodeCase:
    name: str
    batch: int
    seqlen_q: int
    hq: int
    hkv: int
    topk: int = 16
    q_dtype: torch.dtype = BF16
    kv: str = "same"              # same | fp8 | nvfp4
    layout: str = "paged"         # paged | flat | packed | packed_nhd
    # ragged: any length in [1, 4000]; multiples: random multiples of 128 in [256, 1920]; a list
    seqlens: Union[str, List[int]] = "ragged"
    selection: str = "causal_local"
    causal: bool = True
    q_offset: Union[None, int, List[int]] = None
    softmax_scale: Optional[float] = None
    v_global_scale: Optional[float] = None
    invalid_pages: bool = False
    partial_dtype: Optional[torch.dtype] = None
    force_fused: Optional[bool] = None
    checks: Tuple[str, ...] = BOTH

    def __str__(self):
        return self.name


DECODE = [
    *_on(GPU, [
        # FlashInfer's test_sparse_decode / test_sparse_decode_fused shapes
        # (docs/semantics.md#accuracy).
        DecodeCase("spec_8_1_8_2_bf16_flat", 8, 1, 8, 2, layout="flat", seqlens="multiples"),
        DecodeCase("spec_8_1_8_2_fp8_paged", 8, 1, 8, 2, kv="fp8", seqlens="multiples"),
        DecodeCase("spec_4_2_16_2_bf16_paged", 4, 2, 16, 2, seqlens="multiples"),
        DecodeCase("spec_16_1_4_4_topk8_fp8", 16, 1, 4, 4, topk=8, kv="fp8", seqlens="multiples"),
        DecodeCase("spec_6_1_16_1_fp8", 6, 1, 16, 1, kv="fp8"),
        DecodeCase("nvfp4_paged", 8, 1, 8, 2, kv="nvfp4"),
        DecodeCase("nvfp4_flat_mtp", 4, 4, 16, 2, kv="nvfp4", layout="flat"),
        # M3 decode (64 q / 4 kv heads, top-16) and its TP4 slice (16 / 1).
        DecodeCase("m3_b64_ctx8k_fp8", 64, 1, 64, 4, kv="fp8", seqlens=[8192] * 64),
        # Between the split rule's measured batches (132 SMs: 92 / 112 items): bf16 B28 one wave
        # of 2 splits on the 8-warp kernel (16 one-block splits before the split's start was
        # priced), fp8 B28 fused (from 70 % of an item per SM), fp8 B23 split.
        DecodeCase("m3_b28_bf16", 28, 1, 64, 4),
        DecodeCase("m3_b28_fp8", 28, 1, 64, 4, kv="fp8"),
        DecodeCase("m3_b23_fp8", 23, 1, 64, 4, kv="fp8"),
        # Past the shared-memory kernel's one wave (512 items for 396 slots): bf16 on the register
        # kernel (decode_16bit_takes_regs).
        DecodeCase("m3_b128_bf16", 128, 1, 64, 4),
        DecodeCase("m3_tp4_mtp2", 16, 2, 16, 1, seqlens="ragged"),
        # q dtypes.
        DecodeCase("fp16", 8, 1, 8, 2, q_dtype=FP16),
        DecodeCase("fp16_fp8kv_mtp4", 4, 4, 8, 2, q_dtype=FP16, kv="fp8"),
        DecodeCase("fp8_q_fp8_kv", 8, 2, 16, 4, q_dtype=FP8, kv="fp8"),
        DecodeCase("fp8_q_bf16_kv", 8, 1, 16, 4, q_dtype=FP8),
        DecodeCase("fp8_q_nvfp4_kv", 8, 1, 16, 4, q_dtype=FP8, kv="nvfp4"),
        # GQA groups and topk.
        DecodeCase("g1_topk1", 12, 1, 4, 4, topk=1),
        DecodeCase("g3_topk33", 6, 2, 9, 3, topk=33, seqlens=[9000, 7000, 300, 129, 5000, 4300],
                   selection="full"),
        DecodeCase("g4_topk64", 4, 1, 8, 2, topk=64, seqlens=[9000, 8200, 128, 1],
                   selection="full"),
        DecodeCase("g16_topk64_mtp4", 3, 4, 16, 1, topk=64, seqlens=[12000, 8300, 700],
                   selection="full"),
        # Lengths, offsets, index lists, pages, layouts, scales.
        DecodeCase("empty_and_tiny_sequences", 6, 1, 8, 2, seqlens=[0, 1, 128, 129, 0, 3000]),
        DecodeCase("mtp_seqlen_gt_keys", 3, 4, 8, 2, seqlens=[2, 3, 1000]),
        DecodeCase("q_offset_int", 4, 2, 8, 2, q_offset=300, seqlens=[1000, 2000, 500, 4000]),
        DecodeCase("q_offset_tensor_negative", 4, 2, 8, 2, q_offset=[-5, 130, 0, 3999],
                   seqlens=[1000, 2000, 500, 4000]),
        DecodeCase("non_causal", 4, 2, 8, 2, causal=False, selection="random"),
        DecodeCase("unsorted", 8, 1, 8, 2, selection="unsorted"),
        DecodeCase("duplicates", 8, 2, 8, 2, selection="duplicates"),
        DecodeCase("holes", 8, 1, 8, 2, selection="holes"),
        DecodeCase("out_of_range", 8, 1, 8, 2, selection="out_of_range"),
        DecodeCase("some_empty_rows", 8, 2, 8, 2, selection="some_empty"),
        DecodeCase("invalid_pages", 6, 1, 16, 2, invalid_pages=True, selection="full"),
        DecodeCase("packed_hnd_fp8", 8, 1, 8, 2, kv="fp8", layout="packed"),
        DecodeCase("packed_nhd", 8, 2, 16, 2, layout="packed_nhd"),
        DecodeCase("scales", 8, 1, 8, 2, softmax_scale=0.03, v_global_scale=1.7),
    ]),
    *_on(REFERENCE, [
        DecodeCase("b8_g4_flat", 8, 1, 8, 2, layout="flat", seqlens="multiples",
                   selection="random"),
        DecodeCase("b8_g4_fp8_paged", 8, 1, 8, 2, kv="fp8", seqlens="multiples",
                   selection="random"),
        DecodeCase("mtp2_g8_paged", 4, 2, 16, 2, seqlens="multiples", selection="random"),
        DecodeCase("b16_topk8_fp8", 16, 1, 4, 4, topk=8, kv="fp8", seqlens="multiples",
                   selection="random"),
        DecodeCase("g16_m3_tp4", 3, 1, 16, 1, seqlens=[4096, 129, 1000], selection="random"),
        DecodeCase("m3_tp1_mtp4", 2, 4, 64, 4, seqlens=[2000, 700], selection="random"),
        DecodeCase("ragged_tail", 5, 1, 8, 2, seqlens=[128 * p - 13 for p in (2, 5, 9, 14, 3)],
                   selection="random"),
        DecodeCase("fp8_q", 6, 1, 16, 1, kv="fp8", q_dtype=FP8, seqlens="multiples",
                   selection="random"),
        DecodeCase("fp16_mtp3", 4, 3, 8, 2, q_dtype=torch.float16, seqlens="multiples",
                   selection="random"),
        DecodeCase("packed_kv", 4, 2, 8, 2, layout="packed", seqlens="multiples",
                   selection="random"),
        DecodeCase("packed_fp8_kv", 4, 1, 8, 1, kv="fp8", layout="packed", seqlens="multiples",
                   selection="random"),
        DecodeCase("nvfp4_paged_multiples", 8, 1, 8, 2, kv="nvfp4", seqlens="multiples",
                   selection="random"),
        DecodeCase("nvfp4_flat", 4, 2, 4, 1, kv="nvfp4", layout="flat", seqlens="multiples",
                   selection="random"),
        DecodeCase("non_causal_mtp3", 4, 3, 8, 2, causal=False, seqlens="multiples",
                   selection="random"),
        DecodeCase("q_offset_int_b3", 3, 2, 4, 2, q_offset=300, seqlens=[1000, 800, 2000],
                   selection="random"),
        DecodeCase("q_offset_tensor", 3, 2, 4, 2, q_offset=[-3, 128, 1500],
                   seqlens=[1000, 800, 2000], selection="random"),
        DecodeCase("empty_sequence", 3, 1, 4, 1, seqlens=[0, 300, 1000], selection="random"),
        DecodeCase("hole_stops_list", 6, 1, 8, 2, selection="holes", seqlens="multiples"),
        DecodeCase("duplicated_ids", 6, 1, 8, 2, selection="duplicates", seqlens="multiples"),
        DecodeCase("unsorted_ids", 6, 1, 8, 2, selection="unsorted", seqlens="multiples"),
        DecodeCase("topk_40", 3, 1, 4, 1, topk=40, seqlens=[6000, 300, 5000], selection="random"),
        DecodeCase("partial_f32_split", 4, 1, 8, 2, partial_dtype=torch.float32,
                   force_fused=False, seqlens="multiples", selection="random"),
        DecodeCase("partial_bf16_split", 4, 1, 8, 2, partial_dtype=torch.bfloat16,
                   force_fused=False, seqlens="multiples", selection="random"),
        DecodeCase("partial_f16_split", 4, 1, 8, 2, partial_dtype=torch.float16,
                   force_fused=False, seqlens="multiples", selection="random"),
        DecodeCase("partial_fp8_split", 4, 1, 8, 2, partial_dtype=FP8, force_fused=False,
                   seqlens="multiples", selection="random"),
        DecodeCase("fused", 4, 2, 8, 2, force_fused=True, seqlens="multiples", selection="random"),
    ]),
]


# ---- msa_topk_select ---------------------------------------------------------------------------

@dataclasses.dataclass
class TopkCase:
    name: str
    H: int                      # heads
    P: int                      # blocks (score columns)
    S: int                      # tokens
    topk: int = 16
    # None | scalar | list (per token) | "random" / "causal" / "clamp" (per token, made by the
    # GPU test's builder)
    nvp: Union[None, int, str, List[int]] = None
    fb: int = 0                 # force_begin_blocks
    fe: int = 0                 # force_end_blocks
    # The builders' score kinds: randn | ties | few | nan | inf | zeros | worst_forced | perm |
    # causal (GPU test); distinct | ties | special | forced_worst (reference test)
    scores: str = "randn"
    seed: int = 0
    checks: Tuple[str, ...] = BOTH

    def __str__(self):
        return self.name


def _clamp_cases(p):
    return [p + 1, 2 * p, 2 ** 31 - 1, 0, -5, p]


TOPK = [
    *_on(REFERENCE, [
        TopkCase("p24_default", 2, 24, 12, scores="distinct"),
        TopkCase("p160_scalar_nvp_forced", 2, 160, 12, nvp=104, fb=3, fe=2, scores="distinct"),
        TopkCase("p128_forced_worst", 2, 128, 64, nvp=72, fb=3, fe=2,
                 scores="forced_worst"),
        TopkCase("p256_forced_worst", 2, 256, 64, nvp=200, fb=3, fe=2,
                 scores="forced_worst"),
        TopkCase("per_token_nvp", 2, 24, 12, nvp=[1, 2, 3, 5, 8, 13, 16, 17, 20, 23, 24, 24],
                 fb=1, fe=1, scores="distinct"),
        TopkCase("per_token_clamped", 2, 160, 6, nvp=_clamp_cases(160), fb=2, fe=3,
                 scores="distinct"),
        TopkCase("per_token_local_window", 3, 40, 8, nvp=[1, 4, 9, 16, 17, 30, 39, 40], fe=1,
                 scores="distinct"),
        TopkCase("ties_lower_index", 2, 300, 8, scores="ties"),
        TopkCase("specials_nan_inf_zero", 1, 64, 4, scores="special"),
        TopkCase("fewer_blocks_than_k", 4, 9, 7, scores="distinct"),
        TopkCase("topk_1", 2, 50, 5, topk=1, scores="distinct"),
        TopkCase("topk_8_forced", 2, 50, 5, topk=8, fb=2, fe=2, scores="distinct"),
        TopkCase("topk_32", 2, 100, 5, topk=32, fe=1, scores="distinct"),
        TopkCase("topk_64", 2, 100, 5, topk=64, fb=10, fe=10, scores="distinct"),
        TopkCase("large_p_ties", 1, 4096, 3, scores="ties"),
    ]),
    *_on(GPU, [
        # Top-k cases of docs/semantics.md#accuracy.
        TopkCase("spec_p128_forced_worst", 2, 128, 64, nvp=128 - 56, fb=3, fe=2,
                 scores="worst_forced"),
        TopkCase("spec_p256_forced_worst", 2, 256, 64, nvp=256 - 56, fb=3, fe=2,
                 scores="worst_forced"),
        TopkCase("spec_p16384_random", 2, 16384, 40),
        TopkCase("spec_p16384_ties", 2, 16384, 40, scores="ties"),
        TopkCase("spec_p16384_nan", 1, 16384, 24, scores="nan"),
        *[TopkCase(f"spec_per_token_p{P}_fb{fb}_fe{fe}", 2, P, 12, nvp="random", fb=fb, fe=fe,
                   scores="perm", seed=P + fb * 7 + fe)
          for P in (24, 160) for fb, fe in ((0, 0), (0, 1), (1, 1), (2, 3))],
        TopkCase("spec_nvp_clamp", 2, 160, 40, nvp="clamp", fb=1, fe=2),
        TopkCase("spec_nvp_clamp_chunks", 2, 700, 40, nvp="clamp", fb=2, fe=1, scores="ties"),
        # topk 1 / 16 / 33 / 64 at single- and multi-chunk P.
        *[TopkCase(f"topk{k}_p{P}", 3, P, 70, topk=k, scores=s, fb=min(2, k // 2),
                   fe=min(1, k - 1))
          for k in (1, 16, 33, 64) for P, s in ((64, "randn"), (256, "few"), (1000, "ties"))],
        # Chunk boundaries (256 blocks per chunk), ties straddling them.
        *[TopkCase(f"chunk_edge_p{P}_{s}", 2, P, 33, scores=s, nvp="random", fe=1, seed=P)
          for P in (255, 256, 257, 511, 512, 513) for s in ("few", "randn")],
        TopkCase("chunks_64_of_them", 1, 64 * 256 + 3, 5, topk=64, scores="few", fb=5, fe=7),
        # Special values.
        TopkCase("nan_inf_zero", 2, 300, 64, scores="nan", fb=1, fe=1),
        TopkCase("nan_inf_zero_small", 2, 40, 64, scores="nan", topk=8),
        TopkCase("mostly_neg_inf", 2, 512, 64, scores="inf", topk=32, nvp="random", fe=1),
        TopkCase("signed_zeros", 2, 200, 40, scores="zeros", topk=20),
        TopkCase("all_forced", 2, 40, 16, topk=16, fb=10, fe=6, nvp=16),
        TopkCase("fewer_candidates_than_slots", 2, 10, 50, topk=64, fb=2, fe=3),
        TopkCase("scalar_nvp_small", 3, 300, 50, nvp=7, fb=3, fe=3, topk=16),
        TopkCase("tokens_not_multiple_of_32", 3, 256, 77, nvp="random", fe=1),
        # MiniMax-M3 prefill at 32K: H=4, P=256, per-token nvp = pos // 128 + 1, local block
        # forced.
        TopkCase("m3_prefill_32k", 4, 256, 32768, nvp="causal", fe=1, scores="causal"),
        TopkCase("m3_decode_b64", 4, 256, 64, nvp="random", fe=1),
        # H * S > 2^24 rows.
        TopkCase("rows_over_2p24", 256, 3, 70000, topk=2, fe=1),
    ]),
]
