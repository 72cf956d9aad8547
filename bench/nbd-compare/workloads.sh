# The workloads of bench/nbd-compare.sh, one function per step, run against the peer started by
# start_peer (bench/nbd-compare/peers.sh). Sourced by it; every sample goes to $SAMPLES as
# "round peer workload metric value" (bench/results.py reads it).

declare -A RATE=() # "peer/workload" -> the rate of its last run, to size the next one
HZ=$(getconf CLK_TCK)
STEP=$((4096 * 7919)) # qemu-img bench's stride: prime, so it visits every block of a 2^k image

put() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$SAMPLES"; }
calc() { awk "BEGIN { printf \"%.${2:-1}f\", $1 }"; }
now() { date +%s.%N; }
# short SECONDS: true when a run took less than SECS.
short() { awk "BEGIN { exit !($1 < $SECS) }"; }

# put_fio ROUND WORKLOAD "fio_stats line" [mbps]: the peer's IOPS, mean, p50, p99, run time
# (and MB/s).
put_fio() {
  local r=$1 w=$2 mb=${4:-}
  set -- $3
  put "$r" "$PEER" "$w" iops "$1"; put "$r" "$PEER" "$w" mean_us "$2"
  put "$r" "$PEER" "$w" p50_us "$3"; put "$r" "$PEER" "$w" p99_us "$4"
  put "$r" "$PEER" "$w" run_s "$6"
  if [ -n "$mb" ]; then put "$r" "$PEER" "$w" mbps "$7"; fi
}

# put_wb ROUND WORKLOAD IOS RUN_S WB_S: the write-back after a write run and the rate counting it.
put_wb() {
  put "$1" "$PEER" "$2" wb_s "$5"
  put "$1" "$PEER" "$2" iops_wb "$(calc "$3 / ($4 + $5)" 0)"
}

# ops_for KEY MIN [MULTIPLE]: requests for a sized run: MIN, or more if the last run of KEY
# went fast enough to finish MIN in less than SECS (its rate × SECS × 1.2), a multiple of
# MULTIPLE (1).
ops_for() {
  local n
  n=$(awk -v r="${RATE[$1]:-0}" -v s="$SECS" -v m="$2" -v k="${3:-1}" \
    'BEGIN { n = r * s * 1.2; if (n < m) n = m; n = int((n + k - 1) / k) * k; print n }')
  echo "$n"
}

# sized_fio KEY MIN_OPS BS_KIB JOBS FIO-ARGS...: a write run of at least MIN_OPS requests of
# BS_KIB (spread over JOBS jobs, --group_reporting) that also lasts at least SECS: sized from
# the last round's rate of KEY; the first time, a run that ends sooner than SECS is made durable
# in place and run again, larger (it counts for nothing). Sets OUT (fio_stats' line).
sized_fio() {
  local key=$1 min=$2 bs=$3 jobs=$4 n first=1
  shift 4
  local args=("$@")
  [ -n "${RATE[$key]:-}" ] && first=0
  while :; do
    n=$(ops_for "$key" "$min" "$jobs")
    OUT=$(fio_stats --size="${WS_MIB}M" --bs="${bs}k" --io_size=$((n * bs / jobs))k \
      --numjobs="$jobs" --group_reporting "${args[@]}")
    set -- $OUT
    RATE[$key]=$1
    { [ $first = 1 ] && short "$6"; } || break
    first=0
    durable_in_place >/dev/null
  done
}

# server_ticks: the server's CPU ticks so far (0 for raw, which has none).
server_ticks() { if [ -n "$SPID" ]; then cpu_ticks "$SPID"; else echo 0; fi; }

