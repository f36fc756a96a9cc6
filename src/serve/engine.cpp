// SPDX-License-Identifier: Apache-2.0
#include "serve/engine.h"

#include <algorithm>
#include <limits>

#include "core/thread_pool.h"
#include "serve/pool_tier.h"
#include "serve/stop_strings.h"

namespace ferry::serve {

std::string_view to_string(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

struct Engine::Sequence {
  RequestId id = 0;
  GenerationRequest req;
  std::vector<std::int32_t> tokens;  // prompt, then generated
  std::int64_t prompt_len = 0;
  std::int64_t computed = 0;    // tokens whose K/V are in the cache
  std::int64_t high_water = 0;  // most tokens ever computed (below it: recompute after preemption)
  BlockTable table;
  Rng rng;
  bool cancel = false;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::vector<TokenLogprob> logprobs, prompt_logprobs;  // when the request asks for them
  std::int64_t generated() const { return std::int64_t(tokens.size()) - prompt_len; }
};

Engine::Engine(const model::DecoderGeometry& geo, const model::ModelParams& params,
               const EngineConfig& cfg)
    : geo_(geo), params_(params), cfg_(cfg) {}
Engine::~Engine() {
  // Queued device work still reads the pools, slots and weights destroyed below.
  if (streams_) (void)streams_->synchronize();
}

Result<std::unique_ptr<Engine>> Engine::create(const model::DecoderGeometry& geo,
                                               const model::ModelParams& params,
                                               const EngineConfig& cfg, kernels::Backend& backend) {
  if (cfg.max_running <= 0 || cfg.max_batch_tokens <= 0) {
    return invalid_argument("serve: max_running ({}) and max_batch_tokens ({}) must be positive",
                            cfg.max_running, cfg.max_batch_tokens);
  }
  if (cfg.max_running > cfg.max_batch_tokens) {
    return invalid_argument(
        "serve: max_running {} exceeds max_batch_tokens {} (every running sequence decodes one "
        "token per step)",
        cfg.max_running, cfg.max_batch_tokens);
  }
  std::unique_ptr<Engine> e(new Engine(geo, params, cfg));
  if (e->cfg_.max_seq_len <= 0) e->cfg_.max_seq_len = std::numeric_limits<int>::max();
  const bool cuda = backend.device() == Device::kCuda;
  // The same tier as the pools it covers (pool_tier.h; GPU memory for the CUDA engine).
  e->device_budget_ = std::make_unique<mem::MemoryBudget>(
      cuda ? mem::MemTier::kDevice : cpu_engine_pool_tier(),
      cfg.device_budget_bytes > 0 ? cfg.device_budget_bytes : mem::MemoryBudget::kUnlimited);
  if (!cuda && cfg.link_pace_gbps > 0) {
    return invalid_argument(
        "serve: link_pace_gbps paces the CUDA engine's copy stream; the CPU engine's emulated "
        "link is paced by mem::set_host_link_rate");
  }
  if (cfg.dense_dtype != DType::kF32 && cfg.dense_dtype != DType::kBF16) {
    return invalid_argument("serve: dense weights in f32 or bf16, not {}",
                            to_string(cfg.dense_dtype));
  }
  if (!cuda) {
    // Experts first: with a tight device budget the expert request is the one the error names.
    FERRY_ASSIGN_OR_RETURN(e->experts_,
                           ExpertExecutor::create(geo, params, cfg.pager, e->device_budget_.get()));
    FERRY_ASSIGN_OR_RETURN(e->kv_, KvCache::create(geo, cfg.kv, e->device_budget_.get()));
    // bf16 dense weights: a bf16 copy the runner reads (widening each weight where f32 would be
    // read); f32: the model's own views, read in place.
    if (cfg.dense_dtype != DType::kF32) {
      FERRY_ASSIGN_OR_RETURN(e->host_dense_, HostDenseWeights::create(params, cfg.dense_dtype));
    }
    FERRY_ASSIGN_OR_RETURN(
        e->runner_, ModelRunner::create(geo, e->host_dense_ ? e->host_dense_->params() : params,
                                        *e->kv_, *e->experts_, cfg.max_batch_tokens, backend));
  } else {
    // NOTE(serve): device 0 (the backend interface does not expose its index).
    FERRY_ASSIGN_OR_RETURN(mem::StreamSet ss, mem::StreamSet::create(Device::kCuda, 0));
    e->streams_ = std::make_unique<mem::StreamSet>(std::move(ss));
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<mem::TransferEngine> cuda_te,
                           mem::cuda_transfer_engine(0));
    FERRY_ASSIGN_OR_RETURN(
        e->te_, LinkEngine::create(std::move(cuda_te), {.gbps = cfg.link_pace_gbps,
                                                        .chunk_bytes = cfg.link_pace_chunk_bytes,
                                                        .stream = &e->streams_->h2d()}));
    mem::Stream& compute = e->streams_->compute();
    FERRY_ASSIGN_OR_RETURN(
        e->weights_, DeviceWeights::create(geo, params, cfg.pager.mode == ExpertMode::kResident,
                                           cfg.pager.expert_dtype, cfg.dense_dtype, *e->te_,
                                           compute, e->device_budget_.get()));
    const ExpertDevice dev{.params = &e->weights_->params(),
                           .te = e->te_.get(),
                           .compute = &compute,
                           .copy = &e->streams_->h2d(),
                           .max_tokens = cfg.max_batch_tokens,
                           .pace_gbps = cfg.link_pace_gbps};
    FERRY_ASSIGN_OR_RETURN(
        e->experts_, ExpertExecutor::create(geo, params, cfg.pager, e->device_budget_.get(), &dev));
    FERRY_ASSIGN_OR_RETURN(
        e->kv_, KvCache::create(geo, cfg.kv, e->device_budget_.get(), mem::MemTier::kDevice));
    // KV resizes (MV-WSA) move rows on the compute stream: ordered after the kernels that wrote
    // them and before those that read them next, without a host sync.
    e->kv_->set_device_copier(e->te_.get(), &compute);
    FERRY_ASSIGN_OR_RETURN(
        e->runner_,
        ModelRunner::create_cuda(geo, e->weights_->params(), *e->kv_, *e->experts_,
                                 cfg.max_batch_tokens, backend, e->weights_->inv_freq(), compute,
                                 *e->te_, e->device_budget_.get(), cfg.max_running));
  }
  e->runner_->set_batch_invariant(cfg.batch_invariant);
  e->runner_->set_cuda_graphs(cfg.cuda_graphs);
  e->logits_.resize(std::size_t(cfg.max_running) * std::size_t(geo.vocab));
  e->rows_.reserve(std::size_t(cfg.max_running));
  e->note_held();
  return e;
}

std::size_t Engine::device_held_bytes() const {
  std::size_t held = device_budget_->bytes_used();
  if (kv_ && kv_->resizable()) {
    held += kv_->held_bytes() - std::size_t(kv_->num_blocks()) * kv_->block_bytes();
  }
  const ExpertPager* pager = experts_ ? experts_->pager() : nullptr;
  if (pager != nullptr && pager->resizable()) held += pager->held_bytes() - pager->live_bytes();
  return held;
}

bool Engine::pools_backed_up_front() const {
  const ExpertPager* pager = experts_ ? experts_->pager() : nullptr;
  return (kv_ && kv_->backed_up_front()) || (pager != nullptr && pager->backed_up_front());
}

std::size_t Engine::pool_reserved_bytes() const {
  const ExpertPager* pager = experts_ ? experts_->pager() : nullptr;
  return (kv_ ? kv_->reserved_bytes() : 0) + (pager != nullptr ? pager->reserved_bytes()
                                              : experts_       ? experts_->device_bytes()
                                                               : 0);
}

std::size_t Engine::device_weight_bytes() const { return weights_ ? weights_->bytes() : 0; }

Result<RequestId> Engine::submit(GenerationRequest r) {
  if (r.prompt.empty()) return invalid_argument("serve: empty prompt");
  for (std::size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= geo_.vocab) {
      return invalid_argument(
          "serve: prompt token {} at position {} is outside the vocabulary of {}", r.prompt[i], i,
          geo_.vocab);
    }
  }
  for (const auto& [what, n] : {std::pair<const char*, int>{"logprobs", r.logprobs},
                                {"prompt_logprobs", r.prompt_logprobs}}) {
    if (n < -1 || n > kMaxTopLogprobs) {
      return invalid_argument("serve: {} must be -1 (off) or in [0, {}], got {}", what,
                              kMaxTopLogprobs, n);
    }
  }
  if (r.max_new_tokens < 0 || (r.max_new_tokens == 0 && r.prompt_logprobs < 0)) {
    return invalid_argument(
        "serve: max_new_tokens must be positive (0 only to score a prompt with prompt_logprobs), "
        "got {}",
        r.max_new_tokens);
  }
  FERRY_TRY(validate(r.sampling));
  FERRY_TRY(validate(r.sampling.penalties, geo_.vocab));
  if (!r.stop_strings.empty() && !r.detokenize) {
    return invalid_argument("serve: stop strings need a detokenizer");
  }
  const std::int64_t total = std::int64_t(r.prompt.size()) + r.max_new_tokens;
  if (total > cfg_.max_seq_len) {
    return invalid_argument("serve: prompt of {} + {} new tokens exceeds the {} positions allowed",
                            r.prompt.size(), r.max_new_tokens, cfg_.max_seq_len);
  }
  if (kv_->blocks_for(total) > kv_->num_blocks()) {
    return resource_exhausted("serve: request needs {} KV blocks, the whole pool has {}",
                              kv_->blocks_for(total), kv_->num_blocks());
  }
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->prompt_len = std::int64_t(r.prompt.size());
  s->tokens = r.prompt;
  s->rng = Rng(r.sampling.seed.has_value()
                   ? *r.sampling.seed
                   : cfg_.seed ^ (0x9E3779B97F4A7C15ull * std::uint64_t(s->id + 1)));
  s->req = std::move(r);
  s->tokens.reserve(std::size_t(total));
  const RequestId id = s->id;
  waiting_.push_back(std::move(s));
  return id;
}

