// CPU reference of stage 3: sparse attention prefill (docs/semantics.md#sparse-attention, with
// #nvfp4 and #packed-kv) and decode / MTP (#decode), with D5 (q2k set semantics), D6 (any GQA
// group) and D8 (empty rows: exact 0, LSE -inf) of docs/semantics.md#decisions.
//
// This is the exact math the kernels are compared against, not a model of any kernel schedule:
// decode's partial_dtype / force_fused choose how a kernel splits and combines, and the kernels'
// split paths are checked against this reference with tolerances. Precision: inputs are upconverted
// exactly to fp32 (bf16, fp16, fp8 e4m3 and NVFP4 e2m1 * e4m3 values are all exact in fp32), every
// dot product, exponential, sum and weighted V sum is fp32, and only the final output is rounded
// (RNE) to out_dtype. Softmax is two-pass per row (max first, then sum and weighted V), so no
// rescaling error. Block order is canonical (ascending block id), so a q2k list gives bit-identical
// results whatever its order or duplicates, and flat, paged and packed K/V views agree bit for bit.
//
// Work is split over (query row, kv head) items, each computing the G query heads of its kv head.
// A prefill block is selected by hundreds of items, so the K and V of every (sequence, kv head,
// block) that kMinUses or more items select are dequantized to fp32 once per call into a cache
// instead of once per item (NVFP4's decode would otherwise cost more than the attention math);
// rarer blocks (decode) are dequantized by each item into its scratch. A serial pass counts the
// uses; a second walks the items in (sequence, kv head, row) order and cuts them into chunks whose
// cached blocks fit in kCacheBytes; each chunk dequantizes its blocks (parallel over blocks), then
// runs its items (parallel over items). Blocks and items write disjoint memory, and every path
// feeds the same exact fp32 values to the same loops, so results depend neither on the thread count
// nor on which blocks are cached or where the chunks are cut.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "flashmsa/error.h"
#include "flashmsa/numeric.h"
#include "flashmsa/params.h"
#include "flashmsa/reference/reference.h"
#include "flashmsa/semantics.h"

// Hot loops get an AVX2 clone next to the portable one (GCC function multi-versioning, picked at
// load time). The loops fix the order of every sum, and the avx2 target has no FMA to contract
// into, so both clones give the same bits (a build whose -march has FMA contracts in both).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MSA_REF_HOT __attribute__((target_clones("avx2", "default")))
#else
#define MSA_REF_HOT
#endif

namespace flashmsa::reference {
namespace {

constexpr int kD = kHeadDim;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// fp16 -> fp32 by table: fp16_bits_to_float is exact but branchy, and a prefill converts billions
// of K/V elements.
const float* fp16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = fp16_bits_to_float(uint16_t(h));
    return t;
  }();
  return table.data();
}

const float* e4m3_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (uint32_t b = 0; b < 256; ++b) t[b] = e4m3_bits_to_float(uint8_t(b));
    return t;
  }();
  return table.data();
}

// One 128-value row of a 16-bit tensor (bf16 / fp16) -> fp32.
MSA_REF_HOT void load_row_bf16(const uint16_t* src, float* dst) {
  for (int d = 0; d < kD; ++d) dst[d] = bits_to_float(uint32_t(src[d]) << 16);
}
void load_row_table16(const uint16_t* src, const float* table, float* dst) {
  for (int d = 0; d < kD; ++d) dst[d] = table[src[d]];
}

// The two e2m1 values of each NVFP4 byte (low nibble first).
struct E2m1Pair {
  float lo, hi;
};
const E2m1Pair* e2m1_pair_table() {
  static const std::vector<E2m1Pair> table = [] {
    std::vector<E2m1Pair> t(256);
    for (uint32_t b = 0; b < 256; ++b) t[b] = {e2m1_to_float(b & 0xFu), e2m1_to_float(b >> 4)};
    return t;
  }();
  return table.data();
}

// Eight fp32 lanes: one AVX2 register, two SSE registers in the portable clone. Loads and stores go
// through memcpy (unaligned, no aliasing questions).
typedef float v8f __attribute__((vector_size(32)));
constexpr int kLanes = 8;

