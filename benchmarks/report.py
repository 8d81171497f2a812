#!/usr/bin/env python3
"""flashmsa benchmark report: a markdown page with plots from benchmark runs' JSON.

    python benchmarks/report.py results.json --out docs/report/
    python benchmarks/report.py benchmarks/results/*.json --since 2026-12-02 --out docs/report/

Reads the JSON that `bench_msa.py --out` writes (or a run recorded in benchmarks/results/, the
same rows with `commit` / `gpu` / `date` at the top) and writes `--out`/README.md with PNG plots:
time per stage and speedup over dense attention (scaled_dot_product_attention) against context
length, for prefill and for decode. Every plot and the page name the GPU, the commit and the date
of the run; the numbers behind each plot are tabulated under it with the benchmark case they come
from. Given several runs (of one GPU; `--since DATE` drops older ones), each number is the newest
run's that has it, and every speedup divides times of one run: a prefill row's whole-pipeline and
dense times come from the newest run that has both (so do its TP4 pair and each decode row), and
each table row names the commits it comes from. A recorded run with `superseded` (the commit
that replaced what it measured, and why) is left out of a report of several runs and named
under the run list. Needs matplotlib (`pip install "flashmsa[bench]"`
or `pip install matplotlib`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REFERENCE_GPU = "H200"  # the GPU of the tables in docs/benchmarks.md

# Prefill series: (key, label, stage, case pattern with the context length as group "s").
PREFILL = (
    ("proxy", "proxy score (4 index heads)", "proxy",
     r"prefill S=(?P<s>\w+) idx 4q/1k(?: (?P<variant>sm90|sm90_ss))?"),
    ("topk", "top-k select", "topk", r"prefill S=(?P<s>\w+) H4 P=\d+"),
    ("sparse", "sparse attention (pipeline selections)", "sparse", r"S=(?P<s>\w+) bf16 flat pipeline"),
    ("pipeline", "whole MSA prefill (proxy + top-k + attention)", "pipeline",
     r"S=(?P<s>\w+) 64q/4kv/4idx bf16 flat"),
    ("dense", "dense attention, 64 heads (SDPA)", "dense", r"S=(?P<s>\w+) SDPA causal 64 heads"),
    ("pipeline_tp4", "whole MSA prefill, TP4 rank (16 heads)", "pipeline",
     r"S=(?P<s>\w+) TP4 16q/1kv/1idx bf16 flat"),
    ("dense_tp4", "dense attention, 16 heads (SDPA)", "dense", r"S=(?P<s>\w+) SDPA causal 16 heads"),
)
# Decode series (one token per request, bf16 K/V): group "b" the batch, "s" the context.
DECODE = (
    ("index", "index (proxy score + top-k)", "index", r"decode B(?P<b>\d+) ctx=(?P<s>\w+) sq1 \+topk"),
    ("attention", "sparse decode attention", "decode", r"B(?P<b>\d+) ctx=(?P<s>\w+) sq1 bf16 paged"),
    ("dense", "dense decode attention (SDPA)", "dense",
     r"decode B(?P<b>\d+) ctx=(?P<s>\w+) sq1 SDPA 64 heads"),
)


def size_tokens(name: str) -> int:
    """'8K' -> 8192, '4096' -> 4096."""
    m = re.fullmatch(r"(\d+)([KM]?)", name)
    if not m:
        raise ValueError(f"unrecognized context length {name!r}")
    return int(m.group(1)) * {"": 1, "K": 1024, "M": 1024 * 1024}[m.group(2)]


def size_name(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def row_us(row: dict) -> float | None:
    """A row's median time in µs (recorded rows quoted from prose carry `us` or `ms`)."""
    if row.get("status", "ok") != "ok":
        return None
    for key, scale in (("median_us", 1.0), ("us", 1.0), ("ms", 1000.0)):
        if isinstance(row.get(key), (int, float)):
            return float(row[key]) * scale
    return None


