#!/usr/bin/env bash
# What keeping history costs the write path (issue 17): Mariner with history on and off,
# interleaved in one run, over fio's nbd engine. Two configurations of history:
#   a) a window shorter than the log holds: expiry and roll-forward of the base run all along;
#   b) a window longer than the log holds: history shrinks all along (shrink count > 0).
# ROUNDS rounds per configuration, each a server with history off and one with it on (odd
# rounds off first, even rounds on first), so each is measured ROUNDS x SECS seconds in all
# (10 minutes at the defaults). Each server, after WARM seconds of warm-up, is measured for
# SECS seconds: half of them durable 4 KiB random writes at depth 32 (IOPS), a quarter at
# depth 1 (p50/p99 latency), a quarter 1 MiB sequential writes at depth 8 (MB/s); with
# history on it samples the index lag every second (p99), and reports the shrinks, the
# roll-forward MB/s and the server's CPU per write; for each server, the share of CPU time
# the host took from this machine (steal) while it was measured (a run of record wants it
# near 0). Prints each round's on/off ratios, then the medians over the rounds and their
# ratios, which the targets are read on: (a) depth-32 IOPS >= 0.85x, (b) >= 0.75x; depth-1
# p50 <= 1.1x, p99 <= 1.5x; 1 MiB sequential >= 0.8x; index lag p99 <= 2 s. Also prints the
# index's size against its memory budget (the issue asks for >= 10x).
# Why rounds: one server of each, ten minutes apart, differed more than the targets allow
# with history off alone (depth-1 p50 206 and 237 us in two runs of the same build; history
# on measured 0.95x and 1.12x of off in two runs: docs/benchmarks.md), so each side is
# measured in turns and the medians compared.
# The defaults make both: (a)'s window and the 5 s between expiry rounds fit the log's 60 %
# for history even while 1 MiB writes run at full speed (15 s at ~600 MB/s here, 9 GB of
# 10.3; a 20 s window shrank 30 times), and 15 s of 4 KiB writes at ~30 k/s index ~450 k
# records (~25x the budget); (b)'s log holds ~560 k records before it shrinks.
# Usage: bench/history-overhead.sh   env: ROUNDS=3 SECS=200 WARM=30 LOG_A=16GiB WINDOW_A=10s
#        LOG_B=4GiB WINDOW_B=7d INDEX_MEMORY=1MiB VOLUME=8GiB CONFIGS="a b" FIRST=off (a probe
#        may run one configuration; a run of record runs both at the defaults)
. "$(dirname "$0")/lib.sh"
case ${1:-} in -h | --help) sed -n '2,/^\. /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
SECS=${SECS:-200}
WARM=${WARM:-30}
ROUNDS=${ROUNDS:-3}
LOG_A=${LOG_A:-16GiB}
WINDOW_A=${WINDOW_A:-10s}
LOG_B=${LOG_B:-4GiB}
WINDOW_B=${WINDOW_B:-7d}
INDEX_MEMORY=${INDEX_MEMORY:-1MiB}
VOLUME=${VOLUME:-8GiB}
CONFIGS=${CONFIGS:-a b}
build_release
D=$SCRATCH/history-overhead
OUT=$D/samples.tsv
mkdir -p "$D"
: >"$OUT"

