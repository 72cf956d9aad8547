#!/usr/bin/env bash
# Issue 4: the B+tree and hash table on BOSC beside redb (a conventional B-tree), fjall (an
# LSM tree) and the same hash table over plain read/write, one run.
#
# Each engine runs in its own process inside its own memory cgroup of BUDGET + SLACK (the
# cgroup also bounds the page cache, so it cannot hold the index), on a scratch directory on
# the real disk. Every engine gets BUDGET for what it keeps in memory and makes its writes
# durable every SYNC_EVERY operations (crates/index-bench/src/engines/mod.rs says how). A run:
# untimed sorted bulk load of PRELOAD records (20-byte key + 8-byte value; 28 B x PRELOAD is at
# least 10x BUDGET), random inserts for WINDOW seconds (or OPS), random updates likewise, then
# QUERIES point and QUERIES range queries. Then a second process opens the files again (BOSC
# recovers its queues from its log: the run ended without committing them) under the same
# limit; if that is OOM-killed it is retried under REOPEN_LIMIT and marked.
#
# A timed phase can end with BOSC's queues full of work the others did in the phase. With
# COMMIT_QUEUED=1 (the default) each timed write phase of BOSC ends with a timed commit of
# everything queued (`--commit-queued`), reported beside the rate ("commit s", and the rate
# with the commit paid). The reopen then finds nothing to requeue; COMMIT_QUEUED=0 for the
# crash-case reopen of full queues.
#
# Usage: bench/index-compare.sh            (environment overrides below; ~20 min on 2 cores)
#   BUDGET_MIB=32 SLACK_MIB=64 PRELOAD=12000000 OPS=1000000000 WINDOW=60 SYNC_EVERY=1000
#   QUERIES=2000 RANGE_LEN=100 SEED=1 RUN_KIB=256 BLOCK_BYTES=4096 BTREE_BLOCK_BYTES=8192
#   LOG_PARTS=1 COMMIT_QUEUED=1 ENGINES="bosc-btree redb fjall bosc-hash plain-hash"
#   DROP_CACHES=0 (1: drop the page cache before each reopen; root)
#   TORN_GUARD= (shadow | double-write: how the BOSC engines guard against torn writes;
#   unset: the build's default, shadow extents since 2026-11-29)
#   INDEX_BENCH_BIN=<path> (a build of mariner-index-bench to run instead of building this one)
#   SCRATCH=/var/tmp/mariner-index-bench IN_MEMCG=<checkout>/../shared/tools/in-memcg
#   LIMIT_MIB_fjall=256 (per-engine cgroup limit, '-' as '_': for an engine that cannot run at
#   BUDGET + SLACK at all; the table marks it)
# Results: target/index-bench/<time>/ (one JSON line per process, in-memcg's peak per run), the
# table on stdout, and bench/results/index-compare-<time>.json (all of it in one file, for
# bench/render.py, which writes the tables of docs/benchmarks.md).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IN_MEMCG=${IN_MEMCG:-$ROOT/../shared/tools/in-memcg}
BUDGET_MIB=${BUDGET_MIB:-32}
# The slack covers code, stacks, allocator overhead and what an engine allocates beyond its
# knobs (fjall peaked at 86 MiB RSS with a 32 MiB budget), and leaves the page cache a fifth
# of the index at most.
SLACK_MIB=${SLACK_MIB:-64}
PRELOAD=${PRELOAD:-12000000}
# The window decides how long a phase runs; OPS only caps it. The hash tables pack a key into a
# u64 (24 bits of insert timestamp), so they stop at 2^23 - 1 operations per phase.
OPS=${OPS:-1000000000}
HASH_MAX_OPS=8388607
WINDOW=${WINDOW:-60}
SYNC_EVERY=${SYNC_EVERY:-1000}
QUERIES=${QUERIES:-2000}
RANGE_LEN=${RANGE_LEN:-100}
SEED=${SEED:-1}
# BOSC's longest commit run: 256 KiB, the seed's I/O unit of the hash table experiment.
RUN_KIB=${RUN_KIB:-256}
# Pages of the hash tables (BOSC's and the plain one), and leaves of the B+tree on BOSC: a
# leaf of 8 KiB holds twice the records, so the tree's in-memory internal nodes (which share
# the budget with the queues) are half as large (the seed's leaves were 64 KB, §3.4.1).
BLOCK_BYTES=${BLOCK_BYTES:-4096}
BTREE_BLOCK_BYTES=${BTREE_BLOCK_BYTES:-8192}
# Parts each B+tree batch is logged in (BPlusTree::set_log_parts); 1 = one log write a batch.
LOG_PARTS=${LOG_PARTS:-1}
COMMIT_QUEUED=${COMMIT_QUEUED:-1}
ENGINES=${ENGINES:-"bosc-btree redb fjall bosc-hash plain-hash"}
SCRATCH=${SCRATCH:-/var/tmp/mariner-index-bench}
# 1: the page cache is dropped before each reopen (issue 18's reopen target; needs root).
DROP_CACHES=${DROP_CACHES:-0}
REOPEN_LIMIT=${REOPEN_LIMIT:-1G}
LIMIT_MIB=$((BUDGET_MIB + SLACK_MIB))

