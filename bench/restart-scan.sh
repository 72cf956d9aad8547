#!/usr/bin/env bash
# What a restart reads and how long it takes when the log is full of applied records (issue 17
# M1: recovery reads the first block of each segment and whole only the segments that may hold
# records to replay). The previous release (PREV_REV, default 20714cb^: log format v1, every
# segment read) writes LOG_MIB×2 of 1 MiB sequential writes through fio's nbd engine onto a
# volume, stops, and is restarted cold (page cache dropped); then this build opens the same data
# directory (an upgrade from v1), writes as much again, and is restarted cold. Each restart
# prints the server's "recovery complete" figures and the time until its ports were published.
# Needs root (drops the page cache). Usage: bench/restart-scan.sh   env: LOG_MIB=2048
. "$(dirname "$0")/lib.sh"
case ${1:-} in -h | --help) sed -n '2,/^\. /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
[ "$(id -u)" = 0 ] || { echo "needs root: drops the page cache" >&2; exit 1; }
LOG_MIB=${LOG_MIB:-2048}
build_release
build_prev
D=$SCRATCH/restart-scan
rm -rf "$D"; mkdir -p "$D"
serve() {
  rm -f "$D/data/ports.json"
  "$1" --log-format json serve --data "$D/data" --listen 127.0.0.1:0 --iscsi-listen 127.0.0.1:0 \
    --log-size "${LOG_MIB}MiB" --default-volume-size "$((LOG_MIB * 2))MiB" >"$D/server.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 1200); do [ -s "$D/data/ports.json" ] && return 0; sleep 0.05; done
  cat "$D/server.log" >&2; return 1
}
stop() { kill -TERM "$PID"; wait "$PID" || true; }
fill() {
  local addr
  addr=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['nbd'][0])" "$D/data/ports.json")
  fio --name=fill --ioengine=nbd --uri="nbd://$addr/vol0" --rw=write --bs=1M --iodepth=8 \
    --size="$((LOG_MIB * 2))M" --refill_buffers >/dev/null
}
restart() { # BINARY LABEL
  sync; echo 3 >/proc/sys/vm/drop_caches
  local t0 t1
  t0=$(date +%s.%N); serve "$1"; t1=$(date +%s.%N)
  grep -m1 "recovery complete" "$D/server.log" | python3 -c '
import json,sys
f=json.loads(sys.stdin.read())["fields"]
print("%-44s recovery %8.1f ms  read %13d B  replayed %6s  ports after %.2f s" % (
    sys.argv[1], f["elapsed_ms"], f["bytes_scanned"], f["records_replayed"], float(sys.argv[2])))' \
    "$2" "$(echo "$t1 - $t0" | bc)"
}
serve "$PREV_BIN"; fill; stop
restart "$PREV_BIN" "previous release, its own (v1) log"; stop
restart "$MARINER" "this build, the same v1 log (upgrade)"; fill; stop
restart "$MARINER" "this build, its v2 log"; stop
rm -rf "$D"
