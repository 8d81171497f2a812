"""Per-kernel time breakdown of the M3 sparse attention (prefill 32K, decode B64) for each schedule.

    python benchmarks/profile_stages.py [--seq 32768] [--only prefill|decode]
    python benchmarks/profile_stages.py --sweep pipeline:8192:default,3.0,3.5 --sweep random:32768:1.5
    python benchmarks/profile_stages.py --sweep pipeline:131072:default,kv_major_kernel=tma+chunk_rows=8058
    python benchmarks/profile_stages.py --timeline 1/128K,1/128K/1/fp8,64/32K

--sweep KIND:TOKENS:W,... (repeatable) instead prints the kernel totals of bench_msa's M3 builders
(KIND pipeline: proxy -> top-k -> sparse attention; random: the sparse attention on random
selections, bf16, flat), one per point W of the list: "default" (the library's own plan), a number
(the sparse attention's plan option tile_max_waste forced to it: how the tile kernel's waste bound
was tuned), or plan options KEY=VALUE joined by "+" (e.g. chunk_rows=8058+kv_major_kernel=tma;
an unknown option or value is the op's own ValueError when the point runs).

Prints torch.profiler's CUDA time per kernel (summed over one call after warm-up), so the share of
list building, the main kernels and the combine is visible. Used to direct kernel work; the numbers
of record come from bench_msa.py.

--host ITEMS (e.g. 8K,32K,1/32K,64/32K/1/fp8) prints the host time per call of each op of the M3
pipeline at a prefill size (proxy, top-k, the selection's transpose, sparse attention) or of bench_msa's
eager decode step at a step case B/CTX[/SQ[/IDX[/KV]]] (proxy, top-k, sparse decode, the whole
step): from the call to its return, median of 20 calls, with the GPU idle before each call and
with the 20 calls back to back behind one long GPU spin (steady: an engine's host running ahead of
its GPU); then, per op, torch.profiler's CPU records of the call (CUDA runtime calls, ATen ops),
and the same two times for a trivial torch op (control): what an eager caller pays on the CPU
besides the kernels.

--timeline B/CTX[/SQ[/IDX[/KV]]],... (bench_msa's --steps cases) instead replays the captured
decode step (bench_msa's build_step: proxy -> top-k -> sparse decode in one CUDA graph) with L2
flushed before each replay, as bench_msa times it, and prints each kernel's start, duration and the
gap before it inside the graph (medians over the replays, from torch.profiler's kernel records):
where a latency-bound step's time goes between and inside its kernels, without Nsight Compute's
per-kernel cache flushes and serialization.
"""
import argparse

import torch

import flashmsa.msa_ops as msa_ops
from flashmsa.testing import inputs as msa_inputs


def span_text(kernels, reps):
    """How a call's kernels fill the GPU: "; X ms on the GPU from its first kernel's start to its last
    one's end, Y ms of it between kernels (largest gaps: ...)" from the (start_us, end_us, name)
    records of `reps` calls run one after another with a synchronization between them (medians, as
    replay_timeline); "" where the records do not split into equal calls."""
    try:
        rows, span = replay_timeline(kernels, reps)
    except ValueError:
        return ""
    idle = sum(r[3] for r in rows)
    worst = sorted((r for r in rows if r[3] > 0), key=lambda r: -r[3])[:3]
    gaps = ", ".join(f"{r[3]:.1f} us before {r[0][:40]}" for r in worst)
    return (f"; {span / 1000:.3f} ms on the GPU from the call's first kernel start to its last kernel end, "
            f"{idle / 1000:.3f} ms of it between {len(rows) - 1} kernel hand-offs"
            + (f" (largest: {gaps})" if gaps else ""))


