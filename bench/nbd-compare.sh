#!/usr/bin/env bash
# Issue 16's benchmark of record: Mariner beside its peers on the same disk, every workload the
# issue's "What must be shown" lists, in one run; rounds interleaved (peer order rotated every
# round), medians, p50 and p99 as well as IOPS, and every target printed as
# "target X: measured Y -> met/missed". Needs root (drops the page cache; nbdfuse).
#
# Peers (PEERS, all by default; bench/nbd-compare/peers.sh):
#   mariner : this checkout's `mariner serve`, default 256 MiB log; NBD, and iSCSI (on a free
#             port, used by the qemu group)
#   prev    : the previous release's `mariner serve`, run the same way: the git revision PREV_REV
#             (default 20714cb^, the last commit before issue 16's work), built once into
#             target/bench-prev/<commit> (its own CARGO_TARGET_DIR) and reused
#   nbdkit  : nbdkit file + fua filter (fuamode=force: an fdatasync after every write) on a file
#             fully written first; also the "nbdkit file" of the read, sparse and mkfs targets
#   memory  : nbdkit memory (the protocol round trip with no disk), write workloads only
#   raw     : fio on a file of the same file system: psync + fdatasync (depth 1), libaio
#             O_DIRECT|O_DSYNC (depth 32), libaio O_DIRECT 1 MiB sequential
# Workload groups (ONLY="writes multiconn mixed seq reads sparse qemu", all by default; each
# peer runs the groups it takes part in, in this order, every round; bench/nbd-compare/workloads.sh):
#   writes    durable 4 KiB random writes, fio nbd engine, depth 1 and 32 (all peers)
#   multiconn fio 4 jobs × depth 8 against 1 job × depth 32 (4 KiB random writes); nbdcopy of
#             MC_MIB (4 GiB) onto a volume of that size and off it to null:, 4 connections
#             against 1 (Mariner)
#   mixed     70/30 random read/write, depth 32, over MIX_MIB written just before; a depth-1
#             reader's p99 alone and beside a depth-32 writer (mariner, prev, nbdkit)
#   seq       1 MiB sequential writes and reads at depth 8 (mariner, prev, nbdkit, raw)
#   reads     4 KiB random reads of applied data, depth 1 and 32, warm (working set read once)
#             and with the page cache dropped before each (mariner, prev, nbdkit, raw)
#   sparse    `qemu-img convert -n` of a sparse SPARSE_MIB (10 GiB) image onto a new volume;
#             `mkfs.ext4 -E discard` through nbdfuse on a new volume; wall time (mariner, nbdkit)
#   qemu      qemu-img bench, 4 KiB writes at depth 32 on a prefilled volume, the NBD and the
#             iSCSI front end of the same binary (a new server each); write IOPS and server CPU
#             per write from /proc/<pid>/stat utime+stime (mariner, prev)
# Every write run (writes, multiconn fio, seq writes, qemu) writes at least WRITE_MIB (3× the
# log) and lasts at least SECS: sized from the previous round's rate (the first round reruns a
# run that was too short). Before the write runs the working set (WS_MIB) is written once
# sequentially and made durable in place (Mariner: written back). After every write run the
# time until Mariner has written everything back is measured and the rate counting it reported.
#
# Usage: bench/nbd-compare.sh [ROUNDS] [SECONDS]   (5 rounds, 10 s per timed workload)
#   env: ONLY=<groups>  PEERS="mariner prev nbdkit memory raw"  PREV_REV=20714cb^
#        WS_MIB=1024 (working set) LOG_MIB=256 (Mariner's default log; other values pass
#        --log-size) WRITE_MIB=3×LOG_MIB MIX_MIB=64 MC_MIB=4096 SPARSE_MIB=10240
#        NBDCOPY_REQUESTS=64 FIO_TIMEOUT=600 WB_TIMEOUT=300 NBDKIT_PORT=10899 (and +1)
#        SCRATCH=<checkout>/target/bench-scratch RESULTS=<checkout>/bench/results
#   Short mode to try it (records a run marked "not counted"; keep it out of bench/results):
#     RESULTS=/tmp/nc ROUNDS=1 WS_MIB=256 WRITE_MIB=64 MC_MIB=512 SPARSE_MIB=1024 \
#       bench/nbd-compare.sh 1 2
# A run with fewer rounds, shorter workloads, smaller sizes, another log size, or only some
# groups or peers is recorded with a defect: it counts towards no target.
# Time at the defaults: about 20–25 minutes per round, 1 h 40 min – 2 h for 5 rounds (scaled
# from short runs on this 2-core machine at load 2–3; per round ≈ Mariner 10–11 min, prev 7–8,
# nbdkit 3–4, raw 2, memory 0.5). Most of it: the depth-1 writes (≥ 196,608 durable writes per
# peer: 1–3 min each for Mariner, prev and nbdkit), the qemu-img runs with their write-backs, and
# the 4 GiB nbdcopy runs. Each fio/qemu-img/nbdcopy/mkfs is killed after FIO_TIMEOUT
# seconds, Mariner's write-back waited for at most WB_TIMEOUT; either fails the run.
# Results: RESULTS/nbd-compare-<time>.json (every sample, medians, ratios, targets; the tables
# of docs/benchmarks.md are rendered from it by `bench/results.py render`), and stdout.
. "$(dirname "$0")/lib.sh"
case ${1:-} in -h | --help) sed -n '2,/^\. /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
ALL_GROUPS="writes multiconn mixed seq reads sparse qemu"
ALL_PEERS="mariner prev nbdkit memory raw"
ROUNDS=${1:-${ROUNDS:-5}}; SECS=${2:-${SECS:-10}}
ONLY=${ONLY:-$ALL_GROUPS}; PEERS=${PEERS:-$ALL_PEERS}
WS_MIB=${WS_MIB:-1024}; LOG_MIB=${LOG_MIB:-256}; WRITE_MIB=${WRITE_MIB:-$((3 * LOG_MIB))}
MIX_MIB=${MIX_MIB:-64}; MC_MIB=${MC_MIB:-4096}; SPARSE_MIB=${SPARSE_MIB:-10240}
NBDCOPY_REQUESTS=${NBDCOPY_REQUESTS:-64}; NBDKIT_PORT=${NBDKIT_PORT:-10899}
RESULTS=${RESULTS:-$ROOT/bench/results}
MIN_OPS=$((WRITE_MIB * 256)) # 4 KiB writes in WRITE_MIB
LOG_ARGS=()
[ "$LOG_MIB" = 256 ] || LOG_ARGS=(--log-size "${LOG_MIB}MiB")
has() { [[ " $ONLY " == *" $1 "* ]]; }
in_peers() { [[ " $PEERS " == *" $1 "* ]]; }
for g in $ONLY; do [[ " $ALL_GROUPS " == *" $g "* ]] || { echo "unknown group $g (groups: $ALL_GROUPS)" >&2; exit 2; }; done
for p in $PEERS; do [[ " $ALL_PEERS " == *" $p "* ]] || { echo "unknown peer $p (peers: $ALL_PEERS)" >&2; exit 2; }; done
for t in fio nbdkit nbdinfo nbdcopy nbdfuse fusermount3 qemu-img mkfs.ext4 curl; do
  command -v $t >/dev/null || { echo "$t missing (apt-get install fio nbdkit libnbd-bin nbdfuse fuse3 qemu-utils qemu-block-extra e2fsprogs curl)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "needs root: drops the page cache for the cold reads, mounts nbdfuse" >&2; exit 1; }
. "$ROOT/bench/nbd-compare/peers.sh"
. "$ROOT/bench/nbd-compare/workloads.sh"

build_release
PREV_NOTE="not run"
if in_peers prev; then build_prev; PREV_NOTE="${PREV_REV:-20714cb^} = ${PREV_COMMIT:0:7}"; fi
mkdir -p "$SCRATCH" "$RESULTS"
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
STAMP=$(date -u +%Y%m%d-%H%M%S)
SAMPLES=$SCRATCH/nbd-compare-$STAMP.tsv
: >"$SAMPLES"
LOAD_BEFORE=$(loadavg)
# The code measured: the commit at the start, "+dirty" if crates/ or bench/ differ from it.
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- crates bench || echo +dirty)
cleanup() { cleanup_peers; rm -f "$SAMPLES"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
if has sparse; then make_sparse_src; fi

# one_peer ROUND PEER: every selected group PEER takes part in.
one_peer() {
  local r=$1 p=$2 main=0
  local g
  for g in writes multiconn mixed seq reads; do
    has $g || continue
    case $p:$g in
      mariner:* | prev:writes | prev:mixed | prev:seq | prev:reads | nbdkit:writes | nbdkit:mixed | \
        nbdkit:seq | nbdkit:reads | raw:writes | raw:seq | raw:reads | memory:writes) main=1 ;;
    esac
  done
  if [ $main = 1 ]; then
    start_peer "$p"
    fill
    if has writes; then wl_writes "$r"; fi
    if has multiconn && [ "$p" = mariner ]; then wl_multiconn_fio "$r"; fi
    if has mixed && [ "$p" != raw ] && [ "$p" != memory ]; then wl_mixed "$r"; fi
    if has seq && [ "$p" != memory ]; then wl_seq_write "$r"; fi
    if { has reads || has seq; } && [ "$p" != memory ]; then warm; fi
    if has reads && [ "$p" != memory ]; then randreads "$r" warm; fi
    if has seq && [ "$p" != memory ]; then wl_seq_read "$r"; fi
    if has reads && [ "$p" != memory ]; then randreads "$r" cold drop; fi
    stop_peer
  fi
  if has multiconn && [ "$p" = mariner ]; then PEER=$p; wl_nbdcopy "$r"; fi
  if has sparse && { [ "$p" = mariner ] || [ "$p" = nbdkit ]; }; then PEER=$p; wl_sparse "$r"; fi
  if has qemu && { [ "$p" = mariner ] || [ "$p" = prev ]; }; then PEER=$p; wl_qemu "$r"; fi
}

