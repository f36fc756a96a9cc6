// SPDX-License-Identifier: Apache-2.0
// measure_machine(): each rate is the median of opts.reps timed runs (wall clock around a run
// that ends in a stream synchronize, so GPU work is included and nothing else is). Read
// machine_profile.h first.
#include "plan/machine_profile.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "core/file_util.h"
#include "kernels/backend.h"
#include "mem/buffer.h"
#include "mem/device_info.h"
#include "mem/nvme_store.h"
#include "mem/stream_set.h"
#include "mem/transfer_engine.h"
#include "plan/profile.h"

namespace ferry::plan {
namespace {

using Clock = std::chrono::steady_clock;

// The MachineSpec fields a profile can carry, by their JSON / report name.
struct Field {
  const char* name;
  double& (*ref)(MachineSpec&);
};
const Field kFields[] = {
    {"gemm_tflops", [](MachineSpec& s) -> double& { return s.gemm_tflops; }},
    {"attn_fwd_tflops", [](MachineSpec& s) -> double& { return s.attn_fwd_tflops; }},
    {"attn_bwd_tflops", [](MachineSpec& s) -> double& { return s.attn_bwd_tflops; }},
    {"hbm_gbps", [](MachineSpec& s) -> double& { return s.hbm_gbps; }},
    {"h2d_gbps", [](MachineSpec& s) -> double& { return s.link.h2d_gbps; }},
    {"d2h_gbps", [](MachineSpec& s) -> double& { return s.link.d2h_gbps; }},
    {"duplex_gbps", [](MachineSpec& s) -> double& { return s.link.duplex_gbps; }},
    {"duplex_loaded_gbps", [](MachineSpec& s) -> double& { return s.link.duplex_loaded_gbps; }},
    {"nvme_read_gbps", [](MachineSpec& s) -> double& { return s.link.nvme_read_gbps; }},
    {"nvme_write_gbps", [](MachineSpec& s) -> double& { return s.link.nvme_write_gbps; }},
    {"cpu_optimizer_gparams_per_s",
     [](MachineSpec& s) -> double& { return s.cpu_optimizer_gparams_per_s; }},
};

const Field* find_field(const std::string& name) {
  for (const Field& f : kFields) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// Median seconds of `reps` runs of `run` (each run returns its own Status).
Result<double> seconds(const std::function<Status()>& run) {
  const auto t0 = Clock::now();
  FERRY_TRY(run());
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Result<double> median_seconds(int reps, const std::function<Status()>& run) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    FERRY_ASSIGN_OR_RETURN(double s, seconds(run));
    t.push_back(s);
  }
  return median(std::move(t));
}

class Recorder {
 public:
  explicit Recorder(MachineProfile& p) : p_(p) {}
  void set(const char* field, double value) {
    find_field(field)->ref(p_.spec) = value;
    p_.measured.emplace_back(field);
  }
  void skip(std::initializer_list<const char*> fields, const std::string& why) {
    for (const char* f : fields) p_.not_measured.push_back({f, why});
  }

