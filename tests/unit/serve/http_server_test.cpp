// SPDX-License-Identifier: Apache-2.0
// The OpenAI-style HTTP server (serve/http/) over loopback with a real httplib::Client, on the
// built-in random-weight MoE and a byte-level tokenizer. Answers are checked against the same
// engine configuration run directly (greedy output, stop strings), streams against whole answers.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/json.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "serve/builtin_model.h"
#include "serve/engine.h"
#include "serve/http/http_server.h"
#include "serve/http/openai_api.h"

namespace ferry::serve::http {
namespace {

// 256 byte tokens + <|endoftext|>, <|im_start|>, <|im_end|> (ids 256..258), no merges: the same
// ids as `ferry train`'s built-in tokenizer, which lives in ferry_train (not linked here).
model::Tokenizer byte_tokenizer() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b)
    vocab[model::tok::byte_to_unicode_utf8(static_cast<unsigned char>(b))] = b;
  Json added = Json::array();
  int id = 256;
  for (const char* t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    added.push_back({{"id", id++},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const Json bl = {{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", false},
                   {"use_regex", false}};
  const Json j = {{"version", "1.0"},
                  {"added_tokens", added},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", bl},
                  {"post_processor", bl},
                  {"decoder", bl},
                  {"model",
                   {{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", nullptr},
                    {"continuing_subword_prefix", nullptr},
                    {"end_of_word_suffix", nullptr},
                    {"fuse_unk", false},
                    {"byte_fallback", false},
                    {"vocab", vocab},
                    {"merges", Json::array()}}}};
  auto t = model::Tokenizer::from_json_text(j.dump(), "test byte tokenizer");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(*t);
}

EngineConfig engine_config(const BuiltinModel& m) {
  EngineConfig ec;
  ec.max_running = 4;
  // Answers compared with a solo run of the same request must not depend on what shares its
  // steps (a request's choices run side by side; the handler threads race the engine's steps).
  ec.batch_invariant = true;
  ec.max_seq_len = static_cast<int>(m.config.max_position_embeddings);
  return ec;
}

std::string sanitized(const std::string& raw) {
  std::string s;
  append_utf8_sanitized(raw, 0, true, s);
  return s;
}

struct Sse {
  std::vector<Json> chunks;
  bool done = false;
  bool well_formed = true;
};

Sse parse_sse(const std::string& body) {
  Sse out;
  std::size_t i = 0;
  while (i < body.size()) {
    const std::size_t end = body.find("\n\n", i);
    if (end == std::string::npos || body.compare(i, 6, "data: ") != 0 || out.done) {
      out.well_formed = false;
      break;
    }
    const std::string data = body.substr(i + 6, end - i - 6);
    if (data == "[DONE]") {
      out.done = true;
    } else {
      Json j = Json::parse(data, nullptr, false);
      if (j.is_discarded()) out.well_formed = false;
      out.chunks.push_back(std::move(j));
    }
    i = end + 2;
  }
  return out;
}

// Text of a stream: completions' "text" or chat deltas' "content"; plus the last finish_reason.
std::pair<std::string, std::string> stream_text(const Sse& s) {
  std::string text, finish;
  for (const Json& c : s.chunks) {
    if (!c.contains("choices") || c["choices"].empty()) continue;  // e.g. the usage chunk
    const Json& ch = c["choices"][0];
    if (ch.contains("text")) text += ch["text"].get<std::string>();
    if (ch.contains("delta") && ch["delta"].contains("content")) {
      text += ch["delta"]["content"].get<std::string>();
    }
    if (ch["finish_reason"].is_string()) finish = ch["finish_reason"].get<std::string>();
  }
  return {text, finish};
}

// Minimal Prometheus text checker: HELP/TYPE before samples, well-formed sample lines,
// histograms cumulative with +Inf == _count. Returns "" or the first problem.
std::string check_prometheus(const std::string& text) {
  static const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$)");
  std::map<std::string, std::string> types;
  std::map<std::string, double> last_bucket;
  std::istringstream in(text);
  std::string line;
  int samples = 0;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      if (type != "counter" && type != "gauge" && type != "histogram") return "bad type: " + line;
      types[name] = type;
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    std::smatch m;
    if (!std::regex_match(line, m, sample)) return "bad line: " + line;
    std::string name = m[1];
    char* end = nullptr;
    const std::string vs = m[3];
    const double v = std::strtod(vs.c_str(), &end);
    if (end != vs.c_str() + vs.size() || std::isnan(v)) return "bad value: " + line;
    std::string base = name;
    for (const char* suf : {"_bucket", "_sum", "_count"}) {
      const std::string s = suf;
      if (base.size() > s.size() && base.compare(base.size() - s.size(), s.size(), s) == 0 &&
          types.count(base.substr(0, base.size() - s.size()))) {
        base = base.substr(0, base.size() - s.size());
      }
    }
    if (!types.count(base)) return "sample before its TYPE: " + line;
    if (types[base] == "histogram" && name == base + "_bucket") {
      if (v < last_bucket[base]) return "buckets not cumulative: " + line;
      last_bucket[base] = v;
    }
    if (types[base] == "histogram" && name == base + "_count" && v != last_bucket[base]) {
      return "+Inf bucket != count: " + line;
    }
    ++samples;
  }
  return samples > 0 ? "" : "no samples";
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = make_builtin_moe({}, /*seed=*/0x5eed);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::move(*m);
    tok_.emplace(byte_tokenizer());
    auto e = Engine::create(model_->geometry, model_->params, engine_config(*model_));
    ASSERT_TRUE(e.ok()) << e.status().message();
    engine_ = std::move(*e);
    server_ = std::make_unique<HttpServer>(*engine_, &*tok_, server_config());
    auto port = server_->start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().message();
    port_ = *port;
  }
  void TearDown() override {
    if (server_) server_->stop();
  }
  // What the server runs with; a test fixture deriving from this one may change it (the model
  // and the tokenizer exist when it is called).
  virtual HttpServerConfig server_config() { return {.model_name = "tiny", .poll_ms = 10}; }

  httplib::Client client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }
  // POST a JSON body; returns (status, body).
  std::pair<int, std::string> post(const std::string& path, const std::string& body) {
    auto c = client();
    auto r = c.Post(path.c_str(), body, "application/json");
    if (!r) return {-1, "no response: " + httplib::to_string(r.error())};
    return {r->status, r->body};
  }

  // The engine's own output for a prompt, on a fresh engine of the same configuration.
  RequestOutput reference(const std::vector<std::int32_t>& prompt, int max_tokens,
                          std::vector<std::string> stop, bool ignore_eos,
                          SamplingParams sampling = {}) {
    GenerationRequest g;
    g.prompt = prompt;
    g.max_new_tokens = max_tokens;
    g.stop_strings = std::move(stop);
    g.sampling = sampling;
    if (!ignore_eos) g.stop_token_ids = default_stop_ids(*tok_);
    const model::Tokenizer* t = &*tok_;
    g.detokenize = [t](std::span<const std::int32_t> ids) {
      return t->decode(ids, {.skip_special_tokens = true});
    };
    return run_alone(std::move(g));
  }
  // The engine's own logprobs for a greedy request (fresh engine, same configuration).
  RequestOutput reference_logprobs(const std::vector<std::int32_t>& prompt, int max_tokens,
                                   int logprobs, int prompt_logprobs) {
    GenerationRequest g;
    g.prompt = prompt;
    g.max_new_tokens = max_tokens;
    g.stop_token_ids = default_stop_ids(*tok_);
    g.logprobs = logprobs;
    g.prompt_logprobs = prompt_logprobs;
    return run_alone(std::move(g));
  }
  // One request on a fresh engine of the server's configuration.
  RequestOutput run_alone(GenerationRequest g) {
    auto e = Engine::create(model_->geometry, model_->params, engine_config(*model_));
    EXPECT_TRUE(e.ok());
    auto id = (*e)->submit(std::move(g));
    EXPECT_TRUE(id.ok()) << id.status().message();
    EXPECT_TRUE((*e)->run_until_idle().ok());
    auto out = (*e)->take_output(*id);
    EXPECT_TRUE(out.ok());
    return *out;
  }
  std::vector<std::int32_t> encode(const std::string& s) {
    auto ids = tok_->encode(s);
    EXPECT_TRUE(ids.ok());
    return {ids->begin(), ids->end()};
  }

  std::unique_ptr<BuiltinModel> model_;
  std::optional<model::Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
};

TEST_F(HttpServerTest, HealthAndModels) {
  auto c = client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  const Json j = Json::parse(m->body);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
}

TEST_F(HttpServerTest, CompletionEqualsEngineGreedyOutput) {
  const std::string prompt = "The quick brown fox";
  const RequestOutput ref = reference(encode(prompt), 24, {}, false);
  auto [status, body] = post(
      "/v1/completions", Json{{"prompt", prompt}, {"max_tokens", 24}, {"model", "tiny"}}.dump());
  ASSERT_EQ(status, 200) << body;
  const Json j = Json::parse(body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), sanitized(ref.text));
  EXPECT_EQ(j["usage"]["completion_tokens"].get<std::size_t>(), ref.tokens.size());
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<std::size_t>(), prompt.size());
  EXPECT_EQ(j["choices"][0]["finish_reason"],
            ref.finish == FinishReason::kLength ? "length" : "stop");

  // The same prompt as token ids gives the same answer.
  auto [s2, b2] =
      post("/v1/completions", Json{{"prompt", encode(prompt)}, {"max_tokens", 24}}.dump());
  ASSERT_EQ(s2, 200) << b2;
  EXPECT_EQ(Json::parse(b2)["choices"][0]["text"], j["choices"][0]["text"]);
}

