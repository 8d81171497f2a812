// CPU reference of msa_proxy_score (stage 1) against a naive fp64 oracle written here from the
// text of docs/semantics.md (#conventions, #proxy-score-math), independent of semantics.h: exact
// -inf pattern, finite values within the fp32 summation error, paged == flat and fp8 == dequantized
// bf16 bit for bit, every output element written, results independent of the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "flashmsa/numeric.h"
#include "flashmsa/params.h"
#include "flashmsa/reference/reference.h"
#include "test_util.h"

namespace flashmsa::testing {
namespace {

constexpr int kD = 128;     // head_dim
constexpr int kBlk = 128;   // block = page size
constexpr double kInf = std::numeric_limits<double>::infinity();
// fp32 summation of 128 exact products (8 lanes of 16 terms, then 3 tree levels) is off by at most
// ~19 ulp(1)/2 of the sum of |terms|; 2e-6 leaves a small margin and still catches a lost term.
constexpr double kRelTol = 2e-6;

enum class Layout { kFlat, kPaged, kPagedInvalidPages };

struct ProxyCase {
  std::string name;
  std::vector<int> seqs_q;
  std::vector<int> seqs_k;
  int hq = 4;
  int hkv = 1;
  bool causal = true;
  bool reduce_heads = false;
  int max_k_tiles = -1;  // -1: max over sequences of ceil(seqlen_k / 128) (at least 1)
  QOffsetMode offset_mode = QOffsetMode::kRightAligned;
  int offset_value = 0;      // kScalar
  std::vector<int> offsets;  // kPerSequence
  ScalarType q_dtype = ScalarType::kBF16;
  ScalarType k_dtype = ScalarType::kBF16;
  Layout layout = Layout::kFlat;
  int extra_rows = 0;  // q rows after cu_seqlens_q[B] that no sequence covers
  int q_pad = 0;       // extra elements per head row of q (strided view)
  int k_pad = 0;       // extra elements per key row of k
};

std::string describe(const ProxyCase& c) {
  std::string s = c.name + " seqs_q=[";
  for (int v : c.seqs_q) s += std::to_string(v) + ",";
  s += "] seqs_k=[";
  for (int v : c.seqs_k) s += std::to_string(v) + ",";
  s += "] hq=" + std::to_string(c.hq) + " hkv=" + std::to_string(c.hkv) +
       " causal=" + std::to_string(c.causal) + " reduce=" + std::to_string(c.reduce_heads) +
       " P=" + std::to_string(c.max_k_tiles) + " offset_mode=" + std::to_string(int(c.offset_mode)) +
       " layout=" + std::to_string(int(c.layout)) + " q=" + scalar_type_name(c.q_dtype) +
       " k=" + scalar_type_name(c.k_dtype);
  return s;
}

DType to_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::kBF16: return DType::kBF16;
    case ScalarType::kFP16: return DType::kFP16;
    case ScalarType::kFP8E4M3: return DType::kFP8E4M3;
    default: throw std::invalid_argument("to_dtype");
  }
}

// Writes a NaN of the tensor's dtype at element i: any read of it would poison the output.
void poison(HostTensor& t, int64_t i) {
  switch (t.dtype) {
    case ScalarType::kBF16: t.as<uint16_t>()[i] = 0x7FC0; break;
    case ScalarType::kFP16: t.as<uint16_t>()[i] = 0x7E00; break;
    case ScalarType::kFP8E4M3: t.as<uint8_t>()[i] = 0x7F; break;
    default: throw std::invalid_argument("poison");
  }
}

// Same values, stored as bf16 (exact for fp8 e4m3).
HostTensor to_bf16(const HostTensor& t) {
  HostTensor r(ScalarType::kBF16, t.shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (std::isnan(t.get(i))) {
      r.as<uint16_t>()[i] = 0x7FC0;
    } else {
      r.set(i, t.get(i));
    }
  }
  return r;
}

// One concrete problem: the tensors of a ProxyCase.
struct ProxyInstance {
  ProxyCase c;
  int batch = 0;
  int total_q = 0;
  int total_k = 0;
  int max_k_tiles = 0;
  std::vector<int> cu_q, cu_k;
  HostTensor q;       // [total_q, hq, 128 + q_pad]
  HostTensor k_flat;  // [total_k, hkv, 128 + k_pad]
  std::vector<double> q_values;  // [total_q, hq, 128] for the oracle
  std::vector<double> k_values;  // [total_k, hkv, 128] for the oracle
  HostTensor cu_q_t, cu_k_t, offsets_t, seqused_t;
  // Paged copy of k_flat: block t of sequence b in page page_table[b, t].
  HostTensor k_paged;     // [num_pages, hkv, 128, 128 + k_pad]
  HostTensor page_table;  // [B, max_pages]
  int max_pages = 0;
  int num_pages = 0;
  std::vector<std::vector<bool>> invalid_block;  // [b][t]: page id outside the cache
};

