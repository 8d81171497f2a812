"""Runs one benchmark case once between cudaProfilerStart / Stop, for Nsight Compute.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \\
        python3 benchmarks/profile_msa.py --case proxy_decode_b64

The case is built exactly as benchmarks/bench_msa.py builds it (same shapes, data and
selections), run twice to warm up (plans, allocator, shared-memory opt-in), then once under the
profiler: ncu reports every kernel of that one call. scripts/gpu_check.sh runs this for each case
named in PROFILE=... and keeps ncu's report in $OUT/profile.log. --list prints the case names.
"""
from __future__ import annotations

import argparse
import sys

import torch

import bench_msa as bm  # the script's own directory: run as python3 benchmarks/profile_msa.py

K = bm.K


def cases(bench: bm.Bench) -> dict:
    """name -> build: build() -> (fn, info) as in bench_msa (with the plan options the case names;
    sparse cases under the library's own plan)."""
    def sparse(pattern, kv="bf16", layout="flat", options=None):
        return lambda: bench.build_sparse(32 * K, kv, layout, pattern, bm.M3, options)
    return {
        "proxy_prefill_32k": lambda: bench.build_proxy_prefill(32 * K, dict(kernel="mma_sync")),
        "proxy_prefill_32k_sm90": lambda: bench.build_proxy_prefill(32 * K, dict(kernel="sm90_only")),
        "proxy_prefill_32k_sm90_fp8": lambda: bench.build_proxy_prefill(32 * K, dict(kernel="sm90_only"),
                                                                        fmt="fp8"),
        "proxy_prefill_32k_sm90_fp8_f16": lambda: bench.build_proxy_prefill(
            32 * K, dict(kernel="sm90_f16_only"), fmt="fp8"),
        "proxy_prefill_32k_sm90_nvfp4_f16": lambda: bench.build_proxy_prefill(
            32 * K, dict(kernel="sm90_f16_only"), fmt="nvfp4"),
        # fp8 q and K on the sm_90a kernel (Q's fragments converted in registers).
        "proxy_prefill_32k_sm90_fp8q_f16": lambda: bench.build_proxy_prefill(
            32 * K, dict(kernel="sm90_f16_only"), fmt="fp8q"),
        "proxy_prefill_32k_sm90_ss": lambda: bench.build_proxy_prefill(32 * K,
                                                                       dict(kernel="sm90_ss_only")),
        "proxy_decode_b64": lambda: bench.build_proxy_decode(64, 32 * K, 1),
        # The B1 / 128K decode step's proxy call (1024 blocks of bf16 index-K over 264 CTAs).
        "proxy_decode_b1_128k": lambda: bench.build_proxy_decode(1, 128 * K, 1),
        # ... with fp8 index-K and with the NVFP4 indexer (the step's two faster forms: at batch 1
        # the NVFP4 one is the slower in the graph, docs/design/sparse_attention.md#step-nvfp4-index).
        "proxy_decode_b1_128k_fp8": lambda: bench.build_proxy_decode(1, 128 * K, 1, k_fp8=True),
        "proxy_decode_b1_128k_nvfp4": lambda: bench.build_proxy_decode(1, 128 * K, 1, fp4=True),
        "proxy_decode_b64_decode": lambda: bench.build_proxy_decode(
            64, 32 * K, 1, options=dict(kernel="decode_only")),
        "proxy_decode_b64_fp8_decode": lambda: bench.build_proxy_decode(
            64, 32 * K, 1, k_fp8=True, options=dict(kernel="decode_only")),
        "proxy_decode_b64_fp8_decode_f16": lambda: bench.build_proxy_decode(
            64, 32 * K, 1, k_fp8=True, options=dict(kernel="decode_f16_only")),
        "proxy_decode_b64_fp8_ctas3": lambda: bench.build_proxy_decode(
            64, 32 * K, 1, k_fp8=True, options=dict(decode_ctas=3)),
        "proxy_decode_b64_nvfp4_decode": lambda: bench.build_proxy_decode(
            64, 32 * K, 1, fp4=True, options=dict(kernel="decode_only", decode_nvfp4="cta")),
        # One / two key blocks per decode-kernel iteration (plan option decode_ilp; auto: 2 for fp8
        # K, 1 otherwise), auto otherwise (fp8: fp16 MMAs, 3 CTAs per SM; NVFP4: 4): against the
        # fp8 / NVFP4 defaults.
        "proxy_decode_b64_fp8_ilp1": lambda: bench.build_proxy_decode(
            64, 32 * K, 1, k_fp8=True, options=dict(decode_ilp=1)),
        "proxy_decode_b64_nvfp4_ilp2": lambda: bench.build_proxy_decode(
            64, 32 * K, 1, fp4=True, options=dict(decode_ilp=2, decode_nvfp4="cta")),
        # NVFP4 index-K converted a byte (2 codes) at a time (plan option nvfp4_cvt=byte; auto:
        # a word of 8 codes since 27436c2), auto otherwise: against proxy_decode_b64_nvfp4_decode.
        "proxy_decode_b64_nvfp4_byte": lambda: bench.build_proxy_decode(
            64, 32 * K, 1, fp4=True, options=dict(nvfp4_cvt="byte", decode_nvfp4="cta")),
        # NVFP4 index-K through TMA, a warp per key block (plan option decode_nvfp4=tma; auto's
        # since 900266d), against proxy_decode_b64_nvfp4_decode (the cp.async ring, forced; the
        # NVFP4 cases above pin it too).
        "proxy_decode_b64_nvfp4_tma": lambda: bench.build_proxy_decode(
            64, 32 * K, 1, fp4=True, options=dict(decode_nvfp4="tma")),
        # The same with a producer warp issuing the loads (decode_tma_issue=producer; auto: each
        # consumer warp for itself since 9738086).
        "proxy_decode_b64_nvfp4_tma_producer": lambda: bench.build_proxy_decode(
            64, 32 * K, 1, fp4=True, options=dict(decode_nvfp4="tma", decode_tma_issue="producer")),
        # fp8 index-K through TMA, a warp per key block (plan option decode_fp8=tma; auto: the
        # cp.async ring), auto otherwise: against proxy_decode_b64_fp8_ctas3 (the fp8 default).
        "proxy_decode_b64_fp8_tma": lambda: bench.build_proxy_decode(
            64, 32 * K, 1, k_fp8=True, options=dict(decode_fp8="tma")),
        # MTP 4 tokens (G 4 x 4 = 16 columns): decode_fp8=tma's 16-column pass (each converted K
        # fragment into two MMAs; forced only) against proxy_decode_b64_sq4_fp8 (auto: the cp.async
        # ring, one 16-row pass).
        "proxy_decode_b64_sq4_fp8_tma": lambda: bench.build_proxy_decode(
            64, 32 * K, 4, k_fp8=True, options=dict(decode_fp8="tma")),
        "proxy_decode_b64_sq4_fp8": lambda: bench.build_proxy_decode(64, 32 * K, 4, k_fp8=True),
        "index_decode_b64": lambda: bench.build_proxy_decode(64, 32 * K, 1, with_topk=True),
        "topk_prefill_32k": lambda: bench.build_topk(32 * K),
        "topk_prefill_32k_radix": lambda: bench.build_topk(32 * K, dict(kernel="radix")),
        "topk_prefill_128k_radix": lambda: bench.build_topk(128 * K, dict(kernel="radix")),
        # The radix kernel's lean variant (docs/design/topk_select.md, "Lean variants").
        "topk_prefill_32k_radix_1buf": lambda: bench.build_topk(32 * K, dict(kernel="radix_1buf")),
        "topk_prefill_128k_radix_1buf": lambda: bench.build_topk(128 * K,
                                                                 dict(kernel="radix_1buf")),
        # radix_1buf with branch-free passes of warp-uniform trip counts ("Uniform passes").
        "topk_prefill_32k_radix_uniform": lambda: bench.build_topk(32 * K,
                                                                   dict(kernel="radix_uniform")),
        "topk_prefill_128k_radix_uniform": lambda: bench.build_topk(128 * K,
                                                                    dict(kernel="radix_uniform")),
        "topk_prefill_32k_net": lambda: bench.build_topk(32 * K, dict(kernel="net")),
        "topk_prefill_128k_net": lambda: bench.build_topk(128 * K, dict(kernel="net")),
        "topk_decode_warp8": lambda: bench.build_topk_decode(*bm.TOPK_DECODE,
                                                             dict(kernel="warp_per_row_8")),
        # The B1 / 128K decode step's top-k (1 token x 4 heads x 1024 blocks): today's kernel and
        # split rows (docs/design/topk_select.md, "Split rows").
        "topk_decode_b1_128k_warp8": lambda: bench.build_topk_decode(1, 4, 1024,
                                                                     dict(kernel="warp_per_row_8")),
        "topk_decode_b1_128k_warp_split": lambda: bench.build_topk_decode(
            1, 4, 1024, dict(kernel="warp_split")),
        "topk_decode_warp_split": lambda: bench.build_topk_decode(*bm.TOPK_DECODE,
                                                                  dict(kernel="warp_split")),
        # Split rows with one-chunk rows' thresholds by 8-bit digits (docs/design/topk_select.md,
        # "Digit rows"): the decode call (one warp a CTA) and B1 / 128K (as warp_split).
        "topk_decode_warp_digits": lambda: bench.build_topk_decode(*bm.TOPK_DECODE,
                                                                   dict(kernel="warp_digits")),
        "topk_decode_b1_128k_warp_digits": lambda: bench.build_topk_decode(
            1, 4, 1024, dict(kernel="warp_digits")),
        # Sorting networks (docs/design/topk_select.md, "Sorting networks"): the decode calls (16
        # and 32 lanes a row).
        "topk_decode_net": lambda: bench.build_topk_decode(*bm.TOPK_DECODE, dict(kernel="net")),
        "topk_decode_b1_128k_net": lambda: bench.build_topk_decode(1, 4, 1024, dict(kernel="net")),
        # ... with the pivot before the networks (net_pivot=on, auto's there since dda49c5) and
        # without it (net_pivot=off).
        "topk_decode_net_pivot": lambda: bench.build_topk_decode(*bm.TOPK_DECODE, dict(net_pivot="on")),
        "topk_decode_b1_128k_net_pivot": lambda: bench.build_topk_decode(1, 4, 1024, dict(net_pivot="on")),
        "topk_decode_b1_128k_net_off": lambda: bench.build_topk_decode(1, 4, 1024, dict(kernel="net", net_pivot="off")),
        # ... the pivot's form: auto's (the cases above) is a CTA of 4 warps a row counting at
        # B1 / 128K (rows of more than 256 blocks) and a warp a row sorting at 256 blocks; each
        # forced (net_pivot_mode; docs/design/topk_select.md, "Counting instead of sorting").
        "topk_decode_b1_128k_sort": lambda: bench.build_topk_decode(1, 4, 1024, dict(net_pivot_mode="sort")),
        "topk_decode_rank_cta": lambda: bench.build_topk_decode(*bm.TOPK_DECODE, dict(net_pivot_mode="rank_cta")),
        "sparse_random_32k": sparse("random"),
        "sparse_clustered_32k": sparse("clustered"),
        "sparse_pipeline_32k": sparse("pipeline"),
        "sparse_fp8_paged_clustered_32k": sparse("clustered", "fp8", "paged"),
        # The whole 8K prefill (proxy, top-k, q2k transpose, attention): every kernel of one call.
        "pipeline_8k": lambda: bench.build_pipeline(8 * K, bm.M3),
        "pipeline_128k": lambda: bench.build_pipeline(128 * K, bm.M3),
        # The cp.async tile kernel (plan option tile_kernel=cp_async; the clustered cases above
        # run the default TMA one).
        "sparse_clustered_32k_cp_async": sparse("clustered", options=dict(tile_kernel="cp_async")),
        "sparse_paged_clustered_32k_cp_async": sparse("clustered", "bf16", "paged",
                                                      dict(tile_kernel="cp_async")),
        # Each KV-major launch group's work lists built before it (plan option lists=per_group;
        # the default builds them all at once).
        "sparse_random_32k_per_group": sparse("random", options=dict(lists="per_group")),
        # The KV-major TMA kernel (plan option kv_major_kernel=tma, off by default; the auto
        # schedule, so that its KV-major part runs it): docs/design/sparse_attention.md#kv-major-tma.
        "sparse_random_32k_kv_tma": sparse("random", options=dict(kv_major_kernel="tma")),
        "decode_b1": lambda: bench.build_decode(1, 32 * K, 1, "bf16"),
        # Batch 1 with the splits of a row as one cluster merging in distributed shared memory
        # (split=cluster): one kernel instead of attention + combine; on 8 warps, one CTA per SM,
        # where that kernel applies (docs/design/sparse_attention.md#b1-cluster8), and the 4-warp
        # cluster kernel (split_warps=4) beside it.
        "decode_b1_split_cluster": lambda: bench.build_decode(1, 32 * K, 1, "bf16", dict(split="cluster")),
        "decode_b1_fp8_split_cluster": lambda: bench.build_decode(1, 32 * K, 1, "fp8", dict(split="cluster")),
        "decode_b1_128k_fp8_split_cluster": lambda: bench.build_decode(1, 128 * K, 1, "fp8", dict(split="cluster")),
        "decode_b1_128k_fp8": lambda: bench.build_decode(1, 128 * K, 1, "fp8"),
        "decode_b1_fp8_split_cluster_w4": lambda: bench.build_decode(1, 32 * K, 1, "fp8",
                                                                     dict(split="cluster", split_warps=4)),
        # Batch 1 split-K with 8 warps per CTA sharing each block (split_warps=8), at 32K and 128K.
        "decode_b1_split_warps8": lambda: bench.build_decode(1, 32 * K, 1, "bf16", dict(split_warps=8)),
        "decode_b1_128k_split_warps8": lambda: bench.build_decode(1, 128 * K, 1, "bf16", dict(split_warps=8)),
        "decode_b1_128k": lambda: bench.build_decode(1, 128 * K, 1, "bf16"),
        # ... its combine loading the partial values with the LSEs (combine_loads=with, auto's since
        # dda49c5) and after them (combine_loads=after).
        "decode_b1_128k_combine_with": lambda: bench.build_decode(1, 128 * K, 1, "bf16",
                                                                  dict(combine_loads="with")),
        "decode_b1_128k_combine_after": lambda: bench.build_decode(1, 128 * K, 1, "bf16",
                                                                   dict(combine_loads="after")),
        "decode_b64": lambda: bench.build_decode(64, 32 * K, 1, "bf16"),
        "decode_b64_sq4": lambda: bench.build_decode(64, 32 * K, 4, "bf16"),
        "decode_b64_fp8": lambda: bench.build_decode(64, 32 * K, 1, "fp8"),
        "decode_b64_nvfp4": lambda: bench.build_decode(64, 32 * K, 1, "nvfp4"),
        # The decode variants forced (decode plan options kernel / mtp).
        "decode_b64_regs": lambda: bench.build_decode(64, 32 * K, 1, "bf16", dict(kernel="regs")),
        "decode_b64_fp8_smem": lambda: bench.build_decode(64, 32 * K, 1, "fp8", dict(kernel="smem")),
        "decode_b64_fp8_regs": lambda: bench.build_decode(64, 32 * K, 1, "fp8", dict(kernel="regs")),
        # ... with its stages filled by TMA (regs_feed=tma; off by default).
        "decode_b64_fp8_regs_tma": lambda: bench.build_decode(64, 32 * K, 1, "fp8",
                                                              dict(kernel="regs", regs_feed="tma")),
        # NVFP4 K/V converted a byte at a time (nvfp4_cvt=byte; auto: word since f4fdc62).
        "decode_b64_nvfp4_byte": lambda: bench.build_decode(64, 32 * K, 1, "nvfp4",
                                                            dict(kernel="regs", nvfp4_cvt="byte")),
        "decode_b64_sq4_union": lambda: bench.build_decode(64, 32 * K, 4, "bf16", dict(mtp="union")),
        "decode_b64_sq4_fp8_union": lambda: bench.build_decode(64, 32 * K, 4, "fp8",
                                                               dict(mtp="union")),
        "decode_b64_sq4_fp8_union_regs": lambda: bench.build_decode(
            64, 32 * K, 4, "fp8", dict(kernel="regs", mtp="union")),
        # fp8 union items where per-token items win (B1, B32: H200 at 4a4ffcb, 35.8 / 65.9 us
        # union against 18.0 / 63.7 per token), and auto's per-token items at B1.
        "decode_b1_sq4_fp8_union": lambda: bench.build_decode(1, 32 * K, 4, "fp8", dict(mtp="union")),
        "decode_b32_sq4_fp8_union": lambda: bench.build_decode(32, 32 * K, 4, "fp8", dict(mtp="union")),
        "decode_b1_sq4_fp8": lambda: bench.build_decode(1, 32 * K, 4, "fp8"),
        # bf16 union items on the sm_90a TMA + wgmma kernel (kernel=wgmma; its pipe auto: ahead).
        "decode_b64_sq4_wgmma": lambda: bench.build_decode(64, 32 * K, 4, "bf16", dict(kernel="wgmma")),
        # The same with one producer warp planning each item inline (wgmma_pipe=inline), and with
        # the planner warp ahead of the loader warp named (wgmma_pipe=ahead).
        "decode_b64_sq4_wgmma_inline": lambda: bench.build_decode(
            64, 32 * K, 4, "bf16", dict(kernel="wgmma", wgmma_pipe="inline")),
        "decode_b64_sq4_wgmma_ahead": lambda: bench.build_decode(
            64, 32 * K, 4, "bf16", dict(kernel="wgmma", wgmma_pipe="ahead")),
        # fp8 K/V on the wgmma kernel (wgmma_fp8=on: raw TMA copies, four converter warps).
        "decode_b64_sq4_fp8_wgmma": lambda: bench.build_decode(
            64, 32 * K, 4, "fp8", dict(kernel="wgmma", wgmma_fp8="on")),
        # The decode step captured in one CUDA graph (bench_msa stage step): one replay, every
        # kernel node of the graph profiled.
        "step_b64": lambda: bench.build_step(64, 32 * K, 1),
        "step_b64_fp8": lambda: bench.build_step(64, 32 * K, 1, "fp8", "fp8"),
        "step_b1_128k": lambda: bench.build_step(1, 128 * K, 1),
        "step_b1_128k_split_cluster": lambda: bench.build_step(1, 128 * K, 1,
                                                               decode_options=dict(split="cluster")),
    }


def make_bench(ops, device) -> "bm.Bench":
    """The benchmark whose builders the cases call: bench_msa's quick configuration, its defaults."""
    return bm.Bench(bm.parser().parse_args(["--quick"]), ops, device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", help="the case to run (see --list)")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    ap.add_argument("--kernel-times", action="store_true",
                    help="instead of one call for Nsight Compute, print torch.profiler's time per kernel "
                         "(summed over one call, averaged over 3, after warm-up): where a case's time goes")
    args = ap.parse_args(argv)
    if args.list:
        # Names only: no device needed.
        print("\n".join(cases(None)))  # type: ignore[arg-type]
        return 0
    if not torch.cuda.is_available():
        print("profile_msa: no CUDA device", file=sys.stderr)
        return 2
    from flashmsa import msa_ops

    device = torch.device("cuda", torch.cuda.current_device())
    bench = make_bench(msa_ops, device)
    table = cases(bench)
    if args.case not in table:
        ap.error(f"unknown case {args.case!r}; choose from {', '.join(table)}")
    fn, _ = table[args.case]()
    if args.kernel_times:
        from profile_stages import profile as kernel_times  # the same directory

        kernel_times(args.case, fn)
        return 0
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profile_msa: {args.case} ran once under the profiler", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
