"""CPU checks of the benchmark tooling: profile_msa's cases build through bench_msa's builders
with the arguments those builders take (a renamed builder or a changed signature fails here, not
on the GPU machine); bench_msa's command line and configurations; the decode-step stage (step) run
on the CPU reference with a stand-in for the CUDA graph, its byte floor and its replay check."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch

from flashmsa import msa_ops
from flashmsa import testing as ft
from flashmsa.testing import inputs as mi
from flashmsa.testing.timing import Timer

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(name: str):
    """benchmarks/<name>.py as module <name> (the scripts import each other by name, as they do
    when run from that directory)."""
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bm = load_script("bench_msa")
profile_msa = load_script("profile_msa")


def test_profile_cases_call_existing_builders():
    bench = mock.create_autospec(bm.Bench, instance=True)
    table = profile_msa.cases(bench)
    assert len(table) >= 8
    for build in table.values():
        build()  # autospec: an unknown method or a wrong argument list raises here
    called = {c[0] for c in bench.method_calls}
    assert {"build_proxy_prefill", "build_proxy_decode", "build_topk", "build_topk_decode",
            "build_sparse", "build_decode", "build_step"} <= called


def test_profile_bench_takes_bench_msa_defaults():
    from flashmsa import msa_ops
    bench = profile_msa.make_bench(msa_ops, torch.device("cpu"))
    assert bench.timer.flush_mode == "read" and bench.cfg["max_reps"] == bm.QUICK["max_reps"]


def test_profile_stages_sweep_builds_through_bench_msa():
    """profile_stages --sweep: one case per bound, each built by bench_msa's pipeline / sparse
    builder with tile_max_waste forced (None for default)."""
    profile_stages = load_script("profile_stages")
    bench = mock.create_autospec(bm.Bench, instance=True)
    bench.build_pipeline.return_value = ("pipeline call", {})
    bench.build_sparse.return_value = ("sparse call", {})
    cases = profile_stages.sweep_cases(bench, ["pipeline:8192:default,3.5", "random:32768:2"])
    assert [label for label, _ in cases] == [
        "[sweep] pipeline 8192 tile_max_waste=default", "[sweep] pipeline 8192 tile_max_waste=3.5",
        "[sweep] random 32768 tile_max_waste=2"]
    assert [build() for _, build in cases] == ["pipeline call", "pipeline call", "sparse call"]
    assert bench.build_pipeline.call_args_list == [mock.call(8192, bm.M3, None),
                                                   mock.call(8192, bm.M3, dict(tile_max_waste=3.5))]
    bench.build_sparse.assert_called_once_with(32768, "bf16", "flat", "random", bm.M3,
                                               dict(tile_max_waste=2.0))


def test_profile_stages_sweep_takes_plan_options():
    """A sweep point KEY=VALUE+... forces those plan options (ints and floats parsed as such)."""
    profile_stages = load_script("profile_stages")
    bench = mock.create_autospec(bm.Bench, instance=True)
    bench.build_pipeline.return_value = ("pipeline call", {})
    cases = profile_stages.sweep_cases(
        bench, ["pipeline:131072:kv_major_kernel=tma+chunk_rows=8058,tile_max_waste=2.5"])
    assert [label for label, _ in cases] == [
        "[sweep] pipeline 131072 kv_major_kernel=tma+chunk_rows=8058",
        "[sweep] pipeline 131072 tile_max_waste=2.5"]
    for _, build in cases:
        build()
    assert bench.build_pipeline.call_args_list == [
        mock.call(131072, bm.M3, dict(kv_major_kernel="tma", chunk_rows=8058)),
        mock.call(131072, bm.M3, dict(tile_max_waste=2.5))]


@pytest.mark.parametrize("spec", ["pipeline:8192", "dense:8192:default", "pipeline:8K:default",
                                  "pipeline:8192:", "random:32768:0.5", "random:32768:fast",
                                  "random:32768:chunk_rows=", "random:32768:a=1+a=2",
                                  "random:32768:=3"])
def test_profile_stages_sweep_rejects_bad_specs(spec, capsys):
    profile_stages = load_script("profile_stages")
    with pytest.raises(SystemExit) as e:
        profile_stages.main(["--sweep", spec])
    assert e.value.code == 2 and f"--sweep {spec!r}" in capsys.readouterr().err


def test_profile_stages_timeline_splits_replays():
    """--timeline: the kernel records of several replays (in any order) give each kernel's start,
    duration and the gap before it as medians over the replays, and the replay's span."""
    profile_stages = load_script("profile_stages")
    kernels = []
    for r, base in enumerate((1000.0, 2000.0, 3000.0)):
        jitter = (0.0, 0.5, 1.0)[r]
        kernels += [(base, base + 10.0, "proxy"), (base + 11.0 + jitter, base + 15.0 + jitter, "topk"),
                    (base + 17.0 + jitter, base + 26.0 + jitter, "decode")]
    rows, span = profile_stages.replay_timeline(list(reversed(kernels)), 3)
    assert [r[0] for r in rows] == ["proxy", "topk", "decode"]
    assert rows[0] == ("proxy", 0.0, 10.0, 0.0)
    assert rows[1] == ("topk", 11.5, 4.0, 1.5) and rows[2] == ("decode", 17.5, 9.0, 2.0)
    assert span == 26.5


@pytest.mark.parametrize("sizes", ["100", "abc", ",", "1/100", "0/32K", "1/32K/1/int8"])
def test_profile_stages_host_rejects_bad_sizes(sizes, capsys):
    """--host ITEMS: a size that is not a positive multiple of 128 tokens, or a step case that
    bench_msa's --steps would refuse, is an argument error before the device is touched."""
    profile_stages = load_script("profile_stages")
    with pytest.raises(SystemExit) as e:
        profile_stages.main(["--host", sizes])
    assert e.value.code == 2 and "--host" in capsys.readouterr().err