ProxyInstance make_instance(const ProxyCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ProxyInstance in;
  in.c = c;
  in.batch = int(c.seqs_q.size());
  in.cu_q.assign(1, 0);
  in.cu_k.assign(1, 0);
  int max_nb = 0;
  for (int b = 0; b < in.batch; ++b) {
    in.cu_q.push_back(in.cu_q.back() + c.seqs_q[b]);
    in.cu_k.push_back(in.cu_k.back() + c.seqs_k[b]);
    max_nb = std::max(max_nb, (c.seqs_k[b] + kBlk - 1) / kBlk);
  }
  in.total_q = in.cu_q.back() + c.extra_rows;
  in.total_k = in.cu_k.back();
  in.max_k_tiles = c.max_k_tiles >= 0 ? c.max_k_tiles : std::max(1, max_nb);
  in.cu_q_t = int_tensor(in.cu_q);
  in.cu_k_t = int_tensor(in.cu_k);
  in.seqused_t = int_tensor(c.seqs_k);
  in.offsets_t = int_tensor(c.offsets.empty() ? std::vector<int>{0} : c.offsets);

  const float scale = c.q_dtype == ScalarType::kFP16 ? 2.0f : 1.5f;
  in.q = random_tensor(c.q_dtype, {in.total_q, c.hq, kD + c.q_pad}, rng, scale);
  in.k_flat = random_tensor(c.k_dtype, {in.total_k, c.hkv, kD + c.k_pad}, rng, scale);
  for (int64_t row = 0; row < int64_t(in.total_q) * c.hq; ++row)
    for (int d = kD; d < kD + c.q_pad; ++d) poison(in.q, row * (kD + c.q_pad) + d);
  for (int64_t row = 0; row < int64_t(in.total_k) * c.hkv; ++row)
    for (int d = kD; d < kD + c.k_pad; ++d) poison(in.k_flat, row * (kD + c.k_pad) + d);
  for (int64_t i = int64_t(in.cu_q.back()) * c.hq * (kD + c.q_pad); i < in.q.numel(); ++i)
    poison(in.q, i);  // rows of no sequence are never read
  for (int64_t row = 0; row < int64_t(in.total_q) * c.hq; ++row)
    for (int d = 0; d < kD; ++d) in.q_values.push_back(in.q.get(row * (kD + c.q_pad) + d));
  for (int64_t row = 0; row < int64_t(in.total_k) * c.hkv; ++row)
    for (int d = 0; d < kD; ++d) in.k_values.push_back(in.k_flat.get(row * (kD + c.k_pad) + d));

  if (c.layout == Layout::kFlat) return in;

  // Paged copy: the pages of all sequences in a random order, plus unused poisoned pages; the tail of
  // each partial last page poisoned; page-table columns past a sequence's blocks hold junk ids.
  std::vector<int> nbs(in.batch);
  int needed = 0;
  for (int b = 0; b < in.batch; ++b) {
    nbs[b] = (c.seqs_k[b] + kBlk - 1) / kBlk;
    needed += nbs[b];
  }
  in.num_pages = needed + int(rng() % 3);
  in.max_pages = max_nb + int(rng() % 3);
  std::vector<int> perm(in.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int w = kD + c.k_pad;
  in.k_paged = HostTensor(c.k_dtype, {std::max(in.num_pages, 1), c.hkv, kBlk, w});
  for (int64_t i = 0; i < in.k_paged.numel(); ++i) poison(in.k_paged, i);
  std::vector<int> table(size_t(std::max(in.batch, 1)) * std::max(in.max_pages, 1), 0);
  in.invalid_block.assign(in.batch, {});
  const size_t esz = scalar_size(c.k_dtype);
  int next = 0;
  for (int b = 0; b < in.batch; ++b) {
    in.invalid_block[b].assign(nbs[b], false);
    for (int t = 0; t < in.max_pages; ++t) {
      int& entry = table[size_t(b) * in.max_pages + t];
      if (t >= nbs[b]) {
        entry = (rng() % 2) ? -1000 - t : in.num_pages + 7;  // never read
        continue;
      }
      const int page = perm[next++];
      entry = page;
      for (int h = 0; h < c.hkv; ++h)
        for (int j = t * kBlk; j < std::min(c.seqs_k[b], (t + 1) * kBlk); ++j) {
          const int64_t src = ((int64_t(in.cu_k[b]) + j) * c.hkv + h) * w;
          const int64_t dst = ((int64_t(page) * c.hkv + h) * kBlk + j % kBlk) * w;
          std::memcpy(in.k_paged.bytes.data() + dst * esz, in.k_flat.bytes.data() + src * esz,
                      kD * esz);
        }
      if (c.layout == Layout::kPagedInvalidPages && rng() % 3 == 0) {
        entry = (rng() % 2) ? -1 - int(rng() % 5) : in.num_pages + int(rng() % 5);
        in.invalid_block[b][t] = true;
      }
    }
  }
  in.page_table = int_tensor(table, {std::max(in.batch, 1), std::max(in.max_pages, 1)});
  return in;
}

ProxyScoreParams make_params(ProxyInstance& in, HostTensor& q, HostTensor& k, bool paged,
                             std::vector<float>& out) {
  const ProxyCase& c = in.c;
  ProxyScoreParams p{};
  p.batch = in.batch;
  p.total_q = in.total_q;
  p.num_heads = c.hq;
  p.num_kv_heads = c.hkv;
  p.max_k_tiles = in.max_k_tiles;
  p.causal = c.causal;
  p.reduce_heads = c.reduce_heads;
  p.q = q.bytes.data();
  p.q_dtype = to_dtype(q.dtype);
  p.q_stride_head = q.shape[2];
  p.q_stride_token = q.shape[1] * q.shape[2];
  p.k.data = k.bytes.data();
  p.k.dtype = to_dtype(k.dtype);
  p.k.scale = nullptr;
  p.k.scale_bytes = 0;
  p.kv.batch = in.batch;
  if (paged) {
    p.k.stride_token = k.shape[3];
    p.k.stride_head = k.shape[2] * k.shape[3];
    p.k.stride_page = k.shape[1] * k.shape[2] * k.shape[3];
    p.kv.cu_seqlens_k = nullptr;
    p.kv.seqused_k = in.seqused_t.as<int>();
    p.kv.paged = true;
    p.kv.page_table = in.page_table.as<int>();
    p.kv.page_table_stride = in.page_table.shape[1];
    p.kv.max_pages = in.max_pages;
    p.kv.num_pages = in.num_pages;
    p.kv.total_k = 0;
  } else {
    p.k.stride_token = k.shape[1] * k.shape[2];
    p.k.stride_head = k.shape[2];
    p.k.stride_page = 0;
    p.kv.cu_seqlens_k = in.cu_k_t.as<int>();
    p.kv.seqused_k = nullptr;
    p.kv.paged = false;
    p.kv.page_table = nullptr;
    p.kv.page_table_stride = 0;
    p.kv.max_pages = 0;
    p.kv.num_pages = 0;
    p.kv.total_k = in.total_k;
  }
  p.qi.cu_seqlens_q = in.cu_q_t.as<int>();
  p.qi.seqlen_q = 0;
  p.qi.max_seqlen_q = *std::max_element(c.seqs_q.begin(), c.seqs_q.end());
  p.q_offset.mode = c.offset_mode;
  p.q_offset.value = c.offset_value;
  p.q_offset.per_sequence = in.offsets_t.as<int>();
  const int out_heads = c.reduce_heads ? 1 : c.hq;
  // A sentinel that no computed value can take: an element the op forgets to write shows up.
  out.assign(size_t(out_heads) * in.max_k_tiles * in.total_q, 12345.0f);
  p.out = out.data();
  return p;
}

std::vector<float> run_reference(ProxyInstance& in, HostTensor& q, HostTensor& k, bool paged) {
  std::vector<float> out;
  const ProxyScoreParams p = make_params(in, q, k, paged, out);
  reference::proxy_score(p);
  return out;
}

// ---- the naive oracle (docs/semantics.md#proxy-score-math, in words: max over the visible keys of
// the block of the unscaled dot product; -inf when the block has none) ----------------------------

struct OracleRow {
  std::vector<double> value;  // [out_heads, P]
  std::vector<double> bound;  // [out_heads, P]: max over the block's visible keys of sum |q_d k_d|
};

OracleRow oracle_row(const ProxyInstance& in, int r) {
  const ProxyCase& c = in.c;
  const int out_heads = c.reduce_heads ? 1 : c.hq;
  const int P = in.max_k_tiles;
  OracleRow o;
  o.value.assign(size_t(out_heads) * P, -kInf);
  o.bound.assign(size_t(out_heads) * P, 0.0);
  int b = -1;
  for (int s = 0; s < in.batch; ++s)
    if (in.cu_q[s] <= r && r < in.cu_q[s + 1]) b = s;
  if (b < 0) return o;
  const int i = r - in.cu_q[b];
  const int sq = c.seqs_q[b];
  const int sk = c.seqs_k[b];
  long long offset = sk - sq;  // right-aligned default
  if (c.offset_mode == QOffsetMode::kScalar) offset = c.offset_value;
  if (c.offset_mode == QOffsetMode::kPerSequence) offset = c.offsets[b];
  for (int h = 0; h < c.hq; ++h) {
    const int kh = h / (c.hq / c.hkv);
    const int oh = c.reduce_heads ? 0 : h;
    for (int t = 0; t < P; ++t) {
      if (c.layout == Layout::kPagedInvalidPages && t < int(in.invalid_block[b].size()) &&
          in.invalid_block[b][t])
        continue;
      for (int j = t * kBlk; j < (t + 1) * kBlk; ++j) {
        const bool visible = j < sk && (!c.causal || j <= offset + i);
        if (!visible) continue;
        const double* qv = in.q_values.data() + (int64_t(r) * c.hq + h) * kD;
        const double* kv = in.k_values.data() + (int64_t(in.cu_k[b] + j) * c.hkv + kh) * kD;
        double dot = 0.0, abs_sum = 0.0;
        for (int d = 0; d < kD; ++d) {
          dot += qv[d] * kv[d];
          abs_sum += std::fabs(qv[d] * kv[d]);
        }
        double& v = o.value[size_t(oh) * P + t];
        double& bd = o.bound[size_t(oh) * P + t];
        v = std::max(v, dot);
        bd = std::max(bd, abs_sum);
      }
    }
  }
  return o;
}

// Compares rows `rows` of `got` with the oracle; returns the number of mismatches (reports a few).
int compare_rows(const ProxyInstance& in, const std::vector<float>& got,
                 const std::vector<int>& rows, const std::string& what) {
  const int out_heads = in.c.reduce_heads ? 1 : in.c.hq;
  const int P = in.max_k_tiles;
  int bad = 0;
  for (int r : rows) {
    const OracleRow o = oracle_row(in, r);
    for (int h = 0; h < out_heads; ++h)
      for (int t = 0; t < P; ++t) {
        const double want = o.value[size_t(h) * P + t];
        const float g = got[(size_t(h) * P + t) * in.total_q + r];
        bool ok;
        if (std::isinf(want)) {
          ok = std::isinf(g) && g < 0;
        } else {
          ok = std::isfinite(g) &&
               std::fabs(double(g) - want) <= kRelTol * o.bound[size_t(h) * P + t] + 1e-30;
        }
        if (!ok && ++bad <= 5)
          ADD_FAILURE() << what << ": out[" << h << ", " << t << ", " << r << "] = " << g
                        << ", oracle " << want << " (bound " << o.bound[size_t(h) * P + t] << ")";
      }
  }
  return bad;
}

int compare_all(const ProxyInstance& in, const std::vector<float>& got, const std::string& what) {
  std::vector<int> rows(in.total_q);
  std::iota(rows.begin(), rows.end(), 0);
  return compare_rows(in, got, rows, what);
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  // (memcmp of two empty vectors' null data() is undefined behaviour: UBSan)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Every property one case can check: oracle match in its layout, paged == flat, fp8 == bf16.
void check_case(const ProxyCase& c, uint64_t seed) {
  SCOPED_TRACE(describe(c) + " seed=" + std::to_string(seed));
  ProxyInstance in = make_instance(c, seed);
  const bool paged = c.layout != Layout::kFlat;
  HostTensor& k = paged ? in.k_paged : in.k_flat;
  const std::vector<float> got = run_reference(in, in.q, k, paged);
  EXPECT_EQ(compare_all(in, got, "reference vs oracle"), 0);

  if (c.layout == Layout::kPaged) {
    const std::vector<float> flat = run_reference(in, in.q, in.k_flat, false);
    EXPECT_TRUE(bit_equal(got, flat)) << "paged and flat outputs differ";
  }
  if (c.k_dtype == ScalarType::kFP8E4M3) {
    HostTensor q16 = c.q_dtype == ScalarType::kFP8E4M3 ? to_bf16(in.q) : in.q;
    HostTensor k16 = to_bf16(k);
    const std::vector<float> deq = run_reference(in, q16, k16, paged);
    EXPECT_TRUE(bit_equal(got, deq)) << "fp8 and dequantized bf16 outputs differ";
  }
}

// ---- named cases: proxy shapes of docs/semantics.md#accuracy and #edge-cases --------------------

std::vector<ProxyCase> named_cases() {
  std::vector<ProxyCase> v;
  auto add = [&](ProxyCase c) { v.push_back(std::move(c)); };
  {
    ProxyCase c;
    c.name = "fi_b2_h4_kv2_causal";
    c.seqs_q = {100, 37};
    c.seqs_k = {2048, 700};
    c.hq = 4;
    c.hkv = 2;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "fi_b2_h2_kv2_noncausal";
    c.seqs_q = {130, 64};
    c.seqs_k = {1024, 512};
    c.hq = 2;
    c.hkv = 2;
    c.causal = false;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "fi_b3_h2_kv1_ragged";
    c.seqs_q = {1, 33, 7};
    c.seqs_k = {300, 1111, 256};
    c.hq = 2;
    c.hkv = 1;
    add(c);
  }
  for (bool causal : {true, false}) {
    ProxyCase c;
    c.name = std::string("fi_decode_packed_b2_h4_sq16_") + (causal ? "causal" : "noncausal");
    c.seqs_q = {16, 16};
    c.seqs_k = {4096, 4096};
    c.hq = 4;
    c.hkv = 1;
    c.causal = causal;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "fi_decode_packed_b4_h4_sq1_8k";
    c.seqs_q = {1, 1, 1, 1};
    c.seqs_k = {8192, 8192, 8192, 8192};
    add(c);
  }
  {
    ProxyCase c;
    c.name = "fi_decode_packed_b3_h8_kv2_sq8";
    c.seqs_q = {8, 8, 8};
    c.seqs_k = {2048, 2048, 2048};
    c.hq = 8;
    c.hkv = 2;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "fi_packed_paged_h4_kv1";
    c.seqs_q = {8, 3, 1};
    c.seqs_k = {2048, 300, 1280};
    c.layout = Layout::kPaged;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "fi_packed_paged_h8_kv2";
    c.seqs_q = {2, 2};
    c.seqs_k = {1024, 640};
    c.hq = 8;
    c.hkv = 2;
    c.layout = Layout::kPaged;
    add(c);
  }
  // Decode stream: an empty sequence, every group size, explicit q_offset = seqlen_k // 2.
  for (int g : {1, 3, 4, 8}) {
    ProxyCase c;
    c.name = "fi_decode_stream_g" + std::to_string(g);
    c.seqs_q = {1, 1, 1, 1, 1};
    c.seqs_k = {700, 2048, 129, 0, 4096};
    c.hq = g;
    c.hkv = 1;
    c.layout = Layout::kPaged;
    c.offset_mode = QOffsetMode::kPerSequence;
    for (int sk : c.seqs_k) c.offsets.push_back(sk / 2);
    add(c);
  }
  for (auto [hq, hkv] : {std::pair{4, 1}, std::pair{8, 2}}) {
    ProxyCase c;
    c.name = "fi_reduce_heads_h" + std::to_string(hq) + "_kv" + std::to_string(hkv);
    c.seqs_q = {150};
    c.seqs_k = {2048};
    c.hq = hq;
    c.hkv = hkv;
    c.reduce_heads = true;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "fi_paged_fp8";
    c.seqs_q = {40, 9};
    c.seqs_k = {1000, 385};
    c.k_dtype = ScalarType::kFP8E4M3;
    c.layout = Layout::kPaged;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "fp8_q_and_k_reduce";
    c.seqs_q = {20, 50};
    c.seqs_k = {130, 600};
    c.hq = 3;
    c.q_dtype = ScalarType::kFP8E4M3;
    c.k_dtype = ScalarType::kFP8E4M3;
    c.reduce_heads = true;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "fp16_q_fp8_k_paged_invalid_pages";
    c.seqs_q = {33, 5};
    c.seqs_k = {900, 1281};
    c.q_dtype = ScalarType::kFP16;
    c.k_dtype = ScalarType::kFP8E4M3;
    c.layout = Layout::kPagedInvalidPages;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "seqlen_q_gt_seqlen_k";  // early rows see nothing (right-aligned offset < 0)
    c.seqs_q = {300, 64};
    c.seqs_k = {200, 1};
    c.hq = 2;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "empty_sequences";
    c.seqs_q = {0, 5, 7, 0, 3};
    c.seqs_k = {100, 0, 0, 0, 257};
    c.extra_rows = 4;
    c.layout = Layout::kPaged;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "negative_scalar_offset";
    c.seqs_q = {200, 90};
    c.seqs_k = {512, 300};
    c.offset_mode = QOffsetMode::kScalar;
    c.offset_value = -77;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "per_sequence_offsets_large_and_negative";
    c.seqs_q = {50, 60, 20};
    c.seqs_k = {400, 700, 129};
    c.offset_mode = QOffsetMode::kPerSequence;
    c.offsets = {-30, 1000, 127};
    add(c);
  }
  {
    ProxyCase c;
    c.name = "max_k_tiles_smaller_than_blocks";
    c.seqs_q = {64, 10};
    c.seqs_k = {1000, 300};
    c.max_k_tiles = 3;
    c.causal = false;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "max_k_tiles_larger_than_blocks";
    c.seqs_q = {64, 10};
    c.seqs_k = {1000, 300};
    c.max_k_tiles = 12;
    c.layout = Layout::kPaged;
    add(c);
  }
  {
    ProxyCase c;
    c.name = "gqa_16_strided_views";
    c.seqs_q = {17, 9};
    c.seqs_k = {333, 129};
    c.hq = 32;
    c.hkv = 2;
    c.q_pad = 8;
    c.k_pad = 128;  // a packed K|V view: K is the first half of each 256-wide row
    c.extra_rows = 2;
    add(c);
  }
  return v;
}

class ProxyScoreNamed : public ::testing::TestWithParam<ProxyCase> {};

TEST_P(ProxyScoreNamed, MatchesOracle) { check_case(GetParam(), 0xC0FFEE); }

INSTANTIATE_TEST_SUITE_P(Spec, ProxyScoreNamed, ::testing::ValuesIn(named_cases()),
                         [](const ::testing::TestParamInfo<ProxyCase>& info) {
                           return info.param.name;
                         });

// ---- random cases ---------------------------------------------------------------------------

ProxyCase random_case(uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 17);
  auto uni = [&](int lo, int hi) { return lo + int(rng() % uint64_t(hi - lo + 1)); };
  ProxyCase c;
  c.name = "random";
  const int B = uni(1, 4);
  const int group_choice = uni(0, 2);
  const int G = group_choice == 0 ? 1 : (group_choice == 1 ? 3 : 16);
  c.hkv = G == 16 ? 1 : uni(1, 2);
  c.hq = G * c.hkv;
  const int max_q = G == 16 ? 12 : 48;
  for (int b = 0; b < B; ++b) {
    int sk;
    switch (uni(0, 5)) {
      case 0: sk = 0; break;
      case 1: sk = kBlk * uni(1, 4); break;
      case 2: sk = kBlk * uni(1, 4) + 1; break;
      case 3: sk = kBlk * uni(1, 4) - 1; break;
      default: sk = uni(1, 600); break;
    }
    int sq = uni(0, 4) == 0 ? 0 : uni(1, max_q);
    if (uni(0, 6) == 0) sq = std::min(sk + uni(1, 20), max_q + 20);  // seqlen_q > seqlen_k
    c.seqs_q.push_back(sq);
    c.seqs_k.push_back(sk);
  }
  c.causal = uni(0, 3) != 0;
  c.reduce_heads = uni(0, 3) == 0;
  switch (uni(0, 3)) {
    case 0:
      c.offset_mode = QOffsetMode::kScalar;
      c.offset_value = uni(-100, 400);
      break;
    case 1:
      c.offset_mode = QOffsetMode::kPerSequence;
      for (int b = 0; b < B; ++b) c.offsets.push_back(uni(-150, c.seqs_k[b] + 50));
      break;
    default: c.offset_mode = QOffsetMode::kRightAligned; break;
  }
  int max_nb = 0;
  for (int sk : c.seqs_k) max_nb = std::max(max_nb, (sk + kBlk - 1) / kBlk);
  switch (uni(0, 3)) {
    case 0: c.max_k_tiles = max_nb > 1 ? uni(1, max_nb - 1) : -1; break;
    case 1: c.max_k_tiles = std::max(max_nb, 1) + uni(1, 3); break;
    default: c.max_k_tiles = -1; break;
  }
  static const std::pair<ScalarType, ScalarType> kDtypes[] = {
      {ScalarType::kBF16, ScalarType::kBF16},
      {ScalarType::kFP16, ScalarType::kFP16},
      {ScalarType::kBF16, ScalarType::kFP8E4M3},
      {ScalarType::kFP16, ScalarType::kFP8E4M3},
      {ScalarType::kFP8E4M3, ScalarType::kFP8E4M3}};
  std::tie(c.q_dtype, c.k_dtype) = kDtypes[uni(0, 4)];
  c.layout = Layout(uni(0, 2));
  c.extra_rows = uni(0, 2) == 0 ? uni(1, 5) : 0;
  c.q_pad = uni(0, 3) == 0 ? 8 : 0;
  c.k_pad = uni(0, 3) == 0 ? 128 : 0;
  return c;
}

class ProxyScoreRandom : public ::testing::TestWithParam<int> {};

TEST_P(ProxyScoreRandom, MatchesOracle) {
  const int seed = GetParam();
  check_case(random_case(uint64_t(seed)), uint64_t(seed));
}

INSTANTIATE_TEST_SUITE_P(Seeds, ProxyScoreRandom, ::testing::Range(0, 160));

// ---- targeted properties --------------------------------------------------------------------

// q_offset override (FlashInfer test_q_offset_override): the first token of each sequence sees keys
// [0, offset], so columns from block offset // 128 + 1 on are exactly -inf.
TEST(ProxyScoreHost, QOffsetOverrideMasksFromTheRightBlock) {
  ProxyCase c;
  c.name = "q_offset_override";
  c.seqs_q = {256, 256};
  c.seqs_k = {8192, 4096};
  c.hq = 2;
  c.offset_mode = QOffsetMode::kPerSequence;
  c.offsets = {256, 128};
  ProxyInstance in = make_instance(c, 5);
  const std::vector<float> got = run_reference(in, in.q, in.k_flat, false);
  for (int b = 0; b < 2; ++b) {
    const int r = in.cu_q[b];
    const int first_masked = c.offsets[b] / kBlk + 1;
    for (int h = 0; h < c.hq; ++h)
      for (int t = 0; t < in.max_k_tiles; ++t) {
        const float v = got[(size_t(h) * in.max_k_tiles + t) * in.total_q + r];
        if (t < first_masked) {
          EXPECT_TRUE(std::isfinite(v)) << "b=" << b << " t=" << t;
        } else {
          EXPECT_EQ(v, -std::numeric_limits<float>::infinity()) << "b=" << b << " t=" << t;
        }
      }
  }
  std::vector<int> rows;
  for (int r = 0; r < in.total_q; r += 37) rows.push_back(r);
  EXPECT_EQ(compare_rows(in, got, rows, "q_offset override"), 0);
}

// msa_proxy_score_fp4: NVFP4 q and k (random codes and e4m3 block scales, 128x4-swizzled) give,
// with logit_scale 1, the bf16 result of their dequantized values bit for bit (e2m1 * e4m3 is a
// bf16 value), which also matches the fp64 oracle; a logit_scale multiplies every logit before
// the block max (for a positive scale: the unit result times the scale, bit for bit).
struct Fp4Tensor {
  std::vector<uint8_t> data;    // [rows, 64]
  std::vector<uint8_t> scales;  // nvfp4_scale_bytes(rows)
};

Fp4Tensor random_fp4(int64_t rows, std::mt19937_64& rng) {
  Fp4Tensor t;
  t.data.resize(size_t(rows) * 64);
  for (auto& b : t.data) b = uint8_t(rng());
  t.scales.assign(size_t(nvfp4_scale_bytes(rows)), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < 8; ++c) t.scales[size_t(nvfp4_scale_offset(r, c))] = uint8_t(0x28 + rng() % 0x20);
  return t;
}

// Writes the dequantized values of t into the bf16 tensor dst ([rows, 128] elements) and values.
void dequantize_into(const Fp4Tensor& t, int64_t rows, HostTensor& dst, std::vector<double>& values) {
  values.clear();
  for (int64_t r = 0; r < rows; ++r)
    for (int d = 0; d < kD; ++d) {
      const float v = nvfp4_value(t.data.data() + r * 64, t.scales.data(), r, d);
      dst.set(r * kD + d, v);
      ASSERT_EQ(float(dst.get(r * kD + d)), v) << "dequantized value not exact in bf16";
      values.push_back(v);
    }
}

TEST(ProxyScoreHost, Fp4EqualsDequantizedBf16) {
  std::vector<ProxyCase> cases(3);
  cases[0].name = "fp4_gqa2";
  cases[0].seqs_q = {100, 37};
  cases[0].seqs_k = {700, 300};
  cases[0].hq = 4;
  cases[0].hkv = 2;
  cases[1].name = "fp4_reduce_noncausal";
  cases[1].seqs_q = {40};
  cases[1].seqs_k = {1000};
  cases[1].hq = 8;
  cases[1].hkv = 2;
  cases[1].causal = false;
  cases[1].reduce_heads = true;
  cases[2].name = "fp4_q_offset";
  cases[2].seqs_q = {16, 16};
  cases[2].seqs_k = {512, 300};
  cases[2].hq = 2;
  cases[2].offset_mode = QOffsetMode::kPerSequence;
  cases[2].offsets = {-5, 400};
  uint64_t seed = 31;
  for (const ProxyCase& c : cases) {
    SCOPED_TRACE(describe(c));
    ProxyInstance in = make_instance(c, seed++);
    std::mt19937_64 rng(seed);
    const int64_t q_rows = int64_t(in.total_q) * c.hq, k_rows = int64_t(in.total_k) * c.hkv;
    const Fp4Tensor q4 = random_fp4(q_rows, rng), k4 = random_fp4(k_rows, rng);
    dequantize_into(q4, q_rows, in.q, in.q_values);
    dequantize_into(k4, k_rows, in.k_flat, in.k_values);
    const std::vector<float> bf16 = run_reference(in, in.q, in.k_flat, false);
    EXPECT_EQ(compare_all(in, bf16, "dequantized bf16 vs oracle"), 0);

    for (const float logit_scale : {1.0f, 0.75f}) {
      std::vector<float> got;
      ProxyScoreParams p = make_params(in, in.q, in.k_flat, false, got);
      p.q = q4.data.data();
      p.q_dtype = DType::kNVFP4;
      p.q_stride_head = 64;
      p.q_stride_token = int64_t(c.hq) * 64;
      p.q_scale = q4.scales.data();
      p.k.data = k4.data.data();
      p.k.dtype = DType::kNVFP4;
      p.k.stride_head = 64;
      p.k.stride_token = int64_t(c.hkv) * 64;
      p.k.scale = k4.scales.data();
      p.k.scale_bytes = int64_t(k4.scales.size());
      p.logit_scale = logit_scale;
      reference::proxy_score(p);
      std::vector<float> want = bf16;
      for (float& v : want) v *= logit_scale;
      EXPECT_TRUE(bit_equal(got, want)) << "logit_scale " << logit_scale;
    }
  }
}

// The block max runs after the per-key mask: a NaN key that is masked (above the causal limit,
// or past seqlen_k inside a partial page) changes nothing; a visible one makes the block NaN,
// stored as the canonical positive NaN (FlashInfer leaves NaN open; docs/semantics.md#proxy-score
// states this rule).
TEST(ProxyScoreHost, NanOnlyFromVisibleKeys) {
  ProxyCase c;
  c.name = "nan";
  c.seqs_q = {4};
  c.seqs_k = {200};
  c.hq = 1;
  ProxyInstance in = make_instance(c, 9);
  // Right-aligned: offset 196, query i sees keys [0, 197 + i).
  poison(in.k_flat, int64_t(199) * kD);  // key 199: visible only to query 3
  poison(in.k_flat, int64_t(5) * kD);    // key 5: visible to all, block 0
  const std::vector<float> got = run_reference(in, in.q, in.k_flat, false);
  const int P = in.max_k_tiles;
  ASSERT_EQ(P, 2);
  for (int i = 0; i < 4; ++i) {
    const float b0 = got[size_t(0) * in.total_q + i];
    const float b1 = got[size_t(1) * in.total_q + i];
    uint32_t bits;
    std::memcpy(&bits, &b0, 4);
    EXPECT_EQ(bits, 0x7FFFFFFFu) << "row " << i;
    if (i < 3) {
      EXPECT_TRUE(std::isfinite(b1)) << "row " << i;
    } else {
      std::memcpy(&bits, &b1, 4);
      EXPECT_EQ(bits, 0x7FFFFFFFu) << "row " << i;
    }
  }
}

// Paged lengths beyond the page table are clamped to max_pages * 128 (a device-only value must not
// make the op read past the table).
TEST(ProxyScoreHost, PagedSequsedBeyondPageTableIsClamped) {
  ProxyCase c;
  c.name = "seqused_clamp";
  c.seqs_q = {20, 3};
  c.seqs_k = {256, 384};
  c.layout = Layout::kPaged;
  ProxyInstance in = make_instance(c, 11);
  in.max_pages = 2;  // the table's first two columns; seqused_k claims more for sequence 1
  std::vector<int> table;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 2; ++t) table.push_back(in.page_table.as<int>()[b * in.page_table.shape[1] + t]);
  in.page_table = int_tensor(table, {2, 2});
  in.max_k_tiles = 3;
  const std::vector<float> got = run_reference(in, in.q, in.k_paged, true);
  in.seqused_t.as<int>()[1] = 256;
  const std::vector<float> want = run_reference(in, in.q, in.k_paged, true);
  EXPECT_TRUE(bit_equal(got, want));
}