 private:
  MachineProfile& p_;
};

// Fused fp32 AdamW of the CPU backend over n parameters on all cores.
struct CpuOptimizerLoad {
  std::vector<float> param, m, v, grad;
  std::int64_t step = 0;
  explicit CpuOptimizerLoad(std::size_t n)
      : param(n, 0.5f), m(n, 0.0f), v(n, 0.0f), grad(n, 1e-3f) {}
  Status run() {
    const auto n = static_cast<std::int64_t>(param.size());
    auto f32 = [n](float* p) { return TensorView::contiguous(p, DType::kF32, Device::kCpu, {n}); };
    return kernels::cpu_backend().adamw({.param = f32(param.data()),
                                         .m = f32(m.data()),
                                         .v = f32(v.data()),
                                         .grad = ConstTensorView(f32(grad.data())),
                                         .lr = 1e-4f,
                                         .weight_decay = 0.01f,
                                         .step = ++step},
                                        mem::Stream::host());
  }
};

Status measure_cpu_optimizer(const MachineProfileOptions& o, Recorder& rec) {
  CpuOptimizerLoad load(o.optimizer_params);
  FERRY_TRY(load.run());  // first touch of the pages
  FERRY_ASSIGN_OR_RETURN(double s, median_seconds(o.reps, [&] { return load.run(); }));
  rec.set("cpu_optimizer_gparams_per_s", static_cast<double>(o.optimizer_params) / s / 1e9);
  return ok_status();
}

// "256 MiB", or "1052672 bytes" when not a whole number of MiB.
std::string mib_or_bytes(std::size_t b) {
  return b % (1u << 20) == 0 ? fmt::format("{} MiB", b >> 20) : fmt::format("{} bytes", b);
}

Status check_nvme_options(const MachineProfileOptions& o) {
  if (o.nvme_record_bytes == 0) {
    return invalid_argument(
        "plan: NVMe measurement record of 0 bytes (nvme_record_bytes must be > 0)");
  }
  if (o.nvme_record_bytes > o.nvme_bytes) {
    return invalid_argument(
        "plan: NVMe measurement record of {} is larger than the {} to write and read back "
        "(nvme_record_bytes <= nvme_bytes; ferry plan: --nvme-record-mib <= --nvme-measure-mib)",
        mib_or_bytes(o.nvme_record_bytes), mib_or_bytes(o.nvme_bytes));
  }
  return ok_status();
}

// The executor's NVMe pattern (stream_executor.cpp store_boundary / fetch_into): one record-sized
// buffer in `staging_tier` (its bounce buffer, in the tier the executor would use), each record
// written with NvmeStore::write (submit, wait) before the next, and in the backward read back with
// NvmeStore::read one at a time. A pass writes every record in order, then reads every record
// last-written first (the backward fetches the deepest boundary first); the first, untimed write
// pass lays out the file, as the executor's warm-up step does before the timed ones.
Status measure_nvme(const MachineProfileOptions& o, mem::MemTier staging_tier, Recorder& rec,
                    MachineProfile& p) {
  const std::size_t records = o.nvme_bytes / o.nvme_record_bytes;
  mem::MemoryBudget nvme_budget(mem::MemTier::kNvme);
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<mem::NvmeStore> store,
                         mem::NvmeStore::open({.dir = o.nvme_dir,
                                               .name = "machine-profile",
                                               .record_bytes = o.nvme_record_bytes,
                                               .capacity_records = records},
                                              nvme_budget));
  mem::MemoryBudget host(staging_tier);
  FERRY_ASSIGN_OR_RETURN(mem::Buffer bounce,
                         mem::Buffer::allocate(staging_tier, store->record_stride(), host,
                                               {.what = "nvme profile bounce buffer"}));
  std::memset(bounce.data(), 0x5a, bounce.size());
  std::vector<mem::RecordId> ids;
  for (std::size_t i = 0; i < records; ++i) {
    FERRY_ASSIGN_OR_RETURN(mem::RecordId id, store->allocate());
    ids.push_back(id);
  }
  auto pass = [&](bool write) -> Status {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      FERRY_TRY(write ? store->write(ids[i], bounce.data())
                      : store->read(ids[ids.size() - 1 - i], bounce.data()));
    }
    return ok_status();
  };
  FERRY_TRY(pass(true));  // untimed: allocates the file's blocks
  std::vector<double> tw, tr;
  for (int r = 0; r < o.reps; ++r) {
    FERRY_ASSIGN_OR_RETURN(double w, seconds([&] { return pass(true); }));
    FERRY_ASSIGN_OR_RETURN(double rd, seconds([&] { return pass(false); }));
    tw.push_back(w);
    tr.push_back(rd);
  }
  // The bytes that move: each record's stride (its size rounded up to 4 KiB), as the executor
  // counts them (TransferStats::nvme_write / nvme_read).
  const double bytes = static_cast<double>(records * store->record_stride());
  rec.set("nvme_write_gbps", bytes / median(tw) / 1e9);
  rec.set("nvme_read_gbps", bytes / median(tr) / 1e9);
  p.measured_by += fmt::format(
      "; NVMe: {} records of {} one at a time (submit, wait, next: the executor's bounce-buffer "
      "pattern), all written in order then read back last first, {} staging, median of {} "
      "passes, {}",
      records, mib_or_bytes(o.nvme_record_bytes),
      staging_tier == mem::MemTier::kPinnedHost ? "pinned" : "pageable", o.reps,
      !store->direct_io_active() ? "buffered I/O (the folder refused O_DIRECT; reads may come "
                                   "from the page cache)"
      : store->io_uring_active() ? "O_DIRECT through io_uring"
                                 : "O_DIRECT through pread/pwrite");
  return ok_status();
}

