#!/usr/bin/env bash
# crash-soak.sh [N]: build release and run the kill -9 crash test (crates/mariner/tests/crash.rs)
# for N kill cycles in total (default 500), split over its variants (one and two log devices),
# which run in parallel. Prints each cycle as it happens, then one summary line:
#   crash-soak: PASS|FAIL cycles=N failures=F duration=Ss log=FILE
# Set MARINER_CRASH_SEED to repeat the random choices of a run (the interleaving still varies).
set -euo pipefail
n=${1:-500}
case $n in '' | *[!0-9]*) echo "usage: $0 [CYCLES]" >&2; exit 2 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log=${MARINER_SOAK_LOG:-$root/target/crash-soak.log}
mkdir -p "$(dirname "$log")"
start=$(date +%s)
echo "crash-soak: building (cargo test --release -p mariner --test crash --no-run)"
cargo test --release -p mariner --test crash --no-run
echo "crash-soak: $n kill cycles; full output in $log"
set +e
MARINER_CRASH_CYCLES=$n cargo test --release -p mariner --test crash -- \
  --nocapture kill_cycles 2>&1 | tee "$log" | grep --line-buffered -E 'cycle [0-9]+/[0-9]+: killed|PASS|panicked|violation|test result'
rc=${PIPESTATUS[0]}
set -e
duration=$(($(date +%s) - start))
done_cycles=$(grep -cE 'cycle [0-9]+/[0-9]+: in-flight writes visible' "$log" || true)
failures=$(grep -cE "^test kill_cycles_[a-z_]+ \.\.\. FAILED" "$log" || true)
verdict=PASS
[ "$rc" -eq 0 ] && [ "$failures" -eq 0 ] || verdict=FAIL
echo "crash-soak: $verdict cycles=$done_cycles/$n failures=$failures duration=${duration}s log=$log"
[ "$verdict" = PASS ]
