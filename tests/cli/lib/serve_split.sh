# Sourced by CLI tests (tests/cli/lib is not itself a test), after serve_port.sh:
#   serve_split TMP NAME ARGS...
# starts `$FERRY serve --port 0 --split auto --device-budget-mib 12 --wsa-max-context 256 ARGS...`
# in the background (stdout TMP/NAME.out, stderr TMP/NAME.err), sends two greedy 16-token
# completions (TMP/NAME.c1.json, .c2.json), stops it with SIGTERM and checks that it exited
# cleanly and printed its wsa line. Uses the caller's fail() and its global spid (which the
# caller's cleanup kills if a check fails while the server runs).
serve_split() {
  local tmp=$1 name=$2
  shift 2
  "$FERRY" serve --port 0 --split auto --device-budget-mib 12 --wsa-max-context 256 "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.err" &
  spid=$!
  local port
  port=$(serve_port "$tmp/$name.out")
  [ -n "$port" ] || fail "$name: server did not start: $(cat "$tmp/$name.err")"
  for i in 1 2; do
    curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"prompt\": \"The ferry crosses the bay. Turn $i.\", \"max_tokens\": 16, \"temperature\": 0, \"ignore_eos\": true}" \
      >"$tmp/$name.c$i.json" || fail "$name: completion $i: $(cat "$tmp/$name.err")"
    grep -q '"completion_tokens":16' "$tmp/$name.c$i.json" || fail "$name: completion $i: $(cat "$tmp/$name.c$i.json")"
  done
  kill -TERM "$spid"
  wait "$spid" || fail "$name: serve exited $?: $(cat "$tmp/$name.err")"
  spid=""
  grep -Eq "^wsa: decisions=[0-9]+ " "$tmp/$name.err" || fail "$name: no wsa line: $(cat "$tmp/$name.err")"
}
