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
# Workloads, 4 KiB: writes at depth 1 and 32, reads at depth 32 over prefilled data. qemu-img
# bench walks offsets by a fixed step modulo the image size; a step of 7919 blocks (prime,
# coprime with the image's 2^18 blocks) scatters consecutive requests across the whole image.
# Usage: bench/iscsi-compare.sh [ROUNDS] [PERCENT]   (PERCENT scales the request counts, 100)
. "$(dirname "$0")/lib.sh"
ROUNDS=${1:-5}; PERCENT=${2:-100}
for t in qemu-img tgtd tgtadm; do
  command -v "$t" >/dev/null || { echo "$t missing (apt-get install qemu-utils qemu-block-extra tgt)" >&2; exit 1; }
done
build_release
mkdir -p "$SCRATCH"
SIZE=$((1 << 30)); STEP=$((4096 * 7919))
W1=$((3000 * PERCENT / 100)); W32=$((40000 * PERCENT / 100)); R32=$((60000 * PERCENT / 100))
TGT_PORT=${TGT_PORT:-3261}; TGT_CTL=${TGT_CTL:-7391}
TGT_IQN=iqn.2026-11.dev.mariner.bench:tgt
declare -A res
TPID=""
cleanup() {
  if [ -n "$TPID" ]; then kill -9 "$TPID" 2>/dev/null || true; wait "$TPID" 2>/dev/null || true; fi
  if [ -n "${MPID:-}" ]; then stop_mariner; fi
}
trap cleanup EXIT

# bench URL COUNT DEPTH [-w]: prints the seconds qemu-img took for COUNT requests.
bench() {
  local url=$1 count=$2 depth=$3; shift 3
  qemu-img bench -f raw -c "$count" -d "$depth" -s 4096 -S "$STEP" "$@" "$url" 2>&1 |
    sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p'
}

# cpu_ticks PID: user + system clock ticks the server process used so far (all threads).
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

# measure PEER URL PID: one round of the three workloads; results as "iops latency_us", and for
# depth-32 writes also the server's CPU time per write (µs, write-back included).
measure() {
  local peer=$1 url=$2 pid=$3 secs c0 c1 hz
  hz=$(getconf CLK_TCK)
  secs=$(bench "$url" "$W1" 1 -w --pattern=0x5a)
  res["$peer:write:1"]+="$(python3 -c "print('%.0f %.1f' % ($W1/$secs, $secs/$W1*1e6))");"
  settle "$pid"; c0=$(cpu_ticks "$pid")
  secs=$(bench "$url" "$W32" 32 -w --pattern=0xa5)
  settle "$pid"; c1=$(cpu_ticks "$pid")
  res["$peer:write:32"]+="$(python3 -c "print('%.0f %.1f' % ($W32/$secs, $secs/$W32*32e6))");"
  res["$peer:cpu:32"]+="$(python3 -c "print('%.1f' % (($c1-$c0)/$hz/$W32*1e6))");"
  # Prefill the whole image so reads find data everywhere (1 MiB sequential writes).
  qemu-img bench -f raw -c $((SIZE >> 20)) -d 8 -s 1M -w --pattern=0x33 "$url" >/dev/null 2>&1
  # Reads start once the server is idle: Mariner writes the prefill back to its image after
  # the writers pause (tgtd wrote it synchronously), and timing reads during that write-back
  # would measure the prefill (it halved Mariner's read rate).
  settle "$pid"
  secs=$(bench "$url" "$R32" 32)
  res["$peer:read:32"]+="$(python3 -c "print('%.0f %.1f' % ($R32/$secs, $secs/$R32*32e6))");"
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

for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  for peer in mariner-iscsi mariner-nbd; do
    start_mariner "$SCRATCH/m" --iscsi-listen 127.0.0.1:0 --default-volume-size 1GiB
    if [ $peer = mariner-iscsi ]; then
      portal=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['iscsi'][0])" "$SCRATCH/m/data/ports.json")
      measure $peer "iscsi://$portal/iqn.2026-11.dev.mariner:vol0/0" "$MPID"
    else
      measure $peer "$MURL" "$MPID"
    fi
    stop_mariner; MPID=""
  done
  tgt_start
  measure tgtd "iscsi://127.0.0.1:$TGT_PORT/$TGT_IQN/1" "$TPID"
  tgt_stop
done

med() { echo "${res[$1]}" | tr ';' '\n' | awk -v c="$2" 'NF{print $c}' | median; }
printf '%-12s %-14s %10s %12s   %s\n' workload peer iops latency_us "ratios (iops)"
for w in write:1 write:32 read:32; do
  mi=$(med "mariner-iscsi:$w" 1)
  for p in mariner-iscsi mariner-nbd tgtd; do
    i=$(med "$p:$w" 1); l=$(med "$p:$w" 2)
    ratio=$(python3 -c "print('%.2f' % ($mi/$i if $i else 0))")
    printf '%-12s %-14s %10s %12s   iscsi/%s = %s\n' "${w/:/ qd}" $p "$i" "$l" $p "$ratio"
  done
done
for p in mariner-iscsi mariner-nbd tgtd; do
  printf 'server CPU per depth-32 write (write-back included): %-14s %6s µs\n' $p "$(med "$p:cpu:32" 1)"
done
echo "rounds=$ROUNDS counts: write qd1 $W1, write qd32 $W32, read qd32 $R32 (4 KiB, step $STEP B, 1 GiB image)"
