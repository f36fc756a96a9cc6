// SPDX-License-Identifier: Apache-2.0
// The decode-shaped serve kernels (docs/cuda.md "Decode kernels", KernelVariant in
// kernels/cuda/serve_kernel_args.h) against the kernels they replace, the CPU twins and f64:
//   - paged_attention, split keys (kDecode) and the warp-per-head baseline (kBaseline), each
//     within style.md's rule of the CPU twin serve::paged_attention (err <= 2 err(cpu) + 1e-6,
//     both against an f64 loop), on scattered block tables, prefill chunks mixed with decodes,
//     D = 16 / 18 (no 16-byte path: the baseline runs) / 32 / 64 / 96 / 128 / 256 and
//     Qwen3-30B-A3B's G = 8 query heads per kv head, D = 128 at contexts 1, 17, 160, 1000, 4096;
//     the same bits on a second run, for each token run alone (T = 1) and in a reversed step
//     (batch invariance: a token's bits do not depend on the other tokens of the step);
//   - a bf16 pool (KvConfig::dtype): both kernels give, bit for bit, their result on an f32 pool
//     holding the same rounded rows, and kv_write stores the CPU's KvCache::write_rows bytes;
//   - the router's softmax/top-k, registers kernel vs the baseline: the same ids, probs and
//     weights bits (ties included: lower id first), E = 8 .. 256 and > 256 (baseline in both);
//   - expert_ffn, chunked 16-byte-load kernels and the baseline: bf16 == f32 on the widened
//     weights bit for bit, the same bits at misaligned slot addresses, in row splits and
//     through a row list, and style.md's rule against the CPU twin expert_ffn_row; C / F
//     multiples of 8 (Qwen3-30B-A3B's 2048 / 768), of 4 only, and odd (tails, unaligned rows).
// Skips, saying so, without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "kernels/cuda/serve_kernels.h"
#include "serve/expert_ffn.h"
#include "serve/kv_cache.h"
#include "serve/paged_attention.h"
#include "tests/gpu/gpu_test_util.h"

