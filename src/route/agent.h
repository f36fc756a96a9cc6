// SPDX-License-Identifier: Apache-2.0
// The route edge agent: streams the frames of a RecordSet at a frame rate, runs the router's
// placement for the current ρ (fixed, or the server's published ρ when auto) with one
// FeedbackController per placement (controller.h; the realised ratio holds to ±(1/η+1)/T),
// offloads the chosen frames to the cloud server (server.h) with a deadline, and falls back to
// the local weak result on timeout, transport error, 503 or a reply after the deadline.
// Accounting invariant (checked at the end, reported as "accounted"): every frame is exactly one
// of local, offloaded_ok, offloaded_fallback, so local + ok + fallback = frames; no frame is lost.
// "Running the weak detector" reads the frame's weak detections from the records after an
// emulated weak_ms; under the skip placement an offloaded frame never runs it unless it falls back.
// Offloads run on `concurrency` worker threads (one keep-alive connection each); each job goes to
// the most recently idle worker, so only as many connections stay open as requests were in flight
// at the peak (a server serves a bounded number of connections at once). When all workers are
// busy the frame falls back at once (reason "busy") rather than stalling the stream; with fps = 0
// (throughput mode) the loop waits for a free worker instead.
// Thread-safety: run_agent is one blocking call; metrics may be rendered concurrently.
// Covered by tests/unit/route/agent_test.cpp and tests/cli/route_e2e.sh.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "route/metrics_prom.h"
#include "route/records.h"
#include "route/replay.h"

namespace ferry::route {

struct AgentOptions {
  std::string server_url = "http://127.0.0.1:8000";
  std::string model = "strong";
  std::string client = "edge-0";
  double rho = 0.5;                // fixed budget; ignored when rho_auto
  bool rho_auto = false;           // follow the server's published sustainable ρ
  double deadline_ms = 200;        // offload deadline, from frame arrival
  double fps = 0;                  // frame arrival rate; 0 = as fast as possible
  int frames = 0;                  // 0 = all frames of the split
  int concurrency = 8;             // offload worker threads
  double weak_ms = 0;              // emulated weak-detector time per frame
  std::size_t frame_bytes = 4096;  // emulated upload: UINT8 pixels per offloaded frame
  bool binary_upload = true;       // KServe binary tensor extension; false = pixels as JSON numbers
  double feedback_gain = 0;        // 0 = auto: the smallest η that holds ±0.01 over the run
  double rho_poll_ms = 250;        // auto: metadata poll period
};
Status validate(const AgentOptions& o);

struct LatencyStats {
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
  int count = 0;
};
LatencyStats latency_stats(std::vector<double> ms);

// One frame's timeline for diagnosis (steady_clock nanoseconds since its epoch, so it lines up
// with WanProxy and DetectionServer traces taken in the same process; 0 = did not happen).
struct FrameTrace {
  int frame = 0;
  int worker = -1;  // offload worker (each holds one keep-alive connection); -1 = none
  bool offload = false;
  std::int64_t arrival_ns = 0, send_ns = 0, reply_ns = 0, done_ns = 0;
  int http_status = 0;  // 0 = no reply
  std::string outcome;  // local, ok, or the fallback reason
};

struct AgentSummary {
  int frames = 0, local = 0, offloaded_ok = 0, offloaded_fallback = 0;
  int skip_frames = 0, cond_frames = 0;
  std::map<std::string, int> fallback_reasons;  // timeout, unavailable, rejected, error, late, busy
  double target_rho = 0;    // fixed ρ, or the mean published ρ over the frames (auto)
  double realised_rho = 0;  // frames the controller sent to the cloud / frames
  double served_rho = 0;    // frames answered by the cloud in time / frames
  LatencyStats latency_ms, offload_latency_ms;
  double ap_produced = 0, ap_weak_only = 0, ap_strong_only = 0;  // pooled 11-pt AP@.5
  double coco_produced = 0, coco_weak_only = 0, coco_strong_only = 0;
  double wall_s = 0;
  std::vector<FrameTrace> trace;  // [frames]; not part of to_json
  bool accounted() const { return local + offloaded_ok + offloaded_fallback == frames; }
  Json to_json() const;
};

// Streams `split` (frames in order) against the server. The router's score columns must exist in
// `split`. `metrics` (optional) receives the agent's Prometheus series while it runs.
Result<AgentSummary> run_agent(const RecordSet& split, const TunedRouter& router,
                               const AgentOptions& opts, PromRegistry* metrics);

}  // namespace ferry::route
