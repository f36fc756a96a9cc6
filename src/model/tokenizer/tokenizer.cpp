// SPDX-License-Identifier: Apache-2.0
// Tokenizer: loads tokenizer.json into its components and runs the encode/decode pipelines (see
// tokenizer.h for the data flow).
#include "model/tokenizer/tokenizer.h"

#include "core/file_util.h"
#include "core/json.h"
#include "model/tokenizer/added_vocabulary.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/normalizer.h"
#include "model/tokenizer/post_processor.h"
#include "model/tokenizer/pre_tokenizer.h"
#include "model/tokenizer/utf8.h"

namespace ferry::model {

using tok::AddedVocabulary;
using tok::BpeModel;
using tok::Normalizer;
using tok::PostProcessor;
using tok::PreTokenizer;
using tok::Segment;

namespace {

// Ids beyond this are refused: id -> token is a dense table.
constexpr TokenId kMaxTokenId = 1 << 24;

const Json& field(const Json& doc, const char* key) {
  static const Json kNull;
  return doc.contains(key) ? doc[key] : kNull;
}

}  // namespace

struct Tokenizer::Impl {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  BpeModel model;
  AddedVocabulary added;
  PostProcessor post_processor;
  bool byte_level_decoder = false;
  std::vector<std::string> id_to_token;  // [vocab_size]; "" for holes
  std::vector<unsigned char> kind;       // [vocab_size]; 0 hole, 1 model, 2 added, 3 added special
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::from_file(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return from_json_text(text, path);
}

Result<Tokenizer> Tokenizer::from_json_text(std::string_view json_text, std::string_view what) {
  auto parsed = parse_json(json_text, what);
  if (!parsed.ok()) {
    return Status(parsed.status().code(), fmt::format("tokenizer: {}", parsed.status().message()));
  }
  const Json doc = std::move(parsed).value();
  // "tokenizer: <file>: <component message>".
  const auto ctx = [&](const Status& s) {
    std::string_view msg = s.message();
    if (msg.starts_with("tokenizer: ")) msg.remove_prefix(11);
    return Status(s.code(), fmt::format("tokenizer: {}: {}", what, msg));
  };
  if (!doc.is_object()) return corrupt("tokenizer: {}: top level must be a JSON object", what);
  if (!doc.contains("model")) return corrupt("tokenizer: {}: no \"model\" section", what);

  auto impl = std::make_unique<Impl>();
  auto normalizer = Normalizer::from_json(field(doc, "normalizer"));
  if (!normalizer.ok()) return ctx(normalizer.status());
  impl->normalizer = std::move(normalizer).value();
  auto pre = PreTokenizer::from_json(field(doc, "pre_tokenizer"));
  if (!pre.ok()) return ctx(pre.status());
  impl->pre_tokenizer = std::move(pre).value();
  auto model = BpeModel::from_json(doc["model"]);
  if (!model.ok()) return ctx(model.status());
  impl->model = std::move(model).value();
  auto added = AddedVocabulary::from_json(field(doc, "added_tokens"), impl->normalizer);
  if (!added.ok()) return ctx(added.status());
  impl->added = std::move(added).value();
  auto post = PostProcessor::from_json(field(doc, "post_processor"));
  if (!post.ok()) return ctx(post.status());
  impl->post_processor = std::move(post).value();

  const Json& decoder = field(doc, "decoder");
  if (!decoder.is_null()) {
    if (!decoder.is_object() || !decoder.contains("type") || !decoder["type"].is_string()) {
      return corrupt("tokenizer: {}: decoder must be an object with a string \"type\"", what);
    }
    const std::string type = decoder["type"].get<std::string>();
    if (type != "ByteLevel") {
      return unimplemented("tokenizer: {}: decoder type \"{}\" is not supported (ByteLevel)", what,
                           type);
    }
    impl->byte_level_decoder = true;
  }

  // Dense id -> token table over model vocab and added tokens.
  TokenId max_id = -1;
  for (const auto& [token, id] : impl->model.vocab()) max_id = std::max(max_id, id);
  for (const auto& a : impl->added.tokens()) max_id = std::max(max_id, a.id);
  if (max_id >= kMaxTokenId) {
    return corrupt("tokenizer: {}: token id {} is above the supported maximum {}", what, max_id,
                   kMaxTokenId - 1);
  }
  impl->id_to_token.resize(static_cast<std::size_t>(max_id + 1));
  impl->kind.assign(static_cast<std::size_t>(max_id + 1), 0);
  for (const auto& [token, id] : impl->model.vocab()) {
    if (impl->kind[id] != 0) {
      return corrupt("tokenizer: {}: model.vocab gives id {} to both \"{}\" and \"{}\"", what, id,
                     impl->id_to_token[id], token);
    }
    impl->id_to_token[id] = token;
    impl->kind[id] = 1;
  }
  for (const auto& a : impl->added.tokens()) {
    impl->id_to_token[a.id] = a.content;
    impl->kind[a.id] = a.special ? 3 : 2;
  }
  return Tokenizer(std::move(impl));
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text,
                                               const EncodeOptions& opts) const {
  if (const std::size_t bad = tok::utf8_first_invalid(text); bad != std::string_view::npos) {
    return invalid_argument("tokenizer: input is not valid UTF-8 (byte {} of {})", bad,
                            text.size());
  }
  const Impl& t = *impl_;
  std::vector<Segment> raw, segments;
  t.added.split(text, /*normalized=*/false, raw);
  for (Segment& s : raw) {
    if (s.id >= 0 || t.normalizer.empty()) {
      if (s.id >= 0) {
        segments.push_back(std::move(s));
      } else {
        t.added.split(s.text, /*normalized=*/true, segments);
      }
      continue;
    }
    FERRY_ASSIGN_OR_RETURN(std::string normalized, t.normalizer.apply(s.text));
    t.added.split(normalized, /*normalized=*/true, segments);
  }

  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<std::string> words;
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    words.clear();
    FERRY_TRY(t.pre_tokenizer.split(s.text, words));
    for (const std::string& w : words) t.model.encode_word(w, ids);
  }
  if (opts.add_special_tokens) return t.post_processor.apply(ids);
  return ids;
}

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids,
                                      const DecodeOptions& opts) const {
  const Impl& t = *impl_;
  std::string bytes;
  bool first = true;
  for (const TokenId id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= t.kind.size() || t.kind[id] == 0) {
      return out_of_range("tokenizer: cannot decode id {}: not in the vocabulary (size {})", id,
                          t.kind.size());
    }
    const unsigned char kind = t.kind[id];
    if (kind == 3 && opts.skip_special_tokens) continue;
    const std::string& token = t.id_to_token[id];
    if (!t.byte_level_decoder) {
      // No decoder: HF joins the tokens with spaces.
      if (!first) bytes.push_back(' ');
      bytes += token;
    } else if (kind == 1) {
      tok::byte_level_decode_append(token, bytes);
    } else {
      bytes += token;
    }
    first = false;
  }
  return tok::utf8_repair(bytes);
}