// One NVFP4 row: 64 bytes of e2m1 pairs (low nibble = even element) and 8 e4m3 block scales. The
// products e2m1 * scale are those of nvfp4_value (both factors exact, so is the product); a table
// of the two values of each byte and 8-lane multiplies only skip the per-element decode.
MSA_REF_HOT void load_row_nvfp4(const uint8_t* src, const uint8_t* scales, int64_t scale_row,
                                const E2m1Pair* t, const float* e4m3, float* dst) {
  for (int c = 0; c < kNvfp4ScaleCols; ++c) {
    const float s = e4m3[scales[nvfp4_scale_offset(scale_row, c)]];
    const uint8_t* q = src + c * 8;
    v8f x0 = {t[q[0]].lo, t[q[0]].hi, t[q[1]].lo, t[q[1]].hi,
              t[q[2]].lo, t[q[2]].hi, t[q[3]].lo, t[q[3]].hi};
    v8f x1 = {t[q[4]].lo, t[q[4]].hi, t[q[5]].lo, t[q[5]].hi,
              t[q[6]].lo, t[q[6]].hi, t[q[7]].lo, t[q[7]].hi};
    x0 *= s;
    x1 *= s;
    __builtin_memcpy(dst + c * 16, &x0, sizeof(x0));
    __builtin_memcpy(dst + c * 16 + 8, &x1, sizeof(x1));
  }
}

// One fp8 row by table, 8 lanes at a time: building each 8-lane vector in registers (no scalar
// stores that a vector load must then gather) is what makes a table row cheap.
MSA_REF_HOT void load_row_table8(const uint8_t* src, const float* t, float* dst) {
  for (int d = 0; d < kD; d += kLanes) {
    const uint8_t* q = src + d;
    const v8f x = {t[q[0]], t[q[1]], t[q[2]], t[q[3]], t[q[4]], t[q[5]], t[q[6]], t[q[7]]};
    __builtin_memcpy(dst + d, &x, sizeof(x));
  }
}

// Keys [j0, j0 + n) of sequence b, kv head kh (all inside one block with a valid page) -> fp32
// rows dst[n][128]. Offsets are in storage elements of t (bytes for fp8 / NVFP4).
void load_keys(const KVTensor& t, const KVIndex& kv, int num_kv_heads, int b, int kh, int j0,
               int n, float* dst) {
  for (int k = 0; k < n; ++k) {
    const int j = j0 + k;
    const int64_t off = kv_offset(t, kv, b, kh, j);
    float* row = dst + int64_t(k) * kD;
    switch (t.dtype) {
      case DType::kBF16: load_row_bf16(static_cast<const uint16_t*>(t.data) + off, row); break;
      case DType::kFP16:
        load_row_table16(static_cast<const uint16_t*>(t.data) + off, fp16_table(), row);
        break;
      case DType::kFP8E4M3:
        load_row_table8(static_cast<const uint8_t*>(t.data) + off, e4m3_table(), row);
        break;
      case DType::kNVFP4:
        load_row_nvfp4(static_cast<const uint8_t*>(t.data) + off, t.scale,
                       kv_scale_row(kv, num_kv_heads, b, kh, j), e2m1_pair_table(), e4m3_table(),
                       row);
        break;
    }
  }
}

// Query row of one head -> fp32 (fp8 q is exact in bf16, so "computed as bf16" is the same value).
void load_q(const SparseAttnParams& p, int r, int hq, float* dst) {
  const int64_t off = int64_t(r) * p.q_stride_token + int64_t(hq) * p.q_stride_head;
  switch (p.q_dtype) {
    case DType::kBF16: load_row_bf16(static_cast<const uint16_t*>(p.q) + off, dst); break;
    case DType::kFP16:
      load_row_table16(static_cast<const uint16_t*>(p.q) + off, fp16_table(), dst);
      break;
    case DType::kFP8E4M3:
      load_row_table8(static_cast<const uint8_t*>(p.q) + off, e4m3_table(), dst);
      break;
    case DType::kNVFP4: MSA_FAIL("sparse attention reference: q cannot be NVFP4");
  }
}

