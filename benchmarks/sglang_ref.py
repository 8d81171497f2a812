"""SGLang's own MiniMax-M3 MSA Triton kernels as a reference (check on the CPU; bench_msa.py
--sglang on the GPU).

SGLang serves MiniMax-M3's sparse attention through Triton kernels in
``sglang.kernels.ops.attention.minimax_sparse`` (the indexer's block scores and top-k, prefill and
decode; the block-sparse attention, prefill and decode). Those files need only torch, Triton and
three small pieces of SGLang (the platform query, two hardware probes, its environment flags), so
``prepare`` keeps just them:

    # on a machine with network access, from the repository root (~160 KB under .deps/sglang):
    python benchmarks/sglang_ref.py prepare --dest .deps/sglang
    # flashmsa's SGLang adapter against SGLang's kernels, on the CPU (Triton's interpreter):
    python benchmarks/sglang_ref.py check --dest .deps/sglang
    # the GPU benchmark, SGLang's kernels beside the adapter on the same tensors:
    python benchmarks/bench_msa.py --sglang .deps/sglang --stages sglang

``prepare`` downloads the SGLang wheel (``pip download --no-deps``), copies the kernel package out
of it and writes the rest of the ``sglang`` package those files import as stand-ins of our own:
``sglang.srt.runtime_context.get_platform()`` answering ``is_sm90`` from torch,
``sglang.srt.utils`` answering the AMD / Intel probes as on an NVIDIA GPU, and
``sglang.srt.environ.envs`` with SGLang's defaults for the flags the kernels read. Nothing of it is
part of flashmsa: it stays under the ignored ``.deps/``.

``check`` runs SGLang's kernels in Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors, fp16
and fp8 caches: the interpreter mishandles bf16) and flashmsa's adapter
(``flashmsa.integrations.sglang``, the CPU reference) on the same inputs in SGLang's layouts and
compares them: the indexer's selections (prefill and decode) equal, attention outputs within fp16
tolerances.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import types
from pathlib import Path

from engine_ref import Rows, add_package_inits, extract_from_wheel, first_configs, interpreter
from engine_ref import load_site

SGLANG_VERSION = "0.5.23"
KERNELS = "sglang/kernels/ops/attention/minimax_sparse/"
OPS = {
    "prefill_index": "sglang.kernels.ops.attention.minimax_sparse.prefill.flash_with_topk_idx",
    "decode_index": "sglang.kernels.ops.attention.minimax_sparse.decode.flash_with_topk_idx",
    "prefill_attn": "sglang.kernels.ops.attention.minimax_sparse.prefill.topk_sparse",
    "decode_attn": "sglang.kernels.ops.attention.minimax_sparse.decode.topk_sparse",
}

RUNTIME_CONTEXT_SHIM = '''"""Written by flashmsa's benchmarks/sglang_ref.py: the part of SGLang's platform query that its
MiniMax-M3 MSA kernels read, answered from torch."""
import torch


class _Platform:
    @property
    def is_sm90(self):
        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def get_platform():
    return _Platform()
'''

UTILS_SHIM = '''"""Written by flashmsa's benchmarks/sglang_ref.py: SGLang's hardware probes, as on an NVIDIA
GPU."""


def is_hip():
    return False


def is_gfx95_supported():
    return False


def is_xpu():
    return False
'''

ENVIRON_SHIM = '''"""Written by flashmsa's benchmarks/sglang_ref.py: SGLang's environment flags that its
MiniMax-M3 MSA kernels read, with SGLang's defaults (environ.py), overridable by the environment."""
import os

_DEFAULTS = {"SGLANG_OPT_USE_MINIMAX_DECODE_TOPK_RADIX": True}


class _Flag:
    def __init__(self, name):
        self.name = name

    def get(self):
        value = os.environ.get(self.name)
        if value is None:
            return _DEFAULTS.get(self.name, False)
        return value.strip().lower() in ("1", "true", "yes", "on")


class _Envs:
    def __getattr__(self, name):
        return _Flag(name)


