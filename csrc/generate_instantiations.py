#!/usr/bin/env python3
"""The explicit template instantiations of the CUDA kernels, generated from one list: KERNELS.

Each KERNELS entry is one host entry point of a kernel (a launcher template, or a query such as its
shared-memory size), instantiated for every compute element type and KV kind the entry lists. From
the list this script writes, for each op directory csrc/<op>/:

  instantiations/<unit>.cu          one translation unit per element type (and KV kind): the
                                    explicit instantiations `template ...;` of every entry of that
                                    unit, so that the heavy kernels compile in parallel and once
  instantiations/declarations.h     the matching `extern template ...;` declarations, included by
                                    <op>/launch.h (where the templates are declared), so that the
                                    callers see exactly the list

The generated files are checked in (the build does not need Python); tests/python/
test_kernel_instantiations.py fails when they differ from what this script writes, and when an
instantiations/ directory holds a file the list did not generate.

Adding a kernel variant:
  1. its launcher template in a header of the op (e.g. csrc/sparse_attn/my_kernel.cuh), declared in
     csrc/<op>/launch.h;
  2. one line in KERNELS below;
  3. `python3 csrc/generate_instantiations.py` (rewrites the generated files; commit them);
  4. the call site (the op's planner / dispatch) picks it.

Usage: python3 csrc/generate_instantiations.py [--check]
"""

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

CSRC = Path(__file__).resolve().parent

# Placeholders of a unit name / signature and what they become in C++.
ELEMS = {"bf16": "__nv_bfloat16", "fp16": "__half"}
KVS = {"native": "KvKind::kNative", "fp8": "KvKind::kFp8", "nvfp4": "KvKind::kNvfp4"}
BOTH = ("bf16", "fp16")
ALL_KV = ("native", "fp8", "nvfp4")


@dataclass(frozen=True)
class Op:
    """An op directory under csrc/: the namespace of its launchers and the header declaring them."""

    namespace: str
    launch_header: str


OPS = {
    "sparse_attn": Op("flashmsa::sparse_attn", "sparse_attn/launch.h"),
    "proxy_score": Op("flashmsa::cuda::proxy", "proxy_score/launch.h"),
}


@dataclass(frozen=True)
class Kernel:
    """One instantiated entry point.

    unit:      file stem in csrc/<op>/instantiations/; {e} (and {kv} when the signature has {KV})
               make one file per element type (and KV kind)
    header:    the header defining the template, relative to csrc/ (its directory is the op)
    signature: the instantiated declaration inside the op's namespace; {E} is the element type,
               {KV} the KV kind; a launcher in a nested namespace is named relative to the op's
               (e.g. "bool sm90::launch<{E}>(const ProxyScoreParams&, cudaStream_t)")
    elems:     element types, keys of ELEMS
    kvs:       KV kinds, keys of KVS (only with {KV})
    """

    unit: str
    header: str
    signature: str
    elems: Tuple[str, ...] = BOTH
    kvs: Tuple[str, ...] = ALL_KV


