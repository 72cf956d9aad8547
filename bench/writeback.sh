#!/usr/bin/env bash
# Sustained durable 4 KiB random writes through NBD, bounded by the store's write-back: the rate
# once the log is full is the rate the applier frees it (issue 16's depth-32 target is measured
# over rounds that write >= 3x the log, so this is the rate that counts).
# Each round, on a new data dir (default 256 MiB log) with a WS_MIB volume:
#   1. untimed: the volume written once sequentially (1 MiB writes) and written back;
#   2. fio nbd 4 KiB randwrite at depth DEPTH, --io_size = IO_MIB (3x the log by default),
#      while /metrics is sampled every second;
#   3. reported: fio's IOPS over the whole round; the steady rate of acknowledged writes and of
#      applied records (records/s) from the samples of the round's second half (the log full,
#      writers waiting for the applier); the syncs and log read-backs per second and the CPU
#      of the applier thread and of the whole server (% of one core) over that half.
# Prints one line per round and the medians.
#
# Usage: bench/writeback.sh [ROUNDS] [IO_MIB]          (3 rounds, 768 MiB)
#   env: WS_MIB=1024 DEPTH=32 MARINER=<checkout>/target/release/mariner SERVE_ARGS=
#        SCRATCH=<checkout>/target/bench-scratch  PERF=1 (perf record -g the applier thread
#        during the second half of the last round into $SCRATCH/wb-perf.data)
. "$(dirname "$0")/lib.sh"
case ${1:-} in -h|--help) sed -n '2,/^\. /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
ROUNDS=${1:-3}; IO_MIB=${2:-768}; WS_MIB=${WS_MIB:-1024}; DEPTH=${DEPTH:-32}
DIR=$SCRATCH/wb
MPID=""; SPID=""; PPID_=""
cleanup() {
  [ -n "$SPID" ] && { kill "$SPID" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true; }
  [ -n "$MPID" ] && stop_mariner
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
[ -x "$MARINER" ] || build_release
mkdir -p "$SCRATCH"

# sample DIR: every second, "t writes applied_bytes syncs log_reads fill stalled applier_cpu
# server_cpu" (CPU in clock ticks) until killed.
sample() {
  local tid
  tid=$(ps -T -p "$MPID" -o spid=,comm= | awk '$2 == "store-apply" { print $1 }')
  while :; do
    cpu=$(awk '{ printf "%d ", $14 + $15 }' "/proc/$MPID/task/$tid/stat" "/proc/$MPID/stat" 2>/dev/null || true)
    curl -sf --max-time 2 --unix-socket "$1/data/admin.sock" http://mariner/metrics | awk -v t="$(date +%s.%N)" -v c="$cpu" '
      $1 ~ /^mariner_volume_writes_total\{/ { w += $2 }
      $1 == "mariner_store_applied_bytes_total" { a = $2 }
      $1 == "mariner_store_syncs_total" { s = $2 }
      $1 == "mariner_store_log_reads_total" { r = $2 }
      $1 == "mariner_log_fill_ratio" { f = $2 }
      $1 == "mariner_log_stalled_writes" { st = $2 }
      END { printf "%s %d %d %d %d %s %s %s\n", t, w, a, s, r, f, st, c }' || true
    sleep 1
  done
}

echo "load $(loadavg); $(nproc) cpus; $ROUNDS rounds of ${IO_MIB} MiB 4 KiB randwrite depth $DEPTH over ${WS_MIB} MiB" >&2
printf 'round\tfio_iops\tsteady_write_iops\tsteady_applied_rec_s\tsyncs_per_s\tlog_reads_per_s\tapplier_cpu_pct\tserver_cpu_pct\tload\n'
RES=$SCRATCH/wb-results.tsv; : >"$RES"
for r in $(seq 1 "$ROUNDS"); do
  # shellcheck disable=SC2086
  start_mariner "$DIR" --default-volume-size "${WS_MIB}MiB" ${SERVE_ARGS:-}
  timeout "${FIO_TIMEOUT:-600}" fio --name=fill --ioengine=nbd --uri="$MURL" --size="${WS_MIB}M" \
    --rw=write --bs=1M --iodepth=8 --output-format=terse >/dev/null
  wait_written_back "$DIR" 300 >/dev/null
  sample "$DIR" >"$DIR/samples" &
  SPID=$!
  if [ "${PERF:-}" = 1 ] && [ "$r" = "$ROUNDS" ]; then
    (
      sleep "${PERF_DELAY:-15}"
      tid=$(ps -T -p "$MPID" -o spid=,comm= | awk '$2 == "store-apply" { print $1 }')
      perf record -g -t "$tid" -o "$SCRATCH/wb-perf.data" -- sleep 10 >/dev/null 2>&1
    ) &
    PPID_=$!
  fi
  out=$(fio_stats --name=b --ioengine=nbd --uri="$MURL" --size="${WS_MIB}M" --io_size="${IO_MIB}M" \
    --rw=randwrite --bs=4k --iodepth="$DEPTH")
  kill "$SPID"; wait "$SPID" 2>/dev/null || true; SPID=""
  [ -n "$PPID_" ] && { wait "$PPID_" || true; PPID_=""; }
  stop_mariner; MPID=""
  cp "$DIR/samples" "$SCRATCH/wb-samples-$r"; cp "$DIR/serve.log" "$SCRATCH/wb-serve-$r.log"
  line=$(python3 - "$DIR/samples" "$out" "$r" "$(loadavg | cut -d' ' -f1)" <<'EOF'
import sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 9]
# The round's second half by writes acknowledged: the log has long been full.
total = rows[-1][1] - rows[0][1]
half = [x for x in rows if x[1] - rows[0][1] >= total / 2]
a, b = half[0], half[-1]
dt = b[0] - a[0]
fio_iops = sys.argv[2].split()[0]
# CPU in clock ticks (100 per second): percent of one core.
print("%s\t%s\t%.0f\t%.0f\t%.2f\t%.0f\t%.0f\t%.0f\t%s" % (sys.argv[3], fio_iops, (b[1] - a[1]) / dt,
      (b[2] - a[2]) / 4096 / dt, (b[3] - a[3]) / dt, (b[4] - a[4]) / dt, (b[7] - a[7]) / dt,
      (b[8] - a[8]) / dt, sys.argv[4]))
EOF
)
  echo "$line" | tee -a "$RES"
done
for col in 2 3 4; do
  printf '%s ' "$(cut -f$col "$RES" | median)"
done | awk '{ printf "median\t%s\t%s\t%s\n", $1, $2, $3 }'
