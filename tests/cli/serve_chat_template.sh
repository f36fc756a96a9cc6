#!/bin/bash
# `ferry serve --model DIR` and the model's chat template: a tokenizer_config.json with plain
# ChatML renders chat (here /tokenize with messages: no generation needed); another template, or
# none, refuses /v1/chat/completions with a 400 that says why (instead of a silently wrong ChatML
# prompt) while /v1/completions still serves; --chat-template chatml forces ChatML.
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
chat_status() {  # the HTTP status of a chat completion
  curl -s -o "$tmp/chat.json" -w '%{http_code}' "$URL/v1/chat/completions" \
    -H 'Content-Type: application/json' -d '{"messages": [{"role": "user", "content": "hi"}]}'
}

# ChatML: chat is rendered (/tokenize with messages answers with the rendered prompt's ids).
cp "$ROOT"/tests/data/tokenizer/qwen2/tokenizer_config.json "$model/"
start chatml
code=$(curl -s -o "$tmp/tok.json" -w '%{http_code}' "$URL/tokenize" \
  -d '{"messages": [{"role": "user", "content": "hi"}]}')
[ "$code" = 200 ] || fail "ChatML model: /tokenize messages gave $code"
grep -q '"tokens"' "$tmp/tok.json" || fail "ChatML model: no tokens"
stop

# Another template: chat refused with the reason, completions and /tokenize of text still work.
python3 - "$model/tokenizer_config.json" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["chat_template"] = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
json.dump(c, open(p, "w"))
PY
start other
code=$(chat_status)
[ "$code" = 400 ] || fail "non-ChatML template: chat gave $code"
grep -q "not plain ChatML" "$tmp/chat.json" || fail "refusal without its reason: $(cat "$tmp/chat.json")"
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/tokenize" -d '{"prompt": "hi"}')
[ "$code" = 200 ] || fail "non-ChatML template: /tokenize of text gave $code"
stop

# --chat-template chatml forces ChatML: chat is no longer refused (the request then reaches the
# engine; whatever it answers, it is not the refusal).
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