Status Engine::cancel(RequestId id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id != id) continue;
    done_[id] = RequestOutput{.finish = FinishReason::kCancelled};
    pending_.push_back({.id = id, .token = -1, .index = 0, .finish = FinishReason::kCancelled});
    waiting_.erase(it);
    return ok_status();
  }
  for (auto& s : running_) {
    if (s->id == id) {
      s->cancel = true;
      return ok_status();
    }
  }
  return not_found("serve: no running or waiting request {}", id);
}

void Engine::admit() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < cfg_.max_running) {
    Sequence& s = *waiting_.front();
    // kv_preempt: what the next steps compute (the prompt, or everything to recompute).
    const std::int64_t need =
        cfg_.kv_preempt ? std::int64_t(s.tokens.size()) : s.prompt_len + s.req.max_new_tokens;
    // Prefix cache: the longest cached block-aligned prefix is taken as computed. Not for prompt
    // scoring, which needs the logits of every prompt position.
    const int matched = s.req.prompt_logprobs >= 0 ? 0 : kv_->match_prefix(s.table, s.tokens);
    if (!kv_->reserve(s.table, need).ok()) {
      kv_->release(s.table);  // the matched blocks stay cached
      break;                  // FIFO: wait for blocks, no overtaking
    }
    s.computed = std::int64_t(matched) * kv_->block_tokens();
    if (kv_->prefix_cache()) kv_->report_lookup(s.table);
    stats_.prefix_query_tokens += s.tokens.size();
    stats_.prefix_hit_tokens += std::uint64_t(s.computed);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  stats_.kv_blocks = kv_->num_blocks() - kv_->free_blocks();
  stats_.kv_blocks_peak = std::max(stats_.kv_blocks_peak, stats_.kv_blocks);
}

