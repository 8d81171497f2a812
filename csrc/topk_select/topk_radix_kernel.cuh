// msa_topk_select on SM80+, the thread-per-row kernel for large score tensors (many rows): the
// same result as topk_select_kernel.cuh (docs/semantics.md#topk-select, #d3), bit for bit, at a
// fraction of its instructions per row.
//
// A warp owns 32 consecutive tokens of one head; lane l owns row (s0 + l, h), whole. Nothing is
// shared between the warps of a CTA: each warp has its own slice of shared memory and
// synchronizes with __syncwarp only. Per warp, the blocks some row can choose are streamed in
// chunks of kChunk blocks (16-byte cp.async of 4 tokens where S % 4 == 0; double-buffered: chunk
// c + 1 loads while chunk c is chosen from, or one buffer), into a [block][lane] tile whose row
// is the 32 tokens of one block (128 contiguous bytes in memory and in shared memory; lane l's
// column is conflict-free).
//
// Each lane keeps its row's current choice (the carry: the best `target` entries so far, in
// block order, with the largest key among them). A chunk entry whose key is not below that
// largest key can never be chosen (it ranks after every carried entry: a larger key, or an equal
// key at a higher block), so the chunk is filtered and compacted in place while its scores become
// order keys; on random data only the first chunk of a row keeps most of its entries. Among
// (carry) + (survivors) the lane then finds the `target` best with an exact radix select on the
// order key, 4 bits at a time, most significant first: a private 16-bin histogram (bins
// [digit][lane]: lane l only ever touches bank l) of the keys that share the digits fixed so far
// picks the bin holding the remaining rank; it stops as soon as that bin holds exactly the keys
// still needed, else after the last digit with the exact key value K* and the count `need` of
// keys equal to it to take. One pass in block order takes key < K*, plus the first `need` keys
// == K*: exactly the reference's (key asc, block asc) order. The choice is the new carry, or on
// the row's last chunk the output row. docs/design/topk_select.md has the reasoning and numbers.
//
// One template, three variants (topk_select_config.h, radix::Variant): the kernel `radix` as
// measured (Classic) and the lean radix_1buf (by_size's kernel for large calls): a row's first
// chunk converted in place without compaction, the insertion-or-radix choice made warp-uniform,
// the radix select started at the keys' range with bins of at most one float exponent, and one
// chunk buffer and one warp per CTA (more warps per SM). Two more lean variants, radix_lean (two
// buffers) and radix_c32 (one buffer of 32 blocks), measured slower and were removed. A third one,
// radix_uniform (Uniform1Buf, off by default), is radix_1buf with its passes branch-free and their
// trip counts warp-uniform: the filter, the survivors' radix levels and the ordered output.
// docs/design/topk_select.md, "Uniform passes".
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "common/ptx.cuh"
#include "flashmsa/params.h"
#include "flashmsa/semantics.h"
#include "topk_select/topk_select_config.h"

