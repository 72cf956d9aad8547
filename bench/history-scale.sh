#!/usr/bin/env bash
# History at scale (issue 17 M3, "Scale and start-up"): a log holding HISTORY bytes of history
# (1 MiB and 64 KiB writes over a VOLUME volume), then kill -9, the page cache dropped and a
# restart inside a memory cgroup:
#   - seconds from the restart until a read of the current volume is answered (target <= 5 s),
#     and until a read of an export as of an instant in the middle of the history is (<= 30 s);
#   - the server's peak RSS (VmHWM) and the cgroup's peak, against history's index memory +
#     the store's payload budget + 64 MiB (the target; RSS).
# Usage: bench/history-scale.sh   env: HISTORY=16GiB LOG=24GiB VOLUME=16GiB INDEX_MEMORY=64MiB
#        (needs root: cgroup v2 and dropping the page cache; LOG must exceed HISTORY / 0.6)
. "$(dirname "$0")/lib.sh"
case ${1:-} in -h | --help) sed -n '2,/^\. /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
HISTORY=${HISTORY:-16GiB}
LOG=${LOG:-28GiB}
VOLUME=${VOLUME:-16GiB}
INDEX_MEMORY=${INDEX_MEMORY:-64MiB}
build_release
bytes_of() { numfmt --from=iec-i "${1%B}"; }
D=$SCRATCH/history-scale
DATA=$D/srv/data
mkdir -p "$D"
printf '[history]\nwindow = "7d"\nindex_memory = "%s"\n' "$INDEX_MEMORY" >"$D/config.toml"
M() { "$MARINER" "$@" --data "$DATA"; }
now() { date +%s.%N; }

start_mariner "$D/srv" --config "$D/config.toml" --log-size "$LOG" --default-volume-size "$VOLUME"
half=$(( $(bytes_of "$HISTORY") / 2 ))
echo "writing $HISTORY of history: half in 1 MiB sequential writes, half in 64 KiB random ones" >&2
fio --name=s --ioengine=nbd --uri="$MURL" --rw=write --bs=1M --iodepth=8 --size=100% \
  --io_size="$half" --output-format=terse >/dev/null 2>&1
mid=$(M volume info vol0 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["history"]["newest_seq"])')
fio --name=r --ioengine=nbd --uri="$MURL" --rw=randwrite --bs=64k --iodepth=8 --size=100% \
  --io_size="$half" --randrepeat=0 --output-format=terse >/dev/null 2>&1
M volume info vol0 --json | python3 -c 'import json,sys; h=json.load(sys.stdin)["history"]; print("history: @%d..@%d, effective window %.0f s" % (h["oldest_seq"], h["newest_seq"], h["effective_window_s"]))' >&2
M snapshot export vol0 --at "@$mid" --name mid >/dev/null
kill -9 "$MPID"; wait "$MPID" 2>/dev/null || true
drop_caches

# A memory cgroup without a limit, for its peak (page cache included): cgroup v2, or v1's
# memory hierarchy (where /sys/fs/cgroup itself is a tmpfs and a directory made there is none).
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  cg=/sys/fs/cgroup/mariner-history-scale.$$; peak_file=memory.peak
elif [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/mariner-history-scale.$$; peak_file=memory.max_usage_in_bytes
else
  echo "history-scale: no memory cgroup controller on this machine" >&2; exit 2
fi
mkdir "$cg"
trap 'for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done; sleep 0.3; rmdir "$cg" 2>/dev/null || true' EXIT
rm -f "$DATA/ports.json"
t0=$(now)
sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
  "$MARINER" serve --data "$DATA" --listen 127.0.0.1:0 --config "$D/config.toml" 2>>"$D/srv/serve.log" &
MPID=$!
until [ -f "$DATA/ports.json" ]; do kill -0 "$MPID" || { tail "$D/srv/serve.log" >&2; exit 1; }; sleep 0.05; done
addr=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['nbd'][0])" "$DATA/ports.json")
until qemu-io -r -f raw -c "read 0 4k" "nbd://$addr/vol0" >/dev/null 2>&1; do sleep 0.05; done
current_s=$(python3 -c "print('%.2f' % ($(now) - $t0))")
until qemu-io -r -f raw -c "read 1G 4k" "nbd://$addr/vol0@mid" >/dev/null 2>&1; do sleep 0.1; done
hist_s=$(python3 -c "print('%.2f' % ($(now) - $t0))")
# Some reads of the past and the present, so the peak includes serving them.
fio --name=h --ioengine=nbd --uri="nbd://$addr/vol0@mid" --rw=randread --bs=4k --iodepth=16 --size=100% \
  --runtime=10 --time_based --readonly --output-format=terse >/dev/null 2>&1
hwm=$(awk '/VmHWM/ {print $2 * 1024}' "/proc/$MPID/status")
peak=$(cat "$cg/$peak_file")
# The store's payload budget ([store] payload_budget): none by default without --direct-io
# (its overlay points into the log rather than holding payloads).
store_budget=0
stop_mariner
python3 - "$current_s" "$hist_s" "$hwm" "$peak" "$(bytes_of "$INDEX_MEMORY")" "$store_budget" <<'PY'
import sys
cur, hist, hwm, peak, index, store = map(float, sys.argv[1:])
target = index + store + 64 * 2**20
print("restart: current I/O after %.2f s (target <= 5 s), historical reads after %.2f s (<= 30 s)" % (cur, hist))
print("peak RSS %.0f MiB, cgroup peak (with page cache) %.0f MiB; target RSS <= %.0f MiB (index %.0f + store %.0f + 64)"
      % (hwm / 2**20, peak / 2**20, target / 2**20, index / 2**20, store / 2**20))
PY
# Where the restart's time went: the log's recovery (records replayed, bytes scanned, ms).
grep -E 'recovery complete|history|serving' "$D/srv/serve.log" | tail -4 >&2 || true
rm -rf "$D/srv"
