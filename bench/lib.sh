# Shared helpers for bench scripts: start/stop a mariner server on a scratch data dir.
# Source it: . "$(dirname "$0")/lib.sh"
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MARINER=${MARINER:-$ROOT/target/release/mariner}
SCRATCH=${SCRATCH:-$ROOT/target/bench-scratch}

build_release() { (cd "$ROOT" && cargo build --release -q -p mariner); }

# start_mariner DIR [serve args...]: starts a server, sets MPID and MURL (nbd://.../vol0).
start_mariner() {
  local dir=$1; shift
  rm -rf "$dir"; mkdir -p "$dir"
  "$MARINER" serve --data "$dir/data" --listen 127.0.0.1:0 "$@" 2>"$dir/serve.log" &
  MPID=$!
  # Up to 5 minutes: a new log is written with zeros first (tens of GiB take minutes).
  for _ in $(seq 1 6000); do
    [ -f "$dir/data/ports.json" ] && break
    kill -0 $MPID 2>/dev/null || { cat "$dir/serve.log" >&2; return 1; }
    sleep 0.05
  done
  local addr
  addr=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['nbd'][0])" "$dir/data/ports.json")
  MURL="nbd://$addr/vol0"
}

stop_mariner() { kill -TERM "$MPID" 2>/dev/null || true; wait "$MPID" 2>/dev/null || true; }

# fio_nbd URL RW BS DEPTH SECONDS: prints "iops mean_lat_us p99_lat_us".
fio_nbd() {
  local url=$1 rw=$2 bs=$3 depth=$4 secs=$5
  fio --name=b --ioengine=nbd --uri="$url" --rw="$rw" --bs="$bs" --iodepth="$depth" \
      --size=256M --runtime="$secs" --time_based --output-format=json 2>/dev/null |
  sed -n '/^{/,$p' | python3 -c '
import json,sys
j=json.load(sys.stdin)["jobs"][0]
op="write" if j["write"]["io_bytes"]>0 else "read"
d=j[op]
print("%.0f %.1f %.1f" % (d["iops"], d["clat_ns"]["mean"]/1000, d["clat_ns"]["percentile"]["99.000000"]/1000))'
}

median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# --- Helpers for the fair comparisons (nbd-compare, iscsi-compare); results go through
# bench/results.py into bench/results/<script>-<time>.json, from which bench/results.py
# render writes the tables of docs/benchmarks.md.

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# drop_caches: writes dirty pages back and empties the page cache (needs root).
drop_caches() {
  sync
  echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || {
    echo "dropping the page cache needs root (echo 3 > /proc/sys/vm/drop_caches)" >&2
    return 1
  }
}

