# Sourced by CLI tests (tests/cli/lib is not itself a test): serve_port OUT waits up to 30 s for a
# `ferry serve --port 0` started in the background with its stdout in OUT to print its
# "listening port=P ..." line and prints P (nothing if it never did).
serve_port() {
  for _ in $(seq 300); do grep -q "^listening port=" "$1" && break; sleep 0.1; done
  sed -n 's/^listening port=\([0-9]*\).*/\1/p' "$1"
}
