#!/usr/bin/env bash
# Which makes a log write durable faster here: buffered write + fdatasync (default) or one
# O_DIRECT|O_DSYNC write (--direct-io)? 4 KiB random writes over NBD at depth 1 and 32,
# rounds interleaved, medians. Usage: bench/sync-mode.sh [ROUNDS] [SECONDS]
. "$(dirname "$0")/lib.sh"
ROUNDS=${1:-5}; SECS=${2:-5}
build_release
declare -A res
for r in $(seq 1 "$ROUNDS"); do
  for mode in fdatasync direct; do
    args=(); [ $mode = direct ] && args=(--direct-io)
    start_mariner "$SCRATCH/sync" "${args[@]}"
    for d in 1 32; do res["$mode:$d"]+="$(fio_nbd "$MURL" randwrite 4k $d "$SECS");"; done
    stop_mariner
  done
done
printf '%-10s %10s %12s %10s %12s\n' mode qd1_iops qd1_mean_us qd32_iops qd32_mean_us
for mode in fdatasync direct; do
  row=()
  for d in 1 32; do
    row+=("$(echo "${res[$mode:$d]}" | tr ';' '\n' | awk 'NF{print $1}' | median)")
    row+=("$(echo "${res[$mode:$d]}" | tr ';' '\n' | awk 'NF{print $2}' | median)")
  done
  printf '%-10s %10s %12s %10s %12s\n' $mode "${row[@]}"
done
