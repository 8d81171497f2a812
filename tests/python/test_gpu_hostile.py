"""Hostile inputs on the GPU, each compared with the same op on the same data as CPU tensors (the
exact C++ reference):

* paged msa_sparse_attention whose cu_seqlens_k differences (up to 2^31 - 1) win over seqused_k and
  are clamped to the page table;
* v_global_scale near the float32 limit of the output (1e35 with |V| up to ~4: outputs ~1e35, far
  inside bfloat16's range), prefill and decode, bf16 / fp8 / NVFP4 K/V;
* the proxy's last block of a 2^31 - 1-key sequence (tests/python/test_hostile_inputs.py runs it
  on both devices).

Skipped (not passed) without a CUDA device or without a CUDA build.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import flashmsa  # noqa: E402
from flashmsa import msa_ops  # noqa: E402
from flashmsa.testing import paginate, quantize_nvfp4  # noqa: E402

if not flashmsa.built_with_cuda():
    pytest.skip("flashmsa was built without CUDA kernels", allow_module_level=True)

DEV = torch.device("cuda")
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
I32 = torch.int32


def on(device, tensors):
    return {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in tensors.items()}


def assert_matches_cpu(fn, args, *, rel=2e-2):
    """fn on CUDA vs fn on CPU: every output within `rel` of the CPU output's largest magnitude
    (bf16 rounding of both plus the kernels' different summation order), -inf / 0 patterns
    equal."""
    cpu = fn(**args)
    gpu = fn(**on(DEV, args))
    cpu = cpu if isinstance(cpu, tuple) else (cpu,)
    gpu = gpu if isinstance(gpu, tuple) else (gpu,)
    for c, g in zip(cpu, gpu):
        c, g = c.float(), g.cpu().float()
        assert torch.equal(torch.isinf(c), torch.isinf(g))
        fin = torch.isfinite(c)
        assert bool(torch.isfinite(g[fin]).all())
        scale = c[fin].abs().max().clamp(min=1e-30) if fin.any() else torch.tensor(1.0)
        err = ((g[fin] - c[fin]).abs() / scale).max() if fin.any() else torch.tensor(0.0)
        assert float(err) <= rel, f"max error {float(err):.3g} of {float(scale):.3g}"


def paged_attention_args(seqlens_q, seqlens_k, hq=8, hkv=2, topk=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(seqlens_q), sum(seqlens_k)
    k = torch.randn(total_k, hkv, 128, generator=g).to(BF16)
    v = torch.randn(total_k, hkv, 128, generator=g).to(BF16)
    k_cache, table, used = paginate(k, seqlens_k, generator=g, extra_pages=2)
    v_cache = torch.zeros_like(k_cache)
    # Same pages for V: scatter V with the same table.
    start = 0
    for b, n in enumerate(seqlens_k):
        for t in range((n + 127) // 128):
            rows = v[start + 128 * t: start + min(n, 128 * (t + 1))]
            v_cache[table[b, t], :, : rows.shape[0]] = rows.transpose(0, 1)
        start += n
    nb = max((n + 127) // 128 for n in seqlens_k)
    q2k = torch.full((hkv, total_q, topk), -1, dtype=I32)
    for r in range(total_q):
        for h in range(hkv):
            sel = torch.randperm(nb + 1, generator=g)[:topk].sort().values
            q2k[h, r, : sel.numel()] = sel.to(I32)
    cu_q = torch.tensor([0] + torch.tensor(seqlens_q).cumsum(0).tolist(), dtype=I32)
    return dict(q=torch.randn(total_q, hq, 128, generator=g).to(BF16), k=k_cache, v=v_cache,
                q2k_indices=q2k, cu_seqlens_q=cu_q, page_table=table, seqused_k=used)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cu_k", [[0, 2**31 - 1], [0, 2**31 - 1, 2**31 - 1], [0, 300, 2**31 - 1]])
def test_paged_cu_seqlens_k_clamped_to_the_pages(causal, cu_k):
    """cu_seqlens_k on the paged path gives the lengths (over seqused_k) and is clamped to each
    row of the page table: a 5-query problem with differences of 2^31 - 1."""
    batch = len(cu_k) - 1
    a = paged_attention_args([5] * batch if batch == 1 else [5, 3], [300] * batch)
    a["cu_seqlens_k"] = torch.tensor(cu_k, dtype=I32)
    a["causal"] = causal
    assert_matches_cpu(lambda **kw: msa_ops.msa_sparse_attention(**kw, return_softmax_lse=True), a)


@pytest.mark.parametrize("kv", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("v_global_scale", [1e35, 3e36, 1e-35])
def test_prefill_extreme_v_global_scale(kv, v_global_scale):
    a = paged_attention_args([37, 200], [700, 300], hq=8, hkv=2, topk=6)
    if kv == "fp8":
        a["k"], a["v"] = a["k"].to(FP8), a["v"].to(FP8)
    elif kv == "nvfp4":
        k, ks, kg = quantize_nvfp4(a["k"])
        v, vs, vg = quantize_nvfp4(a["v"])
        a.update(k=k, v=v, k_scale=ks, v_scale=vs, k_global_scale=kg)
        v_global_scale *= vg
    a["v_global_scale"] = v_global_scale
    assert_matches_cpu(msa_ops.msa_sparse_attention, a)


@pytest.mark.parametrize("force_fused", [None, True, False])
@pytest.mark.parametrize("v_global_scale", [1e35, 3e36])
def test_decode_extreme_v_global_scale(force_fused, v_global_scale):
    a = paged_attention_args([2] * 6, [700, 300, 129, 1000, 5, 256], hq=16, hkv=2, topk=8)
    del a["cu_seqlens_q"]
    a.update(seqlen_q=2, v_global_scale=v_global_scale, force_fused=force_fused)
    assert_matches_cpu(msa_ops.msa_sparse_decode_attention, a)
