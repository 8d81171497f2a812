"""Host time of msa_ops' Python layer per call, without the native op (no GPU needed).

    python benchmarks/host_python.py [--calls 20000] [--repeat 5] [--json]

Every public op's wrapper (argument checks, defaults, output allocation, the plan-log hook) runs
on CPU tensors of the eager decode step's shapes (M3: 64 q / 4 KV heads, 4 index heads, 4 pages),
with each ``torch.ops.flashmsa`` op it calls replaced by a function that returns at once: what is
left is the Python an eager caller pays per call on top of the op itself (the op's own C++ and its
launches are what ``profile_stages.py --host`` measures on the GPU). Per op the best of
``--repeat`` rounds of ``--calls`` calls (timeit), in us per call, beside a trivial torch op
(``x.add_(1)`` on one CPU element) as the machine's yardstick.
"""
import argparse
import json
import timeit
from contextlib import contextmanager

import torch

import flashmsa.msa_ops as msa_ops

_NATIVE = ("proxy_score", "topk_select", "sparse_attention", "sparse_decode")


@contextmanager
def native_ops_stubbed():
    """msa_ops' native ops replaced by no-ops (restored on exit)."""
    ops = msa_ops._ops
    saved = {name: getattr(ops, name) for name in _NATIVE}
    try:
        for name in _NATIVE:
            setattr(ops, name, lambda *args: None)
        yield
    finally:
        for name, fn in saved.items():
            setattr(ops, name, fn)


def calls():
    """(name, fn): one eager call of each public op at the decode step's shapes."""
    bf16, i32 = torch.bfloat16, torch.int32
    pages, hq, hkv, d = 4, 64, 4, 128
    k = torch.randn(pages, hkv, 128, d, dtype=bf16)
    q = torch.randn(1, hq, d, dtype=bf16)
    page_table = torch.arange(pages, dtype=i32).view(1, pages)
    seqused_k = torch.tensor([pages * 128], dtype=i32)
    q2k = torch.arange(pages, dtype=i32).expand(hkv, 1, pages)
    index_q = torch.randn(1, hkv, d, dtype=bf16)
    index_k = torch.randn(pages, 1, 128, d, dtype=bf16)
    cu_q = torch.tensor([0, 1], dtype=i32)
    scores = torch.randn(hkv, pages, 1)
    q8 = torch.randn(8, hq, d, dtype=bf16)
    k_flat = torch.randn(pages * 128, hkv, d, dtype=bf16)
    cu_q8, cu_k = torch.tensor([0, 8], dtype=i32), torch.tensor([0, pages * 128], dtype=i32)
    q2k8 = torch.zeros(hkv, 8, pages, dtype=i32)
    proxy = dict(page_table=page_table, seqused_k=seqused_k, max_seqlen_q=1, max_k_tiles=pages)
    return [
        ("msa_proxy_score", lambda: msa_ops.msa_proxy_score(index_q, index_k, cu_q, **proxy)),
        ("msa_topk_select", lambda: msa_ops.msa_topk_select(scores, 16, num_valid_pages=pages,
                                                            force_end_blocks=1)),
        ("msa_sparse_decode_attention", lambda: msa_ops.msa_sparse_decode_attention(
            q, k, k, q2k, page_table=page_table, seqused_k=seqused_k)),
        ("msa_sparse_attention", lambda: msa_ops.msa_sparse_attention(
            q8, k_flat, k_flat, q2k8, cu_q8, cu_k, causal=True)),
    ]


def measure(n_calls: int, repeat: int):
    """{name: best us per call}, the control (torch's add_) first."""
    one = torch.zeros(1)
    rows = [("control: torch add_", lambda: one.add_(1))]
    with native_ops_stubbed():
        rows += calls()
        result = {}
        for name, fn in rows:
            fn()  # warm-up: first-call work (op lookups, caches) is not per-call cost
            best = min(timeit.repeat(fn, number=n_calls, repeat=repeat))
            result[name] = best / n_calls * 1e6
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000, help="calls per round")
    ap.add_argument("--repeat", type=int, default=5, help="rounds; the best one counts")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.repeat < 1:
        ap.error("--calls and --repeat must be at least 1")
    result = measure(args.calls, args.repeat)
    if args.json:
        print(json.dumps({name: round(us, 3) for name, us in result.items()}))
    else:
        print(f"## [host, python layer] us per call, native ops stubbed, best of {args.repeat} x "
              f"{args.calls} calls")
        for name, us in result.items():
            print(f"   {name}: {us:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