# wl_writes ROUND: durable 4 KiB random writes at depth 1 and 32, each ≥ 3× the log
# (WRITE_MIB) and ≥ SECS; then the time until written back (Mariner), the rate counting it,
# and the server's CPU per write from before the run until it is idle again.
wl_writes() {
  local r=$1 d wb c0 c1 ios rt
  for d in 1 32; do
    c0=$(server_ticks)
    if [ "$PEER" = raw ] && [ $d = 1 ]; then
      sized_fio "$PEER/randwrite-qd1" "$MIN_OPS" 4 1 --name=b $FIO_T --rw=randwrite --ioengine=psync --fdatasync=1
    elif [ "$PEER" = raw ]; then
      sized_fio "$PEER/randwrite-qd32" "$MIN_OPS" 4 1 --name=b $FIO_T --rw=randwrite --ioengine=libaio --direct=1 --sync=dsync --iodepth=32
    else
      sized_fio "$PEER/randwrite-qd$d" "$MIN_OPS" 4 1 --name=b $FIO_T --rw=randwrite --iodepth=$d
    fi
    wb=$(durable_in_place)
    put_fio "$r" "randwrite-qd$d" "$OUT"
    set -- $OUT; ios=$5; rt=$6
    put_wb "$r" "randwrite-qd$d" "$ios" "$rt" "$wb"
    if [ -n "$SPID" ]; then
      settle "$SPID"; c1=$(server_ticks)
      put "$r" "$PEER" "randwrite-qd$d" cpu_us "$(calc "($c1 - $c0) / $HZ / $ios * 1e6")"
    fi
  done
}