envs = _Envs()
'''


def write_stand_ins(site: Path, version: str) -> None:
    """The parts of the ``sglang`` package the kernel files import, as our stand-ins: empty package
    ``__init__``s (SGLang's own import the whole engine) and ``sglang.srt.{runtime_context, utils,
    environ}``."""
    (site / "sglang/srt").mkdir(parents=True, exist_ok=True)
    add_package_inits(site / "sglang")
    (site / "sglang/srt/runtime_context.py").write_text(RUNTIME_CONTEXT_SHIM)
    (site / "sglang/srt/utils.py").write_text(UTILS_SHIM)
    (site / "sglang/srt/environ.py").write_text(ENVIRON_SHIM)
    (site / "sglang/__init__.py").write_text(f'__version__ = "{version}"\n')


def prepare(dest: Path, version: str) -> list[str]:
    site = dest / "site"
    files = extract_from_wheel("sglang", version, site,
                               lambda name: name.startswith(KERNELS) and name.endswith(".py"))
    write_stand_ins(site, version)
    return files


def load(path) -> types.SimpleNamespace:
    """SGLang's MSA kernel modules from what ``prepare`` put under ``path``, and its version
    (engine_ref.load_site)."""
    return load_site(path, "sglang", OPS, KERNELS + "decode/topk_sparse.py", "sglang_ref.py")


# ---- problems in SGLang's layouts --------------------------------------------------------------

BLK = 128


def problem(seq_lens, q_lens, hkv, g, seed, kv_dtype, topk=4, device="cpu", q_dtype=None,
            idx_heads=4):
    """A batch in SGLang's layouts: request b in req_to_token row slot_ids[b] (rows out of order),
    its seq_lens[b] tokens in whole 128-slot pages of the slot-major caches (pages shuffled, spare
    pages; columns past a request's length hold stale slots), its queries the last q_lens[b]
    tokens; selections random sets of each row's visible blocks (ascending, -1 padded)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    B = len(seq_lens)
    pages = [math.ceil(s / BLK) for s in seq_lens]
    num_pages = sum(pages) + 3
    perm = torch.randperm(num_pages, generator=gen)
    max_kv_len = max(seq_lens) + 200
    slot_ids = torch.randperm(B + 2, generator=gen)[:B]
    r2t = torch.randint(0, num_pages * BLK, (B + 2, max_kv_len), generator=gen, dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages):
        for t in range(n):
            cols = torch.arange(t * BLK, min((t + 1) * BLK, max_kv_len))
            r2t[slot_ids[b], cols] = (int(perm[used + t]) * BLK + cols % BLK).to(torch.int32)
        used += n
    prefix = [s - n for s, n in zip(seq_lens, q_lens)]
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    sel = torch.full((hkv, cu[-1], topk), -1, dtype=torch.int32)
    for b in range(B):
        for i in range(q_lens[b]):
            visible = (prefix[b] + i) // BLK + 1
            for kh in range(hkv):
                n = int(torch.randint(1, min(topk, visible) + 1, (1,), generator=gen))
                chosen = sorted(torch.randperm(visible, generator=gen)[:n].tolist())
                sel[kh, cu[b] + i, :n] = torch.tensor(chosen, dtype=torch.int32)
    t = dict(
        q=(torch.randn((cu[-1], hkv * g, 128), generator=gen) / 3).to(q_dtype or torch.float16),
        k_cache=(torch.randn((num_pages * BLK, hkv, 128), generator=gen) / 3).to(kv_dtype),
        v_cache=torch.randn((num_pages * BLK, hkv, 128), generator=gen).to(kv_dtype),
        idx_q=(torch.randn((cu[-1], idx_heads, 128), generator=gen) / 4).to(q_dtype or torch.float16),
        idx_k=(torch.randn((num_pages * BLK, 1, 128), generator=gen) / 4).to(kv_dtype),
        topk_idx=sel, req_to_token=r2t, slot_ids=slot_ids,
        cu=torch.tensor(cu, dtype=torch.int32), seq_lens=torch.tensor(seq_lens),
        prefix_lens=torch.tensor(prefix, dtype=torch.int32))
    return {k: v.to(device) for k, v in t.items()}


# ---- check: the adapter against SGLang's kernels (CPU, Triton interpreter) -----------------------

def check(path) -> Rows:
    """flashmsa's SGLang adapter against SGLang's kernels on the same inputs."""
    interpreter(path)
    ref = load(path)
    import torch

    from flashmsa.integrations import sglang as fs

    # Key tiles of whole 128-key blocks (the indexer's kernels assert it; on a GPU their
    # autotuners drop the configurations that fail or prune them).
    first_configs((ref.prefill_index, ref.decode_index, ref.prefill_attn, ref.decode_attn),
                  prefer=lambda c: all(c.kwargs.get(k, BLK) >= BLK
                                       for k in ("BLOCK_SIZE_K", "BLOCK_SIZE_N")))
    rows = Rows("SGLang")
    hkv, g, topk = 2, 4, 4
    # The decode top-k by SGLang's Triton kernels (its default, a JIT-compiled CUDA radix select,
    # needs SGLang's JIT toolchain; both return the same sets).
    os.environ["SGLANG_OPT_USE_MINIMAX_DECODE_TOPK_RADIX"] = "0"
    for fp8 in (False, True):
        # fp8: e4m3 K / V caches with scalar scales under fp16 queries (SGLang's widening mode).
        kind = "fp8 K/V" if fp8 else "fp16"
        kv_dtype = torch.float8_e4m3fn if fp8 else torch.float16
        scales = dict(k_scale=0.5, v_scale=2.0) if fp8 else {}
        # Prefill indexer (smaller: it is the slowest kernel in the interpreter): a chunk after a
        # 360-token prefix, a whole 200-token prompt, one token after 128.
        t = problem([460, 200, 129], [100, 200, 1], hkv, g, seed=1, kv_dtype=kv_dtype)
        index = (t["idx_q"], t["idx_k"], None, None, t["req_to_token"], t["slot_ids"], t["cu"],
                 t["seq_lens"], t["prefix_lens"], 200, 460, 1, BLK, topk)
        index_kw = dict(init_blocks=1, local_blocks=1, sm_scale=0.088, disable_index_value=True,
                        page_size=BLK, k_scale=scales.get("k_scale"))
        _, sel_ours = fs.flash_prefill_with_topk_index(*index, **index_kw)
        _, sel_theirs = ref.prefill_index.flash_prefill_with_topk_index(*index, **index_kw)
        rows.equal(f"{kind} prefill index top-k", sel_ours, sel_theirs)
        # Prefill attention: a chunk after a 400-token prefix, a whole 300-token prompt, one token.
        t = problem([700, 300, 129], [300, 300, 1], hkv, g, seed=1, kv_dtype=kv_dtype)
        ours = fs.msa_sparse_prefill_main(
            t["q"], t["k_cache"], t["v_cache"], t["topk_idx"], t["req_to_token"], t["slot_ids"],
            t["cu"], t["seq_lens"], t["prefix_lens"], BLK, sm_scale=0.1, **scales)
        theirs = ref.prefill_attn.flash_prefill_with_gqa_share_sparse(
            t["q"], t["k_cache"], t["v_cache"], None, t["req_to_token"], t["slot_ids"],
            t["topk_idx"], 1, BLK, t["cu"], t["seq_lens"], t["prefix_lens"], 300, sm_scale=0.1,
            **scales)
        rows.close(f"{kind} prefill attention", ours, theirs, 2e-2, 2e-3)
        # Decode: one query per request, a request of one block, one of a block and a token.
        t = problem([900, 300, 128, 129, 1000], [1] * 5, hkv, g, seed=2, kv_dtype=kv_dtype)
        index = (t["idx_q"], None, t["idx_k"], None, t["req_to_token"], t["seq_lens"], 1000,
                 t["slot_ids"], BLK, topk, 1, 1)
        index_kw = dict(sm_scale=0.088, disable_index_value=True, page_size=BLK,
                        k_scale=scales.get("k_scale"))
        _, sel_ours, _ = fs.flash_decode_with_topk_idx(*index, **index_kw)
        _, sel_theirs, _ = ref.decode_index.flash_decode_with_topk_idx(*index, **index_kw)
        rows.equal(f"{kind} decode index top-k", sel_ours, sel_theirs)
        ours = fs.msa_sparse_decode_main(
            t["q"], t["k_cache"], t["v_cache"], t["topk_idx"], t["req_to_token"], t["slot_ids"],
            t["seq_lens"], BLK, sm_scale=0.1, **scales)
        theirs = ref.decode_attn.flash_decode_with_gqa_share_sparse(
            t["q"], None, t["k_cache"], t["v_cache"], t["req_to_token"], t["seq_lens"],
            t["slot_ids"], BLK, t["topk_idx"], sm_scale=0.1, page_size=BLK, **scales)
        rows.close(f"{kind} decode attention", ours, theirs, 2e-2, 2e-3)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    prep = sub.add_parser("prepare", help="download SGLang's MSA kernel files (see above)")
    prep.add_argument("--dest", type=Path, default=Path(".deps/sglang"))
    prep.add_argument("--version", default=SGLANG_VERSION)
    chk = sub.add_parser("check", help="flashmsa's SGLang adapter against SGLang's kernels (CPU)")
    chk.add_argument("--dest", type=Path, default=Path(".deps/sglang"))
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        files = prepare(args.dest.resolve(), args.version)
        print(f"sglang_ref: SGLang {args.version}: {len(files)} files and the stand-ins under "
              f"{args.dest / 'site'}")
        return 0
    return check(args.dest).report("sglang_ref")


if __name__ == "__main__":
    sys.exit(main())
