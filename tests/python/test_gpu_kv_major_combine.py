"""The KV-major combine on the GPU (the separate combine kernel after each launch group,
docs/design/sparse_attention.md#combine) under the KV-major schedules, forced through
msa_ops._sparse_attention_planned: checked against the exact CPU reference (baseline-bounded
outputs, exact -inf / zero patterns, LSE and temperature LSE) on fresh random inputs, with several
launch groups (the chunk_rows option), topk above one batch of slots, bf16 / fp16 / fp8 K and V,
flat and paged caches, a workspace poisoned with NaN bytes, and under CUDA-graph capture.

The variants prefetch, overlap and overlap_staged (and the plan option combine) were removed:
equal or slower on the H200, and the prefetching loads read partials the KV-major kernel never
wrote (compute-sanitizer initcheck); docs/design/sparse_attention.md#combine-variants. So were
fused (docs/design/sparse_attention.md#fused-combine) and the later combine=overlap / combine_ctas
(each launch group's combine inside the next group's attention kernel: bit-identical but slower;
docs/design/sparse_attention.md#combine-overlap).

A case's inputs, CPU reference and baseline are memoised per xdist worker
(test_gpu_sparse_attention's ``problem`` / ``reference``): the schedules of one case (the last,
fastest-varying parameter) compute them once.

Skipped (not passed) without a CUDA device or without a CUDA build.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import flashmsa  # noqa: E402
from flashmsa import msa_ops  # noqa: E402

if not flashmsa.built_with_cuda():
    pytest.skip("flashmsa was built without CUDA kernels", allow_module_level=True)

from test_gpu_sparse_attention import (  # noqa: E402
    BF16, DEV, FP16, GpuCase, bits_equal, build, check_empty_rows, check_lse, check_output,
    plan_options, problem, reference, run)

# The schedules of test_gpu_sparse_attention.SCHEDULES that combine KV-major partials.
KV_MAJOR_SCHEDULES = pytest.mark.parametrize("schedule", ["kv_major", "kv_major_mma_sync", "hybrid",
                                                        "hybrid_cp_async", "kv_major_lists_once",
                                                        "hybrid_lists_once", "kv_major_per_group",
                                                        "hybrid_per_group", "kv_major_tma",
                                                        "hybrid_tma", "kv_major_tma_groups",
                                                        "kv_major_stg", "hybrid_stg",
                                                        "kv_major_precise", "hybrid_precise"])


def check_against_reference(case, seed, got, what):
    """got (the GPU result on problem(case, seed)) against the memoised CPU reference."""
    _, cpu, base_out = reference(case, seed)
    check_output(got[0], cpu[0], base_out, f"{what} out")
    check_lse(got[1], cpu[1], f"{what} lse")
    check_empty_rows(got[0], cpu[1], what)
    if case.temperature is not None:
        check_lse(got[2], cpu[2], f"{what} lse_t")


@KV_MAJOR_SCHEDULES
@pytest.mark.parametrize("chunk_rows", [None, 1, 37, 500])
@pytest.mark.parametrize("temperature,topk", [(None, 16), (0.9, 16), (0.9, 33)])
def test_combine_matches_reference(schedule, chunk_rows, temperature, topk):
    """Uneven sequences, an empty one, causal: any number of launch groups (chunk_rows 1: one row
    per group; None: one group); topk 33: more slots than one batch of the merge's loads (16)."""
    case = GpuCase("combine", [300, 5, 0, 211], [2000, 100, 50, 3000], 16, 2, topk=topk, causal=True,
                   temperature=temperature, selection="random")
    seed = 21 + (chunk_rows or 0)
    pb = problem(case, seed)
    extra = {} if chunk_rows is None else dict(chunk_rows=chunk_rows)
    got = run(pb, gpu=True, schedule=schedule, **extra)
    check_against_reference(case, seed, got, f"{schedule}/{chunk_rows}")


