#!/usr/bin/env bash
# Runs libiscsi's conformance suite (iscsi-test-cu -d -v, SCSI and iSCSI families) against the
# real `mariner serve` on a small volume, counts real passes apart from skips (iscsi-test-cu
# counts "[SKIPPED] ... not implemented" as passed) and fails when a test listed as passing in
# tests/iscsi-baseline.txt no longer passes. Two more runs: SCSI.MultipathIO over two sessions
# to the same volume (its verdicts are named mp:SCSI/...) and SCSI.ReadOnly against a second
# volume set read-only with `mariner volume set` (ro:SCSI/...). And SCSI.GetLBAStatus.UnmapSingle
# against a volume of 4096-byte blocks (4k:SCSI/...): libiscsi's test is only right when a
# physical block holds one logical block (see below), and 512-byte volumes report 4096-byte
# physical blocks.
#
# Usage: scripts/iscsi-conformance.sh [--update-baseline]
#   MARINER_BIN   the binary to test [default: target/release/mariner, built if absent]
#   KEEP_LOGS=1   keep the scratch directory with the run logs
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=tests/iscsi-baseline.txt
update=0; [ "${1:-}" = "--update-baseline" ] && update=1
command -v iscsi-test-cu >/dev/null || { echo "iscsi-test-cu missing (Debian libiscsi-bin)" >&2; exit 1; }
bin=${MARINER_BIN:-target/release/mariner}
[ -x "$bin" ] || cargo build --release -p mariner

work=$(mktemp -d "${TMPDIR:-/tmp}/mariner-cu.XXXXXX")
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

"$bin" serve --data "$work/data" --listen 127.0.0.1:0 --iscsi-listen 127.0.0.1:0 \
  --log-size 64MiB --default-volume-size 64MiB 2>"$work/serve.log" &
pid=$!
for _ in $(seq 1 300); do
  [ -s "$work/data/ports.json" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.1
done
portal=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["iscsi"][0])' "$work/data/ports.json")
url="iscsi://$portal/iqn.2026-11.dev.mariner:vol0/0"
# A small volume for SCSI.ReadOnly, made read-only over the admin socket in the data directory.
"$bin" volume create ro --size 16MiB --data "$work/data" >/dev/null
"$bin" volume set ro --read-only true --data "$work/data" >/dev/null
ro_url="iscsi://$portal/iqn.2026-11.dev.mariner:ro/0"
"$bin" volume create blk4k --size 16MiB --block-size 4096 --data "$work/data" >/dev/null
url4k="iscsi://$portal/iqn.2026-11.dev.mariner:blk4k/0"
echo "testing $url (and $ro_url, read-only)"

# iscsi-test-cu exits non-zero when a test fails; the verdicts come from the logs.
cu() { local log=$1; shift; timeout 900 iscsi-test-cu -d -v "$@" >"$work/$log" 2>&1 || true; }
for family in SCSI iSCSI; do
  cu "$family.log" -t "$family" "$url"
done
# libiscsi 1.19.0 cannot run iSCSI.iSCSITMF.LUNResetSimpleAsync meaningfully in the family run:
# AbortTaskSimpleAsync, before it in the same suite, logs out and clears sd->iscsi_ctx, so it
# returns at once through CU_PASS("[SKIPPED] Non-iSCSI") without printing anything; run alone,
# it asserts reconnect_succeeded == 1 right after queueing the TMF, before the callback that
# sets it can have run (test_async_lu_reset_simple.c:157; upstream moved the assert into the
# callback, commit 5553d6b, libiscsi 1.20.0). Run twice in one process, the first instance
# fails on that assert and its callback sets the flag during logout; the second, in a fresh
# session, then tests the target: WRITE then LUN RESET, the reset answered "function complete"
# within 5 s and the write not cancelled. Its verdict is the test's.
lu_reset=iSCSI.iSCSITMF.LUNResetSimpleAsync
cu iSCSI-lu-reset.log -t "$lu_reset,$lu_reset" "$url"
# Two URLs for the same volume: two sessions (initiator names 1 and 2), the multipath tests.
cu mp.log -t SCSI.MultipathIO "$url" "$url"
cu ro.log -t SCSI.ReadOnly "$ro_url"
# GetLBAStatus.UnmapSingle's second loop unmaps LBAs [0, i) (i a multiple of the logical blocks
# per physical block, lbppb), asks GET LBA STATUS for LBA i+1 and requires the first
# descriptor to start at i+lbppb (test_get_lba_status_unmap_single.c:120-134, unchanged in
# libiscsi master), while SBC-3 makes the first descriptor the one holding the requested LBA:
# no correct target passes it when lbppb > 1. On 512-byte volumes (lbppb 8) it fails and is
# counted failed; it runs again where lbppb is 1.
cu 4k.log -t SCSI.GetLBAStatus.UnmapSingle "$url4k"
# The raw counts of ../shared/tools/cu-summary, for comparison with the counting below.
cu_summary=${CU_SUMMARY:-../shared/tools/cu-summary}
if [ -x "$cu_summary" ]; then
  for log in SCSI iSCSI mp ro 4k; do echo "cu-summary $log.log: $("$cu_summary" "$work/$log.log" | tail -1)"; done
fi

