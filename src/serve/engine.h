// SPDX-License-Identifier: Apache-2.0
// Engine: the serving loop an HTTP server (or `ferry generate`) drives.
//   submit(request) -> id           queue a prompt with its sampling and stop settings
//   step() -> token events          one scheduler iteration: admit, batch, forward, sample
//   cancel(id)                      finish a request early (client went away)
//   take_output(id)                 the finished request's tokens, text and finish reason
// Scheduling (continuous batching): requests are admitted FIFO while fewer than max_running run
// and the KV pool can hold prompt + max_new_tokens (reserved whole at admission, so a running
// request never waits for blocks) -- or, with EngineConfig::kv_preempt, what is computed so far:
// blocks then grow one at a time and a decode that cannot get one preempts the youngest running
// request (its blocks freed; it goes back to the head of the queue and is recomputed, prompt and
// generated tokens, before it samples again: the same tokens come out).
// Prefix cache (KvConfig::prefix_cache): at admission a request takes its longest cached
// block-aligned prefix from the pool (KvCache::match_prefix) and computes only the rest; after
// every forward the blocks it filled are committed to the cache, and they stay cached after it
// ends until their memory is needed. With EngineConfig::batch_invariant the outputs are
// bit-identical to a run without it; otherwise they differ by the batching noise above.
// Resizing (MV-WSA): resize_pools() changes the expert caps and the KV block count between steps
// without draining (ExpertPager::resize, KvCache::resize); a step hook runs at every step boundary
// (before admission) so a controller can call it (serve/wsa/live_split.h). Each step takes one
// decode token from every running sequence that has finished its prompt, then fills the rest of
// max_batch_tokens with prompt chunks (chunked prefill), oldest first. A sequence is sampled when
// the step computes its last known token. Threading: not thread-safe. A server calls every method
// from one engine thread and hands events to connections through its own queue.
//   auto eng = Engine::create(geo, params, cfg).value();
//   RequestId id = eng->submit({.prompt = ids, .max_new_tokens = 32}).value();
//   while (!eng->idle()) for (const TokenEvent& ev : eng->step().value()) stream(ev);
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "kernels/backend.h"
#include "mem/stream_set.h"
#include "mem/transfer_engine.h"
#include "serve/dense_weights.h"
#include "serve/device_weights.h"
#include "serve/expert_executor.h"
#include "serve/kv_cache.h"
#include "serve/link_engine.h"
#include "serve/logprobs.h"
#include "serve/model_runner.h"
#include "serve/sampler.h"
#include "serve/serve_config.h"

namespace ferry::serve {

using RequestId = std::int64_t;

enum class FinishReason : std::uint8_t { kNone, kLength, kStopToken, kStopString, kCancelled };
std::string_view to_string(FinishReason r);

struct GenerationRequest {
  std::vector<std::int32_t> prompt;
  SamplingParams sampling;
  int max_new_tokens = 16;
  std::vector<std::int32_t> stop_token_ids;  // the stop token is kept as the last token
  std::vector<std::string> stop_strings;     // text is cut before the first match
  // Text of generated ids (the caller's tokenizer); needed for stop_strings and output text.
  std::function<Result<std::string>(std::span<const std::int32_t>)> detokenize;
  // Log-probabilities (serve/logprobs.h; raw logits, before temperature / top-k / top-p):
  // -1 off; n in [0, kMaxTopLogprobs]: each generated token's logprob plus the n most likely
  // alternatives at its position.
  int logprobs = -1;
  // -1 off; n >= 0: the logprob of every prompt token after the first (given the tokens before
  // it) plus n alternatives. Such a request computes its whole prompt (no prefix-cache match,
  // whose positions would have no logits) and may set max_new_tokens = 0 to only score the
  // prompt (it then finishes with kLength once the prompt is computed).
  int prompt_logprobs = -1;
};

struct TokenEvent {
  RequestId id = 0;
  std::int32_t token = -1;  // -1 on a cancellation event
  int index = 0;            // position among the request's generated tokens
  FinishReason finish = FinishReason::kNone;
  std::optional<TokenLogprob> logprob;  // the token's, when the request asked for logprobs
};

struct RequestOutput {
  std::vector<std::int32_t> tokens;  // generated ids
  std::string text;                  // detokenized (cut at a stop string); empty without one
  FinishReason finish = FinishReason::kNone;
  std::vector<TokenLogprob> logprobs;         // per generated token (GenerationRequest::logprobs)
  std::vector<TokenLogprob> prompt_logprobs;  // prompt tokens 1..P-1 (prompt_logprobs)
};

struct EngineStats {
  std::uint64_t steps = 0, prefill_tokens = 0, decode_tokens = 0, max_step_tokens = 0;
  int kv_blocks = 0, kv_blocks_peak = 0;
  std::uint64_t preemptions = 0, recompute_tokens = 0, pool_resizes = 0;
  int preempted_blocks_last_step = 0;  // blocks freed by preemptions in the last step
  // Prefix cache, counted at each admission: tokens the request had (prompt, or prompt and
  // generated after a preemption) and tokens found cached (not computed again).
  std::uint64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  double prefix_hit_rate() const {
    return prefix_query_tokens ? double(prefix_hit_tokens) / double(prefix_query_tokens) : 0.0;
  }
};

// What the KV pool was asked for at a step boundary (MV-WSA's KV demand signal).
struct KvDemandSample {
  int used = 0;          // blocks held by running requests
  int waiting_need = 0;  // blocks the waiting requests need to be admitted (up to max_running)
  int preempted = 0;     // blocks freed by preemptions in the last step (work to redo)
  int blocks() const { return used + waiting_need + preempted; }
};

class Engine {
 public:
  // backend: the CPU backend (default), or a CUDA backend (kernels::cuda_backend(0)): then the
  // engine owns a StreamSet on device 0 (compute: every op; h2d: expert copies) and the CUDA
  // transfer engine, uploads the weights (DeviceWeights: dense ones, plus the experts in resident
  // mode) and keeps activations, KV blocks and expert slots / staging in GPU memory, all charged
  // to the one device budget (docs/serve.md "CUDA path"). `params` stay host views either way.
  static Result<std::unique_ptr<Engine>> create(const model::DecoderGeometry& geo,
                                                const model::ModelParams& params,
                                                const EngineConfig& cfg,
                                                kernels::Backend& backend = kernels::cpu_backend());
  ~Engine();

