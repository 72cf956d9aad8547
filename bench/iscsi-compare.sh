#!/usr/bin/env bash
# Mariner over iSCSI beside Mariner over NBD and beside tgtd, driven by the same client
# (`qemu-img bench`, Debian qemu-utils + qemu-block-extra), one run, rounds interleaved,
# medians and ratios. Issue 3's benchmark.
#   mariner-iscsi : `mariner serve`, iscsi://…/iqn.2026-11.dev.mariner:vol0/0
#   mariner-nbd   : the same server, nbd://…/vol0
#   tgtd          : Debian tgt 1.0.85 on its own port, a 1 GiB file backing store opened with
#                   O_SYNC (--bsoflags sync), LUN 1
# Every peer acknowledges a write only once it is durable (Mariner: in the log; tgtd: O_SYNC),
# so qemu-img runs with its default cache mode and sends no flushes.
# Every peer, every round (peer order rotated each round), the same steps on a new server:
#   1. untimed: the whole 1 GiB image written once sequentially (1 MiB writes, depth 8) through
#      the peer, then the server left to go idle — Mariner until its images hold every record
#      (written back), so no peer starts on a sparse image or with a full log;
#   2. W1 4 KiB writes at depth 1;
#   3. W32 4 KiB writes at depth 32: at least 3× the log (LOG_MIB, Mariner's default 256 MiB)
#      in payload, so Mariner's rate includes the write-back its log forces (a burst that fits
#      in the log never pays it). After the burst, the time until Mariner has written everything
#      back is measured too ("write-back after") and the rate including it is reported beside;
#      server CPU per write counts from before the burst until the server is idle again;
#   4. R32 4 KiB reads at depth 32 over the prefilled image, once the server is idle (all peers'
#      data in the page cache from the prefill and the writes: warm for every peer alike).
# qemu-img bench walks offsets by a fixed step modulo the image size; a step of 7919 blocks
# (prime, coprime with the image's 2^18 blocks) scatters consecutive requests over the image.
# Results: bench/results/iscsi-compare-<time>.json (every sample, medians, ratios, targets; the
# tables of docs/benchmarks.md are rendered from it by `bench/results.py render`), and stdout.
# A run whose depth-32 phase writes less than 3× the log (PERCENT < 100) is recorded as a run
# with a defect: it does not count towards the targets.
#
# Usage: bench/iscsi-compare.sh [ROUNDS] [PERCENT]   (5 rounds; PERCENT scales the counts, 100)
#   env: LOG_MIB=256 QEMU_IMG_TIMEOUT=900 TGT_PORT=3261 TGT_CTL=7391 SCRATCH=...
#        RESULTS=<checkout>/bench/results
# Time: 1–3 minutes per round at the defaults on this machine (tgtd's 196,608 depth-32 writes
# take 10–35 s); every qemu-img is killed after QEMU_IMG_TIMEOUT seconds (900), failing the run.
. "$(dirname "$0")/lib.sh"
case ${1:-} in -h|--help) sed -n '2,/^\. /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
ROUNDS=${1:-5}; PERCENT=${2:-100}
LOG_MIB=${LOG_MIB:-256}
QEMU_IMG_TIMEOUT=${QEMU_IMG_TIMEOUT:-900}
RESULTS=${RESULTS:-$ROOT/bench/results}
for t in qemu-img tgtd tgtadm curl; do
  command -v "$t" >/dev/null || { echo "$t missing (apt-get install qemu-utils qemu-block-extra tgt curl)" >&2; exit 1; }
