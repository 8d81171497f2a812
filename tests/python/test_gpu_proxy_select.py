"""flashmsa's extension op proxy_score_select on the GPU: the proxy decode kernel's select tail
(the top-k of each request's rows run by its last CTA; docs/design/proxy_score.md#select-tail)
against the two ops it replaces, msa_proxy_score then msa_topk_select, and against the CPU
reference.

Every output is poisoned first (scores NaN, indices -7) and compared whole: the scores bit for bit
with msa_proxy_score's on the GPU (the same kernel code, the tail runs after it), the indices
exactly with msa_topk_select's of those scores (the same selection code, exact by D3) and with
the CPU reference's top-k of the GPU's scores. The tests also check that the one-kernel path ran
where it should (one kernel launched, with caller-owned arrivals) and that it leaves the arrival
counters zero, eagerly and across CUDA-graph replays whose inputs change between replays, for
both forms of the tail (plan option select_tail: the CTA a row, auto's, and a warp a row).

Skipped (not passed) without CUDA.
"""

from __future__ import annotations

import dataclasses
import random
import zlib

import pytest
import torch

import flashmsa

if not (torch.cuda.is_available() and flashmsa.built_with_cuda()):
    pytest.skip("needs a CUDA GPU and a flashmsa build with CUDA kernels", allow_module_level=True)

from flashmsa import msa_ops  # noqa: E402
from flashmsa.testing import paginate  # noqa: E402

DEV = torch.device("cuda")
BLK = 128


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    seqs_k: tuple                # keys per request
    tokens: int = 1              # query tokens per request (decode 1, MTP 4)
    hq: int = 4
    hkv: int = 1
    k_dtype: torch.dtype = torch.bfloat16
    paged: bool = True
    nvp: str = "tensor"          # num_valid_pages: "tensor" (per token), "int", "none"
    force: tuple = (1, 1)        # force_begin_blocks, force_end_blocks
    topk: int = 16
    lead: int = 0                # uncovered rows before the first request (cu_seqlens_q[0])
    tail: int = 0                # uncovered rows after the last one
    max_k_tiles: int = 0         # 0: the longest request's blocks

    def __str__(self):
        return self.name


def _dtype_id(d):
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "fp8"}[d]


BASE = [
    Case("b1_128k", (131072,)),
    Case("b1_32k", (32768,)),
    Case("b1_short", (200,), force=(1, 1)),
    Case("b8_mixed", (32768, 5000, 129, 1, 0, 70000, 128, 32769)),
    Case("b64_32k", tuple(32768 - 97 * i for i in range(64))),
    Case("mtp4_b8", (9000, 32768, 300, 17000, 128, 4096, 60000, 1000), tokens=4),
    Case("g8_two_kv_heads", (20000, 3000, 40000), hq=16, hkv=2),
    Case("nvp_int", (50000, 60000), nvp="int"),
    Case("nvp_none", (30000, 640), nvp="none"),
    Case("no_force", (40000, 2000), force=(0, 1), topk=8),
    Case("sinks_locals", (40000, 2000, 100000), force=(2, 3), topk=16),
    Case("uncovered_rows", (30000, 4000, 700), lead=2, tail=3),
    # Graph padding: more rows of no request than CTAs hold (each CTA selects its own share).
    Case("padded_rows", (32768, 700), tail=700),
    Case("flat", (32768, 1000, 77777), paged=False),
    Case("wide_columns", (3000, 100), max_k_tiles=1024),
]
CASES = [dataclasses.replace(c, name=f"{c.name}_{_dtype_id(d)}", k_dtype=d)
         for c in BASE for d in (torch.bfloat16, torch.float8_e4m3fn)]
CASES.append(Case("fp16_b4", (30000, 200, 1000, 64000), k_dtype=torch.float16))


