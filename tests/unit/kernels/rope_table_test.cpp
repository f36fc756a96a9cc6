// SPDX-License-Identifier: Apache-2.0
// make_rope_table against properties derived from the published formulas (each test states its
// derivation): default inv_freq[i] = theta^(-2i/R); linear divides by factor; dynamic NTK
// rescales the base only past max_position_embeddings; llama3 divides the low-frequency band by
// factor, keeps the high-frequency band and blends in between; yarn keeps dims below the
// correction range, interpolates those above, and scales attention by 0.1 ln(factor) + 1.
#include <cmath>
#include <numbers>

#include "kernels/rope_table.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::kernels {
namespace {

RopeTable make_ok(const RopeScaling& r, int head_dim, std::int64_t max_pos = 0,
                  std::int64_t seq_len = 0) {
  auto t = make_rope_table(r, head_dim, max_pos, seq_len);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : RopeTable{};
}

TEST(RopeTable, DefaultHandComputed) {
  // theta = 10000, D = R = 4: inv_freq = [10000^0, 10000^(-2/4)] = [1, 0.01].
  const RopeTable t = make_ok({}, 4);
  ASSERT_EQ(t.inv_freq.size(), 2u);
  EXPECT_EQ(t.rotary_dims, 4);
  EXPECT_EQ(t.inv_freq[0], 1.0f);
  EXPECT_EQ(t.inv_freq[1], 0.01f);
  EXPECT_EQ(t.attention_scaling, 1.0f);
}

TEST(RopeTable, DefaultMatchesFormulaAndPartialRotary) {
  // inv_freq[i] = theta^(-2i/R), evaluated independently here as exp(-(2i/R) ln theta) in f64;
  // the two f64 evaluations differ by ~1e-15 relative, so after rounding to f32 they agree to
  // one f32 ulp (2^-23 relative).
  RopeScaling r;
  r.theta = 1e6;
  r.partial_rotary_factor = 0.5;
  const RopeTable t = make_ok(r, 80);  // R = 40
  ASSERT_EQ(t.rotary_dims, 40);
  ASSERT_EQ(t.inv_freq.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    const double want = std::exp(-(2.0 * i / 40.0) * std::log(1e6));
    EXPECT_NEAR(t.inv_freq[i], want, want * 0x1p-23) << "i=" << i;
  }
  // head_dim 10 * 0.5 = 5 rotary dims, rounded down to even: R = 4, so inv_freq = [1, 1e6^-0.5].
  const RopeTable odd = make_ok(r, 10);
  EXPECT_EQ(odd.rotary_dims, 4);
  ASSERT_EQ(odd.inv_freq.size(), 2u);
  EXPECT_EQ(odd.inv_freq[1], 0.001f);
}

TEST(RopeTable, LinearIsDefaultOverFactor) {
  // factor 4 is a power of two, so dividing the f32 default entry by it is exact and must equal
  // the f32 rounding of (f64 default / 4).
  RopeScaling lin;
  lin.type = RopeType::kLinear;
  lin.factor = 4.0;
  const RopeTable d = make_ok({}, 64), l = make_ok(lin, 64);
  ASSERT_EQ(l.inv_freq.size(), d.inv_freq.size());
  for (std::size_t i = 0; i < d.inv_freq.size(); ++i) EXPECT_EQ(l.inv_freq[i], d.inv_freq[i] / 4);
  EXPECT_EQ(l.attention_scaling, 1.0f);
}

TEST(RopeTable, DynamicNtkRescalesBaseOnlyPastMaxPositions) {
  RopeScaling dyn;
  dyn.type = RopeType::kDynamic;
  dyn.factor = 2.0;
  const RopeTable d = make_ok({}, 4);
  // seq_len <= max_position_embeddings (and seq_len 0): the unscaled table.
  EXPECT_EQ(make_ok(dyn, 4, 100, 100).inv_freq, d.inv_freq);
  EXPECT_EQ(make_ok(dyn, 4, 100, 0).inv_freq, d.inv_freq);
  // seq_len 200 > 100: base = 10000 * (2 * 200/100 - (2 - 1))^(R/(R-2)) = 10000 * 3^2 = 90000,
  // so inv_freq = [1, 90000^(-1/2)] = [1, 1/300].
  const RopeTable s = make_ok(dyn, 4, 100, 200);
  ASSERT_EQ(s.inv_freq.size(), 2u);
  EXPECT_EQ(s.inv_freq[0], 1.0f);
  EXPECT_EQ(s.inv_freq[1], static_cast<float>(1.0 / 300.0));
}

TEST(RopeTable, Llama3BandsFollowWavelength) {
  // Llama 3.1 8B: theta 500000, D 128, factor 8, low 1, high 4, original 8192.
  // wavelen_i = 2 pi / inv_freq_i. Low-frequency band (wavelen > 8192 / 1): divided by 8.
  // High-frequency band (wavelen < 8192 / 4 = 2048): unchanged. Between: with
  // s = (8192 / wavelen - 1) / (4 - 1), value = (1 - s) f / 8 + s f, which lies in [f/8, f].
  // For this config the bands hold 29, 29 and 6 entries (counted with the same rule in f64).
  RopeScaling def;
  def.theta = 500000.0;
  RopeScaling l3 = def;
  l3.type = RopeType::kLlama3;
  l3.factor = 8.0;
  l3.low_freq_factor = 1.0;
  l3.high_freq_factor = 4.0;
  l3.original_max_position_embeddings = 8192;
  const RopeTable d = make_ok(def, 128), t = make_ok(l3, 128);
  ASSERT_EQ(t.inv_freq.size(), 64u);
  int low = 0, high = 0, mid = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * i / 128.0);
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > 8192.0) {
      ++low;
      EXPECT_EQ(t.inv_freq[i], d.inv_freq[i] / 8) << "i=" << i;  // /8 is exact in f32
    } else if (wavelen < 2048.0) {
      ++high;
      EXPECT_EQ(t.inv_freq[i], d.inv_freq[i]) << "i=" << i;
    } else {
      ++mid;
      const double s = (8192.0 / wavelen - 1.0) / 3.0;
      const double want = (1.0 - s) * f / 8.0 + s * f;
      EXPECT_NEAR(t.inv_freq[i], want, want * 0x1p-23) << "i=" << i;
      EXPECT_GE(t.inv_freq[i], d.inv_freq[i] / 8);
      EXPECT_LE(t.inv_freq[i], d.inv_freq[i]);
    }
  }
  EXPECT_EQ(low, 29);
  EXPECT_EQ(high, 29);
  EXPECT_EQ(mid, 6);
  EXPECT_EQ(t.attention_scaling, 1.0f);
}

