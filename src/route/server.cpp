// SPDX-License-Identifier: Apache-2.0
// The route cloud server's HTTP surface over cpp-httplib (see server.h): KServe v2 routes,
// admission → batcher → JSON reply, demand tracking for the published ρ, and /metrics.
#include "route/server.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <httplib.h>

#include "core/log.h"
#include "route/metrics_prom.h"
#include "route/transport/http_listener.h"
#include "route/transport/kserve.h"

namespace ferry::route {

Status validate(const ServerOptions& o) {
  const BatcherOptions& b = o.batcher;
  if (o.port < 0 || o.port > 65535) return invalid_argument("route server: bad port {}", o.port);
  if (b.max_batch < 1 || b.max_queue < 1)
    return invalid_argument("route server: max_batch and max_queue must be >= 1");
  if (b.batch_timeout_ms < 0 || b.capacity_fps < 0 || b.batch_base_ms < 0 || b.per_frame_ms < 0)
    return invalid_argument("route server: negative timing option");
  if (!(o.headroom > 0 && o.headroom <= 1))
    return invalid_argument("route server: headroom must be in (0, 1]");
  if (o.model.empty() || o.model.find('/') != std::string::npos)
    return invalid_argument("route server: bad model name '{}'", o.model);
  return ok_status();
}

int default_http_threads(const BatcherOptions& b) { return std::max(64, 2 * b.max_batch + 4); }

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kDemandWindowS = 5.0;

// Sum of the frame rates clients reported recently.
class DemandTracker {
 public:
  void note(const std::string& client, double fps) {
    if (fps <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    seen_[client] = {fps, Clock::now()};
  }
  double demand_fps() {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    double sum = 0;
    for (auto it = seen_.begin(); it != seen_.end();) {
      if (std::chrono::duration<double>(now - it->second.second).count() > kDemandWindowS) {
        it = seen_.erase(it);
      } else {
        sum += it->second.first;
        ++it;
      }
    }
    return sum;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::pair<double, Clock::time_point>> seen_;
};

// cpp-httplib runs each accepted connection as one task that keeps its thread until the
// connection closes (keep-alive included: up to 5 s idle), so a connection queued here has no
// thread and its requests are not read at all, whatever admission control would say. Counting
// both makes that visible: ferry_route_server_http_connections{state="active"|"waiting"}.
class CountingPool : public httplib::TaskQueue {
 public:
  CountingPool(std::size_t threads, PromGauge* active, PromGauge* waiting)
      : pool_(threads), active_(active), waiting_(waiting) {}
  void enqueue(std::function<void()> fn) override {
    waiting_->add(1);
    pool_.enqueue([this, fn = std::move(fn)] {
      waiting_->add(-1);
      active_->add(1);
      fn();
      active_->add(-1);
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  httplib::ThreadPool pool_;
  PromGauge *active_, *waiting_;
};

}  // namespace

struct DetectionServer::Impl {
  ServerOptions opts;
  std::unordered_map<int, std::vector<Detection>> strong;
  PromRegistry reg;
  PromCounter *req_ok, *req_bad, *req_not_found, *req_rejected, *req_error, *batches;
  PromHistogram *batch_size, *latency_s;
  PromGauge *queue_depth, *rho_gauge, *demand_gauge, *capacity_gauge;
  PromGauge *conn_active, *conn_waiting;
  PromCounter* rejected_total;
  DemandTracker demand;
  std::unique_ptr<Batcher> batcher;
  httplib::Server http;
  HttpListener listener{http, "route server"};  // after http: stopped before it is destroyed
  bool running = false;
  mutable std::mutex trace_mu;
  std::vector<RequestTrace> traces;

  static std::int64_t ns(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }
  void note_trace(RequestTrace t) {
    if (!opts.trace) return;
    t.reply_ns = ns(Clock::now());
    std::lock_guard<std::mutex> lock(trace_mu);
    traces.push_back(std::move(t));
  }

  double capacity_fps() const {
    return opts.batcher.capacity_fps > 0 ? opts.batcher.capacity_fps : service_fps(opts.batcher);
  }
  double rho() {
    const double d = demand.demand_fps();
    demand_gauge->set(d);
    if (d <= 0) return 1.0;
    return std::clamp(std::floor(100.0 * opts.headroom * capacity_fps() / d) / 100.0, 0.0, 1.0);
  }

  void reply(httplib::Response& res, int status, const std::string& body) {
    res.status = status;
    res.set_header("X-Ferry-Rho", fmt::format("{:.2f}", rho()));
    res.set_content(body, "application/json");
  }
  void reply_error(httplib::Response& res, int status, std::string_view msg) {
    (status == 404   ? req_not_found
     : status == 503 ? req_rejected
     : status < 500  ? req_bad
                     : req_error)
        ->inc();
    reply(res, status, kserve::error_body(msg));
  }
  // Runs a handler, mapping any escaping exception to a 500 JSON error.
  template <typename Fn>
  auto guard(Fn fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const std::exception& e) {
        reply_error(res, 500, fmt::format("route server: internal error: {}", e.what()));
      } catch (...) {
        reply_error(res, 500, "route server: internal error");
      }
    };
  }
  bool check_model(const httplib::Request& req, httplib::Response& res) {
    if (req.matches.size() > 1 && req.matches[1] == opts.model) return true;
    reply_error(res, 404,
                fmt::format("route server: unknown model '{}' (serving '{}')",
                            req.matches.size() > 1 ? req.matches[1].str() : "", opts.model));
    return false;
  }

  void metadata(const httplib::Request& req, httplib::Response& res) {
    if (!check_model(req, res)) return;
    if (req.has_param("stream_fps")) {
      const std::string v = req.get_param_value("stream_fps");
      char* end = nullptr;
      const double fps = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(fps) || fps < 0 || fps > 1e6) {
        reply_error(res, 400, fmt::format("route server: bad stream_fps '{}'", v));
        return;
      }
      demand.note(req.get_param_value("client"), fps);
    }
    const double r = rho();
    Json j = {{"name", opts.model},
              {"versions", {"1"}},
              {"platform", "ferry-route-replay"},
              {"inputs",
               {{{"name", "frame_id"}, {"datatype", "INT64"}, {"shape", {1}}},
                {{"name", "image"}, {"datatype", "UINT8"}, {"shape", {-1}}}}},
              {"outputs",
               {{{"name", "boxes"}, {"datatype", "FP32"}, {"shape", {-1, 4}}},
                {{"name", "scores"}, {"datatype", "FP32"}, {"shape", {-1}}},
                {{"name", "classes"}, {"datatype", "BYTES"}, {"shape", {-1}}}}},
              {"parameters",
               {{"sustainable_rho", r},
                {"capacity_fps", capacity_fps()},
                {"demand_fps", demand.demand_fps()},
                {"max_batch", opts.batcher.max_batch},
                {"max_queue", opts.batcher.max_queue}}}};
    req_ok->inc();
    reply(res, 200, j.dump());
  }

  void infer(const httplib::Request& req, httplib::Response& res) {
    const auto t0 = Clock::now();
    if (!check_model(req, res)) return;
    std::int64_t header_length = -1;  // binary tensor extension when the header is present
    if (req.has_header(kserve::kHeaderLengthHeader)) {
      const std::string v = req.get_header_value(kserve::kHeaderLengthHeader);
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 0) {
        reply_error(res, 400,
                    fmt::format("route server: bad {} '{}'", kserve::kHeaderLengthHeader, v));
        return;
      }
      header_length = n;
    }
    Result<kserve::FrameRequest> fr = kserve::decode_frame_request(req.body, header_length);
    if (!fr.ok()) {
      reply_error(res, 400, fr.status().message());
      return;
    }
    demand.note(fr->client, fr->stream_fps);
    double retry_after_s = 1;
    const auto t_admit = Clock::now();
    Result<BatchReply> r = batcher->run(fr->frame, &retry_after_s);
    if (!r.ok()) {
      note_trace({fr->id, ns(t0), 0, 0, 503, 0});
      const StatusCode c = r.status().code();
      if (c == StatusCode::kResourceExhausted) {
        rejected_total->inc();
        res.set_header("Retry-After", fmt::format("{}", static_cast<int>(retry_after_s)));
        reply_error(res, 503, r.status().message());
      } else {
        reply_error(res, c == StatusCode::kNotFound ? 404 : 503, r.status().message());
      }
      return;
    }
    req_ok->inc();
    res.set_header("X-Ferry-Batch-Size", std::to_string(r->batch_size));
    reply(res, 200, kserve::encode_detections(opts.model, fr->id, r->dets));
    latency_s->observe(std::chrono::duration<double>(Clock::now() - t0).count());
    note_trace({fr->id, ns(t0), ns(t_admit) + static_cast<std::int64_t>(r->queue_ms * 1e6), 0, 200,
                r->batch_size});
  }

