// One line per plan (plan.h): which kernel and schedule a call runs and why. For logs
// (FLASHMSA_LOG=info in the Python package) and tests; host-only and pure, like the planners.
#pragma once

#include <string>

#include "flashmsa/params.h"
#include "flashmsa/plan.h"

namespace flashmsa {

// The plan of msa_sparse_attention made from these params and options.
std::string describe(const SparseAttnPlan& plan, const SparseAttnParams& p,
                     const SparseAttnOptions& options);
// The plan of msa_sparse_decode_attention (always query-major).
std::string describe_decode(const SparseAttnPlan& plan, const SparseAttnParams& p);
std::string describe(const ProxyScorePlan& plan, const ProxyScoreOptions& options);
std::string describe(const TopkSelectPlan& plan, const TopkSelectParams& p,
                     const TopkSelectOptions& options, const TopkSelectDeviceFacts& facts);

}  // namespace flashmsa