TEST(RopeTable, YarnRampAndAttentionScaling) {
  // theta 10000, R 128, original 4096, beta_fast 32, beta_slow 1, factor 4.
  // Correction dims: R ln(4096 / (b 2 pi)) / (2 ln 10000) = 20.944 (b = 32) and 45.027 (b = 1);
  // truncated to low = 20, high = 46. ramp_i = clamp((i - 20) / 26, 0, 1);
  // inv_freq_i = f_i / 4 * ramp_i + f_i * (1 - ramp_i): i <= 20 unchanged, i >= 46 divided by 4.
  // attention_scaling unset: 0.1 ln 4 + 1 = 1.1386294361.
  RopeScaling y;
  y.type = RopeType::kYarn;
  y.factor = 4.0;
  y.original_max_position_embeddings = 4096;
  const RopeTable d = make_ok({}, 128), t = make_ok(y, 128, 16384);
  ASSERT_EQ(t.inv_freq.size(), 64u);
  for (int i = 0; i < 64; ++i) {
    if (i <= 20) {
      EXPECT_EQ(t.inv_freq[i], d.inv_freq[i]) << "i=" << i;
    } else if (i >= 46) {
      EXPECT_EQ(t.inv_freq[i], d.inv_freq[i] / 4) << "i=" << i;
    } else {
      const double ramp = (i - 20) / 26.0;
      const double f = 1.0 / std::pow(10000.0, 2.0 * i / 128.0);
      const double want = f / 4.0 * ramp + f * (1.0 - ramp);
      EXPECT_NEAR(t.inv_freq[i], want, want * 0x1p-23) << "i=" << i;
    }
  }
  EXPECT_FLOAT_EQ(t.attention_scaling, 1.1386294361f);

  RopeScaling explicit_af = y;
  explicit_af.attention_factor = 0.75;
  EXPECT_EQ(make_ok(explicit_af, 128).attention_scaling, 0.75f);
  // DeepSeek style: mscale = mscale_all_dim gives a ratio of two equal terms = 1.
  RopeScaling ds = y;
  ds.mscale = 0.707;
  ds.mscale_all_dim = 0.707;
  EXPECT_EQ(make_ok(ds, 128).attention_scaling, 1.0f);
  // mscale 1, mscale_all_dim 0.5: (0.1 ln 4 + 1) / (0.05 ln 4 + 1) = 1.13863 / 1.06931 = 1.06482.
  ds.mscale = 1.0;
  ds.mscale_all_dim = 0.5;
  EXPECT_NEAR(make_ok(ds, 128).attention_scaling,
              (0.1 * std::log(4.0) + 1.0) / (0.05 * std::log(4.0) + 1.0), 1e-6);
}

TEST(RopeTable, BadConfigsAreInvalidArgument) {
  auto code = [](const RopeScaling& r, int head_dim, std::int64_t max_pos = 0,
                 std::int64_t seq_len = 0) {
    return make_rope_table(r, head_dim, max_pos, seq_len).status().code();
  };
  RopeScaling r;
  EXPECT_EQ(code(r, 0), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(r, 1), StatusCode::kInvalidArgument);  // R = 0 rotary dims
  r.theta = -1.0;
  EXPECT_EQ(code(r, 64), StatusCode::kInvalidArgument);
  r = {};
  r.partial_rotary_factor = 1.5;
  EXPECT_EQ(code(r, 64), StatusCode::kInvalidArgument);
  r = {};
  r.type = RopeType::kLinear;
  r.factor = 0.0;
  EXPECT_EQ(code(r, 64), StatusCode::kInvalidArgument);
  r = {};
  r.type = RopeType::kLlama3;
  r.factor = 8.0;  // original_max_position_embeddings missing
  EXPECT_EQ(code(r, 64), StatusCode::kInvalidArgument);
  r.original_max_position_embeddings = 8192;
  r.low_freq_factor = 4.0;  // not below high_freq_factor
  EXPECT_EQ(code(r, 64), StatusCode::kInvalidArgument);
  r = {};
  r.type = RopeType::kYarn;
  r.factor = 4.0;  // neither original nor max_position_embeddings
  EXPECT_EQ(code(r, 64), StatusCode::kInvalidArgument);
  r = {};
  r.type = RopeType::kDynamic;
  r.factor = 2.0;  // seq_len given without max_position_embeddings
  EXPECT_EQ(code(r, 64, 0, 500), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(r, 64, 0, 0), StatusCode::kOk);
}

}  // namespace
}  // namespace ferry::kernels