  void routes() {
    http.Get("/v2/health/live", guard([this](const httplib::Request&, httplib::Response& res) {
               reply(res, 200, R"({"live":true})");
             }));
    http.Get("/v2/health/ready", guard([this](const httplib::Request&, httplib::Response& res) {
               reply(res, 200, R"({"ready":true})");
             }));
    http.Get("/v2", guard([this](const httplib::Request&, httplib::Response& res) {
               reply(res, 200,
                     R"({"name":"ferry-route","version":"1","extensions":["binary_tensor_data"]})");
             }));
    http.Get(R"(/v2/models/([^/]+))",
             guard([this](const httplib::Request& q, httplib::Response& s) { metadata(q, s); }));
    http.Get(R"(/v2/models/([^/]+)/ready)",
             guard([this](const httplib::Request& q, httplib::Response& s) {
               if (check_model(q, s)) reply(s, 200, R"({"ready":true})");
             }));
    http.Post(R"(/v2/models/([^/]+)/infer)",
              guard([this](const httplib::Request& q, httplib::Response& s) { infer(q, s); }));
    http.Get("/metrics", guard([this](const httplib::Request&, httplib::Response& res) {
               res.status = 200;
               res.set_content(render(), "text/plain; version=0.0.4");
             }));
    const httplib::Server::HandlerWithResponse on_error =
        [this](const httplib::Request& req,
               httplib::Response& res) -> httplib::Server::HandlerResponse {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      try {
        reply_error(
            res, res.status,
            fmt::format("route server: {} {}: http status {}", req.method, req.path, res.status));
      } catch (...) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      return httplib::Server::HandlerResponse::Handled;
    };
    http.set_error_handler(on_error);
  }