# fmt: off
KERNELS = [
    # unit                     defining header                 instantiated signature
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/query_major.cuh",   "void launch_query_major<{E}, {KV}, 1>(const QueryMajorArgs&, cudaStream_t)"),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/query_major.cuh",   "void launch_query_major<{E}, {KV}, 4>(const QueryMajorArgs&, cudaStream_t)"),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/query_major.cuh",   "void launch_query_major<{E}, {KV}, 1, true>(const QueryMajorArgs&, cudaStream_t)"),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/query_major.cuh",   "void launch_query_major<{E}, {KV}, 4, false, true>(const QueryMajorArgs&, cudaStream_t)"),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/query_major.cuh",   "void launch_query_major<{E}, {KV}, 4, true, true>(const QueryMajorArgs&, cudaStream_t)", kvs=("fp8",)),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/query_major.cuh",   "void launch_query_major<{E}, {KV}, 1, true, false, true>(const QueryMajorArgs&, cudaStream_t)", kvs=("nvfp4",)),
    # kCluster (decode plan option split=cluster): the split CTAs of a row as one cluster merging
    # through distributed shared memory, in units of their own so that they compile beside the others.
    Kernel("sparse_attn_qm_cluster_{e}_{kv}", "sparse_attn/query_major.cuh", "void launch_query_major<{E}, {KV}, 1, false, false, false, true>(const QueryMajorArgs&, cudaStream_t)"),
    Kernel("sparse_attn_qm_cluster_{e}_{kv}", "sparse_attn/query_major.cuh", "void launch_query_major<{E}, {KV}, 4, false, false, false, true>(const QueryMajorArgs&, cudaStream_t)"),
    Kernel("sparse_attn_qm_cluster_{e}_{kv}", "sparse_attn/query_major.cuh", "void launch_query_major<{E}, {KV}, 1, true, false, false, true>(const QueryMajorArgs&, cudaStream_t)"),
    Kernel("sparse_attn_qm_cluster_{e}_{kv}", "sparse_attn/query_major.cuh", "void launch_query_major<{E}, {KV}, 1, true, false, true, true>(const QueryMajorArgs&, cudaStream_t)", kvs=("nvfp4",)),
    Kernel("sparse_attn_qm_cluster_{e}_{kv}", "sparse_attn/query_major.cuh", "int query_major_cluster_max<{E}, {KV}>(bool)"),
    # split_warps=8: split-K decode with 8 warps per CTA sharing each block (16-bit or fp8 K/V).
    Kernel("qm_wide_{e}_{kv}",     "sparse_attn/query_major_wide.cuh", "void launch_query_major_wide<{E}, {KV}, false>(const QueryMajorArgs&, cudaStream_t)", kvs=("native", "fp8")),
    # ... and its split=cluster form (one cluster of the split CTAs per row, one CTA per SM).
    Kernel("qm_wide_cluster_{e}_{kv}", "sparse_attn/query_major_wide.cuh", "void launch_query_major_wide<{E}, {KV}, true>(const QueryMajorArgs&, cudaStream_t)", kvs=("native", "fp8")),
    Kernel("qm_wide_cluster_{e}_{kv}", "sparse_attn/query_major_wide.cuh", "int query_major_wide_cluster_max<{E}, {KV}>()", kvs=("native", "fp8")),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/kv_major.cuh",      "void launch_kv_major<{E}, {KV}>(const KvMajorArgs&, int, cudaStream_t)"),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/kv_major_sm90.cuh", "void launch_kv_major_sm90<{E}, {KV}>(const KvMajorArgs&, int, bool, cudaStream_t)"),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/kv_major_sm90.cuh", "int kv_major_sm90_ctas_per_sm<{E}, {KV}>()"),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/kv_major.cuh",      "int kv_major_smem_bytes<{E}, {KV}>(int)"),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/kv_major.cuh",      "int kv_major_ctas_per_sm<{E}, {KV}>(int)"),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/union_sm90.cuh",    "void launch_union_sm90<{E}, {KV}>(const UnionArgs&, int, cudaStream_t)", kvs=("native", "fp8")),
    Kernel("sparse_attn_{e}_{kv}", "sparse_attn/union_sm90.cuh",    "int union_sm90_ctas_per_sm<{E}, {KV}>()", kvs=("native", "fp8")),
    Kernel("union_tma_{e}",        "sparse_attn/union_tma_sm90.cuh", "void launch_union_tma_sm90<{E}>(const UnionArgs&, int, cudaStream_t)"),
    Kernel("union_tma_{e}",        "sparse_attn/union_tma_sm90.cuh", "int union_tma_sm90_ctas_per_sm<{E}>()"),
    Kernel("kv_major_tma_{e}",     "sparse_attn/kv_major_tma_sm90.cuh", "void launch_kv_major_tma_sm90<{E}>(const KvMajorArgs&, int, cudaStream_t)"),
    Kernel("kv_major_tma_{e}",     "sparse_attn/kv_major_tma_sm90.cuh", "int kv_major_tma_sm90_ctas_per_sm<{E}>()"),
    Kernel("mtp_wgmma_{e}",        "sparse_attn/mtp_wgmma_sm90.cuh", "void launch_mtp_wgmma_sm90<{E}>(const QueryMajorArgs&, int, bool, cudaStream_t)"),
    Kernel("mtp_wgmma_{e}",        "sparse_attn/mtp_wgmma_sm90.cuh", "int mtp_wgmma_sm90_ctas_per_sm<{E}>()"),
    Kernel("mtp_wgmma_fp8_{e}",    "sparse_attn/mtp_wgmma_sm90.cuh", "void launch_mtp_wgmma_fp8_sm90<{E}>(const QueryMajorArgs&, int, cudaStream_t)"),
    Kernel("mtp_wgmma_fp8_{e}",    "sparse_attn/mtp_wgmma_sm90.cuh", "int mtp_wgmma_fp8_sm90_ctas_per_sm<{E}>()"),
    # regs_feed=tma: the 16-row fp8 register kernel with its stages filled by TMA (sm_90a).
    Kernel("qm_regs_tma_{e}",      "sparse_attn/query_major.cuh",   "void launch_query_major<{E}, KvKind::kFp8, 1, true, false, false, false, true>(const QueryMajorArgs&, cudaStream_t)"),
    Kernel("qm_regs_tma_{e}",      "sparse_attn/query_major.cuh",   "int query_major_regs_tma_ctas_per_sm<{E}>()"),
    Kernel("proxy_score_{e}",      "proxy_score/proxy_score_launch.cuh", "void launch_proxy_score<{E}>(const ProxyScoreParams&, cudaStream_t)"),
    Kernel("proxy_decode_{e}",     "proxy_score/proxy_decode.cuh",       "bool launch_proxy_decode<{E}>(const ProxyScoreParams&, const ProxyScorePlan&, cudaStream_t)"),
    # ... its paths with many kernel variants, in units of their own so that they compile in parallel.
    Kernel("proxy_decode_ring_{e}", "proxy_score/proxy_decode.cuh",      "void decode::launch_ring_fp8<{E}>(const decode::Params&, const ProxyScorePlan&, cudaStream_t)"),
    Kernel("proxy_decode_ring_fp4_{e}", "proxy_score/proxy_decode.cuh",  "void decode::launch_ring_fp4<{E}>(const decode::Params&, const ProxyScorePlan&, cudaStream_t)", elems=("bf16",)),
    Kernel("proxy_decode_tma_{e}", "proxy_score/proxy_decode.cuh",       "bool decode::tma::launch_fp8<{E}>(const decode::Params&, const ProxyScorePlan&, cudaStream_t)"),
    Kernel("proxy_decode_tma_{e}", "proxy_score/proxy_decode.cuh",       "bool decode::tma::launch_fp4<{E}>(const decode::Params&, const ProxyScorePlan&, cudaStream_t)", elems=("bf16",)),
    Kernel("proxy_score_sm90_{e}", "proxy_score/proxy_score_sm90.cuh",   "bool sm90::launch<{E}>(const ProxyScoreParams&, sm90::QSource, bool, bool, cudaStream_t)"),
]
# fmt: on

