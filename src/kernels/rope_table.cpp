// SPDX-License-Identifier: Apache-2.0
// Rotary frequency tables from the published rope-scaling formulas, as Hugging Face transformers'
// rope init functions compute them (default, linear, dynamic NTK, YaRN, Llama 3.1). Everything is
// computed in f64 and rounded to f32 once; transformers computes in f32, so entries can differ
// from it by an ulp or two. Property tests (rope_table_test.cpp) state each formula's derivation.
//
// Choices where the config leaves room (also in docs/kernels.md):
//   R = floor(head_dim * partial_rotary_factor) rounded down to even (Python int() truncation,
//     then even, so an odd product never yields more frequencies than dims).
//   dynamic: scales only when seq_len > max_position_embeddings (0 falls back to
//     original_max_position_embeddings); seq_len 0 means the unscaled table.
//   yarn: uses the explicit factor; original_max_position_embeddings 0 falls back to
//     max_position_embeddings. attention_factor 0 means derived (0.1 ln(factor) + 1, or the
//     mscale / mscale_all_dim ratio when both are set).
#include "kernels/rope_table.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ferry::kernels {
namespace {

// inv_freq[i] = base^(-2i/R), i < R/2, in f64.
std::vector<double> default_inv_freq(double base, int rotary_dims) {
  std::vector<double> f(static_cast<std::size_t>(rotary_dims / 2));
  for (int i = 0; i < rotary_dims / 2; ++i) {
    f[static_cast<std::size_t>(i)] =
        1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(rotary_dims));
  }
  return f;
}