// Everything that needs the GPU: link rates, GEMM, attention, elementwise.
class GpuBench {
 public:
  GpuBench(const model::ModelConfig& cfg, const MachineProfileOptions& o, kernels::Backend& be)
      : cfg_(cfg), o_(o), be_(be) {}

  Status run(Recorder& rec) {
    FERRY_ASSIGN_OR_RETURN(mem::StreamSet ss, mem::StreamSet::create(Device::kCuda, 0));
    ss_ = std::make_unique<mem::StreamSet>(std::move(ss));
    FERRY_ASSIGN_OR_RETURN(te_, mem::cuda_transfer_engine(0));
    const std::size_t n = o_.link_bytes;
    FERRY_ASSIGN_OR_RETURN(pin_a_, pinned(n, "profile pinned a"));
    FERRY_ASSIGN_OR_RETURN(pin_b_, pinned(n, "profile pinned b"));
    FERRY_ASSIGN_OR_RETURN(dev_a_, device(n, "profile device a"));
    FERRY_ASSIGN_OR_RETURN(dev_b_, device(n, "profile device b"));
    // bf16 0.0099 everywhere: finite inputs for the kernels below.
    auto* h = reinterpret_cast<std::uint16_t*>(pin_a_.data());
    std::fill(h, h + n / 2, std::uint16_t{0x3c23});
    std::memcpy(pin_b_.data(), pin_a_.data(), n);
    FERRY_TRY(links(rec));
    FERRY_TRY(elementwise(rec));
    FERRY_TRY(gemm(rec));
    return attention(rec);
  }

 private:
  Result<mem::Buffer> pinned(std::size_t n, const char* what) {
    return mem::Buffer::allocate(mem::MemTier::kPinnedHost, n, pinned_budget_, {.what = what});
  }
  Result<mem::Buffer> device(std::size_t n, const char* what) {
    return mem::Buffer::allocate(mem::MemTier::kDevice, n, device_budget_, {.what = what});
  }
  // Device buffer of n bytes filled from the pinned pattern.
  Result<mem::Buffer> filled(std::size_t n, const char* what) {
    FERRY_ASSIGN_OR_RETURN(mem::Buffer b, device(n, what));
    for (std::size_t off = 0; off < n; off += o_.link_bytes) {
      FERRY_TRY(
          te_->h2d(b.data() + off, pin_a_.data(), std::min(o_.link_bytes, n - off), ss_->h2d()));
    }
    FERRY_TRY(ss_->h2d().synchronize());
    return b;
  }

