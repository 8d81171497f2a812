#!/usr/bin/env python3
"""Small calls of every flashmsa op and every major feature path, for compute-sanitizer.

    compute-sanitizer --tool memcheck --leak-check no --error-exitcode 97 \
        python3 benchmarks/sanitize_smoke.py
    compute-sanitizer --tool racecheck --error-exitcode 97 python3 benchmarks/sanitize_smoke.py
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_smoke.py --only "[kv_major] flat bf16"
    compute-sanitizer --tool initcheck python3 benchmarks/sanitize_smoke.py --shard 3/8 --no-tma-stores
    python3 benchmarks/sanitize_smoke.py --list [--only ...] [--shard I/N]   # names; no GPU needed

Shapes are small (the sanitizers slow kernels down by orders of magnitude) but irregular: ragged
sequences, partial last pages, permuted pages, empty sequences, rows with no selected block, ids
out of range, per-token nvp values out of range. The "hostile" cases (names starting with
"hostile") add page ids outside the cache, block ids up to INT32_MAX, empty selections,
zero-length key and query sequences, no query rows at all, an empty page table and lengths beyond
the page table, for every op. Each call is synchronized on its own so that a
report points at one case. A NotImplementedError (or an op missing from flashmsa.msa_ops) is
printed as SKIP; any other exception fails the script (exit 1) after the remaining cases ran.
Results are checked only for NaN: correctness is the test suites' job.

Selecting cases: --only SUBSTRING runs just the cases whose name (as printed) contains SUBSTRING
(or one of "A|B|..."); --shard I/N runs every N-th of those from the I-th (1-based, in case order),
so that N sanitizer processes share the work (scripts/gpu_check.sh, SANITIZER_JOBS); --list prints
the selected names and calls no op; --resume LOG leaves out the cases that LOG (the output of an
earlier run of this script, e.g. a cut sanitizer run's merged log) names as PASS or SKIP, before
--shard splits the rest, so a run that a time limit cut can be finished by another. Nothing is
built for the other cases, and a case's data do not depend on which other cases run (see Smoke): a
shard, an --only or a --resume run reproduces exactly what the full run does for its cases. The
summary line names the shard and how many of the selected calls it ran.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import sys
import time
import traceback
import zlib

import torch
from flashmsa import testing as ft
from flashmsa.testing import inputs as mi

BF16, FP16, FP8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn


PARTS = ("proxy", "proxy_sm90", "proxy_decode", "proxy_fp4", "topk", "sparse_attention", "decode",
         "pipeline", "hostile")
# The top-k kernels (plan option kernel) whose calls the topk and hostile parts make.
TOPK_KERNELS = ("warp_per_row", "warp_per_row_8", "radix", "radix_1buf", "warp_split",
                "radix_uniform", "warp_digits", "net", "net net_pivot=on", "net net_pivot=off",
                "net net_pivot=on net_pivot_mode=sort", "net net_pivot=on net_pivot_mode=rank_cta")


def topk_options(kernel: str) -> dict:
    """Plan options of a TOPK_KERNELS entry: "net net_pivot=on" -> kernel=net, net_pivot=on."""
    name, *extra = kernel.split()
    return dict(kernel=name, **dict(e.split("=", 1) for e in extra))


def seed_of(name: str) -> int:
    """A seed that follows from a name alone (crc32: stable across processes and Python versions,
    unlike hash())."""
    return zlib.crc32(name.encode())


class Smoke:
    """Runs the cases in a fixed order. `only`: name substrings ("A|B"), `shard`: (i, n), 1-based:
    of the cases `only` selects (all by default), the i-th, (i+n)-th, ... in that order.
    `listing`: the selected cases' names are collected (and printed), no op is called.

    Data: nothing is built for a case that is not selected. A case's function builds its own
    inputs, drawing from a generator seeded by the case's name; an input that several cases share
    is a Lazy, built on its first use from a generator seeded by the part's name and the Lazy's
    place in the part (both independent of which cases run). So a case sees the same data in a
    full run, a shard or an --only run."""

    def __init__(self, ops, device, only=None, shard=None, listing=False, done=frozenset()):
        self.ops = ops
        self.dev = device
        self.only = only
        self.shard = shard
        self.done = done    # names an earlier run passed or skipped (--resume): not selected
        self.listing = listing
        self.gen = mi.cuda_generator(7, device)  # builders draw from it: a case's or a Lazy's own
        self.passed, self.skipped, self.failed, self.listed = [], [], [], []
        self.filtered = 0   # cases not matching `only`
        self.resumed = 0    # cases matching `only` that are in `done`
        self.matched = 0    # cases matching `only`: the shard takes every n-th of them
        self.part, self.inputs = "", 0

    def run_parts(self, parts=PARTS):
        for part in parts:
            self.part, self.inputs = part, 0
            getattr(self, part)()

    def lazy(self, build):
        """An input shared by several cases: build() runs on the first call (by a selected case),
        its draws from a generator seeded by (part, n) where this is the part's n-th lazy input."""
        self.inputs += 1
        return Lazy(self, seed_of(f"{self.part}/{self.inputs}"), build)

    def selected(self, name) -> bool:
        if self.only is not None and not any(part in name for part in self.only.split("|")):
            self.filtered += 1
            return False
        if name in self.done:
            self.resumed += 1
            return False
        index = self.matched
        self.matched += 1
        return self.shard is None or index % self.shard[1] == self.shard[0] - 1

    def run(self, name, fn):
        if not self.selected(name):
            return
        if self.listing:
            self.listed.append(name)
            print(name, flush=True)
            return
        build_gen, self.gen = self.gen, mi.cuda_generator(seed_of(name), self.dev)
        try:
            self._call(name, fn)
        finally:
            self.gen = build_gen

    def _call(self, name, fn):
        start = time.perf_counter()
        try:
            out = fn()
            self.sync()
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != FP8:
                    if bool(torch.isnan(t).any()):
                        raise RuntimeError("output contains NaN")
            self.passed.append(name)
            # The call's wall time (inputs built, op run, synchronized): under a sanitizer it
            # shows which calls the tool's time goes to.
            print(f"PASS {name} ({time.perf_counter() - start:.1f} s)", flush=True)
        except (NotImplementedError, AttributeError) as e:
            if isinstance(e, AttributeError) and "msa_ops" not in str(e):
                self._fail(name, e)
            else:
                self.skipped.append(name)
                print(f"SKIP {name}: {type(e).__name__}: {e}", flush=True)
        except Exception as e:
            self._fail(name, e)

    def _fail(self, name, e):
        self.failed.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()
        self.sync()  # a sticky CUDA error ends the run here, loudly

    def sync(self):
        if torch.device(self.dev).type == "cuda":
            torch.cuda.synchronize()

    # ---- data ----
    def rnd(self, shape, dtype=BF16):
        x = mi.randn(shape, self.gen, self.dev)
        return x.to(dtype)

    def i32(self, values):
        return torch.tensor(values, dtype=torch.int32, device=self.dev)

    def paged(self, lengths, heads, dtype=BF16, spare_pages=3):
        """Paged cache for sequences of `lengths` keys: permuted pages plus unused spare pages,
        the last page of each sequence partly filled. Returns (cache, page_table, seqused_k)."""
        blocks = [math.ceil(n / mi.BLOCK) for n in lengths]
        max_pages = max(max(blocks), 1) + 1  # one column more than needed: never read
        total = sum(blocks) + spare_pages
        perm = torch.randperm(total, generator=self.gen, device=self.dev).to(torch.int32)
        table = torch.zeros((len(lengths), max_pages), dtype=torch.int32, device=self.dev)
        at = 0
        for b, nb in enumerate(blocks):
            table[b, :nb] = perm[at:at + nb]
            at += nb
        cache = self.rnd((total, heads, mi.BLOCK, mi.HEAD_DIM), dtype)
        return cache, table, self.i32(lengths)

    def paged_kv(self, lengths, heads, dtype=BF16):
        """self.paged's K cache with a V cache of the same shape: (k, v, page_table, seqused_k)."""
        kc, table, used = self.paged(lengths, heads, dtype)
        return kc, self.rnd(kc.shape).to(dtype), table, used

    def cu_rows(self, batch, seqlen_q):
        """cu_seqlens_q of `batch` requests of seqlen_q query rows each."""
        return torch.arange(0, batch * seqlen_q + 1, seqlen_q, dtype=torch.int32, device=self.dev)

    def decode_selection(self, lens, seqlen_q, hkv, topk=16):
        """Random causal selections of the last seqlen_q tokens of each sequence (batch-major)."""
        pos = torch.cat([torch.arange(n - seqlen_q, n, device=self.dev) for n in lens])
        return mi.random_selection(pos.clamp(min=0), hkv, topk, self.gen)

    def selection(self, seqs_q, seqs_k, hkv, topk, pattern="random"):
        """Per-sequence causal (right-aligned) selections stacked over the varlen rows."""
        parts = []
        for sq, sk in zip(seqs_q, seqs_k):
            pos = torch.arange(sk - sq, sk, device=self.dev).clamp(min=0)
            if pattern == "clustered":
                full = mi.clustered_selection(sk, hkv, topk, 3, self.dev)
                parts.append(full[:, sk - sq:])
            else:
                parts.append(mi.random_selection(pos, hkv, topk, self.gen))
        return torch.cat(parts, dim=1).contiguous()

    # ---- ops ----
    # Inputs that several cases share are self.lazy(build) (built by the first selected case that
    # calls them); an input of one case is built inside that case's function.
    def proxy(self):
        ops = self.ops
        sq, sk = [100, 37, 0], [700, 300, 256]
        cu_q, cu_k = ft.cu_seqlens(sq, self.dev), ft.cu_seqlens(sk, self.dev)
        qk = self.lazy(lambda: (self.rnd((sum(sq), 4, 128)), self.rnd((sum(sk), 1, 128))))
        p = math.ceil(max(sk) / 128)
        self.run("proxy flat bf16 causal G4 ragged+empty", lambda: ops.msa_proxy_score(
            *qk(), cu_q, cu_k, max_seqlen_q=max(sq), max_k_tiles=p))
        self.run("proxy flat bf16 reduce_heads", lambda: ops.msa_proxy_score(
            *qk(), cu_q, cu_k, max_seqlen_q=max(sq), max_k_tiles=p, reduce_heads=True))
        self.run("proxy flat fp16 non-causal G2 derived dims", lambda: ops.msa_proxy_score(
            self.rnd((sum(sq), 4, 128), FP16), self.rnd((sum(sk), 2, 128), FP16), cu_q, cu_k,
            causal=False))
        self.run("proxy flat bf16 q_offset tensor (negative too)", lambda: ops.msa_proxy_score(
            *qk(), cu_q, cu_k, max_seqlen_q=max(sq), max_k_tiles=p,
            q_offset=self.i32([-5, 100, 0])))
        s = 1024
        cu = ft.cu_seqlens([s], self.dev)
        self.run("proxy flat bf16 prefill S=1024 (MMA tiles)", lambda: ops.msa_proxy_score(
            self.rnd((s, 4, 128)), self.rnd((s, 1, 128)), cu, cu, max_seqlen_q=s,
            max_k_tiles=s // 128))
        # Paged decode-like shapes: stream (sq 1) and packed (sq 4) schedules, ragged lengths.
        lens = [700, 2048, 129, 0, 1000]
        b = len(lens)
        for hkv, dtype in ((1, BF16), (2, BF16), (1, FP8)):
            paged = self.lazy(lambda hkv=hkv, dtype=dtype: self.paged(lens, hkv, dtype))
            for seqlen_q in (1, 4):
                cu_qd = self.cu_rows(b, seqlen_q)

                def call(paged=paged, cu_qd=cu_qd, sqd=seqlen_q):
                    cache, table, used = paged()
                    return ops.msa_proxy_score(
                        self.rnd((b * sqd, 4, 128)), cache, cu_qd, None, page_table=table,
                        seqused_k=used, max_seqlen_q=sqd, max_k_tiles=table.shape[1])
                self.run(f"proxy paged {str(dtype)[6:]} k, G{4 // hkv}, sq{seqlen_q}", call)
        cu_qd = self.cu_rows(b, 1)

        def fp8_q():
            cache, table, used = self.paged(lens, 1, FP8)
            return ops.msa_proxy_score(
                self.rnd((b, 4, 128)).to(FP8), cache, cu_qd, None, page_table=table,
                seqused_k=used, max_seqlen_q=1, max_k_tiles=table.shape[1],
                q_offset=self.i32([350, 1024, 64, 0, 0]))
        self.run("proxy paged fp8 q + fp8 k", fp8_q)

    def proxy_sm90(self):
        """The sm_90a TMA + wgmma prefill kernel, forced, in both variants (plan option kernel=
        sm90_only: Q in registers, sm90_ss_only: Q in shared memory; SKIP on other devices):
        ragged and empty sequences, several tiles per CTA, q_offset, padding columns, non-causal,
        G = 1 / 2 / 8, fp16, rows of no sequence, paged K with an invalid page id; fp8 K and NVFP4
        q / K (converted by the producer warpgroup), flat and paged; sm90_f16_only: fp8 K with bf16 q
        on fp16 MMAs (q rows scaled into fp16 in registers), fp8 q and K (Q's raw bytes by TMA, its
        fragments converted in registers; the other calls as sm90_only)."""
        for variant in ("sm90", "sm90_ss", "sm90_f16"):
            options = dict(kernel=variant + "_only")
            self._proxy_sm90_cases(variant, PlannedOps(self.ops, msa_proxy_score=options,
                                                       msa_proxy_score_fp4=options))

    def _proxy_sm90_cases(self, tag, ops):
        sq, sk = [1000, 37, 0, 129], [1000, 300, 256, 2000]
        cu_q, cu_k = ft.cu_seqlens(sq, self.dev), ft.cu_seqlens(sk, self.dev)
        qk = self.lazy(lambda: (self.rnd((sum(sq) + 5, 4, 128)), self.rnd((sum(sk), 1, 128))))
        p = math.ceil(max(sk) / 128)
        self.run(f"proxy {tag} flat bf16 causal G4 ragged+empty+uncovered",
                 lambda: ops.msa_proxy_score(*qk(), cu_q, cu_k, max_seqlen_q=max(sq),
                                             max_k_tiles=p))
        self.run(f"proxy {tag} flat bf16 q_offset tensor, padding columns",
                 lambda: ops.msa_proxy_score(*qk(), cu_q, cu_k, max_seqlen_q=max(sq),
                                             max_k_tiles=p + 3, q_offset=self.i32([-5, 100, 0, 1500])))
        self.run(f"proxy {tag} flat fp16 non-causal G2", lambda: ops.msa_proxy_score(
            self.rnd((sum(sq) + 5, 4, 128), FP16), self.rnd((sum(sk), 2, 128), FP16), cu_q, cu_k,
            causal=False, max_seqlen_q=max(sq), max_k_tiles=p))
        self.run(f"proxy {tag} flat bf16 G1 / G8 heads", lambda: (
            ops.msa_proxy_score(self.rnd((sum(sq) + 5, 2, 128)), self.rnd((sum(sk), 2, 128)),
                                cu_q, cu_k, max_seqlen_q=max(sq), max_k_tiles=p),
            ops.msa_proxy_score(self.rnd((sum(sq) + 5, 8, 128)), qk()[1], cu_q, cu_k,
                                max_seqlen_q=max(sq), max_k_tiles=p)))

        def invalid_page():
            cache, table, used = self.paged(sk, 1)
            table[0, 2] = -1  # an invalid page id: that block is -inf, nothing is loaded
            return ops.msa_proxy_score(qk()[0], cache, cu_q, None, page_table=table, seqused_k=used,
                                       max_seqlen_q=max(sq), max_k_tiles=table.shape[1])
        self.run(f"proxy {tag} paged bf16 causal G4 (invalid page)", invalid_page)
        s = 4096  # 64 q-tiles per head group: several tiles per CTA, Q slots and K stages wrap
        cu = ft.cu_seqlens([s, s], self.dev)
        self.run(f"proxy {tag} flat bf16 prefill 2 x 4096", lambda: ops.msa_proxy_score(
            self.rnd((2 * s, 4, 128)), self.rnd((2 * s, 1, 128)), cu, cu, max_seqlen_q=s,
            max_k_tiles=s // 128))
        # fp8 / NVFP4 K: raw blocks staged by TMA, converted by the producer warpgroup's threads
        # (generic-proxy stores fenced for the wgmmas), raw and converted rings wrapping.
        fp8 = torch.float8_e4m3fn
        self.run(f"proxy {tag} flat fp8 k causal G4 ragged+empty+uncovered", lambda: ops.msa_proxy_score(
            qk()[0], qk()[1].to(fp8), cu_q, cu_k, max_seqlen_q=max(sq), max_k_tiles=p,
            q_offset=self.i32([-5, 100, 0, 1500])))

        def invalid_page_fp8():
            cache, table, used = self.paged(sk, 1)
            table[0, 2] = -1
            return ops.msa_proxy_score(qk()[0], cache.to(fp8), cu_q, None, page_table=table,
                                       seqused_k=used, max_seqlen_q=max(sq), max_k_tiles=table.shape[1])
        self.run(f"proxy {tag} paged fp8 k G4 (invalid page)", invalid_page_fp8)
        if tag == "sm90_f16":
            # fp8 q and K (their raw Q by TMA, the fragments converted in registers): sm90_f16's
            # only (sm90_only / sm90_ss_only refuse fp8 q).
            self.run(f"proxy {tag} flat fp8 q + fp8 k causal G4 ragged+empty+uncovered",
                     lambda: ops.msa_proxy_score(
                         qk()[0].to(fp8), qk()[1].to(fp8), cu_q, cu_k, max_seqlen_q=max(sq),
                         max_k_tiles=p, q_offset=self.i32([-5, 100, 0, 1500])))

            def invalid_page_fp8_q():
                cache, table, used = self.paged(sk, 1)
                table[0, 2] = -1
                return ops.msa_proxy_score(qk()[0].to(fp8), cache.to(fp8), cu_q, None, page_table=table,
                                           seqused_k=used, max_seqlen_q=max(sq),
                                           max_k_tiles=table.shape[1])
            self.run(f"proxy {tag} paged fp8 q + fp8 k G4 (invalid page)", invalid_page_fp8_q)
        self.run(f"proxy {tag} flat fp8 k prefill 2 x 4096", lambda: ops.msa_proxy_score(
            self.rnd((2 * s, 4, 128)), self.rnd((2 * s, 1, 128)).to(fp8), cu, cu, max_seqlen_q=s,
            max_k_tiles=s // 128))

        def flat_fp4():
            (q4, qs, qg), (k4, ks, kg) = ft.quantize_nvfp4(qk()[0]), ft.quantize_nvfp4(qk()[1])
            return ops.msa_proxy_score_fp4(q4, k4, qs, ks, qg, kg, cu_q, cu_k, max_seqlen_q=max(sq),
                                           max_k_tiles=p)
        self.run(f"proxy {tag} flat nvfp4 q / k causal G4 ragged+empty+uncovered", flat_fp4)

        def invalid_page_fp4():
            cache, table, used = self.paged(sk, 1)
            table[0, 2] = -1
            (q4, qs, qg), (c4, cs, cg) = ft.quantize_nvfp4(qk()[0]), ft.quantize_nvfp4(cache)
            return ops.msa_proxy_score_fp4(q4, c4, qs, cs, qg, cg, cu_q, None, page_table=table,
                                           seqused_k=used, max_seqlen_q=max(sq),
                                           max_k_tiles=table.shape[1])
        self.run(f"proxy {tag} paged nvfp4 q / k G4 (invalid page)", invalid_page_fp4)

    def proxy_decode(self):
        """The decode streaming kernel, forced (plan option kernel=decode_only): paged bf16 /
        fp8 / NVFP4 index-K with ragged and empty contexts and invalid pages, sq 1..4, reduce_heads,
        G 2 with two KV heads, q_offset, padding columns, flat with rows of no sequence."""
        # NVFP4 on the cp.async ring here (decode_nvfp4=cta; its TMA kernel has its own calls below).
        options, fp4 = dict(kernel="decode_only"), dict(kernel="decode_only", decode_nvfp4="cta")
        self._proxy_decode_cases(PlannedOps(self.ops, msa_proxy_score=options,
                                            msa_proxy_score_fp4=fp4))
        # kernel=decode_f16_only: fp16 MMAs for fp8 K, bf16 q rows scaled into fp16 (fp8 q as is).
        self._proxy_decode_paged(
            PlannedOps(self.ops, msa_proxy_score=dict(kernel="decode_f16_only")), ((1, FP8),),
            (BF16, FP8), (1, 4),
            lambda dtype, hkv, q_dtype, sq: f"proxy decode_f16 paged {str(dtype)[6:]} k, "
                                            f"{str(q_dtype)[6:]} q, sq{sq}")
        # decode_ctas=3 / 4: the same kernel built for more CTAs per SM (4 / 3 stages for fp8 K).
        for ctas in (3, 4):
            self._proxy_decode_paged(
                PlannedOps(self.ops, msa_proxy_score=dict(kernel="decode_f16_only", decode_ctas=ctas)),
                ((1, FP8),), (BF16,), (1, 4),
                lambda dtype, hkv, q_dtype, sq, c=ctas: f"proxy decode_ctas={c} paged "
                                                        f"{str(dtype)[6:]} k, sq{sq}")
        # decode_ilp=2: two key blocks per iteration (pairs multiplied together, multi-pass and
        # boundary units one by one), on every case above; and with fp16 MMAs at 3 / 4 CTAs.
        ilp = dict(kernel="decode_only", decode_ilp=2)
        self._proxy_decode_cases(PlannedOps(self.ops, msa_proxy_score=ilp,
                                            msa_proxy_score_fp4=dict(ilp, decode_nvfp4="cta")),
                                 tag="decode_ilp=2")
        for ctas in (3, 4):
            self._proxy_decode_paged(
                PlannedOps(self.ops, msa_proxy_score=dict(kernel="decode_f16_only", decode_ctas=ctas,
                                                          decode_ilp=2)),
                ((1, FP8),), (BF16,), (1, 4),
                lambda dtype, hkv, q_dtype, sq, c=ctas: f"proxy decode_ilp=2 decode_ctas={c} paged "
                                                        f"{str(dtype)[6:]} k, sq{sq}")
        # NVFP4 K converted a word (8 codes; auto since 27436c2) or a byte (2 codes) at a time,
        # one and two key blocks per iteration (sq 1: single-pass pairs; sq 2; sq 5: two passes of
        # 16 rows).
        for cvt in ("word", "byte"):
            for ilp in (1, 2):
                forced = dict(kernel="decode_only", nvfp4_cvt=cvt, decode_ilp=ilp, decode_nvfp4="cta")
                self._proxy_decode_nvfp4(PlannedOps(self.ops, msa_proxy_score_fp4=forced),
                                         f"nvfp4_cvt={cvt} decode_ilp={ilp}", (1, 2, 5))

        # decode_nvfp4=tma: NVFP4 K through the TMA ring (e2m1 rows by TMA, scales by the producer
        # lanes' cp.async), a warp per key block: paged (sq 1, 2: 8 columns; 4: 16; 5: two passes),
        # and flat with partial last blocks and two KV heads (scale rows strided, gathered).
        # decode_tma_issue=warps: the same with each consumer warp issuing its own loads.
        for issue in ("producer", "warps"):
            fp4_tma = PlannedOps(self.ops, msa_proxy_score_fp4=dict(kernel="decode_only", decode_nvfp4="tma",
                                                                    decode_tma_issue=issue))
            self._proxy_decode_nvfp4(fp4_tma, f"decode_nvfp4=tma decode_tma_issue={issue}", (1, 2, 4, 5))
            self._proxy_decode_flat_nvfp4(fp4_tma, f"decode_nvfp4=tma decode_tma_issue={issue}")
        fp8_warps = dict(kernel="decode_f16_only", decode_fp8="tma", decode_tma_issue="warps")
        self._proxy_decode_paged(
            PlannedOps(self.ops, msa_proxy_score=fp8_warps), ((1, FP8),), (BF16,), (1, 4),
            lambda dtype, hkv, q_dtype, sq: f"proxy decode_fp8=tma decode_tma_issue=warps paged sq{sq}",
            reduce_sq=None)


        # decode_fp8=tma: fp8 K through the TMA ring, a warp per key block (bf16 and fp16 MMAs;
        # sq 1 and 2: one pass of 8 columns; sq 3 and 4: one pass of 16 columns), invalid pages
        # and empty contexts (no reduce_heads at sq 3: that call would run the cp.async ring).
        for kernel in ("decode_only", "decode_f16_only"):
            self._proxy_decode_paged(
                PlannedOps(self.ops, msa_proxy_score=dict(kernel=kernel, decode_fp8="tma")),
                ((1, FP8),), (BF16, FP8), (1, 2, 3, 4),
                lambda dtype, hkv, q_dtype, sq, k=kernel: f"proxy decode_fp8=tma {k} paged "
                                                          f"{str(dtype)[6:]} k, {str(q_dtype)[6:]} q, sq{sq}",
                reduce_sq=None)

    def _proxy_decode_paged(self, ops, kinds, q_dtypes, seqlens_q, name, reduce_sq=3):
        """Paged decode calls: ragged and empty contexts, an invalid page, q_offset, padding
        columns; reduce_heads at sq reduce_sq (None: never) with one KV head. kinds: (KV heads, K
        dtype) pairs."""
        lens = [700, 2048, 129, 0, 1000, 1]
        b = len(lens)
        for hkv, dtype in kinds:
            def build(hkv=hkv, dtype=dtype):
                cache, table, used = self.paged(lens, hkv, dtype)
                table[0, 2] = -1  # an invalid page: its column is -inf, nothing read
                return cache, table, used
            paged = self.lazy(build)
            for q_dtype in q_dtypes:
                for seqlen_q in seqlens_q:
                    def call(paged=paged, sqd=seqlen_q, q_dtype=q_dtype,
                             red=hkv == 1 and seqlen_q == reduce_sq):
                        cache, table, used = paged()
                        return ops.msa_proxy_score(
                            self.rnd((b * sqd, 4, 128)).to(q_dtype), cache, self.cu_rows(b, sqd),
                            None, page_table=table, seqused_k=used, max_seqlen_q=sqd,
                            max_k_tiles=table.shape[1] + 2, reduce_heads=red,
                            q_offset=self.i32([350, 1024, 64, 0, 999, 0]))
                    self.run(name(dtype, hkv, q_dtype, seqlen_q), call)

    def _proxy_decode_cases(self, ops, tag="decode"):
        """tag: the calls' name after "proxy " (the plan options they run under)."""
        self._proxy_decode_paged(
            ops, ((1, BF16), (2, BF16), (1, FP8)), (BF16,), (1, 3, 4),
            lambda dtype, hkv, q_dtype, sq: f"proxy {tag} paged {str(dtype)[6:]} k, G{4 // hkv}, "
                                            f"sq{sq}")
        lens = [700, 2048, 129, 0, 1000, 1]
        b = len(lens)
        sq, sk = [1, 4, 0, 2], [300, 1000, 256, 129]
        cu_q, cu_k = ft.cu_seqlens(sq, self.dev), ft.cu_seqlens(sk, self.dev)
        self.run(f"proxy {tag} flat bf16, rows of no sequence", lambda: ops.msa_proxy_score(
            self.rnd((sum(sq) + 3, 4, 128)), self.rnd((sum(sk), 1, 128)), cu_q, cu_k,
            max_seqlen_q=4, max_k_tiles=8))
        self._proxy_decode_nvfp4(ops, tag, (2,))

    def _proxy_decode_flat_nvfp4(self, ops, tag):
        """Flat NVFP4 decode calls (scale rows strided, gathered; partial last blocks; an empty
        context) with one and two KV heads."""
        for hkv in (1, 2):
            lens = [700, 2048, 129, 0, 1000, 1]
            cu_q, cu_k = self.cu_rows(len(lens), 1), ft.cu_seqlens(lens, self.dev)

            def flat_nvfp4(hkv=hkv, lens=lens, cu_q=cu_q, cu_k=cu_k):
                (q4, qs, qg) = ft.quantize_nvfp4(self.rnd((len(lens), 4 * hkv, 128)))
                (k4, ks, kg) = ft.quantize_nvfp4(self.rnd((sum(lens), hkv, 128)))
                return ops.msa_proxy_score_fp4(q4, k4, qs, ks, qg, kg, cu_q, cu_k, max_seqlen_q=1,
                                               max_k_tiles=math.ceil(max(lens) / 128))
            self.run(f"proxy {tag} flat nvfp4 G4 hkv{hkv} sq1", flat_nvfp4)

    def _proxy_decode_nvfp4(self, ops, tag, seqlens_q):
        """Paged NVFP4 decode calls (ragged and empty contexts, 4 heads over 1 KV head) at each
        query length of seqlens_q."""
        lens = [700, 2048, 129, 0, 1000, 1]
        b = len(lens)
        for sq in seqlens_q:
            cu_q = self.cu_rows(b, sq)

            def nvfp4(sq=sq, cu_q=cu_q):
                cache, table, used = self.paged(lens, 1)
                k_fp4, k_sc, k_gs = ft.quantize_nvfp4(cache)
                q_fp4, q_sc, q_gs = ft.quantize_nvfp4(self.rnd((b * sq, 4, 128)))
                return ops.msa_proxy_score_fp4(
                    q_fp4, k_fp4, q_sc, k_sc, q_gs, k_gs, cu_q, None, page_table=table,
                    seqused_k=used, max_seqlen_q=sq, max_k_tiles=table.shape[1])
            self.run(f"proxy {tag} paged nvfp4 sq{sq}", nvfp4)

    def proxy_fp4(self):
        ops = self.ops
        lens = [700, 300]
        b, hq, hkv = len(lens), 4, 1
        cu_q = self.cu_rows(b, 1)

        def call():
            cache, table, used = self.paged(lens, hkv)
            k_fp4, k_sc, k_gs = ft.quantize_nvfp4(cache)
            q_fp4, q_sc, q_gs = ft.quantize_nvfp4(self.rnd((b, hq, 128)))
            return ops.msa_proxy_score_fp4(
                q_fp4, k_fp4, q_sc, k_sc, q_gs, k_gs, cu_q, None, page_table=table,
                seqused_k=used, max_seqlen_q=1, max_k_tiles=table.shape[1])
        self.run("proxy_fp4 paged decode", call)

    def topk(self):
        """Every case under each top-k kernel (plan option kernel): warp-per-row at 32 and at 8
        tokens per CTA, the thread-per-row radix kernel and its lean variant (16-byte loads
        where S % 4 == 0, 4-byte ones on the S = 77 and misaligned cases), and split rows (the
        P = 5000 case: rows over 7 warps of 3 chunks each, then the merge)."""
        for kernel in TOPK_KERNELS:
            self._topk_cases(kernel, PlannedOps(self.ops, msa_topk_select=topk_options(kernel)))

    def _topk_cases(self, kernel, ops):
        for h, p, s in ((2, 24, 12), (4, 128, 64), (2, 300, 40), (1, 2048, 8), (3, 200, 77),
                        (4, 5000, 2)):
            def build(h=h, p=p, s=s):
                score = torch.randn((h, p, s), generator=self.gen, device=self.dev)
                score[:, ::7, ::3] = float("-inf")
                score[0, 1, 0] = float("nan")
                nvp = torch.randint(1, p + 1, (s,), generator=self.gen, device=self.dev)
                nvp = nvp.to(torch.int32)
                nvp[:6] = self.i32([p + 1, 2 * p, 2**31 - 1, 0, -5, p])[: min(6, s)]
                return score, nvp
            data = self.lazy(build)
            for topk in (16, 8, 64):
                fb, fe = (2, 1) if topk >= 3 else (0, 0)
                self.run(f"topk [{kernel}] H{h} P{p} S{s} k{topk} per-token nvp fb{fb} fe{fe}",
                         lambda data=data, topk=topk, fb=fb, fe=fe: ops.msa_topk_select(
                             data()[0], topk, num_valid_pages=data()[1], force_begin_blocks=fb,
                             force_end_blocks=fe))
            self.run(f"topk [{kernel}] H{h} P{p} S{s} scalar nvp, output=",
                     lambda data=data, h=h, p=p, s=s: ops.msa_topk_select(
                         data()[0], 16, num_valid_pages=max(1, p - 3),
                         output=torch.empty((s, h, 16), dtype=torch.int32, device=self.dev),
                         force_end_blocks=1))
            self.run(f"topk [{kernel}] H{h} P{p} S{s} per-token nvp, head-major output=",
                     lambda data=data, h=h, s=s: ops.msa_topk_select(
                         data()[0], 16, num_valid_pages=data()[1],
                         output=torch.empty((h, s, 16), dtype=torch.int32,
                                            device=self.dev).transpose(0, 1),
                         force_end_blocks=1))
        # A score 4 bytes past a 16-byte boundary (S % 4 == 0): the radix kernel's 4-byte loads.
        h, p, s = 2, 130, 64

        def misaligned():
            flat = torch.randn(h * p * s + 1, generator=self.gen, device=self.dev)
            return ops.msa_topk_select(flat[1:].view(h, p, s), 16, num_valid_pages=p,
                                       force_begin_blocks=1, force_end_blocks=1)
        self.run(f"topk [{kernel}] H{h} P{p} S{s} misaligned score", misaligned)

    def sparse_attention(self):
        """Every prefill case under each schedule (plan option schedule: query_major, kv_major,
        hybrid), the KV-major schedule once more with small launch groups (chunk_rows=100) and the
        hybrid one with every tile of up to 96 union blocks taken (tile_max_waste=8: consumer
        warpgroups skip blocks on unrelated selections), both with the default tile kernel (TMA; fp8
        K/V take the cp.async one) and with the cp.async one forced (tile_kernel=cp_async); the TMA
        KV-major kernel (kv_major_kernel=tma) alone, in small groups and under hybrid; the
        warpgroup-MMA KV-major kernel with its partials by each lane's stores (kv_major_store=stg;
        auto's are TMA stores where G % 16 == 0) alone, in small groups and under hybrid, and with
        its row math correctly rounded (kv_major_math=precise) in small groups and under hybrid;
        both
        KV-major schedules once more with
        small launch groups (chunk_rows=100; under hybrid the combine of every group skips the rows
        of done tiles; the default lists=once: initcheck sees the first group's -inf marks and the
        combine's LSE resets), and with each group's work lists built before it (lists=per_group)."""
        for tag, options in (("query_major", dict(schedule="query_major")),
                             ("kv_major", dict(schedule="kv_major")),
                             ("kv_major/chunk100", dict(schedule="kv_major", chunk_rows=100)),
                             ("hybrid", dict(schedule="hybrid")),
                             ("hybrid/chunk100", dict(schedule="hybrid", chunk_rows=100)),
                             ("kv_major/chunk100/per_group", dict(schedule="kv_major", chunk_rows=100,
                                                                  lists="per_group")),
                             ("hybrid/chunk100/per_group", dict(schedule="hybrid", chunk_rows=100,
                                                                lists="per_group")),
                             ("hybrid/waste8", dict(schedule="hybrid", tile_max_waste=8)),
                             ("hybrid/cp_async", dict(schedule="hybrid", tile_kernel="cp_async")),
                             ("hybrid/cp_async/waste8", dict(schedule="hybrid", tile_kernel="cp_async",
                                                             tile_max_waste=8)),
                             # The TMA KV-major kernel (kv_major_kernel=tma; fp8 / NVFP4 K/V and
                             # other G fall back, as the plan text says), alone, in small launch
                             # groups (items crossing groups, lists=once), and under the tiles.
                             ("kv_major/tma", dict(schedule="kv_major", kv_major_kernel="tma")),
                             ("kv_major/tma/chunk100", dict(schedule="kv_major", kv_major_kernel="tma",
                                                            chunk_rows=100)),
                             ("hybrid/tma", dict(schedule="hybrid", kv_major_kernel="tma")),
                             # The warpgroup-MMA KV-major kernel's partials by each lane's stores
                             # (kv_major_store=stg; auto's TMA stores need G % 16 == 0), alone, in
                             # small launch groups and under the tiles.
                             ("kv_major/stg", dict(schedule="kv_major", kv_major_store="stg")),
                             ("kv_major/stg/chunk100", dict(schedule="kv_major", kv_major_store="stg",
                                                            chunk_rows=100)),
                             ("hybrid/stg", dict(schedule="hybrid", kv_major_store="stg")),
                             # Its row LSEs' log2 and 1 / l correctly rounded (kv_major_math=
                             # precise; auto's are MUFU approximations), in small launch groups
                             # and under the tiles.
                             ("kv_major/precise/chunk100", dict(schedule="kv_major", kv_major_math="precise",
                                                                chunk_rows=100)),
                             ("hybrid/precise", dict(schedule="hybrid", kv_major_math="precise")),
                             # The tiles' bound decided on the device (tile_bound=adaptive) over
                             # a low forced bound, so that some tiles sit between the two.
                             ("hybrid/adaptive", dict(schedule="hybrid", tile_max_waste=1.25,
                                                      tile_bound="adaptive"))):
            self._sparse_attention_cases(tag, PlannedOps(self.ops, msa_sparse_attention=options))

    def _sparse_attention_cases(self, tag, ops):

        def run(name, fn):
            self.run(f"sparse [{tag}] {name}", fn)
        # M3 head layout, one causal sequence, low- and high-overlap selections.
        s = 1024
        cu = ft.cu_seqlens([s], self.dev)
        qkv = self.lazy(lambda: (self.rnd((s, 64, 128)), self.rnd((s, 4, 128)),
                                 self.rnd((s, 4, 128))))
        clustered = self.lazy(lambda: self.selection([s], [s], 4, 16, "clustered"))
        run("flat bf16 64/4 causal random", lambda: ops.msa_sparse_attention(
            *qkv(), self.selection([s], [s], 4, 16), cu, cu, causal=True, return_softmax_lse=True))
        run("flat bf16 64/4 causal clustered", lambda: ops.msa_sparse_attention(
            *qkv(), clustered(), cu, cu, causal=True, return_softmax_lse=True))

        # fp8 K / V on high-overlap selections (the shared-selection tiles take fp8 on sm_90a).
        def fp8_clustered():
            q, k, v = qkv()
            return ops.msa_sparse_attention(q, k.to(FP8), v.to(FP8), clustered(), cu, cu,
                                            causal=True, return_softmax_lse=True)
        run("flat fp8 64/4 causal clustered", fp8_clustered)
        # Ragged varlen, fp16, GQA 2, topk 8, non-causal, LSE + temperature LSE, q_offset int.
        sq, sk = [100, 37], [2048, 700]
        cu_q, cu_k = ft.cu_seqlens(sq, self.dev), ft.cu_seqlens(sk, self.dev)
        ragged = self.lazy(lambda: (
            self.rnd((sum(sq), 4, 128), FP16), self.rnd((sum(sk), 2, 128), FP16),
            self.rnd((sum(sk), 2, 128), FP16), self.selection(sq, sk, 2, 8)))
        run("flat fp16 4/2 topk8 non-causal lse+temperature", lambda: ops.msa_sparse_attention(
            *ragged(), cu_q, cu_k, causal=False, return_softmax_lse=True,
            return_temperature_lse=True, lse_temperature_scale=0.7))
        run("flat fp16 causal q_offset=64", lambda: ops.msa_sparse_attention(
            *ragged(), cu_q, cu_k, causal=True, q_offset=64))

        # Set semantics: -1 rows, a hole, duplicates and ids past the sequence.
        def odd_ids():
            q2, k2, v2, sel2 = ragged()
            odd = sel2.clone()
            odd[:, :10] = -1
            odd[:, 10:20, 3] = -1
            odd[:, 20:30, 1] = odd[:, 20:30, 0]
            odd[:, 30:40, 2] = 10_000
            return ops.msa_sparse_attention(q2, k2, v2, odd.contiguous(), cu_q, cu_k, causal=True,
                                            return_softmax_lse=True)
        run("flat fp16 empty rows/holes/dups/out-of-range ids", odd_ids)
        # G=1 with topk 32; TP4 head layout 16/1.
        run("flat bf16 2/2 topk32", lambda: ops.msa_sparse_attention(
            self.rnd((sum(sq), 2, 128)), self.rnd((sum(sk), 2, 128)), self.rnd((sum(sk), 2, 128)),
            self.selection(sq, sk, 2, 32), cu_q, cu_k, causal=True))
        run("flat bf16 16/1 causal", lambda: ops.msa_sparse_attention(
            self.rnd((s, 16, 128)), self.rnd((s, 1, 128)), self.rnd((s, 1, 128)),
            self.selection([s], [s], 1, 16, "clustered"), cu, cu, causal=True))
        # Paged: bf16, fp8, NVFP4 and a packed K|V view, ragged tails, permuted pages.
        sq, sk = [150, 90], [2000, 1237]
        cu_q, cu_k = ft.cu_seqlens(sq, self.dev), ft.cu_seqlens(sk, self.dev)
        q_sel = self.lazy(lambda: (self.rnd((sum(sq), 8, 128)), self.selection(sq, sk, 2, 16)))
        for dtype in (BF16, FP8):
            def paged_call(dtype=dtype):
                qp, sel = q_sel()
                kc, table, used = self.paged(sk, 2, dtype)
                vc = self.rnd(kc.shape).to(dtype)
                return ops.msa_sparse_attention(qp, kc, vc, sel, cu_q, None, causal=True,
                                                page_table=table, seqused_k=used,
                                                return_softmax_lse=True, v_global_scale=0.5)
            run(f"paged {str(dtype)[6:]} 8/2 causal", paged_call)
        paged = self.lazy(lambda: self.paged(sk, 2))

        def packed():
            (qp, sel), (kc, table, used) = q_sel(), paged()
            _, k_view, v_view = ft.pack_kv(kc, self.rnd(kc.shape))
            return ops.msa_sparse_attention(qp, k_view, v_view, sel, cu_q, None, causal=True,
                                            page_table=table, seqused_k=used)
        run("paged bf16 packed K|V view", packed)

        def packed_out():  # out=: the caller's tensor written in place
            (qp, sel), (kc, table, used) = q_sel(), paged()
            _, k_view, v_view = ft.pack_kv(kc, self.rnd(kc.shape))
            return ops.msa_sparse_attention(qp, k_view, v_view, sel, cu_q, None, causal=True,
                                            page_table=table, seqused_k=used,
                                            out=torch.empty_like(qp))
        run("paged bf16 packed K|V view out=", packed_out)

        def paged_nvfp4():
            (qp, sel), (kc, table, used) = q_sel(), paged()
            k4, ks, kg = ft.quantize_nvfp4(kc)
            v4, vs, vg = ft.quantize_nvfp4(self.rnd(kc.shape))
            return ops.msa_sparse_attention(qp, k4, v4, sel, cu_q, None, causal=True,
                                            page_table=table, seqused_k=used, k_scale=ks,
                                            v_scale=vs, k_global_scale=kg, v_global_scale=vg)
        run("paged nvfp4", paged_nvfp4)
        flat = self.lazy(lambda: (self.rnd((sum(sk), 2, 128)), self.rnd((sum(sk), 2, 128))))

        def flat_nvfp4():
            (qp, sel), (kf, vf) = q_sel(), flat()
            k4, ks, kg = ft.quantize_nvfp4(kf)
            v4, vs, vg = ft.quantize_nvfp4(vf)
            return ops.msa_sparse_attention(qp, k4, v4, sel, cu_q, cu_k, causal=True, k_scale=ks,
                                            v_scale=vs, k_global_scale=kg, v_global_scale=vg)
        run("flat nvfp4", flat_nvfp4)

        def flat_fp8():
            (qp, sel), (kf, vf) = q_sel(), flat()
            return ops.msa_sparse_attention(qp, kf.to(FP8), vf.to(FP8), sel, cu_q, cu_k,
                                            causal=True)
        run("flat fp8", flat_fp8)

    def decode(self):
        ops = self.ops
        lens = [700, 2048, 129, 1000, 384, 1900]
        b = len(lens)
        for hq, hkv, dtype in ((64, 4, BF16), (8, 2, FP8), (16, 1, BF16)):
            cache = self.lazy(lambda hkv=hkv, dtype=dtype: self.paged_kv(lens, hkv, dtype))
            for seqlen_q in (1, 4):
                q_sel = self.lazy(lambda hq=hq, hkv=hkv, sqd=seqlen_q: (
                    self.rnd((b * sqd, hq, 128)), self.decode_selection(lens, sqd, hkv)))
                for fused in (True, False, None):
                    for partial in ((None, torch.float32) if fused is False else (None,)):
                        def call(cache=cache, q_sel=q_sel, sqd=seqlen_q, fused=fused,
                                 partial=partial):
                            (kc, vc, table, used), (q, sel) = cache(), q_sel()
                            return ops.msa_sparse_decode_attention(
                                q, kc, vc, sel, page_table=table, seqused_k=used, seqlen_q=sqd,
                                return_softmax_lse=True, force_fused=fused, partial_dtype=partial)
                        self.run(f"decode paged {str(dtype)[6:]} {hq}/{hkv} sq{seqlen_q} "
                                 f"fused={fused} partial={partial}", call)
        paged = self.lazy(lambda: self.paged(lens, 2))
        sel = self.lazy(lambda: mi.random_selection(torch.tensor(lens, device=self.dev) - 1, 2, 16,
                                                    self.gen))

        def build_nvfp4():
            kc, table, used = paged()
            return (*ft.quantize_nvfp4(kc), *ft.quantize_nvfp4(self.rnd(kc.shape)))
        nvfp4 = self.lazy(build_nvfp4)
        for fused in (True, False):
            def nvfp4_call(fused=fused):
                (k4, ks, kg, v4, vs, vg), (_, table, used) = nvfp4(), paged()
                return ops.msa_sparse_decode_attention(
                    self.rnd((b, 8, 128)), k4, v4, sel(), page_table=table, seqused_k=used,
                    k_scale=ks, v_scale=vs, k_global_scale=kg, v_global_scale=vg,
                    force_fused=fused)
            self.run(f"decode paged nvfp4 fused={fused}", nvfp4_call)

        def fp8_q():
            kc, table, used = paged()
            return ops.msa_sparse_decode_attention(
                self.rnd((b, 8, 128)).to(FP8), kc, self.rnd(kc.shape), sel(), page_table=table,
                seqused_k=used)
        self.run("decode paged bf16 fp8 q", fp8_q)

        def fp8_q_out(fused):  # out=: the caller's bf16 tensor written in place
            kc, table, used = paged()
            q = self.rnd((b, 8, 128)).to(FP8)
            return ops.msa_sparse_decode_attention(
                q, kc, self.rnd(kc.shape), sel(), page_table=table, seqused_k=used,
                force_fused=fused, out=torch.empty(q.shape, dtype=BF16, device=self.dev))
        for fused in (True, False):
            self.run(f"decode paged bf16 fp8 q out= fused={fused}", lambda f=fused: fp8_q_out(f))
        self.run("decode flat bf16 cu_seqlens_k", lambda: ops.msa_sparse_decode_attention(
            self.rnd((b, 8, 128)), self.rnd((sum(lens), 2, 128)), self.rnd((sum(lens), 2, 128)),
            sel(), cu_seqlens_k=ft.cu_seqlens(lens, self.dev)))
        self.decode_regs(lens)
        self.decode_mtp_union(lens)
        self.decode_mtp_union_regs(lens)
        self.decode_mtp_wgmma(lens)
        self.decode_mtp_wgmma(lens, pipe="ahead")
        self.decode_mtp_wgmma(lens, pipe="ahead", fp8=True)
        self.decode_split_cluster(lens)
        self.decode_split_warps8(lens)
        self.decode_combine_with(lens)

    def decode_combine_with(self, lens):
        """Split-K decode whose combine loads the partial values with the LSEs (plan option
        combine_loads=with): every kernel that writes partials (smem 16- and 64-row tiles, regs
        with fp8 / NVFP4 K/V, split_warps=8, MTP union items on smem, regs and wgmma), batch 1 at
        M3 and the smoke lengths, each partial dtype, ids out of range and -1 holes (empty splits
        and rows): initcheck finds a slot the combine reads that no kernel wrote."""
        for extra, blens, hq, hkv, dtype, seqlen_q in (
                (dict(kernel="smem", mtp="per_token"), [4096 + 77], 64, 4, BF16, 1),
                (dict(kernel="smem", mtp="per_token"), lens, 8, 2, FP16, 4),
                (dict(kernel="smem", mtp="per_token"), lens[:2], 128, 2, BF16, 1),
                (dict(kernel="regs"), [4096], 64, 4, FP8, 1),
                (dict(kernel="regs"), lens, 16, 4, FP8, 4),
                (dict(split_warps=8), [4096 + 77], 64, 4, BF16, 1),
                (dict(split_warps=8), lens, 16, 4, BF16, 1),
                (dict(mtp="union", kernel="smem"), lens, 64, 4, BF16, 4),
                (dict(mtp="union", kernel="wgmma"), lens, 64, 4, BF16, 4)):
            ops = PlannedOps(self.ops, msa_sparse_decode_attention=dict(extra, combine_loads="with"))
            nb = len(blens)
            cache = self.lazy(lambda blens=blens, hkv=hkv, dtype=dtype: self.paged_kv(blens, hkv, dtype))

            def build(blens=blens, hq=hq, hkv=hkv, sqd=seqlen_q, nb=nb, dtype=dtype):
                sel = self.decode_selection(blens, sqd, hkv)
                sel[:, ::3, 5] = 10 ** 6  # out of range: ignored
                sel[:, 1::4, 9] = -1      # the list ends there
                return self.rnd((nb * sqd, hq, 128)).to(FP16 if dtype == FP16 else BF16), sel
            tag = " ".join(f"{k}={v}" for k, v in extra.items())
            self._decode_fused_and_split(
                ops, cache, self.lazy(build), seqlen_q, (False, None),
                f"decode combine_loads=with {tag} paged {str(dtype)[6:]} B{nb} {hq}/{hkv} sq{seqlen_q}")
        nvfp4_ops = PlannedOps(self.ops, msa_sparse_decode_attention=dict(combine_loads="with"))

        def build_fp4():
            kc, vc, table, used = self.paged_kv(lens, 2)
            (k4, ks, kg), (v4, vs, vg) = ft.quantize_nvfp4(kc), ft.quantize_nvfp4(vc)
            return k4, v4, self.decode_selection(lens, 1, 2), table, used, dict(
                k_scale=ks, v_scale=vs, k_global_scale=kg, v_global_scale=vg)
        nvfp4 = self.lazy(build_fp4)

        def call_fp4():
            k4, v4, sel, table, used, scales = nvfp4()
            return nvfp4_ops.msa_sparse_decode_attention(
                self.rnd((len(lens), 8, 128)), k4, v4, sel, page_table=table, seqused_k=used,
                return_softmax_lse=True, force_fused=False, **scales)
        self.run(f"decode combine_loads=with paged nvfp4 B{len(lens)} 8/2 sq1 fused=False", call_fp4)

    def decode_split_warps8(self, lens):
        """Decode with 8 warps per CTA sharing each block (plan option split_warps=8): batch 1 at
        M3 (16 splits of one block, a partial last block), the smoke lengths (ragged), bf16 / fp16
        / fp8 K/V (fp8: converted in registers), G 16 / 4, bf16 / fp16 / fp8 q, split (forced and by
        the plan) with the default, fp32 and fp8 partials, and fused, ids out of range and -1 holes
        (empty splits and rows); G 32 falls back to 4 warps."""
        ops = PlannedOps(self.ops, msa_sparse_decode_attention=dict(mtp="per_token", split_warps=8))
        for blens, hq, hkv, q_dtype, kv_dtype in (
                ([4096 + 77], 64, 4, BF16, BF16), (lens, 8, 2, FP16, FP16), (lens, 16, 4, FP8, BF16),
                ([4096], 64, 4, BF16, FP8), (lens, 16, 4, FP16, FP8), ([4096 + 77], 64, 4, FP8, FP8),
                (lens[:2], 64, 2, BF16, BF16)):
            nb = len(blens)
            cache = self.lazy(lambda blens=blens, hkv=hkv, dtype=kv_dtype:
                              self.paged_kv(blens, hkv, dtype))

            def build(blens=blens, hq=hq, hkv=hkv, q_dtype=q_dtype, nb=nb):
                sel = self.decode_selection(blens, 1, hkv)
                sel[:, ::3, 5] = 10 ** 6  # out of range: ignored
                sel[:, 1::4, 9] = -1      # the list ends there
                return self.rnd((nb, hq, 128)).to(q_dtype), sel
            self._decode_fused_and_split(
                ops, cache, self.lazy(build), 1, (False, None, True),
                f"decode split_warps=8 paged {str(kv_dtype)[6:]} q={str(q_dtype)[6:]} B{nb} {hq}/{hkv} sq1")

    def decode_split_cluster(self, lens):
        """The splits of a row as one thread-block cluster merging through distributed shared
        memory (plan option split=cluster; sm_90, elsewhere the blocks split runs): batch 1 at M3
        (16 splits: a cluster of 16) and the smoke lengths, the smem and regs kernels, bf16 / fp16
        / fp8 / NVFP4 K/V, G 16 / 4 / 32 (64-row tiles), MTP per-token items, split (forced and by
        the plan) with each partial dtype, ids out of range and -1 holes (empty splits and rows);
        the 4-warp cluster kernels (smem, regs) and the 8-warp one (split_warps=8 under kernel=auto:
        16-bit and fp8 K/V, G <= 16; G = 32 falls back to 4 warps)."""
        b = len(lens)
        for kernel, warps in (("smem", 4), ("regs", 4), ("auto", 8)):
            ops = PlannedOps(self.ops, msa_sparse_decode_attention=dict(
                kernel=kernel, mtp="per_token", split="cluster", split_warps=warps))
            for blens, hq, hkv, q_dtype, kv_dtype, seqlen_q in (
                    ([4096], 64, 4, BF16, BF16, 1), ([4096], 64, 4, BF16, FP8, 1),
                    (lens, 8, 2, FP16, FP16, 1), (lens, 16, 4, FP8, FP8, 4),
                    (lens[:2], 64, 2, BF16, BF16, 1)):
                nb = len(blens)
                cache = self.lazy(lambda blens=blens, hkv=hkv, dtype=kv_dtype:
                                  self.paged_kv(blens, hkv, dtype))

                def build(blens=blens, hq=hq, hkv=hkv, q_dtype=q_dtype, sqd=seqlen_q, nb=nb):
                    sel = self.decode_selection(blens, sqd, hkv)
                    sel[:, ::3, 5] = 10 ** 6  # out of range: ignored
                    sel[:, 1::4, 9] = -1      # the list ends there
                    return self.rnd((nb * sqd, hq, 128)).to(q_dtype), sel
                self._decode_fused_and_split(
                    ops, cache, self.lazy(build), seqlen_q, (False, None),
                    f"decode split=cluster {kernel} w{warps} paged {str(kv_dtype)[6:]} q={str(q_dtype)[6:]} "
                    f"B{nb} {hq}/{hkv} sq{seqlen_q}")
        ops = PlannedOps(self.ops, msa_sparse_decode_attention=dict(split="cluster"))

        def build_fp4():
            kc, vc, table, used = self.paged_kv(lens, 2)
            (k4, ks, kg), (v4, vs, vg) = ft.quantize_nvfp4(kc), ft.quantize_nvfp4(vc)
            sel = self.decode_selection(lens, 1, 2)
            sel[:, ::3, 5] = 10 ** 6
            return k4, v4, sel, table, used, dict(k_scale=ks, v_scale=vs, k_global_scale=kg,
                                                  v_global_scale=vg)
        nvfp4 = self.lazy(build_fp4)

        def call_fp4():
            k4, v4, sel, table, used, scales = nvfp4()
            return ops.msa_sparse_decode_attention(
                self.rnd((b, 8, 128)), k4, v4, sel, page_table=table, seqused_k=used,
                return_softmax_lse=True, force_fused=False, **scales)
        self.run(f"decode split=cluster paged nvfp4 B{b} 8/2 sq1 fused=False", call_fp4)

    def decode_regs(self, lens):
        """The streaming decode variant (plan option kernel=regs): fp8 and NVFP4 K/V converted in
        registers, bf16 / fp16 K/V with 3 stages; M3 and small groups, bf16 / fp16 / fp8 q,
        seqlen_q 1 and 4, fused / split with each partial dtype, ids out of range and -1 holes in
        the lists."""
        ops = PlannedOps(self.ops, msa_sparse_decode_attention=dict(kernel="regs"))
        # NVFP4 K/V also converted a word at a time (nvfp4_cvt=word; seqlen_q 1: MTP calls take
        # union items, which do not convert in registers).
        word_ops = PlannedOps(self.ops, msa_sparse_decode_attention=dict(kernel="regs",
                                                                         nvfp4_cvt="word"))
        # fp8 K/V at one token a request also with the stages filled by TMA (regs_feed=tma, sm_90a;
        # elsewhere the cp.async feed runs).
        tma_ops = PlannedOps(self.ops, msa_sparse_decode_attention=dict(kernel="regs", regs_feed="tma"))
        b = len(lens)
        for hq, hkv, q_dtype, kv_dtype in ((64, 4, BF16, FP8), (8, 2, FP16, FP8), (16, 4, FP8, FP8),
                                           (64, 4, BF16, BF16), (8, 2, FP16, FP16)):
            cache = self.lazy(lambda hkv=hkv, dtype=kv_dtype: self.paged_kv(lens, hkv, dtype))
            for seqlen_q in (1, 4):
                def build(hq=hq, hkv=hkv, q_dtype=q_dtype, sqd=seqlen_q):
                    sel = self.decode_selection(lens, sqd, hkv)
                    sel[:, ::3, 5] = 10 ** 6  # out of range: ignored
                    sel[:, 1::4, 9] = -1      # the list ends there
                    return self.rnd((b * sqd, hq, 128)).to(q_dtype), sel
                feeds = [(ops, "")]
                if kv_dtype == FP8 and seqlen_q == 1:
                    feeds.append((tma_ops, " regs_feed=tma"))
                inputs = self.lazy(build)
                for feed_ops, tag in feeds:
                    self._decode_fused_and_split(
                        feed_ops, cache, inputs, seqlen_q, (True, False, None),
                        f"decode regs{tag} paged {str(kv_dtype)[6:]} q={str(q_dtype)[6:]} {hq}/{hkv} "
                        f"sq{seqlen_q}")
        # NVFP4 K/V converted in registers (raw blocks with their scales, 5 stages).
        for hq, hkv, q_dtype in ((64, 4, BF16), (8, 2, FP8)):
            def build_fp4(hkv=hkv):
                kc, vc, table, used = self.paged_kv(lens, hkv)
                (k4, ks, kg), (v4, vs, vg) = ft.quantize_nvfp4(kc), ft.quantize_nvfp4(vc)
                return k4, v4, dict(k_scale=ks, v_scale=vs, k_global_scale=kg, v_global_scale=vg), \
                    table, used
            cache = self.lazy(build_fp4)
            for seqlen_q in (1, 4):
                def build(hq=hq, hkv=hkv, q_dtype=q_dtype, sqd=seqlen_q):
                    sel = self.decode_selection(lens, sqd, hkv)
                    sel[:, ::3, 5] = 10 ** 6
                    sel[:, 1::4, 9] = -1
                    return self.rnd((b * sqd, hq, 128)).to(q_dtype), sel
                q_sel = self.lazy(build)
                for fused in (True, False):
                    for tag, planned in (("", ops), (" nvfp4_cvt=word", word_ops)):
                        if tag and seqlen_q != 1:
                            continue
                        def call(cache=cache, q_sel=q_sel, sqd=seqlen_q, fused=fused, o=planned):
                            (k4, v4, scales, table, used), (q, sel) = cache(), q_sel()
                            return o.msa_sparse_decode_attention(
                                q, k4, v4, sel, page_table=table, seqused_k=used, seqlen_q=sqd,
                                return_softmax_lse=True, force_fused=fused, **scales)
                        self.run(f"decode regs{tag} paged nvfp4 q={str(q_dtype)[6:]} {hq}/{hkv} "
                                 f"sq{seqlen_q} fused={fused}", call)

    def decode_mtp_union(self, lens):
        """MTP union items (plan option mtp=union): M3 and small groups, bf16 / fp8 / NVFP4
        K/V, seqlen_q 2 and 4, shared and per-token selections, fused / split, ids out of range
        and -1 holes."""
        ops = PlannedOps(self.ops, msa_sparse_decode_attention=dict(mtp="union"))
        b = len(lens)
        for hq, hkv, dtype in ((64, 4, BF16), (64, 4, FP8), (8, 2, FP8), (12, 4, BF16)):
            cache = self.lazy(lambda hkv=hkv, dtype=dtype: self.paged_kv(lens, hkv, dtype))
            for seqlen_q, shared in ((4, True), (4, False), (2, False)):
                def build(hq=hq, hkv=hkv, sqd=seqlen_q, shared=shared):
                    sel = self.mtp_selection(lens, sqd, hkv, shared)
                    return self.rnd((b * sqd, hq, 128)), sel
                q_sel = self.lazy(build)
                for fused in (True, False):
                    def call(cache=cache, q_sel=q_sel, sqd=seqlen_q, fused=fused):
                        (kc, vc, table, used), (q, sel) = cache(), q_sel()
                        return ops.msa_sparse_decode_attention(
                            q, kc, vc, sel, page_table=table, seqused_k=used, seqlen_q=sqd,
                            return_softmax_lse=True, force_fused=fused)
                    self.run(f"decode mtp union paged {str(dtype)[6:]} {hq}/{hkv} sq{seqlen_q} "
                             f"shared={shared} fused={fused}", call)

        def build_nvfp4():
            kc, table, used = self.paged(lens, 2)
            k4, ks, kg = ft.quantize_nvfp4(kc)
            v4, vs, vg = ft.quantize_nvfp4(self.rnd(kc.shape))
            return k4, v4, self.decode_selection(lens, 4, 2), table, used, dict(
                k_scale=ks, v_scale=vs, k_global_scale=kg, v_global_scale=vg)
        nvfp4 = self.lazy(build_nvfp4)
        for fused in (True, False):
            def call(fused=fused):
                k4, v4, sel, table, used, scales = nvfp4()
                return ops.msa_sparse_decode_attention(
                    self.rnd((b * 4, 16, 128)), k4, v4, sel, page_table=table, seqused_k=used,
                    seqlen_q=4, force_fused=fused, **scales)
            self.run(f"decode mtp union paged nvfp4 sq4 fused={fused}", call)

    def mtp_selection(self, lens, seqlen_q, hkv, shared):
        """The MTP calls' selection: decode_selection, every token of a request on its last token's
        selection when `shared`, with ids out of range (every 3rd row) and -1 holes (every 4th)."""
        b = len(lens)
        sel = self.decode_selection(lens, seqlen_q, hkv)
        if shared:
            sel = sel.view(hkv, b, seqlen_q, 16)[:, :, -1:].expand(-1, -1, seqlen_q, -1)
            sel = sel.reshape(hkv, b * seqlen_q, 16).contiguous()
        sel[:, ::3, 5] = 10 ** 6
        sel[:, 1::4, 9] = -1
        return sel

    def decode_mtp_union_regs(self, lens):
        """MTP union items with fp8 K/V converted in registers (plan options kernel=regs,
        mtp=union): M3, G = 8 and G = 3, bf16 / fp16 / fp8 q, seqlen_q 2 and 4, shared and
        per-token selections, fused / split with each partial dtype, ids out of range and -1
        holes."""
        ops = PlannedOps(self.ops, msa_sparse_decode_attention=dict(kernel="regs", mtp="union"))
        b = len(lens)
        for hq, hkv, q_dtype in ((64, 4, BF16), (16, 2, FP16), (12, 4, FP8)):
            cache = self.lazy(lambda hkv=hkv: self.paged_kv(lens, hkv, FP8))
            for seqlen_q, shared in ((4, True), (4, False), (2, False)):
                def build(hq=hq, hkv=hkv, q_dtype=q_dtype, sqd=seqlen_q, shared=shared):
                    sel = self.mtp_selection(lens, sqd, hkv, shared)
                    return self.rnd((b * sqd, hq, 128)).to(q_dtype), sel
                self._decode_fused_and_split(
                    ops, cache, self.lazy(build), seqlen_q, (True, False),
                    f"decode mtp union regs paged fp8 q={str(q_dtype)[6:]} {hq}/{hkv} "
                    f"sq{seqlen_q} shared={shared}")


    def decode_mtp_wgmma(self, lens, pipe="inline", fp8=False):
        """MTP union items with bf16 / fp16 K/V on the sm_90a TMA + wgmma kernel (plan option
        kernel=wgmma; planned as auto where it cannot run): M3, G = 8 and G = 3, seqlen_q 2 and 4,
        shared and per-token selections, fused / split with each partial dtype, ids out of range
        and -1 holes. pipe: the option wgmma_pipe (ahead: the planner / loader warps; then also 40
        requests of M3, 160 items: CTAs that take two items, plans made while a loader streams).
        fp8: fp8 K/V with wgmma_fp8=on (raw copies and the converter warps; the same calls)."""
        options = dict(kernel="wgmma", wgmma_pipe=pipe)
        if fp8:
            options["wgmma_fp8"] = "on"
        ops = PlannedOps(self.ops, msa_sparse_decode_attention=options)
        tag = ("wgmma" if pipe == "inline" else f"wgmma {pipe}") + (" fp8 kv" if fp8 else "")
        if pipe == "ahead":
            many = [700, 130, 1, 300, 129] * 8
            cache = self.lazy(lambda: self.paged_kv(many, 4, FP8 if fp8 else BF16))

            def build_many():
                return self.rnd((len(many) * 4, 64, 128)).to(BF16), self.mtp_selection(many, 4, 4, False)
            self._decode_fused_and_split(ops, cache, self.lazy(build_many), 4, (True, False),
                                         f"decode mtp {tag} paged bfloat16 64/4 sq4 b{len(many)}")
        b = len(lens)
        for hq, hkv, dtype in ((64, 4, BF16), (16, 2, FP16), (12, 4, BF16)):
            cache = self.lazy(lambda hkv=hkv, dtype=dtype: self.paged_kv(lens, hkv, FP8 if fp8 else dtype))
            for seqlen_q, shared in ((4, True), (4, False), (2, False)):
                def build(hq=hq, hkv=hkv, dtype=dtype, sqd=seqlen_q, shared=shared):
                    sel = self.mtp_selection(lens, sqd, hkv, shared)
                    return self.rnd((b * sqd, hq, 128)).to(dtype), sel
                self._decode_fused_and_split(
                    ops, cache, self.lazy(build), seqlen_q, (True, False),
                    f"decode mtp {tag} paged {str(dtype)[6:]} {hq}/{hkv} sq{seqlen_q} shared={shared}")

    def _decode_fused_and_split(self, ops, cache, q_sel, seqlen_q, fuseds, name):
        """Paged decode calls of one problem (cache: K/V, page table, lengths; q_sel: q and the
        selection, both lazy) for each force_fused of `fuseds`; split (False) also with fp32 and
        fp8 partials."""
        for fused in fuseds:
            for partial in (None, torch.float32, FP8) if fused is False else (None,):
                def call(fused=fused, partial=partial):
                    (kc, vc, table, used), (q, sel) = cache(), q_sel()
                    return ops.msa_sparse_decode_attention(
                        q, kc, vc, sel, page_table=table, seqused_k=used, seqlen_q=seqlen_q,
                        return_softmax_lse=True, force_fused=fused, partial_dtype=partial)
                self.run(f"{name} fused={fused} partial={partial}", call)

    def hostile(self):
        """Hostile inputs (every op; attention under each prefill schedule, decode fused and split,
        top-k under each kernel): page ids out of the cache (-1, num_pages, INT32_MAX) in selected
        blocks, block ids out of range (nb, 10^6, INT32_MAX), empty selections (all -1, nvp 0),
        zero-length key and query sequences, no query rows at all, an empty page table, lengths
        beyond the page table (clamped), offsets beyond the keys."""
        ops = self.ops
        big = 2 ** 31 - 1
        # proxy: invalid page ids, zero-length sequences, an empty page table, no query rows,
        # seqused_k beyond the table (clamped), q_offset beyond the keys.
        lens = [700, 0, 300, 129]

        def build_paged():
            cache, table, used = self.paged(lens, 1)
            bad = table.clone()
            bad[0, 1], bad[0, 3], bad[2, 0], bad[3, 1] = -1, cache.shape[0], big, -(2 ** 31)
            return cache, table, bad, used
        paged = self.lazy(build_paged)
        b = len(lens)
        cu_qd = self.cu_rows(b, 4)
        q = self.lazy(lambda: self.rnd((4 * b, 4, 128)))

        def invalid_pages():
            cache, _, bad, used = paged()
            return ops.msa_proxy_score(q(), cache, cu_qd, None, page_table=bad, seqused_k=used,
                                       max_seqlen_q=4, max_k_tiles=bad.shape[1])
        self.run("hostile proxy paged invalid page ids, empty sequence", invalid_pages)

        def beyond_table():
            cache, table, _, _ = paged()
            return ops.msa_proxy_score(
                q(), cache, cu_qd, None, page_table=table,
                seqused_k=self.i32([big, 5000, 0, 2 ** 20]), max_seqlen_q=4,
                max_k_tiles=table.shape[1], q_offset=self.i32([big - 10, 10_000, 0, 5]))
        self.run("hostile proxy paged seqused_k beyond the table (clamped), q_offset beyond keys",
                 beyond_table)
        self.run("hostile proxy paged empty page table", lambda: ops.msa_proxy_score(
            q(), paged()[0], cu_qd, None,
            page_table=torch.zeros((b, 0), dtype=torch.int32, device=self.dev),
            seqused_k=self.i32([0] * b)))
        self.run("hostile proxy flat no query rows", lambda: ops.msa_proxy_score(
            self.rnd((0, 4, 128)), self.rnd((300, 1, 128)), self.i32([0, 0]), self.i32([0, 300]),
            max_k_tiles=3))
        self.run("hostile proxy flat all sequences empty", lambda: ops.msa_proxy_score(
            self.rnd((5, 4, 128)), self.rnd((0, 1, 128)), self.i32([0, 3, 5]), self.i32([0, 0, 0]),
            max_k_tiles=1))

        def fp4_invalid_pages():
            cache, table, bad, used = paged()
            k4, ks, kg = ft.quantize_nvfp4(cache)
            q4, qs, qg = ft.quantize_nvfp4(q())
            return ops.msa_proxy_score_fp4(q4, k4, qs, ks, qg, kg, cu_qd, None, page_table=bad,
                                           seqused_k=used, max_seqlen_q=4,
                                           max_k_tiles=table.shape[1])
        self.run("hostile proxy_fp4 paged invalid page ids", fp4_invalid_pages)
        # top-k: every nvp 0 (empty selections), no tokens, a single block.
        for kernel in TOPK_KERNELS:
            kops = PlannedOps(ops, msa_topk_select=topk_options(kernel))
            score = self.lazy(lambda: torch.randn((2, 300, 40), generator=self.gen,
                                                  device=self.dev))
            self.run(f"hostile topk [{kernel}] nvp all 0 / negative",
                     lambda kops=kops, score=score: kops.msa_topk_select(
                         score(), 16, num_valid_pages=self.i32([0, -5, -(2 ** 31)] * 13 + [0]),
                         force_end_blocks=1))
            self.run(f"hostile topk [{kernel}] no tokens", lambda kops=kops: kops.msa_topk_select(
                torch.empty((2, 300, 0), device=self.dev), 16))
            self.run(f"hostile topk [{kernel}] one block, topk 64",
                     lambda kops=kops, score=score: kops.msa_topk_select(
                         score()[:, :1].contiguous(), 64, force_begin_blocks=1))
        # sparse attention
        for schedule in ("query_major", "kv_major", "hybrid"):
            self._hostile_attention(
                schedule, PlannedOps(self.ops, msa_sparse_attention=dict(schedule=schedule)))
        self._hostile_decode()

    def _hostile_attention(self, tag, ops):
        big = 2 ** 31 - 1
        sq, sk = [40, 0, 25, 30], [700, 300, 0, 1300]
        cu_q, cu_k = ft.cu_seqlens(sq, self.dev), ft.cu_seqlens(sk, self.dev)
        hq, hkv = 16, 2
        q = self.lazy(lambda: self.rnd((sum(sq) + 3, hq, 128)))  # 3 rows of no sequence

        def build_selections():
            sel = self.selection(sq, [max(n, 1) for n in sk], hkv, 16)
            sel = torch.cat([sel, torch.zeros((hkv, 3, 16), dtype=torch.int32, device=self.dev)],
                            1)
            odd = sel.clone()
            odd[:, 0:10] = -1                                  # empty selections
            odd[:, 10:20, 0] = big                             # ids far out of range ...
            odd[:, 20:30, 1] = 10 ** 6
            odd[:, 30:40, 2] = 6                               # ... and just past the sequence
            return sel, odd.contiguous()
        sels = self.lazy(build_selections)
        kv = self.lazy(lambda: (self.rnd((sum(sk), hkv, 128)), self.rnd((sum(sk), hkv, 128))))
        self.run(f"hostile sparse [{tag}] flat empty/out-of-range ids, empty sequences",
                 lambda: ops.msa_sparse_attention(q(), *kv(), sels()[1], cu_q, cu_k, causal=True,
                                                  return_softmax_lse=True))
        self.run(f"hostile sparse [{tag}] flat every selection empty",
                 lambda: ops.msa_sparse_attention(q(), *kv(), torch.full_like(sels()[1], -1), cu_q,
                                                  cu_k, causal=False, return_temperature_lse=True))
        self.run(f"hostile sparse [{tag}] flat q_offset beyond the keys / negative",
                 lambda: ops.msa_sparse_attention(q(), *kv(), sels()[0], cu_q, cu_k, causal=True,
                                                  q_offset=self.i32([big - 100, 5, -(2 ** 31), -3]),
                                                  return_softmax_lse=True))
        self.run(f"hostile sparse [{tag}] no query rows", lambda: ops.msa_sparse_attention(
            self.rnd((0, hq, 128)), *kv(), torch.empty((hkv, 0, 16), dtype=torch.int32,
                                                        device=self.dev),
            self.i32([0, 0, 0, 0, 0]), cu_k, causal=True))
        for dtype in (BF16, FP8):
            def build_cache(dtype=dtype):
                kc, vc, table, _ = self.paged_kv([max(n, 1) for n in sk], hkv, dtype)
                bad = table.clone()
                bad[0, 0], bad[0, 3], bad[3, 2], bad[3, 5] = -1, kc.shape[0], big, -7
                return kc, vc, table, bad
            cache = self.lazy(build_cache)

            def invalid_pages(cache=cache):
                kc, vc, _, bad = cache()
                return ops.msa_sparse_attention(
                    q(), kc, vc, sels()[1], cu_q, None, causal=True, page_table=bad,
                    seqused_k=self.i32([700, 0, 0, 1300]), return_softmax_lse=True)
            self.run(f"hostile sparse [{tag}] paged {str(dtype)[6:]} invalid page ids, odd ids",
                     invalid_pages)

            def beyond_table(cache=cache):
                kc, vc, table, _ = cache()
                return ops.msa_sparse_attention(
                    q(), kc, vc, sels()[0], cu_q, None, causal=True, page_table=table,
                    seqused_k=self.i32([big, 10 ** 6, 0, 1300]))
            self.run(f"hostile sparse [{tag}] paged {str(dtype)[6:]} lengths beyond the table",
                     beyond_table)

            def cu_seqlens_k_max(cache=cache):
                kc, vc, table, _ = cache()
                return ops.msa_sparse_attention(
                    q(), kc, vc, sels()[0], cu_q, self.i32([0, big, big, big, big]), causal=True,
                    page_table=table, seqused_k=self.i32([1, 1, 1, 1]))
            self.run(f"hostile sparse [{tag}] paged {str(dtype)[6:]} cu_seqlens_k up to INT32_MAX",
                     cu_seqlens_k_max)

        def build_bf16():
            kc, table, used = self.paged([max(n, 1) for n in sk], hkv)
            bad = table.clone()
            bad[0, 1], bad[3, 0] = kc.shape[0] + 5, -1
            return kc, bad, used
        paged = self.lazy(build_bf16)

        def packed():
            kc, bad, used = paged()
            _, k_view, v_view = ft.pack_kv(kc, self.rnd(kc.shape))
            return ops.msa_sparse_attention(q(), k_view, v_view, sels()[1], cu_q, None,
                                            causal=True, page_table=bad, seqused_k=used)
        self.run(f"hostile sparse [{tag}] packed invalid page ids, odd ids", packed)

        def nvfp4():
            kc, bad, used = paged()
            k4, ks, kg = ft.quantize_nvfp4(kc)
            v4, vs, vg = ft.quantize_nvfp4(self.rnd(kc.shape))
            return ops.msa_sparse_attention(q(), k4, v4, sels()[1], cu_q, None, causal=True,
                                            page_table=bad, seqused_k=used, k_scale=ks,
                                            v_scale=vs, k_global_scale=kg, v_global_scale=vg)
        self.run(f"hostile sparse [{tag}] paged nvfp4 invalid page ids, odd ids", nvfp4)

    def _hostile_decode(self):
        ops = self.ops
        big = 2 ** 31 - 1
        lens = [700, 0, 129, 2000, 1, 0]
        b, hq, hkv, seqlen_q = len(lens), 16, 2, 2
        for dtype in (BF16, FP8):
            def build(dtype=dtype):
                kc, vc, table, _ = self.paged_kv([max(n, 1) for n in lens], hkv, dtype)
                sel = self.decode_selection(lens, seqlen_q, hkv)
                sel[:, 0:2] = -1                 # empty selections
                sel[:, 2:4, 3] = big             # ids out of range
                sel[:, 4:6, 0] = 10 ** 6
                sel[:, 6:8, 5] = 16              # just past the sequence
                bad = table.clone()
                bad[0, 0], bad[0, 3], bad[3, 1], bad[3, 10] = -1, kc.shape[0], big, -(2 ** 31)
                return self.rnd((b * seqlen_q, hq, 128)), kc, vc, sel.contiguous(), table, bad
            data = self.lazy(build)
            for fused in (True, False):
                for name, use_bad, seqused in (
                        ("invalid page ids, zero-length sequences, odd ids", True, lens),
                        ("lengths beyond the table", False, [big, 0, 10 ** 6, 2000, 0, 5000])):
                    def call(data=data, use_bad=use_bad, seqused=seqused, fused=fused):
                        q, kc, vc, sel, table, bad = data()
                        return ops.msa_sparse_decode_attention(
                            q, kc, vc, sel, page_table=bad if use_bad else table,
                            seqused_k=self.i32(seqused), seqlen_q=seqlen_q,
                            return_softmax_lse=True, force_fused=fused)
                    self.run(f"hostile decode {str(dtype)[6:]} fused={fused} {name}", call)

                def empty(data=data, fused=fused):
                    q, kc, vc, sel, table, _ = data()
                    return ops.msa_sparse_decode_attention(
                        q, kc, vc, sel, page_table=table, seqused_k=self.i32([0] * b),
                        seqlen_q=seqlen_q, force_fused=fused)
                self.run(f"hostile decode {str(dtype)[6:]} fused={fused} every sequence empty",
                         empty)

        def batch0():
            kc, vc, table, _ = self.paged_kv([max(n, 1) for n in lens], hkv, FP8)
            return ops.msa_sparse_decode_attention(
                self.rnd((0, hq, 128)), kc, vc, torch.empty((hkv, 0, 16), dtype=torch.int32,
                                                            device=self.dev),
                page_table=table[:0], seqused_k=self.i32([]))
        self.run("hostile decode batch 0", batch0)

    def pipeline(self):
        """The M3 decode step at a small size: proxy (per-head) -> top-k -> decode."""
        ops = self.ops
        b, ctx = 8, 1024
        lens = [ctx - 37 * i for i in range(b)]
        cu_q = self.cu_rows(b, 1)

        def step():
            ik, table, used = self.paged(lens, 1)
            kc = self.rnd((ik.shape[0], 4, 128, 128))
            vc = self.rnd(kc.shape)
            scores = ops.msa_proxy_score(self.rnd((b, 4, 128)), ik, cu_q, None, page_table=table,
                                         seqused_k=used, max_seqlen_q=1,
                                         max_k_tiles=table.shape[1])
            nvp = ((used - 1) // mi.BLOCK + 1).to(torch.int32)
            sel = ops.msa_topk_select(scores, 16, num_valid_pages=nvp, force_end_blocks=1)
            return ops.msa_sparse_decode_attention(
                self.rnd((b, 64, 128)), kc, vc, sel.transpose(0, 1).contiguous(),
                page_table=table, seqused_k=used)
        self.run("pipeline M3 decode step B8", step)


class Lazy:
    """A value built on the first call, from its own generator (Smoke.lazy), then kept."""

    def __init__(self, smoke, seed, build):
        self.smoke, self.seed, self.build = smoke, seed, build
        self.built, self.value = False, None

    def __call__(self):
        if not self.built:
            smoke = self.smoke
            outer, smoke.gen = smoke.gen, mi.cuda_generator(self.seed, smoke.dev)
            try:
                self.value = self.build()
            finally:
                smoke.gen = outer
            self.built = True
        return self.value


class PlannedOps:
    """flashmsa.msa_ops with plan options for some ops: their calls go through the private planned
    twins (msa_ops._*_planned(..., options=...)), the rest to the public functions.

    Given another PlannedOps, the options go on top of its own (per op, key by key; these win),
    and its `skip` stays: skip(op, options) returns why a call with those options is not run
    (raised as NotImplementedError, which the smoke prints as SKIP) or None."""

    _TWINS = {"msa_proxy_score": "_proxy_score_planned",
              "msa_proxy_score_fp4": "_proxy_score_fp4_planned",
              "msa_topk_select": "_topk_select_planned",
              "msa_sparse_attention": "_sparse_attention_planned",
              "msa_sparse_decode_attention": "_sparse_decode_planned"}

    def __init__(self, ops, skip=None, **options):
        if isinstance(ops, PlannedOps):
            base = ops._options
            options = {op: {**base.get(op, {}), **options.get(op, {})} for op in {*base, *options}}
            skip = skip or ops._skip
            ops = ops._ops
        self._ops, self._options, self._skip = ops, options, skip

    def __getattr__(self, name):
        if name in self._options:
            why = self._skip(name, self._options[name]) if self._skip is not None else None
            if why is not None:
                def skipped(*args, **kwargs):
                    raise NotImplementedError(why)
                return skipped
            return functools.partial(getattr(self._ops, self._TWINS[name]),
                                     options=self._options[name])
        return getattr(self._ops, name)


def no_tma_stores(ops) -> PlannedOps:
    """ops for initcheck, which does not count a TMA store as a write (gpu_check.sh runs
    tests/sanitizer/run_initcheck_tma_store.sh first and passes --no-tma-stores only where that
    control shows it): every sparse-attention call stores the KV-major partials by each lane's
    stores (kv_major_store=stg, the same values), and the calls of the TMA KV-major kernel, whose
    partials go only by TMA stores, are skipped. Otherwise each read of a TMA-stored partial by
    the combine would be reported as uninitialized, and the reports, past the print limit, slow
    the shard to a stop. memcheck, racecheck and synccheck run the TMA stores."""

    def skip(op, options):
        if op == "msa_sparse_attention" and "tma" in (options.get("kv_major_kernel"),
                                                      options.get("kv_major_store")):
            return ("--no-tma-stores: initcheck does not see the TMA stores of the KV-major "
                    "partials (tests/sanitizer/run_initcheck_tma_store.sh)")
        return None

    return PlannedOps(ops, skip, msa_sparse_attention=dict(kv_major_store="stg"))


_RESULT_LINE = re.compile(r"^(?:PASS (.*) \([0-9.]+ s\)|SKIP (.*?): (?:NotImplementedError|AttributeError): .*)$")


def finished_cases(path: str) -> frozenset:
    """The case names an earlier run's output at `path` reports as PASS or SKIP (a FAIL, or a case
    cut before its result line, runs again)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise SystemExit(f"sanitize_smoke: --resume {path}: {e.strerror}") from None
    names = set()
    for line in lines:
        m = _RESULT_LINE.match(line)
        if m:
            names.add(m.group(1) if m.group(1) is not None else m.group(2))
    return frozenset(names)


def parse_shard(text: str):
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N, got {text!r}") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"expected 1 <= I <= N, got {text!r}")
    return i, n


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", metavar="SUBSTRING", default=None,
                        help="run only the cases whose name contains SUBSTRING (case-sensitive; "
                             "several alternatives separated by '|')")
    parser.add_argument("--shard", metavar="I/N", type=parse_shard, default=None,
                        help="run only every N-th case from the I-th (1-based) of those --only "
                             "selects, in case order (one of N concurrent sanitizer processes)")
    parser.add_argument("--no-tma-stores", action="store_true",
                        help="for initcheck, which does not count TMA stores as writes: the "
                             "KV-major partials by each lane's stores (kv_major_store=stg), the "
                             "TMA KV-major kernel's calls skipped (see no_tma_stores)")
    parser.add_argument("--resume", metavar="LOG", default=None,
                        help="leave out the cases that LOG, an earlier run's output, reports as "
                             "PASS or SKIP (finishing a run a time limit cut); applied before "
                             "--shard")
    parser.add_argument("--list", action="store_true",
                        help="print the names of the selected cases, one a line, and call no op "
                             "(builds the inputs; on the CPU where there is no CUDA device)")
    args = parser.parse_args(argv)
    if args.list:
        dev = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
               else torch.device("cpu"))
    elif not torch.cuda.is_available():
        print("sanitize_smoke: no CUDA device", file=sys.stderr)
        return 2
    else:
        dev = torch.device("cuda", torch.cuda.current_device())
    from flashmsa import msa_ops
    start = time.monotonic()
    ops = no_tma_stores(msa_ops) if args.no_tma_stores else msa_ops
    done = finished_cases(args.resume) if args.resume is not None else frozenset()
    smoke = Smoke(ops, dev, args.only, args.shard, listing=args.list, done=done)
    smoke.run_parts()
    ran = len(smoke.listed) + len(smoke.passed) + len(smoke.skipped) + len(smoke.failed)
    scope = ""
    if args.only is not None:
        scope += f", {smoke.filtered} not matching --only {args.only!r}"
    if args.resume is not None:
        scope += f", {smoke.resumed} done in {args.resume}"
    if args.shard is not None:
        scope += f", shard {args.shard[0]}/{args.shard[1]} ({ran} of {smoke.matched} calls)"
    if args.list:
        print(f"sanitize_smoke: {ran} listed{scope}", file=sys.stderr)
    else:
        print(f"sanitize_smoke: {len(smoke.passed)} passed, {len(smoke.skipped)} skipped, "
              f"{len(smoke.failed)} failed{scope} in {time.monotonic() - start:.1f} s", flush=True)
        for name in smoke.failed:
            print(f"  failed: {name}")
    if args.only is not None and smoke.matched + smoke.resumed == 0:
        print(f"sanitize_smoke: no case name contains {args.only!r}", file=sys.stderr)
        return 2
    return 1 if smoke.failed else 0


if __name__ == "__main__":
    sys.exit(main())
