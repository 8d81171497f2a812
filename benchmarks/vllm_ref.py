"""vLLM's own MiniMax-M3 MSA kernels as a reference (bench_msa.py --vllm; check on the CPU).

They serve bench_msa.py (``--vllm``, on the GPU) and the check of flashmsa's vLLM adapter against
them (``check``, on the CPU).

vLLM serves MiniMax-M3's MSA through Triton ops: ``vllm.models.minimax_m3.common.ops.index_topk``
(the indexer: block scores, top-k, the decode pair), ``...common.ops.sparse_attn`` (prefill and
decode attention) and, on Hopper since 0.34, ``...nvidia.ops.sparse_prefill`` (a query-tiled
prefill attention tuned on the H200). Those three files need only torch, Triton and two small
pieces of vLLM (the platform query and the Triton import), so ``prepare`` keeps just them:

    # on a machine with network access, from the repository root (~150 KB under .deps/vllm):
    python benchmarks/vllm_ref.py prepare --dest .deps/vllm
    # the GPU benchmark, vLLM's kernels beside flashmsa's on the same tensors:
    python benchmarks/bench_msa.py --vllm .deps/vllm --stages vllm
    # the adapter against vLLM's kernels, on the CPU (Triton's interpreter):
    python benchmarks/vllm_ref.py check --dest .deps/vllm

``prepare`` downloads the vLLM wheel (``pip download --no-deps``), copies the three op modules and
``vllm/utils/math_utils.py`` out of it, and writes the rest of the ``vllm`` package they import as
stand-ins of our own: ``vllm.platforms.current_platform`` answering from torch what vLLM's CUDA
platform answers (the device capability, PDL from sm_90 on) and ``vllm.triton_utils`` importing
Triton. With ``--triton`` it also installs beside them the Triton the vLLM release's torch pins
(vLLM 0.34.0's Hopper prefill kernel uses ``tl.make_block_ptr``, which the interpreter of Triton
>= 3.9 no longer runs). Nothing of it is part of flashmsa: it stays under the ignored ``.deps/``.

``check`` runs vLLM's kernels in Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors, fp16
and fp8 caches: the interpreter mishandles bf16) and flashmsa's adapter (``flashmsa.integrations.vllm``, the CPU
reference) on the same inputs in vLLM's layouts, and compares them op by op: scores where flashmsa
gives a finite value (vLLM leaves some unseen blocks unwritten), selections as sets per row (vLLM
returns them in score order), attention outputs within fp16 tolerances.
"""

from __future__ import annotations

import argparse
import math
import sys
import types
from pathlib import Path

from engine_ref import Rows, add_package_inits, extract_from_wheel, first_configs, install_triton
from engine_ref import interpreter, load_site, sorted_sets

VLLM_VERSION = "0.34.0"
TRITON_VERSION = "3.7.1"  # the interpreter that still runs tl.make_block_ptr (vLLM 0.34's Hopper prefill)
OPS = {
    "index_topk": "vllm.models.minimax_m3.common.ops.index_topk",
    "sparse_attn": "vllm.models.minimax_m3.common.ops.sparse_attn",
    "sparse_prefill": "vllm.models.minimax_m3.nvidia.ops.sparse_prefill",
}
FILES = [m.replace(".", "/") + ".py" for m in OPS.values()] + ["vllm/utils/math_utils.py"]

PLATFORMS_SHIM = '''"""Written by flashmsa's benchmarks/vllm_ref.py: the part of vLLM's current_platform that its
MiniMax-M3 MSA ops query, answered from torch as vLLM's CUDA platform answers it."""
import torch


class _Platform:
    @staticmethod
    def is_cuda():
        return torch.cuda.is_available() and torch.version.cuda is not None

    @staticmethod
    def is_rocm():
        return False

    @classmethod
    def _capability(cls):
        if not cls.is_cuda():
            return None
        return torch.cuda.get_device_capability(torch.cuda.current_device())

    @classmethod
    def is_device_capability(cls, capability, device_id=0):
        cap = cls._capability()
        if cap is None:
            return False
        if isinstance(capability, tuple):
            return cap == capability
        return cap[0] * 10 + cap[1] == capability

    @classmethod
    def is_device_capability_family(cls, capability, device_id=0):
        cap = cls._capability()
        return cap is not None and (cap[0] * 10 + cap[1]) // 10 == capability // 10

    @classmethod
    def is_arch_support_pdl(cls):
        cap = cls._capability()
        return cap is not None and cap[0] >= 9

    @staticmethod
    def fp8_dtype():
        return torch.float8_e4m3fn


current_platform = _Platform()
'''

