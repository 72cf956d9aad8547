#!/usr/bin/env bash
# Mariner beside its peers on the same disk, one run, rounds interleaved, medians and ratios:
#   mariner  : `mariner serve`, every write durable in the log before its reply
#   nbdkit   : nbdkit file plugin + fua filter (fuamode=force: every write flushed, fdatasync)
#   raw      : fio straight on a file (psync + fdatasync at depth 1; O_DIRECT|O_DSYNC libaio at 32)
# Workloads: 4 KiB random writes at depth 1 and 32, 4 KiB random reads at depth 32.
# Usage: bench/nbd-compare.sh [ROUNDS] [SECONDS]
. "$(dirname "$0")/lib.sh"
ROUNDS=${1:-5}; SECS=${2:-5}
command -v nbdkit >/dev/null || { echo "nbdkit missing (apt-get install nbdkit)" >&2; exit 1; }
build_release
mkdir -p "$SCRATCH"
declare -A res

nbdkit_start() {
  rm -f "$SCRATCH/nbdkit.img"
  dd if=/dev/zero of="$SCRATCH/nbdkit.img" bs=1M count=1024 status=none
  nbdkit --exit-with-parent -f -p 0 --port=10899 --filter=fua file "$SCRATCH/nbdkit.img" fuamode=force &
  NPID=$!
  sleep 0.5
}

raw_fio() { # depth rw -> "iops mean p99"
  local depth=$1 rw=$2 extra
  if [ "$depth" = 1 ]; then extra="--ioengine=psync --fdatasync=1"; else extra="--ioengine=libaio --direct=1 --sync=dsync --iodepth=$depth"; fi
  [ "$rw" = randread ] && extra="--ioengine=libaio --direct=1 --iodepth=$depth"
  fio --name=r --filename="$SCRATCH/raw.img" --size=1G --rw="$rw" --bs=4k $extra \
      --runtime="$SECS" --time_based --output-format=json 2>/dev/null | sed -n '/^{/,$p' | python3 -c '
import json,sys
j=json.load(sys.stdin)["jobs"][0]
d=j["write"] if j["write"]["io_bytes"]>0 else j["read"]
print("%.0f %.1f %.1f" % (d["iops"], d["clat_ns"]["mean"]/1000, d["clat_ns"]["percentile"]["99.000000"]/1000))'
}

prefill() { # url: write the first 1 GiB once so random reads hit data
  fio --name=p --ioengine=nbd --uri="$1" --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
}

dd if=/dev/zero of="$SCRATCH/raw.img" bs=1M count=1024 status=none
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  start_mariner "$SCRATCH/m" --default-volume-size 1GiB
  for w in "randwrite 1" "randwrite 32"; do set -- $w; res["mariner:$1:$2"]+="$(fio_nbd "$MURL" $1 4k $2 "$SECS");"; done
  prefill "$MURL"; res["mariner:randread:32"]+="$(fio_nbd "$MURL" randread 4k 32 "$SECS");"
  stop_mariner
  nbdkit_start
  for w in "randwrite 1" "randwrite 32"; do set -- $w; res["nbdkit:$1:$2"]+="$(fio_nbd nbd://127.0.0.1:10899 $1 4k $2 "$SECS");"; done
  prefill nbd://127.0.0.1:10899; res["nbdkit:randread:32"]+="$(fio_nbd nbd://127.0.0.1:10899 randread 4k 32 "$SECS");"
  kill "$NPID"; wait "$NPID" 2>/dev/null || true
  for w in "randwrite 1" "randwrite 32" "randread 32"; do set -- $w; res["raw:$1:$2"]+="$(raw_fio $2 $1);"; done
done

med() { echo "${res[$1]}" | tr ';' '\n' | awk -v c="$2" 'NF{print $c}' | median; }
printf '%-14s %-8s %10s %10s %10s   %s\n' workload peer iops mean_us p99_us "iops vs mariner"
for w in "randwrite:1" "randwrite:32" "randread:32"; do
  m=$(med "mariner:$w" 1)
  for p in mariner nbdkit raw; do
    i=$(med "$p:$w" 1); l=$(med "$p:$w" 2); q=$(med "$p:$w" 3)
    ratio=$(python3 -c "print('%.2f' % ($m/$i if $i else 0))")
    printf '%-14s %-8s %10s %10s %10s   mariner/%s = %s\n' "${w/:/ qd}" $p $i $l $q $p $ratio
  done
done