def load_run(path) -> dict:
    """The run in either layout -> dict(meta=dict(gpu, commit, date, command), ceilings, rows)."""
    with open(path) as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: not a benchmark result (no 'rows' list)")
    m = data.get("meta") if isinstance(data.get("meta"), dict) else {}
    if "commit" not in data and m:  # bench_msa.py --out
        m = data["meta"]
        argv = m.get("argv")
        meta = dict(gpu=m.get("gpu"), commit=m.get("commit"), date=m.get("date"),
                    command=" ".join(argv) if isinstance(argv, list) else None,
                    mode=m.get("mode"), torch=m.get("torch"), cuda=m.get("cuda"))
    else:  # benchmarks/results/<commit>.json (its bench_msa.py meta, where kept, times the run)
        commands = data.get("commands")
        stamp = str(m.get("date") or "")
        date = stamp if stamp[:10] == str(data.get("date")) else data.get("date")
        meta = dict(gpu=data.get("gpu"), commit=data.get("commit"), date=date,
                    command="; ".join(commands) if isinstance(commands, list) else None,
                    mode=data.get("scope"), title=data.get("title"))
    meta["gpu"] = meta.get("gpu") or "unknown GPU"
    meta["commit"] = meta.get("commit") or "unknown commit"
    meta["date"] = str(meta.get("date") or "unknown date")
    return dict(meta=meta, ceilings=data.get("ceilings") or {}, rows=data["rows"],
                source=str(path), superseded=data.get("superseded"))


def collect(run: dict) -> dict:
    """The plotted numbers: prefill[key][S] and decode[key][(B, ctx)] = (µs, case). Where several
    rows match (the proxy's kernel variants), the fastest is kept and its case is reported."""
    out = dict(prefill={k: {} for k, *_ in PREFILL}, decode={k: {} for k, *_ in DECODE})
    for table, series in (("prefill", PREFILL), ("decode", DECODE)):
        for key, _label, stage, pattern in series:
            rx = re.compile(pattern)
            for row in run["rows"]:
                if row.get("stage") != stage:
                    continue
                m = rx.fullmatch(str(row.get("case", "")))
                us = row_us(row)
                if not m or us is None:
                    continue
                s = size_tokens(m.group("s"))
                at = s if table == "prefill" else (int(m.group("b")), s)
                have = out[table][key].get(at)
                if have is None or us < have[0]:
                    out[table][key][at] = (us, row["case"])
    return out


# The prefill series measured together with dense attention: (MSA key, dense key).
PAIRED = (("pipeline", "dense"), ("pipeline_tp4", "dense_tp4"))


def collect_latest(runs: list) -> tuple:
    """collect() over several runs, oldest first: each number from the newest run that has it,
    except that a pipeline time and the dense time beside it (each PAIRED pair, at each context)
    come from the newest run that has both, and a decode row's index, attention and dense times
    from the newest run that has the first two. Returns (data, origin, sparse_dense): origin
    mirrors data with run indices; sparse_dense[S] is the dense time of the run of sparse[S]
    (the attention-alone speedup's divisor)."""
    per_run = [collect(r) for r in runs]
    data = dict(prefill={k: {} for k, *_ in PREFILL}, decode={k: {} for k, *_ in DECODE})
    origin = dict(prefill={k: {} for k, *_ in PREFILL}, decode={k: {} for k, *_ in DECODE})
    paired = {k for pair in PAIRED for k in pair}
    for i, d in enumerate(per_run):  # newer runs overwrite
        pre = d["prefill"]
        for key, *_ in PREFILL:
            if key in paired:
                continue
            for s, entry in pre[key].items():
                data["prefill"][key][s], origin["prefill"][key][s] = entry, i
        for msa, dense in PAIRED:
            for s, entry in pre[msa].items():
                if s in pre[dense]:
                    data["prefill"][msa][s], origin["prefill"][msa][s] = entry, i
                    data["prefill"][dense][s], origin["prefill"][dense][s] = pre[dense][s], i
        dec = d["decode"]
        for at in set(dec["index"]) & set(dec["attention"]):
            for key in ("index", "attention", "dense"):
                data["decode"][key].pop(at, None)
                origin["decode"][key].pop(at, None)
                if at in dec[key]:
                    data["decode"][key][at], origin["decode"][key][at] = dec[key][at], i
    # A context where no run has both: the newest MSA time alone (no speedup), else the newest
    # dense time alone; never the two from different runs.
    for msa, dense in PAIRED:
        for key in (msa, dense):
            for i, d in enumerate(per_run):
                for s, entry in d["prefill"][key].items():
                    if s in origin["prefill"][msa] and s in origin["prefill"][dense]:
                        continue  # paired above
                    if key == dense and s in origin["prefill"][msa]:
                        continue  # the MSA time alone is shown
                    data["prefill"][key][s], origin["prefill"][key][s] = entry, i
    sparse_dense = {s: per_run[i]["prefill"]["dense"][s][0]
                    for s, i in origin["prefill"]["sparse"].items()
                    if s in per_run[i]["prefill"]["dense"]}
    return data, origin, sparse_dense