done
build_release
mkdir -p "$SCRATCH" "$RESULTS"
SIZE=$((1 << 30)); STEP=$((4096 * 7919))
# 3× the log in 4 KiB payloads (each record is 80 bytes more, so the log turns over > 3×).
W32_FULL=$((3 * LOG_MIB * 256))
W1=$((3000 * PERCENT / 100)); W32=$((W32_FULL * PERCENT / 100)); R32=$((60000 * PERCENT / 100))
TGT_PORT=${TGT_PORT:-3261}; TGT_CTL=${TGT_CTL:-7391}
TGT_IQN=iqn.2026-11.dev.mariner.bench:tgt
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
STAMP=$(date -u +%Y%m%d-%H%M%S)
SAMPLES=$SCRATCH/iscsi-compare-$STAMP.tsv
: >"$SAMPLES"
LOAD_BEFORE=$(loadavg)
# The code measured: the commit at the start, "+dirty" if crates/ or bench/ differ from it.
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- crates bench || echo +dirty)
TPID=""
MPID=""
cleanup() {
  if [ -n "$TPID" ]; then tgt_stop; fi
  if [ -n "$MPID" ]; then stop_mariner; MPID=""; fi
  rm -rf "$SCRATCH/ic-m" "$SCRATCH/tgt.img" "$SCRATCH/tgtd.log" "$SAMPLES"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# bench URL COUNT DEPTH [-w]: prints the seconds qemu-img took for COUNT requests.
bench() {
  local url=$1 count=$2 depth=$3; shift 3
  local out secs
  out=$(timeout "$QEMU_IMG_TIMEOUT" qemu-img bench -f raw -c "$count" -d "$depth" -s 4096 -S "$STEP" "$@" "$url" 2>&1) || true
  secs=$(echo "$out" | sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p')
  [ -n "$secs" ] || { echo "qemu-img bench $url failed: $(echo "$out" | tail -3)" >&2; return 1; }
  echo "$secs"
}

# cpu_ticks and settle: bench/lib.sh.
# put ROUND PEER WORKLOAD METRIC VALUE: one sample.
put() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$SAMPLES"; }

# written_back PEER: Mariner: seconds until its images hold every durable record; others 0
# (tgtd writes O_SYNC in place).
written_back() {
  case $1 in mariner-*) wait_written_back "$SCRATCH/ic-m" ;; *) echo 0 ;; esac
}

# measure ROUND PEER URL PID: one round of the workloads on a fresh server.
measure() {
  local r=$1 peer=$2 url=$3 pid=$4 secs c0 c1 hz wb
  hz=$(getconf CLK_TCK)
  # 1. untimed: the whole image written once, then durable in place and the server idle.
  timeout "$QEMU_IMG_TIMEOUT" qemu-img bench -f raw -c $((SIZE >> 20)) -d 8 -s 1M -w --pattern=0x33 "$url" >/dev/null 2>&1 ||
    { echo "prefill of $url failed" >&2; return 1; }
  written_back "$peer" >/dev/null; settle "$pid"
  # 2. depth 1
  secs=$(bench "$url" "$W1" 1 -w --pattern=0x5a)
  put "$r" "$peer" write-qd1 iops "$(python3 -c "print('%.0f' % ($W1/$secs))")"
  put "$r" "$peer" write-qd1 lat_us "$(python3 -c "print('%.1f' % ($secs/$W1*1e6))")"
  written_back "$peer" >/dev/null; settle "$pid"
  # 3. depth 32, >= 3x the log
  c0=$(cpu_ticks "$pid")
  secs=$(bench "$url" "$W32" 32 -w --pattern=0xa5)
  wb=$(written_back "$peer"); settle "$pid"; c1=$(cpu_ticks "$pid")
  put "$r" "$peer" write-qd32 iops "$(python3 -c "print('%.0f' % ($W32/$secs))")"
  put "$r" "$peer" write-qd32 lat_us "$(python3 -c "print('%.1f' % ($secs/$W32*32e6))")"
  put "$r" "$peer" write-qd32 wb_s "$wb"
  put "$r" "$peer" write-qd32 iops_wb "$(python3 -c "print('%.0f' % ($W32/($secs+$wb)))")"
  put "$r" "$peer" write-qd32 cpu_us "$(python3 -c "print('%.1f' % (($c1-$c0)/$hz/$W32*1e6))")"
  # 4. reads over the written image, server idle
  secs=$(bench "$url" "$R32" 32)
  put "$r" "$peer" read-qd32 iops "$(python3 -c "print('%.0f' % ($R32/$secs))")"
  put "$r" "$peer" read-qd32 lat_us "$(python3 -c "print('%.1f' % ($secs/$R32*32e6))")"
}

