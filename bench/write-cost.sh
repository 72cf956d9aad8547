#!/usr/bin/env bash
# Where a durable 4 KiB random write's cost goes, for one server configuration: device writes
# and bytes per record (from /proc/diskstats, the whole machine's disk — run it idle), the
# server's CPU per record, and with history on the base image's bytes per record, the
# roll-forwards and shrinks. A diagnostic for issue 17 (history's write-path cost): run it
# with history off and on, and compare; bench/history-overhead.sh is the benchmark of record.
# One server: WARM seconds of fio (nbd engine, depth DEPTH, BS blocks over FSIZE) to warm
# up, then SECS measured.
# Usage: bench/write-cost.sh   env: HISTORY=on|off WINDOW=10s LOG=4GiB INDEX_MEMORY=1MiB
#        WARM=40 SECS=90 DEPTH=32 BS=4k FSIZE=256M DISK=<block device name, default: the one
#        holding the scratch dir>
. "$(dirname "$0")/lib.sh"
case ${1:-} in -h | --help) sed -n '2,/^\. /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
HISTORY=${HISTORY:-on}; WINDOW=${WINDOW:-10s}; LOG=${LOG:-4GiB}; INDEX_MEMORY=${INDEX_MEMORY:-1MiB}
WARM=${WARM:-40}; SECS=${SECS:-90}; DEPTH=${DEPTH:-32}; BS=${BS:-4k}; FSIZE=${FSIZE:-256M}
build_release
D=$SCRATCH/write-cost
mkdir -p "$D"
DISK=${DISK:-$(lsblk -no PKNAME "$(df --output=source "$D" | tail -1)" 2>/dev/null | head -1)}
DISK=${DISK:-$(basename "$(df --output=source "$D" | tail -1)")}
{
  echo "[history]"
  if [ "$HISTORY" = off ]; then echo "enabled = false"; else
    echo "window = \"$WINDOW\""; echo "min_window = \"1s\""; echo "index_memory = \"$INDEX_MEMORY\""
  fi
} >"$D/config.toml"
start_mariner "$D/srv" --config "$D/config.toml" --log-size "$LOG" --default-volume-size 8GiB
trap stop_mariner EXIT
metric() {
  curl -sf --max-time 30 --unix-socket "$D/srv/data/admin.sock" http://mariner/metrics |
    awk -v n="$1" '$1 == n { v = $2 } END { print (v == "" ? 0 : v) }'
}
disk() { awk -v d="$DISK" '$3 == d { print $8, $10 }' /proc/diskstats; }
sample() {
  read -r w s < <(disk)
  echo "$w $s $(awk '{print $14+$15}' "/proc/$MPID/stat") $(metric mariner_log_records_total)" \
    "$(metric mariner_history_rolled_bytes_total) $(metric mariner_history_roll_forwards_total)"
}
run_fio() {
  fio --name=w --ioengine=nbd --uri="$MURL" --rw=randwrite --bs="$BS" --iodepth="$DEPTH" \
    --size="$FSIZE" --runtime="$1" --time_based --output-format=json 2>/dev/null | sed -n '/^{/,$p'
}
run_fio "$WARM" >/dev/null
read -r w0 s0 c0 r0 b0 f0 < <(sample)
run_fio "$SECS" >"$D/fio.json"
read -r w1 s1 c1 r1 b1 f1 < <(sample)
python3 - "$D/fio.json" "$HISTORY" "$WINDOW" "$LOG" "$DISK" "$w0" "$s0" "$c0" "$r0" "$b0" "$f0" \
  "$w1" "$s1" "$c1" "$r1" "$b1" "$f1" "$(metric mariner_history_shrinks_total)" "$(getconf CLK_TCK)" <<'PY'
import json, sys
a = sys.argv
j = json.load(open(a[1]))["jobs"][0]["write"]
w0, s0, c0, r0, b0, f0, w1, s1, c1, r1, b1, f1, shrinks, tck = map(float, a[6:20])
n = max(r1 - r0, 1)
pct = j["clat_ns"]["percentile"]
print(f"history {a[2]}" + (f" (window {a[3]})" if a[2] != "off" else "") + f", log {a[4]}, disk {a[5]}")
print(f"  IOPS {j['iops']:.0f}  p50 {pct['50.000000']/1e3:.0f} us  p99 {pct['99.000000']/1e3:.0f} us  records {n:.0f}")
print(f"  device writes/record {(w1-w0)/n:.2f}  device KiB/record {(s1-s0)*512/1024/n:.1f}  "
      f"server CPU us/record {(c1-c0)*1e6/tck/n:.0f}")
if a[2] != "off":
    print(f"  base KiB/record {(b1-b0)/1024/n:.2f}  roll-forwards {f1-f0:.0f}  shrinks (whole run) {shrinks:.0f}")
PY