# mariner_metric DIR NAME: one value of the server's /metrics (admin socket of DIR/data).
mariner_metric() {
  # awk reads to the end: an early exit would SIGPIPE curl and fail the pipeline (pipefail).
  local text
  text=$(curl -sf --max-time 5 --unix-socket "$1/data/admin.sock" http://mariner/metrics) || return 1
  echo "$text" | awk -v n="$2" '$1 == n { v = $2 } END { if (v != "") printf "%.0f\n", v }'
}

# wait_written_back DIR [TIMEOUT_S]: waits until the images hold (synced) every record that was
# durable in the log when called; prints the seconds it took. Fails after TIMEOUT_S (120).
wait_written_back() {
  local dir=$1 limit=${2:-120} target synced t0 now
  t0=$(date +%s.%N)
  target=$(mariner_metric "$dir" mariner_log_durable_seq)
  [ -n "$target" ] || { echo "no metrics from $dir/data/admin.sock" >&2; return 1; }
  while :; do
    synced=$(mariner_metric "$dir" mariner_store_synced_seq)
    now=$(date +%s.%N)
    [ -n "$synced" ] && [ "$synced" -ge "$target" ] && break
    if python3 -c "import sys; sys.exit(0 if $now - $t0 > $limit else 1)"; then
      echo "write-back not done after ${limit}s (synced $synced of $target)" >&2; return 1
    fi
    sleep 0.02
  done
  python3 -c "print('%.3f' % ($now - $t0))"
}

# fio_stats FIO-ARGS...: runs fio, prints "iops mean_us p50_us p99_us ios runtime_s MB/s" of the
# job's reads or writes (whichever moved data; env FIO_DIR=read|write says which, FIO_DIR=both:
# the IOPS, ios and MB/s of both summed, the latencies the reads').
# The first job's, or the one named by env FIO_JOB (with --group_reporting the first is the
# group's sum). Fails if fio fails or runs past FIO_TIMEOUT seconds (600).
fio_stats() {
  local out
  out=$(timeout "${FIO_TIMEOUT:-600}" fio "$@" --output-format=json 2>&1) || { echo "fio $*: $out" | tail -5 >&2; return 1; }
  echo "$out" | sed -n '/^{/,$p' | FIO_JOB=${FIO_JOB:-} FIO_DIR=${FIO_DIR:-} python3 -c '
import json,os,sys
jobs=json.load(sys.stdin)["jobs"]
want=os.environ["FIO_JOB"]
j=next((x for x in jobs if x["jobname"]==want), None) if want else jobs[0]
if j is None: sys.exit("fio: no job named %s" % want)
dr=os.environ["FIO_DIR"]
if dr == "both":
    d=dict(j["read"]); w=j["write"]
    for k in ("iops", "total_ios", "bw_bytes"): d[k] += w[k]
    d["runtime"]=max(d["runtime"], w["runtime"])
else:
    d=j[dr or ("write" if j["write"]["io_bytes"]>0 else "read")]
c=d["clat_ns"]; p=c.get("percentile",{})
mean, p50, p99 = c["mean"], p.get("50.000000",0), p.get("99.000000",0)
# With --fdatasync=1 each write is followed by an fdatasync whose time fio reports apart:
# add it (the mean exactly; the percentiles summed, an approximation).
l=j.get("sync",{}).get("lat_ns",{})  # its total_ios stays 0 in fio 3.33: look at the times
if l.get("mean",0) > 0:
    sp=l.get("percentile",{})
    mean += l["mean"]; p50 += sp.get("50.000000",0); p99 += sp.get("99.000000",0)
print("%.0f %.1f %.1f %.1f %d %.3f %.1f" % (d["iops"], mean/1000, p50/1000, p99/1000,
      d["total_ios"], d["runtime"]/1000, d["bw_bytes"]/1e6))'
}

# build_prev [REV]: builds `mariner` at REV (env PREV_REV, default 20714cb^: the last commit
# before issue 16's work) once into PREV_CACHE/<commit> (default target/bench-prev): the source
# from `git archive` (no worktree left registered in the repository), its own CARGO_TARGET_DIR
# seeded from this checkout's target/release so only the workspace crates compile. Reused while
# the resolved commit is the same. Sets PREV_BIN and PREV_COMMIT; progress on stderr.
build_prev() {
  local rev=${1:-${PREV_REV:-20714cb^}} dir
  PREV_COMMIT=$(git -C "$ROOT" rev-parse --verify "$rev^{commit}") ||
    { echo "PREV_REV=$rev: no such commit" >&2; return 1; }
  dir=${PREV_CACHE:-$ROOT/target/bench-prev}/$PREV_COMMIT
  PREV_BIN=$dir/target/release/mariner
  [ -x "$PREV_BIN" ] && [ -f "$dir/built" ] && return 0
  echo "building the previous release $rev ($PREV_COMMIT) into $dir (once)" >&2
  rm -rf "$dir/src"; mkdir -p "$dir/src"
  git -C "$ROOT" archive "$PREV_COMMIT" | tar -x -C "$dir/src"
  if [ ! -d "$dir/target/release" ] && [ -d "$ROOT/target/release/deps" ]; then
    mkdir -p "$dir/target"; cp -a "$ROOT/target/release" "$dir/target/release"
    rm -f "$dir/target/release/mariner"
  fi
  (cd "$dir/src" && CARGO_TARGET_DIR=$dir/target cargo build --release -q -p mariner) >&2
  touch "$dir/built"
}

# cpu_ticks PID: user + system clock ticks the process used so far (all threads), from
# /proc/PID/stat (fields 14 and 15).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# settle PID: waits (up to 20 s) until the server stops using CPU — Mariner's applier writes
# back what the log absorbed once the writers pause, and that work belongs to the writes.
settle() {
  local a b
  a=$(cpu_ticks "$1")
  for _ in $(seq 1 100); do
    sleep 0.2; b=$(cpu_ticks "$1")
    [ "$b" -le $((a + 1)) ] && return 0
    a=$b
  done
}
