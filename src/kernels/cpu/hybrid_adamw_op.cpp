// SPDX-License-Identifier: Apache-2.0
// CpuBackend::hybrid_adamw: the hybrid AdamW span kernel (hybrid_adamw.h) with the best ISA of
// this CPU, on the calling thread (the LayerOptimizer threads its own calls; this op serves the
// device optimizer tail, whose CPU twin must produce the CPU worker's bits). Checked by
// hybrid_adamw_checks.h. Tested in tests/unit/train/device_optimizer_tail_test.cpp.
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/hybrid_adamw.h"
#include "kernels/cpu/hybrid_adamw_checks.h"

namespace ferry::kernels {

Status CpuBackend::hybrid_adamw(const HybridAdamWArgs& a, Stream&) {
  FERRY_TRY(detail::check_hybrid_adamw("cpu hybrid_adamw", a, Device::kCpu));
  if (a.span.n == 0) return {};
  cpu::hybrid_adamw_span(cpu::best_isa(), a.master, a.states, a.k, a.span);
  return {};
}

}  // namespace ferry::kernels