// Logits of 8 keys at a time with the G heads in the vector lanes:
//   lg[k * Gp + h] = scale * sum_{d = 0..127, in order} q[h][d] * keys[k][d]
// qt is q transposed, qt[d * Gp + h] (Gp = G rounded up to 8, padding heads zero); keys[n8][128]
// with n8 = n rounded up to 8 (padding rows zero). Heads in lanes avoid both a horizontal
// reduction per dot and a transpose of the K block.
MSA_REF_HOT void qk_logits(const float* qt, int Gp, const float* keys, int n8, float scale,
                           float* lg) {
  for (int hv = 0; hv < Gp; hv += kLanes) {
    for (int k0 = 0; k0 < n8; k0 += kLanes) {
      v8f acc[kLanes] = {};
      const float* kr = keys + int64_t(k0) * kD;
      for (int d = 0; d < kD; ++d) {
        v8f qv;
        __builtin_memcpy(&qv, qt + int64_t(d) * Gp + hv, sizeof(v8f));
        for (int kk = 0; kk < kLanes; ++kk) acc[kk] += qv * kr[kk * kD + d];
      }
      for (int kk = 0; kk < kLanes; ++kk) {
        const v8f v = scale * acc[kk];
        __builtin_memcpy(lg + int64_t(k0 + kk) * Gp + hv, &v, sizeof(v8f));
      }
    }
  }
}

// Per head h < G over n keys of lg[n][Gp], 8 head lanes at a time: m = max logit; when lse_t is
// given, the temperature LSE ln sum exp(T * l) (shifted by max(T * l)); then lg <- exp(l - m) in
// place, sum = their sum (keys in order), lse = m + ln(sum).
MSA_REF_HOT void softmax_weights(float* lg, int64_t n, int G, int Gp, float T, float* sum,
                                 float* lse, float* lse_t) {
  for (int hv = 0; hv < G; hv += kLanes) {
    const int lanes = std::min(kLanes, G - hv);
    v8f m = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
    for (int64_t k = 0; k < n; ++k) {
      v8f x;
      __builtin_memcpy(&x, lg + k * Gp + hv, sizeof(v8f));
      m = x > m ? x : m;
    }
    if (lse_t != nullptr) {
      v8f mt = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
      for (int64_t k = 0; k < n; ++k) {
        v8f x;
        __builtin_memcpy(&x, lg + k * Gp + hv, sizeof(v8f));
        x *= T;
        mt = x > mt ? x : mt;
      }
      float st[kLanes] = {};
      for (int64_t k = 0; k < n; ++k)
        for (int l = 0; l < lanes; ++l) st[l] += std::exp(T * lg[k * Gp + hv + l] - mt[l]);
      for (int l = 0; l < lanes; ++l) lse_t[hv + l] = mt[l] + std::log(st[l]);
    }
    float s[kLanes] = {};
    for (int64_t k = 0; k < n; ++k) {
      float* x = lg + k * Gp + hv;
      for (int l = 0; l < lanes; ++l) {
        x[l] = std::exp(x[l] - m[l]);
        s[l] += x[l];
      }
    }
    for (int l = 0; l < lanes; ++l) {
      sum[hv + l] = s[l];
      lse[hv + l] = m[l] + std::log(s[l]);
    }
  }
}

// acc[h] += sum_k w[k * Gp + h] * vals[k] for G heads and n keys (vals[k]: 128 values), keys in
// order. Keys go in groups of 32 (16 KB of V, which stays in L1 while every head reads it), and
// 64 output dims of one head live in registers per pass.
MSA_REF_HOT void pv_accumulate(const float* w, int Gp, int G, const float* vals, int n,
                               float* acc) {
  constexpr int kChunk = 64;
  constexpr int kKeyGroup = 32;
  for (int k0 = 0; k0 < n; k0 += kKeyGroup) {
    const int k1 = std::min(n, k0 + kKeyGroup);
    for (int h = 0; h < G; ++h) {
      for (int c0 = 0; c0 < kD; c0 += kChunk) {
        float* ar = acc + int64_t(h) * kD + c0;
        v8f a[kChunk / kLanes];
        __builtin_memcpy(a, ar, sizeof(a));
        for (int k = k0; k < k1; ++k) {
          const float wk = w[int64_t(k) * Gp + h];
          const float* vr = vals + int64_t(k) * kD + c0;
          for (int l = 0; l < kChunk / kLanes; ++l) {
            v8f vv;
            __builtin_memcpy(&vv, vr + l * kLanes, sizeof(v8f));
            a[l] += wk * vv;
          }
        }
        __builtin_memcpy(ar, a, sizeof(a));
      }
    }
  }
}

