// SPDX-License-Identifier: Apache-2.0
#include "train/builtin_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "core/check.h"
#include "core/file_util.h"
#include "core/irwin_hall.h"
#include "core/json.h"
#include "core/thread_pool.h"
#include "model/config.h"
#include "model/param_spec.h"
#include "model/safetensors_writer.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/chat_template.h"
#include "train/rng.h"

namespace ferry::train {

namespace {

// Qwen2's pre-split pattern (tokenizer.json of Qwen2/2.5/3).
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Json added_token(int id, const char* content) {
  return Json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
              {"rstrip", false}, {"normalized", false}, {"special", true}};
}

}  // namespace

std::string builtin_tokenizer_json() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[model::tok::byte_to_unicode_utf8(static_cast<unsigned char>(b))] = b;
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  Json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", Json::array({added_token(kBuiltinEndOfText, "<|endoftext|>"),
                                          added_token(kBuiltinImStart, "<|im_start|>"),
                                          added_token(kBuiltinImEnd, "<|im_end|>")})},
            {"normalizer", nullptr},
            {"pre_tokenizer",
             {{"type", "Sequence"},
              {"pretokenizers", Json::array({Json{{"type", "Split"},
                                                  {"pattern", {{"Regex", kQwen2Pattern}}},
                                                  {"behavior", "Isolated"},
                                                  {"invert", false}},
                                             byte_level})}}},
            {"post_processor", byte_level},
            {"decoder", byte_level},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", false},
              {"vocab", vocab},
              {"merges", Json::array()}}}};
  return j.dump(1);
}

std::string builtin_tokenizer_config_json() {
  const Json j = {{"chat_template", std::string(model::kChatMlJinja)},
                  {"eos_token", "<|im_end|>"},
                  {"pad_token", "<|endoftext|>"},
                  {"bos_token", nullptr},
                  {"model_max_length", 512},
                  {"tokenizer_class", "Qwen2Tokenizer"}};
  return j.dump(1);
}

bool known_builtin_model_type(const std::string& model_type) {
  return model_type == "qwen3" || model_type == "qwen2";
}

std::string builtin_config_json(const BuiltinModelSpec& s) {
  FERRY_CHECK(known_builtin_model_type(s.model_type), "train: built-in model type '{}'",
              s.model_type);
  const bool qwen2 = s.model_type == "qwen2";
  Json j = {{"architectures", Json::array({qwen2 ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM"})},
            {"model_type", s.model_type},
            {"vocab_size", s.vocab},
            {"hidden_size", s.hidden},
            {"intermediate_size", s.intermediate},
            {"num_hidden_layers", s.layers},
            {"num_attention_heads", s.heads},
            {"num_key_value_heads", s.kv_heads},
            {"head_dim", s.head_dim},
            {"max_position_embeddings", s.max_positions},
            {"rms_norm_eps", 1e-6},
            {"rope_parameters", {{"rope_theta", 10000.0}, {"rope_type", "default"}}},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"tie_word_embeddings", s.tie_embeddings},
            {"use_sliding_window", false},
            {"sliding_window", nullptr},
            {"bos_token_id", nullptr},
            {"eos_token_id", kBuiltinImEnd},
            {"pad_token_id", nullptr},
            {"initializer_range", s.init_std},
            {"dtype", "float32"}};
  // HF's Qwen2 has q/k/v biases always and no attention_bias key.
  if (qwen2) j.erase("attention_bias");
  return j.dump(1);
}

void fill_normal_chunked(float* out, std::int64_t n, double std, std::uint64_t stream_seed) {
  const std::int64_t chunks = (n + kInitChunk - 1) / kInitChunk;
  const float scale = static_cast<float>(std / std::sqrt(kIrwinHall4Variance));
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(chunks), [&](std::size_t c0, std::size_t c1) {
        for (std::size_t c = c0; c < c1; ++c) {
          Rng rng(mix_seed(stream_seed, c));
          const std::int64_t begin = static_cast<std::int64_t>(c) * kInitChunk;
          const std::int64_t end = std::min(n, begin + kInitChunk);
          for (std::int64_t k = begin; k < end; ++k)
            out[k] = static_cast<float>(irwin_hall4_centred(rng.next_u64())) * scale;
        }
      });
}

BuiltinInit::BuiltinInit(const BuiltinModelSpec& spec, std::uint64_t seed,
                         const std::vector<model::ParamSpec>& specs)
    : std_(spec.init_std), seed_(seed), specs_(specs), rng_(mix_seed(seed, 0x1417)) {
  std::int64_t total = 0;
  for (const model::ParamSpec& p : specs) total += p.numel();
  chunked_ = total > kSequentialInitParams;
}

void BuiltinInit::fill(std::size_t i, float* out) {
  FERRY_CHECK(i == next_, "train: built-in init of parameter {} before {}", i, next_);
  ++next_;
  const model::ParamSpec& p = specs_[i];
  const std::int64_t n = p.numel();
  if (model::is_norm_role(p.role)) {
    std::fill(out, out + n, 1.0f);
  } else if (chunked_) {
    fill_normal_chunked(out, n, std_, mix_seed(mix_seed(seed_, 0x1418), i));
  } else {
    for (std::int64_t k = 0; k < n; ++k) out[k] = static_cast<float>(rng_.normal() * std_);
  }
}

Status write_builtin_model(const std::string& dir, const BuiltinModelSpec& spec,
                           std::uint64_t seed) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error("train: cannot create {}: {}", dir, ec.message());
  const std::string config_text = builtin_config_json(spec);
  FERRY_ASSIGN_OR_RETURN(const model::ModelConfig config,
                         model::parse_model_config_text(config_text, "built-in config"));
  const std::vector<model::ParamSpec> specs = model::param_specs(config);
  std::vector<std::vector<float>> data(specs.size());
  std::vector<model::NamedTensor> named;
  named.reserve(specs.size());
  BuiltinInit init(spec, seed, specs);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const model::ParamSpec& p = specs[i];
    data[i].resize(static_cast<std::size_t>(p.numel()));
    init.fill(i, data[i].data());
    ConstTensorView v = ConstTensorView::contiguous(data[i].data(), DType::kF32, Device::kCpu, {1});
    v.ndim = static_cast<int>(p.shape.size());
    std::int64_t stride = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.shape[d] = p.shape[d];
      v.stride[d] = stride;
      stride *= p.shape[d];
    }
    named.push_back({p.hf_name, v});
  }
  FERRY_TRY(model::write_safetensors(dir + "/model.safetensors", named, {{"format", "pt"}}));
  FERRY_TRY(write_file_atomic(dir + "/config.json", config_text));
  FERRY_TRY(write_file_atomic(dir + "/tokenizer.json", builtin_tokenizer_json()));
  FERRY_TRY(write_file_atomic(dir + "/tokenizer_config.json", builtin_tokenizer_config_json()));
  return {};
}

}  // namespace ferry::train
