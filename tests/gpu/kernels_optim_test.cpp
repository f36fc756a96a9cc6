// SPDX-License-Identifier: Apache-2.0
// The device twin of the hybrid AdamW kernel (kernels/cuda/hybrid_adamw_cuda.h) against the CPU
// kernel (the scalar twin, which every CPU SIMD body equals bit for bit): for every (master,
// states) combination it supports, spans of odd lengths (partial 8-bit blocks, one element,
// several blocks), two consecutive steps with different constants, every output array equal
// byte for byte. Also prints the device update's rate on a 64 Mi-element span (bytes moved /
// time; informational, not asserted).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/hybrid_adamw.h"
#include "kernels/cpu/q8_code.h"
#include "kernels/cuda/hybrid_adamw_cuda.h"
#include "tests/gpu/gpu_test_util.h"

namespace ferry {
namespace {

namespace kc = kernels::cpu;

// Host arrays of one span and their device copies.
struct SpanData {
  std::int64_t n = 0;
  std::vector<float> grad, p32, m32, v32, m_absmax, v_absmax;
  std::vector<std::uint16_t> p16, comp16;
  std::vector<std::uint8_t> m8, v8;
};

std::uint16_t bf16_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<std::uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

SpanData make_span(kc::MasterKind mk, kc::StateKind sk, std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  SpanData d;
  d.n = n;
  d.grad.resize(static_cast<std::size_t>(n));
  for (auto& g : d.grad) g = unit(rng) < 0.05f ? 0.0f : 1e-3f * normal(rng);  // some exact zeros
  if (mk == kc::MasterKind::kF32) {
    d.p32.resize(static_cast<std::size_t>(n));
    for (auto& p : d.p32) p = 0.02f * normal(rng);
    d.p16.resize(static_cast<std::size_t>(n));  // the optional bf16 copy out
  } else {
    d.p16.resize(static_cast<std::size_t>(n));
    for (auto& p : d.p16) p = bf16_of(0.02f * normal(rng));
    if (mk == kc::MasterKind::kBf16Kahan) {
      d.comp16.resize(static_cast<std::size_t>(n));
      for (auto& c : d.comp16) c = bf16_of(1e-5f * normal(rng));
    }
    d.p32.resize(static_cast<std::size_t>(n));  // the optional f32 compute view out
  }
  if (sk == kc::StateKind::kF32) {
    d.m32.resize(static_cast<std::size_t>(n));
    d.v32.resize(static_cast<std::size_t>(n));
    for (auto& m : d.m32) m = 1e-4f * normal(rng);
    for (auto& v : d.v32) v = 1e-8f * unit(rng);
  } else {
    const std::size_t blocks = static_cast<std::size_t>((n + kc::q8::kBlock - 1) / kc::q8::kBlock);
    d.m8.resize(static_cast<std::size_t>(n));
    d.v8.resize(static_cast<std::size_t>(n));
    for (auto& c : d.m8) c = static_cast<std::uint8_t>(byte(rng));
    for (auto& c : d.v8) c = static_cast<std::uint8_t>(byte(rng));
    d.m_absmax.resize(blocks);
    d.v_absmax.resize(blocks);
    for (auto& a : d.m_absmax) a = 1e-4f * (0.5f + unit(rng));
    for (auto& a : d.v_absmax) a = 1e-4f * (0.5f + unit(rng));
    if (blocks > 1) d.m_absmax[1] = 0.0f;  // an all-zero block's multipliers
  }
  return d;
}

// Absent arrays (empty vectors) stay null pointers: the kernel checks the pointer set.
template <typename T>
T* up(const std::vector<T>& h) {
  return h.empty() ? nullptr : testing::device_copy(h);
}

template <typename T>
void down_and_free(std::vector<T>& h, T* d) {
  if (d == nullptr) return;
  h = testing::host_copy(d, h.size());
  cudaFree(d);
}

kc::HybridAdamWSpan host_span(SpanData& d, std::uint64_t index0, std::uint64_t key) {
  kc::HybridAdamWSpan s;
  s.n = d.n;
  s.grad = d.grad.data();
  s.p32 = d.p32.empty() ? nullptr : d.p32.data();
  s.p16 = d.p16.empty() ? nullptr : d.p16.data();
  s.comp16 = d.comp16.empty() ? nullptr : d.comp16.data();
  s.m32 = d.m32.empty() ? nullptr : d.m32.data();
  s.v32 = d.v32.empty() ? nullptr : d.v32.data();
  s.m8 = d.m8.empty() ? nullptr : d.m8.data();
  s.v8 = d.v8.empty() ? nullptr : d.v8.data();
  s.m_absmax = d.m_absmax.empty() ? nullptr : d.m_absmax.data();
  s.v_absmax = d.v_absmax.empty() ? nullptr : d.v_absmax.data();
  s.index0 = index0;
  s.sr_key = key;
  return s;
}

// One step of the device twin on copies of d, results written back into d.
void device_step(kc::MasterKind mk, kc::StateKind sk, const kc::AdamWConstants& k, SpanData& d,
                 std::uint64_t index0, std::uint64_t key) {
  kc::HybridAdamWSpan s;
  s.n = d.n;
  s.grad = up(d.grad);
  s.p32 = up(d.p32);
  s.p16 = up(d.p16);
  s.comp16 = up(d.comp16);
  s.m32 = up(d.m32);
  s.v32 = up(d.v32);
  s.m8 = up(d.m8);
  s.v8 = up(d.v8);
  s.m_absmax = up(d.m_absmax);
  s.v_absmax = up(d.v_absmax);
  s.index0 = index0;
  s.sr_key = key;
  ASSERT_EQ(kernels::cuda::launch_hybrid_adamw(mk, sk, k, s, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(const_cast<float*>(s.grad));
  down_and_free(d.p32, s.p32);
  down_and_free(d.p16, s.p16);
  down_and_free(d.comp16, s.comp16);
  down_and_free(d.m32, s.m32);
  down_and_free(d.v32, s.v32);
  down_and_free(d.m8, s.m8);
  down_and_free(d.v8, s.v8);
  down_and_free(d.m_absmax, s.m_absmax);
  down_and_free(d.v_absmax, s.v_absmax);
}

template <typename T>
void expect_same_bytes(const std::vector<T>& cpu, const std::vector<T>& gpu, const char* what,
                       const std::string& where) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what << " " << where;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (std::memcmp(&cpu[i], &gpu[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << "[" << i << "] differs (" << where << "): cpu " << +cpu[i] << " gpu "
                    << +gpu[i];
      return;
    }
  }
}

class HybridAdamWGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  }
};

struct Mode {
  kc::MasterKind master;
  kc::StateKind states;
  const char* name;
};

constexpr Mode kModes[] = {
    {kc::MasterKind::kF32, kc::StateKind::kQ8, "f32+8bit"},
    {kc::MasterKind::kBf16Kahan, kc::StateKind::kF32, "bf16-kahan+f32"},
    {kc::MasterKind::kBf16Kahan, kc::StateKind::kQ8, "bf16-kahan+8bit"},
    {kc::MasterKind::kBf16Sr, kc::StateKind::kF32, "bf16-sr+f32"},
    {kc::MasterKind::kBf16Sr, kc::StateKind::kQ8, "bf16-sr+8bit"},
};

TEST_F(HybridAdamWGpu, EqualsTheCpuKernelBitForBitInEveryMode) {
  const std::int64_t lengths[] = {1, 2047, 2048, 5000, 3 * kc::q8::kBlock + 17};
  const kc::AdamWConstants steps[] = {
      kc::make_adamw_constants(1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.7f, 1),
      kc::make_adamw_constants(3e-4f, 0.9f, 0.95f, 1e-6f, 0.1f, 1.0f, 2),
  };
  int checked = 0;
  for (const Mode& mode : kModes) {
    for (std::int64_t n : lengths) {
      SpanData cpu = make_span(mode.master, mode.states, n, 1000 + static_cast<std::uint64_t>(n));
      SpanData gpu = cpu;
      const std::uint64_t index0 = 4096 * 3;  // a span starting inside its parameter
      for (int st = 0; st < 2; ++st) {
        const std::uint64_t key = kc::sr_key(7, st + 1, 3);
        kc::hybrid_adamw_span(kc::Isa::kScalar, mode.master, mode.states, steps[st],
                              host_span(cpu, index0, key));
        device_step(mode.master, mode.states, steps[st], gpu, index0, key);
        const std::string where =
            std::string(mode.name) + " n=" + std::to_string(n) + " step " + std::to_string(st + 1);
        expect_same_bytes(cpu.p32, gpu.p32, "p32", where);
        expect_same_bytes(cpu.p16, gpu.p16, "p16", where);
        expect_same_bytes(cpu.comp16, gpu.comp16, "comp16", where);
        expect_same_bytes(cpu.m32, gpu.m32, "m32", where);
        expect_same_bytes(cpu.v32, gpu.v32, "v32", where);
        expect_same_bytes(cpu.m8, gpu.m8, "m8", where);
        expect_same_bytes(cpu.v8, gpu.v8, "v8", where);
        expect_same_bytes(cpu.m_absmax, gpu.m_absmax, "m_absmax", where);
        expect_same_bytes(cpu.v_absmax, gpu.v_absmax, "v_absmax", where);
        ++checked;
      }
      // The update moved something (a test of equal copies of unchanged arrays proves nothing).
      const SpanData before =
          make_span(mode.master, mode.states, n, 1000 + static_cast<std::uint64_t>(n));
      EXPECT_TRUE(before.p16 != cpu.p16 || before.p32 != cpu.p32) << mode.name << " n=" << n;
    }
  }
  EXPECT_EQ(checked, 5 * 5 * 2);
}

TEST_F(HybridAdamWGpu, RefusesWhatTheCpuKernelRefuses) {
  SpanData d = make_span(kc::MasterKind::kF32, kc::StateKind::kF32, 16, 1);
  kc::HybridAdamWSpan s = host_span(d, 0, 0);  // pointers are never dereferenced: refused first
  const kc::AdamWConstants k = kc::make_adamw_constants(1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1);
  EXPECT_EQ(
      kernels::cuda::launch_hybrid_adamw(kc::MasterKind::kF32, kc::StateKind::kF32, k, s, nullptr),
      cudaErrorInvalidValue);  // f32 + f32 is launch_adamw's
  EXPECT_EQ(kernels::cuda::launch_hybrid_adamw(kc::MasterKind::kBf16Kahan, kc::StateKind::kF32, k,
                                               s, nullptr),
            cudaErrorInvalidValue);  // Kahan without comp16
  EXPECT_EQ(
      kernels::cuda::launch_hybrid_adamw(kc::MasterKind::kF32, kc::StateKind::kQ8, k, s, nullptr),
      cudaErrorInvalidValue);  // 8-bit states without codes
}

TEST_F(HybridAdamWGpu, PrintsTheDeviceUpdateRate) {
  // bf16-Kahan + 8-bit over 64 Mi elements: f32 grad read (4), p16 and comp16 read and written
  // (8), m8 and v8 read and written (4) = 16 bytes per element (scales negligible).
  const std::int64_t n = std::int64_t{64} << 20;
  SpanData d = make_span(kc::MasterKind::kBf16Kahan, kc::StateKind::kQ8, n, 5);
  d.p32.clear();  // no f32 view out: the streaming executor's case
  kc::HybridAdamWSpan s;
  s.n = n;
  s.grad = up(d.grad);
  s.p16 = up(d.p16);
  s.comp16 = up(d.comp16);
  s.m8 = up(d.m8);
  s.v8 = up(d.v8);
  s.m_absmax = up(d.m_absmax);
  s.v_absmax = up(d.v_absmax);
  const kc::AdamWConstants k = kc::make_adamw_constants(1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f, 1);
  cudaEvent_t e0, e1;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  ASSERT_EQ(kernels::cuda::launch_hybrid_adamw(kc::MasterKind::kBf16Kahan, kc::StateKind::kQ8, k, s,
                                               nullptr),
            cudaSuccess);  // warm-up
  constexpr int kReps = 5;
  ASSERT_EQ(cudaEventRecord(e0), cudaSuccess);
  for (int r = 0; r < kReps; ++r) {
    ASSERT_EQ(kernels::cuda::launch_hybrid_adamw(kc::MasterKind::kBf16Kahan, kc::StateKind::kQ8, k,
                                                 s, nullptr),
              cudaSuccess);
  }
  ASSERT_EQ(cudaEventRecord(e1), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
  float ms = 0.0f;
  ASSERT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
  const double per = ms / kReps;
  std::printf(
      "[hybrid_adamw_gpu] bf16-kahan+8bit, %lld elements: %.3f ms per update, %.1f "
      "Gparam/s, %.0f GB/s at 16 B/param\n",
      static_cast<long long>(n), per, static_cast<double>(n) / per / 1e6,
      16.0 * static_cast<double>(n) / per / 1e6);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  for (const void* p : {static_cast<const void*>(s.grad), static_cast<const void*>(s.p16),
                        static_cast<const void*>(s.comp16), static_cast<const void*>(s.m8),
                        static_cast<const void*>(s.v8), static_cast<const void*>(s.m_absmax),
                        static_cast<const void*>(s.v_absmax)}) {
    cudaFree(const_cast<void*>(p));
  }
}

}  // namespace
}  // namespace ferry