// A selected block that contributes keys to a row: keys [128 * t, 128 * t + n).
struct SelectedBlock {
  int t;
  int n;
};

// Selected set of row r (of sequence b) and kv head kh (D5): used entries of the list, canonical
// ascending order, keys below the limit, blocks whose page is outside the cache dropped.
void select_blocks(const SparseAttnParams& p, int b, int r, int kh,
                   std::vector<SelectedBlock>& blocks) {
  const RowRange rows = q_rows(p.qi, p.total_q, b);
  const int i = r - rows.begin;
  const int seqlen_k = kv_seqlen(p.kv, b);
  const int nb = num_blocks(seqlen_k);
  const int64_t q_off = q_offset_of(p.q_offset, b, rows.len, seqlen_k);
  const int limit = col_limit(p.causal, q_off, i, seqlen_k);
  const int* list = q2k_row(p, kh, r);
  const int len = q2k_length(list, p.topk);
  blocks.clear();
  for (int e = 0; e < len; ++e) {
    if (!q2k_entry_used(list, e, nb)) continue;
    const int t = list[e];
    const int n = std::min(kBlockSize, limit - t * kBlockSize);
    if (n <= 0) continue;
    if (p.kv.paged && kv_page(p.kv, b, t) < 0) continue;
    blocks.push_back({t, n});
  }
  std::sort(blocks.begin(), blocks.end(),
            [](const SelectedBlock& x, const SelectedBlock& y) { return x.t < y.t; });
}

// fp32 K and V of the blocks that many items select, for one chunk of items at a time. A block
// selected by fewer than kMinUses items is dequantized by each item into its scratch instead (as a
// decode block usually is): writing it to the cache and reading it back from memory costs more than
// a few decodes (caching the blocks of 4 MTP rows was slower than decoding them, even for NVFP4).
// 256 MB bounds the cache whatever the sequence lengths (2048 blocks of K and V; one item needs at
// most kMaxTopk = 64) and holds every block of a 4K-token sequence with 64 kv heads.
constexpr int kMinUses = 8;
constexpr int64_t kCacheBytes = int64_t(256) << 20;
constexpr int64_t kBlockFloats = int64_t(kBlockSize) * kD;
constexpr int kCacheSlots = int(kCacheBytes / (2 * kBlockFloats * int64_t(sizeof(float))));
static_assert(kCacheSlots >= kMaxTopk, "one item's blocks must fit in the cache");

class BlockCache {
 public:
  explicit BlockCache(const SparseAttnParams& p) : p_(p), first_block_(size_t(p.batch) + 1, 0) {
    for (int b = 0; b < p.batch; ++b)
      first_block_[b + 1] = first_block_[b] + num_blocks(kv_seqlen(p.kv, b));
    uses_.assign(size_t(first_block_[p.batch]) * p.num_kv_heads, 0);
    slot_.assign(uses_.size(), -1);
  }

  // First pass: one more item selects block t of sequence b, kv head kh.
  void count_use(int b, int kh, int t) { ++uses_[id(b, kh, t)]; }

  // Whether the block is worth a slot and the current chunk has not claimed one for it yet.
  bool wants(int b, int kh, int t) const {
    const int64_t i = id(b, kh, t);
    return uses_[i] >= kMinUses && slot_[i] < 0;
  }

  void claim(int b, int kh, int t) {
    if (!wants(b, kh, t)) return;
    slot_[id(b, kh, t)] = size();
    blocks_.push_back({b, kh, t});
  }

  int size() const { return int(blocks_.size()); }

  // Slot of the block in the current chunk, or -1.
  int slot(int b, int kh, int t) const { return slot_[id(b, kh, t)]; }