TEST_F(HttpServerTest, StreamConcatenatesToTheWholeAnswer) {
  const Json req = {{"prompt", "Once upon a time"}, {"max_tokens", 32}, {"ignore_eos", true}};
  auto [s1, whole] = post("/v1/completions", req.dump());
  ASSERT_EQ(s1, 200) << whole;
  Json sreq = req;
  sreq["stream"] = true;
  auto [s2, body] = post("/v1/completions", sreq.dump());
  ASSERT_EQ(s2, 200) << body;
  const Sse sse = parse_sse(body);
  EXPECT_TRUE(sse.well_formed) << body;
  EXPECT_TRUE(sse.done) << "no data: [DONE]";
  EXPECT_GT(sse.chunks.size(), 2u);
  auto [text, finish] = stream_text(sse);
  EXPECT_EQ(text, Json::parse(whole)["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(finish, "length");
}

TEST_F(HttpServerTest, ChatStreamMatchesChatAnswer) {
  const Json msgs = Json::array(
      {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi there"}}});
  const Json req = {{"messages", msgs}, {"max_tokens", 20}};
  auto [s1, whole] = post("/v1/chat/completions", req.dump());
  ASSERT_EQ(s1, 200) << whole;
  const Json w = Json::parse(whole);
  EXPECT_EQ(w["object"], "chat.completion");
  EXPECT_EQ(w["choices"][0]["message"]["role"], "assistant");
  // The prompt is the ChatML rendering of the messages.
  const std::vector<model::ChatMessage> m = {{"system", "be brief"}, {"user", "hi there"}};
  const RequestOutput ref = reference(encode(model::render_chatml(m, true)), 20, {}, false);
  EXPECT_EQ(w["choices"][0]["message"]["content"].get<std::string>(), sanitized(ref.text));
  Json sreq = req;
  sreq["stream"] = true;
  auto [s2, body] = post("/v1/chat/completions", sreq.dump());
  ASSERT_EQ(s2, 200) << body;
  const Sse sse = parse_sse(body);
  EXPECT_TRUE(sse.well_formed && sse.done) << body;
  ASSERT_FALSE(sse.chunks.empty());
  EXPECT_EQ(sse.chunks[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(sse.chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(stream_text(sse).first, w["choices"][0]["message"]["content"].get<std::string>());
}

TEST_F(HttpServerTest, StopSequenceCutsTheText) {
  const std::string prompt = "stop here:";
  // Sampled with a fixed seed: greedy decoding of the random model repeats one byte.
  const SamplingParams sampling = {.temperature = 1.0f, .seed = 11};
  const RequestOutput free_run = reference(encode(prompt), 64, {}, true, sampling);
  // An ASCII byte the free run produces after a few tokens is a stop string the answer must end
  // before (at its first occurrence).
  std::string stop;
  for (std::size_t i = 3; i < free_run.text.size(); ++i) {
    const auto c = static_cast<unsigned char>(free_run.text[i]);
    if (c >= 0x21 && c < 0x7f) {
      stop = std::string(1, static_cast<char>(c));
      break;
    }
  }
  ASSERT_FALSE(stop.empty()) << "the free run has no ASCII byte to stop at: "
                             << ::testing::PrintToString(free_run.tokens);
  const std::string expected = sanitized(free_run.text.substr(0, free_run.text.find(stop)));
  const Json req = {{"prompt", prompt},   {"max_tokens", 64},
                    {"ignore_eos", true}, {"temperature", 1.0},
                    {"seed", 11},         {"stop", Json::array({stop, "never-seen-xyz"})}};
  auto [s1, whole] = post("/v1/completions", req.dump());
  ASSERT_EQ(s1, 200) << whole;
  const Json w = Json::parse(whole);
  EXPECT_EQ(w["choices"][0]["text"].get<std::string>(), expected);
  EXPECT_EQ(w["choices"][0]["finish_reason"], "stop");
  Json sreq = req;
  sreq["stream"] = true;
  auto [s2, body] = post("/v1/completions", sreq.dump());
  ASSERT_EQ(s2, 200);
  auto [text, finish] = stream_text(parse_sse(body));
  EXPECT_EQ(text, expected);
  EXPECT_EQ(finish, "stop");
}

TEST_F(HttpServerTest, SeededSamplingIsReproducible) {
  const Json req = {{"prompt", "abc"}, {"max_tokens", 16}, {"temperature", 0.8}, {"top_p", 0.9},
                    {"top_k", 50},     {"seed", 7},        {"ignore_eos", true}};
  auto [s1, a] = post("/v1/completions", req.dump());
  auto [s2, b] = post("/v1/completions", req.dump());
  ASSERT_EQ(s1, 200) << a;
  ASSERT_EQ(s2, 200) << b;
  EXPECT_EQ(Json::parse(a)["choices"][0]["text"], Json::parse(b)["choices"][0]["text"]);
  // And equals the engine's own output for the same sampling settings and seed.
  const RequestOutput ref = reference(encode("abc"), 16, {}, true,
                                      {.temperature = 0.8f, .top_k = 50, .top_p = 0.9f, .seed = 7});
  EXPECT_EQ(Json::parse(a)["choices"][0]["text"].get<std::string>(), sanitized(ref.text));
}

TEST_F(HttpServerTest, ConcurrentRequestsAllComplete) {
  constexpr int kN = 5;
  std::vector<std::thread> threads;
  std::vector<int> status(kN, 0);
  std::vector<std::string> bodies(kN);
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] {
      Json req = {{"prompt", "request " + std::to_string(i)},
                  {"max_tokens", 12 + i},
                  {"ignore_eos", true},
                  {"stream", i % 2 == 1}};
      std::tie(status[i], bodies[i]) = post("/v1/completions", req.dump());
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(status[i], 200) << bodies[i];
    if (i % 2 == 1) {
      const Sse s = parse_sse(bodies[i]);
      EXPECT_TRUE(s.done);
      EXPECT_EQ(stream_text(s).second, "length");
    } else {
      const Json j = Json::parse(bodies[i]);
      EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), 12 + i);
    }
  }
  EXPECT_EQ(server_->metrics().requests_ok.load(), static_cast<std::uint64_t>(kN));
}

TEST_F(HttpServerTest, ClientDisconnectCancelsTheRequest) {
  // A long stream whose client hangs up after the first token chunk.
  std::atomic<int> chunks{0};
  std::thread disconnecting([&] {
    auto c = client();
    httplib::Request r;
    r.method = "POST";
    r.path = "/v1/completions";
    r.set_header("Content-Type", "application/json");
    r.body =
        Json{{"prompt", "long story"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}}
            .dump();
    r.content_receiver = [&](const char*, std::size_t, std::uint64_t, std::uint64_t) {
      return ++chunks < 2;  // stop reading: the client closes the connection
    };
    (void)c.send(r);
  });
  disconnecting.join();
  EXPECT_GE(chunks.load(), 1);
  // The engine finishes it as cancelled, well before 400 tokens.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((server_->metrics().finish_cancelled.load() == 0 ||
          server_->metrics().requests_cancelled.load() == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->metrics().finish_cancelled.load(), 1u);
  EXPECT_EQ(server_->metrics().requests_cancelled.load(), 1u);
  EXPECT_LT(server_->metrics().generated_tokens.load(), 400u);
  // Others are unaffected: a normal request still equals the engine's own output.
  const RequestOutput ref = reference(encode("after"), 10, {}, false);
  auto [s, body] = post("/v1/completions", Json{{"prompt", "after"}, {"max_tokens", 10}}.dump());
  ASSERT_EQ(s, 200) << body;
  EXPECT_EQ(Json::parse(body)["choices"][0]["text"].get<std::string>(), sanitized(ref.text));
}

TEST_F(HttpServerTest, BadRequestsGet4xxJsonAndTheServerKeepsServing) {
  struct Case {
    std::string path, body;
    int status;
  };
  const std::vector<std::int32_t> long_prompt(600, 'a');  // > 512 positions of the model
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", 400},
      {"/v1/completions", "[1, 2]", 400},
      {"/v1/completions", R"({"max_tokens": 4})", 400},
      {"/v1/completions", R"({"prompt": "x", "temperature": -1})", 400},
      {"/v1/completions", R"({"prompt": "x", "top_p": 0})", 400},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400},
      {"/v1/completions", R"({"prompt": "x", "stop": [3]})", 400},
      {"/v1/completions", Json{{"prompt", long_prompt}}.dump(), 400},
      {"/v1/completions", R"({"prompt": [999999]})", 400},
      {"/v1/completions", R"({"prompt": "x", "model": "nope"})", 404},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       400},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
       400},
      {"/v1/chat/completions", R"({"prompt": "x"})", 400},
      {"/v1/completions", R"({"prompt": "x", "logprobs": 21})", 400},
      {"/v1/completions", R"({"prompt": "x", "presence_penalty": 5})", 400},
      {"/v1/completions", R"({"prompt": "x", "repetition_penalty": 0})", 400},
      {"/v1/completions", R"({"prompt": "x", "logit_bias": {"abc": 1}})", 400},
      {"/v1/completions", R"({"prompt": "x", "logit_bias": {"5": 200}})", 400},
      {"/v1/completions", R"({"prompt": "x", "logit_bias": {"999999": 1}})", 400},
      {"/v1/completions", R"({"prompt": "x", "stop_token_ids": [-3]})", 400},
      {"/v1/completions", R"({"prompt": "x", "n": 0})", 400},
      {"/v1/completions", R"({"prompt": ["a", "b"], "n": 40})", 400},
      {"/v1/completions", R"({"prompt": ["a", 5]})", 400},
      {"/v1/completions", R"({"prompt": ["a", ""]})", 400},
      {"/v1/completions", R"({"prompt": [[1, 2], []]})", 400},
      {"/v1/completions", R"({"prompt": "x", "logprobs": true})", 400},
      {"/v1/completions", R"({"prompt": "x", "echo": true, "max_tokens": 0})", 400},
      {"/v1/completions", R"({"prompt": "x", "echo": true, "logprobs": 1, "stream": true})", 400},
      {"/v1/completions", R"({"prompt": "x", "stream_options": {"include_usage": true}})", 400},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}],
                                   "top_logprobs": 2})",
       400},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}],
                                   "echo": true})",
       400},
      {"/v1/nothing", "{}", 404},
  };
  for (const Case& c : cases) {
    auto [status, body] = post(c.path, c.body);
    EXPECT_EQ(status, c.status) << c.path << " " << c.body << " -> " << body;
    const Json j = Json::parse(body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << body;
    EXPECT_TRUE(j["error"]["type"].is_string()) << body;
  }
  auto [status, body] = post("/v1/completions", R"({"prompt": "still here", "max_tokens": 3})");
  EXPECT_EQ(status, 200) << body;
  EXPECT_GE(server_->metrics().requests_client_error.load(), 32u);
}