  Status links(Recorder& rec) {
    const std::size_t n = o_.link_bytes;
    const double bytes = static_cast<double>(n);
    auto h2d = [&]() -> Status {
      FERRY_TRY(te_->h2d(dev_a_.data(), pin_a_.data(), n, ss_->h2d()));
      return ss_->h2d().synchronize();
    };
    auto d2h = [&]() -> Status {
      FERRY_TRY(te_->d2h(pin_b_.data(), dev_b_.data(), n, ss_->d2h()));
      return ss_->d2h().synchronize();
    };
    auto duplex = [&]() -> Status {
      FERRY_TRY(te_->h2d(dev_a_.data(), pin_a_.data(), n, ss_->h2d()));
      FERRY_TRY(te_->d2h(pin_b_.data(), dev_b_.data(), n, ss_->d2h()));
      FERRY_TRY(ss_->h2d().synchronize());
      return ss_->d2h().synchronize();
    };
    FERRY_TRY(duplex());  // warm-up
    FERRY_ASSIGN_OR_RETURN(double t_h2d, median_seconds(o_.reps, h2d));
    FERRY_ASSIGN_OR_RETURN(double t_d2h, median_seconds(o_.reps, d2h));
    FERRY_ASSIGN_OR_RETURN(double t_dup, median_seconds(o_.reps, duplex));
    rec.set("h2d_gbps", bytes / t_h2d / 1e9);
    rec.set("d2h_gbps", bytes / t_d2h / 1e9);
    rec.set("duplex_gbps", 2 * bytes / t_dup / 1e9);

    // The same duplex copies while the CPU optimizer streams host memory on all cores.
    CpuOptimizerLoad load(o_.optimizer_params);
    std::atomic<bool> stop{false};
    Status load_status;
    std::thread cpu([&] {
      while (!stop.load(std::memory_order_relaxed) && load_status.ok()) load_status = load.run();
    });
    Result<double> t_loaded = median_seconds(o_.reps, duplex);
    stop = true;
    cpu.join();
    FERRY_TRY(load_status);
    FERRY_ASSIGN_OR_RETURN(double tl, std::move(t_loaded));
    rec.set("duplex_loaded_gbps", 2 * bytes / tl / 1e9);
    return ok_status();
  }

  Status elementwise(Recorder& rec) {
    const std::int64_t n = static_cast<std::int64_t>(o_.link_bytes / 2);
    FERRY_ASSIGN_OR_RETURN(mem::Buffer out, device(o_.link_bytes, "profile add out"));
    const kernels::AddArgs a{
        .out = bf16(out, {n}), .a = cbf16(dev_a_, {n}), .b = cbf16(dev_b_, {n})};
    auto run = [&]() -> Status {
      FERRY_TRY(be_.add(a, ss_->compute()));
      return ss_->compute().synchronize();
    };
    FERRY_TRY(run());
    FERRY_ASSIGN_OR_RETURN(double t, median_seconds(o_.reps, run));
    rec.set("hbm_gbps", 3.0 * static_cast<double>(o_.link_bytes) / t / 1e9);
    return ok_status();
  }

  Status gemm(Recorder& rec) {
    const std::int64_t m = o_.gemm_tokens, c = cfg_.hidden_size, d = cfg_.head_dim,
                       h = cfg_.num_attention_heads, g = cfg_.num_key_value_heads,
                       f = cfg_.is_moe() ? cfg_.moe_intermediate_size : cfg_.intermediate_size;
    // (N, K) of y = x W^T for q/k/v, o, gate+up, down.
    const std::pair<std::int64_t, std::int64_t> shapes[] = {
        {(h + 2 * g) * d, c}, {c, h * d}, {2 * f, c}, {c, f}};
    std::int64_t max_k = 0, max_nk = 0, max_n = 0;
    double flops = 0;
    for (auto [n, k] : shapes) {
      max_k = std::max(max_k, k);
      max_nk = std::max(max_nk, n * k);
      max_n = std::max(max_n, n);
      flops += 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    }
    FERRY_ASSIGN_OR_RETURN(mem::Buffer x, filled(static_cast<std::size_t>(m * max_k) * 2, "x"));
    FERRY_ASSIGN_OR_RETURN(mem::Buffer w, filled(static_cast<std::size_t>(max_nk) * 2, "w"));
    FERRY_ASSIGN_OR_RETURN(mem::Buffer y, device(static_cast<std::size_t>(m * max_n) * 2, "y"));
    auto run = [&]() -> Status {
      for (auto [n, k] : shapes) {
        FERRY_TRY(be_.gemm(
            {.out = bf16(y, {m, n}), .a = cbf16(x, {m, k}), .b = cbf16(w, {n, k}), .trans_b = true},
            ss_->compute()));
      }
      return ss_->compute().synchronize();
    };
    FERRY_TRY(run());  // workspace + autotuning
    FERRY_ASSIGN_OR_RETURN(double t, median_seconds(o_.reps, run));
    rec.set("gemm_tflops", flops / t / 1e12);
    return ok_status();
  }