  // Dequantizes every claimed block, keys past the end of the sequence zero. The buffers are not
  // value-initialized: fill writes every float of the claimed slots, in parallel.
  void fill() {
    if (size() > capacity_) {
      capacity_ = size();
      k_.reset(new float[size_t(capacity_) * kBlockFloats]);
      v_.reset(new float[size_t(capacity_) * kBlockFloats]);
    }
    parallel_for(size(), [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        const BlockRef& blk = blocks_[s];
        const int j0 = blk.t * kBlockSize;
        const int n = std::min(kBlockSize, kv_seqlen(p_.kv, blk.b) - j0);
        for (const auto& [src, dst] : {std::pair{&p_.k, k_.get()}, std::pair{&p_.v, v_.get()}}) {
          float* rows = dst + s * kBlockFloats;
          load_keys(*src, p_.kv, p_.num_kv_heads, blk.b, blk.kh, j0, n, rows);
          std::fill(rows + int64_t(n) * kD, rows + kBlockFloats, 0.f);
        }
      }
    });
  }

  // Forgets every claim: the next chunk starts empty and reuses the buffers.
  void clear() {
    for (const BlockRef& blk : blocks_) slot_[id(blk.b, blk.kh, blk.t)] = -1;
    blocks_.clear();
  }

  // [128 keys, 128] fp32 K / V of a claimed block.
  const float* k(int slot) const { return k_.get() + int64_t(slot) * kBlockFloats; }
  const float* v(int slot) const { return v_.get() + int64_t(slot) * kBlockFloats; }

 private:
  struct BlockRef {
    int b, kh, t;
  };
  int64_t id(int b, int kh, int t) const {
    return (first_block_[b] + t) * p_.num_kv_heads + kh;
  }

  const SparseAttnParams& p_;
  std::vector<int64_t> first_block_;  // [B + 1]: blocks of the sequences before b
  std::vector<int> uses_;             // [blocks of all sequences, Hkv]: items selecting it
  std::vector<int> slot_;             // [blocks of all sequences, Hkv]: slot or -1
  std::vector<BlockRef> blocks_;      // [slots]
  int capacity_ = 0;                  // slots allocated in k_ and v_
  std::unique_ptr<float[]> k_, v_;    // [capacity, 128, 128]
};

struct Scratch {
  std::vector<float> q;       // [128]: one head's query row at a time
  std::vector<float> qt;      // [128, Gp]: the G query rows transposed, padding heads zero
  std::vector<float> kv;      // [128 keys, 128]: one uncached block of K or V
  std::vector<float> lg;      // [keys, Gp]: logits, then exp(logit - max)
  std::vector<float> acc;     // [G, 128]
  std::vector<float> sum, lse, lse_t;  // [Gp]
  std::vector<SelectedBlock> blocks;
};

void write_row(const SparseAttnParams& p, int r, int hq, const float* o, float lse, float lse_t) {
  const int64_t base = (int64_t(r) * p.num_heads + hq) * kD;
  uint16_t* out = static_cast<uint16_t*>(p.out) + base;
  if (p.out_dtype == DType::kBF16) {
    for (int d = 0; d < kD; ++d) out[d] = float_to_bf16_bits(o[d]);
  } else {
    for (int d = 0; d < kD; ++d) out[d] = float_to_fp16_bits(o[d]);
  }
  if (p.lse != nullptr) p.lse[int64_t(r) * p.num_heads + hq] = lse;
  if (p.lse_temperature_out != nullptr) p.lse_temperature_out[int64_t(r) * p.num_heads + hq] = lse_t;
}

void write_empty_rows(const SparseAttnParams& p, int r, int kh, int G) {
  static const float zeros[kD] = {};
  for (int h = 0; h < G; ++h) write_row(p, r, kh * G + h, zeros, kNegInf, kNegInf);
}

