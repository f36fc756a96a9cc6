// SPDX-License-Identifier: Apache-2.0
// `ferry tokenize`: encodes text with a Hugging Face tokenizer.json and prints the ids and the
// decode back (or, with --json, {"ids": [...], "tokens": [...], "decoded": "..."}).
// --chat renders the input through the chat template first: the input is either a JSON array of
// {"role", "content"} messages or plain text taken as one user message; a generation prompt is
// appended. The template comes from tokenizer_config.json beside the tokenizer when it has one
// (only ChatML is implemented; others are refused), else ChatML.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/ferry/commands.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "model/tokenizer/chat_renderer.h"
#include "model/tokenizer/tokenizer.h"

namespace ferry::app {
namespace {

struct TokenizeConfig {
  std::string tokenizer_path;  // tokenizer.json or the folder holding it
  std::string text;
  std::string text_file;
  bool json = false;
  bool add_special_tokens = false;
  bool skip_special_tokens = false;
  bool chat = false;
};

Result<std::vector<model::ChatMessage>> parse_messages(const std::string& input) {
  const Json j = Json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return std::vector<model::ChatMessage>{{"user", input}};
  std::vector<model::ChatMessage> messages;
  for (const Json& m : j) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return invalid_argument(
          "tokenize: --chat messages must be {{\"role\": str, \"content\": str}}");
    }
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return messages;
}

Result<std::string> render_chat_input(const std::string& tokenizer_json, const std::string& input) {
  FERRY_ASSIGN_OR_RETURN(auto messages, parse_messages(input));
  const std::string config =
      (std::filesystem::path(tokenizer_json).parent_path() / "tokenizer_config.json").string();
  // The folder's template (ChatML natively, any other through the Jinja subset); ChatML when
  // the folder has none, as before.
  std::error_code ec;
  if (std::filesystem::exists(config, ec)) {
    auto renderer = model::ChatRenderer::from_tokenizer_config(config);
    if (renderer.ok()) return renderer->render(messages, /*add_generation_prompt=*/true);
    if (renderer.status().code() != StatusCode::kNotFound) return renderer.status();
    log::get("tokenizer")->warn("no chat_template in {}; using ChatML", config);
  } else {
    log::get("tokenizer")->warn("no tokenizer_config.json beside {}; using ChatML", tokenizer_json);
  }
  return model::render_chatml(messages, /*add_generation_prompt=*/true);
}

Status run_tokenize(const TokenizeConfig& cfg) {
  std::string path = cfg.tokenizer_path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) path += "/tokenizer.json";
  FERRY_ASSIGN_OR_RETURN(model::Tokenizer tok, model::Tokenizer::from_file(path));
  std::string text = cfg.text;
  if (!cfg.text_file.empty()) {
    FERRY_ASSIGN_OR_RETURN(text, read_file(cfg.text_file));
  }
  if (cfg.chat) {
    FERRY_ASSIGN_OR_RETURN(text, render_chat_input(path, text));
  }

  FERRY_ASSIGN_OR_RETURN(auto ids,
                         tok.encode(text, {.add_special_tokens = cfg.add_special_tokens}));
  FERRY_ASSIGN_OR_RETURN(std::string decoded,
                         tok.decode(ids, {.skip_special_tokens = cfg.skip_special_tokens}));
  if (cfg.json) {
    Json out = Json::object();
    out["ids"] = ids;
    Json tokens = Json::array();
    for (const auto id : ids) tokens.push_back(std::string(tok.id_to_token(id)));
    out["tokens"] = std::move(tokens);
    out["decoded"] = decoded;
    const std::string s = out.dump(-1, ' ', false, Json::error_handler_t::replace);
    std::printf("%s\n", s.c_str());
    return ok_status();
  }
  std::string line;
  for (const auto id : ids) {
    if (!line.empty()) line.push_back(' ');
    line += std::to_string(id);
  }
  std::printf("ids (%zu): %s\ndecoded: %s\n", ids.size(), line.c_str(), decoded.c_str());
  return ok_status();
}

void register_tokenize(CLI::App& app, CommandFn& run) {
  static TokenizeConfig cfg;
  auto* cmd =
      app.add_subcommand("tokenize", "encode text with a tokenizer.json and decode it back");
  cmd->add_option("--tokenizer", cfg.tokenizer_path, "tokenizer.json, or a model folder holding it")
      ->required()
      ->envname("FERRY_TOKENIZER");
  auto* text = cmd->add_option("--text", cfg.text, "text to encode");
  auto* file = cmd->add_option("--text-file", cfg.text_file, "file whose contents to encode");
  text->excludes(file);
  file->excludes(text);
  cmd->add_flag("--json", cfg.json, "print {\"ids\", \"tokens\", \"decoded\"} as JSON");
  cmd->add_flag("--add-special-tokens", cfg.add_special_tokens,
                "apply the post_processor template (e.g. a BOS token)");
  cmd->add_flag("--skip-special-tokens", cfg.skip_special_tokens,
                "leave special tokens out of the decoded text");
  cmd->add_flag("--chat", cfg.chat,
                "render the input (a JSON message array, or one user message) with the chat "
                "template, adding the generation prompt");
  cmd->callback([&run, text, file] {
    run = [text, file]() -> int {
      if (text->count() == 0 && file->count() == 0) {
        std::fprintf(stderr, "ferry tokenize: one of --text or --text-file is required\n");
        return 2;
      }
      const Status s = run_tokenize(cfg);
      return s.ok() ? 0 : fail(s);
    };
  });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_tokenize);
}  // namespace ferry::app
