#!/usr/bin/env bash
# Mariner beside its peers on the same disk, with the same working set and the same cache state
# for every peer; rounds interleaved (peer order rotated each round), medians and ratios.
#   mariner : `mariner serve` (default 256 MiB log), NBD; every write durable in the log first
#   nbdkit  : nbdkit file plugin + fua filter (fuamode=force: every write followed by fdatasync)
#   raw     : fio straight on a file on the same file system
# Every peer, every round, the same steps on a new sparse file (Mariner: a new data dir):
#   1. untimed: the whole working set (WS_MIB, 1 GiB) written once sequentially (1 MiB writes)
#      through the peer, then made durable in place (Mariner: until its images hold every
#      record, i.e. written back; nbdkit and raw: fsync);
#   2. 4 KiB random writes over the working set, depth 1 and depth 32 (raw: psync + fdatasync at
#      depth 1 — its latency is the write plus its fdatasync, percentiles summed —, libaio
#      O_DIRECT|O_DSYNC at 32). After each, Mariner's time until written back
#      is measured ("write-back after") and the rate including it reported too;
#   3. warm reads: the whole working set read once sequentially through the peer, then 4 KiB
#      random reads at depth 1 and 32 (raw: buffered, psync at 1 and io_uring at 32 — through
#      the page cache like the servers' preads, not O_DIRECT);
#   4. cold reads: `sync; echo 3 > /proc/sys/vm/drop_caches` before each of the depth-1 and the
#      depth-32 random reads (needs root), the same for every peer.
# Results: bench/results/nbd-compare-<time>.json (every sample, medians, ratios, targets; the
# tables of docs/benchmarks.md are rendered from it by `bench/results.py render`), and stdout.
#
# Usage: bench/nbd-compare.sh [ROUNDS] [SECONDS]      (5 rounds, 5 s per workload)
#   env: WS_MIB=1024 FIO_TIMEOUT=600 NBDKIT_PORT=10899 SCRATCH=<checkout>/target/bench-scratch
#        RESULTS=<checkout>/bench/results
# Time: about (6 × SECONDS + 30 s) per peer and round: ~13 minutes at the defaults; each fio is
# killed after FIO_TIMEOUT seconds (600), and Mariner's write-back waited for at most 120 s,
# failing the run.
. "$(dirname "$0")/lib.sh"
case ${1:-} in -h|--help) sed -n '2,/^\. /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
ROUNDS=${1:-5}; SECS=${2:-5}; WS_MIB=${WS_MIB:-1024}
NBDKIT_PORT=${NBDKIT_PORT:-10899}
RESULTS=${RESULTS:-$ROOT/bench/results}
for t in fio nbdkit curl; do
  command -v $t >/dev/null || { echo "$t missing (apt-get install fio nbdkit curl)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "needs root to drop the page cache for the cold reads" >&2; exit 1; }
build_release
mkdir -p "$SCRATCH" "$RESULTS"
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
STAMP=$(date -u +%Y%m%d-%H%M%S)
SAMPLES=$SCRATCH/nbd-compare-$STAMP.tsv
: >"$SAMPLES"
LOAD_BEFORE=$(loadavg)
# The code measured: the commit at the start, "+dirty" if crates/ or bench/ differ from it.
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- crates bench || echo +dirty)
MPID=""; NPID=""
cleanup() {
  [ -n "$MPID" ] && { stop_mariner; MPID=""; }
  if [ -n "$NPID" ]; then kill "$NPID" 2>/dev/null || true; wait "$NPID" 2>/dev/null || true; NPID=""; fi
  rm -rf "$SCRATCH/nc-m" "$SCRATCH/nc-nbdkit.img" "$SCRATCH/nc-raw.img" "$SAMPLES"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# put ROUND PEER WORKLOAD "iops mean p50 p99 ios runtime" [WB_S]: appends the samples.
put() {
  local r=$1 p=$2 w=$3 wb=${5:-}
  set -- $4
  printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$p" "$w" iops "$1" "$r" "$p" "$w" mean_us "$2" \
    "$r" "$p" "$w" p50_us "$3" "$r" "$p" "$w" p99_us "$4" >>"$SAMPLES"
  if [ -n "$wb" ]; then
    printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$p" "$w" wb_s "$wb" "$r" "$p" "$w" iops_wb \
      "$(python3 -c "print('%.0f' % ($5 / ($6 + $wb)))")" >>"$SAMPLES"
  fi
}

# The fio target of a peer: NBD URI or the raw file.
target() {
  case $1 in
    mariner) echo "--ioengine=nbd --uri=$MURL" ;;
    nbdkit) echo "--ioengine=nbd --uri=nbd://127.0.0.1:$NBDKIT_PORT" ;;
    raw) echo "--filename=$SCRATCH/nc-raw.img" ;;
  esac
}