void Engine::preempt(std::size_t i) {
  std::unique_ptr<Sequence> s = std::move(running_[i]);
  running_.erase(running_.begin() + std::ptrdiff_t(i));
  stats_.preempted_blocks_last_step += static_cast<int>(s->table.blocks.size());
  kv_->release(s->table);
  s->computed = 0;
  ++stats_.preemptions;
  // Back to the head of the queue: preempted in youngest-first order, so older ones end first.
  waiting_.push_front(std::move(s));
}

Status Engine::grow_for_decode() {
  if (!cfg_.kv_preempt) return ok_status();
  for (std::size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    if (s.computed < s.prompt_len || std::int64_t(s.tokens.size()) - s.computed != 1) continue;
    while (!kv_->reserve(s.table, s.computed + 1).ok()) {
      // The youngest running request gives its blocks back; that may be this one (then the loop
      // has nothing after it). Alone it always fits: submit() checked its total against the pool
      // and resize_pools() never goes below an outstanding request's need.
      const std::size_t victim = running_.size() - 1;
      FERRY_CHECK(running_.size() > 1, "serve: a lone request cannot grow its kv ({} blocks)",
                  kv_->num_blocks());
      preempt(victim);
      if (victim == i) break;
    }
  }
  return ok_status();
}

int Engine::max_request_blocks() const {
  int m = 0;
  auto need = [&](const Sequence& s) {
    m = std::max(m, kv_->blocks_for(s.prompt_len + s.req.max_new_tokens));
  };
  for (const auto& s : running_) need(*s);
  for (const auto& s : waiting_) need(*s);
  return m;
}

