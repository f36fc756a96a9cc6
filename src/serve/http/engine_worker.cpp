// SPDX-License-Identifier: Apache-2.0
#include "serve/http/engine_worker.h"

#include <algorithm>

#include "core/log.h"

namespace ferry::serve::http {

void RequestChannel::push_token(std::int32_t token, const std::optional<TokenLogprob>& logprob) {
  {
    std::lock_guard lk(mu_);
    tokens_.push_back(token);
    if (logprob) logprobs_.push_back(*logprob);
  }
  cv_.notify_all();
}

void RequestChannel::finish(Result<RequestOutput> out) {
  {
    std::lock_guard lk(mu_);
    output_.emplace(std::move(out));
  }
  cv_.notify_all();
}

RequestChannel::Snapshot RequestChannel::wait(std::size_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return output_.has_value() || tokens_.size() > seen; });
  const std::size_t from = std::min(seen, logprobs_.size());
  return Snapshot{
      tokens_, std::vector<TokenLogprob>(logprobs_.begin() + std::ptrdiff_t(from), logprobs_.end()),
      output_};
}

EngineWorker::EngineWorker(Engine& engine, ServerMetrics* metrics)
    : engine_(engine), metrics_(metrics) {
  if (metrics_) metrics_->kv_blocks_total = engine_.kv().num_blocks();
  thread_ = std::thread([this] { loop(); });
}

EngineWorker::~EngineWorker() { stop(); }

Result<EngineWorker::Submitted> EngineWorker::submit(GenerationRequest request) {
  auto reply = std::make_shared<std::promise<Result<Submitted>>>();
  std::future<Result<Submitted>> fut = reply->get_future();
  {
    std::lock_guard lk(mu_);
    if (stopping_) return unavailable("serve: the engine is stopping");
    commands_.push_back(
        {.kind = Command::Kind::kSubmit, .request = std::move(request), .reply = reply});
  }
  cv_.notify_all();
  return fut.get();
}

void EngineWorker::cancel(RequestId id) {
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    commands_.push_back({.kind = Command::Kind::kCancel, .id = id});
  }
  cv_.notify_all();
}

void EngineWorker::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EngineWorker::loop() {
  for (;;) {
    std::deque<Command> cmds;
    bool stopping = false;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !commands_.empty() || !engine_.idle(); });
      cmds.swap(commands_);
      stopping = stopping_;
    }
    for (Command& c : cmds) {
      if (c.kind == Command::Kind::kSubmit) {
        if (stopping) {
          c.reply->set_value(unavailable("serve: the engine is stopping"));
          continue;
        }
        Result<RequestId> id = engine_.submit(std::move(c.request));
        if (!id.ok()) {
          c.reply->set_value(id.status());
          continue;
        }
        auto ch = std::make_shared<RequestChannel>();
        live_[*id] = {.channel = ch, .last = std::chrono::steady_clock::now()};
        c.reply->set_value(Submitted{*id, ch});
      } else if (live_.count(c.id)) {
        (void)engine_.cancel(c.id);  // not_found when it finished this very step: harmless
      }
    }
    if (stopping) {
      for (auto& [id, live] : live_) (void)engine_.cancel(id);
    }
    if (!engine_.idle()) step_once();
    publish_gauges();
    if (stopping && engine_.idle()) break;
  }
  // Anything left (a failed engine) is released so no handler waits forever.
  for (auto& [id, live] : live_) live.channel->finish(cancelled("serve: the server stopped"));
  live_.clear();
}

void EngineWorker::step_once() {
  Result<std::vector<TokenEvent>> events = engine_.step();
  if (metrics_) ++metrics_->engine_steps;
  if (!events.ok()) {
    // The engine cannot go on; fail every request rather than loop on the error.
    log::get("serve")->error("engine step failed: {}", events.status().message());
    for (auto& [id, live] : live_) {
      (void)engine_.cancel(id);
      live.channel->finish(events.status());
    }
    live_.clear();
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  // Finished requests are handed over after the gauges are published, so a client that reads
  // /metrics right after its answer sees the state after its request.
  std::vector<std::pair<std::shared_ptr<RequestChannel>, Result<RequestOutput>>> finished;
  for (const TokenEvent& ev : *events) {
    auto it = live_.find(ev.id);
    if (it == live_.end()) continue;
    Live& live = it->second;
    if (ev.token >= 0) {
      live.channel->push_token(ev.token, ev.logprob);
      if (metrics_) {
        ++metrics_->generated_tokens;
        const double dt = std::chrono::duration<double>(now - live.last).count();
        (live.got_token ? metrics_->inter_token_s : metrics_->ttft_s).observe(dt);
      }
      live.got_token = true;
      live.last = now;
    }
    if (ev.finish == FinishReason::kNone) continue;
    Result<RequestOutput> out = engine_.take_output(ev.id);
    if (metrics_ && out.ok()) {
      switch (out->finish) {
        case FinishReason::kLength:
          ++metrics_->finish_length;
          break;
        case FinishReason::kCancelled:
          ++metrics_->finish_cancelled;
          break;
        default:
          ++metrics_->finish_stop;
          break;
      }
    }
    finished.emplace_back(live.channel, std::move(out));
    live_.erase(it);
  }
  publish_gauges();
  for (auto& [channel, out] : finished) channel->finish(std::move(out));
}

void EngineWorker::publish_gauges() {
  if (!metrics_) return;
  metrics_->in_flight = static_cast<int>(live_.size());
  metrics_->awaiting_first = static_cast<int>(std::count_if(
      live_.begin(), live_.end(), [](const auto& kv) { return !kv.second.got_token; }));
  metrics_->kv_blocks_used = engine_.kv().used_blocks();
  metrics_->kv_blocks_cached = engine_.kv().cached_blocks();
  metrics_->kv_blocks_total = engine_.kv().num_blocks();  // MV-WSA resizes it live
  metrics_->prefix_query_tokens = engine_.stats().prefix_query_tokens;
  metrics_->prefix_hit_tokens = engine_.stats().prefix_hit_tokens;
  metrics_->preemptions = engine_.stats().preemptions;
  metrics_->recompute_tokens = engine_.stats().recompute_tokens;
  if (const ExpertPager* p = engine_.experts().pager()) {
    metrics_->pager_hits = p->counters().hits;
    metrics_->pager_misses = p->counters().misses;
    metrics_->pager_bytes_copied = p->counters().bytes_copied;
    metrics_->host_computed_misses = engine_.experts().counters().cpu_misses;
    metrics_->bypassed_misses = engine_.experts().counters().bypassed;
  }
}

}  // namespace ferry::serve::http
