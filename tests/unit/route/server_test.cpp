// SPDX-License-Identifier: Apache-2.0
// The route cloud server over loopback: health/metadata, infer round trip against the records'
// strong detections, batching of concurrent requests, admission control (503 + Retry-After),
// malformed requests (4xx JSON, the server keeps serving) and /metrics as Prometheus text.
#include "route/server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/json.h"
#include "route/transport/http_client.h"
#include "route/transport/kserve.h"
#include "server_test_util.h"

namespace ferry::route {
namespace {

struct Running {
  RecordSet rs = testing::small_records();
  std::unique_ptr<DetectionServer> server;
  int port = 0;
  explicit Running(ServerOptions o) {
    server = std::make_unique<DetectionServer>(o, rs);
    auto p = server->start();
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    port = p.ok() ? *p : 0;
  }
  HttpClient client(double timeout_ms = 5000) const {
    return HttpClient(HttpEndpoint{"127.0.0.1", port}, timeout_ms);
  }
};

ServerOptions fast_options() {
  ServerOptions o;
  o.batcher.batch_base_ms = 0;
  o.batcher.per_frame_ms = 0;
  o.batcher.batch_timeout_ms = 1;
  return o;
}

TEST(RouteServer, HealthAndMetadata) {
  Running r(fast_options());
  HttpClient c = r.client();
  for (const char* path : {"/v2/health/live", "/v2/health/ready", "/v2/models/strong/ready"}) {
    auto rep = c.get(path);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    EXPECT_EQ(rep->status, 200) << path;
  }
  auto md = c.get("/v2/models/strong");
  ASSERT_TRUE(md.ok());
  ASSERT_EQ(md->status, 200);
  auto j = parse_json(md->body, "metadata");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["name"], "strong");
  EXPECT_DOUBLE_EQ((*j)["parameters"]["sustainable_rho"].get<double>(), 1.0);  // no demand yet
  EXPECT_EQ(md->rho, "1.00");
  auto unknown = c.get("/v2/models/nope");
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->status, 404);
  EXPECT_NE(unknown->body.find("\"error\""), std::string::npos);
}

TEST(RouteServer, PublishedRhoFollowsDemand) {
  ServerOptions o = fast_options();
  o.batcher.capacity_fps = 50;
  o.headroom = 0.9;
  Running r(o);
  HttpClient c = r.client();
  auto md = c.get("/v2/models/strong?client=a&stream_fps=100");
  ASSERT_TRUE(md.ok());
  auto j = parse_json(md->body, "metadata");
  ASSERT_TRUE(j.ok());
  EXPECT_DOUBLE_EQ((*j)["parameters"]["sustainable_rho"].get<double>(), 0.45);  // 0.9·50/100
  ASSERT_TRUE(c.get("/v2/models/strong?client=b&stream_fps=200").ok());         // demand 300 fps
  EXPECT_DOUBLE_EQ(r.server->sustainable_rho(), 0.15);
  auto bad = c.get("/v2/models/strong?stream_fps=abc");
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->status, 400);
}