namespace flashmsa::cuda::topk {

extern __shared__ __align__(16) uint8_t topk_smem_raw[];

namespace radix {

// One warp's shared memory (layout: warp_words in topk_select_config.h). Every array is
// [row][32 lanes]; a lane only touches its own column, except the chunk loads.
struct WarpSmem {
  uint32_t* carry_key;  // [carry][32]: the carry sits in rows [carry - n_carry, carry)
  int* carry_idx;       // [carry][32]: its block ids
  uint32_t* tiles;      // [kBuffers][kChunk][32]: chunk buffers (scores, then keys)
  uint8_t* offsets;     // [kChunk / 4][32] words: block offsets (in the chunk) of the compacted
                        // keys, four to a word of the lane's own (see offset_at)
  uint32_t* hist;       // [kBins + 1][32]: bin kBins is a spare that is never read
};

// The loads of chunk c (blocks [b_begin, b_end), all inside the chunk) into tile rows
// block - p0 (p0: the chunk's first block). Vectorized: 8 lanes cover the 32 tokens of one block (16 bytes each), a warp
// instruction 4 blocks; needs S % 4 == 0 and a 16-byte aligned score (the host checks).
__device__ __forceinline__ void load_chunk(const Params& rp, uint32_t* tile, const float* src,
                                           int ntok, int b_begin, int b_end, int p0) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = rp.p.num_tokens;
  uint32_t* rows = tile + (b_begin - p0) * 32;  // the row of block b_begin
  const int nb = b_end - b_begin;
  src += b_begin * stride;
  if (rp.vec) {
    const int seg = (lane & 7) * 4;
    if (seg < ntok) {  // ntok is a multiple of 4 here (S % 4 == 0)
#pragma unroll 4
      for (int i = lane >> 3; i < nb; i += 4)
        cp_async_16(smem_addr(rows + i * 32 + seg), src + i * stride + seg);
    }
  } else if (lane < ntok) {
#pragma unroll 4
    for (int i = 0; i < nb; ++i) cp_async_4(smem_addr(rows + i * 32 + lane), src + i * stride + lane);
  }
  cp_async_commit();
}

// f(value, row) for the rows [r_lo, r_hi) of a lane's column `col` (col[row * 32]), in order. The
// values are read kBatch at a time before any is used: the compiler keeps shared loads behind
// earlier shared atomics / stores (it cannot tell the addresses apart), so one load per step
// would expose the full load latency on every key. f may write rows <= the current one.
template <int kBatch = 8, typename T, typename F>
__device__ __forceinline__ void for_each_row(const T* col, int r_lo, int r_hi, F&& f) {
  int row = r_lo;
  for (; row + kBatch <= r_hi; row += kBatch) {
    T v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) v[i] = col[(row + i) * 32];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) f(v[i], row + i);
  }
  for (; row < r_hi; ++row) f(col[row * 32], row);
}

// A candidate of the ordered output: its order key and block id.
struct Entry {
  uint32_t key;
  int blk;
};

// f(load(row), row) for the rows [r_lo, r_hi), in order, the entries loaded kBatch at a time
// before any is used (as in for_each_row; here the key and its block id, whose loads would
// otherwise wait behind f's stores to the carry). f may write rows <= the current one.
template <int kBatch = 8, typename L, typename F>
__device__ __forceinline__ void for_each_entry(int r_lo, int r_hi, L&& load, F&& f) {
  int row = r_lo;
  for (; row + kBatch <= r_hi; row += kBatch) {
    Entry e[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) e[i] = load(row + i);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) f(e[i], row + i);
  }
  for (; row < r_hi; ++row) f(load(row), row);
}

// The bin holding rank `rem` (1-based) of the histogram: `below` keys lie in lower bins, `m` in
// it. The bins hold at least `rem` keys in all (the caller's invariant).
__device__ __forceinline__ void find_bin(const uint32_t* hist, int rem, int& bin, int& below,
                                         int& m) {
  int cum = 0;
  bool found = false;
  bin = kBins - 1;
  below = 0;
  m = 0;
#pragma unroll
  for (int d = 0; d < kBins; ++d) {
    const int c = int(hist[d * 32]);
    if (!found && cum + c >= rem) {
      found = true;
      bin = d;
      below = cum;
      m = c;
    }
    cum += c;
  }
}

// Byte offset of entry `row` in a lane's offset column (from ws.offsets + 4 * lane): byte row % 4
// of word (row / 4) * 32 + lane. A word holds one lane's bytes only, so no two lanes ever write
// parts of one word, and a warp's accesses to one row fall into 32 different banks.
__device__ __forceinline__ int offset_at(int row) { return (row >> 2) * 128 + (row & 3); }

__device__ __forceinline__ void clear_hist(uint32_t* hist) {
#pragma unroll
  for (int d = 0; d < kBins; ++d) hist[d * 32] = 0;
}