def profile(label, fn, reps=3):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
            torch.cuda.synchronize()  # calls apart, so that each one's span and gaps are its own
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((t / reps, e.count // reps, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"\n## {label}: {total / 1000:.3f} ms of kernels per call{span_text(cuda_kernels(prof), reps)}")
    for t, n, name in rows[:12]:
        print(f"  {t / 1000:9.3f} ms  x{n:<4d} {name[:110]}")


def sweep_point(spec, w):
    """The plan options of one sweep point W (None for "default"); ValueError naming the spec."""
    if w == "default":
        return None
    if "=" not in w:
        try:
            bound = float(w)
        except ValueError:
            bound = 0.0
        if not 1.0 <= bound <= 8.0:
            raise ValueError(f"--sweep {spec!r}: point {w!r} is not default, a bound from 1 to 8 or "
                             "KEY=VALUE+...")
        return dict(tile_max_waste=bound)
    options = {}
    for item in w.split("+"):
        key, eq, value = item.partition("=")
        if not eq or not key or not value or key in options:
            raise ValueError(f"--sweep {spec!r}: point {w!r} is not KEY=VALUE+... with each key once")
        for kind in (int, float):
            try:
                options[key] = kind(value)
                break
            except ValueError:
                continue
        else:
            options[key] = value
    return options


def sweep_cases(bench, specs):
    """(label, build) per point of each --sweep spec KIND:TOKENS:W,...; build() returns the call
    (bench_msa's builder with the point's plan options, None for "default"). Raises ValueError
    naming a malformed spec before anything is built."""
    import bench_msa as bm  # the same directory

    builders = {"pipeline": lambda s, o: bench.build_pipeline(s, bm.M3, o)[0],
                "random": lambda s, o: bench.build_sparse(s, "bf16", "flat", "random", bm.M3, o)[0]}
    out = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 3 or parts[0] not in builders or not parts[1].isdigit() or not parts[2]:
            raise ValueError(f"--sweep {spec!r}: expected KIND:TOKENS:W,... with KIND pipeline or "
                             "random, TOKENS a number, W default, a bound from 1 to 8 or KEY=VALUE+...")
        kind, s = parts[0], int(parts[1])
        for w in parts[2].split(","):
            options = sweep_point(spec, w)
            label = f"tile_max_waste={w}" if options is None or "=" not in w else w
            out.append((f"[sweep] {kind} {s} {label}",
                        lambda build=builders[kind], s=s, o=options: build(s, o)))
    return out


def sweep(specs):
    from profile_msa import make_bench  # the same directory

    bench = make_bench(msa_ops, torch.device("cuda", torch.cuda.current_device()))
    for label, build in sweep_cases(bench, specs):
        profile(label, build())
        torch.cuda.empty_cache()


def replay_timeline(kernels, reps):
    """Per kernel position of one replay: (name, start, duration, gap before it) in us, medians over
    the replays, and the median replay span (first start to last end). kernels: (start_us, end_us,
    name) of every kernel of `reps` replays of the same graph, in any order; each replay runs the
    same kernels in the same order. ValueError when the records do not split into `reps` equal
    replays of the same kernel names."""
    import statistics

    ks = sorted(kernels)
    if reps <= 0 or not ks or len(ks) % reps:
        raise ValueError(f"{len(ks)} kernel records do not split into {reps} replays")
    n = len(ks) // reps
    runs = [ks[i * n:(i + 1) * n] for i in range(reps)]
    names = [k[2] for k in runs[0]]
    if any([k[2] for k in run] != names for run in runs):
        raise ValueError("the replays ran different kernels (or overlapped)")
    rows = []
    for i, name in enumerate(names):
        start = statistics.median(run[i][0] - run[0][0] for run in runs)
        dur = statistics.median(run[i][1] - run[i][0] for run in runs)
        gap = statistics.median(run[i][0] - (run[i - 1][1] if i else run[0][0]) for run in runs)
        rows.append((name, start, dur, gap))
    span = statistics.median(max(k[1] for k in run) - run[0][0] for run in runs)
    return rows, span


def cuda_kernels(prof):
    """(start_us, end_us, name) of every CUDA kernel record of a torch.profiler run."""
    return [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]


def parse_plan_options(text: str) -> dict:
    """Plan options "NAME=VALUE,..." as a dict ({} for an empty text)."""
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"expected NAME=VALUE: {part}")
        out[name] = value
    return out


def timeline(cases, reps=20, proxy_options=None, topk_options=None, decode_options=None):
    from profile_msa import make_bench  # the same directory

    bench = make_bench(msa_ops, torch.device("cuda", torch.cuda.current_device()))
    # The L2 flush's own kernels (outside the graph), by name, to leave out of the replays' records.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        bench.timer.flush()
        torch.cuda.synchronize()
    flush_names = {k[2] for k in cuda_kernels(prof)}
    for b, ctx, sq, idx, kv in cases:
        graphed, _ = bench.build_step(b, ctx, sq, idx, kv, decode_options=decode_options or None,
                                      topk_options=topk_options or None, proxy_options=proxy_options or None)
        for _ in range(3):
            graphed()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                bench.timer.flush()
                torch.cuda.synchronize()
                graphed()
                torch.cuda.synchronize()
        rows, span = replay_timeline([k for k in cuda_kernels(prof) if k[2] not in flush_names], reps)
        opts = "".join(f" [{k}: {v}]" for k, v in (("proxy", proxy_options), ("topk", topk_options),
                                                     ("decode", decode_options)) if v)
        print(f"\n## timeline B{b} ctx={ctx} sq{sq} idx-K {idx} K/V {kv}{opts}: {span:.1f} us from the first "
              f"kernel's start to the last one's end (median of {reps} replays, L2 flushed before each)")
        print(f"  {'start':>8} {'gap':>6} {'kernel':>8}  name")
        for name, start, dur, gap in rows:
            print(f"  {start:8.2f} {gap:6.2f} {dur:8.2f}  {name[:100]}")
        torch.cuda.empty_cache()


def host_ops(bench, s):
    """(name, fn) of the ops of bench_msa's M3 pipeline at s tokens, in its order (the same inputs
    and arguments as build_pipeline)."""
    import math

    import bench_msa as bm  # the same directory

    geo = bm.M3
    iq, ik, cu, nvp = bench.index_inputs(s, geo)
    g = bench.gen()
    q = bench.rnd((s, geo["hq"], 128), g)
    k, v = bench.rnd((s, geo["hkv"], 128), g), bench.rnd((s, geo["hkv"], 128), g)
    p = math.ceil(s / 128)
    scores = torch.empty((geo["idx_hq"], p, s), dtype=torch.float32, device=q.device)
    sel = torch.empty((s, geo["idx_hq"], bm.TOPK), dtype=torch.int32, device=q.device)
    ops = bench.ops
    kw = bench.kw_attention(ops.msa_sparse_attention, s)
    ops.msa_proxy_score(iq, ik, cu, cu, causal=True, max_seqlen_q=s, max_k_tiles=p, output=scores)
    ops.msa_topk_select(scores, bm.TOPK, num_valid_pages=nvp, force_end_blocks=1, output=sel)
    q2k = sel.transpose(0, 1).contiguous()
    return [("proxy", lambda: ops.msa_proxy_score(iq, ik, cu, cu, causal=True, max_seqlen_q=s, max_k_tiles=p,
                                                   output=scores)),
            ("top-k", lambda: ops.msa_topk_select(scores, bm.TOPK, num_valid_pages=nvp, force_end_blocks=1,
                                                  output=sel)),
            ("transpose", lambda: sel.transpose(0, 1).contiguous()),
            ("sparse attention", lambda: ops.msa_sparse_attention(q, k, v, q2k, cu, cu, causal=True, **kw))]


def host_step_ops(bench, case):
    """(name, fn) of the ops of bench_msa's eager decode step (proxy -> top-k -> sparse decode,
    the arguments an engine passes: max_seqlen_q, max_k_tiles, outputs and a grown workspace), then
    the whole step."""
    import bench_msa as bm  # the same directory

    b, ctx, sq, idx, kv = case
    step = bm.DecodeStep(bench.ops, b, ctx, sq, bm.STEP_INDEX_DTYPES[idx], bm.STEP_DTYPES[kv],
                         bench.gen(), bench.device)
    step()  # plans, kernels, the workspace grown
    kw = dict(page_table=step.page_table, seqused_k=step.seqused, causal=True,
              max_seqlen_q=step.seqlen_q, max_k_tiles=step.nb, output=step.scores)
    if step.index_fp4:
        def proxy():
            step.proxy_score(step.index_q4, step.index_k, step.index_q_scale, step.index_k_scale,
                             step.index_q_gs, step.index_k_gs, step.cu_q, None, **kw)
    else:
        def proxy():
            step.proxy_score(step.index_q, step.index_k, step.cu_q, None, **kw)
    return [("proxy", proxy),
            ("top-k", lambda: step.topk_select(step.scores, step.topk, num_valid_pages=step.nvp,
                                               output=step.sel, force_end_blocks=1)),
            ("sparse decode", lambda: step.decode(step.q, step.k, step.v, step.q2k, page_table=step.page_table,
                                                  seqused_k=step.seqused, seqlen_q=step.seqlen_q, causal=True,
                                                  workspace=step.workspace)),
            ("step", step)]


# The GPU kept busy ahead of timed calls (torch.cuda._sleep's spin, in GPU cycles: ~1 ms on an
# H200 per unit), so that their launches queue behind running work as an engine's do.
BUSY_CYCLES = 2_000_000


def host_times(ops, reps=20, mode="idle"):
    """Median host time (us) of each (name, fn): from the call to its return, after 3 warm-up
    calls. mode "idle": the GPU idle before each call (synchronized); "steady": the reps calls back
    to back behind one long GPU spin, so that the GPU is busy throughout and each call follows the
    previous one at once (an engine's host running ahead of its GPU)."""
    import statistics
    import time

    out = []
    for name, fn in ops:
        for _ in range(3):
            fn()
        ts = []
        if mode == "steady":
            torch.cuda.synchronize()
            torch.cuda._sleep(BUSY_CYCLES * (reps + 2))
        for _ in range(reps):
            if mode != "steady":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        out.append((name, statistics.median(ts)))
    return out


def host_api(fn, reps=10):
    """Where one call's host time goes, by torch.profiler's CPU records of `reps` calls back to back
    behind one long GPU spin (the steady case of host_times): the CUDA runtime calls and the ATen
    ops, "name count x mean us" per call, largest total first."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.cuda._sleep(BUSY_CYCLES * (reps + 2))
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        name = e.key
        # The spin's own launch is one record of reps calls' worth: left out with the syncs.
        if name.startswith(("cuda", "cu", "aten::", "flashmsa::")) and name not in (
                "cudaDeviceSynchronize", "cudaStreamSynchronize") and "_sleep" not in name:
            count = e.count - (1 if name == "cudaLaunchKernel" else 0)
            total = e.cpu_time_total * (count / e.count if e.count else 0.0)
            rows.append((total / reps, count / reps, name))
    rows.sort(reverse=True)
    return "; ".join(f"{name} {count:g} x {total / max(count, 1e-9):.1f}" for total, count, name in rows[:8]
                     if count > 0)


def host_control():
    """The same two measures of a trivial CUDA op (an in-place add on one element): the machine's
    own launch cost, to read the ops' times against."""
    x = torch.zeros(1, device="cuda")
    return [("add_", lambda: x.add_(1))]


def host(cases):
    from profile_msa import make_bench  # the same directory

    bench = make_bench(msa_ops, torch.device("cuda", torch.cuda.current_device()))
    for label, ops in [("control", host_control())] + [
            (host_label(c), host_ops(bench, c) if isinstance(c, int) else host_step_ops(bench, c))
            for c in cases]:
        idle, steady = host_times(ops), host_times(ops, mode="steady")
        head = label if label == "control" else f"{'step' if '/' in label else 'pipeline'} {label}"
        print(f"\n## [host] {head}: " + ", ".join(f"{name} {us:.1f}" for name, us in idle)
              + " us of host time per call (median of 20, the GPU idle before each)")
        print(f"## [host, steady] {head}: " + ", ".join(f"{name} {us:.1f}" for name, us in steady)
              + " us of host time per call (median of 20 calls back to back, the GPU busy throughout)")
        for name, fn in ops:
            if name not in ("transpose", "step", "add_"):
                print(f"   {name}: {host_api(fn)} (us per call, profiled)")
        del ops
        torch.cuda.empty_cache()


def host_label(case):
    if isinstance(case, int):
        return str(case)
    b, ctx, sq, idx, kv = case
    return f"B{b}/{ctx // 1024}K" + (f"/sq{sq}" if sq != 1 else "") + f" {idx}/{kv}"


def parse_host(text):
    """--host items: prefill sizes ("8K": the M3 pipeline's ops) and decode step cases
    ("1/32K[/SQ[/IDX[/KV]]]": the eager step's ops), comma-separated."""
    import bench_msa as bm  # the same directory

    cases = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        cases += bm.parse_cases(part, True) if "/" in part else bm.parse_sizes(part)
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--only", default="")
    ap.add_argument("--sweep", action="append", default=[],
                    help="KIND:TOKENS:W,... kernel totals per point W: default, a tile_max_waste bound or KEY=VALUE+...")
    ap.add_argument("--timeline", default=None,
                    help="B/CTX[/SQ[/IDX[/KV]]],...: the captured decode step's kernels, start / gap / duration")
    for stage in ("proxy", "topk", "decode"):
        ap.add_argument(f"--{stage}-options", default="",
                        help=f"with --timeline: the step's {stage} plan options, NAME=VALUE,...")
    ap.add_argument("--host", default=None,
                    help="SIZES (e.g. 8K,32K): each pipeline op's host time per call (after --sweep, --timeline)")
    args = ap.parse_args(argv)
    host_sizes = None
    if args.host is not None:
        try:
            host_sizes = parse_host(args.host)
        except (argparse.ArgumentTypeError, ValueError) as e:
            ap.error(f"--host: {e}")
        if not host_sizes:
            ap.error("--host: no size")
    # --sweep, --timeline and --host run in that order, each where given; their arguments are all
    # checked before the device is touched.
    cases = options = None
    if args.timeline is not None:
        import bench_msa as bm  # the same directory

        try:
            cases = bm.parse_cases(args.timeline, True)
            options = {f"{s}_options": parse_plan_options(getattr(args, f"{s}_options"))
                       for s in ("proxy", "topk", "decode")}
        except (argparse.ArgumentTypeError, ValueError) as e:
            ap.error(f"--timeline: {e}")
    if args.sweep:
        try:
            sweep_cases(None, args.sweep)
        except ValueError as e:
            ap.error(str(e))
    if args.sweep:
        sweep(args.sweep)
    if cases is not None:
        timeline(cases, **options)
    if host_sizes is not None:
        host(host_sizes)
    if args.sweep or cases is not None or host_sizes is not None:
        return
    dev = torch.device("cuda")
    gen = msa_inputs.cuda_generator(0, dev)
    S, hq, hkv, topk = args.seq, 64, 4, 16
    if args.only in ("", "prefill"):
        q = msa_inputs.randn((S, hq, 128), gen, dev)
        k = msa_inputs.randn((S, hkv, 128), gen, dev)
        v = msa_inputs.randn((S, hkv, 128), gen, dev)
        cu = torch.tensor([0, S], dtype=torch.int32, device=dev)
        pos = torch.arange(S, device=dev)
        sels = {"random": msa_inputs.random_selection(pos, hkv, topk, gen),
                "clustered": msa_inputs.clustered_selection(S, hkv, topk, 0, dev)}
        for pat, sel in sels.items():
            for sched in ("hybrid", "kv_major", "kv_major mma_sync", "query_major"):
                options = dict(schedule=sched.split()[0],
                               kv_major_kernel="mma_sync" if "mma_sync" in sched else "auto")
                profile(f"prefill S={S} {pat} {sched}",
                        lambda sel=sel, options=options: msa_ops._sparse_attention_planned(
                            q, k, v, sel, cu, cu, causal=True, options=options))
    if args.only in ("", "decode"):
        B, ctx = 64, 32768
        nb = ctx // 128
        pages = B * nb
        kc = msa_inputs.randn((pages, hkv, 128, 128), gen, dev)
        vc = msa_inputs.randn((pages, hkv, 128, 128), gen, dev)
        pt = torch.arange(pages, dtype=torch.int32, device=dev).view(B, nb)
        used = torch.full((B,), ctx, dtype=torch.int32, device=dev)
        qd = msa_inputs.randn((B, hq, 128), gen, dev)
        pos = torch.full((B,), ctx - 1, device=dev)
        sel = msa_inputs.random_selection(pos, hkv, topk, gen)
        for fused in (None, True, False):
            profile(f"decode B={B} ctx={ctx} force_fused={fused}",
                    lambda: msa_ops.msa_sparse_decode_attention(
                        qd, kc, vc, sel, page_table=pt, seqused_k=used, force_fused=fused))


if __name__ == "__main__":
    main()