TEST(RouteServer, InferRoundTripReturnsTheRecordsStrongDetections) {
  Running r(fast_options());
  HttpClient c = r.client();
  int checked = 0;
  for (int f : {0, 7, 31}) {
    std::vector<Detection> want;
    for (const auto& d : r.rs.strong)
      if (d.frame == f) want.push_back(d);
    const std::string id = "req-" + std::to_string(f);
    auto rep = c.post("/v2/models/strong/infer", kserve::encode_frame_request(id, f, 64, "t", 0));
    ASSERT_TRUE(rep.ok());
    ASSERT_EQ(rep->status, 200) << rep->body;
    auto got = kserve::decode_detections(rep->body, id, f);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_DOUBLE_EQ((*got)[i].box.left, want[i].box.left);
      EXPECT_DOUBLE_EQ((*got)[i].box.height, want[i].box.height);
      EXPECT_DOUBLE_EQ((*got)[i].score, want[i].score);
      EXPECT_EQ((*got)[i].cls, want[i].cls);
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(RouteServer, ConcurrentRequestsFormBatches) {
  ServerOptions o = fast_options();
  o.batcher.max_batch = 8;
  o.batcher.batch_timeout_ms = 200;  // long enough that 8 concurrent requests meet
  Running r(o);
  std::atomic<int> max_batch{0}, ok{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&, t] {
      HttpClient c = r.client();
      auto rep = c.post("/v2/models/strong/infer",
                        kserve::encode_frame_request("b" + std::to_string(t), t, 0, "", 0));
      if (rep.ok() && rep->status == 200) {
        ++ok;
        const int b = std::atoi(rep->header("x-ferry-batch-size").c_str());
        int cur = max_batch.load();
        while (b > cur && !max_batch.compare_exchange_weak(cur, b)) {
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_GT(max_batch.load(), 1);
  std::map<std::string, double> v;
  ASSERT_EQ(testing::check_prometheus(r.server->metrics_text(), &v), "");
  EXPECT_LT(v["ferry_route_server_batches_total"], 8);
  EXPECT_EQ(v["ferry_route_server_batch_size_count"], v["ferry_route_server_batches_total"]);
  EXPECT_EQ(v["ferry_route_server_batch_size_sum"], 8);
}

TEST(RouteServer, AdmissionControlRejectsWith503AndRetryAfter) {
  ServerOptions o;
  o.batcher.max_batch = 1;
  o.batcher.max_queue = 2;
  o.batcher.batch_base_ms = 150;  // slow detector: the queue fills
  o.batcher.per_frame_ms = 0;
  Running r(o);
  std::atomic<int> ok{0}, rejected{0}, other{0};
  std::atomic<bool> retry_after_set{true}, json_error{true};
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; ++t) {
    ts.emplace_back([&, t] {
      HttpClient c = r.client();
      auto rep = c.post("/v2/models/strong/infer",
                        kserve::encode_frame_request("a" + std::to_string(t), t, 0, "", 0));
      if (!rep.ok()) return void(++other);
      if (rep->status == 200) return void(++ok);
      if (rep->status != 503) return void(++other);
      ++rejected;
      if (rep->retry_after.empty() || std::atoi(rep->retry_after.c_str()) < 1)
        retry_after_set = false;
      if (rep->body.find("\"error\"") == std::string::npos) json_error = false;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_GE(rejected.load(), 1);
  EXPECT_GE(ok.load(), 2);
  EXPECT_EQ(ok.load() + rejected.load(), 6);
  EXPECT_TRUE(retry_after_set.load());
  EXPECT_TRUE(json_error.load());
  std::map<std::string, double> v;
  ASSERT_EQ(testing::check_prometheus(r.server->metrics_text(), &v), "");
  EXPECT_EQ(v["ferry_route_server_rejected_total"], rejected.load());
  HttpClient c = r.client();  // still serving afterwards
  auto rep = c.post("/v2/models/strong/infer", kserve::encode_frame_request("z", 1, 0, "", 0));
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->status, 200);
}

TEST(RouteServer, CapacityRateLimitRejectsBursts) {
  ServerOptions o = fast_options();
  o.batcher.max_batch = 1;  // burst of one token
  o.batcher.capacity_fps = 2;
  Running r(o);
  HttpClient c = r.client();
  int codes[3];
  for (int i = 0; i < 3; ++i) {
    auto rep = c.post("/v2/models/strong/infer", kserve::encode_frame_request("c", i, 0, "", 0));
    ASSERT_TRUE(rep.ok());
    codes[i] = rep->status;
  }
  EXPECT_EQ(codes[0], 200);
  EXPECT_EQ(codes[1], 503);
  EXPECT_EQ(codes[2], 503);
}

TEST(RouteServer, MalformedRequestsGet4xxJsonAndServerKeepsServing) {
  Running r(fast_options());
  HttpClient c = r.client();
  const std::string p = "/v2/models/strong/infer";
  const std::vector<std::string> bodies = {
      "",
      "not json",
      "{\"inputs\": [",
      "[]",
      "{}",
      R"({"inputs": {}})",
      R"({"id": 5, "inputs": []})",
      R"({"inputs": []})",
      R"({"inputs": [{"shape":[1],"datatype":"INT64","data":[1]}]})",
      R"({"inputs": [{"name":"frame_id","shape":[2],"datatype":"INT64","data":[1]}]})",
      R"({"inputs": [{"name":"frame_id","shape":[1],"datatype":"FP32","data":[1]}]})",
      R"({"inputs": [{"name":"frame_id","shape":[1],"datatype":"INT64","data":["x"]}]})",
      R"({"inputs": [{"name":"frame_id","shape":[1],"datatype":"INT64","data":[-4]}]})",
      R"({"inputs": [{"name":"frame_id","shape":[-1],"datatype":"INT64","data":[1]}]})",
      R"({"inputs": [{"name":"frame_id","shape":"1","datatype":"INT64","data":[1]}]})",
      R"({"inputs": [{"name":"frame_id","shape":[1],"datatype":"INT64","data":[99999]}]})",
      R"({"inputs": [{"name":"frame_id","shape":[1],"datatype":"INT64","data":[1]},
                     {"name":"image","shape":[2],"datatype":"UINT8","data":[1,300]}]})",
      R"({"inputs": [{"name":"frame_id","shape":[1],"datatype":"INT64","data":[1]},
                     {"name":"image","shape":[4294967296,4294967296],"datatype":"UINT8","data":[]}]})",
      R"({"inputs": [{"name":"frame_id","shape":[1],"datatype":"INT64","data":[1]},
                     {"name":"mask","shape":[1],"datatype":"UINT8","data":[1]}]})",
      R"({"parameters": {"stream_fps": "fast"}, "inputs": [{"name":"frame_id","shape":[1],"datatype":"INT64","data":[1]}]})",
      std::string(20000, '['),
  };
  for (const std::string& b : bodies) {
    auto rep = c.post(p, b);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string() << " body: " << b.substr(0, 80);
    EXPECT_GE(rep->status, 400) << b.substr(0, 80);
    EXPECT_LT(rep->status, 500) << b.substr(0, 80) << " -> " << rep->body;
    auto j = parse_json(rep->body, "error reply");
    ASSERT_TRUE(j.ok()) << rep->body;
    EXPECT_TRUE(j->contains("error")) << rep->body;
  }
  auto wrong_model =
      c.post("/v2/models/other/infer", kserve::encode_frame_request("w", 1, 0, "", 0));
  ASSERT_TRUE(wrong_model.ok());
  EXPECT_EQ(wrong_model->status, 404);
  auto get_infer = c.get(p);  // wrong method
  ASSERT_TRUE(get_infer.ok());
  EXPECT_GE(get_infer->status, 400);
  EXPECT_LT(get_infer->status, 500);
  auto nowhere = c.get("/v3/nothing");
  ASSERT_TRUE(nowhere.ok());
  EXPECT_EQ(nowhere->status, 404);
  EXPECT_NE(nowhere->body.find("\"error\""), std::string::npos);
  // Binary tensor extension: a bad or lying Inference-Header-Content-Length is a 400.
  kserve::BinaryRequest bin = kserve::encode_frame_request_binary("bin", 2, 64, "", 0);
  for (const std::string& len :
       {std::string("x"), std::string("-1"), std::to_string(bin.body.size() + 1),
        std::to_string(bin.header_length + 1)}) {
    auto bad =
        c.post(p, bin.body, "application/octet-stream", {{kserve::kHeaderLengthHeader, len}});
    ASSERT_TRUE(bad.ok());
    EXPECT_EQ(bad->status, 400) << len;
  }
  auto bin_ok = c.post(p, bin.body, "application/octet-stream",
                       {{kserve::kHeaderLengthHeader, std::to_string(bin.header_length)}});
  ASSERT_TRUE(bin_ok.ok());
  EXPECT_EQ(bin_ok->status, 200) << bin_ok->body;
  EXPECT_TRUE(kserve::decode_detections(bin_ok->body, "bin", 2).ok());
  auto good = c.post(p, kserve::encode_frame_request("ok", 2, 16, "", 0));
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->status, 200);
  std::map<std::string, double> v;
  ASSERT_EQ(testing::check_prometheus(r.server->metrics_text(), &v), "");
  EXPECT_GE(v["ferry_route_server_requests_total{outcome=\"bad_request\"}"], 18);
}