# wl_multiconn_fio ROUND: 4 KiB random writes, 1 job × depth 32 against 4 jobs × depth 8 (4
# connections), each ≥ 3× the log and ≥ SECS, the order swapped every round.
wl_multiconn_fio() {
  local r=$1 shape jobs depth wb
  local shapes=(1x32 4x8)
  [ $((r % 2)) = 0 ] && shapes=(4x8 1x32)
  for shape in "${shapes[@]}"; do
    jobs=${shape%x*}; depth=${shape#*x}
    sized_fio "$PEER/randwrite-$shape" "$MIN_OPS" 4 "$jobs" --name=b $FIO_T --rw=randwrite --iodepth="$depth"
    wb=$(durable_in_place)
    put_fio "$r" "randwrite-$shape" "$OUT"
    set -- $OUT
    put_wb "$r" "randwrite-$shape" "$5" "$6" "$wb"
  done
}

# wl_mixed ROUND: (1) 70/30 random read/write at depth 32 over blocks written just before: a
# MIX_MIB region written once at random (4 KiB, depth 32), then at once the mix over it for SECS
# (IOPS of both, latencies of the reads); (2) a depth-1 random reader over the working set alone,
# then beside a depth-32 random writer on another connection (its p99 both times).
wl_mixed() {
  local r=$1
  fio_stats --name=b $FIO_T --size="${MIX_MIB}M" --bs=4k --rw=randwrite --iodepth=32 >/dev/null
  OUT=$(FIO_DIR=both fio_stats --name=b $FIO_T --size="${MIX_MIB}M" --bs=4k --rw=randrw \
    --rwmixread=70 --iodepth=32 --runtime="$SECS" --time_based)
  put_fio "$r" randrw7030-qd32 "$OUT"
  durable_in_place >/dev/null
  OUT=$(fio_stats --size="${WS_MIB}M" --bs=4k --runtime="$SECS" --time_based \
    --name=reader $FIO_T --rw=randread --iodepth=1)
  put_fio "$r" randread-qd1-alone "$OUT"
  OUT=$(FIO_JOB=reader fio_stats --size="${WS_MIB}M" --bs=4k --runtime="$SECS" --time_based \
    --name=reader $FIO_T --rw=randread --iodepth=1 --name=writer $FIO_T --rw=randwrite --iodepth=32)
  put_fio "$r" randread-qd1-beside-writer "$OUT"
  durable_in_place >/dev/null
}

# raw_direct: raw fio's engine for the 1 MiB sequential runs (O_DIRECT, libaio); none for servers.
raw_direct() { [ "$PEER" = raw ] && echo "--ioengine=libaio --direct=1" || true; }

# wl_seq_write ROUND: 1 MiB sequential writes at depth 8, ≥ 3× the log and ≥ SECS.
wl_seq_write() {
  local r=$1 wb
  sized_fio "$PEER/seqwrite-1m-qd8" "$WRITE_MIB" 1024 1 --name=b $FIO_T $(raw_direct) --rw=write --iodepth=8
  wb=$(durable_in_place)
  put_fio "$r" seqwrite-1m-qd8 "$OUT" mbps
  set -- $OUT
  put_wb "$r" seqwrite-1m-qd8 "$5" "$6" "$wb"
}

# wl_seq_read ROUND: 1 MiB sequential reads at depth 8 for SECS (after warm).
wl_seq_read() {
  OUT=$(fio_stats --name=b $FIO_T $(raw_direct) --size="${WS_MIB}M" --bs=1M --rw=read --iodepth=8 \
    --runtime="$SECS" --time_based)
  put_fio "$1" seqread-1m-qd8 "$OUT" mbps
}

# randreads ROUND WHEN [drop]: 4 KiB random reads at depth 1 and 32 for SECS each (raw:
# buffered, psync at 1 and io_uring at 32, through the page cache like the servers' preads);
# "drop" drops the page cache before each.
randreads() {
  local r=$1 when=$2 d eng
  for d in 1 32; do
    [ "${3:-}" = drop ] && drop_caches
    eng=""
    if [ "$PEER" = raw ]; then
      if [ $d = 1 ]; then eng=--ioengine=psync; else eng=--ioengine=io_uring; fi
    fi
    OUT=$(fio_stats --name=b $FIO_T $eng --size="${WS_MIB}M" --bs=4k --rw=randread --iodepth=$d \
      --runtime="$SECS" --time_based)
    put_fio "$r" "randread-qd$d-$when" "$OUT"
  done
}

# wl_nbdcopy ROUND: Mariner on its own MC_MIB volume, filled and written back; nbdcopy of
# MC_MIB onto it from nbdkit's pattern plugin (every block data; served on its own port, which
# allows multi-conn: a socket-activated source would hold nbdcopy to 1 connection) with 1 and
# with 4 connections (order swapped every round; written back after each, timed apart), then
# of the volume to null: the same way. --threads as many as connections (nbdcopy caps the
# connections at its threads, which default to the cores). MB/s = MC_MIB MiB / seconds.
wl_nbdcopy() {
  local r=$1 c t0 secs wb ppid src conns=(1 4)
  [ $((r % 2)) = 0 ] && conns=(4 1)
  start_peer "$PEER" "$MC_MIB"
  fill "$MC_MIB"
  src=nbd://127.0.0.1:$((NBDKIT_PORT + 1))
  nbdkit --exit-with-parent -f --port=$((NBDKIT_PORT + 1)) pattern size="${MC_MIB}M" &
  ppid=$!
  for _ in $(seq 1 100); do nbdinfo --size "$src" >/dev/null 2>&1 && break; sleep 0.05; done
  for c in "${conns[@]}"; do
    t0=$(now)
    timeout "${FIO_TIMEOUT:-600}" nbdcopy --connections="$c" --threads="$c" \
      --requests="$NBDCOPY_REQUESTS" "$src" "$URL"
    secs=$(calc "$(now) - $t0" 3)
    wb=$(durable_in_place)
    put "$r" "$PEER" "nbdcopy-write-c$c" secs "$secs"
    put "$r" "$PEER" "nbdcopy-write-c$c" mbps "$(calc "$MC_MIB * 1.048576 / $secs")"
    put "$r" "$PEER" "nbdcopy-write-c$c" wb_s "$wb"
  done
  kill "$ppid"; wait "$ppid" 2>/dev/null || true
  for c in "${conns[@]}"; do
    t0=$(now)
    timeout "${FIO_TIMEOUT:-600}" nbdcopy --connections="$c" --threads="$c" \
      --requests="$NBDCOPY_REQUESTS" "$URL" null:
    secs=$(calc "$(now) - $t0" 3)
    put "$r" "$PEER" "nbdcopy-read-c$c" secs "$secs"
    put "$r" "$PEER" "nbdcopy-read-c$c" mbps "$(calc "$MC_MIB * 1.048576 / $secs")"
  done
  stop_peer
}

# make_sparse_src: the source of the sparse runs: a SPARSE_MIB raw image, 1 MiB of random data
# every 128 MiB, holes between.
make_sparse_src() {
  local i
  rm -f "$SCRATCH/nc-sparse.img"; truncate -s "${SPARSE_MIB}M" "$SCRATCH/nc-sparse.img"
  for ((i = 0; i < SPARSE_MIB; i += 128)); do
    dd if=/dev/urandom of="$SCRATCH/nc-sparse.img" bs=1M count=1 seek=$i conv=notrunc status=none
  done
}

# wl_sparse ROUND: on a new SPARSE_MIB volume each: `qemu-img convert -n` of the sparse image
# onto it (qemu zeroes the target's holes), and `mkfs.ext4 -E discard` of the file nbdfuse
# exposes for it (discards through FUSE fallocate -> NBD trim); wall time of each, with
# Mariner's write-back after it apart.
wl_sparse() {
  local r=$1 t0 secs wb p=$PEER
  start_peer "$p" "$SPARSE_MIB"
  t0=$(now)
  timeout "${FIO_TIMEOUT:-600}" qemu-img convert -n -f raw -O raw "$SCRATCH/nc-sparse.img" "$URL"
  secs=$(calc "$(now) - $t0" 3); wb=$(durable_in_place)
  put "$r" "$p" sparse-convert secs "$secs"; put "$r" "$p" sparse-convert wb_s "$wb"
  stop_peer
  start_peer "$p" "$SPARSE_MIB"
  FUSE_MNT=$SCRATCH/nc-fuse; mkdir -p "$FUSE_MNT"
  nbdfuse "$FUSE_MNT/disk" "$URL" &
  local fpid=$!
  for _ in $(seq 1 100); do [ -e "$FUSE_MNT/disk" ] && break; sleep 0.05; done
  t0=$(now)
  timeout "${FIO_TIMEOUT:-600}" mkfs.ext4 -q -F -E discard "$FUSE_MNT/disk"
  secs=$(calc "$(now) - $t0" 3)
  fusermount3 -u "$FUSE_MNT"; wait "$fpid" 2>/dev/null || true
  wb=$(durable_in_place)
  put "$r" "$p" sparse-mkfs secs "$secs"; put "$r" "$p" sparse-mkfs wb_s "$wb"
  stop_peer
}

# qbench URL COUNT DEPTH [ARGS]: qemu-img bench of COUNT 4 KiB requests; prints its seconds.
qbench() {
  local url=$1 count=$2 depth=$3 out secs
  shift 3
  out=$(timeout "${FIO_TIMEOUT:-600}" qemu-img bench -f raw -c "$count" -d "$depth" -s 4096 -S "$STEP" "$@" "$url" 2>&1) || true
  secs=$(echo "$out" | sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p')
  [ -n "$secs" ] || { echo "qemu-img bench $url failed: $(echo "$out" | tail -3)" >&2; return 1; }
  echo "$secs"
}

# wl_qemu ROUND: qemu-img bench driving the peer's NBD and its iSCSI front end (a new server
# each, NBD first on odd rounds): the volume prefilled (1 MiB writes, depth 8) and written back,
# then 4 KiB writes at depth 32, ≥ 3× the log and ≥ SECS; written back; server CPU per write
# from before the burst until the server is idle. Peer names: PEER (NBD), PEER-iscsi.
wl_qemu() {
  local r=$1 p=$PEER fe url name n secs wb c0 c1 first key fes=(nbd iscsi)
  [ $((r % 2)) = 0 ] && fes=(iscsi nbd)
  for fe in "${fes[@]}"; do
    start_peer "$p" "$WS_MIB"
    if [ "$fe" = nbd ]; then url=$URL; name=$p; else url=$ISCSI_URL; name=$p-iscsi; fi
    timeout "${FIO_TIMEOUT:-600}" qemu-img bench -f raw -c "$WS_MIB" -d 8 -s 1M -w --pattern=0x33 "$url" >/dev/null
    durable_in_place >/dev/null; settle "$SPID"
    key=$name/qemu; first=1; [ -n "${RATE[$key]:-}" ] && first=0
    while :; do
      n=$(ops_for "$key" "$MIN_OPS")
      c0=$(server_ticks)
      secs=$(qbench "$url" "$n" 32 -w --pattern=0xa5)
      wb=$(durable_in_place); settle "$SPID"; c1=$(server_ticks)
      RATE[$key]=$(calc "$n / $secs" 0)
      { [ $first = 1 ] && short "$secs"; } || break
      first=0
    done
    put "$r" "$name" qemu-write-qd32 iops "${RATE[$key]}"
    put "$r" "$name" qemu-write-qd32 lat_us "$(calc "$secs / $n * 32e6")"
    put "$r" "$name" qemu-write-qd32 run_s "$secs"
    put "$r" "$name" qemu-write-qd32 wb_s "$wb"
    put "$r" "$name" qemu-write-qd32 iops_wb "$(calc "$n / ($secs + $wb)" 0)"
    put "$r" "$name" qemu-write-qd32 cpu_us "$(calc "($c1 - $c0) / $HZ / $n * 1e6")"
    stop_peer
  done
}