  Status attention(Recorder& rec) {
    const std::int64_t s = o_.seq_len, b = std::max<std::int64_t>(1, o_.attention_tokens / s),
                       t = s * b, h = cfg_.num_attention_heads, g = cfg_.num_key_value_heads,
                       d = cfg_.head_dim;
    const auto bytes = [](std::int64_t elems) { return static_cast<std::size_t>(elems) * 2; };
    FERRY_ASSIGN_OR_RETURN(mem::Buffer q, filled(bytes(t * h * d), "q"));
    FERRY_ASSIGN_OR_RETURN(mem::Buffer k, filled(bytes(t * g * d), "k"));
    FERRY_ASSIGN_OR_RETURN(mem::Buffer v, filled(bytes(t * g * d), "v"));
    FERRY_ASSIGN_OR_RETURN(mem::Buffer d_out, filled(bytes(t * h * d), "d_out"));
    FERRY_ASSIGN_OR_RETURN(mem::Buffer out, device(bytes(t * h * d), "out"));
    FERRY_ASSIGN_OR_RETURN(mem::Buffer dq, device(bytes(t * h * d), "dq"));
    FERRY_ASSIGN_OR_RETURN(mem::Buffer dk, device(bytes(t * g * d), "dk"));
    FERRY_ASSIGN_OR_RETURN(mem::Buffer dv, device(bytes(t * g * d), "dv"));
    FERRY_ASSIGN_OR_RETURN(mem::Buffer lse, device(static_cast<std::size_t>(h * t) * 4, "lse"));
    FERRY_ASSIGN_OR_RETURN(mem::Buffer cu, device(static_cast<std::size_t>(b + 1) * 4, "cu"));
    auto* hcu = reinterpret_cast<std::int32_t*>(pin_b_.data());
    for (std::int64_t i = 0; i <= b; ++i) hcu[i] = static_cast<std::int32_t>(i * s);
    FERRY_TRY(te_->h2d(cu.data(), pin_b_.data(), static_cast<std::size_t>(b + 1) * 4, ss_->h2d()));
    FERRY_TRY(ss_->h2d().synchronize());
    const auto i32 = [](const mem::Buffer& buf, std::int64_t n) {
      return ConstTensorView(TensorView::contiguous(buf.data(), DType::kI32, Device::kCuda, {n}));
    };
    const kernels::AttentionArgs fa{
        .out = bf16(out, {t, h, d}),
        .lse = TensorView::contiguous(lse.data(), DType::kF32, Device::kCuda, {h, t}),
        .q = cbf16(q, {t, h, d}),
        .k = cbf16(k, {t, g, d}),
        .v = cbf16(v, {t, g, d}),
        .cu_seqlens = i32(cu, b + 1)};
    kernels::AttentionBackwardArgs ba{.d_q = bf16(dq, {t, h, d}),
                                      .d_k = bf16(dk, {t, g, d}),
                                      .d_v = bf16(dv, {t, g, d}),
                                      .d_out = cbf16(d_out, {t, h, d}),
                                      .q = fa.q,
                                      .k = fa.k,
                                      .v = fa.v,
                                      .out = ConstTensorView(fa.out),
                                      .lse = ConstTensorView(fa.lse),
                                      .cu_seqlens = fa.cu_seqlens};
    mem::Buffer ws;
    if (const std::size_t wb = be_.workspace_bytes(ba); wb > 0) {
      FERRY_ASSIGN_OR_RETURN(ws, device(wb, "attention backward workspace"));
      ba.workspace = TensorView::contiguous(ws.data(), DType::kU8, Device::kCuda,
                                            {static_cast<std::int64_t>(wb)});
    }
    auto fwd = [&]() -> Status {
      FERRY_TRY(be_.attention(fa, ss_->compute()));
      return ss_->compute().synchronize();
    };
    auto fwd_bwd = [&]() -> Status {
      FERRY_TRY(be_.attention(fa, ss_->compute()));
      FERRY_TRY(be_.attention_backward(ba, ss_->compute()));
      return ss_->compute().synchronize();
    };
    FERRY_TRY(fwd_bwd());
    FERRY_ASSIGN_OR_RETURN(double tf, median_seconds(o_.reps, fwd));
    FERRY_ASSIGN_OR_RETURN(double tfb, median_seconds(o_.reps, fwd_bwd));
    // Causal: half of the S x S scores; backward does 2.5x the forward's FLOPs.
    const double fwd_flops =
        4.0 * static_cast<double>(b * h * d) * (static_cast<double>(s * s) / 2);
    rec.set("attn_fwd_tflops", fwd_flops / tf / 1e12);
    rec.set("attn_bwd_tflops", 2.5 * fwd_flops / std::max(tfb - tf, 1e-9) / 1e12);
    return ok_status();
  }