start_peer() {
  case $1 in
    mariner) start_mariner "$SCRATCH/nc-m" --default-volume-size "${WS_MIB}MiB" ;;
    nbdkit)
      rm -f "$SCRATCH/nc-nbdkit.img"; truncate -s "${WS_MIB}M" "$SCRATCH/nc-nbdkit.img"
      nbdkit --exit-with-parent -f -p 0 --port="$NBDKIT_PORT" --filter=fua \
        file "$SCRATCH/nc-nbdkit.img" fuamode=force &
      NPID=$!
      for _ in $(seq 1 100); do nbdinfo --size "nbd://127.0.0.1:$NBDKIT_PORT" >/dev/null 2>&1 && break; sleep 0.05; done
      ;;
    raw) rm -f "$SCRATCH/nc-raw.img"; truncate -s "${WS_MIB}M" "$SCRATCH/nc-raw.img" ;;
  esac
}

stop_peer() {
  case $1 in
    mariner) stop_mariner; MPID="" ;;
    nbdkit) kill "$NPID"; wait "$NPID" 2>/dev/null || true; NPID="" ;;
    raw) ;;
  esac
}

# durable_in_place PEER: untimed; Mariner until written back (prints its seconds), else fsync.
durable_in_place() {
  case $1 in
    mariner) wait_written_back "$SCRATCH/nc-m" ;;
    nbdkit) sync -d "$SCRATCH/nc-nbdkit.img"; echo 0 ;;
    raw) sync -d "$SCRATCH/nc-raw.img"; echo 0 ;;
  esac
}

one_peer() {
  local r=$1 p=$2 t common out wb
  start_peer "$p"
  t=$(target "$p")
  common="--name=b --size=${WS_MIB}M --bs=4k --runtime=$SECS --time_based"
  # 1. fill the working set, durable in place
  timeout "${FIO_TIMEOUT:-600}" fio --name=fill $t --size="${WS_MIB}M" --rw=write --bs=1M --iodepth=8 --output-format=terse >/dev/null
  durable_in_place "$p" >/dev/null
  # 2. durable random writes
  if [ "$p" = raw ]; then
    out=$(fio_stats $common $t --rw=randwrite --ioengine=psync --fdatasync=1)
  else
    out=$(fio_stats $common $t --rw=randwrite --iodepth=1)
  fi
  wb=$(durable_in_place "$p"); put "$r" "$p" randwrite-qd1 "$out" "$wb"
  if [ "$p" = raw ]; then
    out=$(fio_stats $common $t --rw=randwrite --ioengine=libaio --direct=1 --sync=dsync --iodepth=32)
  else
    out=$(fio_stats $common $t --rw=randwrite --iodepth=32)
  fi
  wb=$(durable_in_place "$p"); put "$r" "$p" randwrite-qd32 "$out" "$wb"
  # 3. warm reads: read the working set once, then random reads
  timeout "${FIO_TIMEOUT:-600}" fio --name=warm $t --size="${WS_MIB}M" --rw=read --bs=1M --iodepth=8 --output-format=terse >/dev/null
  for d in 1 32; do
    if [ "$p" = raw ]; then
      if [ $d = 1 ]; then eng=psync; else eng=io_uring; fi
      out=$(fio_stats $common $t --rw=randread --ioengine=$eng --iodepth=$d)
    else
      out=$(fio_stats $common $t --rw=randread --iodepth=$d)
    fi
    put "$r" "$p" "randread-qd$d-warm" "$out"
  done
  # 4. cold reads: the page cache dropped before each
  for d in 1 32; do
    drop_caches
    if [ "$p" = raw ]; then
      if [ $d = 1 ]; then eng=psync; else eng=io_uring; fi
      out=$(fio_stats $common $t --rw=randread --ioengine=$eng --iodepth=$d)
    else
      out=$(fio_stats $common $t --rw=randread --iodepth=$d)
    fi
    put "$r" "$p" "randread-qd$d-cold" "$out"
  done
  stop_peer "$p"
}

PEERS=(mariner nbdkit raw)
for r in $(seq 1 "$ROUNDS"); do
  order=()
  for i in 0 1 2; do order+=("${PEERS[$(((i + r - 1) % 3))]}"); done
  echo "round $r/$ROUNDS: ${order[*]} (load $(loadavg))" >&2
  for p in "${order[@]}"; do one_peer "$r" "$p"; done
done
LOAD_AFTER=$(loadavg)

python3 "$ROOT/bench/results.py" record nbd-compare "$SAMPLES" "$RESULTS/nbd-compare-$STAMP.json" \
  "started=$STARTED" "commit=$COMMIT" \
  "command=bench/nbd-compare.sh $ROUNDS $SECS (WS_MIB=$WS_MIB)" "rounds=$ROUNDS" \
  "load_before=$LOAD_BEFORE" "load_after=$LOAD_AFTER" \
  "setup=fio $(fio --version | sed 's/fio-//'), $(nbdkit --version), $SECS s per workload; every peer on a new sparse file (Mariner: new data dir, default 256 MiB log) filled once through the peer and made durable in place (Mariner: written back) before the timed work" \
  "working_set=${WS_MIB} MiB for every peer" \
  "cache=warm = the working set read once sequentially through the peer first; cache dropped = sync; echo 3 > /proc/sys/vm/drop_caches before each; raw reads buffered (psync at depth 1, io_uring at 32), like the servers' preads"
