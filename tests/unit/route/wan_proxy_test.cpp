// SPDX-License-Identifier: Apache-2.0
// The user-space WAN emulator between the edge agent and the cloud server: requests pay the
// round trip, uploads pay their serialisation time, a deadline below the RTT turns every offload
// into a fallback with no frame lost, an upstream that is down fails only that connection, and
// stop() returns with connections open. Only lower bounds on time are asserted: a loaded machine
// can make things slower, never faster than the modelled link.
#include "route/transport/wan_proxy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "route/agent.h"
#include "route/replay.h"
#include "route/server.h"
#include "route/transport/http_client.h"
#include "server_test_util.h"

namespace ferry::route {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

ServerOptions instant() {
  ServerOptions o;
  o.batcher.batch_base_ms = 0;
  o.batcher.per_frame_ms = 0;
  o.batcher.batch_timeout_ms = 0.5;
  o.batcher.max_queue = 1000;
  return o;
}

struct Stack {
  RecordSet rs = testing::small_records(400, 7);
  DetectionServer server{instant(), rs};
  std::unique_ptr<WanProxy> proxy;
  int proxy_port = 0;
  Stack(double one_way_ms, double up_mbps) {
    auto sp = server.start();
    EXPECT_TRUE(sp.ok());
    WanProxyOptions o;
    o.upstream_port = sp.ok() ? *sp : 1;
    o.uplink = {one_way_ms, up_mbps};
    o.downlink = {one_way_ms, 0};
    proxy = std::make_unique<WanProxy>(o);
    auto pp = proxy->start("127.0.0.1", 0);
    EXPECT_TRUE(pp.ok()) << pp.status().to_string();
    proxy_port = pp.ok() ? *pp : 0;
  }
};

TEST(WanProxy, RequestsPayTheRoundTrip) {
  Stack st(25, 0);
  HttpClient c(HttpEndpoint{"127.0.0.1", st.proxy_port}, 5000);
  for (int i = 0; i < 3; ++i) {  // also over a kept-alive connection
    const auto t = Clock::now();
    auto r = c.get("/v2/health/ready");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->status, 200);
    EXPECT_GE(ms_since(t), 50.0) << "request " << i;
  }
  EXPECT_GE(st.proxy->stats().connections, 1);
  EXPECT_GT(st.proxy->stats().bytes_down, 0);
}

TEST(WanProxy, UploadsPayTheirSerialisationTime) {
  Stack st(1, 8);  // 8 Mbit/s uplink: 200 kB take >= 200 ms
  HttpClient c(HttpEndpoint{"127.0.0.1", st.proxy_port}, 10000);
  const std::string body(200 * 1000, 'x');
  const auto t = Clock::now();
  auto r = c.post("/v2/models/strong/infer", body);  // malformed for the server: a 4xx is fine
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GE(r->status, 400);
  EXPECT_GE(ms_since(t), 200.0);
  EXPECT_GE(st.proxy->stats().bytes_up, 200 * 1000);
}

TEST(WanProxy, ConnectionsShareTheLinkRate) {
  Stack st(1, 8);  // one 8 Mbit/s uplink: two concurrent 100 kB uploads take >= 200 ms together
  const std::string body(100 * 1000, 'x');
  const auto t = Clock::now();
  auto upload = [&] {
    HttpClient c(HttpEndpoint{"127.0.0.1", st.proxy_port}, 10000);
    auto r = c.post("/v2/models/strong/infer", body);
    EXPECT_TRUE(r.ok());
  };
  std::thread a(upload), b(upload);
  a.join();
  b.join();
  EXPECT_GE(ms_since(t), 200.0);
  EXPECT_GE(st.proxy->stats().connections, 2);
}

TEST(WanProxy, AgentFallsBackWhenTheDeadlineIsBelowTheRtt) {
  Stack st(30, 0);
  RecordSet test = st.rs.subset("test");
  auto tuned = tune_router(st.rs.subset("calib"), "skip", "cond", ReplayOptions{}, 0.0);
  ASSERT_TRUE(tuned.ok());
  AgentOptions o;
  o.server_url = "http://127.0.0.1:" + std::to_string(st.proxy_port);
  o.rho = 0.5;
  o.frames = 40;
  o.fps = 200;
  o.concurrency = 32;  // 100 offloads/s x 60+ ms in flight: enough workers (Little's law)
  o.deadline_ms = 40;  // below the 60 ms RTT
  auto s = run_agent(test, tuned->router, o, nullptr);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE(s->accounted());
  EXPECT_EQ(s->frames, 40);
  EXPECT_EQ(s->offloaded_ok, 0);
  EXPECT_EQ(s->offloaded_fallback, 20);
  o.deadline_ms = 5000;  // far above: offloads succeed and each took at least one RTT
  s = run_agent(test, tuned->router, o, nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->offloaded_ok, 20);
  EXPECT_GE(s->offload_latency_ms.p50, 60.0);
}

TEST(WanProxy, UpstreamDownFailsTheConnectionNotTheProxy) {
  int dead_port;
  {
    DetectionServer gone(instant(), testing::small_records(40, 1));
    auto p = gone.start();
    ASSERT_TRUE(p.ok());
    dead_port = *p;
  }
  WanProxyOptions o;
  o.upstream_port = dead_port;
  o.uplink = o.downlink = {1, 0};
  WanProxy proxy(o);
  auto pp = proxy.start("127.0.0.1", 0);
  ASSERT_TRUE(pp.ok());
  for (int i = 0; i < 2; ++i) {
    HttpClient c(HttpEndpoint{"127.0.0.1", *pp}, 2000);
    EXPECT_FALSE(c.get("/v2/health/ready").ok());
  }
  proxy.stop();
  proxy.stop();
}

TEST(WanProxy, StopsWithOpenConnectionsAndRejectsBadOptions) {
  Stack st(5, 0);
  HttpClient c(HttpEndpoint{"127.0.0.1", st.proxy_port}, 2000);
  ASSERT_TRUE(c.get("/v2/health/live").ok());  // keep-alive connection stays open
  st.proxy->stop();
  EXPECT_FALSE(c.get("/v2/health/live").ok());
  WanProxyOptions bad;
  EXPECT_FALSE(validate(bad).ok());  // no upstream port
  bad.upstream_port = 80;
  bad.uplink.delay_ms = -1;
  EXPECT_FALSE(validate(bad).ok());
  bad.uplink.delay_ms = 1;
  bad.downlink.rate_mbps = -5;
  EXPECT_FALSE(validate(bad).ok());
  WanProxy p(bad);
  EXPECT_FALSE(p.start("127.0.0.1", 0).ok());
}

}  // namespace
}  // namespace ferry::route