  static TensorView bf16(const mem::Buffer& b, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(b.data(), DType::kBF16, Device::kCuda, shape);
  }
  static ConstTensorView cbf16(const mem::Buffer& b, std::initializer_list<std::int64_t> shape) {
    return ConstTensorView(bf16(b, shape));
  }

  const model::ModelConfig& cfg_;
  const MachineProfileOptions& o_;
  kernels::Backend& be_;
  mem::MemoryBudget pinned_budget_{mem::MemTier::kPinnedHost};
  mem::MemoryBudget device_budget_{mem::MemTier::kDevice};
  std::unique_ptr<mem::StreamSet> ss_;
  std::unique_ptr<mem::TransferEngine> te_;
  mem::Buffer pin_a_, pin_b_, dev_a_, dev_b_;
};

}  // namespace

Result<MachineProfile> measure_machine(const model::ModelConfig& cfg,
                                       const MachineProfileOptions& opts) {
  if (opts.reps < 1 || opts.link_bytes < 4096 || opts.optimizer_params < 1 || opts.seq_len < 1) {
    return invalid_argument("plan: machine profile options out of range (reps, sizes, seq)");
  }
  if (cfg.hidden_size <= 0 || cfg.num_attention_heads <= 0 || cfg.head_dim <= 0) {
    return invalid_argument(
        "plan: machine profile needs a model geometry (hidden, heads, head_dim)");
  }
  if (!opts.nvme_dir.empty()) FERRY_TRY(check_nvme_options(opts));
  MachineProfile p;
  p.machine = opts.machine;
  p.cpu_threads = static_cast<int>(std::thread::hardware_concurrency());
  p.measured_by = fmt::format(
      "ferry plan --measure-machine (geometry {}, seq {}, {} reps, link copies of {} MiB)",
      geometry_key(cfg), opts.seq_len, opts.reps, opts.link_bytes >> 20);
  Recorder rec(p);
  FERRY_TRY(measure_cpu_optimizer(opts, rec));
  Result<kernels::Backend*> cuda = kernels::cuda_backend(0);
  if (opts.nvme_dir.empty()) {
    rec.skip({"nvme_read_gbps", "nvme_write_gbps"}, "no --nvme-dir given");
  } else {
    // The staging the executor uses: pinned (cudaHostAlloc) beside a GPU, where O_DIRECT moves
    // pages that are already locked; pageable host memory in a CPU build, as its executor's.
    FERRY_TRY(measure_nvme(
        opts, cuda.ok() ? mem::MemTier::kPinnedHost : mem::MemTier::kPageableHost, rec, p));
  }
  if (!cuda.ok()) {
    p.gpu = "none";
    rec.skip({"h2d_gbps", "d2h_gbps", "duplex_gbps", "duplex_loaded_gbps", "hbm_gbps",
              "gemm_tflops", "attn_fwd_tflops", "attn_bwd_tflops"},
             std::string(cuda.status().message()));
  } else {
    // The card's name where the runtime gives one (a profile says which GPU measured it).
    const mem::CudaInfo info = mem::query_cuda_info();
    p.gpu = info.devices.empty() ? std::string("cuda:0") : "cuda:0 " + info.devices.front().name;
    GpuBench bench(cfg, opts, **cuda);
    FERRY_TRY(bench.run(rec));
  }
  return p;
}