def test_profile_stages_host_items():
    """--host ITEMS mixes prefill sizes and decode step cases, in order, labelled as printed."""
    profile_stages = load_script("profile_stages")
    cases = profile_stages.parse_host("8K, 1/128K/1/fp8,64/32K/4")
    assert cases == [8192, (1, 131072, 1, "fp8", "fp8"), (64, 32768, 4, "bf16", "bf16")]
    assert [profile_stages.host_label(c) for c in cases] == ["8192", "B1/128K fp8/fp8", "B64/32K/sq4 bf16/bf16"]


def test_profile_stages_sweep_reports_the_span_and_gaps():
    """--sweep: beside the kernel totals, each call's span on the GPU and the time between its
    kernels (medians over the calls), the largest gaps named; nothing where the calls differ."""
    profile_stages = load_script("profile_stages")
    kernels = []
    for base in (0.0, 10000.0):
        kernels += [(base, base + 1000.0, "proxy"), (base + 1020.0, base + 1500.0, "topk"),
                    (base + 1505.0, base + 4000.0, "attention")]
    text = profile_stages.span_text(kernels, 2)
    assert text == ("; 4.000 ms on the GPU from the call's first kernel start to its last kernel end, "
                    "0.025 ms of it between 2 kernel hand-offs (largest: 20.0 us before topk, "
                    "5.0 us before attention)")
    assert profile_stages.span_text(kernels[:-1], 2) == ""


@pytest.mark.parametrize("records,reps", [([(0.0, 1.0, "a"), (2.0, 3.0, "b"), (4.0, 5.0, "a")], 2),
                                          ([(0.0, 1.0, "a"), (2.0, 3.0, "b"), (4.0, 5.0, "b"),
                                            (6.0, 7.0, "a")], 2),
                                          ([], 1)])
def test_profile_stages_timeline_refuses_uneven_replays(records, reps):
    profile_stages = load_script("profile_stages")
    with pytest.raises(ValueError):
        profile_stages.replay_timeline(records, reps)


@pytest.mark.parametrize("spec", ["1", "0/32K", "1/32K/1/int8", "a/32K"])
def test_profile_stages_timeline_rejects_bad_cases(spec, capsys):
    profile_stages = load_script("profile_stages")
    with pytest.raises(SystemExit) as e:
        profile_stages.main(["--timeline", spec])
    assert e.value.code == 2 and "--timeline" in capsys.readouterr().err


def test_profile_stages_plan_options():
    """--proxy-options / --topk-options / --decode-options: NAME=VALUE,... for --timeline's steps;
    malformed ones are usage errors."""
    profile_stages = load_script("profile_stages")
    assert profile_stages.parse_plan_options("") == {}
    assert profile_stages.parse_plan_options("decode_tma_issue=warps, kernel=decode") == dict(
        decode_tma_issue="warps", kernel="decode")
    for bad in ("warps", "=warps", "decode_tma_issue="):
        with pytest.raises(ValueError):
            profile_stages.parse_plan_options(bad)
        with pytest.raises(SystemExit):
            profile_stages.main(["--timeline", "1/32K", "--proxy-options", bad])


def test_profile_list_needs_no_device(capsys):
    assert profile_msa.main(["--list"]) == 0
    names = capsys.readouterr().out.split()
    assert "proxy_decode_b64" in names and "topk_prefill_32k" in names


@pytest.mark.parametrize("label,options", [
    ("auto", None),
    ("query_major", dict(schedule="query_major", kv_major_kernel="auto")),
    ("kv_major", dict(schedule="kv_major", kv_major_kernel="auto")),
    ("kv_major mma_sync", dict(schedule="kv_major", kv_major_kernel="mma_sync")),
    ("kv_major tma", dict(schedule="kv_major", kv_major_kernel="tma")),
    ("hybrid tma", dict(schedule="hybrid", kv_major_kernel="tma")),
    ("hybrid waste=2.5", dict(schedule="hybrid", kv_major_kernel="auto", tile_max_waste="2.5")),
    ("tile_kernel=cp_async", dict(schedule="auto", kv_major_kernel="auto", tile_kernel="cp_async")),
    ("kv_major kv_major_store=stg", dict(schedule="kv_major", kv_major_kernel="auto", kv_major_store="stg")),
    ("kv_major_store=stg", dict(schedule="auto", kv_major_kernel="auto", kv_major_store="stg")),
    ("kv_major_math=precise", dict(schedule="auto", kv_major_kernel="auto", kv_major_math="precise")),
])
def test_bench_schedule_labels_become_plan_options(label, options):
    assert bm.plan_options(label) == options
    # The core accepts them (a bad name or value raises ValueError): a tiny call on the CPU.
    q = torch.zeros(1, 1, 128, dtype=torch.bfloat16)
    kv = torch.zeros(128, 1, 128, dtype=torch.bfloat16)
    q2k = torch.zeros(1, 1, 1, dtype=torch.int32)
    cu_q, cu_k = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 128], dtype=torch.int32)
    msa_ops._sparse_attention_planned(q, kv, kv, q2k, cu_q, cu_k, options=options)


# ---- the command line and the configurations ---------------------------------------------------

def test_help_lists_the_stages(capsys):
    with pytest.raises(SystemExit) as e:
        bm.main(["--help"])
    assert e.value.code == 0
    assert ",".join(bm.STAGES) in capsys.readouterr().out.replace("\n", "").replace(" ", "")
    assert "step" in bm.STAGES


def test_unknown_stage_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        bm.main(["--stages", "step,nope"])
    assert e.value.code == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.cpu_only