TEST(RouteServer, MetricsEndpointServesPrometheusText) {
  Running r(fast_options());
  HttpClient c = r.client();
  ASSERT_TRUE(
      c.post("/v2/models/strong/infer", kserve::encode_frame_request("m", 3, 0, "", 0)).ok());
  auto m = c.get("/metrics");
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->status, 200);
  EXPECT_NE(m->content_type.find("text/plain"), std::string::npos);
  std::map<std::string, double> v;
  ASSERT_EQ(testing::check_prometheus(m->body, &v), "");
  for (const char* k :
       {"ferry_route_server_requests_total{outcome=\"ok\"}", "ferry_route_server_batches_total",
        "ferry_route_server_queue_depth", "ferry_route_server_rejected_total",
        "ferry_route_server_infer_latency_seconds_count", "ferry_route_server_batch_size_count",
        "ferry_route_server_sustainable_rho"}) {
    EXPECT_TRUE(v.count(k)) << k;
  }
  EXPECT_EQ(v["ferry_route_server_infer_latency_seconds_count"], 1);
}

// A server stopped right after start used to race httplib's listener thread: stop() before the
// listener ran was ignored and the join hung (seen once in CI). Start/stop back to back, many
// times, then the port is free and nothing listens on it.
TEST(RouteServer, StopRightAfterStartNeverHangs) {
  RecordSet rs = testing::small_records(40, 1);
  for (int i = 0; i < 100; ++i) {
    DetectionServer s(fast_options(), rs);
    auto p = s.start();
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    s.stop();
    s.stop();  // idempotent
    EXPECT_FALSE(HttpClient(HttpEndpoint{"127.0.0.1", *p}, 500).get("/v2/health/ready").ok());
  }
}