KvDemandSample Engine::kv_demand() const {
  KvDemandSample d;
  d.used = kv_->used_blocks();
  d.preempted = stats_.preempted_blocks_last_step;
  int slots = cfg_.max_running - static_cast<int>(running_.size());
  for (const auto& s : waiting_) {
    if (slots-- <= 0) break;
    const std::int64_t need =
        cfg_.kv_preempt ? std::int64_t(s->tokens.size()) : s->prompt_len + s->req.max_new_tokens;
    d.waiting_need += kv_->blocks_for(need);
  }
  return d;
}

int Engine::final_blocks() const {
  int n = 0;
  for (const auto& s : running_) n += kv_->blocks_for(s->prompt_len + s->req.max_new_tokens);
  for (const auto& s : waiting_) {
    // What it will hold once run, less the prefix it will find cached (those blocks are the
    // reuse prior's pending already): a new session's prompt counts, a next turn's history
    // does not. (Counting only max_new_tokens left a queue of new sessions out of the working
    // set: on the 48-layer agentic run the prior saw 418 of ~620 blocks, below the KV floor,
    // and live gave the cache away at its first decision; docs/serve_wsa.md, session 37.)
    n += kv_->blocks_for(s->prompt_len + s->req.max_new_tokens) -
         kv_->cached_prefix_blocks(s->tokens);
  }
  return n;
}

Status Engine::resize_pools(std::span<const int> caps, int kv_blocks) {
  // The held peak is at either end: the shrinking side goes first.
  const Status st = resize_pools_now(caps, kv_blocks);
  note_held();
  return st;
}

Status Engine::resize_pools_now(std::span<const int> caps, int kv_blocks) {
  const bool kv_change = kv_blocks > 0 && kv_blocks != kv_->num_blocks();
  if (kv_change && kv_blocks < max_request_blocks()) {
    return invalid_argument(
        "serve: kv resize to {} blocks is below the {} an outstanding request "
        "needs",
        kv_blocks, max_request_blocks());
  }
  std::vector<BlockTable*> tables;
  for (auto& s : running_) tables.push_back(&s->table);
  for (auto& s : waiting_) {
    if (!s->table.blocks.empty()) tables.push_back(&s->table);
  }
  const bool kv_shrinks = kv_change && kv_blocks < kv_->num_blocks();
  if (kv_shrinks) FERRY_TRY(kv_->resize(kv_blocks, tables));
  if (!caps.empty()) FERRY_TRY(experts_->resize_caps(caps));
  if (kv_change && !kv_shrinks) FERRY_TRY(kv_->resize(kv_blocks, tables));
  ++stats_.pool_resizes;
  return ok_status();
}

void Engine::finish(Sequence& s, FinishReason r) {
  s.finish = r;
  kv_->release(s.table);
  RequestOutput out;
  out.tokens.assign(s.tokens.begin() + s.prompt_len, s.tokens.end());
  out.text = std::move(s.text);
  out.finish = r;
  out.logprobs = std::move(s.logprobs);
  out.prompt_logprobs = std::move(s.prompt_logprobs);
  done_[s.id] = std::move(out);
}