Result<std::string> Tokenizer::token_bytes(TokenId id) const {
  const Impl& t = *impl_;
  if (id < 0 || static_cast<std::size_t>(id) >= t.kind.size() || t.kind[id] == 0) {
    return out_of_range("tokenizer: no token {} in the vocabulary (size {})", id, t.kind.size());
  }
  const std::string& token = t.id_to_token[id];
  if (!t.byte_level_decoder || t.kind[id] != 1) return token;
  std::string bytes;
  tok::byte_level_decode_append(token, bytes);
  return bytes;
}

Result<std::string> Tokenizer::normalize(std::string_view text) const {
  if (const std::size_t bad = tok::utf8_first_invalid(text); bad != std::string_view::npos) {
    return invalid_argument("tokenizer: input is not valid UTF-8 (byte {} of {})", bad,
                            text.size());
  }
  if (impl_->normalizer.empty()) return std::string(text);
  // Like encode(): raw-matched added tokens are cut out before normalizing, so a combining mark
  // after "<|im_start|>" does not compose with its '>'.
  std::vector<Segment> raw;
  impl_->added.split(text, /*normalized=*/false, raw);
  std::string out;
  for (const Segment& s : raw) {
    if (s.id >= 0) {
      out += s.text;
      continue;
    }
    FERRY_ASSIGN_OR_RETURN(std::string n, impl_->normalizer.apply(s.text));
    out += n;
  }
  return out;
}

std::string_view Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->id_to_token.size()) return {};
  return impl_->id_to_token[id];
}

TokenId Tokenizer::token_to_id(std::string_view token) const {
  if (const auto* a = impl_->added.find_content(token)) return a->id;
  return impl_->model.token_to_id(token);
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->kind.size() && impl_->kind[id] == 3;
}

std::size_t Tokenizer::vocab_size() const { return impl_->id_to_token.size(); }

}  // namespace ferry::model
