# Sourced by CLI tests (tests/cli/lib is not itself a test): bench_model_dir DIR writes DIR/config.json,
# the model of `ferry bench train --layers 12 --hidden 64 ...` (the built-in Qwen3 layout: 12 layers,
# C 64, F 64, 4/2 heads of 16, the built-in 259-word vocabulary) as a model folder for ferry plan.
bench_model_dir() {
  mkdir -p "$1"
  python3 - "$1/config.json" <<'PY'
import json, sys
json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 259,
           "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 12,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": True},
          open(sys.argv[1], "w"))
PY
}
