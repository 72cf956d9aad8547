#!/usr/bin/env bash
# Who queues the device while a depth-1 writer runs (issue 17's (b) tail): one server, history
# on or off, WARM seconds of depth-32 4 KiB random writes, then D32 more, then D1 seconds at
# depth 1 with the kernel's block_bio_queue tracepoint recorded (`perf record -a`) and every bio
# counted for the thread that submitted it (store-apply, log-dev0.*, history-roll,
# bosc-commit, kworker...), with `iostat -x 1` beside it. Prints the depth-32 IOPS, the
# depth-1 p50/p99 and IOPS, the bytes by thread and the device's queue (aqu-sz) per second.
# Defaults are (b) of bench/history-overhead.sh: a 4 GiB log, a 7 d window (history shrinks
# all along), a 1 MiB index budget. Needs root (perf's tracepoints) and linux-perf, sysstat.
# Usage: bench/history-trace.sh on|off [OUT]   env: WARM=30 D32=100 D1=50 LOG=4GiB WINDOW=7d
#        INDEX_MEMORY=1MiB VOLUME=8GiB (OUT keeps the raw outputs; default a scratch dir)
#        (a) of bench/history-overhead.sh: LOG=16GiB WINDOW=10s. Also prints the depth-1 writer's
#        p99 per second (from fio's per-request latency log) beside the device's queue, and
#        how many requests took over 1 ms at fio, at the log's acknowledgement and in the log's
#        device writes (the server's histograms before and after the phase): where a slow
#        request's time went.
. "$(dirname "$0")/lib.sh"
case ${1:-} in on | off) ;; *) sed -n '2,/^\. /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
mode=$1
WARM=${WARM:-30}
D32=${D32:-100}
D1=${D1:-50}
LOG=${LOG:-4GiB}
WINDOW=${WINDOW:-7d}
INDEX_MEMORY=${INDEX_MEMORY:-1MiB}
VOLUME=${VOLUME:-8GiB}
for t in perf iostat fio; do
  command -v "$t" >/dev/null || { echo "history-trace: needs $t (apt-get install linux-perf sysstat fio)" >&2; exit 1; }
done
build_release
D=$SCRATCH/history-trace
OUT=${2:-$D/out}
mkdir -p "$D" "$OUT"
cfg=$D/config.toml
if [ "$mode" = off ]; then printf '[history]\nenabled = false\n' >"$cfg"; else
  printf '[history]\nwindow = "%s"\nmin_window = "1s"\nindex_memory = "%s"\n' "$WINDOW" "$INDEX_MEMORY" >"$cfg"
fi
dev=$(basename "$(df --output=source "$SCRATCH" | tail -1)")
RUST_LOG=${RUST_LOG:-info,mariner_history=debug} \
  start_mariner "$D/srv" --config "$cfg" --log-size "$LOG" --default-volume-size "$VOLUME"
fio_nbd "$MURL" randwrite 4k 32 "$WARM" >/dev/null
read -r iops32 _ _ < <(fio_nbd "$MURL" randwrite 4k 32 "$D32")
scrape() { curl -sf --max-time 5 --unix-socket "$D/srv/data/admin.sock" http://mariner/metrics >"$1" || : >"$1"; }
scrape "$OUT/metrics-before.txt"
iostat -x 1 "$dev" >"$OUT/iostat.txt" & io=$!
perf record -q -o "$OUT/perf.data" -a -e block:block_bio_queue -- sleep "$D1" >/dev/null 2>&1 & pr=$!
read -r iops1 _ p50 p99 _ < <(fio_stats --name=b --ioengine=nbd --uri="$MURL" --rw=randwrite --bs=4k \
  --iodepth=1 --size=256M --runtime="$D1" --time_based --write_lat_log="$OUT/d1" --log_avg_msec=0)
wait "$pr" || echo "history-trace: perf record failed" >&2
kill "$io" 2>/dev/null || true
scrape "$OUT/metrics-after.txt"
cp "$D/srv/serve.log" "$OUT/"
stop_mariner
echo "history $mode: depth-32 $iops32 IOPS; depth-1 p50 $p50 us, p99 $p99 us, $iops1 IOPS"
python3 - "$OUT" "$dev" <<'PY'
import collections, re, subprocess, sys
out, dev = sys.argv[1:]
text = subprocess.run(["perf", "script", "-i", out + "/perf.data"], capture_output=True, text=True).stdout
line = re.compile(r"^\s*(.+?)\s+\d+\s+\[\d+\]\s+[\d.]+:\s+block:block_bio_queue: \S+ (\S+) .*?(\d+) \+ (\d+)")
count, size = collections.Counter(), collections.Counter()
for l in text.splitlines():
    m = line.match(l)
    if m:
        who = re.sub(r"^kworker.*", "kworker", m.group(1).strip())
        count[(who, m.group(2))] += 1
        size[(who, m.group(2))] += int(m.group(4)) * 512
print("bios submitted in the depth-1 phase, by thread and kind (W write, R read, S sync, M meta):")
for k in sorted(size, key=lambda k: -size[k])[:16]:
    print("  %-18s %-4s %8d bios %9.1f MiB" % (k[0], k[1], count[k], size[k] / 2**20))
flushes = collections.Counter(k[0] for k in count.elements() if k[1].startswith("F"))
print("flushes (F bios) in the depth-1 phase, by thread:",
      ", ".join("%s %d" % kv for kv in flushes.most_common(8)) or "none")
q = [l.split() for l in open(out + "/iostat.txt") if l.startswith(dev + " ")]
print("device queue (aqu-sz) per second:", " ".join(r[-2] for r in q[1:]))
per = collections.defaultdict(list)
for l in open(out + "/d1_clat.1.log"):
    f = l.split(",")
    per[int(f[0]) // 1000].append(int(f[1]) / 1000)
def p99(v):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * 0.99))]
print("depth-1 p99 us per second:", " ".join("%.0f" % p99(per[s]) for s in sorted(per)))
every = [v for s in per.values() for v in s]
print("depth-1 requests over 1 ms (fio): %d of %d" % (sum(v > 1024 for v in every), len(every)))
def buckets(path, name):
    b = {}
    for l in open(path):
        m = re.match(name + r'_bucket\{le="([^"]+)"\} (\d+)', l)
        if m:
            b[m.group(1)] = int(m.group(2))
    return b
for name in ("mariner_ack_latency_seconds", "mariner_log_device_write_seconds"):
    a, z = buckets(out + "/metrics-before.txt", name), buckets(out + "/metrics-after.txt", name)
    if "+Inf" in a and "+Inf" in z:
        n = z["+Inf"] - a["+Inf"]
        le = min((k for k in z if k != "+Inf"), key=lambda k: abs(float(k) - 0.001024))
        fast = z[le] - a.get(le, 0)
        print("  %s in the phase: %d, over 1 ms: %d" % (name, n, n - fast))
PY
grep "applied records to the base" "$OUT/serve.log" | sed 's/^.*base images /roll round: /' || true