@KV_MAJOR_SCHEDULES
@pytest.mark.parametrize("kv,layout,dtype", [("fp8", "flat", BF16), ("same", "paged", FP16),
                                             ("fp8", "paged", FP16)])
def test_combine_kv_kinds_and_layouts(schedule, kv, layout, dtype):
    """M3-shaped heads (G = 16, where the tile kernel of hybrid applies) with clustered selections,
    so that done tiles and KV-major rows mix in the combine units; fp8 K / V, paged caches."""
    case = GpuCase("m3", [700, 333], [1500, 900], 64, 4, causal=True, selection="causal_local",
                   kv=kv, layout=layout, dtype=dtype, temperature=1.3)
    pb = problem(case, seed=22)
    got = run(pb, gpu=True, schedule=schedule, chunk_rows=100)
    check_against_reference(case, 22, got, f"{schedule}/{kv}/{layout}")


@KV_MAJOR_SCHEDULES
def test_combine_ignores_poisoned_workspace(schedule):
    """The workspace filled with 0xFF bytes (NaN partials, NaN LSEs) before the call: slots that
    get no pair are set to -inf by the list builder, and slots of weight 0 are never read, so the
    result is the clean workspace's."""
    case = GpuCase("poison", [400, 77], [1200, 2500], 32, 4, causal=True, temperature=0.7,
                   selection="duplicates")
    pb = problem(case, seed=23)
    options = plan_options(schedule, chunk_rows=64)
    clean = run(pb, gpu=True, schedule=schedule, chunk_rows=64)
    ws = msa_ops.MSASparseAttentionWorkspace(DEV)
    msa_ops._sparse_attention_planned(*pb.gpu_args, **pb.gpu_kwargs, workspace=ws, options=options)
    ws.buffer.fill_(0xFF)
    poisoned = msa_ops._sparse_attention_planned(*pb.gpu_args, **pb.gpu_kwargs, workspace=ws,
                                                 options=options)
    torch.cuda.synchronize()
    assert bits_equal(clean, poisoned)
    check_against_reference(case, 23, poisoned, f"{schedule} poisoned")


@KV_MAJOR_SCHEDULES
def test_combine_under_graph_capture(schedule):
    """Stream-ordered and allocation-free: captured with a warmed caller workspace, a replay on new
    inputs gives the eager bits of those inputs."""
    case = GpuCase("graph", [300, 211], [1000, 1500], 16, 2, causal=True, temperature=0.8)
    pb = build(case, seed=25)
    pb2 = build(case, seed=26, q2k=pb.cpu_args[3])
    options = plan_options(schedule, chunk_rows=100)
    ws = msa_ops.MSASparseAttentionWorkspace(DEV)
    args = [a.clone() for a in pb.gpu_args]
    msa_ops._sparse_attention_planned(*args, **pb.gpu_kwargs, workspace=ws, options=options)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = msa_ops._sparse_attention_planned(*args, **pb.gpu_kwargs, workspace=ws, options=options)
    torch.cuda.current_stream().wait_stream(stream)
    for dst, src in zip(args, pb2.gpu_args):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    eager = run(pb2, gpu=True, schedule=schedule, chunk_rows=100)
    assert bits_equal(eager, captured)


def test_removed_combine_variants_are_refused():
    """The removed combine variants (prefetch, overlap_staged, fused, and the in-kernel
    combine=overlap with its combine_ctas) took the plan options combine=... and combine_ctas=...;
    both are unknown options now: a ValueError naming the option."""
    case = GpuCase("opt", [64], [256], 16, 2, causal=True)
    pb = build(case, seed=27)
    for value in ("auto", "separate", "overlap", "prefetch", "overlap_staged", "fused"):
        with pytest.raises(ValueError, match="unknown plan option 'combine'"):
            run(pb, gpu=True, schedule="kv_major", combine=value)
    with pytest.raises(ValueError, match="unknown plan option 'combine_ctas'"):
        run(pb, gpu=True, schedule="kv_major", combine_ctas=8)
