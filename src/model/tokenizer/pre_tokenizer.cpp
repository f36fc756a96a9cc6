// SPDX-License-Identifier: Apache-2.0
// Pre-tokenizer steps (see pre_tokenizer.h). Each step maps every current piece to zero or more
// pieces, in order, like HF's PreTokenizedString::split.
#include "model/tokenizer/pre_tokenizer.h"

#include "model/tokenizer/byte_level.h"

namespace ferry::model::tok {
namespace {

Result<bool> optional_bool(const Json& j, const char* key, bool fallback, std::string_view what) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) return corrupt("tokenizer: {}.{} must be a boolean", what, key);
  return j[key].get<bool>();
}

Result<SplitBehavior> parse_behavior(const Json& j) {
  if (!j.contains("behavior") || !j["behavior"].is_string()) {
    return corrupt("tokenizer: pre_tokenizer Split needs a string \"behavior\"");
  }
  const std::string b = j["behavior"].get<std::string>();
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return corrupt("tokenizer: pre_tokenizer Split has unknown behavior \"{}\"", b);
}

Status add_steps(const Json& j, std::vector<PreTokenizerStep>& steps, int depth) {
  if (depth > 8) return corrupt("tokenizer: pre_tokenizer Sequence nested too deeply");
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return corrupt("tokenizer: pre_tokenizer must be an object with a string \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return corrupt("tokenizer: pre_tokenizer Sequence needs a \"pretokenizers\" array");
    }
    for (const Json& p : j["pretokenizers"]) FERRY_TRY(add_steps(p, steps, depth + 1));
    return ok_status();
  }
  PreTokenizerStep step;
  if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    if (!j.contains("pattern") || !j["pattern"].is_object()) {
      return corrupt("tokenizer: pre_tokenizer Split needs a \"pattern\" object");
    }
    const Json& p = j["pattern"];
    if (p.contains("Regex") && p["Regex"].is_string()) {
      FERRY_ASSIGN_OR_RETURN(step.regex, Regex::compile(p["Regex"].get<std::string>()));
    } else if (p.contains("String") && p["String"].is_string()) {
      FERRY_ASSIGN_OR_RETURN(step.regex, Regex::compile(p["String"].get<std::string>(), true));
    } else {
      return corrupt(
          "tokenizer: pre_tokenizer Split pattern needs a string \"Regex\" or \"String\"");
    }
    step.has_regex = true;
    FERRY_ASSIGN_OR_RETURN(step.behavior, parse_behavior(j));
    FERRY_ASSIGN_OR_RETURN(step.invert, optional_bool(j, "invert", false, "Split"));
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    FERRY_ASSIGN_OR_RETURN(step.add_prefix_space,
                           optional_bool(j, "add_prefix_space", true, "ByteLevel"));
    FERRY_ASSIGN_OR_RETURN(step.has_regex, optional_bool(j, "use_regex", true, "ByteLevel"));
    if (step.has_regex) {
      FERRY_ASSIGN_OR_RETURN(step.regex, Regex::compile(kGpt2Pattern));
    }
  } else {
    return unimplemented(
        "tokenizer: pre_tokenizer type \"{}\" is not supported (Split, ByteLevel, Sequence)", type);
  }
  steps.push_back(std::move(step));
  return ok_status();
}

}  // namespace

Status split_by_regex(const Regex& regex, SplitBehavior behavior, bool invert, std::string_view s,
                      std::vector<std::string>& out) {
  std::vector<Span> matches;
  FERRY_TRY(regex.find_all(s, matches));
  // Pieces alternate between gaps and matches; `is_match` says which after inversion.
  struct Piece {
    Span span;
    bool delim;
  };
  std::vector<Piece> pieces;
  pieces.reserve(matches.size() * 2 + 1);
  std::size_t pos = 0;
  for (const Span& m : matches) {
    if (m.begin > pos) pieces.push_back({{pos, m.begin}, invert});
    pieces.push_back({m, !invert});
    pos = m.end;
  }
  if (pos < s.size()) pieces.push_back({{pos, s.size()}, invert});

  const auto text = [&](const Span& sp) {
    return std::string(s.substr(sp.begin, sp.end - sp.begin));
  };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Piece& p : pieces) out.push_back(text(p.span));
      break;
    case SplitBehavior::kRemoved:
      for (const Piece& p : pieces) {
        if (!p.delim) out.push_back(text(p.span));
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      // A delimiter joins the piece before it.
      bool open = false;
      for (const Piece& p : pieces) {
        if (p.delim && open) {
          out.back() += text(p.span);
        } else {
          out.push_back(text(p.span));
        }
        open = !p.delim;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // A delimiter starts a piece that takes whatever follows it (HF merges any piece that
      // follows a delimiter, delimiter or not).
      bool open = false;
      for (const Piece& p : pieces) {
        if (open) {
          out.back() += text(p.span);
        } else {
          out.push_back(text(p.span));
        }
        open = p.delim;
      }
      break;
    }
    case SplitBehavior::kContiguous: {
      // Consecutive delimiters become one piece.
      bool prev_delim = false;
      for (const Piece& p : pieces) {
        if (p.delim && prev_delim) {
          out.back() += text(p.span);
        } else {
          out.push_back(text(p.span));
        }
        prev_delim = p.delim;
      }
      break;
    }
  }
  return ok_status();
}

Result<PreTokenizer> PreTokenizer::from_json(const Json& j) {
  PreTokenizer p;
  if (j.is_null()) return p;
  FERRY_TRY(add_steps(j, p.steps_, 0));
  for (const auto& s : p.steps_) {
    if (s.kind == PreTokenizerStep::Kind::kByteLevel) p.byte_level_ = true;
  }
  return p;
}

Status PreTokenizer::split(std::string_view segment, std::vector<std::string>& out) const {
  std::vector<std::string> cur{std::string(segment)};
  std::vector<std::string> next;
  for (const PreTokenizerStep& step : steps_) {
    next.clear();
    for (std::string& piece : cur) {
      if (step.kind == PreTokenizerStep::Kind::kSplit) {
        FERRY_TRY(split_by_regex(step.regex, step.behavior, step.invert, piece, next));
        continue;
      }
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, " ");
      const std::size_t first = next.size();
      if (step.has_regex) {
        FERRY_TRY(split_by_regex(step.regex, SplitBehavior::kIsolated, false, piece, next));
      } else {
        next.push_back(std::move(piece));
      }
      for (std::size_t i = first; i < next.size(); ++i) next[i] = byte_level_encode(next[i]);
    }
    cur.swap(next);
  }
  for (std::string& w : cur) {
    if (!w.empty()) out.push_back(std::move(w));
  }
  return ok_status();
}

}  // namespace ferry::model::tok
