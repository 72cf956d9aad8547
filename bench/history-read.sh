#!/usr/bin/env bash
# Reading the past (issue 17 M3): a volume holding many versions — a sequential fill, then
# uniform and Zipf(1.1) 4 KiB overwrites — with the server restarted and the page cache
# dropped before each measurement:
#   - an export as of a random instant: seconds from `mariner snapshot export` to the answer
#     of its first read (target <= 1 s);
#   - reading it whole (nbdcopy to null) against the current volume read whole (>= 0.5x);
#   - random historical 4 KiB reads: depth-1 p99 (<= 2 ms), depth-16 p99 against the current
#     volume's cold depth-16 p99 (<= 3x);
#   - `mariner diff` and `mariner history` over the whole window: seconds (<= 2 s each) and the
#     digest bytes read against the log bytes the window holds (<= 5 %).
# Usage: bench/history-read.sh   env: VOLUME=10GiB LOG=28GiB VERSIONS=1000000 SECS=20
#        (VERSIONS 4 KiB overwrites in all, half uniform, half Zipf(1.1); needs root to drop
#        the page cache. The log must hold the fill and the overwrites within the 60 % history
#        may keep before it shrinks: with a 12 or 20 GiB log the window lost its oldest
#        ~100-140 k writes, under the 1 M versions the issue asks for)
. "$(dirname "$0")/lib.sh"
case ${1:-} in -h | --help) sed -n '2,/^\. /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
VOLUME=${VOLUME:-10GiB}
LOG=${LOG:-28GiB}
VERSIONS=${VERSIONS:-1000000}
SECS=${SECS:-20}
build_release
D=$SCRATCH/history-read
DATA=$D/srv/data
mkdir -p "$D"
M() { "$MARINER" "$@" --data "$DATA"; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print('%.3f' % ($(now) - $1))"; }
bytes_of() { numfmt --from=iec-i "${1%B}"; }  # 10GiB -> 10737418240

start_mariner "$D/srv" --log-size "$LOG" --default-volume-size "$VOLUME"
echo "filling $VOLUME sequentially, then $VERSIONS 4 KiB overwrites (uniform, then zipf:1.1)" >&2
fio --name=fill --ioengine=nbd --uri="$MURL" --rw=write --bs=1M --iodepth=8 --size=100% \
  --output-format=terse >/dev/null 2>&1
half=$((VERSIONS / 2))
fio --name=u --ioengine=nbd --uri="$MURL" --rw=randwrite --bs=4k --iodepth=32 --size=100% \
  --number_ios="$half" --io_size=$((half * 4096)) --randrepeat=0 --output-format=terse >/dev/null 2>&1
M history mark vol0 middle >/dev/null
fio --name=z --ioengine=nbd --uri="$MURL" --rw=randwrite --bs=4k --iodepth=32 --size=100% \
  --random_distribution=zipf:1.1 --io_size=$((half * 4096)) --randrepeat=0 \
  --output-format=terse >/dev/null 2>&1
window=$(M volume info vol0 --json | python3 -c 'import json,sys; h=json.load(sys.stdin)["history"]; print(h["oldest_seq"], h["newest_seq"])')
read -r oldest newest <<<"$window"
echo "history holds @$oldest..@$newest ($((newest - oldest)) writes)" >&2
wait_written_back "$D/srv" 600 >/dev/null

restart() {
  stop_mariner
  drop_caches
  "$MARINER" serve --data "$DATA" --listen 127.0.0.1:0 2>>"$D/srv/serve.log" &
  MPID=$!
  for _ in $(seq 1 600); do
    [ -S "$DATA/admin.sock" ] && M status >/dev/null 2>&1 && break
    sleep 0.05
  done
  local addr
  addr=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['nbd'][0])" "$DATA/ports.json")
  MURL="nbd://$addr/vol0"
}

at=$(python3 -c "import random; print(random.randint($oldest + 1, $newest))")
restart
t0=$(now)
url=$(M snapshot export vol0 --at "@$at" --name r --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["nbd"][0])')
qemu-io -r -f raw -c "read 0 4k" "$url" >/dev/null
first=$(since "$t0")
echo "export as of @$at: first read answered ${first}s after the command" >&2

read_whole() { local t; t=$(now); nbdcopy "$1" null: >/dev/null; python3 -c "print('%.1f' % ($(bytes_of "$VOLUME") / 1e6 / ($(now) - $t)))"; }
restart; url=${MURL%/vol0}/vol0@r
hist_mbs=$(read_whole "$url")
restart
cur_mbs=$(read_whole "$MURL")
echo "read whole: export $hist_mbs MB/s, current $cur_mbs MB/s" >&2

randread() { FIO_DIR=read fio_stats --name=r --ioengine=nbd --uri="$1" --rw=randread --bs=4k \
  --iodepth="$2" --size=100% --runtime="$SECS" --time_based --readonly; }
restart; url=${MURL%/vol0}/vol0@r
read -r _ _ _ h1_p99 _ <<<"$(randread "$url" 1)"
restart; url=${MURL%/vol0}/vol0@r
read -r _ _ _ h16_p99 _ <<<"$(randread "$url" 16)"
restart
read -r _ _ _ c16_p99 _ <<<"$(randread "$MURL" 16)"

restart
t0=$(now); M diff vol0 --from "@$oldest" --json >"$D/diff.json"; diff_s=$(since "$t0")
t0=$(now); M history vol0 --json >/dev/null; hist_s=$(since "$t0")
digest_read=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["digest_bytes_read"])' "$D/diff.json")
log_bytes=$(bytes_of "$LOG")
stop_mariner

python3 - "$first" "$hist_mbs" "$cur_mbs" "$h1_p99" "$h16_p99" "$c16_p99" "$diff_s" "$hist_s" \
  "$digest_read" "$log_bytes" "$((newest - oldest))" "$VERSIONS" <<'PY'
import sys
first, hmbs, cmbs, h1, h16, c16, ds, hs, dread, logb, versions, asked = map(float, sys.argv[1:])
print("versions in the window: %d (the setup asks >= %d%s)" % (versions, asked, "" if versions >= asked else "; NOT MET: a larger LOG"))
print("export's first read: %.3f s (target <= 1 s)" % first)
print("read whole: %.1f vs %.1f MB/s = %.2fx (target >= 0.5x)" % (hmbs, cmbs, hmbs / cmbs))
print("historical 4 KiB random reads: depth-1 p99 %.0f us (target <= 2000); depth-16 p99 %.0f us vs current %.0f us = %.2fx (target <= 3x)" % (h1, h16, c16, h16 / c16))
print("diff over the window: %.2f s, history: %.2f s (targets <= 2 s); digest bytes read %.0f = %.2f%% of the log (target <= 5%%)" % (ds, hs, dread, 100 * dread / logb))
PY
rm -rf "$D/srv"