TEST_F(HttpServerTest, NonStreamedClientDisconnectCancelsTheRequest) {
  // A long non-streamed request whose client gives up waiting (read timeout) and closes.
  {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(0, 300 * 1000);
    auto r =
        c.Post("/v1/completions",
               Json{{"prompt", "a long answer"}, {"max_tokens", 480}, {"ignore_eos", true}}.dump(),
               "application/json");
    EXPECT_FALSE(r) << "the 480-token answer came back within the client's 300 ms";
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (server_->metrics().finish_cancelled.load() == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->metrics().finish_cancelled.load(), 1u);
  EXPECT_LT(server_->metrics().generated_tokens.load(), 480u);
  // The handler saw its client leave and counts it; the server goes on serving.
  while (server_->metrics().requests_cancelled.load() == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->metrics().requests_cancelled.load(), 1u);
  const RequestOutput ref = reference(encode("after"), 6, {}, false);
  auto [s, body] = post("/v1/completions", Json{{"prompt", "after"}, {"max_tokens", 6}}.dump());
  ASSERT_EQ(s, 200) << body;
  EXPECT_EQ(Json::parse(body)["choices"][0]["text"].get<std::string>(), sanitized(ref.text));
}

// The token strings of a completions "logprobs" object, and their text offsets.
void expect_offsets_follow_the_tokens(const Json& lp, std::size_t first_offset) {
  ASSERT_EQ(lp["tokens"].size(), lp["text_offset"].size());
  std::size_t expect = first_offset;
  for (std::size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<std::size_t>(), expect) << i;
    const std::string t = lp["tokens"][i].get<std::string>();
    // Byte tokens of the test tokenizer: one byte each (U+FFFD when not ASCII), specials 0.
    expect += t.rfind("<|", 0) == 0 ? 0 : 1;
  }
}