read -r -a PL <<<"$PEERS"
T0=$(date +%s)
for r in $(seq 1 "$ROUNDS"); do
  order=()
  for i in "${!PL[@]}"; do order+=("${PL[$(((i + r - 1) % ${#PL[@]}))]}"); done
  echo "round $r/$ROUNDS: ${order[*]} (load $(loadavg))" >&2
  for p in "${order[@]}"; do
    t=$(date +%s); one_peer "$r" "$p"; echo "  $p: $(($(date +%s) - t)) s" >&2
  done
done
echo "total $(($(date +%s) - T0)) s" >&2
LOAD_AFTER=$(loadavg)

defects=()
[ "$ROUNDS" -ge 5 ] || defects+=("defect=$ROUNDS rounds (the issue asks for 5)")
[ "$SECS" -ge 10 ] || defects+=("defect=$SECS s per workload (the issue asks for ≥ 10 s)")
[ "$LOG_MIB" = 256 ] || defects+=("defect=a ${LOG_MIB} MiB log, not Mariner's default 256 MiB")
[ "$WRITE_MIB" -ge $((3 * LOG_MIB)) ] || defects+=("defect=write runs of ≥ ${WRITE_MIB} MiB, less than 3× the log")
[ "$WS_MIB" -ge 1024 ] && [ "$MC_MIB" -ge 4096 ] && [ "$SPARSE_MIB" -ge 10240 ] ||
  defects+=("defect=smaller sizes (WS_MIB=$WS_MIB MC_MIB=$MC_MIB SPARSE_MIB=$SPARSE_MIB)")
