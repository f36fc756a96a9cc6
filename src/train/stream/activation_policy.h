// SPDX-License-Identifier: Apache-2.0
// ActivationPolicy: the activation half of a plan as data. Boundary i (i = 0..L-1) is the input
// of layer i; boundary L (the final norm's input) always stays in the device tier until the loss
// is taken. Each boundary i < L has a home — device tier, pinned host memory, NVMe — or is
// recomputed in backward from the nearest materialized boundary below it, on weights streamed
// again for that purpose (never a separate pass: the recompute runs just before the backward of
// the span's top layer). Boundary 0 must be materialized.
//
// Spans: consecutive materialized boundaries s < e (e = L for the last) enclose layers s..e-1;
// layers s..e-2 are recomputed (e - s - 1 extra layer forwards and weight streams), then the
// backward runs e-1 down to s, each layer re-running its own forward from its input first (its
// internals), unless the layer is kept.
//
// Kept layers (`keep`, [L], empty = none; issue #7): the forward's layer_forward(l) leaves layer
// l's internals in a device-tier workspace of their own (ModelCompute's kept_layers), and the
// layer's backward consumes them instead of re-running the forward: one layer forward less per
// kept layer and micro-batch (a layer inside a recomputed span still runs in the span's
// recompute, which regenerates the boundary above it). Keeping changes no boundary home and no
// weight stream (weight_schedule is the same); it costs ModelCompute::kept_layer_bytes per layer.
//
// Spellings (CLI --policy, docs/train.md):
//   device              every boundary in the device tier
//   host                every boundary in pinned host memory
//   nvme:DIR            every boundary on NVMe (files under DIR)
//   every:K             boundaries 0, K, 2K, ... in the device tier, the rest recomputed
//   every:K:host        ... checkpoints in host memory; every:K:nvme:DIR on NVMe
//   mix:HOMES[:DIR]     one letter per boundary 0..L-1: d(evice) h(ost) n(vme) r(ecompute)
// Any of them may end in +keep:LIST, the kept layers: LIST is top:N (the N highest layers) or
// comma-separated layer indices and ranges (30,31 or 28-35 or 0,4-6), e.g. every:4+keep:top:2.
// Tests: tests/unit/train/stream_executor_test.cpp (StreamPolicy.*), stream_keep_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace ferry::train::stream {

enum class Home : std::uint8_t { kDevice, kHost, kNvme, kRecompute };

char home_letter(Home h);  // 'd', 'h', 'n', 'r'

struct Span {
  int start = 0;  // materialized boundary
  int end = 0;    // next materialized boundary (or L)
};

struct ActivationPolicy {
  std::vector<Home> homes;  // [L] home of boundary i (input of layer i)
  std::string nvme_dir;     // required when some home is kNvme
  std::string name;         // the spelling it was parsed from
  std::vector<bool> keep;   // [L] layer l's internals kept for its backward; empty = none

  int layers() const { return static_cast<int>(homes.size()); }
  int count(Home h) const;
  bool kept(int l) const { return !keep.empty() && keep[static_cast<std::size_t>(l)]; }
  int kept_count() const;
  // The path of materialized boundaries, bottom to top: spans[0].start == 0, back().end == L.
  std::vector<Span> spans() const;
  // Largest number of boundaries a span regenerates in backward (max e - s - 1, 0 if none).
  int max_recomputed() const;
  // "every:4 = drrrdrrr"; with kept layers "every:4+keep:top:2 = drrrdrrr keep 6-7".
  std::string describe() const;
};

// The kept layers as a LIST of the +keep: spelling, ranges compressed ("0,4-6"); "" for none.
std::string keep_list(const std::vector<bool>& keep);

// Parses one of the spellings above for an L-layer model.
Result<ActivationPolicy> parse_policy(std::string_view spec, int layers);

// A comma-split list of policy spellings (CLI11's --policies delimiter) with the commas of
// +keep:LIST put back: an item that is only a layer or a range ("3", "5-7") continues the
// previous item when that one ends in a +keep: list of indices (no policy spelling is a bare
// number). {"device+keep:1", "3", "every:2"} -> {"device+keep:1,3", "every:2"}.
std::vector<std::string> rejoin_keep_lists(const std::vector<std::string>& items);

// Checks the invariants (L homes, boundary 0 materialized, a directory for NVMe homes, keep
// empty or [L]).
Status validate(const ActivationPolicy& p);

// Layer-weight streams of one micro-batch, in order: forward 0..L-1, then per span from the top
// the recompute of layers s..e-2 followed by the backward of e-1..s. The executor's transfer
// thread and compute thread both follow this order; tests predict the bytes from it.
std::vector<int> weight_schedule(const ActivationPolicy& p);

}  // namespace ferry::train::stream
