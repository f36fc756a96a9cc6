#!/bin/bash
# `ferry route ap` end to end on tests/data/route/ap_*.txt (values hand-computed in the data file
# comments), plus a malformed file that must give exit code 1 and a clear message, not a crash.
set -u
FERRY=$1; ROOT=$2; D=$ROOT/tests/data/route
fail() { echo "FAIL: $*"; exit 1; }
out=$("$FERRY" route ap --gt "$D/ap_gt.txt" --dets "$D/ap_dets.txt" --metric voc07) || fail "voc07 rc"
echo "$out" | grep -q "mAP=0.848485" || fail "voc07: $out"
out=$("$FERRY" route ap --gt "$D/ap_gt.txt" --dets "$D/ap_dets.txt" --metric voc12) || fail "voc12 rc"
echo "$out" | grep -q "mAP=0.833333" || fail "voc12: $out"
tmp=$(mktemp); trap 'rm -f $tmp' EXIT
printf '0,1,0,0,10\n' > "$tmp"
err=$("$FERRY" route ap --gt "$D/ap_gt.txt" --dets "$tmp" 2>&1); rc=$?
[ $rc -eq 1 ] || fail "malformed file: rc=$rc"
echo "$err" | grep -q "expected 8 comma-separated fields" || fail "malformed message: $err"
"$FERRY" route ap --gt "$D/ap_gt.txt" --dets "$D/ap_dets.txt" --metric bogus >/dev/null 2>&1
[ $? -eq 2 ] || fail "bad metric should be a usage error (2)"
echo "route_ap: ok"
