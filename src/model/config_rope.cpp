// SPDX-License-Identifier: Apache-2.0
// config.json rope section -> kernels::RopeScaling, in both spellings:
//   4.x: "rope_theta": 5e5, "rope_scaling": {"rope_type"|"type": "llama3", "factor": 8, ...}
//   5.x: "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8, ...}, or
//        nested per attention type {"full_attention": {...}, "sliding_attention": {...}}, in which
//        case the full-attention entry is the one these (full-attention-only) models use.
// Required keys follow transformers' rope validation: factor for linear/dynamic/yarn/llama3;
// low_freq_factor, high_freq_factor, original_max_position_embeddings for llama3.
#include <string>

#include "model/config.h"

namespace ferry::model {
namespace {

Result<double> number_or(const Json& obj, const char* key, double def, std::string_view what,
                         std::string_view section) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_number()) {
    return invalid_argument("model: {}: {}.{} must be a number, found {}", what, section, key,
                            it->dump());
  }
  return it->get<double>();
}

Result<double> required_number(const Json& obj, const char* key, std::string_view type,
                               std::string_view what, std::string_view section) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    return invalid_argument("model: {}: rope type {} needs {}.{}", what, type, section, key);
  }
  if (!it->is_number()) {
    return invalid_argument("model: {}: {}.{} must be a number, found {}", what, section, key,
                            it->dump());
  }
  return it->get<double>();
}

Result<kernels::RopeType> rope_type_from(std::string_view s, std::string_view what) {
  if (s == "default") return kernels::RopeType::kDefault;
  if (s == "linear") return kernels::RopeType::kLinear;
  if (s == "dynamic") return kernels::RopeType::kDynamic;
  if (s == "yarn") return kernels::RopeType::kYarn;
  if (s == "llama3") return kernels::RopeType::kLlama3;
  return invalid_argument(
      "model: {}: unknown rope type \"{}\" (supported: default, linear, dynamic, yarn, llama3)",
      what, s);
}

// Picks the parameter object out of rope_parameters (flat or nested per attention type).
Result<const Json*> flat_rope_parameters(const Json& rp, std::string_view what) {
  if (!rp.is_object()) {
    return invalid_argument("model: {}: rope_parameters must be an object", what);
  }
  if (rp.contains("rope_type") || rp.contains("rope_theta") || rp.contains("type") || rp.empty()) {
    return &rp;
  }
  if (const auto it = rp.find("full_attention"); it != rp.end() && it->is_object()) {
    return &*it;
  }
  if (rp.size() == 1 && rp.begin()->is_object()) return &*rp.begin();
  std::string keys;
  for (const auto& [k, v] : rp.items()) keys += (keys.empty() ? "" : ", ") + k;
  return invalid_argument(
      "model: {}: rope_parameters has neither rope_type nor a full_attention entry (keys: {})",
      what, keys);
}

}  // namespace

std::string_view to_string(kernels::RopeType t) {
  switch (t) {
    case kernels::RopeType::kDefault:
      return "default";
    case kernels::RopeType::kLinear:
      return "linear";
    case kernels::RopeType::kDynamic:
      return "dynamic";
    case kernels::RopeType::kYarn:
      return "yarn";
    case kernels::RopeType::kLlama3:
      return "llama3";
  }
  return "?";
}

Result<kernels::RopeScaling> parse_rope(const Json& j, double default_theta,
                                        std::string_view what) {
  kernels::RopeScaling r;
  const Json* params = nullptr;
  std::string_view section;
  FERRY_ASSIGN_OR_RETURN(r.theta, number_or(j, "rope_theta", default_theta, what, "config"));
  if (const auto rp = j.find("rope_parameters"); rp != j.end() && !rp->is_null()) {
    FERRY_ASSIGN_OR_RETURN(params, flat_rope_parameters(*rp, what));
    section = "rope_parameters";
  } else if (const auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null()) {
    if (!rs->is_object())
      return invalid_argument("model: {}: rope_scaling must be an object", what);
    params = &*rs;
    section = "rope_scaling";
  }
  FERRY_ASSIGN_OR_RETURN(r.partial_rotary_factor,
                         number_or(j, "partial_rotary_factor", 1.0, what, "config"));
  if (params == nullptr) return r;

  FERRY_ASSIGN_OR_RETURN(r.theta, number_or(*params, "rope_theta", r.theta, what, section));
  FERRY_ASSIGN_OR_RETURN(
      r.partial_rotary_factor,
      number_or(*params, "partial_rotary_factor", r.partial_rotary_factor, what, section));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (const auto it = params->find(key); it != params->end() && !it->is_null()) {
      if (!it->is_string()) {
        return invalid_argument("model: {}: {}.{} must be a string", what, section, key);
      }
      type = it->get<std::string>();
      break;
    }
  }
  FERRY_ASSIGN_OR_RETURN(r.type, rope_type_from(type, what));
  if (r.type != kernels::RopeType::kDefault) {
    FERRY_ASSIGN_OR_RETURN(r.factor, required_number(*params, "factor", type, what, section));
  }
  double ompe = 0.0;
  if (r.type == kernels::RopeType::kLlama3) {
    FERRY_ASSIGN_OR_RETURN(r.low_freq_factor,
                           required_number(*params, "low_freq_factor", type, what, section));
    FERRY_ASSIGN_OR_RETURN(r.high_freq_factor,
                           required_number(*params, "high_freq_factor", type, what, section));
    FERRY_ASSIGN_OR_RETURN(
        ompe, required_number(*params, "original_max_position_embeddings", type, what, section));
  } else {
    FERRY_ASSIGN_OR_RETURN(
        ompe, number_or(*params, "original_max_position_embeddings", 0.0, what, section));
  }
  r.original_max_position_embeddings = static_cast<std::int64_t>(ompe);
  if (r.type == kernels::RopeType::kYarn) {
    FERRY_ASSIGN_OR_RETURN(r.beta_fast, number_or(*params, "beta_fast", 32.0, what, section));
    FERRY_ASSIGN_OR_RETURN(r.beta_slow, number_or(*params, "beta_slow", 1.0, what, section));
    FERRY_ASSIGN_OR_RETURN(r.attention_factor,
                           number_or(*params, "attention_factor", 0.0, what, section));
    FERRY_ASSIGN_OR_RETURN(r.mscale, number_or(*params, "mscale", 0.0, what, section));
    FERRY_ASSIGN_OR_RETURN(r.mscale_all_dim,
                           number_or(*params, "mscale_all_dim", 0.0, what, section));
    if (const auto it = params->find("truncate"); it != params->end() && it->is_boolean()) {
      r.truncate = it->get<bool>();
    }
  }
  if (!(r.theta > 0.0)) {
    return invalid_argument("model: {}: rope_theta must be positive, found {}", what, r.theta);
  }
  if (!(r.factor > 0.0)) {
    return invalid_argument("model: {}: {}.factor must be positive, found {}", what, section,
                            r.factor);
  }
  if (!(r.partial_rotary_factor > 0.0 && r.partial_rotary_factor <= 1.0)) {
    return invalid_argument("model: {}: partial_rotary_factor must be in (0, 1], found {}", what,
                            r.partial_rotary_factor);
  }
  return r;
}

}  // namespace ferry::model
