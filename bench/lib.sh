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
  for _ in $(seq 1 600); do
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