GENERATED = "// Generated by csrc/generate_instantiations.py from its KERNELS list: do not edit.\n"


@dataclass
class Unit:
    op: str
    what: str
    headers: set
    lines: List[str]


def _op_of(kernel: Kernel) -> str:
    op = kernel.header.split("/")[0]
    if op not in OPS:
        raise SystemExit(f"{kernel.header}: its directory is not an op of OPS ({', '.join(OPS)})")
    return op


def _instances(kernel: Kernel):
    """(unit stem, description, C++ signature) of every instance of one entry."""
    has_kv = "{KV}" in kernel.signature
    if has_kv != ("{kv}" in kernel.unit):
        raise SystemExit(f"{kernel.signature}: {{KV}} in the signature goes with {{kv}} in the unit")
    for e in kernel.elems:
        for kv in kernel.kvs if has_kv else (None,):
            fill = {"e": e, "kv": kv, "E": ELEMS[e], "KV": KVS[kv] if kv else None}
            what = f"compute type {e}" + (f", KV {kv}" if kv else "")
            yield kernel.unit.format(**fill), what, kernel.signature.format(**fill)


def units() -> Dict[str, Unit]:
    """Unit path (relative to csrc/) -> its instantiations, in list order."""
    out: Dict[str, Unit] = {}
    for kernel in KERNELS:
        op = _op_of(kernel)
        for stem, what, signature in _instances(kernel):
            unit = out.setdefault(f"{op}/instantiations/{stem}.cu", Unit(op, what, set(), []))
            unit.headers.add(kernel.header)
            if signature in unit.lines:
                raise SystemExit(f"{signature} is listed twice")
            unit.lines.append(signature)
    return out