@pytest.mark.skipif(torch.cuda.is_available(), reason="would run the benchmark")
def test_step_stage_parses_without_a_device(capsys):
    assert bm.main(["--quick", "--stages", "step"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_case_arguments_replace_the_configs():
    """--decodes / --steps / --decode-attn: the proxy-decode, decode-step and sparse-decode cases of
    a run from the command line (B/CTX[/SQ[/IDX[/KV]]], B/CTX[/SQ[/KV]]), replacing the quick /
    full configuration's; malformed ones are usage errors."""
    K = bm.K
    args = bm.parser().parse_args(["--quick", "--decodes", "1/128K, 64/32K/4",
                                   "--steps", "1/128K,64/32768/1/fp8,8/32K/1/bf16/fp8,1/128K/1/nvfp4",
                                   "--decode-attn", "64/32K/1/fp8, 1/128K,8/32K/4/nvfp4"])
    assert args.decodes == [(1, 128 * K, 1), (64, 32 * K, 4)]
    assert args.steps == [(1, 128 * K, 1, "bf16", "bf16"), (64, 32 * K, 1, "fp8", "fp8"),
                          (8, 32 * K, 1, "bf16", "fp8"), (1, 128 * K, 1, "nvfp4", "fp8")]
    assert args.decode_attn == [(64, 32 * K, 1, "fp8"), (1, 128 * K, 1, "bf16"), (8, 32 * K, 4, "nvfp4")]
    bench = bm.Bench.__new__(bm.Bench)
    with mock.patch.object(bm, "Timer"):
        bm.Bench.__init__(bench, args, None, None)
    assert bench.cfg["decode"] == args.decodes and bench.cfg["step"] == args.steps
    assert bench.cfg["decode_attn"] == args.decode_attn
    assert bm.QUICK["step"] != args.steps  # the configuration itself is not changed
    for bad in ("64", "1/32K/1/fp4", "1/32K/1/fp8/1", "0/32K/1/fp8"):
        with pytest.raises(SystemExit):
            bm.parser().parse_args(["--decode-attn", bad])
    for bad in ("64", "0/32K", "1/100", "1/32K/0", "x/32K", "1/32K/1/fp4", "1/32K/1/bf16/bf16/1",
                "1/32K/1/bf16/nvfp4", "1/32K/1/nvfp4/nvfp4"):  # NVFP4 is an index-K kind only
        with pytest.raises(SystemExit):
            bm.parser().parse_args(["--steps", bad])
    with pytest.raises(SystemExit):
        bm.parser().parse_args(["--decodes", "1/32K/1/bf16"])


def test_step_configs():
    K = bm.K
    for cfg in (bm.QUICK, bm.FULL):
        for b, ctx, sq, idx, kv in cfg["step"]:
            assert idx in bm.STEP_INDEX_DTYPES and kv in bm.STEP_DTYPES
            assert ctx % mi.BLOCK == 0 and b >= 1 and 1 <= sq <= 4
        names = [bm.step_case_name(*c) for c in cfg["step"]]
        assert len(set(names)) == len(names)
    assert bm.QUICK["step"] == [(1, 32 * K, 1, "bf16", "bf16"), (64, 32 * K, 1, "bf16", "bf16"),
                                (1, 32 * K, 1, "fp8", "fp8"), (64, 32 * K, 1, "fp8", "fp8"),
                                (1, 32 * K, 1, "nvfp4", "fp8"), (64, 32 * K, 1, "nvfp4", "fp8")]
    full = set(bm.FULL["step"])
    for d in ("bf16", "fp8"):  # batch 1, 8, 64 x 32K, 128K, one token, both dtypes
        assert {(b, c, 1, d, d) for b in (1, 8, 64) for c in (32 * K, 128 * K)} <= full
        assert (64, 32 * K, 4, d, d) in full  # MTP
    assert (64, 32 * K, 1, "bf16", "fp8") in full
    # the NVFP4 indexer with fp8 K/V: batch 1, 8, 64 x 32K, 128K
    assert {(b, c, 1, "nvfp4", "fp8") for b in (1, 8, 64) for c in (32 * K, 128 * K)} <= full


def test_stage_step_runs_each_config_case():
    bench = mock.create_autospec(bm.Bench, instance=True)
    bench.cfg = bm.QUICK
    bm.Bench.stage_step(bench)
    calls = bench.run_case.call_args_list
    # One row per config case (the library's choices: auto everywhere), followed for the split-K
    # batches by one row per sparse-decode variant (plan options: split=cluster; bf16 K/V sq 1 also
    # split_warps=4, fp8 K/V sq 1 split_warps=4 and 8) and, one token per request, per top-k
    # variant (net_pivot=off, net_pivot_mode=sort and rank_cta); NVFP4 index rows only by the
    # proxy variants (their top-k and decode are the fp8 index rows').
    want = []
    for case in bm.QUICK["step"]:
        want.append((case, "", {}))
        if case[3] == "nvfp4":
            if case[0] <= bm.STEP_VARIANT_MAX_BATCH and case[2] == 1:
                want += [(case, suffix, dict(proxy_options=o)) for suffix, o in bm.STEP_PROXY_VARIANTS]
            continue
        if case[0] <= bm.STEP_VARIANT_MAX_BATCH:
            want += [(case, suffix, dict(decode_options=o)) for suffix, o in bm.STEP_VARIANTS]
            if case[2] == 1 and case[4] == "bf16":
                want += [(case, suffix, dict(decode_options=o)) for suffix, o in bm.STEP_BF16_VARIANTS]
            if case[2] == 1 and case[4] == "fp8":
                want += [(case, suffix, dict(decode_options=o)) for suffix, o in bm.STEP_FP8_VARIANTS]
            if case[2] == 1:
                want += [(case, suffix, dict(topk_options=o)) for suffix, o in bm.STEP_TOPK_VARIANTS]
                if case[3] == "fp8":
                    want += [(case, suffix, dict(proxy_options=o)) for suffix, o in bm.STEP_PROXY_VARIANTS]
                want.append((case, bm.STEP_COPY_SUFFIX, dict(q2k_copy=True)))
        elif case[2] == 1 and case[4] == "fp8":  # larger batches: the 8-warp kernel, fused
            want += [(case, suffix, dict(decode_options=o)) for suffix, o in bm.STEP_FP8_WIDE_VARIANTS]
    suffixes = [w[1] for w in want]
    assert suffixes.count(" [split=cluster]") == 2  # B1 bf16, fp8
    assert suffixes.count(" [combine_loads=after]") == 2  # B1 bf16, fp8
    assert suffixes.count(" [split_warps=4]") == 2  # B1 bf16, fp8
    assert suffixes.count(" [split_warps=8]") == 2  # B1, B64 fp8
    assert suffixes.count(" [net_pivot=off]") == 2  # B1 bf16, fp8
    assert suffixes.count(" [net_pivot_mode=sort]") == 2  # B1 bf16, fp8
    assert suffixes.count(" [net_pivot_mode=rank_cta]") == 2  # B1 bf16, fp8
    assert suffixes.count(" [decode_tma_issue=warps]") == 2  # B1 fp8, nvfp4
    assert suffixes.count(" [q2k copy]") == 2  # B1 bf16, fp8
    assert len(calls) == len(want)
    for call, (case, suffix, kwargs) in zip(calls, want):
        stage, got_name, build, bound, ref = call.args
        assert (stage, got_name, bound) == ("step", bm.step_case_name(*case) + suffix, "memory")
        assert (ref is bm.REF_STEP) == (case == (64, 32 * bm.K, 1, "bf16", "bf16") and not suffix)
        bench.build_step.reset_mock()
        build()  # autospec: build_step's argument list
        assert bench.build_step.call_args.args == case
        assert bench.build_step.call_args.kwargs == kwargs
        extra = call.kwargs["extra"]
        assert {k: extra[k] for k in kwargs} == kwargs


# ---- the decode step's byte floor and replay check ---------------------------------------------

def test_distinct_selected_blocks():
    # 2 kv heads, 2 requests of 2 tokens, topk 3
    q2k = torch.tensor([[[0, 1, -1], [1, 2, -1],      # request 0: {0, 1, 2}
                         [5, -1, -1], [5, -1, -1]],   # request 1: {5}
                        [[0, 3, 4], [0, 3, 4],        # {0, 3, 4}
                         [-1, -1, -1], [2, -1, -1]]], dtype=torch.int32)  # {2}
    assert bm.distinct_selected_blocks(q2k, 2) == 3 + 1 + 3 + 1
    assert bm.distinct_selected_blocks(q2k, 1) == 2 + 2 + 1 + 1 + 3 + 3 + 0 + 1
    assert bm.distinct_selected_blocks(q2k, 4) == 4 + 4  # one request per head
    with pytest.raises(ValueError):
        bm.distinct_selected_blocks(q2k, 3)


@pytest.mark.parametrize("kv_elt,scale", [(2, 0), (1, 0), (1, 64)])
def test_step_floor_m3_batch64(kv_elt, scale):
    # B64 at 32K, one token, 16 distinct blocks per (request, kv head): 4096 blocks of K and V
    b, ctx, hkv = 64, 32 * 1024, 4
    q2k = torch.arange(16, dtype=torch.int32).repeat(hkv, b, 1).contiguous()
    index_k = b * ctx * 128 * 2  # bf16 index-K: 537 MB
    floor = bm.step_floor(q2k, 1, index_k, kv_elt, scale)
    assert floor["distinct_blocks"] == b * hkv * 16
    assert floor["kv_bytes"] == 4096 * 2 * (128 * 128 * kv_elt + scale)
    assert floor["bytes"] == index_k + floor["kv_bytes"]
    if (kv_elt, scale) == (2, 0):
        assert floor["kv_bytes"] == 268_435_456  # docs/design/sparse_attention.md: 268 MB


def test_replay_mismatch():
    out = torch.randn(3, 4).to(torch.bfloat16)
    sel = torch.arange(6, dtype=torch.int32).view(3, 2)
    same = (out.clone(), sel.clone())
    assert bm.replay_mismatch(same, (out.clone(), sel.clone()), (out, sel)) is None
    zero = torch.zeros(2, dtype=torch.bfloat16)
    assert bm.replay_mismatch((zero,), (zero,), (-zero,), names=("z",)) == \
        "z: the second replay differs from the first in 2 bytes"  # -0 == 0, not the same bits
    other = sel.clone()
    other[1, 1] += 1
    assert "selection: a replay differs from the eager step" in bm.replay_mismatch(
        (out, other), (out, sel), (out.clone(), sel.clone()))
    poisoned = (out.clone(), sel.clone())
    bm.poison_outputs(poisoned)
    assert torch.isnan(poisoned[0].float()).all() and (poisoned[1] == -7).all()
    assert "output: the second replay" in bm.replay_mismatch(same, same, poisoned)


# ---- the decode step on the CPU reference ------------------------------------------------------

def make_step(sq, idx="bf16", kv="bf16", b=2, ctx=4096, seed=3, decode_options=None):
    return bm.DecodeStep(msa_ops, b, ctx, sq, bm.STEP_INDEX_DTYPES[idx], bm.STEP_DTYPES[kv],
                         torch.Generator().manual_seed(seed), torch.device("cpu"),
                         decode_options=decode_options)


@pytest.mark.parametrize("sq,idx,kv", [(1, "bf16", "bf16"), (1, "fp8", "fp8"),
                                       (4, "bf16", "fp8"), (4, "fp8", "fp8"),
                                       (1, "nvfp4", "fp8"), (4, "nvfp4", "fp8")])
def test_decode_step_on_cpu(sq, idx, kv):
    b, ctx = 2, 4096
    step = make_step(sq, idx, kv, b, ctx)
    fp4 = idx == "nvfp4"
    assert step.index_fp4 == fp4 and step.k.dtype == bm.STEP_DTYPES[kv]
    if fp4:  # e2m1 codes, two a byte; the scales of every paged index-K row
        assert step.index_k.dtype == torch.uint8
        assert step.index_k.shape == (b * ctx // 128, 1, 128, 64)
        assert step.index_k_scale.numel() == ft.nvfp4_scale_bytes(b * ctx)
        assert step.index_q4.shape == (b * sq, 4, 64)
    else:
        assert step.index_k.dtype == bm.STEP_DTYPES[idx]
        assert step.index_k.shape == (b * ctx // 128, 1, 128, 128)
    assert step.k.shape == step.v.shape == (b * ctx // 128, 4, 128, 128)
    assert sorted(step.page_table.view(-1).tolist()) == list(range(b * ctx // 128))
    out, sel = step()
    assert out.shape == (b * sq, 64, 128) and out.dtype == torch.bfloat16
    assert sel is step.sel and sel.shape == (b * sq, 4, bm.TOPK)
    assert torch.equal(step.q2k, sel.transpose(0, 1))
    mi.check_selection(step.q2k, step.positions, bm.TOPK)
    # The same calls the step makes, without its static buffers.
    if fp4:
        scores = msa_ops.msa_proxy_score_fp4(step.index_q4, step.index_k, step.index_q_scale,
                                             step.index_k_scale, step.index_q_gs, step.index_k_gs,
                                             step.cu_q, None, page_table=step.page_table,
                                             seqused_k=step.seqused)
    else:
        scores = msa_ops.msa_proxy_score(step.index_q, step.index_k, step.cu_q, None,
                                         page_table=step.page_table, seqused_k=step.seqused)
    expect_sel = msa_ops.msa_topk_select(scores, bm.TOPK, step.nvp, force_end_blocks=1)
    assert torch.equal(sel, expect_sel)
    expect = msa_ops.msa_sparse_decode_attention(
        step.q, step.k, step.v, expect_sel.transpose(0, 1).contiguous(),
        page_table=step.page_table, seqused_k=step.seqused, seqlen_q=sq)
    assert torch.equal(out, expect)
    again = bm.clone_outputs(step())
    assert bm.replay_mismatch(again, again, (out, sel)) is None
    # The floor from the selection: brute-force count of distinct blocks per (request, kv head).
    distinct = sum(len({x for x in step.q2k[h, r * sq:(r + 1) * sq].view(-1).tolist() if x >= 0})
                   for h in range(4) for r in range(b))
    floor = step.floor()
    elt = step.k.element_size()
    assert floor["distinct_blocks"] == distinct
    assert floor["index_k_bytes"] == b * ctx * (64 + 8 if fp4 else 128 * step.index_k.element_size())
    assert floor["bytes"] == floor["index_k_bytes"] + distinct * 2 * 128 * 128 * elt
    assert (distinct == b * 4 * 16) if sq == 1 else (b * 4 * 16 <= distinct <= b * 4 * 16 * sq)
    assert step.flop() > 0


def test_decode_step_with_decode_options_on_cpu():
    """The step's [split=cluster] rows pass their plan options to the planned twin of the sparse
    decode (the CPU reference: the same results as the public op)."""
    plain = make_step(1)
    step = make_step(1, decode_options=dict(split="cluster"))
    assert step.decode.keywords == dict(options=dict(split="cluster"))
    got, want = step(), plain()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    bad = make_step(1, decode_options=dict(split="dsmem"))
    with pytest.raises(ValueError, match="split must be auto, blocks or cluster"):
        bad()


class HostGraph:
    """Stands in for a captured CUDA graph on the CPU: replay() runs the step again and copies
    its results into the outputs the capture returned (as a replay writes its static outputs)."""

    def __init__(self, fn, corrupt_replay=None):
        self.fn, self.replays, self.corrupt_replay = fn, 0, corrupt_replay
        self.static = fn()

    def replay(self):
        self.replays += 1
        for s, r in zip(self.static, self.fn()):
            if s is not r:
                s.copy_(r)
        if self.replays == self.corrupt_replay:
            self.static[0].view(-1)[0] += 1


@pytest.fixture
def cpu_bench(monkeypatch):
    """A Bench on the CPU: the ops' reference, the host timer, no-op device synchronisation."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    bench = bm.Bench(bm.parser().parse_args(["--quick"]), msa_ops, torch.device("cpu"))
    bench.timer = Timer("cpu", budget_s=0.0, max_reps=2, min_reps=2)
    bench.ceil["copy_gbs"] = 1000.0
    return bench


def test_stage_step_on_cpu(cpu_bench, monkeypatch):
    graphs = []

    def capture(fn):
        fn()
        graphs.append(HostGraph(fn))
        return graphs[-1], graphs[-1].static
    monkeypatch.setattr(bm, "capture_graph", capture)
    cpu_bench.cfg = dict(cpu_bench.cfg,
                         step=[(2, 1024, 1, "bf16", "bf16"), (2, 1024, 4, "fp8", "fp8"),
                               (2, 1024, 1, "nvfp4", "fp8")])
    cpu_bench.stage_step()
    # Each case, then (batch <= STEP_VARIANT_MAX_BATCH) its [split=cluster] and
    # [combine_loads=after] rows, (bf16 K/V, sq 1) its [split_warps=4] row and (sq 1) its
    # top-k variant rows ([net_pivot=off], the two pivot forms) and [q2k copy] row; the NVFP4
    # indexer's case its proxy variant rows.
    n_topk = len(bm.STEP_TOPK_VARIANTS)
    first = 5 + n_topk  # the first case's rows
    n_fp4 = 1 + len(bm.STEP_PROXY_VARIANTS)
    assert [r["status"] for r in cpu_bench.rows] == ["ok"] * (first + 3 + n_fp4), cpu_bench.rows
    fp4_rows, cpu_bench.rows = cpu_bench.rows[-n_fp4:], cpu_bench.rows[:-n_fp4]
    graphs = graphs[:-n_fp4]
    assert fp4_rows[0]["case"] == bm.step_case_name(2, 1024, 1, "nvfp4", "fp8")
    assert fp4_rows[1]["proxy_options"] == bm.STEP_PROXY_VARIANTS[0][1]
    for row in fp4_rows:  # index-K: 64 bytes of codes and 8 of scales a token
        assert row["bit_identical"] and row["index_k_bytes"] == 2 * 1024 * 72
        assert row["bytes"] == row["index_k_bytes"] + row["kv_bytes"]
    name = bm.step_case_name(2, 1024, 1, "bf16", "bf16")
    assert cpu_bench.rows[1]["case"] == name + " [split=cluster]"
    assert cpu_bench.rows[1]["decode_options"] == dict(split="cluster")
    assert cpu_bench.rows[2]["case"] == name + " [combine_loads=after]"
    assert cpu_bench.rows[2]["decode_options"] == dict(combine_loads="after")
    assert cpu_bench.rows[3]["case"] == name + " [split_warps=4]"
    assert cpu_bench.rows[3]["decode_options"] == dict(split_warps=4)
    for i, (suffix, options) in enumerate(bm.STEP_TOPK_VARIANTS):
        assert cpu_bench.rows[4 + i]["case"] == name + suffix
        assert cpu_bench.rows[4 + i]["topk_options"] == options
        assert "decode_options" not in cpu_bench.rows[4 + i]
    assert cpu_bench.rows[4]["topk_options"] == dict(net_pivot="off")
    copy_row = cpu_bench.rows[4 + n_topk]
    assert copy_row["case"] == name + " [q2k copy]" and copy_row["q2k_copy"]
    assert "decode_options" not in cpu_bench.rows[0] and "topk_options" not in cpu_bench.rows[0]
    cpu_bench.rows = cpu_bench.rows[::first]
    graphs = graphs[::first]
    for row, g in zip(cpu_bench.rows, graphs):
        assert row["stage"] == "step" and row["bound"] == "memory"
        assert row["bit_identical"] and g.replays >= 2 + row["reps"]
        assert row["bytes"] == row["index_k_bytes"] + row["kv_bytes"]
        assert row["floor_us"] == pytest.approx(row["bytes"] / 1e12 * 1e6)
        assert row["pct_ceiling"] == pytest.approx(100 * row["floor_us"] / row["median_us"])
        assert row["eager_over_graph"] == pytest.approx(row["eager_us"] / row["median_us"])
        assert "eager" in row["notes"] and "bit for bit" in row["notes"]
    assert cpu_bench.rows[0]["distinct_blocks"] == 2 * 4 * 8  # ctx 1024: all 8 blocks
    assert cpu_bench.rows[1]["kv_dtype"] == "fp8" and cpu_bench.rows[1]["seqlen_q"] == 4
    assert "| step | B2 ctx=1K sq4 idx-K fp8 K/V fp8 graph |" in cpu_bench.table()


def test_stage_step_replay_mismatch_is_an_error_row(cpu_bench, monkeypatch):
    def capture(fn):
        fn()
        g = HostGraph(fn, corrupt_replay=2)
        return g, g.static
    monkeypatch.setattr(bm, "capture_graph", capture)
    monkeypatch.setattr(bm, "STEP_VARIANTS", ())
    monkeypatch.setattr(bm, "STEP_BF16_VARIANTS", ())
    monkeypatch.setattr(bm, "STEP_TOPK_VARIANTS", ())
    monkeypatch.setattr(bm, "STEP_VARIANT_MAX_BATCH", 0)
    cpu_bench.cfg = dict(cpu_bench.cfg, step=[(1, 512, 1, "bf16", "bf16")])
    cpu_bench.stage_step()
    (row,) = cpu_bench.rows
    assert row["status"] == "error"
    assert "not bit-identical: output: the second replay differs" in row["notes"]


def find_nvcc():
    """nvcc on PATH or in /usr/local/cuda (as scripts/gpu_check.sh finds it), else None."""
    found = shutil.which("nvcc")
    if found is None and Path("/usr/local/cuda/bin/nvcc").exists():
        found = "/usr/local/cuda/bin/nvcc"
    return found


@pytest.mark.cpu_only
@pytest.mark.parametrize("tool", ("kv_stream", "kernel_gap", "l2_partials", "cluster_placement"))
def test_microbenchmarks_compile(tmp_path, tool):
    """benchmarks/micro/kv_stream.cu (docs/benchmarks.md#stream-ceiling), kernel_gap.cu (the
    graph's kernel hand-offs, docs/design/sparse_attention.md#b1-budget), l2_partials.cu
    (partials kept in L2, docs/design/sparse_attention.md#l2-partials) and cluster_placement.cu
    (a cluster's SMs, docs/design/sparse_attention.md#b1-cluster8), gpu_check's MICRO=1 step,
    compile with gpu_check's flags (kv_stream against the library's device headers): a change that
    breaks a tool fails here, not on the GPU machine. Compiled only (-c), not linked."""
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    root = BENCH_DIR.parent
    cmd = [nvcc, "-std=c++20", "-O3", "-arch=sm_90a", f"-I{root / 'csrc'}", f"-I{root / 'include'}",
           "-c", str(BENCH_DIR / "micro" / f"{tool}.cu"), "-o", str(tmp_path / f"{tool}.o")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / f"{tool}.o").stat().st_size > 0


def test_stage_flashinfer_on_cpu(cpu_bench, monkeypatch):
    """The flashinfer stage on small shapes, with flashmsa's own ops standing in for FlashInfer's
    (the same signatures): every case gives FlashInfer's row, then flashmsa's with FlashInfer's
    time as its reference and the two outputs compared (identical here)."""
    monkeypatch.setattr(bm, "FI_DECODE", ((2, 1024, 1), (2, 1024, 4)))
    monkeypatch.setattr(bm, "FI_PROXY_DECODE", ((2, 1024, 1),))
    monkeypatch.setattr(bm, "FI_PROXY_PREFILL", (512,))
    monkeypatch.setattr(bm, "FI_TOPK", (("prefill", 512, 4, 4), ("decode", 4, 4, 32)))
    monkeypatch.setattr(bm, "FI_SPARSE", ((1024, "random"),))
    cpu_bench.stage_flashinfer()  # without --flashinfer: nothing
    assert cpu_bench.rows == []
    cpu_bench.flashinfer = (msa_ops, "stand-in")
    cpu_bench.ceil["matmul_tflops"] = 1.0
    cpu_bench.stage_flashinfer()
    rows = cpu_bench.rows
    assert len(rows) == 2 * 7 and all(r["status"] == "ok" for r in rows), rows
    for fi_row, fm_row in zip(rows[::2], rows[1::2]):
        assert fi_row["stage"] == fm_row["stage"] == "flashinfer"
        assert fi_row["case"].endswith(" [flashinfer stand-in]")
        assert fm_row["case"] == fi_row["case"].replace("[flashinfer stand-in]", "[flashmsa]")
        assert fm_row["ref_ms"] == pytest.approx(fi_row["median_us"] / 1000)
        assert fm_row["speedup_vs_ref"] == pytest.approx(fi_row["median_us"] / fm_row["median_us"])
        assert "vs FlashInfer" in fm_row["notes"]
    for fm_row in rows[1::2]:
        assert ("rel L2 0.0e+00" in fm_row["notes"] or
                "100.00 % of rows select the same blocks" in fm_row["notes"]), fm_row["notes"]
    assert rows[0]["bytes"] > 0 and rows[-1]["flop"] > 0


def test_flashinfer_ref_import_closure(tmp_path):
    """flashinfer_ref.prepare's pruning: the modules a package imports at module level (relative,
    absolute, inside try / if), not those its functions import lazily."""
    fr = load_script("flashinfer_ref")
    pkg = tmp_path / "flashinfer"
    (pkg / "msa_ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import everything\n")
    (pkg / "everything.py").write_text("")
    (pkg / "utils.py").write_text("import os\n")
    (pkg / "lazy.py").write_text("")
    (pkg / "opt.py").write_text("")
    (pkg / "msa_ops" / "__init__.py").write_text(
        "from ..utils import x\nfrom .ops import f\ntry:\n    from flashinfer import opt\n"
        "except ImportError:\n    pass\n")
    (pkg / "msa_ops" / "ops.py").write_text("def f():\n    from .. import lazy\n")
    assert fr.import_closure(tmp_path, ["flashinfer.msa_ops"]) == [
        "flashinfer", "flashinfer.msa_ops", "flashinfer.msa_ops.ops", "flashinfer.opt",
        "flashinfer.utils"]


def test_stage_flashinfer_missing_backend_is_a_skip(cpu_bench, monkeypatch):
    """A FlashInfer route whose backend is not installed (its CuTe DSL kernels: ImportError) is a
    SKIP row; flashmsa's row beside it still runs, without a reference."""
    for name in ("FI_DECODE", "FI_PROXY_DECODE", "FI_PROXY_PREFILL", "FI_TOPK"):
        monkeypatch.setattr(bm, name, ())
    monkeypatch.setattr(bm, "FI_SPARSE", ((1024, "random"),))

    class NoCute:
        def msa_sparse_attention(self, *args, **kwargs):
            raise ModuleNotFoundError("No module named 'cutlass'", name="cutlass")
    cpu_bench.flashinfer = (NoCute(), "stand-in")
    cpu_bench.ceil["matmul_tflops"] = 1.0
    cpu_bench.stage_flashinfer()
    fi_row, fm_row = cpu_bench.rows
    assert fi_row["status"] == "skip" and "not installed (cutlass)" in fi_row["notes"]
    assert fm_row["status"] == "ok" and "ref_ms" not in fm_row


def test_stage_vllm_on_cpu(cpu_bench, monkeypatch):
    """The vllm stage on small shapes, with flashmsa's vLLM adapter standing in for vLLM's op
    modules (the same functions and signatures): every case gives vLLM's row, then flashmsa's with
    vLLM's time as its reference and the outputs compared (identical here)."""
    from flashmsa.integrations import vllm as fv

    monkeypatch.setattr(bm, "VL_INDEX_PREFILL", (512,))
    monkeypatch.setattr(bm, "VL_SPARSE", ((1024, "random"),))
    monkeypatch.setattr(bm, "VL_DECODE", ((2, 1024, 1), (2, 1024, 4)))
    monkeypatch.setattr(bm, "VL_STEP", ((2, 1024, 4),))

    def capture(fn):
        graph = HostGraph(fn)
        return graph, graph.static
    monkeypatch.setattr(bm, "capture_graph", capture)
    cpu_bench.stage_vllm()  # without --vllm: nothing
    assert cpu_bench.rows == []
    cpu_bench.vllm = types.SimpleNamespace(index_topk=fv, sparse_attn=fv, sparse_prefill=fv,
                                           version="stand-in")
    cpu_bench.ceil["matmul_tflops"] = 1.0
    cpu_bench.stage_vllm()
    rows = cpu_bench.rows
    assert len(rows) == 2 * 9 and all(r["status"] == "ok" for r in rows), rows
    assert rows[-3]["case"] == "step eager B2 ctx=1K sq4 bf16 [flashmsa]"
    assert rows[-1]["case"] == "step graph B2 ctx=1K sq4 bf16 [flashmsa]"
    for their_row, fm_row in zip(rows[::2], rows[1::2]):
        assert their_row["stage"] == fm_row["stage"] == "vllm"
        assert their_row["case"].endswith(" [vllm stand-in]")
        assert fm_row["case"] == their_row["case"].replace("[vllm stand-in]", "[flashmsa]")
        assert fm_row["speedup_vs_ref"] == pytest.approx(their_row["median_us"] /
                                                         fm_row["median_us"])
        assert ("vs vLLM: " in fm_row["notes"] and ("rel L2 0.0e+00" in fm_row["notes"] or
                "100.00 % of rows select the same blocks" in fm_row["notes"])), fm_row["notes"]
    assert "100.00 % of rows select the same blocks" in rows[-1]["notes"], rows[-1]["notes"]
    assert rows[0]["flop"] > 0 and rows[3]["bytes"] > 0


def test_stage_sglang_on_cpu(cpu_bench, monkeypatch):
    """The sglang stage on small shapes, with flashmsa's SGLang adapter standing in for SGLang's
    kernels (its indexer functions have their signatures; the attention kernels' are wrapped
    here): every case gives SGLang's row, then flashmsa's with SGLang's time as its reference and
    the outputs compared (identical here)."""
    from flashmsa.integrations import sglang as fs

    monkeypatch.setattr(bm, "SG_INDEX_PREFILL", (512,))
    monkeypatch.setattr(bm, "SG_SPARSE", ((1024, "random"),))
    monkeypatch.setattr(bm, "SG_DECODE", ((2, 1024),))
    monkeypatch.setattr(bm, "SG_STEP", ((2, 1024),))

    def capture(fn):
        graph = HostGraph(fn)
        return graph, graph.static
    monkeypatch.setattr(bm, "capture_graph", capture)
    cpu_bench.stage_sglang()  # without --sglang: nothing
    assert cpu_bench.rows == []

    def prefill_attn(q, k, v, sink, r2t, slots, sel, bsq, bsk, cu, lens, pre, max_q, sm_scale=None):
        return fs.msa_sparse_prefill_main(q, k, v, sel, r2t, slots, cu, lens, pre, bsk, sm_scale)

    def decode_attn(q, sink, k, v, r2t, lens, slots, block, sel, sm_scale=None, page_size=0):
        return fs.msa_sparse_decode_main(q, k, v, sel, r2t, slots, lens, block, sm_scale)
    cpu_bench.sglang = types.SimpleNamespace(
        prefill_index=fs, decode_index=fs, version="stand-in",
        prefill_attn=types.SimpleNamespace(flash_prefill_with_gqa_share_sparse=prefill_attn),
        decode_attn=types.SimpleNamespace(flash_decode_with_gqa_share_sparse=decode_attn))
    cpu_bench.ceil["matmul_tflops"] = 1.0
    cpu_bench.stage_sglang()
    rows = cpu_bench.rows
    assert len(rows) == 2 * 7 and all(r["status"] == "ok" for r in rows), rows
    assert rows[-1]["case"] == "step graph B2 ctx=1K bf16 [flashmsa]"
    assert rows[7]["case"] == "index decode B2 ctx=1K bf16, forward plan [flashmsa]"
    for their_row, fm_row in zip(rows[::2], rows[1::2]):
        assert their_row["stage"] == fm_row["stage"] == "sglang"
        assert fm_row["case"] == their_row["case"].replace("[sglang stand-in]", "[flashmsa]")
        assert ("vs SGLang: " in fm_row["notes"] and ("rel L2 0.0e+00" in fm_row["notes"] or
                "100.00 % of rows select the same blocks" in fm_row["notes"])), fm_row["notes"]
    assert "100.00 % of rows select the same blocks" in rows[-1]["notes"], rows[-1]["notes"]
    assert rows[0]["flop"] > 0 and rows[5]["bytes"] > 0


def test_sglang_ref_stand_ins(tmp_path):
    """sglang_ref's stand-in sglang package around the kernel files: load() imports them with it;
    its platform answers as SGLang's on this machine, its probes as on an NVIDIA GPU, its flags
    with SGLang's defaults unless the environment sets them."""
    sr = load_script("sglang_ref")
    site = tmp_path / "site"
    for key, module in sr.OPS.items():
        path = site / (module.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("from sglang.srt.runtime_context import get_platform\n"
                        "from sglang.srt.utils import is_gfx95_supported, is_xpu\n"
                        "from sglang.srt.environ import envs\n"
                        f"NAME = {key!r}\n"
                        "SM90 = get_platform().is_sm90\n"
                        "AMD = is_gfx95_supported() or is_xpu()\n"
                        "RADIX = envs.SGLANG_OPT_USE_MINIMAX_DECODE_TOPK_RADIX.get()\n"
                        "OTHER = envs.SGLANG_SOMETHING_ELSE.get()\n")
    sr.write_stand_ins(site, "9.9.9")
    code = (f"import sys, torch; sys.path.insert(0, {str(BENCH_DIR)!r}); import sglang_ref; "
            f"r = sglang_ref.load({str(tmp_path)!r}); "
            "cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None; "
            "m = r.decode_index; "
            "assert r.version == '9.9.9' and m.NAME == 'decode_index'; "
            "assert m.SM90 == (cap is not None and cap[0] == 9) and not m.AMD; "
            "assert m.RADIX is False and m.OTHER is False; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "SGLANG_OPT_USE_MINIMAX_DECODE_TOPK_RADIX": "0"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    done = subprocess.run([sys.executable, "-c", code.replace("m.RADIX is False", "m.RADIX")],
                          capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items()
                               if k != "SGLANG_OPT_USE_MINIMAX_DECODE_TOPK_RADIX"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    with pytest.raises(FileNotFoundError, match="sglang_ref.py prepare"):
        sr.load(tmp_path / "missing")


def test_vllm_ref_stand_ins(tmp_path):
    """vllm_ref's stand-in vllm package around the op modules: load() imports them with it, and its
    current_platform answers as vLLM's CUDA platform does (here: no CUDA device, or the device's)."""
    vr = load_script("vllm_ref")
    site = tmp_path / "site"
    for key, module in vr.OPS.items():
        path = site / (module.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("from vllm.platforms import current_platform\n"
                        "from vllm.triton_utils import tl, triton\n"
                        f"NAME = {key!r}\n"
                        "PDL = current_platform.is_arch_support_pdl()\n"
                        "HOPPER = current_platform.is_device_capability_family(90)\n")
    vr.write_stand_ins(site, "9.9.9")
    code = (f"import sys, torch; sys.path.insert(0, {str(BENCH_DIR)!r}); import vllm_ref; "
            f"r = vllm_ref.load({str(tmp_path)!r}); "
            "cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None; "
            "assert r.version == '9.9.9' and r.index_topk.NAME == 'index_topk'; "
            "assert r.sparse_prefill.HOPPER == (cap is not None and cap[0] == 9); "
            "assert r.sparse_attn.PDL == (cap is not None and cap[0] >= 9); print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    with pytest.raises(FileNotFoundError, match="vllm_ref.py prepare"):
        vr.load(tmp_path / "missing")


def test_host_python_measures_valid_calls(capsys):
    """host_python's calls are calls the core accepts (run for real here, on the CPU reference),
    so the stubbed timing measures the path an engine's call takes, not an error path; the native
    ops come back after the measurement."""
    host_python = load_script("host_python")
    for name, fn in host_python.calls():
        result = fn()
        assert result is not None, name
    before = {n: getattr(msa_ops._ops, n) for n in host_python._NATIVE}
    assert host_python.main(["--calls", "3", "--repeat", "1", "--json"]) == 0
    times = json.loads(capsys.readouterr().out)
    assert set(times) == {"control: torch add_"} | {n for n, _ in host_python.calls()}
    assert all(us > 0 for us in times.values())
    assert {n: getattr(msa_ops._ops, n) for n in host_python._NATIVE} == before