TEST_F(HttpServerTest, BatchedPromptsAndNGiveOneChoiceEach) {
  // A batch of two prompts (text and ids), greedy: each choice is its prompt's own answer.
  const RequestOutput r0 = reference(encode("first one"), 10, {}, true);
  const RequestOutput r1 = reference(encode("second"), 10, {}, true);
  auto [s1, b1] =
      post("/v1/completions", Json{{"prompt", Json::array({"first one", encode("second")})},
                                   {"max_tokens", 10},
                                   {"ignore_eos", true}}
                                  .dump());
  ASSERT_EQ(s1, 200) << b1;
  const Json j1 = Json::parse(b1);
  ASSERT_EQ(j1["choices"].size(), 2u) << b1;
  EXPECT_EQ(j1["choices"][0]["index"], 0);
  EXPECT_EQ(j1["choices"][1]["index"], 1);
  EXPECT_EQ(j1["choices"][0]["text"].get<std::string>(), sanitized(r0.text));
  EXPECT_EQ(j1["choices"][1]["text"].get<std::string>(), sanitized(r1.text));
  EXPECT_EQ(j1["usage"]["prompt_tokens"].get<int>(), 9 + 6);
  EXPECT_EQ(j1["usage"]["completion_tokens"].get<int>(), 20);

  // n = 3 sampled with a seed: choice j is the engine's answer with seed + j.
  SamplingParams sp{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f};
  std::vector<std::string> want;
  for (std::uint64_t j = 0; j < 3; ++j) {
    sp.seed = 7 + j;
    want.push_back(sanitized(reference(encode("sample"), 12, {}, true, sp).text));
  }
  EXPECT_FALSE(want[0] == want[1] && want[1] == want[2]);
  const Json nreq = {{"prompt", "sample"}, {"max_tokens", 12}, {"ignore_eos", true},
                     {"temperature", 1.0}, {"seed", 7},        {"n", 3}};
  auto [s2, b2] = post("/v1/completions", nreq.dump());
  ASSERT_EQ(s2, 200) << b2;
  const Json j2 = Json::parse(b2);
  ASSERT_EQ(j2["choices"].size(), 3u);
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(j2["choices"][k]["text"].get<std::string>(), want[k]) << k;
  }
  EXPECT_EQ(j2["usage"]["prompt_tokens"].get<int>(), 6);  // the prompt counts once
  EXPECT_EQ(j2["usage"]["completion_tokens"].get<int>(), 36);

  // Streamed: the chunks of each index concatenate to that choice's text, each index finishes.
  Json sreq = nreq;
  sreq["stream"] = true;
  auto [s3, b3] = post("/v1/completions", sreq.dump());
  ASSERT_EQ(s3, 200) << b3;
  const Sse sse = parse_sse(b3);
  ASSERT_TRUE(sse.well_formed && sse.done) << b3;
  std::vector<std::string> text(3);
  std::vector<int> finishes(3, 0);
  for (const Json& c : sse.chunks) {
    ASSERT_EQ(c["choices"].size(), 1u) << c.dump();
    const Json& ch = c["choices"][0];
    const std::size_t k = ch["index"].get<std::size_t>();
    ASSERT_LT(k, 3u);
    text[k] += ch["text"].get<std::string>();
    if (ch["finish_reason"].is_string()) ++finishes[k];
  }
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(text[k], want[k]) << k;
    EXPECT_EQ(finishes[k], 1) << k;
  }
  // Chat with n = 2: two messages.
  auto [s4, b4] = post("/v1/chat/completions",
                       Json{{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})},
                            {"max_tokens", 4},
                            {"n", 2}}
                           .dump());
  ASSERT_EQ(s4, 200) << b4;
  const Json j4 = Json::parse(b4);
  ASSERT_EQ(j4["choices"].size(), 2u);
  EXPECT_EQ(j4["choices"][0]["message"], j4["choices"][1]["message"]);  // greedy: the same
}

class HttpServerChatRefused : public HttpServerTest {
  HttpServerConfig server_config() override {
    return {.model_name = "tiny", .poll_ms = 10, .chat_refusal = "no chat"};
  }
};

TEST_F(HttpServerChatRefused, RefusedChatIs400AndCompletionsStillWork) {
  const Json msgs = Json::array({{{"role", "user"}, {"content", "hi"}}});
  auto [s1, b1] = post("/v1/chat/completions", Json{{"messages", msgs}}.dump());
  EXPECT_EQ(s1, 400);
  EXPECT_EQ(Json::parse(b1)["error"]["message"], "no chat");
  auto [s2, b2] = post("/tokenize", Json{{"messages", msgs}}.dump());
  EXPECT_EQ(s2, 400) << b2;
  auto [s3, b3] = post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})");
  EXPECT_EQ(s3, 200) << b3;
}