// A lane's row: its ranges and its carried choice.
struct RowState {
  TopkRanges r;
  int n_carry;         // entries carried (<= target), in carry rows [carry - n_carry, carry)
  uint32_t max_carry;  // their largest key (meaningful when n_carry == target)
  uint32_t min_carry;  // kLean: a lower bound of their keys (when n_carry > 0)
};

// One lane, one row, one chunk: the row's candidates are tile rows [j_lo, j_hi) of buffer `b`
// (blocks p0 + j). Chooses the row's `target` best of (carry) + (these); `last`: into the output
// row, else as the new carry.
template <class V>
__device__ __forceinline__ void select_chunk(const Params& rp, const WarpSmem& ws, int b,
                                             RowState& st, int j_lo, int j_hi, int p0, bool last,
                                             int* out_row) {
  const int lane = threadIdx.x & 31;
  const int kc = rp.carry;
  uint32_t* ckey = ws.carry_key + lane;
  int* cidx = ws.carry_idx + lane;
  uint32_t* tile = ws.tiles + b * V::kChunk * 32 + lane;
  uint8_t* offs = ws.offsets + lane * 4;
  uint32_t* hist = ws.hist + lane;
  const TopkRanges& r = st.r;
  const int target = r.target;
  const int c_lo = kc - st.n_carry;  // carry rows [c_lo, kc)

  // Scores -> order keys; the entries that can still be chosen end up in tile rows
  // [t_lo, t_lo + w): compacted to rows [0, w) (in place: row w <= j) with their block offsets in
  // `offs`, or (lean, no full carry: every entry is kept) where they are, block p0 + row. Without a
  // full carry the pass also counts the top digits for the radix select below (lean: it takes the
  // keys' range instead).
  const bool full = st.n_carry == target;
  int t_lo = 0;
  int w = 0;
  bool in_place = false;
  uint32_t key_lo = 0xFFFFFFFFu;  // lean: the smallest key of the chunk's entries kept
  uint32_t key_hi = 0;            // lean, no full carry: their largest
  if (!full) {
    if constexpr (V::kLean) {
      for_each_row(tile, j_lo, j_hi, [&](uint32_t bits, int j) {
        const uint32_t k = topk_order_key(__uint_as_float(bits));
        tile[j * 32] = k;
        key_lo = min(key_lo, k);
        key_hi = max(key_hi, k);
      });
      t_lo = j_lo;
      w = j_hi - j_lo;
      in_place = true;
    } else {
      clear_hist(hist);
      for_each_row(tile, j_lo, j_hi, [&](uint32_t bits, int j) {
        const uint32_t k = topk_order_key(__uint_as_float(bits));
        tile[w * 32] = k;
        offs[offset_at(w)] = uint8_t(j);
        atomicAdd(hist + (k >> 28) * 32, 1u);
        ++w;
      });
    }
  } else {
    const uint32_t max_carry = st.max_carry;
    if constexpr (V::kUniform) {
      // Branch-free: every entry is written at row w (<= j: a row already read); a dropped one
      // is overwritten by the next survivor or lies past the survivors.
      for_each_row(tile, j_lo, j_hi, [&](uint32_t bits, int j) {
        const uint32_t k = topk_order_key(__uint_as_float(bits));
        const bool keep = k < max_carry;
        tile[w * 32] = k;
        offs[offset_at(w)] = uint8_t(j);
        w += int(keep);
        key_lo = min(key_lo, keep ? k : 0xFFFFFFFFu);
      });
    } else {
      for_each_row(tile, j_lo, j_hi, [&](uint32_t bits, int j) {
        const uint32_t k = topk_order_key(__uint_as_float(bits));
        if (k < max_carry) {
          tile[w * 32] = k;
          offs[offset_at(w)] = uint8_t(j);
          ++w;
          if constexpr (V::kLean) key_lo = min(key_lo, k);
        }
      });
    }
    if (w == 0 && !last) return;  // nothing beats the carry: it stands

    // A few survivors: each replaces the carry's worst entry (the largest key, the highest block
    // among equal ones) if it still beats it, and is appended (its block is above every carried
    // one). ~5 instructions per carried entry and survivor, against a radix select's ~110 per
    // digit plus its passes. Lean: only when every lane here can (both ways give the same bits),
    // so that a warp does not run both paths one after the other.
    bool insert = w * (target + 4) <= kInsertBudget;
    if constexpr (V::kLean) insert = __all_sync(__activemask(), insert);
    if (insert) {
      uint32_t mx = st.max_carry;
      uint32_t mn = st.min_carry;
      for (int i = 0; i < w; ++i) {
        const uint32_t k = tile[i * 32];
        if (!(k < mx)) continue;
        int worst = -1;
        uint32_t rest = 0;  // the largest key of the entries that stay
        for_each_row(ckey, c_lo, kc, [&](uint32_t c, int row) {
          if (c == mx) {
            if (worst >= 0) rest = mx;
            worst = row;
          } else {
            rest = max(rest, c);
          }
        });
        for (int row = worst; row + 1 < kc; ++row) {
          ckey[row * 32] = ckey[(row + 1) * 32];
          cidx[row * 32] = cidx[(row + 1) * 32];
        }
        ckey[(kc - 1) * 32] = k;
        cidx[(kc - 1) * 32] = p0 + int(offs[offset_at(i)]);
        mx = max(rest, k);
        if constexpr (V::kLean) mn = min(mn, k);  // a lower bound of the carry's keys
      }
      st.max_carry = mx;
      if constexpr (V::kLean) st.min_carry = mn;
      if (last) {
        for_each_row(ckey, c_lo, kc, [&](uint32_t, int row) {
          out_row[r.fb + row - c_lo] = cidx[row * 32];
        });
        write_topk_frame(out_row, rp.p.topk, r, target, 0, 1);
        st.n_carry = 0;
      }
      return;
    }
    if constexpr (!V::kLean) {
      clear_hist(hist);
      for_each_row(tile, 0, w, [&](uint32_t k, int) { atomicAdd(hist + (k >> 28) * 32, 1u); });
    }
  }

  // The chunk's entries are tile rows [t_lo, t_hi). Uniform: the passes over them run to t_end,
  // the warp's largest survivor count from t_lo (rows past t_hi are masked: their tile rows hold
  // dropped keys or scores), so that lanes of different survivor counts run the same loop;
  // otherwise t_end == t_hi.
  const int t_hi = t_lo + w;
  int t_end = t_hi;
  if constexpr (V::kUniform)
    t_end = t_lo + min(int(__reduce_max_sync(__activemask(), unsigned(w))), V::kChunk - t_lo);

  // Selection rule: key < thr, or key == thr and among the first `need` such keys in block order.
  const int m = st.n_carry + w;
  uint32_t thr = 0xFFFFFFFFu;  // take everything (m <= target)
  int need = INT_MAX;
  if (m > target) {
    if constexpr (V::kLean) {
      // Every key of the select lies in [base, top]: after a full carry in [the survivors' and the
      // carry's lower bound, max_carry] (the survivors are below max_carry), else in the range of
      // the chunk's keys and the carry's. The first level's bins are 2^shift wide from the
      // smallest key, shift = the range's bit length - 4 but at most 23 (one exponent of the
      // float: on a wide range the bins follow the best key's exponents, the top-digit levels of
      // `radix` split Gaussian keys into one or two bins), its last bin taking every key above.
      // Each further level splits the chosen bin [base, top] 16 ways.
      uint32_t base, top;
      if (full) {
        base = min(st.min_carry, key_lo);
        top = st.max_carry;
      } else {
        base = st.n_carry > 0 ? min(key_lo, st.min_carry) : key_lo;
        top = st.n_carry > 0 ? max(key_hi, st.max_carry) : key_hi;
      }
      int shift = min(max(32 - __clz(top - base) - 4, 0), 23);
      clear_hist(hist);
      auto count_first = [&](uint32_t k, int) {
        atomicAdd(hist + min((k - base) >> shift, uint32_t(kBins - 1)) * 32, 1u);
      };
      for_each_row(ckey, c_lo, kc, count_first);
      if constexpr (V::kUniform) {
        for_each_row(tile, t_lo, t_end, [&](uint32_t k, int row) {  // masked: the spare bin
          const uint32_t d = min((k - base) >> shift, uint32_t(kBins - 1));
          atomicAdd(hist + (row < t_hi ? d : uint32_t(kBins)) * 32, 1u);
        });
      } else {
        for_each_row(tile, t_lo, t_lo + w, count_first);
      }
      int rem = target;  // ranks still to fill among the keys in [base, top]
      for (bool first = true;; first = false) {
        int bin, below, cnt;
        find_bin(hist, rem, bin, below, cnt);
        rem -= below;
        const uint32_t b_lo = base + (uint32_t(bin) << shift);  // <= a key of the bin: no wrap
        uint32_t b_hi = b_lo + ((1u << shift) - 1u);
        if ((first && bin == kBins - 1) || b_hi < b_lo || b_hi > top) b_hi = top;
        base = b_lo;
        top = b_hi;
        if (cnt == rem) {  // the whole bin is taken: every key <= its top
          thr = top;
          break;
        }
        if (base == top) {  // the exact rank-`target` key; `rem` of the keys equal to it are taken
          thr = base;
          need = rem;
          break;
        }
        shift = max(32 - __clz(top - base) - 4, 0);  // (k - base) >> shift < 16 in the bin
        clear_hist(hist);
        // Any key outside the bin (below: wraps around; above) gives >= kBins and counts into
        // the spare bin. Branch-free: 3 integer instructions and the atomic per key.
        auto count = [&](uint32_t k, int) {
          atomicAdd(hist + min((k - base) >> shift, uint32_t(kBins)) * 32, 1u);
        };
        for_each_row(ckey, c_lo, kc, count);
        if constexpr (V::kUniform) {
          for_each_row(tile, t_lo, t_end, [&](uint32_t k, int row) {  // masked: the spare bin
            const uint32_t d = min((k - base) >> shift, uint32_t(kBins));
            atomicAdd(hist + (row < t_hi ? d : uint32_t(kBins)) * 32, 1u);
          });
        } else {
          for_each_row(tile, t_lo, t_lo + w, count);
        }
      }
    } else {
      for_each_row(ckey, c_lo, kc, [&](uint32_t k, int) { atomicAdd(hist + (k >> 28) * 32, 1u); });
      uint32_t prefix = 0;  // the digits fixed so far
      int rem = target;     // ranks still to fill among the keys that share them
      for (int shift = 28;; shift -= 4) {
        int bin, below, cnt;
        find_bin(hist, rem, bin, below, cnt);
        rem -= below;
        prefix |= uint32_t(bin) << shift;
        if (cnt == rem) {  // the whole bin is taken: every key <= prefix with all lower bits set
          thr = prefix | ((1u << shift) - 1u);
          break;
        }
        if (shift == 0) {  // the exact rank-`target` key; `rem` of the keys equal to it are taken
          thr = prefix;
          need = rem;
          break;
        }
        clear_hist(hist);
        const int next = shift - 4;
        // A key with the prefix has k - prefix < 2^shift, so (k - prefix) >> next is its next
        // digit; any other key (below: wraps around; above) gives >= kBins and counts into the
        // spare bin. Branch-free: 3 integer instructions and the atomic per key.
        auto count = [&](uint32_t k, int) {
          atomicAdd(hist + min((k - prefix) >> next, uint32_t(kBins)) * 32, 1u);
        };
        for_each_row(ckey, c_lo, kc, count);
        for_each_row(tile, 0, w, count);
      }
    }
  }

  // The chosen entries in block order (the carry precedes the chunk): to the output row, or as
  // the new carry, rows [kc - n_sel, kc), written in place (row kc - n_sel + pos never passes the
  // row being read: n_sel >= n_carry).
  const int n_sel = min(m, target);
  const int base_row = kc - n_sel;
  int pos = 0;
  int n_eq = 0;
  uint32_t max_sel = 0;
  uint32_t min_sel = 0xFFFFFFFFu;
  if constexpr (V::kUniform) {
    // Branch-free per key (a warp otherwise runs the take / skip paths of its lanes one after the
    // other on nearly every key), `last` hoisted out of the loops.
    auto emit = [&](auto last_c) {
      uint32_t* dst_key = ckey + base_row * 32;  // the next carry row (not `last`)
      const int idx_off = int(reinterpret_cast<uint32_t*>(cidx) - ckey);  // block ids: kc rows on
      auto visit = [&](const Entry& e, bool valid) {
        // Bitwise on the conditions: predicate logic, no short-circuit branches.
        const bool eq = valid & (e.key == thr);
        const bool take = (valid & (e.key < thr)) | (eq & (n_eq < need));
        n_eq += int(eq);
        if constexpr (decltype(last_c)::value) {
          if (take) out_row[r.fb + pos] = e.blk;
        } else {
          // Predicated single instructions: the stores at the next carry row, min / max.
          if (take) {
            dst_key[0] = e.key;
            dst_key[idx_off] = uint32_t(e.blk);
            max_sel = max(max_sel, e.key);
            min_sel = min(min_sel, e.key);
            dst_key += 32;
          }
        }
        pos += int(take);
      };
      for_each_entry(c_lo, kc, [&](int row) { return Entry{ckey[row * 32], cidx[row * 32]}; },
                     [&](const Entry& e, int) { visit(e, true); });
      if (in_place) {
        for_each_entry(t_lo, t_end, [&](int row) { return Entry{tile[row * 32], p0 + row}; },
                       [&](const Entry& e, int row) { visit(e, row < t_hi); });
      } else {
        for_each_entry(
            0, t_end,
            [&](int row) { return Entry{tile[row * 32], p0 + int(offs[offset_at(row)])}; },
            [&](const Entry& e, int row) { visit(e, row < t_hi); });
      }
    };
    if (last) {
      emit(std::true_type{});
    } else {
      emit(std::false_type{});
    }
  } else {
    auto visit = [&](uint32_t k, int blk) {
      bool sel = k < thr;
      if (k == thr) sel = n_eq++ < need;
      if (sel) {
        if (last) {
          out_row[r.fb + pos] = blk;
        } else {
          ckey[(base_row + pos) * 32] = k;
          cidx[(base_row + pos) * 32] = blk;
          max_sel = max(max_sel, k);
          if constexpr (V::kLean) min_sel = min(min_sel, k);
        }
        ++pos;
      }
    };
    for_each_row(ckey, c_lo, kc, [&](uint32_t k, int row) { visit(k, cidx[row * 32]); });
    if (in_place) {
      for_each_row(tile, t_lo, t_lo + w, [&](uint32_t k, int row) { visit(k, p0 + row); });
    } else {
      for_each_row(tile, 0, w, [&](uint32_t k, int row) { visit(k, p0 + int(offs[offset_at(row)])); });
    }
  }
  if (last) {
    write_topk_frame(out_row, rp.p.topk, r, n_sel, 0, 1);
    st.n_carry = 0;
  } else {
    st.n_carry = n_sel;
    st.max_carry = max_sel;
    if constexpr (V::kLean) st.min_carry = min_sel;
  }
}

