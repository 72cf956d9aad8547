#!/usr/bin/env bash
# The README's first command, as a newcomer runs it: from a fresh clone of this repository,
# `cargo run --release -- serve` at the clone's root must build, create ./mariner-data with the
# default volume and serve it on the documented addresses. Checked with real clients (nbdinfo,
# qemu-io over NBD, iscsi-inq over iSCSI), then stopped with Ctrl-C (SIGINT), which must exit 0.
#
# The clone builds into this checkout's target directory (CARGO_TARGET_DIR) so dependencies
# are not compiled twice, and lives under it (target/readme-clone); the command itself is the
# README's, unchanged, run in the clone.
# The clone is removed on exit: its build leaves this checkout's crates fingerprinted against
# the clone's source files, so while those exist cargo takes the artifacts for fresh and a
# build here ignores edits made since (a benchmark after the test suite ran the clone's binary
# of the tested commit, not the working tree's; 2026-12-03). With them gone, the next build
# here recompiles the workspace's crates from this checkout.
# Needs the README's default ports 10809 and 3260 free on 127.0.0.1. Bounded: the build is
# timed by cargo, the start-up wait by a 120 s limit.
# Usage: scripts/readme-check.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
scratch="$repo/target/readme-clone"
rm -rf "$scratch"
mkdir -p "$scratch"
server=""
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then kill -9 -- "-$server" 2>/dev/null || true; fi
  rm -rf "$scratch/mariner"
}
trap cleanup EXIT
fail() { echo "readme-check: $*" >&2; [ -f "$scratch/serve.log" ] && tail -20 "$scratch/serve.log" >&2; exit 1; }

for port in 10809 3260; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "port $port on 127.0.0.1 is in use; the README's command needs it"
  fi
done

git clone -q "$repo" "$scratch/mariner"
cd "$scratch/mariner"
# The README's first command, verbatim, in the background (it serves until interrupted).
# setsid: Ctrl-C reaches the whole foreground job (cargo and the server) in a terminal;
# here the job is its own process group and SIGINT goes to that group.
CARGO_TARGET_DIR="$repo/target" setsid cargo run --release -- serve >"$scratch/serve.log" 2>&1 &
server=$!

deadline=$((SECONDS + 600))   # the build comes first; the clone shares the build cache
until [ -f mariner-data/ports.json ]; do
  kill -0 "$server" 2>/dev/null || fail "the server exited before serving"
  [ $SECONDS -lt $deadline ] || fail "no mariner-data/ports.json after 600 s"
  sleep 0.5
done

out=$(nbdinfo nbd://127.0.0.1:10809) || fail "nbdinfo failed"
grep -q "export-size: 1073741824" <<<"$out" || fail "default volume is not 1 GiB: $out"
qemu-io -f raw -c "write -P 0x5a 4096 64k" nbd://127.0.0.1:10809/vol0 >/dev/null \
  || fail "qemu-io write over NBD failed"
qemu-io -r -f raw -c "read -P 0x5a 4096 64k" "iscsi://127.0.0.1:3260/iqn.2026-11.dev.mariner:vol0/0" \
  >"$scratch/read.out" 2>&1 || fail "qemu-io read over iSCSI failed: $(cat "$scratch/read.out")"
if grep -qi "fail" "$scratch/read.out"; then fail "pattern mismatch: $(cat "$scratch/read.out")"; fi
iscsi-inq iscsi://127.0.0.1:3260/iqn.2026-11.dev.mariner:vol0/0 >/dev/null || fail "iscsi-inq failed"

# Ctrl-C: SIGINT to the job's process group; the server must shut down cleanly (exit 0).
kill -INT -- "-$server"
status=0
for _ in $(seq 1 600); do
  kill -0 "$server" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$server" 2>/dev/null && fail "the server did not stop within 60 s of SIGINT"
wait "$server" || status=$?
server=""
# cargo run exits with the program's status; a signal-killed child would be 130.
[ "$status" -eq 0 ] || fail "cargo run -- serve exited with $status after SIGINT"
[ -f mariner-data/mariner.json ] || fail "no mariner-data/mariner.json in the clone"
[ -f target/release/mariner ] && fail "the clone built into its own target/ (expected the shared one)"
echo "readme-check: the README's first command works from a fresh clone"