// YaRN's attention scale for a context-extension ratio: 0.1 * mscale * ln(scale) + 1.
double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The (fractional) dimension whose wavelength completes num_rotations over max_pos positions:
// R * ln(max_pos / (num_rotations * 2 pi)) / (2 ln base).
double yarn_correction_dim(double num_rotations, int rotary_dims, double base, double max_pos) {
  return static_cast<double>(rotary_dims) *
         std::log(max_pos / (num_rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

Status check_common(const RopeScaling& rope, int head_dim, int* rotary_dims) {
  if (head_dim <= 0) return invalid_argument("kernels: rope table: head_dim {} <= 0", head_dim);
  if (!(rope.theta > 0.0) || rope.theta == 1.0 || !std::isfinite(rope.theta)) {
    return invalid_argument("kernels: rope table: rope_theta {} must be finite, > 0 and != 1",
                            rope.theta);
  }
  if (!(rope.partial_rotary_factor > 0.0 && rope.partial_rotary_factor <= 1.0)) {
    return invalid_argument("kernels: rope table: partial_rotary_factor {} outside (0, 1]",
                            rope.partial_rotary_factor);
  }
  int r = static_cast<int>(std::floor(static_cast<double>(head_dim) * rope.partial_rotary_factor));
  r -= r % 2;
  if (r < 2) {
    return invalid_argument(
        "kernels: rope table: head_dim {} * partial_rotary_factor {} leaves {} rotary dims, need "
        ">= 2",
        head_dim, rope.partial_rotary_factor, r);
  }
  if (rope.type != RopeType::kDefault && !(rope.factor > 0.0 && std::isfinite(rope.factor))) {
    return invalid_argument("kernels: rope table: scaling factor {} must be finite and > 0",
                            rope.factor);
  }
  *rotary_dims = r;
  return ok_status();
}

Result<std::vector<double>> dynamic_inv_freq(const RopeScaling& rope, int r,
                                             std::int64_t max_position_embeddings,
                                             std::int64_t seq_len) {
  const std::int64_t max_pos =
      max_position_embeddings > 0 ? max_position_embeddings : rope.original_max_position_embeddings;
  if (seq_len <= 0) return default_inv_freq(rope.theta, r);
  if (max_pos <= 0) {
    return invalid_argument(
        "kernels: rope table: dynamic scaling needs max_position_embeddings for seq_len {}",
        seq_len);
  }
  if (seq_len <= max_pos) return default_inv_freq(rope.theta, r);
  if (r <= 2)
    return invalid_argument("kernels: rope table: dynamic scaling needs R > 2, got {}", r);
  // NTK-aware base: base * ((factor * L / L_max) - (factor - 1)) ^ (R / (R - 2)).
  const double ratio = rope.factor * static_cast<double>(seq_len) / static_cast<double>(max_pos) -
                       (rope.factor - 1.0);
  const double base = rope.theta * std::pow(ratio, static_cast<double>(r) / (r - 2));
  return default_inv_freq(base, r);
}

Result<std::vector<double>> yarn_inv_freq(const RopeScaling& rope, int r,
                                          std::int64_t max_position_embeddings,
                                          double* attention_scaling) {
  const std::int64_t orig = rope.original_max_position_embeddings > 0
                                ? rope.original_max_position_embeddings
                                : max_position_embeddings;
  if (orig <= 0) {
    return invalid_argument(
        "kernels: rope table: yarn needs original_max_position_embeddings or "
        "max_position_embeddings");
  }
  if (!(rope.beta_fast > 0.0 && rope.beta_slow > 0.0)) {
    return invalid_argument("kernels: rope table: yarn betas ({}, {}) must be > 0", rope.beta_fast,
                            rope.beta_slow);
  }
  const double factor = rope.factor;
  if (rope.attention_factor > 0.0) {
    *attention_scaling = rope.attention_factor;
  } else if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0) {
    *attention_scaling =
        yarn_get_mscale(factor, rope.mscale) / yarn_get_mscale(factor, rope.mscale_all_dim);
  } else {
    *attention_scaling = yarn_get_mscale(factor, 1.0);
  }
  // Dimensions below `low` rotate fast enough to keep their frequency (extrapolation); above
  // `high` they are interpolated (divided by factor); a linear ramp blends the band between.
  double low = yarn_correction_dim(rope.beta_fast, r, rope.theta, static_cast<double>(orig));
  double high = yarn_correction_dim(rope.beta_slow, r, rope.theta, static_cast<double>(orig));
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(r - 1));
  if (low == high) high += 0.001;  // as upstream: avoids a zero-width ramp
  std::vector<double> f = default_inv_freq(rope.theta, r);
  for (std::size_t i = 0; i < f.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation_weight = 1.0 - ramp;
    f[i] = (f[i] / factor) * (1.0 - extrapolation_weight) + f[i] * extrapolation_weight;
  }
  return f;
}

Result<std::vector<double>> llama3_inv_freq(const RopeScaling& rope, int r) {
  const double orig = static_cast<double>(rope.original_max_position_embeddings);
  if (!(orig > 0.0)) {
    return invalid_argument("kernels: rope table: llama3 needs original_max_position_embeddings");
  }
  if (!(rope.low_freq_factor > 0.0 && rope.high_freq_factor > rope.low_freq_factor)) {
    return invalid_argument(
        "kernels: rope table: llama3 needs 0 < low_freq_factor ({}) < high_freq_factor ({})",
        rope.low_freq_factor, rope.high_freq_factor);
  }
  const double low_freq_wavelen = orig / rope.low_freq_factor;
  const double high_freq_wavelen = orig / rope.high_freq_factor;
  std::vector<double> f = default_inv_freq(rope.theta, r);
  for (double& x : f) {
    const double wavelen = 2.0 * std::numbers::pi / x;
    if (wavelen > low_freq_wavelen) {
      x /= rope.factor;  // low-frequency band: fully interpolated
    } else if (wavelen >= high_freq_wavelen) {
      // Medium band (both edges included, as upstream): blend between x / factor and x.
      const double smooth =
          (orig / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
      x = (1.0 - smooth) * x / rope.factor + smooth * x;
    }  // high-frequency band (wavelen < high_freq_wavelen): unchanged
  }
  return f;
}

}  // namespace

Result<RopeTable> make_rope_table(const RopeScaling& rope, int head_dim,
                                  std::int64_t max_position_embeddings, std::int64_t seq_len) {
  int r = 0;
  FERRY_TRY(check_common(rope, head_dim, &r));
  double attention_scaling = 1.0;
  std::vector<double> f;
  switch (rope.type) {
    case RopeType::kDefault:
      f = default_inv_freq(rope.theta, r);
      break;
    case RopeType::kLinear:
      f = default_inv_freq(rope.theta, r);
      for (double& x : f) x /= rope.factor;
      break;
    case RopeType::kDynamic: {
      FERRY_ASSIGN_OR_RETURN(f, dynamic_inv_freq(rope, r, max_position_embeddings, seq_len));
      break;
    }
    case RopeType::kYarn: {
      FERRY_ASSIGN_OR_RETURN(f,
                             yarn_inv_freq(rope, r, max_position_embeddings, &attention_scaling));
      break;
    }
    case RopeType::kLlama3: {
      FERRY_ASSIGN_OR_RETURN(f, llama3_inv_freq(rope, r));
      break;
    }
    default:
      return unimplemented("kernels: rope table: unknown rope type {}",
                           static_cast<int>(rope.type));
  }
  RopeTable table;
  table.rotary_dims = r;
  table.attention_scaling = static_cast<float>(attention_scaling);
  table.inv_freq.reserve(f.size());
  for (double x : f) table.inv_freq.push_back(static_cast<float>(x));
  return table;
}

}  // namespace ferry::kernels