TRITON_SHIM = '''"""Written by flashmsa's benchmarks/vllm_ref.py: vLLM's Triton import."""
import triton
import triton.language as tl

HAS_TRITON = True
'''


def write_stand_ins(site: Path, version: str) -> None:
    """The parts of the ``vllm`` package the op modules import, as our stand-ins: empty package
    ``__init__``s (vLLM's own import the whole engine), ``vllm.platforms`` and
    ``vllm.triton_utils``."""
    add_package_inits(site / "vllm")
    (site / "vllm/platforms").mkdir(parents=True, exist_ok=True)
    (site / "vllm/platforms/__init__.py").write_text(PLATFORMS_SHIM)
    (site / "vllm/triton_utils").mkdir(exist_ok=True)
    (site / "vllm/triton_utils/__init__.py").write_text(TRITON_SHIM)
    (site / "vllm/__init__.py").write_text(f'__version__ = "{version}"\n')


def prepare(dest: Path, version: str, triton_version: str | None) -> list[str]:
    site = dest / "site"
    files = extract_from_wheel("vllm", version, site, lambda name: name in FILES)
    write_stand_ins(site, version)
    if triton_version:
        install_triton(dest, triton_version)
    return files


def load(path) -> types.SimpleNamespace:
    """vLLM's three MSA op modules from what ``prepare`` put under ``path``, and its version
    (engine_ref.load_site)."""
    return load_site(path, "vllm", OPS, "vllm/models/minimax_m3/common/ops/index_topk.py", "vllm_ref.py")


# ---- check: the adapter against vLLM's kernels (CPU, Triton interpreter) --------------------------

BLK = 128


