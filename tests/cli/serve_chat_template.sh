#!/bin/bash
# `ferry serve --model DIR` and the model's chat template (model/tokenizer/chat_renderer.h):
# plain ChatML and another Jinja template from tokenizer_config.json both render chat (checked
# through /tokenize: the ids of the messages equal the ids of the text the template makes);
# --chat-template FILE renders a template file; a template using a construct ferry's Jinja subset
# leaves out (a macro), or no template, refuses /v1/chat/completions with a 400 that says why
# while /v1/completions still serves; --chat-template chatml forces ChatML.
# Model: the Qwen3 fixture with the qwen2 tokenizer fixture (its vocabulary is larger than the
# model's, which the requests here never reach: nothing is generated).
set -u
FERRY=$1; ROOT=$2
tmp=$(mktemp -d)
spid=""
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err "$tmp"/*.json; do [ -f "$f" ] && { echo "== $f"; tail -20 "$f"; }; done; exit 1; }
cleanup() { [ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

model=$tmp/model
mkdir -p "$model"
cp "$ROOT"/tests/data/models/qwen3/* "$model/"
cp "$ROOT"/tests/data/tokenizer/qwen2/tokenizer.json "$model/"

start() {  # start LABEL [flags...]: serves $model, sets URL
  local label=$1; shift
  "$FERRY" serve --model "$model" --port 0 "$@" >"$tmp/$label.out" 2>"$tmp/$label.err" &
  spid=$!
  for _ in $(seq 300); do grep -q "^listening port=" "$tmp/$label.out" && break; sleep 0.1; done
  local port
  port=$(sed -n 's/^listening port=\([0-9]*\).*/\1/p' "$tmp/$label.out")
  [ -n "$port" ] || fail "$label: server did not start"
  URL=http://127.0.0.1:$port
}
stop() { kill -TERM "$spid"; wait "$spid"; spid=""; }
MSGS='[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]'
chat_status() {  # the HTTP status of a chat completion
  curl -s -o "$tmp/chat.json" -w '%{http_code}' "$URL/v1/chat/completions" \
    -H 'Content-Type: application/json' -d "{\"messages\": $MSGS}"
}
tokens() {  # tokens BODY: the ids /tokenize answers
  curl -sf "$URL/tokenize" -d "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])'
}
set_template() {  # set_template TEMPLATE: tokenizer_config.json with it (and a bos token)
  python3 - "$model/tokenizer_config.json" "$1" <<'PY'
import json, sys
json.dump({"bos_token": "<|endoftext|>", "chat_template": sys.argv[2]}, open(sys.argv[1], "w"))
PY
}

# ChatML from the fixture's tokenizer_config.json.
cp "$ROOT"/tests/data/tokenizer/qwen2/tokenizer_config.json "$model/"
start chatml
want=$(tokens '{"prompt": "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}')
got=$(tokens "{\"messages\": $MSGS}")
[ -n "$got" ] && [ "$got" = "$want" ] || fail "ChatML: messages gave $got, the ChatML text $want"
stop

# Another template, rendered by the Jinja subset: role headers after the bos token.
set_template "{{ bos_token }}{% for m in messages %}[{{ m['role'] | upper }}] {{ m.content }}
{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
start jinja
want=$(tokens '{"prompt": "<|endoftext|>[SYSTEM] be brief\n[USER] hi\n[ASSISTANT]"}')
got=$(tokens "{\"messages\": $MSGS}")
[ -n "$got" ] && [ "$got" = "$want" ] || fail "Jinja template: messages gave $got, want $want"
grep -q "chat template: jinja" "$tmp/jinja.err" || fail "the template kind is not logged"
stop

# --chat-template FILE.
printf '%s' "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}" >"$tmp/t.jinja"
start file --chat-template "$tmp/t.jinja"
want=$(tokens '{"prompt": "<system>be brief<user>hi"}')
got=$(tokens "{\"messages\": $MSGS}")
[ -n "$got" ] && [ "$got" = "$want" ] || fail "template file: messages gave $got, want $want"
stop

# A construct the subset leaves out: refused with the reason; completions still serve.
set_template "{% macro role(m) %}{{ m.role }}{% endmacro %}{% for m in messages %}{{ role(m) }}{% endfor %}"
start macro
code=$(chat_status)
[ "$code" = 400 ] || fail "macro template: chat gave $code"
grep -q "macro" "$tmp/chat.json" || fail "refusal without its reason: $(cat "$tmp/chat.json")"
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/tokenize" -d '{"prompt": "hi"}')
[ "$code" = 200 ] || fail "macro template: /tokenize of text gave $code"
stop

# --chat-template chatml forces ChatML over it.
start forced --chat-template chatml
code=$(chat_status)
grep -q "refused" "$tmp/chat.json" && fail "--chat-template chatml still refused"
stop

# No chat template at all: refused the same way.
rm "$model/tokenizer_config.json"
start none
code=$(chat_status)
[ "$code" = 400 ] || fail "no template: chat gave $code"
grep -q "no chat template" "$tmp/chat.json" || fail "no-template refusal: $(cat "$tmp/chat.json")"
stop
echo "serve_chat_template: ok"