namespace ferry::serve {
namespace {

using ferry::testing::CudaTest;
using kernels::cuda::KernelVariant;

using ferry::testing::DeviceBuf;
using ferry::testing::down;
using ferry::testing::max_abs_diff;
using ferry::testing::same_bits;
using ferry::testing::up;

const char* name(KernelVariant v) { return v == KernelVariant::kDecode ? "decode" : "baseline"; }

// ---- paged_attention ----

struct AttnShape {
  int H, G, D, block_tokens;
  std::vector<int> lens;  // sequence lengths; the last one's final `chunk` positions are a
  int chunk;              // prefill chunk, every other sequence decodes at len - 1
};

// A host KV cache (sequences' blocks interleaved), the step, q, and the pool on the device.
struct PagedCase {
  static constexpr int kLayer = 1;
  AttnShape sh;
  std::unique_ptr<KvCache> kv;
  std::vector<BlockTable> tables;
  std::vector<std::int32_t> seq_of, pos;
  std::vector<float> q;  // [T, H, D]
  float scale = 0;
  std::unique_ptr<DeviceBuf> d_pool, d_tab;
  int stride = 0;
  std::int64_t T() const { return std::int64_t(seq_of.size()); }
};

void build(PagedCase& c, const AttnShape& sh, unsigned seed) {
  c.sh = sh;
  model::DecoderGeometry geo;
  geo.layers = 2;
  geo.heads = sh.H;
  geo.kv_heads = sh.G;
  geo.head_dim = sh.D;
  const int S = int(sh.lens.size()), GD = sh.G * sh.D;
  std::size_t blocks = 0;
  for (int len : sh.lens) blocks += std::size_t((len + sh.block_tokens - 1) / sh.block_tokens) + 1;
  const std::size_t budget = blocks * sh.block_tokens * GD * 4 * 2 * geo.layers;
  auto kvr = KvCache::create(geo, {.block_tokens = sh.block_tokens, .budget_bytes = budget});
  ASSERT_TRUE(kvr.ok()) << kvr.status().to_string();
  c.kv = std::move(*kvr);
  c.tables.assign(S, {});
  const int longest = *std::max_element(sh.lens.begin(), sh.lens.end());
  for (int step = 0; step < longest; ++step) {
    for (int s = 0; s < S; ++s) {
      if (step < sh.lens[s]) {
        ASSERT_TRUE(c.kv->reserve(c.tables[s], step + 1).ok());
      }
    }
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int s = 0; s < S; ++s) {
    for (int p = 0; p < sh.lens[s]; ++p) {
      float* k = c.kv->k_row(PagedCase::kLayer, c.tables[s], p);
      float* v = c.kv->v_row(PagedCase::kLayer, c.tables[s], p);
      for (int i = 0; i < GD; ++i) {
        k[i] = nd(rng);
        v[i] = nd(rng);
      }
    }
  }
  const int last = S - 1;
  for (int p = sh.lens[last] - sh.chunk; p < sh.lens[last]; ++p) {
    c.seq_of.push_back(last);
    c.pos.push_back(p);
  }
  for (int s = 0; s < last; ++s) {
    c.seq_of.push_back(s);
    c.pos.push_back(sh.lens[s] - 1);
  }
  c.q.resize(std::size_t(c.T()) * sh.H * sh.D);
  for (float& x : c.q) x = nd(rng);
  c.scale = 1.0f / std::sqrt(float(sh.D));
  const std::size_t pool_floats = std::size_t(c.kv->layer_stride_elems()) * geo.layers;
  c.d_pool = std::make_unique<DeviceBuf>(pool_floats * 4);
  ASSERT_EQ(ferry::testing::copy_to_device(c.d_pool->p, c.kv->base(), pool_floats * 4),
            cudaSuccess);
  for (auto& t : c.tables) c.stride = std::max<int>(c.stride, int(t.blocks.size()));
  std::vector<std::int32_t> packed(std::size_t(S) * c.stride, 0);
  for (int s = 0; s < S; ++s) {
    std::copy(c.tables[s].blocks.begin(), c.tables[s].blocks.end(),
              packed.begin() + std::size_t(s) * c.stride);
  }
  c.d_tab = std::make_unique<DeviceBuf>(packed.size() * 4);
  up(c.d_tab->p, packed);
}

std::vector<double> attention_f64(const PagedCase& c) {
  const AttnShape& sh = c.sh;
  std::vector<double> want(c.q.size());
  for (std::int64_t t = 0; t < c.T(); ++t) {
    const BlockTable& tab = c.tables[c.seq_of[t]];
    for (int h = 0; h < sh.H; ++h) {
      const int g = h / (sh.H / sh.G);
      const float* qh = c.q.data() + (t * sh.H + h) * sh.D;
      std::vector<double> sc(std::size_t(c.pos[t] + 1));
      double mx = -1e300;
      for (int j = 0; j <= c.pos[t]; ++j) {
        const float* kj = c.kv->k_row(PagedCase::kLayer, tab, j) + g * sh.D;
        double d = 0;
        for (int i = 0; i < sh.D; ++i) d += double(qh[i]) * kj[i];
        sc[j] = d * c.scale;
        mx = std::max(mx, sc[j]);
      }
      double l = 0;
      for (double& x : sc) l += (x = std::exp(x - mx));
      std::vector<double> o(sh.D, 0.0);
      for (int j = 0; j <= c.pos[t]; ++j) {
        const float* vj = c.kv->v_row(PagedCase::kLayer, tab, j) + g * sh.D;
        for (int i = 0; i < sh.D; ++i) o[i] += sc[j] * vj[i];
      }
      for (int i = 0; i < sh.D; ++i) want[(t * sh.H + h) * sh.D + i] = o[i] / l;
    }
  }
  return want;
}

class ServeDecodeKernels : public CudaTest {
 protected:
  // The kernel on the tokens `rows` of the case's step (in that order): out [rows, H, D]. pool:
  // the case's f32 pool, or another image of the same layout (bf16: its elements are bf16).
  std::vector<float> attention_gpu(const PagedCase& c, const std::vector<std::int64_t>& rows,
                                   KernelVariant variant, const DeviceBuf* pool = nullptr,
                                   bool bf16 = false);
};

std::vector<float> ServeDecodeKernels::attention_gpu(const PagedCase& c,
                                                     const std::vector<std::int64_t>& rows,
                                                     KernelVariant variant, const DeviceBuf* pool,
                                                     bool bf16) {
  const int HD = c.sh.H * c.sh.D;
  std::vector<std::int32_t> seq_of, pos;
  std::vector<float> q;
  for (std::int64_t r : rows) {
    seq_of.push_back(c.seq_of[r]);
    pos.push_back(c.pos[r]);
    q.insert(q.end(), c.q.begin() + r * HD, c.q.begin() + (r + 1) * HD);
  }
  DeviceBuf d_seq(seq_of.size() * 4), d_pos(pos.size() * 4), d_q(q.size() * 4), d_out(q.size() * 4);
  up(d_seq.p, seq_of);
  up(d_pos.p, pos);
  up(d_q.p, q);
  EXPECT_EQ(cudaMemsetAsync(d_out.p, 0xff, q.size() * 4, raw_stream()),
            cudaSuccess);  // NaN: every row written
  const kernels::cuda::PagedKvLayout layout{.base = (pool != nullptr ? pool : c.d_pool.get())->p,
                                            .layer_stride = c.kv->layer_stride_elems(),
                                            .block_tokens = c.sh.block_tokens,
                                            .G = c.sh.G,
                                            .D = c.sh.D,
                                            .bf16 = bf16};
  const kernels::cuda::PagedStep step{.seq_of = d_seq.as<std::int32_t>(),
                                      .pos = d_pos.as<std::int32_t>(),
                                      .tables = c.d_tab->as<std::int32_t>(),
                                      .table_stride = c.stride,
                                      .T = std::int64_t(rows.size())};
  const Status st =
      kernels::cuda::paged_attention(layout, PagedCase::kLayer, step, d_out.as<float>(),
                                     d_q.as<float>(), c.sh.H, c.scale, variant, stream());
  EXPECT_TRUE(st.ok()) << st.to_string();
  sync();
  return down<float>(d_out.p, q.size());
}

TEST_F(ServeDecodeKernels, PagedAttentionBothKernelsKeepTheRuleAndBatchInvariance) {
  const std::vector<AttnShape> shapes = {
      {4, 2, 16, 4, {37, 70, 9}, 10},
      {8, 2, 64, 16, {37, 9, 70}, 10},
      {6, 3, 32, 5, {1, 37, 70}, 10},
      {4, 2, 18, 4, {20, 9, 33}, 5},  // D % 4 != 0: kDecode runs the baseline
      {4, 2, 96, 8, {1, 33, 130, 21}, 7},
      {4, 2, 256, 16, {1, 17, 300, 600, 50}, 9},           // two 16-byte chunks per lane
      {32, 4, 128, 16, {1, 17, 160, 1000, 4096, 40}, 10},  // Qwen3-30B-A3B, G = 8 q per kv head
  };
  for (const AttnShape& sh : shapes) {
    PagedCase c;
    build(c, sh, 1234u + unsigned(sh.D) * 7u + unsigned(sh.H));
    ASSERT_FALSE(HasFatalFailure());
    const std::string what = fmt::format("H {} G {} D {} bt {}", sh.H, sh.G, sh.D, sh.block_tokens);
    const std::vector<double> want = attention_f64(c);
    std::vector<float> cpu(c.q.size());
    std::vector<const BlockTable*> tp;
    for (const BlockTable& t : c.tables) tp.push_back(&t);
    ASSERT_TRUE(paged_attention(*c.kv, {.out = cpu.data(),
                                        .q = c.q.data(),
                                        .seq_of = c.seq_of.data(),
                                        .pos = c.pos.data(),
                                        .tables = tp,
                                        .T = c.T(),
                                        .layer = PagedCase::kLayer,
                                        .H = sh.H,
                                        .G = sh.G,
                                        .D = sh.D,
                                        .scale = c.scale})
                    .ok());
    const double en = max_abs_diff(cpu, want);
    std::vector<std::int64_t> all(std::size_t(c.T()));
    std::iota(all.begin(), all.end(), 0);
    std::vector<std::int64_t> reversed(all.rbegin(), all.rend());
    const std::size_t HD = std::size_t(sh.H) * sh.D;
    for (const KernelVariant v : {KernelVariant::kDecode, KernelVariant::kBaseline}) {
      const std::vector<float> gpu = attention_gpu(c, all, v);
      const double e = max_abs_diff(gpu, want);
      EXPECT_LE(e, 2 * en + 1e-6) << what << " " << name(v);
      std::cout << "[serve_decode] paged_attention " << name(v) << " " << what << ": err cuda " << e
                << ", cpu twin " << en << "\n";
      EXPECT_TRUE(same_bits(attention_gpu(c, all, v), gpu))
          << what << " " << name(v) << ": a second run gave other bits";
      const std::vector<float> rev = attention_gpu(c, reversed, v);
      for (std::size_t r = 0; r < all.size(); ++r) {
        const std::size_t t = std::size_t(reversed[r]);
        EXPECT_EQ(std::memcmp(rev.data() + r * HD, gpu.data() + t * HD, HD * 4), 0)
            << what << " " << name(v) << ": token " << t << " differs in a reversed step";
        const std::vector<float> alone = attention_gpu(c, {std::int64_t(t)}, v);
        EXPECT_EQ(std::memcmp(alone.data(), gpu.data() + t * HD, HD * 4), 0)
            << what << " " << name(v) << ": token " << t << " (pos " << c.pos[t]
            << ") alone differs from its row in the step";
      }
    }
  }
}

// A bf16 pool: the case's rows rounded to bf16 (in the host cache, re-uploaded as the f32 pool)
// and the same rows as a bf16 image; each kernel reads both to the same bits, since it widens
// each element exactly and keeps the f32 arithmetic (the CPU's exact twin is
// tests/unit/serve/kv_dtype_test.cpp).
TEST_F(ServeDecodeKernels, PagedAttentionOnABf16PoolIsTheF32KernelOnTheRoundedRows) {
  const std::vector<AttnShape> shapes = {
      {4, 2, 16, 4, {37, 70, 9}, 10},
      {4, 2, 18, 4, {20, 9, 33}, 5},  // D % 4 != 0: the baseline in both
      {4, 2, 256, 16, {1, 17, 300, 50}, 9},
      {32, 4, 128, 16, {1, 17, 160, 1000, 40}, 10},
  };
  for (const AttnShape& sh : shapes) {
    PagedCase c;
    build(c, sh, 99u + unsigned(sh.D));
    ASSERT_FALSE(HasFatalFailure());
    const std::string what = fmt::format("H {} G {} D {} bt {}", sh.H, sh.G, sh.D, sh.block_tokens);
    const std::size_t n = std::size_t(c.kv->layer_stride_elems()) * 2;  // 2 layers
    float* host = c.kv->base();
    std::vector<std::uint16_t> image(n);
    for (std::size_t i = 0; i < n; ++i) {
      image[i] = f32_to_bf16(host[i]);
      host[i] = bf16_to_f32(image[i]);
    }
    ASSERT_EQ(ferry::testing::copy_to_device(c.d_pool->p, host, n * 4), cudaSuccess);
    DeviceBuf d_bf16(n * 2);
    up(d_bf16.p, image);
    std::vector<std::int64_t> all(std::size_t(c.T()));
    std::iota(all.begin(), all.end(), 0);
    for (const KernelVariant v : {KernelVariant::kDecode, KernelVariant::kBaseline}) {
      const std::vector<float> f32 = attention_gpu(c, all, v);
      const std::vector<float> bf = attention_gpu(c, all, v, &d_bf16, /*bf16=*/true);
      EXPECT_TRUE(same_bits(bf, f32))
          << what << " " << name(v) << ": max |d| " << max_abs_diff(bf, f32);
    }
  }
}

// kv_write into a bf16 pool stores what the CPU cache's write_rows stores (round to nearest even),
// at the same addresses, and nothing else.
TEST_F(ServeDecodeKernels, KvWriteIntoABf16PoolStoresTheCpuCachesBytes) {
  model::DecoderGeometry geo;
  geo.layers = 3;
  geo.heads = 4;
  geo.kv_heads = 2;
  geo.head_dim = 16;
  const int GD = geo.kv_heads * geo.head_dim, bt = 4;
  auto kvr =
      KvCache::create(geo, {.block_tokens = bt, .budget_bytes = 1 << 16, .dtype = DType::kBF16});
  ASSERT_TRUE(kvr.ok()) << kvr.status().to_string();
  KvCache& kv = **kvr;
  const std::size_t bytes = std::size_t(kv.layer_stride_elems()) * geo.layers * 2;
  std::memset(kv.data(), 0, bytes);
  std::vector<BlockTable> tables(2);
  ASSERT_TRUE(kv.reserve(tables[0], 9).ok());
  ASSERT_TRUE(kv.reserve(tables[1], 6).ok());
  // A step: sequence 0 positions 3..8 (a chunk), sequence 1 position 5 (a decode).
  std::vector<std::int32_t> seq_of = {0, 0, 0, 0, 0, 0, 1}, pos = {3, 4, 5, 6, 7, 8, 5};
  const std::int64_t T = std::int64_t(pos.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> k(std::size_t(T) * GD), v(k.size());
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  const int layer = 2;
  for (std::int64_t t = 0; t < T; ++t) {
    kv.write_rows(layer, tables[std::size_t(seq_of[t])], pos[t], k.data() + t * GD,
                  v.data() + t * GD);
  }
  const int stride = 3;
  std::vector<std::int32_t> packed(2 * stride, 0);
  for (int s = 0; s < 2; ++s) {
    std::copy(tables[s].blocks.begin(), tables[s].blocks.end(), packed.begin() + s * stride);
  }
  DeviceBuf d_pool(bytes), d_tab(packed.size() * 4), d_seq(seq_of.size() * 4),
      d_pos(pos.size() * 4), d_k(k.size() * 4), d_v(v.size() * 4);
  ASSERT_EQ(cudaMemset(d_pool.p, 0, bytes), cudaSuccess);
  up(d_tab.p, packed);
  up(d_seq.p, seq_of);
  up(d_pos.p, pos);
  up(d_k.p, k);
  up(d_v.p, v);
  const kernels::cuda::PagedKvLayout layout{.base = d_pool.p,
                                            .layer_stride = kv.layer_stride_elems(),
                                            .block_tokens = bt,
                                            .G = geo.kv_heads,
                                            .D = geo.head_dim,
                                            .bf16 = true};
  const kernels::cuda::PagedStep step{.seq_of = d_seq.as<std::int32_t>(),
                                      .pos = d_pos.as<std::int32_t>(),
                                      .tables = d_tab.as<std::int32_t>(),
                                      .table_stride = stride,
                                      .T = T};
  ASSERT_TRUE(
      kernels::cuda::kv_write(layout, layer, step, d_k.as<float>(), d_v.as<float>(), stream())
          .ok());
  sync();
  const std::vector<std::uint8_t> got = down<std::uint8_t>(d_pool.p, bytes);
  EXPECT_EQ(std::memcmp(got.data(), kv.data(), bytes), 0);
}

// ---- router ----

TEST_F(ServeDecodeKernels, RouterRegistersKernelGivesTheBaselinesBits) {
  struct Case {
    std::int64_t t, e;
    int k;
    bool renorm, ties;
  };
  for (const Case cs :
       {Case{1, 128, 8, true, false}, Case{4, 128, 8, false, false}, Case{3, 128, 8, true, true},
        Case{1, 1, 1, false, false}, Case{5, 8, 2, true, true}, Case{3, 60, 4, true, false},
        Case{2, 32, 32, true, false}, Case{9, 64, 6, false, true}, Case{2, 200, 8, true, false},
        Case{3, 256, 32, true, true}, Case{2, 300, 8, true, false}}) {
    std::mt19937 rng(unsigned(cs.t * 131 + cs.e * 7 + cs.k));
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> logits(std::size_t(cs.t * cs.e));
    for (float& x : logits) x = cs.ties ? float(int(rng() % 5) - 2) : nd(rng);
    DeviceBuf d_l(logits.size() * 4);
    up(d_l.p, logits);
    struct Out {
      std::vector<float> w, p;
      std::vector<std::int32_t> ids;
    };
    auto run = [&](KernelVariant v) {
      DeviceBuf d_w(cs.t * cs.k * 4), d_ids(cs.t * cs.k * 4), d_p(cs.t * cs.e * 4);
      const Status st =
          kernels::cuda::router_f32(d_w.as<float>(), d_ids.as<std::int32_t>(), d_p.as<float>(),
                                    d_l.as<float>(), cs.t, cs.e, cs.k, cs.renorm, v, stream());
      EXPECT_TRUE(st.ok()) << st.to_string();
      sync();
      return Out{down<float>(d_w.p, cs.t * cs.k), down<float>(d_p.p, cs.t * cs.e),
                 down<std::int32_t>(d_ids.p, cs.t * cs.k)};
    };
    const Out base = run(KernelVariant::kBaseline), regs = run(KernelVariant::kDecode);
    const std::string what =
        fmt::format("t {} e {} k {} renorm {} ties {}", cs.t, cs.e, cs.k, cs.renorm, cs.ties);
    EXPECT_TRUE(same_bits(regs.ids, base.ids)) << what;
    EXPECT_TRUE(same_bits(regs.p, base.p)) << what;
    EXPECT_TRUE(same_bits(regs.w, base.w)) << what;
    // The ids themselves: distinct, in [0, e), probabilities non-increasing, ties by lower id.
    for (std::int64_t t = 0; t < cs.t; ++t) {
      for (int j = 0; j < cs.k; ++j) {
        const std::int32_t id = regs.ids[t * cs.k + j];
        ASSERT_TRUE(id >= 0 && id < cs.e) << what << " token " << t << " id " << id;
        if (j == 0) continue;
        const std::int32_t prev = regs.ids[t * cs.k + j - 1];
        const float pp = regs.p[t * cs.e + prev], pi = regs.p[t * cs.e + id];
        EXPECT_TRUE(pp > pi || (pp == pi && prev < id)) << what << " token " << t << " rank " << j;
      }
    }
  }
}

// ---- expert_ffn ----

// One expert row in double (as serve_gpu_test.cpp): the expert's [gate; up; down] back to back.
void expert_ffn_f64(const float* b, const float* xt, std::int64_t C, std::int64_t F, double* out) {
  std::vector<double> act(F);
  for (std::int64_t f = 0; f < F; ++f) {
    double g = 0, u = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      g += double(b[f * C + c]) * xt[c];
      u += double(b[F * C + f * C + c]) * xt[c];
    }
    act[f] = g / (1 + std::exp(-g)) * u;
  }
  for (std::int64_t c = 0; c < C; ++c) {
    double o = 0;
    for (std::int64_t f = 0; f < F; ++f) o += double(b[2 * F * C + c * F + f]) * act[f];
    out[c] = o;
  }
}

TEST_F(ServeDecodeKernels, ExpertFfnBf16EqualsF32IgnoresSlotAndGroupingKeepsTheRule) {
  struct Shape {
    std::int64_t C, F;
    int E, K;
    std::int64_t T;
  };
  for (const Shape sh : {Shape{2048, 768, 6, 4, 3},  // Qwen3-30B-A3B's C, F: 16-byte rows
                         Shape{2052, 772, 5, 2, 4},  // f32 rows aligned, bf16 rows every other
                         Shape{2053, 771, 5, 3, 2},  // odd: tails, unaligned rows
                         Shape{96, 40, 5, 2, 7}}) {
    const std::int64_t C = sh.C, F = sh.F, rows = sh.T * sh.K;
    const int E = sh.E, K = sh.K;
    const std::string what = fmt::format("C {} F {} E {} K {} T {}", C, F, E, K, sh.T);
    std::mt19937 rng(unsigned(C * 3 + F));
    std::uniform_real_distribution<float> ud(-0.05f, 0.05f);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const std::size_t per = std::size_t(3 * F * C), n = per * E;
    std::vector<std::uint16_t> wb(n);
    std::vector<float> wf(n), x(std::size_t(sh.T * C));
    for (std::size_t i = 0; i < n; ++i) {
      wb[i] = f32_to_bf16(ud(rng));
      wf[i] = bf16_to_f32(wb[i]);
    }
    for (float& v : x) v = nd(rng);
    std::vector<std::int32_t> ids(rows);  // K distinct experts per token
    for (std::int64_t t = 0; t < sh.T; ++t) {
      std::vector<std::int32_t> perm(E);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int k = 0; k < K; ++k) ids[t * K + k] = perm[k];
    }
    // bf16 and f32 copies at a 16-byte aligned base and at a shifted one (1 bf16, 3 floats).
    DeviceBuf d_wb(n * 2 + 16), d_wf(n * 4 + 16), d_x(x.size() * 4), d_ids(rows * 4),
        d_order(rows * 4), d_act(rows * F * 4);
    std::uint16_t* wb1 = d_wb.as<std::uint16_t>();
    float* wf1 = d_wf.as<float>();
    up(d_x.p, x);
    up(d_ids.p, ids);
    std::vector<std::int32_t> order(rows);
    for (std::int64_t p = 0; p < rows; ++p) order[p] = std::int32_t(rows - 1 - p);
    up(d_order.p, order);
    auto table_for = [&](const std::byte* base, std::size_t elem) {
      return ferry::testing::expert_pointer_table(base, E, F, C, elem);
    };
    DeviceBuf d_tb(3 * E * 8), d_tf(3 * E * 8), d_tb2(3 * E * 8), d_tf2(3 * E * 8);
    up(d_tb.p, table_for(reinterpret_cast<const std::byte*>(wb1), 2));
    up(d_tf.p, table_for(reinterpret_cast<const std::byte*>(wf1), 4));
    up(d_tb2.p, table_for(reinterpret_cast<const std::byte*>(wb1 + 1), 2));
    up(d_tf2.p, table_for(reinterpret_cast<const std::byte*>(wf1 + 3), 4));
    auto args = [&](void* out, void* table, bool bf16, std::int64_t r0, std::int64_t r1) {
      return kernels::cuda::ExpertFfnArgs{.out = static_cast<float*>(out),
                                          .act = d_act.as<float>(),
                                          .x = d_x.as<float>(),
                                          .ids = d_ids.as<std::int32_t>(),
                                          .table = static_cast<const void* const*>(table),
                                          .row_begin = r0,
                                          .row_end = r1,
                                          .K = K,
                                          .E = E,
                                          .C = C,
                                          .F = F,
                                          .bf16 = bf16};
    };
    // CPU twin (on the bf16 bits) and f64 on the widened weights.
    std::vector<float> cpu(rows * C), scratch(F);
    std::vector<double> want(rows * C);
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::size_t base = std::size_t(ids[i]) * per;
      const float* xt = x.data() + (i / K) * C;
      expert_ffn_row(
          {wb.data() + base, wb.data() + base + F * C, wb.data() + base + 2 * F * C, DType::kBF16},
          xt, cpu.data() + i * C, C, F, scratch.data());
      expert_ffn_f64(wf.data() + base, xt, C, F, want.data() + i * C);
    }
    const double en = max_abs_diff(cpu, want);
    DeviceBuf d_ob(rows * C * 4), d_of(rows * C * 4), d_ob2(rows * C * 4), d_of2(rows * C * 4);
    for (const KernelVariant v : {KernelVariant::kDecode, KernelVariant::kBaseline}) {
      const std::string tag = what + " " + name(v);
      for (void* o : {d_ob.p, d_of.p, d_ob2.p, d_of2.p}) {
        ASSERT_EQ(cudaMemsetAsync(o, 0xff, rows * C * 4, raw_stream()),
                  cudaSuccess);  // NaN: every row written
      }
      // Aligned, bf16 then f32 (one launch each).
      up(wb1, wb);
      up(wf1, wf);
      ASSERT_TRUE(kernels::cuda::expert_ffn(args(d_ob.p, d_tb.p, true, 0, rows), v, stream()).ok());
      ASSERT_TRUE(
          kernels::cuda::expert_ffn(args(d_of.p, d_tf.p, false, 0, rows), v, stream()).ok());
      sync();
      // Shifted copies: f32 in launches of 3 rows, bf16 through the reversed row list in uneven
      // segments.
      ASSERT_EQ(ferry::testing::copy_to_device(wb1 + 1, wb.data(), n * 2), cudaSuccess);
      ASSERT_EQ(ferry::testing::copy_to_device(wf1 + 3, wf.data(), n * 4), cudaSuccess);
      for (std::int64_t r0 = 0; r0 < rows; r0 += 3) {
        ASSERT_TRUE(kernels::cuda::expert_ffn(
                        args(d_of2.p, d_tf2.p, false, r0, std::min(rows, r0 + 3)), v, stream())
                        .ok());
      }
      const std::int64_t cut1 = std::min<std::int64_t>(1, rows),
                         cut2 = std::min<std::int64_t>(5, rows);
      for (const auto& [r0, r1] : std::vector<std::pair<std::int64_t, std::int64_t>>{
               {0, cut1}, {cut1, cut2}, {cut2, cut2}, {cut2, rows}}) {
        auto a = args(d_ob2.p, d_tb2.p, true, r0, r1);
        a.row_list = d_order.as<std::int32_t>();
        ASSERT_TRUE(kernels::cuda::expert_ffn(a, v, stream()).ok());
      }
      sync();
      const auto gb = down<float>(d_ob.p, rows * C), gf = down<float>(d_of.p, rows * C),
                 gb2 = down<float>(d_ob2.p, rows * C), gf2 = down<float>(d_of2.p, rows * C);
      EXPECT_TRUE(same_bits(gb, gf)) << tag << ": bf16 differs from f32 on the widened weights";
      EXPECT_TRUE(same_bits(gf, gf2)) << tag << ": f32 bits depend on the address or grouping";
      EXPECT_TRUE(same_bits(gb, gb2)) << tag << ": bf16 bits depend on the address or row list";
      const double e = max_abs_diff(gb, want);
      EXPECT_LE(e, 2 * en + 1e-6) << tag;
      std::cout << "[serve_decode] expert_ffn " << tag << ": err cuda " << e << ", cpu twin " << en
                << "\n";
    }
  }
}

}  // namespace
}  // namespace ferry::serve