def _problem(seq_lens, q_lens, prefix_lens, hkv, g, seed, kv_dtype):
    """A paged batch in vLLM's layouts (fp16 values, pages permuted, spare pages and columns)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    pages = [math.ceil(max(s, 1) / BLK) for s in seq_lens]
    num_blocks = sum(pages) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros((len(seq_lens), max(pages) + 2), dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[used:used + n].to(torch.int32)
        used += n
    total_q = sum(q_lens)
    return dict(
        kv=(torch.randn((num_blocks, hkv, BLK, 256), generator=gen) / 3).to(kv_dtype),
        index_k=(torch.randn((num_blocks, BLK, 128), generator=gen) / 4).half(),
        q=(torch.randn((total_q, hkv * g, 128), generator=gen) / 3).half(),
        idx_q=(torch.randn((total_q, hkv, 128), generator=gen) / 4).half(),
        table=table,
        cu=torch.tensor([0] + [sum(q_lens[:i + 1]) for i in range(len(q_lens))], dtype=torch.int32),
        seq=torch.tensor(seq_lens, dtype=torch.int32),
        pre=torch.tensor(prefix_lens, dtype=torch.int32))


def check(path) -> Rows:
    """Each op of flashmsa's vLLM adapter against vLLM's kernel on the same inputs."""
    interpreter(path)
    ref = load(path)
    import torch

    from flashmsa.integrations import vllm as fv

    first_configs((ref.index_topk, ref.sparse_attn, ref.sparse_prefill))
    rows = Rows("vLLM")
    close, equal = rows.close, rows.equal

    hkv, g, topk, init, local = 2, 4, 4, 1, 1
    for fp8 in (False, True):
        # fp8: an e4m3 index-K cache with e4m3 index queries (vLLM's fp8 indexer) and an e4m3 K|V
        # cache with scalar scales.
        kind = "fp8" if fp8 else "fp16"
        kv_dtype = torch.float8_e4m3fn if fp8 else torch.float16
        scales = dict(k_scale=torch.tensor([0.5]), v_scale=torch.tensor([2.0])) if fp8 else {}

        def indexer(t):
            if fp8:
                t["idx_q"], t["index_k"] = (t[n].to(torch.float8_e4m3fn) for n in ("idx_q", "index_k"))
            return t
        # Prefill: a chunk after a 300-token prefix, a whole 300-token prompt, and a chunk at
        # 200..299 of a 500-token cache (keys past the chunk exist and are masked).
        seq_lens, q_lens, pre = [1000, 300, 500], [300, 300, 100], [300, 0, 200]
        t = indexer(_problem(seq_lens, q_lens, pre, hkv, g, seed=1, kv_dtype=kv_dtype))
        args = (t["idx_q"], t["index_k"], t["table"], t["cu"], t["seq"], t["pre"], max(q_lens),
                max(seq_lens), hkv)
        ours = fv.minimax_m3_index_score(*args)
        theirs = ref.index_topk.minimax_m3_index_score(*args)
        close(f"{kind} prefill scores", theirs[:, :, :ours.shape[2]], ours, 1e-4, 1e-3,
              torch.isfinite(ours))
        sel_ours = fv.minimax_m3_index_topk(ours, t["cu"], t["pre"], max(q_lens), topk, init,
                                            local)
        sel_theirs = ref.index_topk.minimax_m3_index_topk(ours.contiguous(), t["cu"], t["pre"],
                                                          max(q_lens), topk, init, local)
        equal(f"{kind} prefill top-k (same scores)", sorted_sets(sel_ours),
              sorted_sets(sel_theirs))
        out_ours, out_theirs, out_hopper = (torch.zeros_like(t["q"]) for _ in range(3))
        attn = (t["kv"], sel_ours, t["table"], t["cu"], t["seq"], t["pre"], max(q_lens), hkv, 0.1)
        fv.minimax_m3_sparse_attn(t["q"], *attn, out_ours, **scales)
        ref.sparse_attn.minimax_m3_sparse_attn(t["q"], *attn, out_theirs, **scales)
        close(f"{kind} prefill attention (common Triton op)", out_ours, out_theirs, 2e-2, 2e-3)
        ref.sparse_prefill.minimax_m3_sparse_attn(t["q"], *attn, out_hopper, **scales)
        close(f"{kind} prefill attention (Hopper Triton op)", out_ours, out_hopper, 2e-2, 2e-3)

        # Decode: 1 and 2 tokens per request, a request shorter than a block.
        for dql in (1, 2):
            seq_lens = [900, 300, 100]
            t = indexer(_problem(seq_lens, [dql] * 3, [s - dql for s in seq_lens], hkv, g,
                                 seed=2 + dql, kv_dtype=kv_dtype))
            args = (t["idx_q"], t["index_k"], t["table"], t["seq"], max(seq_lens))
            s_ours = fv.minimax_m3_index_decode_score(*args, init, local, hkv, dql, 4)
            s_theirs = ref.index_topk.minimax_m3_index_decode_score(*args, init, local, hkv, dql,
                                                                    4)
            close(f"{kind} decode scores, {dql} token(s)", s_theirs[:, :, :s_ours.shape[2]],
                  s_ours, 1e-4, 1e-3, torch.isfinite(s_ours))
            sel_ours = fv.minimax_m3_index_decode(*args, topk, init, local, hkv, dql, 4)
            sel_theirs = ref.index_topk.minimax_m3_index_decode(*args, topk, init, local, hkv,
                                                                dql, 4)
            equal(f"{kind} decode top-k, {dql} token(s)", sorted_sets(sel_ours),
                  sorted_sets(sel_theirs))
            o_ours, o_theirs = torch.zeros_like(t["q"]), torch.zeros_like(t["q"])
            attn = (t["kv"], sel_ours, t["table"], t["seq"], hkv, 0.1)
            fv.minimax_m3_sparse_attn_decode(t["q"], *attn, o_ours, dql, **scales)
            ref.sparse_attn.minimax_m3_sparse_attn_decode(t["q"], *attn, o_theirs, dql, **scales)
            close(f"{kind} decode attention, {dql} token(s)", o_ours, o_theirs, 2e-2, 2e-3)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    prep = sub.add_parser("prepare", help="download vLLM's MSA op modules (see above)")
    prep.add_argument("--dest", type=Path, default=Path(".deps/vllm"))
    prep.add_argument("--version", default=VLLM_VERSION)
    prep.add_argument("--triton", nargs="?", const=TRITON_VERSION, default=None,
                      help=f"also install this Triton beside them, for check (default "
                           f"{TRITON_VERSION})")
    chk = sub.add_parser("check", help="flashmsa's vLLM adapter against vLLM's kernels (CPU)")
    chk.add_argument("--dest", type=Path, default=Path(".deps/vllm"))
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        files = prepare(args.dest.resolve(), args.version, args.triton)
        print(f"vllm_ref: vLLM {args.version}: {len(files)} files and the stand-ins under "
              f"{args.dest / 'site'}" + (f", Triton {args.triton} under {args.dest / 'triton'}"
                                          if args.triton else ""))
        return 0
    return check(args.dest).report("vllm_ref")

if __name__ == "__main__":
    sys.exit(main())
