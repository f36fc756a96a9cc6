// SPDX-License-Identifier: Apache-2.0
// sampler_bench: the cost of drawing one token from a vocabulary-sized row of logits, per
// sampling setting, the fast path (serve::sampling_distribution: ranks only the prefix the cuts
// reach) against its slow twin (sampling_distribution_sorted: ranks the whole row), in the same
// process, on the same rows. The engine samples every stream's token on its own thread between
// decode steps, so this time adds to every sampled token. Logits are drawn N(0, sd) (sd 3 by
// default, near real models' spread) with a few large ones on top, fresh for each of --rows rows.
// Prints ms per token for both, the sorted/fast ratio, the kept-set size, and states the machine;
// checks that both lists are the same bits. Then, on the settings with a top_p cut, the walk's
// start from the bucketed nucleus bound against a 64-token prefix grown x4 (session 41's start).
// Then a decode step's rows (--rows of them, llama.cpp's
// default setting) sampled one at a time and on the thread pool, as the engine does.
//   sampler_bench [--vocab 151936] [--rows 64] [--sd 3] [--json FILE]
#include <sys/utsname.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cpu_info.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "serve/sampler.h"

namespace {

using ferry::serve::SamplingParams;
using Kept = std::vector<std::pair<std::int32_t, double>>;

struct Setting {
  const char* name;
  SamplingParams params;
};

// Best-of-two ms per row of `fn` over every row.
template <typename Fn>
double ms_per_row(const std::vector<std::vector<float>>& rows, Fn&& fn) {
  double best = 1e30;
  for (int rep = 0; rep < 2; ++rep) {
    ferry::Timer t;
    for (const auto& r : rows) fn(r);
    best = std::min(best, t.elapsed_ms() / double(rows.size()));
  }
  return best;
}

bool same_bits(const Kept& a, const Kept& b) {
  bool same = a.size() == b.size();
  for (std::size_t i = 0; same && i < a.size(); ++i) {
    same = a[i].first == b[i].first &&
           std::bit_cast<std::uint64_t>(a[i].second) == std::bit_cast<std::uint64_t>(b[i].second);
  }
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  int vocab = 151936, n_rows = 64;
  double sd = 3.0;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--vocab" && has_value) {
      vocab = std::atoi(argv[++i]);
    } else if (a == "--rows" && has_value) {
      n_rows = std::atoi(argv[++i]);
    } else if (a == "--sd" && has_value) {
      sd = std::atof(argv[++i]);
    } else if (a == "--json" && has_value) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: sampler_bench [--vocab V] [--rows N] [--sd S] [--json FILE]\n");
      return 2;
    }
  }
  if (vocab < 1 || n_rows < 1 || !(sd > 0.0)) {
    std::fprintf(stderr, "sampler_bench: --vocab and --rows must be >= 1, --sd > 0\n");
    return 2;
  }

  std::mt19937_64 gen(7);
  std::normal_distribution<float> normal(0.0f, float(sd));
  std::uniform_int_distribution<int> pick(0, vocab - 1);
  std::vector<std::vector<float>> rows(static_cast<std::size_t>(n_rows),
                                       std::vector<float>(static_cast<std::size_t>(vocab)));
  for (auto& r : rows) {
    for (float& x : r) x = normal(gen);
    for (int k = 0; k < 8; ++k) r[std::size_t(pick(gen))] += float(3.0 * sd);  // a few likely
  }

  // The OpenAI default (temperature only), the usual nucleus and top-k settings, and
  // llama.cpp's defaults (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8).
  const Setting settings[] = {
      {"temperature 1 (nothing cut)", {.temperature = 1.0f}},
      {"temperature 0.7, top_p 0.9", {.temperature = 0.7f, .top_p = 0.9f}},
      {"temperature 1, top_p 0.95", {.temperature = 1.0f, .top_p = 0.95f}},
      {"temperature 0.7, top_k 40", {.temperature = 0.7f, .top_k = 40}},
      {"temperature 0.7, min_p 0.1", {.temperature = 0.7f, .min_p = 0.1f}},
      {"llama.cpp defaults (T 0.8, k 40, p 0.95, min_p 0.05)",
       {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f}},
  };

  utsname un{};
  uname(&un);
  nlohmann::json j;
  j["what"] =
      "ms to sample one token from a row of logits: sampling_distribution (fast) vs "
      "sampling_distribution_sorted (slow twin, sorts the row), same rows, same process";
  j["machine"] = {{"cpu", ferry::cpu_model_name()},
                  {"os", std::string(un.sysname) + " " + un.release}};
  j["vocab"] = vocab;
  j["rows"] = n_rows;
  j["logit_sd"] = sd;
  std::printf("sampler: vocab %d, %d rows of N(0, %.1f) logits; machine: %s (%s %s)\n", vocab,
              n_rows, sd, ferry::cpu_model_name().c_str(), un.sysname, un.release);
  std::printf("%-54s %10s %10s %8s %10s\n", "setting", "fast ms", "sorted ms", "ratio", "kept");

  Kept fast, slow;
  bool all_same = true;
  std::size_t sink = 0;
  const double greedy_ms = ms_per_row(
      rows, [&](const std::vector<float>& r) { sink += std::size_t(ferry::serve::argmax(r)); });
  std::printf("%-54s %10.3f %10s %8s %10s\n", "greedy (argmax)", greedy_ms, "-", "-", "1");
  j["greedy_ms"] = greedy_ms;
  for (const Setting& s : settings) {
    double kept_mean = 0.0;
    for (const auto& r : rows) {  // the same bits, and the kept sizes
      ferry::serve::sampling_distribution(r, s.params, fast);
      ferry::serve::sampling_distribution_sorted(r, s.params, slow);
      kept_mean += double(fast.size()) / double(rows.size());
      all_same = all_same && same_bits(fast, slow);
    }
    const double fast_ms = ms_per_row(rows, [&](const std::vector<float>& r) {
      ferry::serve::sampling_distribution(r, s.params, fast);
      sink += fast.size();
    });
    const double sorted_ms = ms_per_row(rows, [&](const std::vector<float>& r) {
      ferry::serve::sampling_distribution_sorted(r, s.params, slow);
      sink += slow.size();
    });
    std::printf("%-54s %10.3f %10.3f %7.1fx %10.1f\n", s.name, fast_ms, sorted_ms,
                sorted_ms / fast_ms, kept_mean);
    j["settings"].push_back({{"setting", s.name},
                             {"temperature", s.params.temperature},
                             {"top_k", s.params.top_k},
                             {"top_p", s.params.top_p},
                             {"min_p", s.params.min_p},
                             {"fast_ms", fast_ms},
                             {"sorted_ms", sorted_ms},
                             {"sorted_over_fast", sorted_ms / fast_ms},
                             {"kept_mean", kept_mean}});
  }
  // The top_p walk's start: the bucketed nucleus bound (sampling_distribution, session 42) against
  // session 41's first prefix of 64 tokens grown x4 (sampling_distribution_from(.., 64, ..)), on
  // the settings with a top_p cut, rounds alternating so drift falls on both.
  std::printf("%-54s %10s %10s %8s\n", "top_p start", "bound ms", "64 x4 ms", "ratio");
  for (const Setting& s : settings) {
    if (!(s.params.top_p < 1.0f)) continue;
    double bound_ms = 1e30, grown_ms = 1e30;
    for (int round = 0; round < 3; ++round) {
      bound_ms = std::min(bound_ms, ms_per_row(rows, [&](const std::vector<float>& r) {
                            ferry::serve::sampling_distribution(r, s.params, fast);
                            sink += fast.size();
                          }));
      grown_ms = std::min(grown_ms, ms_per_row(rows, [&](const std::vector<float>& r) {
                            ferry::serve::sampling_distribution_from(r, s.params, 64, slow);
                            sink += slow.size();
                          }));
      all_same = all_same && same_bits(fast, slow);  // the last row's lists
    }
    std::printf("%-54s %10.3f %10.3f %7.2fx\n", s.name, bound_ms, grown_ms, grown_ms / bound_ms);
    j["top_p_start"].push_back({{"setting", s.name},
                                {"bound_ms", bound_ms},
                                {"grown_from_64_ms", grown_ms},
                                {"grown_over_bound", grown_ms / bound_ms}});
  }
  // The engine samples a step's rows on the thread pool (Engine::compute_rows): --rows rows of the
  // llama.cpp-default setting one at a time against spread over the pool, as one decode step of
  // that many streams.
  {
    const SamplingParams p = settings[5].params;
    auto& pool = ferry::ThreadPool::global();
    std::vector<Kept> scratch(rows.size());
    std::vector<std::int32_t> tokens(rows.size());
    double serial_ms = 1e30, pooled_ms = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      ferry::Timer t;
      for (std::size_t r = 0; r < rows.size(); ++r) {
        ferry::serve::Rng rng(r);
        tokens[r] = ferry::serve::sample(rows[r], p, rng, scratch[r]);
      }
      serial_ms = std::min(serial_ms, t.elapsed_ms());
      t.reset();
      pool.parallel_for(rows.size(), [&](std::size_t b, std::size_t e) {
        for (std::size_t r = b; r < e; ++r) {
          ferry::serve::Rng rng(r);
          sink += std::size_t(ferry::serve::sample(rows[r], p, rng, scratch[r]) == tokens[r]);
        }
      });
      pooled_ms = std::min(pooled_ms, t.elapsed_ms());
    }
    std::printf(
        "%zu rows (one step of %zu streams), llama.cpp defaults: one at a time %.3f ms, on "
        "the pool (%zu threads) %.3f ms, %.2fx\n",
        rows.size(), rows.size(), serial_ms, pool.size() + 1, pooled_ms, serial_ms / pooled_ms);
    j["step_rows"] = {{"rows", rows.size()},
                      {"serial_ms", serial_ms},
                      {"pooled_ms", pooled_ms},
                      {"pool_threads", pool.size() + 1},
                      {"serial_over_pooled", serial_ms / pooled_ms}};
  }
  j["same_bits"] = all_same;
  j["checksum"] = sink;
  std::printf("fast and sorted lists: %s\n", all_same ? "the same bits" : "DIFFERENT");
  if (!json_path.empty()) {
    std::ofstream(json_path) << j.dump(2) << "\n";
    std::printf("wrote %s\n", json_path.c_str());
  }
  return all_same ? 0 : 1;
}
