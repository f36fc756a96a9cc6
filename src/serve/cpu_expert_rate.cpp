// SPDX-License-Identifier: Apache-2.0
#include "serve/cpu_expert_rate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "serve/expert_ffn_fast.h"
#include "serve/expert_store.h"

namespace ferry::serve {

Result<CpuExpertRate> measure_cpu_expert_rate(const ExpertStore& store, CpuExpertKernel kernel,
                                              ThreadPool& pool, std::size_t target_bytes,
                                              int min_calls, int passes) {
  if (kernel != CpuExpertKernel::kFast && kernel != CpuExpertKernel::kExact) {
    return invalid_argument("serve: the CPU expert rate is measured for the fast or exact kernel");
  }
  if (target_bytes == 0 || min_calls < 1 || passes < 1) {
    return invalid_argument(
        "serve: CPU expert rate: target bytes {}, min calls {}, passes {} must be positive",
        target_bytes, min_calls, passes);
  }
  std::vector<int> layers;
  for (int l = 0; l < store.layers(); ++l) {
    if (store.has_layer(l)) layers.push_back(l);
  }
  if (layers.empty() || store.experts() == 0) {
    return invalid_argument("serve: CPU expert rate: the expert store holds no MoE layer");
  }
  const int E = store.experts();
  const std::int64_t C = store.hidden(), F = store.width();
  const std::size_t eb = store.expert_bytes();
  // Distinct experts, layer-major: expert 0 of every MoE layer, then expert 1, ...
  const std::size_t all = layers.size() * std::size_t(E);
  const std::size_t distinct =
      std::clamp<std::size_t>((target_bytes + eb - 1) / eb, std::size_t(1), all);
  std::vector<std::pair<int, int>> order;  // (layer, expert) of each call in a pass
  for (std::size_t j = 0; order.size() < std::max<std::size_t>(distinct, std::size_t(min_calls));
       j = (j + 1) % distinct) {
    order.emplace_back(layers[j % layers.size()], int(j / layers.size()));
  }
  std::vector<float> x(static_cast<std::size_t>(C)), out(static_cast<std::size_t>(C)),
      scratch(static_cast<std::size_t>(F));
  for (std::int64_t c = 0; c < C; ++c) x[std::size_t(c)] = 0.05f * std::sin(0.37f * float(c));
  std::vector<ExpertRef> ref_of_expert(static_cast<std::size_t>(E));
  const std::int32_t row = 0;
  ExpertFfnGrouped grouped;
  grouped.reserve(1, F, E);
  double best = 1e300;
  float sink = 0;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& [l, e] : order) {
      const ExpertRef ref = store.ref(l, e);
      if (kernel == CpuExpertKernel::kFast) {
        ref_of_expert[std::size_t(e)] = ref;
        const std::int32_t id = e;
        grouped.run({.ref_of_expert = ref_of_expert.data(),
                     .ids = &id,
                     .rows = &row,
                     .n = 1,
                     .x = x.data(),
                     .out = out.data(),
                     .K = 1,
                     .E = E,
                     .C = C,
                     .F = F},
                    pool);
      } else {
        expert_ffn_row(ref, x.data(), out.data(), C, F, scratch.data());
      }
      sink += out[std::size_t(e) % std::size_t(C)];
    }
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  CpuExpertRate r;
  r.kernel = kernel;
  r.experts = int(distinct);
  r.calls = int(order.size());
  r.passes = passes;
  r.bytes_per_pass = order.size() * eb;
  r.seconds_per_expert = best / double(order.size());
  if (!(r.seconds_per_expert > 0) || !std::isfinite(r.seconds_per_expert) || !std::isfinite(sink)) {
    return internal_error(
        "serve: CPU expert rate: {} calls took {} s (clock too coarse?), output sum {}",
        order.size(), best, sink);
  }
  r.gflops = 6.0 * double(C) * double(F) / r.seconds_per_expert / 1e9;
  r.expert_gbps = double(eb) / r.seconds_per_expert / 1e9;
  return r;
}

}  // namespace ferry::serve
