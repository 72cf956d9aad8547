#!/usr/bin/env bash
# The B+tree's reopen with its router image against the full scan of the leaves (issue 17 M1),
# each with the data file evicted from the page cache first (posix_fadvise DONTNEED; no root
# needed, unlike drop_caches). Usage: bench/router-reopen.sh [DIR] [MIB] [UPDATES]
set -euo pipefail
DIR=${1:-$(mktemp -d)}
MIB=${2:-400}
UPDATES=${3:-300000}
mkdir -p "$DIR"
BIN=target/release/examples/router_reopen
cargo build --release -p mariner-bosc --example router_reopen
evict() {
  python3 - "$DIR" <<'PY'
import os, sys
for name in ("data", "router"):
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
for mode in scan image scan image; do
  evict
  echo "+ $BIN reopen $DIR $mode  (data file evicted)"
  "$BIN" reopen "$DIR" "$mode"
done
du -h "$DIR"/data "$DIR"/router