case ${1:-} in -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;; esac
[ -x "$IN_MEMCG" ] || {
  echo "in-memcg not found at $IN_MEMCG (set IN_MEMCG=/path/to/shared/tools/in-memcg)" >&2
  exit 2
}
mkdir -p "$SCRATCH"
# The mount's own type: `stat -f` names ext4 "ext2/ext3" (one magic number for the three).
fstype=$(findmnt -no FSTYPE -T "$SCRATCH" 2>/dev/null || stat -f -c %T "$SCRATCH")
case $fstype in
  tmpfs|ramfs) echo "SCRATCH=$SCRATCH is on $fstype; use a directory on the real disk" >&2; exit 2 ;;
esac
raw=$((PRELOAD * 28)); need=$((BUDGET_MIB * 10 * 1024 * 1024))
[ "$raw" -ge "$need" ] || echo "warning: PRELOAD x 28 B = $raw B is below 10x the budget ($need B)" >&2

# INDEX_BENCH_BIN: run that build of the benchmark instead (an A/B of two commits).
if [ -n "${INDEX_BENCH_BIN:-}" ]; then
  BIN=$INDEX_BENCH_BIN
else
  (cd "$ROOT" && cargo build --release -q -p mariner-index-bench)
  BIN=$ROOT/target/release/mariner-index-bench
fi
OUT=$ROOT/target/index-bench/$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
echo "budget ${BUDGET_MIB} MiB, cgroup limit ${LIMIT_MIB} MiB, preload $PRELOAD, window ${WINDOW}s (ops <= $OPS)," \
     "durable every $SYNC_EVERY, $QUERIES queries, BOSC run $RUN_KIB KiB, blocks $BLOCK_BYTES B (B+tree $BTREE_BLOCK_BYTES B," \
     "$LOG_PARTS log parts), commit queued $COMMIT_QUEUED, scratch $SCRATCH ($fstype)," \
     "load $(cut -d' ' -f1-3 /proc/loadavg)" |
  tee "$OUT/params.txt"

for e in $ENGINES; do
  override=LIMIT_MIB_${e//-/_}
  limit=${!override:-$LIMIT_MIB}
  [ "$limit" = "$LIMIT_MIB" ] || echo "$limit" >"$OUT/$e.limit"
  dir=$SCRATCH/$e
  rm -rf "$dir"; mkdir -p "$dir"
  ops=$OPS
  case $e in *hash) [ "$ops" -le $HASH_MAX_OPS ] || ops=$HASH_MAX_OPS ;; esac
  block=$BLOCK_BYTES; extra=()
  [ "$e" = bosc-btree ] && { block=$BTREE_BLOCK_BYTES; extra=(--log-parts "$LOG_PARTS"); }
  [ "$COMMIT_QUEUED" = 1 ] && extra+=(--commit-queued)
  case $e in bosc-*) [ -z "${TORN_GUARD:-}" ] || extra+=(--torn-guard "$TORN_GUARD") ;; esac
  max_run=$((RUN_KIB * 1024 / block)); [ $max_run -ge 1 ] || max_run=1
  args=(--engine "$e" --dir "$dir" --budget "${BUDGET_MIB}MiB" --preload-entries "$PRELOAD"
        --ops "$ops" --window-secs "$WINDOW" --sync-every "$SYNC_EVERY" --queries "$QUERIES"
        --range-len "$RANGE_LEN" --seed "$SEED" --block-bytes "$block" --max-run "$max_run" "${extra[@]}")
  echo "+ $IN_MEMCG ${limit}M $BIN ${args[*]}" | tee -a "$OUT/commands.txt"
  rc=0
  "$IN_MEMCG" "${limit}M" "$BIN" "${args[@]}" >"$OUT/$e.json" 2>"$OUT/$e.err" || rc=$?
  [ $rc = 0 ] || echo "  $e: run failed (exit $rc; 137 = OOM-killed): $(tail -2 "$OUT/$e.err" | tr '\n' ' ')"
  if [ $rc = 0 ]; then
    if [ "$DROP_CACHES" = 1 ]; then
      sync; echo 3 >/proc/sys/vm/drop_caches || { echo "DROP_CACHES=1 needs root" >&2; exit 2; }
      echo "+ sync; echo 3 > /proc/sys/vm/drop_caches" >>"$OUT/commands.txt"
    fi
    echo "+ $IN_MEMCG ${limit}M $BIN ${args[*]} --reopen-only" | tee -a "$OUT/commands.txt"
    rc=0
    "$IN_MEMCG" "${limit}M" "$BIN" "${args[@]}" --reopen-only >"$OUT/$e.reopen.json" \
      2>"$OUT/$e.reopen.err" || rc=$?
    if [ $rc = 137 ]; then
      echo "  $e: reopen OOM-killed at ${limit} MiB; again under $REOPEN_LIMIT" | tee -a "$OUT/commands.txt"
      echo "$REOPEN_LIMIT" >"$OUT/$e.reopen.limit"
      rc=0
      "$IN_MEMCG" "$REOPEN_LIMIT" "$BIN" "${args[@]}" --reopen-only >"$OUT/$e.reopen.json" \
        2>"$OUT/$e.reopen.err" || rc=$?
    fi
    [ $rc = 0 ] || echo "  $e: reopen failed (exit $rc): $(tail -2 "$OUT/$e.reopen.err" | tr '\n' ' ')"
  fi
  rm -rf "$dir"