TEST(RouteServer, PrometheusCheckerRejectsBadText) {
  EXPECT_EQ(testing::check_prometheus("# TYPE a counter\na 1\n"), "");
  EXPECT_NE(testing::check_prometheus("a 1\n"), "");                         // no TYPE
  EXPECT_NE(testing::check_prometheus("# TYPE a counter\na one\n"), "");     // bad value
  EXPECT_NE(testing::check_prometheus("# TYPE a counter\na{x=1} 1\n"), "");  // unquoted label
  EXPECT_NE(testing::check_prometheus(
                "# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\n"
                "h_count 2\n"),
            "");  // not cumulative
  EXPECT_NE(testing::check_prometheus(
                "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\n"
                "h_count 3\n"),
            "");                                                      // count mismatch
  EXPECT_NE(testing::check_prometheus("# TYPE a counter\na 1"), "");  // no final newline
}

TEST(RouteServer, ValidateRejectsBadOptions) {
  ServerOptions o;
  o.batcher.max_batch = 0;
  EXPECT_FALSE(validate(o).ok());
  o = ServerOptions{};
  o.headroom = 0;
  EXPECT_FALSE(validate(o).ok());
  o = ServerOptions{};
  o.model = "a/b";
  EXPECT_FALSE(validate(o).ok());
  EXPECT_TRUE(validate(ServerOptions{}).ok());
}

}  // namespace
}  // namespace ferry::route