// Bit-identical for any thread count (D11).
TEST(ProxyScoreHost, DeterministicAcrossThreadCounts) {
  ProxyCase c;
  c.name = "threads";
  c.seqs_q = {300, 1, 77};
  c.seqs_k = {1500, 9000, 77};
  c.hq = 6;
  c.hkv = 2;
  c.reduce_heads = false;
  ProxyInstance in = make_instance(c, 3);
  const char* old = std::getenv("FLASHMSA_NUM_THREADS");
  const std::string saved = old ? old : "";
  std::vector<std::vector<float>> outs;
  for (const char* n : {"1", "2", "7"}) {
    setenv("FLASHMSA_NUM_THREADS", n, 1);
    outs.push_back(run_reference(in, in.q, in.k_flat, false));
  }
  if (old) {
    setenv("FLASHMSA_NUM_THREADS", saved.c_str(), 1);
  } else {
    unsetenv("FLASHMSA_NUM_THREADS");
  }
  EXPECT_TRUE(bit_equal(outs[0], outs[1]));
  EXPECT_TRUE(bit_equal(outs[0], outs[2]));
}

// reduce_heads equals the max over heads of the per-head output, bit for bit.
TEST(ProxyScoreHost, ReduceHeadsIsMaxOfPerHead) {
  ProxyCase c;
  c.name = "reduce";
  c.seqs_q = {70, 20};
  c.seqs_k = {700, 129};
  c.hq = 6;
  c.hkv = 3;
  ProxyInstance in = make_instance(c, 21);
  const std::vector<float> per_head = run_reference(in, in.q, in.k_flat, false);
  in.c.reduce_heads = true;
  const std::vector<float> reduced = run_reference(in, in.q, in.k_flat, false);
  const size_t plane = size_t(in.max_k_tiles) * in.total_q;
  std::vector<float> want(plane, -std::numeric_limits<float>::infinity());
  for (int h = 0; h < c.hq; ++h)
    for (size_t e = 0; e < plane; ++e) want[e] = std::max(want[e], per_head[h * plane + e]);
  EXPECT_TRUE(bit_equal(reduced, want));
}

// MiniMax-M3 indexer shape: 4096 tokens, 4 index heads, 1 key head, causal. Prints the time;
// checks a sample of rows against the oracle.
TEST(ProxyScoreHost, M3Shape4k) {
  ProxyCase c;
  c.name = "m3_4k";
  c.seqs_q = {4096};
  c.seqs_k = {4096};
  c.hq = 4;
  c.hkv = 1;
  ProxyInstance in = make_instance(c, 4096);
  std::vector<float> out;
  const ProxyScoreParams p = make_params(in, in.q, in.k_flat, false, out);
  const auto t0 = std::chrono::steady_clock::now();
  reference::proxy_score(p);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ proxy ] M3 4096 tokens x 4 heads causal: %.1f ms on %d threads\n", ms,
              reference::num_threads());
  std::vector<int> rows = {0, 1, 127, 128, 129, 2047, 4095};
  for (int r = 5; r < 4096; r += 409) rows.push_back(r);
  EXPECT_EQ(compare_rows(in, out, rows, "M3 4k"), 0);
}

}  // namespace
}  // namespace flashmsa::testing