done

python3 - "$OUT" $ENGINES <<'EOF'
import json, os, re, sys
out, engines = sys.argv[1], sys.argv[2:]
def load(path):
    try:
        with open(path) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except Exception:
        return None
def cg_peak(path):
    try:
        m = re.search(r"in-memcg: peak (\S+) of limit", open(path).read())
        return m.group(1) if m else "?"
    except OSError:
        return "?"
def committed(p):
    if p.get("commit_s") is None:
        return "-"
    return f'{p["commit_s"]:.2f} ({p["queued_blocks"]} blocks; {p["ops_per_s_committed"]:.0f} ops/s with it)'
rows, res = [], {}
for e in engines:
    r = load(f"{out}/{e}.json"); o = load(f"{out}/{e}.reopen.json")
    res[e] = r
    if r is None:
        rows.append([e, "failed"] + [""] * 11); continue
    rng = r.get("range")
    reopen = "-"
    if o:
        n = o["notes"].get("pending_requeued")
        reopen = f'{o["reopen_s"]:.2f}' + (f" ({n} requeued)" if n is not None else "")
        if os.path.exists(f"{out}/{e}.reopen.limit"):
            reopen += f' [OOM at the limit; {open(f"{out}/{e}.reopen.limit").read().strip()}, cgroup peak {cg_peak(f"{out}/{e}.reopen.err")}]'
    rows.append([
        e,
        f'{r["bulk_load_s"]:.1f}',
        f'{r["index_disk_bytes"]/2**20:.0f} ({r["index_disk_bytes"]/r["budget_bytes"]:.1f}x)',
        f'{r["insert"]["ops_per_s"]:.0f}',
        committed(r["insert"]),
        f'{r["update"]["ops_per_s"]:.0f}',
        committed(r["update"]),
        f'{r["point"]["p50_us"]:.0f} / {r["point"]["p99_us"]:.0f}',
        f'{rng["p50_us"]:.0f} / {rng["p99_us"]:.0f}' if rng else "-",
        f'{r["peak_rss_bytes"]/2**20:.0f}',
        cg_peak(f"{out}/{e}.err") + (f' [limit {open(f"{out}/{e}.limit").read().strip()} MiB]'
                                     if os.path.exists(f"{out}/{e}.limit") else ""),
        reopen,
    ])
hdr = ["engine", "bulk load s", "index MiB (x budget)", "insert ops/s", "insert: commit s",
       "update ops/s", "update: commit s",
       "point p50/p99 us", "range p50/p99 us", "peak RSS MiB", "cgroup peak", "reopen s"]
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for row in rows:
    print("| " + " | ".join(row) + " |")
def ratio(a, b, phase):
    if res.get(a) and res.get(b):
        x, y = res[a][phase]["ops_per_s"], res[b][phase]["ops_per_s"]
        return f"{x / y:.2f}x" if y else "inf"
    return "n/a"
print()
for a, b in [("bosc-btree", "redb"), ("bosc-btree", "fjall"), ("bosc-hash", "plain-hash")]:
    print(f"{a} / {b}: inserts {ratio(a, b, 'insert')}, updates {ratio(a, b, 'update')}")
if res.get("bosc-btree") and res.get("fjall"):
    b, f = res["bosc-btree"]["point"], res["fjall"]["point"]
    print(f"point query bosc-btree / fjall: p50 {b['p50_us'] / f['p50_us']:.2f}x, p99 {b['p99_us'] / f['p99_us']:.2f}x (lower is faster)")
EOF
mkdir -p "$ROOT/bench/results"
python3 - "$OUT" "$ROOT/bench/results/index-compare-$(basename "$OUT").json" $ENGINES <<'EOF'
import json, sys
out, dest, engines = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(path):
    try:
        with open(path) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except Exception:
        return None
doc = {"script": "index-compare", "run": out.rsplit("/", 1)[-1],
       "params": open(f"{out}/params.txt").read().strip(),
       "commands": open(f"{out}/commands.txt").read().strip().splitlines(),
       "engines": {e: {"run": load(f"{out}/{e}.json"), "reopen": load(f"{out}/{e}.reopen.json")}
                   for e in engines}}
with open(dest, "w") as f:
    json.dump(doc, f, indent=1)
print("result file", dest)
EOF
echo "results in $OUT"
