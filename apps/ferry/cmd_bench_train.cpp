// SPDX-License-Identifier: Apache-2.0
// `ferry bench train`: the streaming trainer's step throughput per activation policy on a
// random-weight model of a chosen geometry (src/train/train_bench.h).
//   ferry bench train --device cuda --layers 8 --hidden 2048 --heads 16 --kv-heads 2
//       --head-dim 128 --intermediate 11008 --batch-size 4 --seq-len 1024
//       --policies device,every:4,host --json r.json   (one line)
//   ferry bench train --device cuda --geometry qwen2.5-7b ...   (a published model's shapes,
//       vocabulary and embedding tying; random weights and token ids)
#include <cstdio>
#include <fstream>
#include <memory>

#include "apps/ferry/commands.h"
#include "apps/ferry/device_update_flags.h"
#include "plan/geometry.h"
#include "train/stream/activation_policy.h"
#include "train/train_bench.h"

namespace ferry::app {
namespace {

int run_bench_train(const train::TrainBenchConfig& cfg, const std::string& json_out) {
  auto r = train::run_train_bench(cfg);
  if (!r.ok()) return fail(r.status());
  if (json_out != "-") std::fputs(train::format_train_bench(*r).c_str(), stdout);
  if (json_out == "-") {
    std::printf("%s\n", r->dump(2).c_str());
  } else if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << r->dump(2) << "\n";
    if (!f) return fail(io_error("bench train: cannot write {}", json_out));
  }
  return 0;
}

void register_bench_train(CLI::App& app, CommandFn& run) {
  auto cfg = std::make_shared<train::TrainBenchConfig>();
  auto json_out = std::make_shared<std::string>();
  auto states = std::make_shared<std::string>("fp32");
  auto master = std::make_shared<std::string>("fp32");
  auto batch = std::make_shared<std::string>("4");
  auto budget_mib = std::make_shared<std::int64_t>(0);
  auto* cmd = bench_cmd(app)->add_subcommand(
      "train", "streaming trainer step throughput per activation policy (docs/train.md)");
  auto geometry = std::make_shared<std::string>();
  auto untied = std::make_shared<bool>(false);
  cmd->add_option("--device", cfg->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  auto* geo_opt = cmd->add_option(
      "--geometry", *geometry,
      "a published model's shapes, vocabulary and tying (ferry plan's names: qwen2.5-3b, "
      "qwen2.5-7b, ...; --layers may still cut the depth)");
  cmd->add_option("--layers", cfg->model.layers, "decoder layers")->check(CLI::Range(1, 256));
  cmd->add_option("--arch", cfg->model.model_type,
                  "qwen3 (q/k norm, no biases; default) or qwen2 (q/k/v biases, no q/k norm: "
                  "the Qwen2.5 models' own architecture)")
      ->check(CLI::IsMember({"qwen3", "qwen2"}));
  const std::vector<CLI::Option*> shape = {
      cmd->add_option("--hidden", cfg->model.hidden, "hidden size C")->check(CLI::Range(8, 16384)),
      cmd->add_option("--heads", cfg->model.heads, "attention heads H")->check(CLI::Range(1, 256)),
      cmd->add_option("--kv-heads", cfg->model.kv_heads, "key/value heads G")
          ->check(CLI::Range(1, 256)),
      cmd->add_option("--head-dim", cfg->model.head_dim, "head dim D (the GPU: 16, 32, 64, 128)")
          ->check(CLI::Range(8, 256)),
      cmd->add_option("--intermediate", cfg->model.intermediate, "MLP width F")
          ->check(CLI::Range(8, 1 << 17)),
      cmd->add_option("--vocab", cfg->model.vocab,
                      "embedding rows (default: the built-in tokenizer's 259; token ids are "
                      "random)")
          ->check(CLI::Range(8, 1 << 20)),
      cmd->add_flag("--untied-embeddings", *untied,
                    "lm_head is a matrix of its own, not the embedding")};
  for (CLI::Option* o : shape) o->excludes(geo_opt);
  cmd->add_option("--batch-size", *batch,
                  "sequences per micro-batch, or auto: per policy the largest batch (<= "
                  "--max-batch) whose device plan fits --device-budget-mib");
  cmd->add_option("--max-batch", cfg->max_batch, "the largest batch --batch-size auto tries")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--device-budget-mib", *budget_mib,
                  "device-tier budget (a GPU-memory cap); 0 = unlimited")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 30));
  cmd->add_option("--seq-len", cfg->seq, "tokens per sequence")
      ->check(CLI::Range(std::int64_t{2}, std::int64_t{1} << 20));
  cmd->add_option("--grad-accum", cfg->accum,
                  "micro-batches (each --batch-size x --seq-len) per optimizer step")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--steps", cfg->steps, "timed steps per policy")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", cfg->warmup, "untimed steps first")->check(CLI::Range(0, 1000));
  cmd->add_option("--policies", cfg->policies,
                  "activation policies, in order; plan=FILE: the boundary homes of a ferry plan "
                  "JSON")
      ->delimiter(',');
  cmd->add_option("--prefetch", cfg->prefetch, "weight slots prefetched ahead")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--gemm-precision", cfg->gemm_precision,
                  "stream: linear layers' GEMMs: bf16 (operands rounded to bf16, f32 "
                  "accumulation; PyTorch autocast), f32, or auto (bf16 on cuda, f32 on cpu)")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  add_device_update_flags(cmd, cfg->device_update_layers, cfg->device_update_slots, "",
                          TailAuto::kBenchPlan);
  add_resident_layers_flag(cmd, cfg->resident_layers, "");
  add_head_update_flag(cmd, cfg->head_update, "");
  add_device_prestage_flag(cmd, cfg->device_update_prestage, "");
  cmd->add_option("--optimizer-threads", cfg->optimizer_threads,
                  "AdamW threads (0: 1 beside CPU compute, all cores but two beside a GPU)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--optimizer-states", *states, "AdamW states: fp32 or 8bit (block-wise)")
      ->check(CLI::IsMember({"fp32", "8bit"}));
  cmd->add_option("--grad-dtype", cfg->grad_dtype,
                  "gradients in host memory and on the D2H: f32 or bf16 (half the bytes)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--weights-dtype", cfg->weights_dtype,
                  "fp32 master: weights computed with and streamed: bf16 (the master rounded), "
                  "f32, or auto (bf16 on cuda)")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  cmd->add_option("--master", *master,
                  "master weights: fp32 (f32 weights on the link), bf16-kahan or bf16-sr (bf16 "
                  "weights on the link, half the bytes)")
      ->check(CLI::IsMember({"fp32", "bf16-kahan", "bf16-sr"}));
  cmd->add_option("--peak-tflops", cfg->peak_tflops, "MFU denominator (default: known GPU peak)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", cfg->seed, "seed of the weights and tokens");
  cmd->add_option("--json", *json_out, "write the JSON report here (-: stdout, no table)");
  CLI::Option* layers_opt = cmd->get_option("--layers");
  cmd->callback(
      [cfg, json_out, states, master, batch, budget_mib, geometry, layers_opt, untied, &run] {
        // --policies is split on commas, which a +keep:LIST of layers also holds: put those back.
        cfg->policies = train::stream::rejoin_keep_lists(cfg->policies);
        if (!geometry->empty()) {
          auto g = plan::builtin_geometry(*geometry);
          if (!g.ok()) throw CLI::ValidationError("--geometry", g.status().message());
          train::BuiltinModelSpec& m = cfg->model;
          if (layers_opt->count() == 0) m.layers = static_cast<int>(g->num_hidden_layers);
          m.hidden = static_cast<int>(g->hidden_size);
          m.heads = static_cast<int>(g->num_attention_heads);
          m.kv_heads = static_cast<int>(g->num_key_value_heads);
          m.head_dim = static_cast<int>(g->head_dim);
          m.intermediate = static_cast<int>(g->intermediate_size);
          m.vocab = static_cast<int>(g->vocab_size);
          m.tie_embeddings = g->tie_word_embeddings;
        } else if (*untied) {
          cfg->model.tie_embeddings = false;
        }
        if (*batch == "auto") {
          cfg->batch_auto = true;
          if (*budget_mib <= 0) {
            throw CLI::ValidationError("--batch-size", "auto needs --device-budget-mib (the cap)");
          }
        } else {
          try {
            std::size_t used = 0;
            cfg->batch = std::stoi(*batch, &used);
            if (used != batch->size() || cfg->batch < 1 || cfg->batch > 4096)
              throw std::exception();
          } catch (const std::exception&) {
            throw CLI::ValidationError("--batch-size", "expected 1..4096 or auto, got " + *batch);
          }
        }
        if (*budget_mib > 0) cfg->device_budget_bytes = static_cast<std::size_t>(*budget_mib) << 20;
        auto st = train::parse_optimizer_states(*states);
        if (!st.ok()) throw CLI::ValidationError("--optimizer-states", st.status().message());
        cfg->optim.states = *st;
        auto mw = train::parse_master_weights(*master);
        if (!mw.ok()) throw CLI::ValidationError("--master", mw.status().message());
        cfg->optim.master = *mw;
        if (cfg->model.hidden != cfg->model.heads * cfg->model.head_dim) {
          throw CLI::ValidationError("--hidden", "must equal --heads x --head-dim");
        }
        if (cfg->model.heads % cfg->model.kv_heads != 0) {
          throw CLI::ValidationError("--kv-heads", "must divide --heads");
        }
        run = [cfg, json_out] { return run_bench_train(*cfg, *json_out); };
      });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_bench_train);
}  // namespace ferry::app
