#!/usr/bin/env bash
# The B+tree's reopen with its router image against the full scan of the leaves (issue 17 M1),
# each with the data file evicted from the page cache first (posix_fadvise DONTNEED; no root
# needed, unlike drop_caches); then, on two copies of the same files, INSERTS random inserts
# after each kind of reopen (leaves known from an image are read at their first put).
# Usage: bench/router-reopen.sh [DIR] [MIB] [UPDATES] [INSERTS]
set -euo pipefail
DIR=${1:-$(mktemp -d)}
MIB=${2:-400}
UPDATES=${3:-300000}
INSERTS=${4:-100000}
mkdir -p "$DIR"
BIN=target/release/examples/router_reopen
cargo build --release -p mariner-bosc --example router_reopen
evict() {
  python3 - "$1" <<'PY'
import os, sys
for name in ("data", "log", "router"):
    p = os.path.join(sys.argv[1], name)
    if os.path.exists(p):
        fd = os.open(p, os.O_RDONLY)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
PY
}
echo "+ $BIN build $DIR $MIB $UPDATES"
"$BIN" build "$DIR" "$MIB" "$UPDATES"
rm -rf "$DIR.copy" && cp -a "$DIR" "$DIR.copy"
for mode in scan image scan image; do
  evict "$DIR"
  echo "+ $BIN reopen $DIR $mode  (files evicted)"
  "$BIN" reopen "$DIR" "$mode"
done
du -h "$DIR"/data "$DIR"/router
evict "$DIR"
echo "+ $BIN reopen $DIR image $INSERTS  (files evicted)"
"$BIN" reopen "$DIR" image "$INSERTS"
evict "$DIR.copy"
echo "+ $BIN reopen $DIR.copy scan $INSERTS  (files evicted; the copy made after the build)"
"$BIN" reopen "$DIR.copy" scan "$INSERTS"
rm -rf "$DIR.copy"