# metric NAME: the server's value as printed (0 when it has none, as with history off).
metric() {
  local text
  text=$(curl -sf --max-time 5 --unix-socket "$D/srv/data/admin.sock" http://mariner/metrics) || { echo 0; return; }
  echo "$text" | awk -v n="$1" '$1 == n { v = $2 } END { print (v == "" ? 0 : v) }'
}

# run LABEL LOG WINDOW|off ROUND: one server, warm-up, the three measurements, its history figures.
run() {
  local label=$1 log=$2 window=$3 round=$4 cfg=$D/config.toml
  {
    echo "[history]"
    if [ "$window" = off ]; then echo "enabled = false"; else
      echo "window = \"$window\""; echo "min_window = \"1s\""; echo "index_memory = \"$INDEX_MEMORY\""
    fi
  } >"$cfg"
  start_mariner "$D/srv" --config "$cfg" --log-size "$log" --default-volume-size "$VOLUME"
  local addr=${MURL#nbd://}; addr=${addr%/vol0}
  fio_nbd "$MURL" randwrite 4k 32 "$WARM" >/dev/null
  local lagfile=$D/lag.txt; : >"$lagfile"
  ( while kill -0 "$MPID" 2>/dev/null; do
      metric mariner_history_index_lag_seconds >>"$lagfile"
      sleep 1
    done ) &
  local sampler=$!
  local cpu0 w0 rolled0; cpu0=$(awk '{print $14+$15}' "/proc/$MPID/stat")
  w0=$(metric mariner_log_records_total)
  rolled0=$(metric mariner_history_rolled_bytes_total)
  local st0; st0=$(head -1 /proc/stat)
  local t0; t0=$(date +%s.%N)
  local half=$((SECS / 2)) quarter=$((SECS / 4))
  read -r iops32 _ _ < <(fio_nbd "$MURL" randwrite 4k 32 "$half")
  local lat1; lat1=$(fio --name=b --ioengine=nbd --uri="$MURL" --rw=randwrite --bs=4k --iodepth=1 \
      --size=256M --runtime="$quarter" --time_based --output-format=json 2>/dev/null | sed -n '/^{/,$p' |
    python3 -c 'import json,sys; p=json.load(sys.stdin)["jobs"][0]["write"]["clat_ns"]["percentile"]; print("%.1f %.1f" % (p["50.000000"]/1000, p["99.000000"]/1000))')
  read -r seq_iops _ _ < <(fio_nbd "$MURL" write 1M 8 "$quarter")
  local t1; t1=$(date +%s.%N)
  local st1; st1=$(head -1 /proc/stat)
  local cpu1 w1 rolled1 shrinks; cpu1=$(awk '{print $14+$15}' "/proc/$MPID/stat")
  w1=$(metric mariner_log_records_total)
  rolled1=$(metric mariner_history_rolled_bytes_total)
  shrinks=$(metric mariner_history_shrinks_total)
  local ibytes; ibytes=$(metric mariner_history_index_bytes)
  [ "$window" = off ] || echo "$label: index $(python3 -c "print('%.1f MiB, %.1fx its budget' % ($ibytes / 2**20, $ibytes / $(numfmt --from=iec-i "${INDEX_MEMORY%B}")))")" >&2
  kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
  local lag99; lag99=$(sort -n "$lagfile" | awk '{a[NR]=$1} END {print (NR ? a[int(NR*0.99)>0?int(NR*0.99):1] : 0)}')
  stop_mariner
  local ticks; ticks=$(getconf CLK_TCK)
  python3 - "$label" "$iops32" "$lat1" "$seq_iops" "$cpu0" "$cpu1" "$w0" "$w1" "$rolled0" "$rolled1" \
    "$t0" "$t1" "$shrinks" "$lag99" "$ticks" "$round" "$st0" "$st1" >>"$OUT" <<'EOF'
import sys
(label, iops32, lat1, seq, c0, c1, w0, w1, r0, r1, t0, t1, shrinks, lag, ticks, rnd, s0, s1) = sys.argv[1:]
# The share of the machine's CPU time the host took (steal) while measuring.
a, b = [int(x) for x in s0.split()[1:9]], [int(x) for x in s1.split()[1:9]]
steal = 100.0 * (b[7] - a[7]) / max(sum(b) - sum(a), 1)
p50, p99 = lat1.split()
writes = max(float(w1) - float(w0), 1)
cpu_us = (float(c1) - float(c0)) / float(ticks) * 1e6 / writes
roll = (float(r1) - float(r0)) / (float(t1) - float(t0)) / 1e6
print("\t".join([label, iops32, p50, p99, seq, "%.1f" % cpu_us, "%.1f" % roll, shrinks, lag, rnd, "%.1f" % steal]))
EOF
  tail -1 "$OUT"
}

# pair OFF LOG off ON WINDOW ROUND: history off and on, on the same log size; odd rounds run
# off first, even rounds on first (FIRST=on starts with on), so neither always meets the
# device fresh after an idle spell or a log's formatting.
pair() {
  local first=${FIRST:-off}
  if [ $(($6 % 2)) = 0 ]; then [ "$first" = off ] && first=on || first=off; fi
  if [ "$first" = off ]; then run "$1" "$2" off "$6"; run "$4" "$2" "$5" "$6"
  else run "$4" "$2" "$5" "$6"; run "$1" "$2" off "$6"; fi
}

echo "label	iops_d32	p50_d1_us	p99_d1_us	seq_1M_iops(=MiB/s)	cpu_us_per_write	rolled_MB_s	shrinks	lag_p99_s	round	steal_pct"
for r in $(seq 1 "$ROUNDS"); do
  case " $CONFIGS " in *" a "*)
    pair a-off "$LOG_A" off a-on "$WINDOW_A" "$r" ;;
  esac
  case " $CONFIGS " in *" b "*)
    pair b-off "$LOG_B" off b-on "$WINDOW_B" "$r" ;;
  esac
done
python3 - "$OUT" <<'EOF'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by, rounds = {}, {}
for r in rows:
    vals = [float(x) for x in r[1:9]]
    by.setdefault(r[0], []).append(vals)
    rounds.setdefault(r[9], {})[r[0]] = vals + [float(r[10])]
print("\nrounds (on/off: depth-32 IOPS, depth-1 p50, p99, 1 MiB seq; steal %, off / on)")
for n in sorted(rounds, key=int):
    for c in ("a", "b"):
        on, off = rounds[n].get(c + "-on"), rounds[n].get(c + "-off")
        if on and off:
            print("round %s (%s): %.2fx %.2fx %.2fx %.2fx; steal %.1f / %.1f" % (n, c, on[0] / off[0], on[1] / off[1], on[2] / off[2], on[3] / off[3], off[8], on[8]))
med = {k: [st.median(c) for c in zip(*v)] for k, v in by.items()}
names = ["iops_d32", "p50_d1_us", "p99_d1_us", "seq_1M_MiB_s", "cpu_us_per_write", "rolled_MB_s", "shrinks", "lag_p99_s"]
print("\nmedians over the rounds")
for k in sorted(med):
    print(k, " ".join("%s=%.1f" % (n, x) for n, x in zip(names, med[k])))
for c, target in (("a", 0.85), ("b", 0.75)):
    on, off = med.get(c + "-on"), med.get(c + "-off")
    if not on or not off:
        continue
    print("\n(%s) on/off: depth-32 IOPS %.2fx (target >= %.2f), depth-1 p50 %.2fx (<= 1.1), p99 %.2fx (<= 1.5), "
          "1 MiB seq %.2fx (>= 0.8); index lag p99 %.2f s (<= 2); shrinks %d; roll-forward %.1f MB/s; "
          "CPU/write %.1f vs %.1f us" % (c, on[0] / off[0], target, on[1] / off[1], on[2] / off[2], on[3] / off[3],
                                          on[7], on[6], on[5], on[4], off[4]))
EOF
rm -rf "$D/srv"
