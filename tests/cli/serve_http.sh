#!/bin/bash
# `ferry serve --port 0` (built-in MoE, byte tokenizer) over loopback with curl: /health, a
# completion, a streamed chat completion ending in data: [DONE], an lm-evaluation-harness style
# prompt scoring (echo + logprobs + max_tokens 0), a 400 for a bad body, /metrics; then SIGTERM
# stops it cleanly. Then a second server with FERRY_API_KEY: 401 without the key, 200 with it.
set -u
FERRY=$1; ROOT=$2
tmp=$(mktemp -d)
spid=""
fail() { echo "FAIL: $*"; for f in "$tmp"/*; do echo "== $f"; tail -20 "$f"; done; exit 1; }
cleanup() { [ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

"$FERRY" serve --port 0 --max-running 2 --http-threads 4 >"$tmp/serve.out" 2>"$tmp/serve.err" &
spid=$!
for _ in $(seq 300); do grep -q "^listening port=" "$tmp/serve.out" && break; sleep 0.1; done
port=$(sed -n 's/^listening port=\([0-9]*\).*/\1/p' "$tmp/serve.out")
[ -n "$port" ] || fail "server did not start"
URL=http://127.0.0.1:$port

curl -sf "$URL/health" >"$tmp/health.json" || fail "/health"
grep -q '"ok"' "$tmp/health.json" || fail "/health body"

curl -sf "$URL/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Hello", "max_tokens": 8, "ignore_eos": true}' >"$tmp/completion.json" \
  || fail "completion"
python3 - "$tmp/completion.json" <<'PY' || fail "completion body: $(cat "$tmp/completion.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["object"] == "text_completion", j
assert j["usage"]["completion_tokens"] == 8, j
assert j["choices"][0]["finish_reason"] == "length", j
assert isinstance(j["choices"][0]["text"], str), j
PY

curl -sfN "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": true}' \
  >"$tmp/chat.sse" || fail "streamed chat"
python3 - "$tmp/chat.sse" <<'PY' || fail "chat stream: $(cat "$tmp/chat.sse")"
import json, sys
events = [e for e in open(sys.argv[1]).read().split("\n\n") if e]
assert all(e.startswith("data: ") for e in events), events
assert events[-1] == "data: [DONE]", events[-1]
chunks = [json.loads(e[6:]) for e in events[:-1]]
assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
assert all(c["object"] == "chat.completion.chunk" for c in chunks)
assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
PY

curl -sf "$URL/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "score me", "max_tokens": 0, "echo": true, "logprobs": 1}' >"$tmp/score.json" \
  || fail "prompt scoring"
python3 - "$tmp/score.json" <<'PY' || fail "scoring body: $(cat "$tmp/score.json")"
import json, sys
j = json.load(open(sys.argv[1]))
c = j["choices"][0]
assert c["text"] == "score me", c
lp = c["logprobs"]
assert len(lp["tokens"]) == 8 and lp["token_logprobs"][0] is None, lp
assert all(x < 0 for x in lp["token_logprobs"][1:]), lp
assert j["usage"]["completion_tokens"] == 0, j
PY

code=$(curl -s -o "$tmp/bad.json" -w '%{http_code}' "$URL/v1/completions" -d '{oops')
[ "$code" = 400 ] || fail "malformed JSON gave $code"
grep -q '"error"' "$tmp/bad.json" || fail "error body"

curl -sf "$URL/metrics" >"$tmp/metrics.txt" || fail "/metrics"
grep -q '^ferry_serve_requests_total{outcome="ok"} 3$' "$tmp/metrics.txt" || fail "metrics ok count"
grep -q '^ferry_serve_requests_total{outcome="client_error"} 1$' "$tmp/metrics.txt" \
  || fail "metrics client_error count"

kill -TERM "$spid"
for _ in $(seq 100); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$spid" 2>/dev/null && fail "server did not stop on SIGTERM"
wait "$spid"; rc=$?; spid=""
[ "$rc" = 0 ] || fail "server exit code $rc"

FERRY_API_KEY=sk-cli-test "$FERRY" serve --port 0 --duration-s 60 >"$tmp/auth.out" 2>"$tmp/auth.err" &
spid=$!
for _ in $(seq 300); do grep -q "^listening port=" "$tmp/auth.out" && break; sleep 0.1; done
aport=$(sed -n 's/^listening port=\([0-9]*\).*/\1/p' "$tmp/auth.out")
[ -n "$aport" ] || fail "server with a key did not start"
AURL=http://127.0.0.1:$aport
req='{"prompt": "Hello", "max_tokens": 2}'
code=$(curl -s -o "$tmp/unauth.json" -w '%{http_code}' "$AURL/v1/completions" -d "$req")
[ "$code" = 401 ] || fail "no key gave $code"
grep -q authentication_error "$tmp/unauth.json" || fail "401 body"
code=$(curl -s -o /dev/null -w '%{http_code}' "$AURL/v1/completions" -H 'Authorization: Bearer nope' -d "$req")
[ "$code" = 401 ] || fail "a wrong key gave $code"
code=$(curl -s -o /dev/null -w '%{http_code}' "$AURL/v1/completions" -H 'Authorization: Bearer sk-cli-test' -d "$req")
[ "$code" = 200 ] || fail "the key gave $code"
curl -sf "$AURL/health" >/dev/null || fail "/health needs no key"
kill -TERM "$spid"; wait "$spid"; spid=""
echo "serve_http: ok (port $port, then $aport with a key)"
