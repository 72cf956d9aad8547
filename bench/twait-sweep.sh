#!/usr/bin/env bash
# T_wait sweep (mariner-paper.md §7.2 Table 1 on this machine): 4 KiB random writes over NBD at
# depth 1 and 32 for each T_wait, with and without dispatch-on-idle, rounds interleaved; prints
# median IOPS and mean latency per setting. Usage: bench/twait-sweep.sh [ROUNDS] [SECONDS]
. "$(dirname "$0")/lib.sh"
ROUNDS=${1:-3}; SECS=${2:-5}
build_release
declare -A res
settings="0:true 25:true 50:true 100:true 200:true 50:false 100:false 200:false 400:false"
for r in $(seq 1 "$ROUNDS"); do
  for s in $settings; do
    tw=${s%%:*}; idle=${s##*:}
    dir=$SCRATCH/twait; mkdir -p "$dir"
    cat > "$dir.toml" <<TOML
[log]
t_wait_us = $tw
dispatch_on_idle = $idle
[volume]
default_size = "1GiB"
TOML
    start_mariner "$dir" --config "$dir.toml"
    for depth in 1 32; do
      out=$(fio_nbd "$MURL" randwrite 4k $depth "$SECS")
      res["$s:$depth"]+="$out;"
    done
    stop_mariner
  done
done
printf '%-8s %-6s %10s %12s %10s %12s\n' t_wait idle qd1_iops qd1_mean_us qd32_iops qd32_mean_us
for s in $settings; do
  line=()
  for depth in 1 32; do
    iops=$(echo "${res[$s:$depth]}" | tr ';' '\n' | awk 'NF{print $1}' | median)
    lat=$(echo "${res[$s:$depth]}" | tr ';' '\n' | awk 'NF{print $2}' | median)
    line+=("$iops" "$lat")
  done
  printf '%-8s %-6s %10s %12s %10s %12s\n' "${s%%:*}" "${s##*:}" "${line[@]}"
done