void apply_machine_profile(const MachineProfile& prof, MachineSpec& spec) {
  MachineSpec measured = prof.spec;
  for (const std::string& f : prof.measured) {
    if (const Field* field = find_field(f)) field->ref(spec) = field->ref(measured);
  }
  spec.name = prof.machine;
}

Json to_json(const MachineProfile& p) {
  Json rates = Json::object();
  MachineSpec spec = p.spec;
  for (const Field& f : kFields) rates[f.name] = f.ref(spec);
  Json not_measured = Json::array();
  for (const NotMeasured& n : p.not_measured) {
    not_measured.push_back({{"field", n.field}, {"why", n.why}});
  }
  return {{"format", "ferry-machine-profile"},
          {"version", 1},
          {"machine", p.machine},
          {"measured_by", p.measured_by},
          {"gpu", p.gpu},
          {"cpu_threads", p.cpu_threads},
          {"rates", rates},
          {"measured", p.measured},
          {"not_measured", not_measured}};
}

Result<MachineProfile> machine_profile_from_json(const Json& j) {
  try {
    if (j.at("format").get<std::string>() != "ferry-machine-profile" ||
        j.at("version").get<int>() != 1) {
      return corrupt("plan: not a version-1 ferry-machine-profile document");
    }
    MachineProfile p;
    p.machine = j.at("machine").get<std::string>();
    p.measured_by = j.at("measured_by").get<std::string>();
    p.gpu = j.at("gpu").get<std::string>();
    p.cpu_threads = j.at("cpu_threads").get<int>();
    for (const Field& f : kFields) f.ref(p.spec) = j.at("rates").at(f.name).get<double>();
    for (const Json& m : j.at("measured")) {
      std::string name = m.get<std::string>();
      const Field* f = find_field(name);
      if (f == nullptr) return corrupt("plan: machine profile names unknown field '{}'", name);
      if (!(f->ref(p.spec) > 0)) {
        return corrupt("plan: machine profile's measured {} is not positive", name);
      }
      p.measured.push_back(std::move(name));
    }
    for (const Json& n : j.at("not_measured")) {
      p.not_measured.push_back({n.at("field").get<std::string>(), n.at("why").get<std::string>()});
    }
    p.spec.name = p.machine;
    return p;
  } catch (const Json::exception& e) {
    return corrupt("plan: machine profile json: {}", e.what());
  }
}

Result<MachineProfile> read_machine_profile(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  FERRY_ASSIGN_OR_RETURN(Json j, parse_json(text, path));
  Result<MachineProfile> p = machine_profile_from_json(j);
  if (!p.ok()) return p.status().with_context(path);
  return p;
}

Status write_machine_profile(const std::string& path, const MachineProfile& p) {
  return write_file_atomic(path, to_json(p).dump(1) + "\n");
}

std::string default_machine_profile_path(const std::string& machine) {
  // default_profile_path() is <cache>/plan/<machine>__<geometry>.json; same folder.
  return default_profile_path("machine", machine);
}

}  // namespace ferry::plan