// Row r (of sequence b, or b < 0 when no sequence covers it), kv head kh: the G heads kh*G ...
void attend(const SparseAttnParams& p, const std::vector<int>& owner, const BlockCache& cache,
            int r, int kh, Scratch& s) {
  const int G = p.num_heads / p.num_kv_heads;
  const int b = owner[r];
  if (b < 0) return write_empty_rows(p, r, kh, G);
  select_blocks(p, b, r, kh, s.blocks);
  if (s.blocks.empty()) return write_empty_rows(p, r, kh, G);
  int64_t num_keys = 0;
  for (const SelectedBlock& blk : s.blocks) num_keys += blk.n;

  const int Gp = int(ceil_div(G, kLanes)) * kLanes;
  s.q.resize(kD);
  s.qt.assign(size_t(kD) * Gp, 0.f);
  for (int h = 0; h < G; ++h) {
    load_q(p, r, kh * G + h, s.q.data());
    for (int d = 0; d < kD; ++d) s.qt[size_t(d) * Gp + h] = s.q[d];
  }
  s.lg.resize(size_t(ceil_div(num_keys, kLanes) * kLanes + kBlockSize) * Gp);
  s.acc.assign(size_t(G) * kD, 0.f);
  s.sum.resize(Gp);
  s.lse.resize(Gp);
  s.lse_t.assign(Gp, kNegInf);

  // A selected block's K or V rows: cached, or dequantized into s.kv. The K pass reads n8 rows;
  // rows past the block's n keys (later keys, or zero) give logits that the next block overwrites
  // or that lie past num_keys.
  s.kv.resize(size_t(kBlockSize) * kD);
  auto block_rows = [&](bool v, const SelectedBlock& blk, int n8) -> const float* {
    const int slot = cache.slot(b, kh, blk.t);
    if (slot >= 0) return v ? cache.v(slot) : cache.k(slot);
    load_keys(v ? p.v : p.k, p.kv, p.num_kv_heads, b, kh, blk.t * kBlockSize, blk.n, s.kv.data());
    std::fill(s.kv.begin() + int64_t(blk.n) * kD, s.kv.begin() + int64_t(n8) * kD, 0.f);
    return s.kv.data();
  };

  // Pass 1: logits of every selected key for the G heads.
  const float scale = effective_softmax_scale(p);
  int64_t col = 0;
  for (const SelectedBlock& blk : s.blocks) {
    const int n8 = int(ceil_div(blk.n, kLanes)) * kLanes;
    qk_logits(s.qt.data(), Gp, block_rows(false, blk, n8), n8, scale, s.lg.data() + col * Gp);
    col += blk.n;
  }

  softmax_weights(s.lg.data(), num_keys, G, Gp, p.lse_temperature, s.sum.data(), s.lse.data(),
                  p.lse_temperature_out != nullptr ? s.lse_t.data() : nullptr);

  // Pass 2: weighted V.
  col = 0;
  for (const SelectedBlock& blk : s.blocks) {
    pv_accumulate(s.lg.data() + col * Gp, Gp, G, block_rows(true, blk, blk.n), blk.n,
                  s.acc.data());
    col += blk.n;
  }

  float o[kD];
  for (int h = 0; h < G; ++h) {
    const float* a = s.acc.data() + int64_t(h) * kD;
    for (int d = 0; d < kD; ++d) o[d] = a[d] / s.sum[h] * p.v_global_scale;
    write_row(p, r, kh * G + h, o, s.lse[h], s.lse_t[h]);
  }
}

void check_common(const SparseAttnParams& p, const char* op) {
  MSA_CHECK(p.num_kv_heads > 0 && p.num_heads > 0 && p.num_heads % p.num_kv_heads == 0, op,
            ": num_heads (", p.num_heads, ") must be a positive multiple of num_kv_heads (",
            p.num_kv_heads, ")");
  MSA_CHECK(p.total_q >= 0 && p.batch >= 0, op, ": total_q and batch must be >= 0");
  MSA_CHECK(p.topk >= 1 && p.topk <= kMaxTopk, op, ": topk must be in [1, ", kMaxTopk, "], got ",
            p.topk);
  MSA_CHECK(p.out_dtype == DType::kBF16 || p.out_dtype == DType::kFP16, op,
            ": output dtype must be bfloat16 or float16, got ", dtype_name(p.out_dtype));
  MSA_CHECK(p.k.dtype == p.v.dtype, op, ": k and v must have the same dtype, got ",
            dtype_name(p.k.dtype), " and ", dtype_name(p.v.dtype));
  MSA_CHECK(p.k.dtype != DType::kNVFP4 || (p.k.scale != nullptr && p.v.scale != nullptr), op,
            ": NVFP4 k and v need k_scale and v_scale");
  MSA_CHECK(p.kv.paged || p.kv.cu_seqlens_k != nullptr, op, ": the flat layout needs cu_seqlens_k");
  MSA_CHECK(!p.kv.paged || p.batch == 0 || p.kv.cu_seqlens_k != nullptr || p.kv.seqused_k != nullptr,
            op, ": the paged layout needs seqused_k or cu_seqlens_k");
  MSA_CHECK(!p.kv.paged || p.batch == 0 || p.kv.max_pages == 0 || p.kv.page_table != nullptr, op,
            ": the paged layout needs page_table");
}