def speedups(data: dict, sparse_dense: dict | None = None) -> dict:
    """Speedup over dense attention of the same heads: prefill[key][S], decode[B][ctx]."""
    pre, dec = data["prefill"], data["decode"]
    sp = dict(prefill={}, decode={})
    for key, dense in PAIRED + (("sparse", "dense"),):
        sp["prefill"][key] = {s: pre[dense][s][0] / t for s, (t, _) in pre[key].items()
                              if s in pre[dense]}
    if sparse_dense is not None:  # several runs: the sparse time's own run's dense time
        sp["prefill"]["sparse"] = {s: sparse_dense[s] / t for s, (t, _) in pre["sparse"].items()
                                   if s in sparse_dense}
    for (b, s), (dense_us, _) in sorted(dec["dense"].items()):
        if (b, s) in dec["index"] and (b, s) in dec["attention"]:
            total = dec["index"][(b, s)][0] + dec["attention"][(b, s)][0]
            sp["decode"].setdefault(b, {})[s] = dense_us / total
    return sp


def gpu_label(meta: dict) -> str:
    gpu = meta["gpu"]
    return gpu if REFERENCE_GPU in gpu else f"{gpu} (not the {REFERENCE_GPU})"


# ---- plots --------------------------------------------------------------------------------------

def _axes_context(ax, sizes, ylabel, log_y=True):
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_name(s) for s in sizes])
    ax.xaxis.set_minor_locator(_null_locator())
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)


def _null_locator():
    from matplotlib.ticker import NullLocator
    return NullLocator()


def _title(meta, what):
    return f"{what}\n{gpu_label(meta)}, commit {meta['commit']}, {meta['date'][:10]}"