template <class V>
__global__ void __launch_bounds__(V::kThreads) topk_radix_kernel(const __grid_constant__ Params rp) {
  constexpr int kChunk = V::kChunk;
  const TopkSelectParams& p = rp.p;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int kc = rp.carry;

  uint32_t* wbase = reinterpret_cast<uint32_t*>(topk_smem_raw) + warp * V::warp_words(kc);
  WarpSmem ws;
  ws.carry_key = wbase;
  ws.carry_idx = reinterpret_cast<int*>(wbase + kc * 32);
  ws.tiles = wbase + 2 * kc * 32;
  ws.offsets = reinterpret_cast<uint8_t*>(ws.tiles + V::kBuffers * kChunk * 32);
  ws.hist = ws.tiles + V::kBuffers * kChunk * 32 + kChunk * 8;

  // One group of 32 tokens per warp, the longest rows first: token groups in descending order,
  // heads interleaved (a causal prefill's rows grow with the token position); the hardware hands
  // the later, shorter groups to the SMs that free up. The loop only matters for a capped grid.
  const int warps = gridDim.x * V::kWarps;
  for (int g = blockIdx.x * V::kWarps + warp; g < rp.groups; g += warps) {
    const int h = g % p.num_heads;
    const int s0 = (rp.token_groups - 1 - g / p.num_heads) * 32;
    const int ntok = min(32, p.num_tokens - s0);
    const bool has_row = lane < ntok;

    RowState st{};
    int* out_row = nullptr;
    if (has_row) {
      const int64_t nvp_in = p.num_valid_pages != nullptr ? int64_t(p.num_valid_pages[s0 + lane])
                                                          : int64_t(p.num_valid_pages_value);
      st.r = topk_ranges(nvp_in, p.num_blocks, p.force_begin, p.force_end, p.topk);
      out_row = topk_out_row(p, s0 + lane, h);
      if (st.r.target <= 0) write_topk_frame(out_row, p.topk, st.r, 0, 0, 1);  // forced blocks and -1 only
    }
    const bool active = has_row && st.r.target > 0;

    // The union of the rows' candidate ranges: only those blocks are read.
    const int lo = __reduce_min_sync(0xFFFFFFFFu, active ? st.r.mid_begin : INT_MAX);
    const int hi = __reduce_max_sync(0xFFFFFFFFu, active ? st.r.mid_end : 0);
    if (lo >= hi) continue;  // warp-uniform

    const float* src = p.score + int64_t(h) * p.num_blocks * p.num_tokens + s0;
    const int c_begin = lo / kChunk;
    const int c_end = (hi + kChunk - 1) / kChunk;
    auto issue = [&](int c, int b) {
      const int p0 = c * kChunk;
      load_chunk(rp, ws.tiles + b * kChunk * 32, src, ntok, max(p0, lo), min(p0 + kChunk, hi), p0);
    };
    issue(c_begin, 0);
    for (int c = c_begin; c < c_end; ++c) {
      const int b = V::kBuffers == 2 ? (c - c_begin) & 1 : 0;
      if (V::kBuffers == 2 && c + 1 < c_end) {
        issue(c + 1, b ^ 1);  // its buffer was last read before the __syncwarp ending c - 1
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncwarp();  // every lane's copies of chunk c are visible to the warp
      const int p0 = c * kChunk;
      const int j_lo = max(st.r.mid_begin - p0, 0);
      const int j_hi = min(st.r.mid_end - p0, kChunk);
      if (active && j_lo < j_hi)
        select_chunk<V>(rp, ws, b, st, j_lo, j_hi, p0, st.r.mid_end <= p0 + kChunk, out_row);
      __syncwarp();  // buffer b is free for chunk c + 2 (one buffer: for chunk c + 1)
      if (V::kBuffers == 1 && c + 1 < c_end) issue(c + 1, 0);
    }
  }
}

}  // namespace radix

}  // namespace flashmsa::cuda::topk
