// SPDX-License-Identifier: Apache-2.0
// The edge agent's frame loop, offload workers and ρ poller (see agent.h). The summary (AP of the
// produced detections vs weak-only and strong-only) is computed in agent_summary.cpp.
#include "route/agent.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "core/log.h"
#include "route/controller.h"
#include "route/transport/http_client.h"
#include "route/transport/kserve.h"

namespace ferry::route {

Status validate(const AgentOptions& o) {
  if (!o.rho_auto && !(o.rho >= 0 && o.rho <= 1))
    return invalid_argument("route agent: rho {} outside [0, 1]", o.rho);
  if (o.rho_auto && !(o.fps > 0))
    return invalid_argument(
        "route agent: rho auto needs fps > 0 (the demand reported to the server)");
  if (!(o.deadline_ms > 0)) return invalid_argument("route agent: deadline_ms must be > 0");
  if (o.fps < 0 || o.frames < 0 || o.weak_ms < 0 || o.feedback_gain < 0)
    return invalid_argument("route agent: negative fps/frames/weak_ms/gain");
  if (o.concurrency < 1 || o.concurrency > 1024)
    return invalid_argument("route agent: concurrency {} outside [1, 1024]", o.concurrency);
  if (o.frame_bytes > kserve::kMaxImageBytes)
    return invalid_argument("route agent: frame_bytes {} over {}", o.frame_bytes,
                            kserve::kMaxImageBytes);
  if (!(o.rho_poll_ms > 0)) return invalid_argument("route agent: rho_poll_ms must be > 0");
  FERRY_TRY(parse_http_url(o.server_url).status());
  return ok_status();
}

// Defined in agent_summary.cpp.
Status summarise(const RecordSet& split, int n, const std::vector<std::vector<Detection>>& produced,
                 AgentSummary& s);

namespace {

using Clock = std::chrono::steady_clock;
enum class Outcome : std::uint8_t { kPending, kLocal, kOk, kFallback };
const char* const kReasons[] = {"timeout", "unavailable", "rejected", "error", "late", "busy"};

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
void sleep_ms(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}
std::int64_t to_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

struct FrameSlot {
  Outcome outcome = Outcome::kPending;
  Placement placement = Placement::kCond;
  bool offload = false, weak_done = false;
  Clock::time_point arrival;
  double latency_ms = 0;
  std::string reason;
  std::vector<Detection> dets;  // what the agent produced for this frame
  int worker = -1, http_status = 0;
  std::int64_t send_ns = 0, reply_ns = 0, done_ns = 0;
};

struct Metrics {
  PromCounter *local = nullptr, *ok = nullptr, *fallback = nullptr;
  std::map<std::string, PromCounter*> reasons;
  PromGauge *rho = nullptr, *realised = nullptr;
  PromHistogram *latency = nullptr, *offload_latency = nullptr;
  explicit Metrics(PromRegistry* r) {
    if (!r) return;
    const std::string f = "ferry_route_agent_frames_total", fh = "frames by outcome";
    local = &r->counter(f, fh, R"(outcome="local")");
    ok = &r->counter(f, fh, R"(outcome="offloaded_ok")");
    fallback = &r->counter(f, fh, R"(outcome="offloaded_fallback")");
    for (const char* why : kReasons) {
      reasons[why] = &r->counter("ferry_route_agent_fallbacks_total", "fallbacks by reason",
                                 fmt::format("reason=\"{}\"", why));
    }
    rho = &r->gauge("ferry_route_agent_rho", "current offload budget");
    realised = &r->gauge("ferry_route_agent_realised_rho", "offloaded / frames so far");
    latency = &r->histogram("ferry_route_agent_frame_latency_seconds", "arrival to result",
                            exponential_buckets(0.0005, 2, 14));
    offload_latency =
        &r->histogram("ferry_route_agent_offload_latency_seconds", "offloaded frames, in time",
                      exponential_buckets(0.0005, 2, 14));
  }
};

class Agent {
 public:
  Agent(const RecordSet& split, const TunedRouter& router, const AgentOptions& o, PromRegistry* reg)
      : split_(split), router_(router), o_(o), m_(reg), ep_(*parse_http_url(o.server_url)) {
    for (const Detection& d : split.weak) weak_[d.frame].push_back(d);
  }

