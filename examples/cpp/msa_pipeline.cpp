// A C++ consumer of flashmsa's torch-free API (find_package(flashmsa), flashmsa::flashmsa): the
// MSA pipeline, proxy score -> top-k select -> sparse attention, on one sequence in host memory
// (so the exact CPU reference runs it; device pointers would run the CUDA kernels).
//
// The index keys of one block (the "needle") are made to match every index query, so top-k must
// select it for every query token that can see it; the sparse output of one token is then checked
// against attention computed here over the blocks top-k selected. Exits 1 when either fails.
#include <flashmsa/api.h>
#include <flashmsa/error.h>
#include <flashmsa/numeric.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace {

constexpr int kSeqlen = 1024;                               // tokens (causal self-attention)
constexpr int kBlocks = kSeqlen / flashmsa::kBlockSize;     // 8 key blocks
constexpr int kIndexHeads = 4;                              // index q heads == attention KV heads
constexpr int kHeads = 8;                                   // attention q heads (GQA group 2)
constexpr int kTopk = 4;
constexpr int kNeedle = 2;                                  // block whose keys match every query
constexpr int kD = flashmsa::kHeadDim;

// A contiguous host tensor description of `data` with the given sizes.
template <typename T>
flashmsa::TensorRef tensor(std::vector<T>& data, flashmsa::ScalarType dtype,
                           std::initializer_list<int64_t> sizes) {
  flashmsa::TensorRef t;
  t.data = data.data();
  t.dtype = dtype;
  t.ndim = int(sizes.size());
  int d = 0;
  for (int64_t s : sizes) t.sizes[d++] = s;
  int64_t stride = 1;
  for (d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.sizes[d];
  }
  t.device = -1;  // host memory: the CPU reference
  return t;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = flashmsa::float_to_bf16_bits(normal(rng));
  return v;
}

float bf16(uint16_t bits) { return flashmsa::bf16_bits_to_float(bits); }

}  // namespace