  std::string render() {
    queue_depth->set(batcher->depth());
    rho_gauge->set(rho());
    return reg.render();
  }

  void make_metrics() {
    const std::string req = "ferry_route_server_requests_total";
    const std::string help = "HTTP requests by outcome";
    req_ok = &reg.counter(req, help, R"(outcome="ok")");
    req_bad = &reg.counter(req, help, R"(outcome="bad_request")");
    req_not_found = &reg.counter(req, help, R"(outcome="not_found")");
    req_rejected = &reg.counter(req, help, R"(outcome="unavailable")");
    req_error = &reg.counter(req, help, R"(outcome="error")");
    batches = &reg.counter("ferry_route_server_batches_total", "detector batches run");
    batch_size = &reg.histogram("ferry_route_server_batch_size", "frames per batch",
                                {1, 2, 4, 8, 16, 32, 64, 128});
    latency_s = &reg.histogram("ferry_route_server_infer_latency_seconds",
                               "infer request latency (admitted and answered)",
                               exponential_buckets(0.0005, 2, 14));
    queue_depth = &reg.gauge("ferry_route_server_queue_depth", "admitted, unfinished requests");
    rejected_total =
        &reg.counter("ferry_route_server_rejected_total", "requests refused by admission (503)");
    rho_gauge = &reg.gauge("ferry_route_server_sustainable_rho", "published offload ratio");
    demand_gauge = &reg.gauge("ferry_route_server_demand_fps", "reported client frame rate");
    capacity_gauge = &reg.gauge("ferry_route_server_capacity_fps", "frames per second served");
    const std::string conn = "ferry_route_server_http_connections";
    const std::string conn_help = "open HTTP connections: served by a thread, or waiting for one";
    conn_active = &reg.gauge(conn, conn_help, R"(state="active")");
    conn_waiting = &reg.gauge(conn, conn_help, R"(state="waiting")");
  }
};

DetectionServer::DetectionServer(ServerOptions opts, const RecordSet& records)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opts = std::move(opts);
  for (const Detection& d : records.strong) m.strong[d.frame].push_back(d);
  for (int f : records.frames) m.strong.try_emplace(f);  // frames with no strong detections
  m.make_metrics();
  m.capacity_gauge->set(m.capacity_fps());
  m.batcher = std::make_unique<Batcher>(
      m.opts.batcher,
      [&m](int frame) -> Result<std::vector<Detection>> {
        auto it = m.strong.find(frame);
        if (it == m.strong.end()) return not_found("route server: unknown frame_id {}", frame);
        return it->second;
      },
      [&m](int n, double) {
        m.batches->inc();
        m.batch_size->observe(n);
      });
  m.routes();
  const int threads = m.opts.threads > 0 ? m.opts.threads : default_http_threads(m.opts.batcher);
  m.http.new_task_queue = [&m, threads] {
    return new CountingPool(static_cast<std::size_t>(threads), m.conn_active, m.conn_waiting);
  };
  m.http.set_payload_max_length(kserve::kMaxImageBytes * 5);
  m.http.set_keep_alive_max_count(1000);
  m.http.set_tcp_nodelay(true);  // replies are small; Nagle + delayed ACK would add ~40 ms
}

DetectionServer::~DetectionServer() { stop(); }

Result<int> DetectionServer::start() {
  Impl& m = *impl_;
  FERRY_TRY(validate(m.opts));
  if (m.running) return invalid_argument("route server: already running");
  FERRY_ASSIGN_OR_RETURN(const int port, m.listener.start(m.opts.host, m.opts.port));
  m.running = true;
  log::get("router")->info("route server: model={} listening={}:{} capacity_fps={:.1f}",
                           m.opts.model, m.opts.host, port, m.capacity_fps());
  return port;
}

void DetectionServer::stop() {
  Impl& m = *impl_;
  if (!m.running) return;
  m.listener.stop();
  m.running = false;
}

double DetectionServer::sustainable_rho() const { return impl_->rho(); }

std::string DetectionServer::metrics_text() const { return impl_->render(); }

std::vector<RequestTrace> DetectionServer::trace() const {
  std::lock_guard<std::mutex> lock(impl_->trace_mu);
  return impl_->traces;
}

}  // namespace ferry::route