# The counting rules of ../shared/tools/cu-summary: a test whose output holds [FAILED] failed,
# one that printed [SKIPPED] was skipped, one that ended in "passed" passed, anything else
# (a crash, a hang cut off) failed. A test's output ends at CUnit's verdict, "passed" or
# "FAILED" at the start of a line (or right after "Test: NAME ..."): what follows, even on the
# same line, is the suite's cleanup (e.g. clear_pr, which the unit attention a LUN reset test
# leaves makes log "[FAILED] PRIN") or the run summary, and belongs to no test.
python3 - "$work" "$baseline" "$update" <<'PY'
import re, sys
work, baseline, update = sys.argv[1], sys.argv[2], sys.argv[3] == "1"

# Tests whose passing path logs "[FAILED]": iSCSIDataSnInvalid sends WRITE(10)s with a DataSN
# out of sequence through write10(..., EXPECT_STATUS_GOOD) and asserts they fail
# (CU_ASSERT_NOT_EQUAL(ret, 0)), so check_result() prints "[FAILED] WRITE10 command failed" for
# every write a correct target refuses. CUnit's verdict (its assertions) decides.
CUNIT_VERDICT = {"iSCSIdatasn.iSCSIDataSnInvalid"}

def verdict_of(line):
    m = re.match(r"(passed|FAILED)", line)
    return m.group(1) if m else None

def parse(text):
    results, suite, current, buf, cunit = [], "?", None, [], None
    def close():
        if current is None:
            return
        body = "\n".join(buf)
        name = f"{suite}.{current}"
        if cunit != "passed":
            verdict = "failed"
        elif name in CUNIT_VERDICT:
            # A skip (which CUnit also reports "passed") stays a skip: the rule only excuses
            # the [FAILED] lines of refused commands.
            verdict = "skipped" if "[SKIPPED]" in body else "passed"
        elif "[FAILED]" in body:
            verdict = "failed"
        elif "[SKIPPED]" in body:
            verdict = "skipped"
        else:
            verdict = "passed"
        results.append((name, verdict))
    for line in text.splitlines():
        m = re.match(r"^Suite: (\S+)", line)
        if m:
            close(); current, buf = None, []; suite = m.group(1); continue
        m = re.match(r"^\s+Test: (\S+) \.\.\.(.*)$", line)
        if m:
            close(); current, cunit = m.group(1), verdict_of(m.group(2))
            buf = [] if cunit else [m.group(2)]
            continue
        if current is not None and cunit is None:
            cunit = verdict_of(line)
            if cunit is None:
                buf.append(line)
    close()
    return results

def run(log, prefix, family):
    results = parse(open(f"{work}/{log}", errors="replace").read())
    return [(f"{prefix}{family}/{name}", v) for name, v in results]

runs = {
    "SCSI": run("SCSI.log", "", "SCSI"),
    "iSCSI": run("iSCSI.log", "", "iSCSI"),
    "multipath SCSI.MultipathIO": run("mp.log", "mp:", "SCSI"),
    "read-only SCSI.ReadOnly": run("ro.log", "ro:", "SCSI"),
    "4 KiB blocks SCSI.GetLBAStatus.UnmapSingle": run("4k.log", "4k:", "SCSI"),
}
# The second instance of LUNResetSimpleAsync stands for the family run's (see the script).
LU_RESET = "iSCSI/iSCSITMF.LUNResetSimpleAsync"
instances = [v for n, v in run("iSCSI-lu-reset.log", "", "iSCSI") if n == LU_RESET]
lu_verdict = instances[1] if len(instances) == 2 else "failed"
runs["iSCSI"] = [(n, lu_verdict if n == LU_RESET else v) for n, v in runs["iSCSI"]]

verdicts = {}
totals = {"passed": 0, "skipped": 0, "failed": 0}
for label, results in runs.items():
    counts = {v: sum(1 for _, x in results if x == v) for v in ("passed", "skipped", "failed")}
    print(f"{label}: passed={counts['passed']} skipped={counts['skipped']} "
          f"failed={counts['failed']} total={len(results)}")
    for k in totals:
        totals[k] += counts[k]
    for name, v in results:
        verdicts[name] = v
        if v == "failed":
            print(f"  failed {name}")
print(f"all: passed={totals['passed']} skipped={totals['skipped']} failed={totals['failed']}")

passing = sorted(n for n, v in verdicts.items() if v == "passed")
if update:
    with open(baseline, "w") as f:
        f.write("# Tests that pass against mariner serve (scripts/iscsi-conformance.sh).\n")
        f.write("# Regenerate with --update-baseline after an improvement; never to hide a loss.\n")
        f.writelines(n + "\n" for n in passing)
    print(f"wrote {len(passing)} passing tests to {baseline}")
    sys.exit(0)
expected = [l.strip() for l in open(baseline) if l.strip() and not l.startswith("#")]
regressed = [n for n in expected if verdicts.get(n) != "passed"]
for n in regressed:
    print(f"REGRESSED {n}: {verdicts.get(n, 'not run')}")
new = [n for n in passing if n not in set(expected)]
if new:
    print(f"{len(new)} test(s) pass that the baseline does not list; run with --update-baseline")
if regressed:
    sys.exit(1)
print(f"no regressions against {len(expected)} baseline passes")
PY