TEST_F(HttpServerTest, ContentPartsEqualTheJoinedText) {
  // OpenAI's list-of-parts content: the text parts joined by newlines, as one string would be.
  const Json parts =
      Json::array({{{"role", "user"},
                    {"content", Json::array({{{"type", "text"}, {"text", "one"}},
                                             {{"type", "text"}, {"text", "two"}}})}}});
  const Json plain = Json::array({{{"role", "user"}, {"content", "one\ntwo"}}});
  auto [s1, b1] = post("/tokenize", Json{{"messages", parts}}.dump());
  auto [s2, b2] = post("/tokenize", Json{{"messages", plain}}.dump());
  ASSERT_EQ(s1, 200) << b1;
  ASSERT_EQ(s2, 200) << b2;
  EXPECT_EQ(Json::parse(b1)["tokens"], Json::parse(b2)["tokens"]);
  // An assistant turn with null content renders as empty.
  const Json with_null = Json::array({{{"role", "user"}, {"content", "a"}},
                                      {{"role", "assistant"}, {"content", nullptr}},
                                      {{"role", "user"}, {"content", "b"}}});
  auto [s3, b3] =
      post("/v1/chat/completions", Json{{"messages", with_null}, {"max_tokens", 2}}.dump());
  EXPECT_EQ(s3, 200) << b3;
}

// extra_stop_ids (ferry serve: generation_config.json / tokenizer_config.json end tokens) stop
// generation like the tokenizer's <|im_end|>; ignore_eos runs past them. The stop id is the 4th
// token of the greedy answer without stops.
class HttpServerStops : public HttpServerTest {
 protected:
  HttpServerConfig server_config() override {
    free_run_ = reference(encode("stop here"), 12, {}, /*ignore_eos=*/true).tokens;
    return {.model_name = "tiny", .poll_ms = 10, .extra_stop_ids = {free_run_.at(3)}};
  }
  std::vector<std::int32_t> free_run_;
};

TEST_F(HttpServerStops, TheModelsOwnEndTokensStopGeneration) {
  const auto at = std::find(free_run_.begin(), free_run_.end(), free_run_[3]) - free_run_.begin();
  auto [s1, b1] = post("/v1/completions", R"({"prompt": "stop here", "max_tokens": 12})");
  ASSERT_EQ(s1, 200) << b1;
  const Json j = Json::parse(b1);
  EXPECT_EQ(j["usage"]["completion_tokens"].get<long>(), at + 1) << b1;
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  auto [s2, b2] =
      post("/v1/completions", R"({"prompt": "stop here", "max_tokens": 12, "ignore_eos": true})");
  ASSERT_EQ(s2, 200) << b2;
  EXPECT_EQ(Json::parse(b2)["usage"]["completion_tokens"].get<int>(), 12);
}

TEST_F(HttpServerTest, TokenizeAndDetokenizeRoundTrip) {
  auto [s1, b1] = post("/tokenize", R"({"prompt": "hello there"})");
  ASSERT_EQ(s1, 200) << b1;
  const Json t = Json::parse(b1);
  EXPECT_EQ(t["tokens"].get<std::vector<std::int32_t>>(), encode("hello there"));
  EXPECT_EQ(t["count"].get<int>(), 11);
  EXPECT_EQ(t["max_model_len"].get<int>(), engine_config(*model_).max_seq_len);
  auto [s2, b2] = post("/detokenize", Json{{"tokens", t["tokens"]}}.dump());
  ASSERT_EQ(s2, 200) << b2;
  EXPECT_EQ(Json::parse(b2)["prompt"], "hello there");
  // messages: the chat completion's prompt, ChatML with the assistant turn opened.
  const Json msgs = Json::array({{{"role", "user"}, {"content", "hi"}}});
  auto [s3, b3] = post("/tokenize", Json{{"messages", msgs}}.dump());
  ASSERT_EQ(s3, 200) << b3;
  const std::vector<model::ChatMessage> chat = {{"user", "hi"}};
  EXPECT_EQ(Json::parse(b3)["tokens"].get<std::vector<std::int32_t>>(),
            encode(model::render_chatml(chat, true)));
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/tokenize", "{oops"},
           {"/tokenize", R"({"prompt": 5})"},
           {"/detokenize", R"({"tokens": "abc"})"},
           {"/detokenize", R"({"tokens": [-1]})"},
           {"/detokenize", R"({"tokens": [999999]})"}}) {
    auto [st, b] = post(path, body);
    EXPECT_EQ(st, 400) << path << " " << body << " -> " << b;
    EXPECT_TRUE(Json::parse(b, nullptr, false)["error"]["message"].is_string()) << b;
  }
}

TEST_F(HttpServerTest, PenaltiesReachTheEngine) {
  const std::string prompt = "penalize";
  SamplingParams sp;
  sp.penalties = {.repetition = 1.8f, .presence = 0.5f, .frequency = 1.0f};
  const RequestOutput ref = reference(encode(prompt), 20, {}, true, sp);
  auto [status, body] = post("/v1/completions", Json{{"prompt", prompt},
                                                     {"max_tokens", 20},
                                                     {"ignore_eos", true},
                                                     {"repetition_penalty", 1.8},
                                                     {"presence_penalty", 0.5},
                                                     {"frequency_penalty", 1.0}}
                                                    .dump());
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(Json::parse(body)["choices"][0]["text"].get<std::string>(), sanitized(ref.text));
  const RequestOutput plain = reference(encode(prompt), 20, {}, true);
  EXPECT_NE(plain.tokens, ref.tokens);  // the penalties changed the answer
  // logit_bias -100 on the plain answer's first token, and stop_token_ids at its third token.
  const std::int32_t first = plain.tokens[0], third = plain.tokens[2];
  auto [s2, b2] = post("/v1/completions", Json{{"prompt", prompt},
                                               {"max_tokens", 20},
                                               {"ignore_eos", true},
                                               {"logit_bias", {{std::to_string(first), -100}}},
                                               {"logprobs", 0}}
                                              .dump());
  ASSERT_EQ(s2, 200) << b2;
  SamplingParams banned;
  banned.penalties.logit_bias = {{first, -100.0f}};
  const RequestOutput bref = reference(encode(prompt), 20, {}, true, banned);
  EXPECT_EQ(std::find(bref.tokens.begin(), bref.tokens.end(), first), bref.tokens.end());
  const Json j2 = Json::parse(b2);
  EXPECT_EQ(j2["choices"][0]["text"].get<std::string>(), sanitized(bref.text));
  EXPECT_EQ(j2["usage"]["completion_tokens"].get<std::size_t>(), bref.tokens.size());
  auto [s3, b3] = post(
      "/v1/completions",
      Json{
          {"prompt", prompt}, {"max_tokens", 20}, {"ignore_eos", true}, {"stop_token_ids", {third}}}
          .dump());
  ASSERT_EQ(s3, 200) << b3;
  const Json j3 = Json::parse(b3);
  const auto at = std::find(plain.tokens.begin(), plain.tokens.end(), third) - plain.tokens.begin();
  EXPECT_EQ(j3["usage"]["completion_tokens"].get<long>(), at + 1);  // the stop token is kept
  EXPECT_EQ(j3["choices"][0]["finish_reason"], "stop");
}