def make_inputs(c: Case, seed: int):
    gen = torch.Generator().manual_seed(seed)
    b = len(c.seqs_k)
    q_dtype = torch.float16 if c.k_dtype == torch.float16 else torch.bfloat16
    total_q = c.lead + b * c.tokens + c.tail
    q = torch.randn((total_q, c.hq, 128), generator=gen).to(q_dtype)
    total_k = sum(c.seqs_k)
    k_flat = torch.randn((total_k, c.hkv, 128), generator=gen).to(c.k_dtype)
    cu_q = (torch.arange(b + 1, dtype=torch.int32) * c.tokens + c.lead)
    cu_k = torch.zeros(b + 1, dtype=torch.int32)
    cu_k[1:] = torch.tensor(c.seqs_k).cumsum(0)
    blocks = max([-(-n // BLK) for n in c.seqs_k] + [1])
    p = c.max_k_tiles or blocks
    inputs = dict(q=q.to(DEV), cu_seqlens_q=cu_q.to(DEV), max_seqlen_q=c.tokens, max_k_tiles=p)
    if c.paged:
        cache, table, used = paginate(k_flat, list(c.seqs_k), generator=gen, extra_pages=3)
        inputs.update(k=cache.to(DEV), page_table=table.to(DEV), seqused_k=used.to(DEV))
    else:
        inputs.update(k=k_flat.to(DEV), cu_seqlens_k=cu_k.to(DEV))
    # Per-token visible blocks (decode: the token's position // 128 + 1), with a few rows cut
    # shorter; uncovered rows get random counts.
    nvp = torch.randint(1, p + 1, (total_q,), generator=gen, dtype=torch.int32)
    for i, n in enumerate(c.seqs_k):
        for t in range(c.tokens):
            pos = n - c.tokens + t
            nvp[c.lead + i * c.tokens + t] = max(pos // BLK + 1, 0)
    # A scalar count (or the default, p) must hold the forced blocks; else per-token counts.
    mode = c.nvp if sum(c.force) <= p else "tensor"
    if mode == "tensor":
        inputs["num_valid_pages"] = nvp.to(DEV)
    elif mode == "int":
        inputs["num_valid_pages"] = max(p // 2, sum(c.force), 1)
    select = dict(topk=c.topk, force_begin_blocks=c.force[0], force_end_blocks=c.force[1])
    return inputs, select


def proxy_args(inputs):
    return {k: v for k, v in inputs.items() if k != "num_valid_pages"}


def poisoned(c: Case, inputs):
    total_q, hq = inputs["q"].shape[:2]
    scores = torch.full((hq, inputs["max_k_tiles"], total_q), float("nan"), device=DEV)
    indices = torch.full((total_q, hq, c.topk), -7, dtype=torch.int32, device=DEV)
    return scores, indices


def two_ops(c: Case, inputs, select, options=None):
    """The two ops in turn; options: the proxy's plan options (the scores of two proxy kernels are
    only asserted equal within the proxy tolerance elsewhere, so a fallback is compared with the
    proxy kernel it ran)."""
    scores, indices = poisoned(c, inputs)
    msa_ops._proxy_score_planned(**proxy_args(inputs), output=scores, options=options)
    msa_ops.msa_topk_select(scores, num_valid_pages=inputs.get("num_valid_pages"), output=indices,
                            **select)
    return scores, indices


FORMS = ("cta", "warp")  # the select tail's forms (plan option select_tail; auto: cta)


def fused(c: Case, inputs, select, arrivals=None, form=None):
    scores, indices = poisoned(c, inputs)
    options = None if form is None else dict(select_tail=form)
    got = msa_ops._proxy_score_select_planned(**inputs, **select, output=scores, indices=indices,
                                              arrivals=arrivals, options=options)
    assert got[0] is scores and got[1] is indices
    return scores, indices


def assert_same(got, want, what):
    gs, gi = got
    ws, wi = want
    assert torch.equal(gs.isnan(), ws.isnan()), f"{what}: NaN pattern of the scores"
    assert torch.equal(torch.nan_to_num(gs, nan=0.0), torch.nan_to_num(ws, nan=0.0)), \
        f"{what}: scores differ (max {float((gs - ws).abs().nan_to_num(0).max())})"
    bad = (gi != wi).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} index entries differ, first (token, head, slot) {bad[0].tolist()}"


def kernels_launched(fn) -> int:
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_proxy_score_select_equals_two_ops(case: Case):
    inputs, select = make_inputs(case, seed=zlib.crc32(case.name.encode()) % 10000)
    arrivals = torch.zeros(len(case.seqs_k) + 5, dtype=torch.int32, device=DEV)
    want = two_ops(case, inputs, select)
    for form in FORMS:
        for _ in range(2):  # the counters must be back at zero for the next call
            got = fused(case, inputs, select, arrivals, form)
            assert_same(got, want, f"{case} select_tail={form}")
            assert int(arrivals.abs().sum()) == 0, arrivals.tolist()
    # Without arrivals: a zeroed buffer per call; auto's form.
    assert_same(fused(case, inputs, select), want, f"{case} (arrivals=None)")
    # The top-k of the GPU's scores on the CPU reference.
    cpu_nvp = inputs.get("num_valid_pages")
    if isinstance(cpu_nvp, torch.Tensor):
        cpu_nvp = cpu_nvp.cpu()
    ref = msa_ops.msa_topk_select(want[0].cpu(), num_valid_pages=cpu_nvp, **select)
    assert torch.equal(got[1].cpu(), ref), f"{case}: indices against the CPU reference"


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", [c for c in CASES if c.k_dtype != torch.float16
                                  and c.name.startswith(("b1_128k", "b64_32k", "mtp4", "uncovered"))],
                         ids=str)
def test_proxy_score_select_is_one_kernel(case: Case, form: str):
    inputs, select = make_inputs(case, seed=7)
    arrivals = torch.zeros(len(case.seqs_k) + 1, dtype=torch.int32, device=DEV)
    scores, indices = poisoned(case, inputs)
    n = kernels_launched(lambda: msa_ops._proxy_score_select_planned(
        **inputs, **select, output=scores, indices=indices, arrivals=arrivals,
        options=dict(select_tail=form)))
    assert n == 1, f"{n} kernels"
    assert_same((scores, indices), two_ops(case, inputs, select), f"{case} select_tail={form}")


def test_proxy_score_select_falls_back_to_two_ops():
    """Where the tail does not apply (rows choosing 16, more than 1024 blocks, a forced cp.async
    ring for fp8, more than 16 rows a request), the two ops run: same results, two kernels."""
    base = Case("fallback", (40000, 3000), k_dtype=torch.float8_e4m3fn)
    for case, options in [
        (dataclasses.replace(base, force=(0, 0)), None),          # 16 chosen by score
        (dataclasses.replace(base, max_k_tiles=1025), None),      # rows of 1025 blocks
        (base, {"decode_fp8": "cta"}),                            # fp8 on the cp.async ring
        (dataclasses.replace(base, hq=16, hkv=2, tokens=2), None),  # 32 rows a request
    ]:
        inputs, select = make_inputs(case, seed=3)
        scores, indices = poisoned(case, inputs)
        arrivals = torch.zeros(3, dtype=torch.int32, device=DEV)
        run = (lambda: msa_ops._proxy_score_select_planned(
            **inputs, **select, output=scores, indices=indices, arrivals=arrivals, options=options))
        assert kernels_launched(run) >= 2
        assert_same((scores, indices), two_ops(case, inputs, select, options), f"{case} {options}")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("k_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_proxy_score_select_graph_replays(k_dtype, form):
    """Captured once, replayed with new q, new keys in the same pages and new visible-block counts:
    each replay equals the two ops on that replay's inputs, and the counters stay zero."""
    case = Case("graph", (131072, 32768, 5000, 129), k_dtype=k_dtype)
    inputs, select = make_inputs(case, seed=11)
    arrivals = torch.zeros(len(case.seqs_k) + 1, dtype=torch.int32, device=DEV)
    scores, indices = poisoned(case, inputs)

    def step():
        msa_ops._proxy_score_select_planned(**inputs, **select, output=scores, indices=indices,
                                            arrivals=arrivals, options=dict(select_tail=form))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    gen = torch.Generator().manual_seed(5)
    for replay in range(4):
        inputs["q"].copy_(torch.randn(inputs["q"].shape, generator=gen).to(inputs["q"].dtype))
        inputs["k"].copy_(torch.randn(inputs["k"].shape, generator=gen).to(k_dtype))
        nvp = inputs["num_valid_pages"]
        nvp.copy_(torch.randint(0, inputs["max_k_tiles"] + 2, nvp.shape, generator=gen,
                                dtype=torch.int32))
        scores.fill_(float("nan"))
        indices.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        assert_same((scores.clone(), indices.clone()), two_ops(case, inputs, select),
                    f"replay {replay}")
        assert int(arrivals.abs().sum()) == 0


def test_proxy_score_select_random_shapes():
    """Fresh random decode batches (batch, lengths, tokens, heads, forced blocks, dtype)."""
    rng = random.Random(1234)
    for trial in range(40):
        b = rng.choice([1, 2, 3, 8, 17, 64, 130])
        tokens = rng.choice([1, 1, 2, 4])
        hkv = rng.choice([1, 1, 2])
        hq = hkv * rng.choice([1, 4, 4, 16 // tokens])  # G x tokens <= 16: the decode kernel
        longest = 131072 if b <= 2 else 32768 if b <= 8 else 4096
        seqs = tuple(rng.choice([0, 1, 127, 128, 129, rng.randrange(1, longest)]) for _ in range(b))
        topk = rng.choice([4, 8, 16])
        fb = rng.randrange(0, 3)
        fe = rng.randrange(1, 3)
        case = Case(f"random{trial}", seqs, tokens=tokens, hq=hq, hkv=hkv,
                    k_dtype=rng.choice([torch.bfloat16, torch.float8_e4m3fn]),
                    paged=rng.random() < 0.8, nvp=rng.choice(["tensor", "int", "none"]),
                    force=(fb, fe), topk=max(topk, fb + fe + 1),
                    lead=rng.choice([0, 0, 1]), tail=rng.choice([0, 0, 2]))
        inputs, select = make_inputs(case, seed=trial)
        arrivals = torch.zeros(b + 1, dtype=torch.int32, device=DEV)
        want = two_ops(case, inputs, select)
        for form in FORMS:
            assert_same(fused(case, inputs, select, arrivals, form), want, f"{case} {form}")
            assert int(arrivals.abs().sum()) == 0, (case, form, arrivals.tolist())


@pytest.mark.parametrize("form", FORMS)
def test_proxy_score_select_hostile_metadata(form):
    """Device metadata the host cannot check: page ids outside the cache, seqused_k beyond the
    page table, visible-block counts out of range (each the same as the two ops, bit for bit), and
    requests whose rows overlap (cu_seqlens_q not non-decreasing: two requests race on the shared
    rows' scores, in the two ops as here, and a request's last CTA may select a shared row while
    the other request's CTAs still write it, so its ids are unspecified (docs/semantics.md,
    device values); the call completes, writes every score and every index slot, and leaves the
    counters zero)."""
    case = Case("hostile", (40000, 3000, 900, 129), k_dtype=torch.float8_e4m3fn)
    inputs, select = make_inputs(case, seed=21)
    table = inputs["page_table"]
    table[0, 3] = 1 << 30          # a page id outside the cache
    table[1, 0] = -5
    inputs["seqused_k"][2] = 1 << 20  # beyond its page-table row: clamped to it
    inputs["num_valid_pages"][:] = torch.tensor([-3, 10 ** 6, 0, 7], dtype=torch.int32)
    arrivals = torch.zeros(len(case.seqs_k) + 1, dtype=torch.int32, device=DEV)
    opts = dict(select_tail=form)
    scores, indices = poisoned(case, inputs)
    msa_ops._proxy_score_select_planned(**inputs, **select, output=scores, indices=indices,
                                        arrivals=arrivals, options=opts)
    assert_same((scores, indices), two_ops(case, inputs, select), f"hostile {form}")
    assert int(arrivals.abs().sum()) == 0
    # Overlapping requests: rows 1 and 2 belong to requests 0 and 2.
    overlap = dict(inputs, cu_seqlens_q=torch.tensor([0, 3, 1, 4, 4], dtype=torch.int32, device=DEV))
    scores, indices = poisoned(case, overlap)
    msa_ops._proxy_score_select_planned(**overlap, **select, output=scores, indices=indices,
                                        arrivals=arrivals, options=opts)
    torch.cuda.synchronize()
    assert not bool(scores.isnan().any()), "a score left unwritten"
    assert bool((indices >= -1).all()), "an index slot left unwritten"
    assert int(arrivals.abs().sum()) == 0
