"""msa_topk_select against the sort-based reference (docs/semantics.md#topk-select, #d3, #d4):
forced blocks inside the k slots whatever their score, the candidate range [0, nvp) with per-token
clamping, the ordering of ties, +-0, +-inf and NaN, and the output contract (min(topk, nvp)
ascending entries, -1 tail)."""

import numpy as np
import pytest
import torch

from conftest import DEVICES
from flashmsa import msa_ops
from flashmsa.testing import cases
from flashmsa.testing import reference as ref

TopkCase = cases.TopkCase
CASES = cases.cases(cases.TOPK, "reference")

# A NaN with the sign bit set: ranks below -inf (docs/semantics.md#topk-order).
NEG_NAN = torch.from_numpy(np.array([0xFFC00000], dtype=np.uint32).view(np.float32))[0]


def make_scores(case: TopkCase) -> torch.Tensor:
    h, p, s = case.H, case.P, case.S
    if case.scores == "distinct":
        # A random permutation per row: every score distinct.
        return torch.stack([torch.randperm(p).float() for _ in range(h * s)]).reshape(
            h, s, p).transpose(1, 2).contiguous()
    if case.scores == "ties":
        # Few distinct values: most of the choice is by the tie rule (lower block first).
        return (1 + torch.randint(0, 4, (h, p, s)).float() * 2 ** -13).contiguous()
    if case.scores == "forced_worst":
        x = torch.rand(h, p, s) + 1
        nvp = case.nvp
        x[:, :case.fb] = float("-inf")
        x[:, nvp - case.fe:nvp] = -1e30
        return x
    if case.scores != "special":
        raise ValueError(f"{case}: scores {case.scores!r} is not one of this builder's")
    # Specials: +NaN ranks above +inf, -NaN below -inf, +0 above -0, -inf still selectable.
    vals = [float("nan"), float("inf"), 0.0, -0.0, float("-inf"), 1.0, -1.0, 3.0]
    x = torch.full((h, p, s), float("-inf"))
    for t in range(s):
        idx = torch.randperm(p)[: len(vals)]
        for v, i in zip(vals, idx.tolist()):
            x[0, i, t] = v
        x[0, int(torch.randint(0, p, (1,))), t] = NEG_NAN
    return x


def _nvp_arg(case: TopkCase, device):
    if isinstance(case.nvp, list):
        return torch.tensor(case.nvp, dtype=torch.int32, device=device)
    return case.nvp


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_topk_select_matches_reference(case, device):
    scores = make_scores(case)
    nvp = _nvp_arg(case, device)
    out = msa_ops.msa_topk_select(scores.to(device), case.topk, nvp, None, case.fb,
                                  case.fe)
    expected = ref.topk_select(scores, case.topk, nvp, case.fb, case.fe)
    assert out.dtype == torch.int32 and out.shape == (case.S, case.H, case.topk)
    bad = (out.cpu() != expected).any(-1).nonzero()[:4].tolist()
    assert torch.equal(out.cpu(), expected), f"rows (token, head) that differ: {bad}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [c for c in CASES if c.scores in ("distinct", "forced_worst")],
                         ids=str)
def test_topk_select_output_contract(case, device):
    """Exactly min(topk, nvp) valid entries, ascending, inside [0, nvp), forced ones present."""
    scores = make_scores(case)
    nvp_arg = _nvp_arg(case, device)
    out = msa_ops.msa_topk_select(scores.to(device), case.topk, nvp_arg,
                                  force_begin_blocks=case.fb,
                                  force_end_blocks=case.fe).cpu()
    p = case.P
    nvps = ([p] * case.S if case.nvp is None else
            [case.nvp] * case.S if isinstance(case.nvp, int) else case.nvp)
    for s in range(case.S):
        nvp = max(0, min(nvps[s], p))
        fb = min(case.fb, nvp)
        fe = min(case.fe, nvp - fb)
        for h in range(case.H):
            row = out[s, h].tolist()
            n = min(case.topk, nvp)
            assert all(v >= 0 for v in row[:n]) and all(v == -1 for v in row[n:]), row
            assert row[:n] == sorted(set(row[:n])), row
            assert all(v < nvp for v in row[:n]), (row, nvp)
            forced = set(range(fb)) | set(range(nvp - fe, nvp))
            assert forced <= set(row[:n]), (row, forced)


