"""The ops called from several host threads at once (on CUDA: each thread on its own stream) give
bit-identical results to serial calls: the host caches (device limits, shared-memory opt-ins,
occupancy), the per-call plans and workspaces, and the CPU reference's worker pools are safe to
share. The CPU reference and the kernels are deterministic, so equality is exact.
"""

import threading

import pytest
import torch

from conftest import DEVICES
from flashmsa import msa_ops
from flashmsa.testing import paginate
from flashmsa.testing import reference as ref

BF16 = torch.bfloat16
THREADS = 4
ROUNDS = 3


def pipeline_inputs(device):
    g = torch.Generator().manual_seed(1)
    seq_q, seq_k = [70, 1, 130], [600, 300, 1000]
    hq, hkv = 8, 2
    q = torch.randn(sum(seq_q), hq, 128, generator=g).to(BF16)
    iq = torch.randn(sum(seq_q), hq, 128, generator=g).to(BF16)
    k = torch.randn(sum(seq_k), hkv, 128, generator=g).to(BF16)
    v = torch.randn(sum(seq_k), hkv, 128, generator=g).to(BF16)
    ik = torch.randn(sum(seq_k), hkv, 128, generator=g).to(BF16)
    kc, table, used = paginate(k, seq_k, generator=g)
    dq = torch.randn(3 * 2, hq, 128, generator=g).to(BF16)
    t = dict(q=q, iq=iq, k=k, v=v, ik=ik, kc=kc, table=table, used=used, dq=dq,
             cu_q=ref.cu_seqlens(seq_q), cu_k=ref.cu_seqlens(seq_k))
    return {n: x.to(device) for n, x in t.items()}


def pipeline(t):
    """Every op once: proxy (flat and paged), top-k, prefill attention, decode."""
    score = msa_ops.msa_proxy_score(t["iq"], t["ik"], t["cu_q"], t["cu_k"], causal=True)
    paged_score = msa_ops.msa_proxy_score(t["iq"], t["kc"], t["cu_q"], page_table=t["table"],
                                          seqused_k=t["used"], causal=True, max_k_tiles=8)
    sel = msa_ops.msa_topk_select(score, 16, force_end_blocks=1)
    q2k = sel[:, ::4].transpose(0, 1).contiguous()  # (Hkv, total_q, 16): head 4 h for kv head h
    out, lse = msa_ops.msa_sparse_attention(t["q"], t["k"], t["v"], q2k, t["cu_q"], t["cu_k"],
                                            causal=True, return_softmax_lse=True)
    dq2k = q2k[:, :6].contiguous()
    dec = msa_ops.msa_sparse_decode_attention(t["dq"], t["kc"], t["kc"], dq2k,
                                              page_table=t["table"], seqused_k=t["used"],
                                              seqlen_q=2)
    return [score, paged_score, sel, out, lse, dec]


@pytest.mark.parametrize("device", DEVICES)
def test_threads_and_streams_match_serial(device):
    t = pipeline_inputs(device)
    expected = pipeline(t)
    if device == "cuda":
        torch.cuda.synchronize()
    results, errors = {}, []
    start = threading.Barrier(THREADS)

    def work(i):
        try:
            stream = torch.cuda.Stream() if device == "cuda" else None
            start.wait()
            got = []
            for _ in range(ROUNDS):
                if stream is not None:
                    with torch.cuda.stream(stream):
                        got.append(pipeline(t))
                else:
                    got.append(pipeline(t))
            if stream is not None:
                stream.synchronize()
            results[i] = got
        except Exception as e:  # reported below with the thread's index
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for i in range(THREADS):
        for r, got in enumerate(results[i]):
            for e, g in zip(expected, got):
                assert torch.equal(e, g), (i, r)