tgt_start() {
  rm -f "$SCRATCH/tgt.img"
  dd if=/dev/zero of="$SCRATCH/tgt.img" bs=1M count=$((SIZE >> 20)) status=none
  tgtd -f --iscsi portal=127.0.0.1:$TGT_PORT -C "$TGT_CTL" >"$SCRATCH/tgtd.log" 2>&1 &
  TPID=$!
  local ok=0
  for _ in $(seq 1 100); do
    tgtadm -C "$TGT_CTL" --lld iscsi --op show --mode target >/dev/null 2>&1 && { ok=1; break; }
    sleep 0.05
  done
  [ $ok = 1 ] || { cat "$SCRATCH/tgtd.log" >&2; return 1; }
  tgtadm -C "$TGT_CTL" --lld iscsi --op new --mode target --tid 1 -T "$TGT_IQN"
  tgtadm -C "$TGT_CTL" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 \
    -b "$SCRATCH/tgt.img" --bsoflags sync
  tgtadm -C "$TGT_CTL" --lld iscsi --op bind --mode target --tid 1 -I 127.0.0.1
}
# tgtd ignores SIGTERM while it has targets: take the system offline and delete it.
tgt_stop() {
  tgtadm -C "$TGT_CTL" --op update --mode sys --name State -v offline >/dev/null 2>&1 || true
  tgtadm -C "$TGT_CTL" --op delete --mode system >/dev/null 2>&1 || kill -9 "$TPID" 2>/dev/null || true
  wait "$TPID" 2>/dev/null || true; TPID=""
}

PEERS=(mariner-iscsi mariner-nbd tgtd)
for r in $(seq 1 "$ROUNDS"); do
  order=()
  for i in 0 1 2; do order+=("${PEERS[$(((i + r - 1) % 3))]}"); done
  echo "round $r/$ROUNDS: ${order[*]} (load $(loadavg))" >&2
  for peer in "${order[@]}"; do
    case $peer in
      mariner-iscsi)
        start_mariner "$SCRATCH/ic-m" --iscsi-listen 127.0.0.1:0 --default-volume-size 1GiB --log-size "${LOG_MIB}MiB"
        portal=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['iscsi'][0])" "$SCRATCH/ic-m/data/ports.json")
        measure "$r" $peer "iscsi://$portal/iqn.2026-11.dev.mariner:vol0/0" "$MPID"
        stop_mariner; MPID="" ;;
      mariner-nbd)
        start_mariner "$SCRATCH/ic-m" --iscsi-listen 127.0.0.1:0 --default-volume-size 1GiB --log-size "${LOG_MIB}MiB"
        measure "$r" $peer "$MURL" "$MPID"
        stop_mariner; MPID="" ;;
      tgtd)
        tgt_start
        measure "$r" tgtd "iscsi://127.0.0.1:$TGT_PORT/$TGT_IQN/1" "$TPID"
        tgt_stop ;;
    esac
  done
done
LOAD_AFTER=$(loadavg)

defects=()
[ "$W32" -ge "$W32_FULL" ] || defects+=("defect=the depth-32 phase wrote $W32 × 4 KiB, less than 3× the ${LOG_MIB} MiB log (PERCENT=$PERCENT)")
python3 "$ROOT/bench/results.py" record iscsi-compare "$SAMPLES" "$RESULTS/iscsi-compare-$STAMP.json" \
  "started=$STARTED" "commit=$COMMIT" \
  "command=bench/iscsi-compare.sh $ROUNDS $PERCENT (LOG_MIB=$LOG_MIB)" "rounds=$ROUNDS" \
  "load_before=$LOAD_BEFORE" "load_after=$LOAD_AFTER" \
  "setup=qemu-img bench $(qemu-img --version | head -1 | awk '{print $3}'), tgt $(dpkg-query -W -f='${Version}' tgt 2>/dev/null || echo '?'); per round and peer: 1 GiB sequential prefill (untimed, then written back), $W1 writes at depth 1, $W32 writes at depth 32 ($(python3 -c "print('%.1f' % ($W32*4096/($LOG_MIB<<20)))")× the ${LOG_MIB} MiB log), $R32 reads at depth 32; step $STEP B over a 1 GiB image" \
  "working_set=the whole 1 GiB image for every peer, fully written before the timed work" \
  "cache=warm for every peer (the prefill leaves the image in the page cache; nothing dropped)" \
  "${defects[@]}"