@pytest.mark.parametrize("device", DEVICES)
def test_topk_select_per_token_equals_scalar_calls(device):
    # A per-token nvp tensor behaves, row by row, exactly like a scalar nvp of the same value.
    case = TopkCase("p", 2, 160, 10, fb=1, fe=1, scores="distinct")
    scores = make_scores(case).to(device)
    nvps = [2, 5, 16, 17, 31, 64, 100, 150, 159, 160]
    per_token = msa_ops.msa_topk_select(scores, 16, torch.tensor(nvps, dtype=torch.int32,
                                                                 device=device),
                                        force_begin_blocks=1, force_end_blocks=1)
    for s, nvp in enumerate(nvps):
        scalar = msa_ops.msa_topk_select(scores, 16, nvp, force_begin_blocks=1,
                                         force_end_blocks=1)
        assert torch.equal(per_token[s], scalar[s]), (s, nvp)


@pytest.mark.parametrize("device", DEVICES)
def test_topk_select_output_argument(device):
    scores = make_scores(TopkCase("p", 3, 40, 9, scores="distinct")).to(device)
    output = torch.full((9, 3, 16), 99, dtype=torch.int32, device=device)
    got = msa_ops.msa_topk_select(scores, 16, output=output)
    assert got is output
    assert torch.equal(output, msa_ops.msa_topk_select(scores, 16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("H,S", [(3, 9), (1, 9), (3, 1), (1, 1)])
def test_topk_select_output_head_major_view(device, H, S):
    """output may be q2k.transpose(0, 1) for a head-major (H, S, topk) q2k: the attention ops'
    layout, written directly, also as a row range of a larger buffer with padded rows; every
    element of the rows written, nothing else, the same values as the token-major output's
    transpose. A last stride other than 1 or overlapping rows are refused."""
    scores = make_scores(TopkCase("p", H, 40, S, scores="distinct")).to(device)
    nvp = torch.tensor([40, 3, 17, 0, 40, 1, 25, 40, 9][:S], dtype=torch.int32, device=device)
    want = msa_ops.msa_topk_select(scores, 16, num_valid_pages=nvp, force_end_blocks=1)
    q2k = torch.full((H, S, 16), 99, dtype=torch.int32, device=device)
    got = msa_ops.msa_topk_select(scores, 16, num_valid_pages=nvp, output=q2k.transpose(0, 1),
                                  force_end_blocks=1)
    assert got.data_ptr() == q2k.data_ptr() and got.shape == (S, H, 16)
    assert torch.equal(q2k, want.transpose(0, 1))
    buf = torch.full((H, S + 3, 19), 99, dtype=torch.int32, device=device)
    rows = buf[:, 2:2 + S, :16]
    msa_ops.msa_topk_select(scores, 16, num_valid_pages=nvp, output=rows.transpose(0, 1),
                            force_end_blocks=1)
    assert torch.equal(rows, want.transpose(0, 1))
    rows.fill_(99)
    assert bool((buf == 99).all())  # nothing outside the rows was written
    if H > 1 and S > 1:
        message = "output must have unit stride in its last dim and rows that do not overlap"
        bad = torch.empty((S, 16, H), dtype=torch.int32, device=device).transpose(1, 2)
        with pytest.raises(ValueError, match=message):
            msa_ops.msa_topk_select(scores, 16, output=bad)
        every_other = torch.empty((S, H, 32), dtype=torch.int32, device=device)[:, :, ::2]
        with pytest.raises(ValueError, match=message):
            msa_ops.msa_topk_select(scores, 16, output=every_other)
        shared = torch.empty((S, 1, 16), dtype=torch.int32, device=device).expand(S, H, 16)
        with pytest.raises(ValueError, match=message):
            msa_ops.msa_topk_select(scores, 16, output=shared)
        halves = torch.empty((S * H * 8 + 8,), dtype=torch.int32, device=device).as_strided(
            (S, H, 16), (H * 8, 8, 1))  # each row overlaps the next one's first half
        with pytest.raises(ValueError, match=message):
            msa_ops.msa_topk_select(scores, 16, output=halves)


@pytest.mark.parametrize("device", DEVICES)
def test_topk_select_deterministic_with_nan_rows(device):
    scores = torch.randn(2, 500, 7)
    scores[:, ::7] = float("nan")
    a = msa_ops.msa_topk_select(scores.to(device), 16)
    b = msa_ops.msa_topk_select(scores.to(device), 16)
    assert torch.equal(a, b)
    assert torch.equal(a.cpu(), ref.topk_select(scores, 16))