TEST_F(HttpServerTest, MinPReachesTheEngine) {
  const std::string prompt = "min p";
  const SamplingParams cut{.temperature = 1.5f, .min_p = 0.6f, .seed = 3};
  const RequestOutput ref = reference(encode(prompt), 24, {}, true, cut);
  auto [status, body] = post("/v1/completions", Json{{"prompt", prompt},
                                                     {"max_tokens", 24},
                                                     {"ignore_eos", true},
                                                     {"temperature", 1.5},
                                                     {"min_p", 0.6},
                                                     {"seed", 3}}
                                                    .dump());
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(Json::parse(body)["choices"][0]["text"].get<std::string>(), sanitized(ref.text));
  // The cut changed the draws (same seed and temperature without it give other tokens).
  const RequestOutput uncut =
      reference(encode(prompt), 24, {}, true, {.temperature = 1.5f, .seed = 3});
  EXPECT_NE(uncut.tokens, ref.tokens);
  auto [bad, msg] = post("/v1/completions", R"({"prompt": "x", "min_p": 1.5})");
  EXPECT_EQ(bad, 400) << msg;
  EXPECT_NE(msg.find("min_p"), std::string::npos) << msg;
}

TEST_F(HttpServerTest, CompletionLogprobsAreTheEnginesRawLogprobs) {
  const std::string prompt = "Logprobs of";
  const RequestOutput ref = reference_logprobs(encode(prompt), 12, 3, -1);
  ASSERT_EQ(ref.logprobs.size(), ref.tokens.size());
  auto [status, body] =
      post("/v1/completions", Json{{"prompt", prompt}, {"max_tokens", 12}, {"logprobs", 3}}.dump());
  ASSERT_EQ(status, 200) << body;
  const Json lp = Json::parse(body)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), ref.tokens.size()) << lp.dump();
  for (std::size_t i = 0; i < ref.tokens.size(); ++i) {
    EXPECT_EQ(lp["token_logprobs"][i].get<float>(), ref.logprobs[i].logprob) << i;
    ASSERT_EQ(ref.logprobs[i].top.size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(ref.logprobs[i].top[0].first, ref.tokens[i]);
    EXPECT_EQ(ref.logprobs[i].top[0].second, ref.logprobs[i].logprob);
    const Json& top = lp["top_logprobs"][i];
    EXPECT_GE(top.size(), 1u);
    EXPECT_LE(top.size(), 3u);  // three alternatives, the chosen one among them
    const std::string chosen = lp["tokens"][i].get<std::string>();
    ASSERT_TRUE(top.contains(chosen)) << top.dump();
    EXPECT_EQ(top[chosen].get<float>(), ref.logprobs[i].logprob);
  }
  expect_offsets_follow_the_tokens(lp, 0);
  // Without "logprobs" the field is null, as OpenAI's.
  auto [s2, b2] = post("/v1/completions", Json{{"prompt", prompt}, {"max_tokens", 2}}.dump());
  ASSERT_EQ(s2, 200) << b2;
  EXPECT_TRUE(Json::parse(b2)["choices"][0]["logprobs"].is_null());
}

TEST_F(HttpServerTest, EchoScoresThePromptWithoutGenerating) {
  // lm-evaluation-harness's loglikelihood request: echo + logprobs + max_tokens 0.
  const std::string prompt = "score this prompt";
  const std::vector<std::int32_t> ids = encode(prompt);
  const RequestOutput ref = reference_logprobs(ids, 0, -1, 2);
  ASSERT_EQ(ref.prompt_logprobs.size(), ids.size() - 1);
  EXPECT_TRUE(ref.tokens.empty());
  EXPECT_EQ(ref.finish, FinishReason::kLength);
  auto [status, body] =
      post("/v1/completions",
           Json{{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 2}}.dump());
  ASSERT_EQ(status, 200) << body;
  const Json j = Json::parse(body);
  const Json& ch = j["choices"][0];
  EXPECT_EQ(ch["text"].get<std::string>(), prompt);
  EXPECT_EQ(ch["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), 0);
  const Json& lp = ch["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size()) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  double sum = 0;
  for (std::size_t i = 1; i < ids.size(); ++i) {
    EXPECT_EQ(lp["tokens"][i].get<std::string>(), prompt.substr(i, 1));
    EXPECT_EQ(lp["token_logprobs"][i].get<float>(), ref.prompt_logprobs[i - 1].logprob) << i;
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);
    sum += lp["token_logprobs"][i].get<double>();
  }
  EXPECT_LT(sum, 0.0);
  expect_offsets_follow_the_tokens(lp, 0);

  // Echo with generation: the prompt's entries, then the answer's; the text starts with the
  // prompt and the answer's offsets continue after it.
  const RequestOutput gen = reference_logprobs(ids, 5, 1, 1);
  auto [s2, b2] =
      post("/v1/completions",
           Json{{"prompt", prompt}, {"max_tokens", 5}, {"echo", true}, {"logprobs", 1}}.dump());
  ASSERT_EQ(s2, 200) << b2;
  const Json j2 = Json::parse(b2);
  const Json& c2 = j2["choices"][0];
  EXPECT_EQ(c2["text"].get<std::string>().rfind(prompt, 0), 0u);
  ASSERT_EQ(c2["logprobs"]["tokens"].size(), ids.size() + gen.tokens.size());
  for (std::size_t i = 0; i < gen.tokens.size(); ++i) {
    EXPECT_EQ(c2["logprobs"]["token_logprobs"][ids.size() + i].get<float>(),
              gen.logprobs[i].logprob);
  }
  // The prompt's logprobs do not depend on the alternatives asked for, nor on generating.
  for (std::size_t i = 0; i + 1 < ids.size(); ++i) {
    EXPECT_EQ(gen.prompt_logprobs[i].logprob, ref.prompt_logprobs[i].logprob) << i;
  }
}

TEST_F(HttpServerTest, ChatLogprobsHaveBytesAndTopEntries) {
  const Json msgs = Json::array({{{"role", "user"}, {"content", "hi"}}});
  auto [status, body] = post(
      "/v1/chat/completions",
      Json{{"messages", msgs}, {"max_tokens", 8}, {"logprobs", true}, {"top_logprobs", 2}}.dump());
  ASSERT_EQ(status, 200) << body;
  const Json j = Json::parse(body);
  const Json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), j["usage"]["completion_tokens"].get<std::size_t>()) << body;
  for (const Json& e : content) {
    ASSERT_TRUE(e["token"].is_string());
    ASSERT_TRUE(e["logprob"].is_number());
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    ASSERT_TRUE(e["bytes"].is_array());
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(),
              e["top_logprobs"][1]["logprob"].get<double>());
    // Greedy: the chosen token is the first alternative.
    EXPECT_EQ(e["top_logprobs"][0]["logprob"].get<float>(), e["logprob"].get<float>());
  }
  // logprobs: true alone gives the chosen tokens' entries with no alternatives.
  auto [s2, b2] = post("/v1/chat/completions",
                       Json{{"messages", msgs}, {"max_tokens", 3}, {"logprobs", true}}.dump());
  ASSERT_EQ(s2, 200) << b2;
  const Json j2 = Json::parse(b2);  // the loop reads into it: it must outlive the loop
  for (const Json& e : j2["choices"][0]["logprobs"]["content"]) {
    EXPECT_TRUE(e["top_logprobs"].empty());
  }
}