  // invalid_argument: empty prompt, ids outside the vocabulary, bad sampling values, stop strings
  // without a detokenizer, prompt + max_new_tokens over max_seq_len or over the whole KV pool,
  // logprob counts outside [-1, kMaxTopLogprobs], max_new_tokens 0 without prompt_logprobs.
  Result<RequestId> submit(GenerationRequest request);
  Result<std::vector<TokenEvent>> step();
  Status cancel(RequestId id);
  bool idle() const { return waiting_.empty() && running_.empty() && pending_.empty(); }
  Status run_until_idle();
  // The output of a finished request (removed from the engine); not_found while it runs.
  Result<RequestOutput> take_output(RequestId id);

  void set_routing_hook(RoutingHook* hook) { runner_->set_routing_hook(hook); }
  // Sees every row of logits the engine samples from (tests compare them bit for bit).
  void set_logits_observer(std::function<void(RequestId, int, std::span<const float>)> fn) {
    logits_observer_ = std::move(fn);
  }

  // Sets the expert caps ([L]; empty: unchanged) and the KV block count (<= 0: unchanged) between
  // steps. Order: the shrinking pool first, so the device budget never holds both. Errors:
  // invalid_argument (a cap or block count out of range, KV below the blocks in use or below what
  // an outstanding request needs), resource_exhausted (the device budget); a failed grow after a
  // successful shrink leaves the shrink in place (the budget holds).
  Status resize_pools(std::span<const int> caps, int kv_blocks);
  // Runs at the start of every step(), before admission (a step boundary: nothing in use).
  void set_step_hook(std::function<Status(Engine&)> fn) { step_hook_ = std::move(fn); }
  KvDemandSample kv_demand() const;
  // Blocks the running requests hold when they finish (prompt + max_new_tokens) plus what the
  // waiting ones will hold beyond the prefix they find cached now (KvCache::
  // cached_prefix_blocks): the working set of MV-WSA's prefix reuse prior (wsa/). It walks every
  // waiting prompt's block hashes, so it is asked at decisions, not sampled every step as
  // kv_demand() is.
  int final_blocks() const;
  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  // The most blocks any outstanding request needs (prompt + max_new_tokens).
  int max_request_blocks() const;