[ "$ONLY" = "$ALL_GROUPS" ] || defects+=("defect=only the groups $ONLY")
[ "$PEERS" = "$ALL_PEERS" ] || defects+=("defect=only the peers $PEERS")
python3 "$ROOT/bench/results.py" record nbd-compare "$SAMPLES" "$RESULTS/nbd-compare-$STAMP.json" \
  "started=$STARTED" "commit=$COMMIT" \
  "command=bench/nbd-compare.sh $ROUNDS $SECS (WS_MIB=$WS_MIB WRITE_MIB=$WRITE_MIB MC_MIB=$MC_MIB SPARSE_MIB=$SPARSE_MIB; groups: $ONLY; peers: $PEERS)" \
  "rounds=$ROUNDS" "load_before=$LOAD_BEFORE" "load_after=$LOAD_AFTER" \
  "setup=fio $(fio --version | sed 's/fio-//'), $(nbdkit --version), nbdcopy $(nbdcopy --version | awk 'NR==1{print $2}'), qemu-img $(qemu-img --version | awk 'NR==1{print $3}'); previous release: $PREV_NOTE; $SECS s per timed workload; write runs ≥ ${WRITE_MIB} MiB and ≥ $SECS s; every peer on a new sparse file (Mariner: new data dir, log ${LOG_MIB} MiB) filled once through the peer and made durable in place (Mariner: written back) before the timed work" \
  "working_set=${WS_MIB} MiB for every peer; 70/30 over ${MIX_MIB} MiB written just before; nbdcopy ${MC_MIB} MiB; sparse ${SPARSE_MIB} MiB" \
  "cache=warm = the working set read once sequentially through the peer first; cache dropped = sync; echo 3 > /proc/sys/vm/drop_caches before each; raw reads buffered (psync at depth 1, io_uring at 32), like the servers' preads" \
  ${defects[@]+"${defects[@]}"}