def plot_all(run: dict, data: dict, sp: dict, out_dir: Path) -> dict:
    """Writes the PNGs that have data; returns {name: file name} of those written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta, written = run["meta"], {}
    pre, dec = data["prefill"], data["decode"]

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written[name.rsplit(".", 1)[0]] = name

    styles = dict(proxy="o-", topk="s-", sparse="^-", pipeline="D-", dense="k--",
                  pipeline_tp4="D:", dense_tp4="k:")
    keys = [k for k, *_ in PREFILL if pre[k] and k in ("proxy", "topk", "sparse", "pipeline",
                                                      "dense")]
    if keys:
        fig, ax = plt.subplots(figsize=(7.5, 5))
        sizes = sorted({s for k in keys for s in pre[k]})
        for key, label, *_ in PREFILL:
            if key in keys:
                xs = sorted(pre[key])
                ax.plot(xs, [pre[key][s][0] / 1000 for s in xs], styles[key], label=label)
        _axes_context(ax, sizes, "median time (ms)")
        ax.set_title(_title(meta, "Prefill, one causal sequence (M3: 64 q / 4 kv heads, bf16)"),
                     fontsize=10)
        ax.legend(fontsize=8)
        save(fig, "prefill_time.png")
    if any(sp["prefill"].values()):
        fig, ax = plt.subplots(figsize=(7.5, 5))
        labels = dict(pipeline="whole MSA prefill, 64 heads", pipeline_tp4="whole MSA prefill, "
                      "TP4 rank (16 heads)", sparse="sparse attention alone, 64 heads")
        sizes = sorted({s for v in sp["prefill"].values() for s in v})
        for key in ("pipeline", "pipeline_tp4", "sparse"):
            xs = sorted(sp["prefill"][key])
            if xs:
                ax.plot(xs, [sp["prefill"][key][s] for s in xs], styles[key], label=labels[key])
        ax.axhline(1.0, color="grey", lw=1)
        _axes_context(ax, sizes, "speedup over dense attention (x)")
        ax.set_title(_title(meta, "Prefill speedup over dense SDPA of the same heads"), fontsize=10)
        ax.legend(fontsize=8)
        save(fig, "prefill_speedup.png")
    batches = sorted({b for key in ("index", "attention") for b, _ in dec[key]})
    if batches:
        fig, ax = plt.subplots(figsize=(7.5, 5))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        sizes = sorted({s for key in dec for _, s in dec[key]})
        for i, b in enumerate(batches):
            c = colors[i % len(colors)]
            for key, label, *_ in DECODE:
                pts = sorted((s, t) for (bb, s), (t, _) in dec[key].items() if bb == b)
                if pts:
                    ax.plot([s for s, _ in pts], [t for _, t in pts],
                            dict(index="o-", attention="s--", dense="x:")[key], color=c,
                            label=f"B={b} {label}")
        _axes_context(ax, sizes, "median time (µs)")
        ax.set_title(_title(meta, "Decode, one token per request (M3, bf16, paged)"), fontsize=10)
        ax.legend(fontsize=7, ncol=2)
        save(fig, "decode_time.png")
    if sp["decode"]:
        fig, ax = plt.subplots(figsize=(7.5, 5))
        sizes = sorted({s for v in sp["decode"].values() for s in v})
        for b, by_ctx in sorted(sp["decode"].items()):
            xs = sorted(by_ctx)
            ax.plot(xs, [by_ctx[s] for s in xs], "o-", label=f"batch {b}")
        ax.axhline(1.0, color="grey", lw=1)
        _axes_context(ax, sizes, "speedup over dense decode (x)")
        ax.set_title(_title(meta, "Decode speedup: dense SDPA / (index + sparse attention)"),
                     fontsize=10)
        ax.legend(fontsize=8)
        save(fig, "decode_speedup.png")
    return written


# ---- markdown -----------------------------------------------------------------------------------

def _ms(entry):
    return f"{entry[0] / 1000:.2f}" if entry else ""


def _us(entry):
    return f"{entry[0]:.1f}" if entry else ""


def _x(value):
    return f"{value:.2f}x" if value is not None else ""


def composite_run(runs: list, origin: dict) -> dict:
    """The page's run for several runs: the commits that numbers were taken from, newest first,
    the newest date and GPU; no command or ceilings (each run's are listed)."""
    used = sorted({i for table in origin.values() for by_at in table.values() for i in by_at.values()},
                  reverse=True)
    newest = runs[used[0]]["meta"] if used else runs[-1]["meta"]
    meta = dict(gpu=newest["gpu"], commit=f"{newest['commit']} and {len(used) - 1} earlier run{'s' if len(used) != 2 else ''}",
                date=newest["date"], mode=f"the newest numbers of {len(used)} runs")
    return dict(meta=meta, ceilings={}, rows=[], runs=[runs[i] for i in used])


def _row_runs(runs: list, indices) -> str:
    return ", ".join(dict.fromkeys(runs[i]["meta"]["commit"] for i in sorted(indices, reverse=True)))


def markdown(run: dict, data: dict, sp: dict, plots: dict, source_name: str,
             origin: dict | None = None, runs: list | None = None) -> str:
    """The page. With origin and runs (several runs, collect_latest), each table row names the
    commits its numbers come from and the runs are listed with their ceilings."""
    meta, pre, dec = run["meta"], data["prefill"], data["decode"]
    lines = [f"# flashmsa benchmark report: {gpu_label(meta)}", "",
             f"Generated by `benchmarks/report.py` from `{source_name}`: commit {meta['commit']}, "
             f"{meta['date']}, {meta['gpu']}"
             + (f", {meta['mode']}" if meta.get("mode") else "") + "."]
    if origin is not None:
        lines += ["", "Runs (newest first; each number below is the newest run's that has it, and "
                      "every speedup divides two times of one run):", ""]
        for r in run["runs"]:
            m, c = r["meta"], r["ceilings"]
            ceil = (f"; ceilings: bf16 matmul {c['matmul_tflops']:.0f} TFLOP/s, device copy "
                    f"{c['copy_gbs']:.0f} GB/s" if c.get("matmul_tflops") and c.get("copy_gbs") else "")
            lines.append(f"* `{Path(r['source']).name}`: commit {m['commit']}, {m['date'][:10]}"
                         + (f", {m['mode']}" if m.get("mode") else "")
                         + (f": {m['title']}" if m.get("title") else "") + ceil)
    if meta.get("title"):
        lines.append(f"That commit: {meta['title']}.")
    if meta.get("command"):
        lines += ["", f"Command: `{meta['command']}`"]
    ceil = run["ceilings"]
    if ceil.get("matmul_tflops") or ceil.get("copy_gbs"):
        lines += ["", f"Ceilings of the same run: bf16 matmul {ceil.get('matmul_tflops', 0):.0f} "
                      f"TFLOP/s, device copy {ceil.get('copy_gbs', 0):.0f} GB/s."]
    if REFERENCE_GPU not in meta["gpu"]:
        lines += ["", f"**Measured on {meta['gpu']}**, not on the {REFERENCE_GPU} of the tables in "
                      "docs/benchmarks.md: compare with those only with that in mind."]
    lines += ["", "Times are medians of CUDA-event timings with a cold L2 (docs/benchmarks.md, "
                  "Timing); shapes, selections and FLOP counts are defined there. Speedup = dense "
                  "attention time / MSA time, dense being `scaled_dot_product_attention` on the "
                  "same heads (cuDNN)."]

    lines += ["", "## Prefill", ""]
    for name in ("prefill_time", "prefill_speedup"):
        if name in plots:
            lines += [f"![{name}]({plots[name]})", ""]
    sizes = sorted({s for v in pre.values() for s in v})
    if sizes:
        runs_col = origin is not None
        lines += ["| context | proxy ms | top-k ms | sparse attention ms | MSA prefill ms | "
                  "dense ms | speedup | TP4 MSA ms | TP4 dense ms | TP4 speedup | "
                  "attention-alone speedup |" + (" runs |" if runs_col else ""),
                  "|" + "---|" * (12 if runs_col else 11)]
        for s in sizes:
            cells = [size_name(s)] + [_ms(pre[k].get(s)) for k in ("proxy", "topk", "sparse",
                                                                     "pipeline", "dense")]
            cells += [_x(sp["prefill"]["pipeline"].get(s)), _ms(pre["pipeline_tp4"].get(s)),
                      _ms(pre["dense_tp4"].get(s)), _x(sp["prefill"]["pipeline_tp4"].get(s)),
                      _x(sp["prefill"]["sparse"].get(s))]
            if runs_col:
                cells.append(_row_runs(runs, [o[s] for o in origin["prefill"].values() if s in o]))
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "Benchmark cases plotted (the proxy: the fastest of its kernel variants in "
                      "the run):", ""]
        for key, label, stage, _ in PREFILL:
            cases = [c for _, (_, c) in sorted(pre[key].items())]
            if cases:
                lines.append(f"* {label}: stage `{stage}`, " + ", ".join(f"`{c}`" for c in cases))
    else:
        lines.append("This run has no prefill rows.")

    lines += ["", "## Decode", ""]
    for name in ("decode_time", "decode_speedup"):
        if name in plots:
            lines += [f"![{name}]({plots[name]})", ""]
    keys = sorted({at for k in dec for at in dec[k]})
    if keys:
        if not dec["dense"]:
            lines += ["This run has no dense decode rows (`dense` stage, `decode B.. ctx=.. sq1 "
                      "SDPA 64 heads`, measured by `bench_msa.py --stages decode` since they were "
                      "added), so no decode speedup is shown.", ""]
        runs_col = origin is not None
        lines += ["| batch | context | index µs | sparse attention µs | MSA decode µs | dense µs | "
                  "speedup |" + (" runs |" if runs_col else ""), "|" + "---|" * (8 if runs_col else 7)]
        for b, s in keys:
            idx, att, dense = (dec[k].get((b, s)) for k in ("index", "attention", "dense"))
            total = f"{idx[0] + att[0]:.1f}" if idx and att else ""
            extra = (" " + _row_runs(runs, [o[(b, s)] for o in origin["decode"].values()
                                           if (b, s) in o]) + " |") if runs_col else ""
            lines.append(f"| {b} | {size_name(s)} | {_us(idx)} | {_us(att)} | {total} | "
                         f"{_us(dense)} | {_x(sp['decode'].get(b, {}).get(s))} |" + extra)
        lines += ["", "MSA decode = index (proxy score + top-k over the paged index cache) + "
                      "sparse decode attention, one token per request, bf16 K/V."]
    else:
        lines.append("This run has no decode rows.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+",
                    help="JSON of bench_msa.py --out, or benchmarks/results/<commit>.json (several: "
                         "each number from the newest run that has it)")
    ap.add_argument("--since", default=None, metavar="DATE",
                    help="with several runs, leave out those dated before DATE (YYYY-MM-DD)")
    ap.add_argument("--out", default="report", help="directory for README.md and the PNGs "
                                                     "(created; default: ./report)")
    args = ap.parse_args(argv)
    try:
        runs = [load_run(path) for path in args.results]
    except (OSError, ValueError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    if args.since is not None:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", args.since):
            print(f"report: --since must be a date YYYY-MM-DD, got {args.since!r}", file=sys.stderr)
            return 2
        runs = [r for r in runs if r["meta"]["date"][:10] >= args.since]
        if not runs:
            print(f"report: no run dated {args.since} or later", file=sys.stderr)
            return 2
    # Runs whose measured state a later commit replaced: out of a report of several runs.
    left_out = [r for r in runs if r.get("superseded")] if len(runs) > 1 else []
    if left_out:
        runs = [r for r in runs if not r.get("superseded")]
        if not runs:
            print("report: every run is superseded", file=sys.stderr)
            return 2
    gpus = {r["meta"]["gpu"].split(" (")[0] for r in runs}
    if len(gpus) > 1:
        print(f"report: runs of different GPUs ({', '.join(sorted(gpus))}): one report per GPU",
              file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print('report: needs matplotlib: pip install "flashmsa[bench]" (or pip install '
              "matplotlib)", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(runs) == 1:
        run = runs[0]
        data = collect(run)
        sp = speedups(data)
        plots = plot_all(run, data, sp, out_dir)
        page = markdown(run, data, sp, plots, Path(args.results[0]).as_posix())
    else:
        runs.sort(key=lambda r: r["meta"]["date"])  # stable: the given order among equal dates
        data, origin, sparse_dense = collect_latest(runs)
        sp = speedups(data, sparse_dense)
        run = composite_run(runs, origin)
        plots = plot_all(run, data, sp, out_dir)
        page = markdown(run, data, sp, plots, f"{len(args.results)} result files", origin, runs)
    if left_out:
        note = "Left out (superseded): " + "; ".join(
            f"`{Path(r['source']).name}` (commit {r['meta']['commit']}: {r['superseded']})" for r in left_out)
        head, sep, tail = page.partition("\n\nRuns (newest first")
        page = head + "\n\n" + note + sep + tail if sep else page + "\n" + note + "\n"
    (out_dir / "README.md").write_text(page)
    print(f"report: {out_dir / 'README.md'} and {len(plots)} plots "
          f"({', '.join(plots.values()) or 'none: no plottable rows'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