  const EngineStats& stats() const { return stats_; }
  ExpertExecutor& experts() { return *experts_; }
  KvCache& kv() { return *kv_; }
  // The one device budget (KV pool + expert slots / staging); bytes_peak() is the reported peak
  // of what it is charged: resizable pools count their live sizes' exact bytes there.
  const mem::MemoryBudget& device_budget() const { return *device_budget_; }
  // Device-tier memory really held: the budget's charges with each resizable pool's live bytes
  // replaced by its held_bytes() (committed granules: live + less than a granule per layer;
  // kv_cache.h, expert_pager.h; or the whole reservation where the GPU lacks VMM or FERRY_VMM=off,
  // mem/virtual_region.h), and its peak since create() (it changes only at create and
  // resize_pools).
  std::size_t device_held_bytes() const;
  std::size_t device_held_peak_bytes() const { return held_peak_; }
  // Whether a resizable pool holds its whole reservation (no CUDA VMM: mem/virtual_region.h).
  bool pools_backed_up_front() const;
  // Address space the pools are laid out in (a resizable pool's reservation, else its arena).
  std::size_t pool_reserved_bytes() const;
  const EngineConfig& config() const { return cfg_; }
  // True for the CUDA engine; the bytes of weights it holds in GPU memory (0 on the CPU).
  bool on_cuda() const { return streams_ != nullptr; }
  std::size_t device_weight_bytes() const;
  // The CPU engine's bf16 copy of the dense weights (EngineConfig::dense_dtype; host memory, not
  // in the device budget); 0 with f32 dense weights (read in place) and on the CUDA engine.
  std::size_t host_dense_weight_bytes() const { return host_dense_ ? host_dense_->bytes() : 0; }
  // The CUDA engine's transfer engine (its counters: every H2D/D2H byte of the engine); null on
  // the CPU, whose expert copies go through mem::host_transfer_engine().
  // (LinkEngine: also counts graph replays' copies; pace_stats() when link pacing is on.)
  const LinkEngine* transfer_engine() const { return te_.get(); }
  // Host waits on the device so far (runner + expert executor; CUDA engine, 0 on the CPU).
  std::uint64_t host_syncs() const {
    return runner_->host_syncs() + experts_->counters().host_syncs;
  }
  const model::DecoderGeometry& geometry() const { return geo_; }
  // CUDA engine: decode steps run as CUDA graphs (EngineConfig::cuda_graphs); zeros on the CPU.
  const GraphStats& graph_stats() const { return runner_->graph_stats(); }

 private:
  struct Sequence;
  Engine(const model::DecoderGeometry& geo, const model::ModelParams& params,
         const EngineConfig& cfg);
  void admit();
  Status resize_pools_now(std::span<const int> caps, int kv_blocks);
  void note_held() { held_peak_ = std::max(held_peak_, device_held_bytes()); }
  Status grow_for_decode();
  void preempt(std::size_t running_index);
  void finish(Sequence& s, FinishReason r);
  Status after_sample(Sequence& s, std::int32_t token, std::optional<TokenLogprob> lp,
                      std::vector<TokenEvent>& events);
  // Fills row_results_ for this step's rows (V: the vocabulary), on the thread pool.
  void compute_rows(std::size_t V);

  model::DecoderGeometry geo_;
  const model::ModelParams& params_;
  EngineConfig cfg_;
  // CUDA engine: its streams and copy engine, declared first so they outlive everything that
  // queues work on them (a StreamSet synchronizes before it is destroyed).
  std::unique_ptr<mem::StreamSet> streams_;
  std::unique_ptr<LinkEngine> te_;
  // Declared before the components charged to it, so it outlives them.
  std::unique_ptr<mem::MemoryBudget> device_budget_;
  std::unique_ptr<DeviceWeights> weights_;        // CUDA engine only
  std::unique_ptr<HostDenseWeights> host_dense_;  // CPU engine with bf16 dense weights only
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<ExpertExecutor> experts_;
  std::unique_ptr<ModelRunner> runner_;
  std::size_t held_peak_ = 0;  // device_held_bytes()' peak
  RequestId next_id_ = 0;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<TokenEvent> pending_;  // events of requests cancelled while waiting
  std::map<RequestId, RequestOutput> done_;
  StepBatch batch_;
  // One row of logits this step asked for: the row a sequence samples from (prompt_pos -1) or,
  // for prompt scoring, the row at prompt position prompt_pos (it scores token prompt_pos + 1).
  struct LogitRow {
    Sequence* seq = nullptr;
    std::int64_t prompt_pos = -1;
  };
  std::vector<float> logits_;      // [rows, V]: max_running rows, grown for prompt scoring
  std::vector<LogitRow> rows_;     // parallel to batch_.logit_rows
  std::vector<Sequence*> scored_;  // max_new_tokens == 0: prompt computed, finishes unsampled
  // What compute_rows made of each row: a sampled row's token (and its logprob when asked), a
  // scored prompt row's logprob; applied to the sequences in row order afterwards.
  struct RowResult {
    std::int32_t token = -1;
    std::optional<TokenLogprob> logprob;
  };
  std::vector<RowResult> row_results_;
  std::function<void(RequestId, int, std::span<const float>)> logits_observer_;
  std::function<Status(Engine&)> step_hook_;
  EngineStats stats_;
};

}  // namespace ferry::serve