def render() -> Dict[str, str]:
    """Path relative to csrc/ -> the text of every generated file."""
    files: Dict[str, str] = {}
    declarations: Dict[str, List[str]] = {}
    for path, unit in units().items():
        op = OPS[unit.op]
        includes = sorted(unit.headers | {op.launch_header})
        files[path] = (
            GENERATED
            + f"// Explicit instantiations for {unit.what} (one translation unit per file: they\n"
            + "// compile in parallel).\n"
            + "".join(f'#include "{h}"\n' for h in includes)
            + f"\nnamespace {op.namespace} {{\n\n"
            + "".join(f"template {s};\n" for s in unit.lines)
            + f"\n}}  // namespace {op.namespace}\n")
        decl = declarations.setdefault(unit.op, [])
        decl.append(f"\n// {Path(path).name}\n")
        decl.extend(f"extern template {s};\n" for s in unit.lines)
    for name, lines in declarations.items():
        op = OPS[name]
        files[f"{name}/instantiations/declarations.h"] = (
            GENERATED
            + "// The explicit instantiations of instantiations/*.cu, declared for their callers.\n"
            + "#pragma once\n\n"
            + f'#include "{op.launch_header}"\n'
            + f"\nnamespace {op.namespace} {{\n"
            + "".join(lines)
            + f"\n}}  // namespace {op.namespace}\n")
    return files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a generated file is missing, differs or "
                        "is stale, or an instantiations/ directory holds a hand-written file")
    parser.add_argument("--csrc", type=Path, default=CSRC,
                        help="the csrc/ directory to write or check (default: this script's)")
    args = parser.parse_args(argv)
    csrc = args.csrc
    files = render()
    problems = []
    for op in OPS:
        for path in sorted((csrc / op / "instantiations").glob("*")):
            rel = path.relative_to(csrc).as_posix()
            if rel in files:
                continue
            if not path.read_text().startswith(GENERATED):
                problems.append(f"csrc/{rel}: not generated; list its kernels in KERNELS of "
                                "csrc/generate_instantiations.py instead")
            elif args.check:
                problems.append(f"csrc/{rel}: stale (no KERNELS entry generates it)")
            else:
                path.unlink()
                print(f"removed csrc/{rel}")
    for rel, text in sorted(files.items()):
        path = csrc / rel
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            problems.append(f"csrc/{rel}: " + ("missing" if current is None else "differs from "
                                               "what csrc/generate_instantiations.py writes"))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote csrc/{rel}")
    for p in problems:
        print(p, file=sys.stderr)
    if problems and args.check:
        print("run `python3 csrc/generate_instantiations.py` and commit the result", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
