// SPDX-License-Identifier: Apache-2.0
// Stream::host(), Stream::wait/synchronize and Event: host streams/events are trivial; CUDA ones
// go through runtime_hooks.h.
#include "mem/stream.h"

#include <utility>

#include "core/check.h"
#include "mem/event.h"
#include "mem/runtime_hooks.h"

namespace ferry::mem {

Stream& Stream::host() {
  static Stream s;
  return s;
}

Status Stream::wait(const Event& event) {
  if (event.native() == nullptr) return {};  // host events are complete once recorded
  if (device_ == Device::kCpu) return event.synchronize();
  return detail::rt_stream_wait_event(native_, event.native());
}

Status Stream::synchronize() {
  if (device_ == Device::kCpu) return {};
  return detail::rt_stream_synchronize(native_);
}

Result<Event> Event::create(Device device, int device_index, bool timing) {
  Event e;
  e.device_ = device;
  e.device_index_ = device_index;
  if (device == Device::kCuda) {
    FERRY_ASSIGN_OR_RETURN(e.native_, detail::rt_event_create(device_index, timing));
  }
  return e;
}

Event::Event(Event&& other) noexcept
    : device_(other.device_),
      device_index_(other.device_index_),
      native_(std::exchange(other.native_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (native_ != nullptr) detail::rt_event_destroy(native_, device_index_);
    device_ = other.device_;
    device_index_ = other.device_index_;
    native_ = std::exchange(other.native_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (native_ != nullptr) detail::rt_event_destroy(native_, device_index_);
}

Status Event::record(Stream& stream) {
  FERRY_CHECK(stream.device() == device_ && stream.device_index() == device_index_,
              "mem: {} event (device {}) recorded on a {} stream (device {})", to_string(device_),
              device_index_, to_string(stream.device()), stream.device_index());
  if (native_ == nullptr) return {};
  return detail::rt_event_record(native_, stream.native());
}

Result<bool> Event::query() const {
  if (native_ == nullptr) return true;
  return detail::rt_event_query(native_);
}

Result<float> Event::elapsed_ms(const Event& start, const Event& end) {
  if (start.native_ == nullptr || end.native_ == nullptr) {
    return invalid_argument("mem: elapsed time needs two CUDA timing events");
  }
  return detail::rt_event_elapsed_ms(start.native_, end.native_);
}

Status Event::synchronize() const {
  if (native_ == nullptr) return {};
  return detail::rt_event_synchronize(native_);
}

}  // namespace ferry::mem