Status Engine::after_sample(Sequence& s, std::int32_t token, std::optional<TokenLogprob> lp,
                            std::vector<TokenEvent>& events) {
  s.tokens.push_back(token);
  if (lp) s.logprobs.push_back(*lp);
  const int index = static_cast<int>(s.generated() - 1);
  FinishReason fin = FinishReason::kNone;
  if (std::find(s.req.stop_token_ids.begin(), s.req.stop_token_ids.end(), token) !=
      s.req.stop_token_ids.end()) {
    fin = FinishReason::kStopToken;
  }
  if (s.req.detokenize) {
    FERRY_ASSIGN_OR_RETURN(std::string text,
                           s.req.detokenize(std::span<const std::int32_t>(
                               s.tokens.data() + s.prompt_len, std::size_t(s.generated()))));
    std::swap(s.text, text);  // text: the previous step's, which held no stop string
    if (fin == FinishReason::kNone && !s.req.stop_strings.empty()) {
      const std::size_t cut = first_stop_match(text, s.text, s.req.stop_strings);
      if (cut != std::string::npos) {
        s.text.resize(cut);
        fin = FinishReason::kStopString;
      }
    }
  }
  if (fin == FinishReason::kNone && s.generated() >= s.req.max_new_tokens) {
    fin = FinishReason::kLength;
  }
  events.push_back(
      {.id = s.id, .token = token, .index = index, .finish = fin, .logprob = std::move(lp)});
  if (fin != FinishReason::kNone) finish(s, fin);
  return ok_status();
}

Result<std::vector<TokenEvent>> Engine::step() {
  std::vector<TokenEvent> events = std::move(pending_);
  pending_.clear();
  for (auto& s : running_) {
    if (s->cancel) {
      finish(*s, FinishReason::kCancelled);
      events.push_back({.id = s->id,
                        .token = -1,
                        .index = int(s->generated()),
                        .finish = FinishReason::kCancelled});
    }
  }
  std::erase_if(running_, [](const auto& s) { return s->finish != FinishReason::kNone; });
  if (step_hook_) FERRY_TRY(step_hook_(*this));
  stats_.preempted_blocks_last_step = 0;
  FERRY_TRY(grow_for_decode());
  admit();
  if (running_.empty()) return events;

  // Decode tokens first (one per sequence past its prompt), then prompt chunks.
  batch_.clear();
  rows_.clear();  // parallel to batch_.logit_rows
  scored_.clear();
  std::int64_t budget = cfg_.max_batch_tokens;
  auto add = [&](Sequence& s, std::int64_t n) {
    const auto seq = static_cast<std::int32_t>(batch_.tables.size());
    batch_.tables.push_back(&s.table);
    batch_.requests.push_back(s.id);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t pos = s.computed + i;
      batch_.ids.push_back(s.tokens[pos]);
      batch_.positions.push_back(static_cast<std::int32_t>(pos));
      batch_.seq_of.push_back(seq);
      // Prompt scoring: position pos scores prompt token pos + 1 (once: a recompute after a
      // preemption does not score again).
      if (s.req.prompt_logprobs >= 0 && pos + 1 < s.prompt_len &&
          pos >= std::int64_t(s.prompt_logprobs.size())) {
        batch_.logit_rows.push_back(static_cast<std::int32_t>(batch_.ids.size() - 1));
        rows_.push_back({.seq = &s, .prompt_pos = pos});
      }
    }
    (s.computed >= s.prompt_len ? stats_.decode_tokens : stats_.prefill_tokens) += n;
    stats_.recompute_tokens += std::uint64_t(
        std::max<std::int64_t>(0, std::min(s.computed + n, s.high_water) - s.computed));
    s.computed += n;
    s.high_water = std::max(s.high_water, s.computed);
    budget -= n;
    if (s.computed == std::int64_t(s.tokens.size())) {
      if (s.generated() == 0 && s.req.max_new_tokens == 0) {
        scored_.push_back(&s);  // only scoring its prompt: nothing to sample
      } else {
        batch_.logit_rows.push_back(static_cast<std::int32_t>(batch_.ids.size() - 1));
        rows_.push_back({.seq = &s});
      }
    }
  };
  // Decoding: past the prompt with one token to compute. Everything else is a prompt chunk (or,
  // after a preemption, a chunk of the prompt and generated tokens being recomputed).
  auto decoding = [](const Sequence& s) {
    return s.computed >= s.prompt_len && std::int64_t(s.tokens.size()) - s.computed == 1;
  };
  for (auto& s : running_) {
    if (decoding(*s)) add(*s, 1);
  }
  // (A sequence decoded above has nothing left to compute: pending == 0.)
  for (auto& s : running_) {
    const std::int64_t pending = std::int64_t(s->tokens.size()) - s->computed;
    if (pending > 0 && !decoding(*s) && budget > 0) add(*s, std::min(budget, pending));
  }
  const std::int64_t T = batch_.tokens();
  const std::size_t V = std::size_t(geo_.vocab);
  if (logits_.size() < rows_.size() * V) logits_.resize(rows_.size() * V);  // prompt scoring
  FERRY_TRY(runner_->forward(batch_, logits_.data()));
  // Blocks this step filled get their prefix-cache identity (no-op without the prefix cache).
  for (auto& s : running_) kv_->commit_full_blocks(s->table, s->tokens, s->computed);
  ++stats_.steps;
  stats_.max_step_tokens = std::max<std::uint64_t>(stats_.max_step_tokens, T);
  compute_rows(V);
  for (std::size_t r = 0; r < rows_.size(); ++r) {
    Sequence& s = *rows_[r].seq;
    RowResult& res = row_results_[r];
    if (rows_[r].prompt_pos >= 0) {
      s.prompt_logprobs.push_back(std::move(*res.logprob));
      continue;
    }
    if (logits_observer_) {
      logits_observer_(s.id, static_cast<int>(s.generated()),
                       std::span<const float>(logits_.data() + r * V, V));
    }
    FERRY_TRY(after_sample(s, res.token, std::move(res.logprob), events));
  }
  for (Sequence* s : scored_) {
    events.push_back({.id = s->id, .token = -1, .index = 0, .finish = FinishReason::kLength});
    finish(*s, FinishReason::kLength);
  }
  std::erase_if(running_, [](const auto& s) { return s->finish != FinishReason::kNone; });
  return events;
}

