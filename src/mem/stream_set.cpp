// SPDX-License-Identifier: Apache-2.0
#include "mem/stream_set.h"

#include "core/check.h"
#include "core/log.h"
#include "mem/runtime_hooks.h"

namespace ferry::mem {

StreamSet::State::~State() {
  if (device != Device::kCuda) return;
  for (Stream& s : streams) {
    if (s.native() == nullptr) continue;
    if (Status st = s.synchronize(); !st.ok()) {
      log::get("mem")->error("stream set teardown: {}", st.to_string());
    }
    detail::rt_stream_destroy(s.native(), device_index);
  }
}

Result<StreamSet> StreamSet::create(Device device, int device_index) {
  StreamSet ss;
  ss.state_ = std::make_unique<State>();
  ss.state_->device = device;
  ss.state_->device_index = device_index;
  for (int r = 0; r < 3; ++r) {
    void* native = nullptr;
    if (device == Device::kCuda) {
      FERRY_ASSIGN_OR_RETURN(native, detail::rt_stream_create(device_index));
    }
    ss.state_->streams[r] = Stream(device, device_index, native);
    FERRY_ASSIGN_OR_RETURN(ss.state_->events[r], Event::create(device, device_index));
  }
  return ss;
}

StreamSet::~StreamSet() = default;

int StreamSet::role_of(const Stream& s) const {
  for (int r = 0; r < 3; ++r) {
    if (&state_->streams[r] == &s) return r;
  }
  FERRY_CHECK(false, "mem: stream does not belong to this stream set");
  return -1;
}

Status StreamSet::order(Stream& producer, Stream& consumer) {
  const int p = role_of(producer);
  (void)role_of(consumer);
  Event& ev = state_->events[p];
  FERRY_TRY(ev.record(producer));
  return consumer.wait(ev);
}

Status StreamSet::synchronize() {
  for (Stream& s : state_->streams) FERRY_TRY(s.synchronize());
  return {};
}

}  // namespace ferry::mem
