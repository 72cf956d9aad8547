#!/usr/bin/env bash
# When the log fills before history's window ends (issue 17 M3, "Log overflow"): writing
# OVERFLOW times what the log holds at depth 1, with history off, on under `policy = "shrink"`,
# and on under `policy = "throttle"`, in one run.
#   - shrink: writers never stall — p99 and max write latency against history off (p99 target
#     <= 2x); the window metric falls, the shrink counter rises, the warning is logged;
#   - throttle: the effective window (sampled every second) never falls below min_window.
# Usage: bench/history-overflow.sh   env: LOG=256MiB OVERFLOW=3 MIN_WINDOW=20s VOLUME=1GiB
. "$(dirname "$0")/lib.sh"
case ${1:-} in -h | --help) sed -n '2,/^\. /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
LOG=${LOG:-256MiB}
OVERFLOW=${OVERFLOW:-3}
MIN_WINDOW=${MIN_WINDOW:-20s}
VOLUME=${VOLUME:-1GiB}
build_release
D=$SCRATCH/history-overflow
mkdir -p "$D"
bytes=$(( $(numfmt --from=iec-i "${LOG%B}") * OVERFLOW ))

# run LABEL off|shrink|throttle: prints "p50_us p99_us max_us window shrinks warned", window
# as peak/lowest after the peak/lowest once min_window was reached (-1: never), in seconds.
run() {
  local label=$1 policy=$2 cfg=$D/config.toml
  if [ "$policy" = off ]; then printf '[history]\nenabled = false\n' >"$cfg"
  else printf '[history]\nwindow = "7d"\nmin_window = "%s"\npolicy = "%s"\n' "$MIN_WINDOW" "$policy" >"$cfg"; fi
  start_mariner "$D/srv" --config "$cfg" --log-size "$LOG" --default-volume-size "$VOLUME"
  local winfile=$D/window.txt; : >"$winfile"
  ( while kill -0 "$MPID" 2>/dev/null; do
      curl -sf --max-time 5 --unix-socket "$D/srv/data/admin.sock" http://m/metrics |
        awk '/^mariner_history_window_seconds\{volume="vol0"\}/ { print $2 }' >>"$winfile" || true
      sleep 1
    done ) &
  local sampler=$!
  local out
  out=$(fio --name=o --ioengine=nbd --uri="$MURL" --rw=randwrite --bs=4k --iodepth=1 --size=100% \
    --io_size="$bytes" --output-format=json 2>/dev/null | sed -n '/^{/,$p' | python3 -c '
import json,sys
w=json.load(sys.stdin)["jobs"][0]["write"]["clat_ns"]
p=w["percentile"]
print("%.1f %.1f %.1f" % (p["50.000000"]/1000, p["99.000000"]/1000, w["max"]/1000))')
  local shrinks; shrinks=$(mariner_metric "$D/srv" mariner_history_shrinks_total || echo 0)
  kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
  stop_mariner
  # The window starts at zero (history is as old as the server): what counts is how far it
  # falls once grown — after its peak (shrink), and once it first reached min_window
  # (throttle; -1 if it never did).
  local wmin; wmin=$(python3 - "$winfile" "$(numfmt --from=iec "${MIN_WINDOW%s}")" <<'PY'
import sys
w = [float(x) for x in open(sys.argv[1]) if x.strip()]
floor = float(sys.argv[2])
peak = max(w, default=0.0)
after_peak = min(w[w.index(peak):], default=0.0) if w else 0.0
reached = next((i for i, x in enumerate(w) if x >= floor), None)
print("%.1f/%.1f/%s" % (peak, after_peak, "-1" if reached is None else "%.1f" % min(w[reached:])))
PY
)
  local warned=0; grep -q "window fell\|history shrinks from its" "$D/srv/serve.log" && warned=1
  echo "$label $out $wmin ${shrinks:-0} $warned"
}

echo "writing $bytes bytes (${OVERFLOW}x a $LOG log) at depth 1" >&2
echo "label p50_us p99_us max_us window_s(peak/low_after_peak/low_after_min_window) shrinks warned"
off=$(run off off); echo "$off"
shrink=$(run shrink shrink); echo "$shrink"
throttle=$(run throttle throttle); echo "$throttle"
python3 - "$off" "$shrink" "$throttle" "$MIN_WINDOW" <<'PY'
import sys
def row(s):
    f = s.split()
    peak, low, floor = (float(x) for x in f[4].split("/"))
    return dict(zip(["label", "p50", "p99", "max"], [f[0]] + [float(x) for x in f[1:4]]),
                peak=peak, low=low, floor=floor, shrinks=float(f[5]), warned=float(f[6]))
off, sh, th = (row(s) for s in sys.argv[1:4])
mw = sys.argv[4]
print("shrink: p99 %.2fx of history off (target <= 2x), max %.2fx; shrinks %d; warned %s; window peaked at %.1f s, then fell to %.1f s"
      % (sh["p99"] / off["p99"], sh["max"] / off["max"], sh["shrinks"], bool(sh["warned"]), sh["peak"], sh["low"]))
if th["floor"] < 0:
    print("throttle: NOT MET: the window never reached min_window %s (peak %.1f s)" % (mw, th["peak"]))
else:
    print("throttle: lowest window once it reached min_window %s: %.1f s (target: not below it); p99 %.2fx, max %.0f ms"
          % (mw, th["floor"], th["p99"] / off["p99"], th["max"] / 1000))
PY
rm -rf "$D/srv"