namespace {
// One pool thread's scratch for the rows it computes, kept across steps (no allocation per row).
struct RowScratch {
  std::vector<float> penalized;  // [V]: a row with its request's penalties applied
  PenaltyScratch penalty;
  std::vector<std::pair<std::int32_t, double>> sample;
  LogprobScratch logprob;
};
}  // namespace

void Engine::compute_rows(std::size_t V) {
  // Each row is a pass or two over the vocabulary (~1 ms at 152k ids: a sampled token's softmax
  // weights, a scored prompt token's log-sum-exp) that reads only its own logits and its
  // sequence; a sampled row advances its sequence's Rng, and a sequence has one sampled row per
  // step. So the rows run on the thread pool, each with its thread's scratch, and the step applies
  // the results in row order afterwards: the same tokens and bits as one row at a time.
  row_results_.assign(rows_.size(), RowResult{});
  auto compute = [&](std::size_t begin, std::size_t end) {
    thread_local RowScratch scratch;
    for (std::size_t r = begin; r < end; ++r) {
      const LogitRow& lr = rows_[r];
      Sequence& s = *lr.seq;
      const std::span<const float> row(logits_.data() + r * V, V);
      if (lr.prompt_pos >= 0) {
        const std::int32_t next = s.tokens[std::size_t(lr.prompt_pos + 1)];
        row_results_[r].logprob = token_logprob(row, next, s.req.prompt_logprobs, scratch.logprob);
        continue;
      }
      std::span<const float> sample_row = row;
      if (s.req.sampling.penalties.active()) {  // on a copy: logprobs stay the model's
        scratch.penalized.assign(row.begin(), row.end());
        const std::span<const std::int32_t> all(s.tokens);
        apply_penalties(scratch.penalized, s.req.sampling.penalties,
                        all.first(std::size_t(s.prompt_len)),
                        all.subspan(std::size_t(s.prompt_len)), scratch.penalty);
        sample_row = scratch.penalized;
      }
      const std::int32_t token = sample(sample_row, s.req.sampling, s.rng, scratch.sample);
      row_results_[r].token = token;
      if (s.req.logprobs >= 0) {
        row_results_[r].logprob = token_logprob(row, token, s.req.logprobs, scratch.logprob);
      }
    }
  };
  // Waking the pool costs tens of microseconds: worth it for a long prompt's scored rows or for
  // several rows of a real vocabulary, not for a few rows of a small one.
  const bool pooled = rows_.size() >= 2 && (rows_.size() >= 16 || rows_.size() * V >= (1u << 17));
  if (!pooled) {
    compute(0, rows_.size());
    return;
  }
  ThreadPool::global().parallel_for(rows_.size(), compute);
}

Status Engine::run_until_idle() {
  while (!idle()) FERRY_TRY(step().status());
  return ok_status();
}

Result<RequestOutput> Engine::take_output(RequestId id) {
  auto it = done_.find(id);
  if (it == done_.end()) return not_found("serve: request {} has not finished", id);
  RequestOutput out = std::move(it->second);
  done_.erase(it);
  return out;
}

}  // namespace ferry::serve