int main() {
  using flashmsa::ScalarType;
  std::mt19937 rng(7);
  std::vector<int32_t> cu_seqlens = {0, kSeqlen};

  // ---- stage 1: proxy score of 4 index heads over one index-K head --------------------------
  // Index queries share one direction per head; the needle block's keys are the sum of them.
  std::vector<uint16_t> direction = random_bf16(size_t(kIndexHeads) * kD, rng, 1.0f);
  std::vector<uint16_t> index_q = random_bf16(size_t(kSeqlen) * kIndexHeads * kD, rng, 0.5f);
  for (size_t i = 0; i < index_q.size(); ++i)
    index_q[i] = flashmsa::float_to_bf16_bits(bf16(index_q[i]) + bf16(direction[i % direction.size()]));
  std::vector<uint16_t> index_k = random_bf16(size_t(kSeqlen) * kD, rng, 0.1f);
  for (int j = kNeedle * flashmsa::kBlockSize; j < (kNeedle + 1) * flashmsa::kBlockSize; ++j) {
    for (int d = 0; d < kD; ++d) {
      float sum = 0.0f;
      for (int h = 0; h < kIndexHeads; ++h) sum += bf16(direction[size_t(h) * kD + d]);
      index_k[size_t(j) * kD + d] = flashmsa::float_to_bf16_bits(sum + bf16(index_k[size_t(j) * kD + d]));
    }
  }
  std::vector<float> scores(size_t(kIndexHeads) * kBlocks * kSeqlen);
  flashmsa::ProxyScoreArgs proxy;
  proxy.q = tensor(index_q, ScalarType::kBF16, {kSeqlen, kIndexHeads, kD});
  proxy.k = tensor(index_k, ScalarType::kBF16, {kSeqlen, 1, kD});
  proxy.cu_seqlens_q = tensor(cu_seqlens, ScalarType::kInt32, {2});
  proxy.cu_seqlens_k = tensor(cu_seqlens, ScalarType::kInt32, {2});
  proxy.causal = true;
  proxy.max_k_tiles = kBlocks;
  proxy.output = tensor(scores, ScalarType::kFloat32, {kIndexHeads, kBlocks, kSeqlen});

  // ---- stage 2: top-4 blocks per (token, head), the token's own block forced ----------------
  std::vector<int32_t> selected(size_t(kSeqlen) * kIndexHeads * kTopk);
  flashmsa::TopkSelectArgs topk;
  topk.max_score = proxy.output;
  topk.topk = kTopk;
  topk.num_valid_pages_value = kBlocks;
  topk.force_end_blocks = 1;
  topk.output = tensor(selected, ScalarType::kInt32, {kSeqlen, kIndexHeads, kTopk});

  // ---- stage 3: sparse attention over the selected blocks -----------------------------------
  std::vector<uint16_t> q = random_bf16(size_t(kSeqlen) * kHeads * kD, rng, 1.0f);
  std::vector<uint16_t> k = random_bf16(size_t(kSeqlen) * kIndexHeads * kD, rng, 1.0f);
  std::vector<uint16_t> v = random_bf16(size_t(kSeqlen) * kIndexHeads * kD, rng, 1.0f);
  std::vector<int32_t> q2k(selected.size());  // (KV heads, tokens, topk): selected transposed
  std::vector<uint16_t> out(q.size());
  flashmsa::SparseAttnArgs attn;
  attn.q = tensor(q, ScalarType::kBF16, {kSeqlen, kHeads, kD});
  attn.kv.k = tensor(k, ScalarType::kBF16, {kSeqlen, kIndexHeads, kD});
  attn.kv.v = tensor(v, ScalarType::kBF16, {kSeqlen, kIndexHeads, kD});
  attn.q2k_indices = tensor(q2k, ScalarType::kInt32, {kIndexHeads, kSeqlen, kTopk});
  attn.cu_seqlens_q = proxy.cu_seqlens_q;
  attn.cu_seqlens_k = proxy.cu_seqlens_k;
  attn.causal = true;
  attn.max_seqlen_q = kSeqlen;
  attn.output = tensor(out, ScalarType::kBF16, {kSeqlen, kHeads, kD});

  try {
    // Each op: validated params, then the plan of this call (device -1: host memory, the CPU
    // reference; default options), then the run.
    const flashmsa::ProxyScoreParams pp = flashmsa::make_proxy_score_params(proxy);
    flashmsa::run_proxy_score(pp, flashmsa::make_proxy_score_plan(pp, {}, -1), -1, nullptr);
    const flashmsa::TopkSelectParams tp = flashmsa::make_topk_select_params(topk);
    flashmsa::run_topk_select(tp, flashmsa::make_topk_select_plan(tp, {}, -1), -1, nullptr);
    for (int s = 0; s < kSeqlen; ++s)
      for (int h = 0; h < kIndexHeads; ++h)
        for (int i = 0; i < kTopk; ++i)
          q2k[(size_t(h) * kSeqlen + s) * kTopk + i] = selected[(size_t(s) * kIndexHeads + h) * kTopk + i];
    const flashmsa::SparseAttnParams ap = flashmsa::make_sparse_attention_params(attn);
    flashmsa::run_sparse_attention(ap, flashmsa::make_sparse_attention_plan(ap, {}, -1), -1, nullptr);
  } catch (const flashmsa::Error& e) {
    std::fprintf(stderr, "flashmsa error: %s\n", e.what());
    return 1;
  }

  // Recall of the needle over the (token, head) rows whose token sees the needle block.
  int rows = 0, found = 0;
  for (int s = (kNeedle + 1) * flashmsa::kBlockSize; s < kSeqlen; ++s) {
    for (int h = 0; h < kIndexHeads; ++h, ++rows) {
      for (int i = 0; i < kTopk; ++i) found += selected[(size_t(s) * kIndexHeads + h) * kTopk + i] == kNeedle;
    }
  }
  std::printf("needle block %d selected in %d of %d (token, head) rows that can see it\n", kNeedle,
              found, rows);

  // Attention of the last token, head 0, over the blocks its KV head selected (float64 here).
  const int s = kSeqlen - 1, h = 0, g = h / (kHeads / kIndexHeads);
  const double scale = 1.0 / std::sqrt(double(kD));
  std::vector<double> logits, acc(kD, 0.0);
  std::vector<int> keys;
  for (int i = 0; i < kTopk; ++i) {
    const int block = q2k[(size_t(g) * kSeqlen + s) * kTopk + i];
    if (block < 0) continue;
    for (int j = block * flashmsa::kBlockSize; j < (block + 1) * flashmsa::kBlockSize && j <= s; ++j) {
      double dot = 0.0;
      for (int d = 0; d < kD; ++d)
        dot += double(bf16(q[(size_t(s) * kHeads + h) * kD + d])) * bf16(k[(size_t(j) * kIndexHeads + g) * kD + d]);
      logits.push_back(dot * scale);
      keys.push_back(j);
    }
  }
  double max_logit = -INFINITY, denom = 0.0;
  for (double l : logits) max_logit = std::max(max_logit, l);
  for (size_t i = 0; i < keys.size(); ++i) {
    const double p = std::exp(logits[i] - max_logit);
    denom += p;
    for (int d = 0; d < kD; ++d) acc[d] += p * bf16(v[(size_t(keys[i]) * kIndexHeads + g) * kD + d]);
  }
  double max_err = 0.0;
  for (int d = 0; d < kD; ++d)
    max_err = std::max(max_err, std::abs(acc[d] / denom - bf16(out[(size_t(s) * kHeads + h) * kD + d])));
  std::printf("sparse attention of the last token over %zu keys: max |error| %.2e (bf16 output)\n",
              keys.size(), max_err);

  const bool ok = found == rows && max_err < 1e-2;
  std::printf("%s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