void run(const SparseAttnParams& p) {
  // Owner of each query row; rows covered by no sequence stay -1 and get 0 / -inf (a row claimed
  // by two sequences of a malformed cu_seqlens_q goes to the first).
  std::vector<int> owner(size_t(p.total_q), -1);
  for (int b = 0; b < p.batch; ++b) {
    const RowRange rows = q_rows(p.qi, p.total_q, b);
    for (int r = rows.begin; r < rows.begin + rows.len; ++r)
      if (owner[r] < 0) owner[r] = b;
  }

  // Items (row, kv head): rows of no sequence first, then per sequence and kv head its rows, so
  // that the items of a chunk share blocks.
  struct Item {
    int r, kh;
  };
  std::vector<Item> items;
  items.reserve(size_t(p.total_q) * p.num_kv_heads);
  for (int r = 0; r < p.total_q; ++r)
    if (owner[r] < 0)
      for (int kh = 0; kh < p.num_kv_heads; ++kh) items.push_back({r, kh});
  for (int b = 0; b < p.batch; ++b) {
    const RowRange rows = q_rows(p.qi, p.total_q, b);
    for (int kh = 0; kh < p.num_kv_heads; ++kh)
      for (int r = rows.begin; r < rows.begin + rows.len; ++r)
        if (owner[r] == b) items.push_back({r, kh});
  }

  // Pass over the items: how many select each block.
  BlockCache cache(p);
  std::vector<SelectedBlock> blocks;
  for (const Item& it : items) {
    const int b = owner[it.r];
    if (b < 0) continue;
    select_blocks(p, b, it.r, it.kh, blocks);
    for (const SelectedBlock& blk : blocks) cache.count_use(b, it.kh, blk.t);
  }

  // Chunks: items [first, w) while their cached blocks fit.
  auto run_chunk = [&](size_t begin, size_t end) {
    cache.fill();
    parallel_for(int64_t(end - begin), [&](int64_t w0, int64_t w1) {
      Scratch s;
      for (int64_t w = w0; w < w1; ++w) {
        const Item& it = items[begin + size_t(w)];
        attend(p, owner, cache, it.r, it.kh, s);
      }
    });
    cache.clear();
  };
  size_t first = 0;
  for (size_t w = 0; w < items.size(); ++w) {
    const int b = owner[items[w].r], kh = items[w].kh;
    if (b < 0) continue;
    select_blocks(p, b, items[w].r, kh, blocks);
    int fresh = 0;
    for (const SelectedBlock& blk : blocks) fresh += cache.wants(b, kh, blk.t);
    if (cache.size() + fresh > kCacheSlots) {
      run_chunk(first, w);
      first = w;
    }
    for (const SelectedBlock& blk : blocks) cache.claim(b, kh, blk.t);
  }
  run_chunk(first, items.size());
}

}  // namespace

void sparse_attention(const SparseAttnParams& p) {
  check_common(p, "sparse_attention");
  MSA_CHECK(p.q_dtype == DType::kBF16 || p.q_dtype == DType::kFP16,
            "sparse_attention: q must be bfloat16 or float16, got ", dtype_name(p.q_dtype));
  run(p);
}

void sparse_decode(const SparseDecodeParams& p) {
  const SparseAttnParams& a = p.attn;
  check_common(a, "sparse_decode");
  MSA_CHECK(a.q_dtype == DType::kBF16 || a.q_dtype == DType::kFP16 || a.q_dtype == DType::kFP8E4M3,
            "sparse_decode: q must be bfloat16, float16 or float8_e4m3fn, got ",
            dtype_name(a.q_dtype));
  MSA_CHECK(a.qi.cu_seqlens_q == nullptr && a.qi.seqlen_q > 0,
            "sparse_decode: queries must have a uniform seqlen_q > 0 (cu_seqlens_q unset), got "
            "seqlen_q ",
            a.qi.seqlen_q);
  // partial_dtype and force_fused only pick a kernel schedule; the math is run()'s.
  run(a);
}

}  // namespace flashmsa::reference