  Result<AgentSummary> run(int n) {
    slots_.assign(static_cast<std::size_t>(n), FrameSlot{});
    double gain = o_.feedback_gain;
    if (gain <= 0) {
      const double x = 0.01 * n - 1.0;
      gain = x <= 0 ? 1.0 : std::clamp(1.0 / x, 0.02, 1.0);
    }
    FeedbackController skip(router_.skip_calibration, gain), cond(router_.cond_calibration, gain);
    const auto& skip_scores = split_.scores.at(router_.skip_column);
    const auto& cond_scores = split_.scores.at(router_.cond_column);
    rho_.store(o_.rho_auto ? 0.0 : o_.rho);
    if (o_.rho_auto) {
      poll_rho();
      poller_ = std::thread([this] { poll_loop(); });
    }
    job_.assign(static_cast<std::size_t>(o_.concurrency), -1);
    wake_ = std::make_unique<std::condition_variable[]>(static_cast<std::size_t>(o_.concurrency));
    for (int w = o_.concurrency - 1; w >= 0; --w) idle_.push_back(w);  // worker 0 on top
    for (int w = 0; w < o_.concurrency; ++w) workers_.emplace_back([this, w] { work(w); });

    const auto start = Clock::now();
    double rho_sum = 0;
    int offloaded = 0;
    for (int i = 0; i < n; ++i) {
      if (o_.fps > 0)
        std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(i / o_.fps)));
      FrameSlot& s = slots_[i];
      s.arrival = Clock::now();
      const double rho = rho_.load();
      rho_sum += rho;
      if (m_.rho) m_.rho->set(rho);
      s.placement = router_.table.placement(rho);
      if (s.placement == Placement::kCond) {
        run_weak(i);  // conditioned: the weak pass is paid first, its detections feed the score
        s.offload = cond.decide(cond_scores[i], rho);
      } else {
        s.offload = skip.decide(skip_scores[i], rho);
      }
      offloaded += s.offload;
      if (m_.realised) m_.realised->set(static_cast<double>(offloaded) / (i + 1));
      if (!s.offload) {
        if (!s.weak_done) run_weak(i);
        finish(i, Outcome::kLocal, "");
      } else if (!submit(i)) {
        fallback(i, "busy");
      }
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      stop_ = true;
    }
    for (int w = 0; w < o_.concurrency; ++w) wake_[static_cast<std::size_t>(w)].notify_all();
    for (auto& t : workers_) t.join();
    if (poller_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(poll_mu_);
        poll_stop_ = true;
      }
      poll_cv_.notify_all();
      poller_.join();
    }
    AgentSummary sum;
    sum.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
    sum.frames = n;
    sum.target_rho = n ? rho_sum / n : 0;
    for (const char* why : kReasons) sum.fallback_reasons[why] = 0;
    std::vector<double> lat, off_lat;
    std::vector<std::vector<Detection>> produced(slots_.size());
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      FrameSlot& s = slots_[i];
      FERRY_CHECK(s.outcome != Outcome::kPending, "route agent: frame {} never finished", i);
      (s.placement == Placement::kSkip ? sum.skip_frames : sum.cond_frames)++;
      if (s.outcome == Outcome::kLocal) ++sum.local;
      if (s.outcome == Outcome::kOk) ++sum.offloaded_ok, off_lat.push_back(s.latency_ms);
      if (s.outcome == Outcome::kFallback)
        ++sum.offloaded_fallback, ++sum.fallback_reasons[s.reason];
      lat.push_back(s.latency_ms);
      produced[i] = std::move(s.dets);
      sum.trace.push_back({split_.frames[i], s.worker, s.offload, to_ns(s.arrival), s.send_ns,
                           s.reply_ns, s.done_ns, s.http_status,
                           s.outcome == Outcome::kLocal ? "local"
                           : s.outcome == Outcome::kOk  ? "ok"
                                                        : s.reason});
    }
    sum.realised_rho = n ? static_cast<double>(offloaded) / n : 0;
    sum.served_rho = n ? static_cast<double>(sum.offloaded_ok) / n : 0;
    sum.latency_ms = latency_stats(lat);
    sum.offload_latency_ms = latency_stats(off_lat);
    FERRY_TRY(summarise(split_, n, produced, sum));
    return sum;
  }

 private:
  void run_weak(int i) {
    sleep_ms(o_.weak_ms);
    FrameSlot& s = slots_[i];
    auto it = weak_.find(split_.frames[i]);
    s.dets = it == weak_.end() ? std::vector<Detection>{} : it->second;
    s.weak_done = true;
  }
  void finish(int i, Outcome out, std::string reason) {
    FrameSlot& s = slots_[i];
    s.outcome = out;
    s.reason = std::move(reason);
    s.latency_ms = ms_since(s.arrival);
    s.done_ns = now_ns();
    const double sec = s.latency_ms / 1000.0;
    if (m_.latency) m_.latency->observe(sec);
    if (out == Outcome::kLocal && m_.local) m_.local->inc();
    if (out == Outcome::kOk && m_.ok) m_.ok->inc(), m_.offload_latency->observe(sec);
    if (out == Outcome::kFallback && m_.fallback) m_.fallback->inc(), m_.reasons[s.reason]->inc();
  }
  void fallback(int i, const char* reason) {
    if (!slots_[i].weak_done) run_weak(i);  // skip placement: the weak pass runs only now
    finish(i, Outcome::kFallback, reason);
  }
  // With a frame rate, a saturated pool means the frame falls back now (the stream cannot wait);
  // without one (throughput mode) the loop waits for a free worker.
  // The job goes to the most recently idle worker (a LIFO stack), so offloads reuse the few
  // connections that are already warm and the number of open keep-alive connections follows the
  // peak number of requests in flight, not `concurrency`. Handing jobs to any idle worker instead
  // rotated them over all `concurrency` connections; cpp-httplib serves each keep-alive
  // connection on one thread until it idles out (5 s), so connections beyond the server's thread
  // pool were never read and their frames missed the deadline (docs/route_system.md).
  bool submit(int i) {
    std::unique_lock<std::mutex> lock(mu_);
    if (o_.fps <= 0) free_cv_.wait(lock, [&] { return !idle_.empty(); });
    if (idle_.empty()) return false;
    const int w = idle_.back();
    idle_.pop_back();
    job_[static_cast<std::size_t>(w)] = i;
    lock.unlock();
    wake_[static_cast<std::size_t>(w)].notify_one();
    return true;
  }
  void work(int w) {
    HttpClient cli(ep_, o_.deadline_ms);
    const std::string path = fmt::format("/v2/models/{}/infer", o_.model);
    const auto slot = static_cast<std::size_t>(w);
    while (true) {
      int i;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_[slot].wait(lock, [&] { return stop_ || job_[slot] >= 0; });
        if (job_[slot] < 0) return;  // stopping, nothing assigned
        i = job_[slot];
      }
      slots_[static_cast<std::size_t>(i)].worker = w;
      offload(cli, path, i);
      std::lock_guard<std::mutex> lock(mu_);
      job_[slot] = -1;
      idle_.push_back(w);
      free_cv_.notify_one();
    }
  }
  void offload(HttpClient& cli, const std::string& path, int i) {
    FrameSlot& s = slots_[i];
    const double left_ms = o_.deadline_ms - ms_since(s.arrival);
    if (left_ms <= 0) return fallback(i, "late");
    cli.set_timeout_ms(left_ms);
    const std::string id = fmt::format("{}-{}", o_.client, i);
    const int frame = split_.frames[i];
    // The body is built before send_ns, so the trace's send time is when the bytes start to go.
    Result<HttpReply> r = [&]() -> Result<HttpReply> {
      if (o_.binary_upload) {
        kserve::BinaryRequest b =
            kserve::encode_frame_request_binary(id, frame, o_.frame_bytes, o_.client, o_.fps);
        s.send_ns = now_ns();
        return cli.post(path, b.body, "application/octet-stream",
                        {{kserve::kHeaderLengthHeader, std::to_string(b.header_length)}});
      }
      const std::string body =
          kserve::encode_frame_request(id, frame, o_.frame_bytes, o_.client, o_.fps);
      s.send_ns = now_ns();
      return cli.post(path, body);
    }();
    s.reply_ns = now_ns();
    if (r.ok()) s.http_status = r->status;
    if (!r.ok()) {
      const StatusCode c = r.status().code();
      return fallback(i, c == StatusCode::kUnavailable        ? "unavailable"
                         : c == StatusCode::kDeadlineExceeded ? "timeout"
                                                              : "error");
    }
    if (o_.rho_auto && !r->rho.empty()) note_rho(r->rho);
    if (r->status == 503) return fallback(i, "rejected");
    if (r->status != 200) {
      log::get("router")->debug("route agent: frame {} http {}: {}", frame, r->status, r->body);
      return fallback(i, "error");
    }
    Result<std::vector<Detection>> d = kserve::decode_detections(r->body, id, frame);
    if (!d.ok()) return fallback(i, "error");
    if (ms_since(s.arrival) > o_.deadline_ms) return fallback(i, "late");
    s.dets = std::move(*d);
    finish(i, Outcome::kOk, "");
  }
  void note_rho(const std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end != text.c_str() && *end == '\0' && v >= 0 && v <= 1) rho_.store(v);
  }
  void poll_rho() {
    HttpClient cli(ep_, std::max(50.0, o_.rho_poll_ms));
    Result<HttpReply> r =
        cli.get(fmt::format("/v2/models/{}?client={}&stream_fps={}", o_.model, o_.client, o_.fps));
    if (!r.ok() || r->status != 200) {
      rho_.store(0.0);  // server unreachable: everything stays local until it answers
      return;
    }
    auto j = parse_json(r->body, "model metadata");
    if (j.ok() && j->contains("parameters") && (*j)["parameters"].is_object() &&
        (*j)["parameters"].contains("sustainable_rho") &&
        (*j)["parameters"]["sustainable_rho"].is_number()) {
      rho_.store(std::clamp((*j)["parameters"]["sustainable_rho"].get<double>(), 0.0, 1.0));
    }
  }
  void poll_loop() {
    std::unique_lock<std::mutex> lock(poll_mu_);
    while (!poll_cv_.wait_for(lock, std::chrono::duration<double, std::milli>(o_.rho_poll_ms),
                              [&] { return poll_stop_; })) {
      lock.unlock();
      poll_rho();
      lock.lock();
    }
  }

  const RecordSet& split_;
  const TunedRouter& router_;
  const AgentOptions o_;
  Metrics m_;
  HttpEndpoint ep_;
  std::unordered_map<int, std::vector<Detection>> weak_;
  std::vector<FrameSlot> slots_;  // [n]; slot i is written by one thread at a time
  std::atomic<double> rho_{0};
  std::mutex mu_;  // guards idle_, job_, stop_
  std::condition_variable free_cv_;
  std::unique_ptr<std::condition_variable[]> wake_;  // [concurrency], one per worker
  std::vector<int> idle_;                            // idle workers; back = most recent
  std::vector<int> job_;                             // [concurrency] frame assigned, -1 none
  bool stop_ = false;
  std::vector<std::thread> workers_;
  std::mutex poll_mu_;
  std::condition_variable poll_cv_;
  bool poll_stop_ = false;
  std::thread poller_;
};

}  // namespace

Result<AgentSummary> run_agent(const RecordSet& split, const TunedRouter& router,
                               const AgentOptions& opts, PromRegistry* metrics) {
  FERRY_TRY(validate(opts));
  for (const std::string* col : {&router.skip_column, &router.cond_column}) {
    if (!split.scores.count(*col))
      return invalid_argument("route agent: records have no score column '{}'", *col);
  }
  if (router.skip_calibration.empty() || router.cond_calibration.empty())
    return invalid_argument("route agent: router has empty calibration scores");
  const int total = static_cast<int>(split.frames.size());
  const int n = opts.frames > 0 ? std::min(opts.frames, total) : total;
  if (n == 0) return invalid_argument("route agent: no frames to stream");
  Agent a(split, router, opts, metrics);
  return a.run(n);
}

}  // namespace ferry::route