TEST_F(HttpServerTest, StreamedLogprobsAndUsageEqualTheWholeAnswer) {
  const Json req = {
      {"prompt", "stream me"}, {"max_tokens", 16}, {"ignore_eos", true}, {"logprobs", 1}};
  auto [s1, whole] = post("/v1/completions", req.dump());
  ASSERT_EQ(s1, 200) << whole;
  const Json want = Json::parse(whole)["choices"][0]["logprobs"];
  Json sreq = req;
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  auto [s2, body] = post("/v1/completions", sreq.dump());
  ASSERT_EQ(s2, 200) << body;
  const Sse sse = parse_sse(body);
  ASSERT_TRUE(sse.well_formed && sse.done) << body;
  Json tokens = Json::array(), lps = Json::array();
  for (const Json& c : sse.chunks) {
    if (c["choices"].empty()) continue;
    const Json& lp = c["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    for (const Json& t : lp["tokens"]) tokens.push_back(t);
    for (const Json& x : lp["token_logprobs"]) lps.push_back(x);
  }
  EXPECT_EQ(tokens, want["tokens"]);
  EXPECT_EQ(lps, want["token_logprobs"]);
  // The usage chunk: last before [DONE], no choices.
  const Json& last = sse.chunks.back();
  EXPECT_TRUE(last["choices"].empty()) << last.dump();
  EXPECT_EQ(last["usage"]["completion_tokens"].get<int>(), 16);
  EXPECT_EQ(last["usage"]["prompt_tokens"].get<int>(), 9);
  EXPECT_EQ(stream_text(sse).first, Json::parse(whole)["choices"][0]["text"].get<std::string>());
}

TEST_F(HttpServerTest, MetricsAreValidPrometheusText) {
  auto [s, b] = post("/v1/completions", R"({"prompt": "m", "max_tokens": 5, "ignore_eos": true})");
  ASSERT_EQ(s, 200) << b;
  (void)post("/v1/completions", "{bad");
  auto c = client();
  auto r = c.Get("/metrics");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(check_prometheus(r->body), "") << r->body;
  EXPECT_NE(r->body.find("ferry_serve_requests_total{outcome=\"ok\"} 1\n"), std::string::npos)
      << r->body;
  EXPECT_NE(r->body.find("ferry_serve_requests_total{outcome=\"client_error\"} 1\n"),
            std::string::npos);
  EXPECT_NE(r->body.find("ferry_serve_generated_tokens_total 5\n"), std::string::npos);
  EXPECT_NE(r->body.find("ferry_serve_time_to_first_token_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(r->body.find("ferry_serve_inter_token_seconds_count 4\n"), std::string::npos);
  EXPECT_NE(r->body.find("ferry_serve_kv_blocks_used 0\n"), std::string::npos);
  EXPECT_NE(r->body.find("ferry_serve_pager_misses_total"), std::string::npos);
  EXPECT_NE(r->body.find("ferry_serve_expert_misses_on_host_total{reason=\"bypass\"}"),
            std::string::npos);
}

// With the default handler pool, the engine gets as many concurrent streams as --max-running
// allows and /health still answers while they are all open. 12 slow streams (the engine's step
// hook sleeps while the test holds them) against max_running 12: with httplib's own default pool,
// max(8, cores - 1), only 4 of them reached the engine on a 2-core host.
TEST(HttpServerBusy, MaxRunningStreamsAreInFlightAndHealthStillAnswers) {
  constexpr int kStreams = 12;
  auto m = make_builtin_moe({}, /*seed=*/0x5eed);
  ASSERT_TRUE(m.ok());
  const model::Tokenizer tok = byte_tokenizer();
  EngineConfig ec = engine_config(**m);
  ec.max_running = kStreams;
  auto e = Engine::create((*m)->geometry, (*m)->params, ec);
  ASSERT_TRUE(e.ok()) << e.status().message();
  std::atomic<bool> hold{true};
  (*e)->set_step_hook([&hold](Engine&) {
    if (hold.load()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return ok_status();
  });
  HttpServer server(**e, &tok, {.model_name = "tiny", .poll_ms = 10});
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  const int max_tokens = ec.max_seq_len - 16;  // ~20 ms a token while held: seconds per stream
  std::vector<std::thread> clients;
  std::vector<int> status(kStreams, 0);
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", *port);
      c.set_read_timeout(120, 0);
      const Json req = {{"prompt", "stream " + std::to_string(i)},
                        {"max_tokens", max_tokens},
                        {"ignore_eos", true},
                        {"stream", true}};
      auto r = c.Post("/v1/completions", req.dump(), "application/json");
      status[std::size_t(i)] = r ? r->status : -1;
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (server.metrics().in_flight.load() < kStreams &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int in_flight = server.metrics().in_flight.load();
  bool health_ok = false;
  {
    httplib::Client c("127.0.0.1", *port);
    c.set_connection_timeout(2, 0);
    c.set_read_timeout(2, 0);
    auto r = c.Get("/health");
    health_ok = r && r->status == 200;
  }
  hold = false;
  for (auto& t : clients) t.join();
  EXPECT_EQ(in_flight, kStreams) << "the handler pool kept requests from the engine";
  EXPECT_TRUE(health_ok) << "/health did not answer within 2 s beside " << in_flight
                         << " open streams";
  for (int i = 0; i < kStreams; ++i) EXPECT_EQ(status[std::size_t(i)], 200) << i;
  server.stop();
}

TEST(HttpServerKv, PromptOverTheKvPoolIs400) {
  auto m = make_builtin_moe({}, /*seed=*/0x5eed);
  ASSERT_TRUE(m.ok());
  const model::Tokenizer tok = byte_tokenizer();
  EngineConfig ec = engine_config(**m);
  {
    EngineConfig probe = engine_config(**m);
    auto e = Engine::create((*m)->geometry, (*m)->params, probe);
    ASSERT_TRUE(e.ok());
    ec.kv.budget_bytes = probe.kv.budget_bytes / (*e)->kv().num_blocks() * 4;  // 4 blocks
  }
  auto e = Engine::create((*m)->geometry, (*m)->params, ec);
  ASSERT_TRUE(e.ok()) << e.status().message();
  const int capacity = (*e)->kv().num_blocks() * ec.kv.block_tokens;
  ASSERT_LT(capacity + 8, ec.max_seq_len);  // the pool, not the context, is the limit here
  HttpServer server(**e, &tok, {.model_name = "tiny"});
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  httplib::Client c("127.0.0.1", *port);
  const std::vector<std::int32_t> prompt(static_cast<std::size_t>(capacity), 'a');
  auto r = c.Post("/v1/completions", Json{{"prompt", prompt}, {"max_tokens", 8}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_TRUE(Json::parse(r->body)["error"]["message"].is_string());
  auto ok = c.Post("/v1/completions", R"({"prompt": "fits", "max_tokens": 8})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST(HttpServerAuth, ApiKeyGuardsEveryRouteButHealthAndMetrics) {
  auto m = make_builtin_moe({}, /*seed=*/0x5eed);
  ASSERT_TRUE(m.ok());
  const model::Tokenizer tok = byte_tokenizer();
  auto e = Engine::create((*m)->geometry, (*m)->params, engine_config(**m));
  ASSERT_TRUE(e.ok()) << e.status().message();
  HttpServer server(**e, &tok, {.model_name = "tiny", .api_key = "sk-test-123"});
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  httplib::Client c("127.0.0.1", *port);
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  auto refused = [&](const httplib::Headers& h, const char* what) {
    for (const char* path : {"/v1/completions", "/v1/chat/completions", "/tokenize", "/nope"}) {
      auto r = c.Post(path, h, body, "application/json");
      ASSERT_TRUE(r) << what;
      EXPECT_EQ(r->status, 401) << what << " " << path << ": " << r->body;
      const Json j = Json::parse(r->body, nullptr, false);
      ASSERT_TRUE(j.is_object()) << r->body;
      EXPECT_EQ(j["error"]["type"], "authentication_error") << r->body;
    }
    auto models = c.Get("/v1/models", h);
    ASSERT_TRUE(models);
    EXPECT_EQ(models->status, 401) << what;
  };
  refused({}, "no header");
  refused({{"Authorization", "Bearer sk-test-12"}}, "a prefix of the key");
  refused({{"Authorization", "Bearer sk-test-1234"}}, "the key and more");
  refused({{"Authorization", "Basic sk-test-123"}}, "another scheme");
  refused({{"Authorization", "sk-test-123"}}, "no scheme");
  // Open without the key: the probes an orchestrator sends.
  for (const char* path : {"/health", "/metrics"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << path;
  }
  // With it (the scheme in any case): served, and the refusals above cost nothing.
  for (const char* auth : {"Bearer sk-test-123", "bearer  sk-test-123"}) {
    auto r = c.Post("/v1/completions", {{"Authorization", auth}}, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << auth << ": " << r->body;
  }
}

TEST(HttpServerAuth, BearerMatchesOnlyTheWholeKey) {
  EXPECT_TRUE(bearer_matches("Bearer k1", "k1"));
  EXPECT_TRUE(bearer_matches("BEARER   k1", "k1"));
  EXPECT_FALSE(bearer_matches("Bearer k1 ", "k1"));
  EXPECT_FALSE(bearer_matches("Bearer k", "k1"));
  EXPECT_FALSE(bearer_matches("Bearerk1", "k1"));
  EXPECT_FALSE(bearer_matches("Bearer ", "k1"));
  EXPECT_FALSE(bearer_matches("", "k1"));
  EXPECT_FALSE(bearer_matches("Bearer k2", "k1"));
}

TEST(HttpServerKv, PrefixCacheHitsShowOnMetrics) {
  auto m = make_builtin_moe({}, /*seed=*/0x5eed);
  ASSERT_TRUE(m.ok());
  const model::Tokenizer tok = byte_tokenizer();
  EngineConfig ec = engine_config(**m);
  ec.kv.prefix_cache = true;
  auto e = Engine::create((*m)->geometry, (*m)->params, ec);
  ASSERT_TRUE(e.ok()) << e.status().message();
  HttpServer server(**e, &tok, {.model_name = "tiny"});
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  httplib::Client c("127.0.0.1", *port);
  // 40 prompt tokens with the byte tokenizer: 2 full blocks of 16; the second request finds them.
  const std::string body =
      R"({"prompt": "the same forty characters of prompt text!", "max_tokens": 2})";
  for (int i = 0; i < 2; ++i) {
    auto r = c.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
  }
  auto r = c.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(check_prometheus(r->body), "") << r->body;
  EXPECT_NE(r->body.find("ferry_serve_prefix_cache_hit_tokens_total 32\n"), std::string::npos)
      << r->body;
  EXPECT_NE(r->body.find("ferry_serve_prefix_cache_hit_rate "), std::string::npos);
  EXPECT_EQ(r->body.find("ferry_serve_kv_blocks_cached 0\n"), std::string::npos) << r->body;
  server.stop();
}

TEST(Utf8Sanitize, PiecewiseEqualsWhole) {
  const std::string bytes = "a\xE2\x82\xAC\xE2q\xF0\x9F\x98\x80\xC0\x80z\xED\xA0\x80\xE2\x82";
  std::string whole;
  append_utf8_sanitized(bytes, 0, true, whole);
  EXPECT_EQ(whole,
            "a\xE2\x82\xAC\xEF\xBF\xBDq\xF0\x9F\x98\x80\xEF\xBF\xBD\xEF\xBF\xBDz"
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  for (std::size_t cut = 0; cut <= bytes.size(); ++cut) {
    std::string piece;
    const std::size_t used =
        append_utf8_sanitized(std::string_view(bytes).substr(0, cut), 0, false, piece);
    append_utf8_sanitized(bytes, used, true, piece);
    EXPECT_EQ(piece, whole) << "cut " << cut;
  }
}

}  // namespace
}  // namespace ferry::serve::http
