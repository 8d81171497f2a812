"""msa_topk_select against the sort-based reference (docs/semantics.md#topk-select, #d3, #d4):
forced blocks inside the k slots whatever their score, the candidate range [0, nvp) with per-token
clamping, the ordering of ties, +-0, +-inf and NaN, and the output contract (min(topk, nvp)
ascending entries, -1 tail)."""

import dataclasses
from typing import List, Union

import numpy as np
import pytest
import torch

from flashmsa.testing import reference as ref
from conftest import DEVICES
from flashmsa import msa_ops


@dataclasses.dataclass
class TopkCase:
    name: str
    heads: int
    blocks: int
    tokens: int
    topk: int = 16
    nvp: Union[None, int, List[int]] = None  # list -> per-token int32 tensor
    force_begin: int = 0
    force_end: int = 0
    scores: str = "distinct"  # distinct | ties | special | forced_worst

    def __str__(self):
        return self.name


# A NaN with the sign bit set: ranks below -inf (docs/semantics.md#topk-order).
NEG_NAN = torch.from_numpy(np.array([0xFFC00000], dtype=np.uint32).view(np.float32))[0]


def _clamp_cases(p):
    return [p + 1, 2 * p, 2 ** 31 - 1, 0, -5, p]


CASES = [
    TopkCase("p24_default", 2, 24, 12),
    TopkCase("p160_scalar_nvp_forced", 2, 160, 12, nvp=104, force_begin=3, force_end=2),
    TopkCase("p128_forced_worst", 2, 128, 64, nvp=72, force_begin=3, force_end=2,
             scores="forced_worst"),
    TopkCase("p256_forced_worst", 2, 256, 64, nvp=200, force_begin=3, force_end=2,
             scores="forced_worst"),
    TopkCase("per_token_nvp", 2, 24, 12, nvp=[1, 2, 3, 5, 8, 13, 16, 17, 20, 23, 24, 24],
             force_begin=1, force_end=1),
    TopkCase("per_token_clamped", 2, 160, 6, nvp=_clamp_cases(160), force_begin=2, force_end=3),
    TopkCase("per_token_local_window", 3, 40, 8, nvp=[1, 4, 9, 16, 17, 30, 39, 40], force_end=1),
    TopkCase("ties_lower_index", 2, 300, 8, scores="ties"),
    TopkCase("specials_nan_inf_zero", 1, 64, 4, scores="special"),
    TopkCase("fewer_blocks_than_k", 4, 9, 7),
    TopkCase("topk_1", 2, 50, 5, topk=1),
    TopkCase("topk_8_forced", 2, 50, 5, topk=8, force_begin=2, force_end=2),
    TopkCase("topk_32", 2, 100, 5, topk=32, force_end=1),
    TopkCase("topk_64", 2, 100, 5, topk=64, force_begin=10, force_end=10),
    TopkCase("large_p_ties", 1, 4096, 3, scores="ties"),
]


def make_scores(case: TopkCase) -> torch.Tensor:
    h, p, s = case.heads, case.blocks, case.tokens
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
        x[:, :case.force_begin] = float("-inf")
        x[:, nvp - case.force_end:nvp] = -1e30
        return x
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
    out = msa_ops.msa_topk_select(scores.to(device), case.topk, nvp, None, case.force_begin,
                                  case.force_end)
    expected = ref.topk_select(scores, case.topk, nvp, case.force_begin, case.force_end)
    assert out.dtype == torch.int32 and out.shape == (case.tokens, case.heads, case.topk)
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
                                  force_begin_blocks=case.force_begin,
                                  force_end_blocks=case.force_end).cpu()
    p = case.blocks
    nvps = ([p] * case.tokens if case.nvp is None else
            [case.nvp] * case.tokens if isinstance(case.nvp, int) else case.nvp)
    for s in range(case.tokens):
        nvp = max(0, min(nvps[s], p))
        fb = min(case.force_begin, nvp)
        fe = min(case.force_end, nvp - fb)
        for h in range(case.heads):
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
    case = TopkCase("p", 2, 160, 10, force_begin=1, force_end=1)
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
    scores = make_scores(TopkCase("p", 3, 40, 9)).to(device)
    output = torch.full((9, 3, 16), 99, dtype=torch.int32, device=device)
    got = msa_ops.msa_topk_select(scores, 16, output=output)
    assert got is output
    assert torch.equal(output, msa_ops.msa_topk_select(scores, 16))


@pytest.mark.parametrize("device", DEVICES)
def test_topk_select_deterministic_with_nan_rows(device):
    scores = torch.randn(2, 500, 7)
    scores[:, ::7] = float("nan")
    a = msa_ops.msa_topk_select(scores.to(device), 16)
    b = msa_ops.msa_topk_select(scores.to(device), 16)
    assert torch.equal(a, b)
    assert torch.equal(a.cpu(), ref.topk_select(scores, 16))
