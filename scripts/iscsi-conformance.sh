#!/usr/bin/env bash
# Runs libiscsi's conformance suite (iscsi-test-cu -d -v, SCSI and iSCSI families) against the
# real `mariner serve` on a small volume, counts real passes apart from skips (iscsi-test-cu
# counts "[SKIPPED] ... not implemented" as passed) and fails when a test listed as passing in
# tests/iscsi-baseline.txt no longer passes.
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
echo "testing $url"

for family in SCSI iSCSI; do
  # iscsi-test-cu exits non-zero when a test fails; the verdicts come from the log.
  timeout 900 iscsi-test-cu -d -v -t "$family" "$url" >"$work/$family.log" 2>&1 || true
done

# The counting rules of ../shared/tools/cu-summary: a test whose output holds [FAILED] failed,
# one that printed [SKIPPED] was skipped, one that ended in "passed" passed, anything else
# (a crash, a hang cut off) failed.
python3 - "$work" "$baseline" "$update" <<'PY'
import re, sys
work, baseline, update = sys.argv[1], sys.argv[2], sys.argv[3] == "1"

def parse(text):
    results, suite, current, buf = [], "?", None, []
    def close():
        if current is None:
            return
        body = "\n".join(buf)
        last = buf[-1] if buf else ""
        if "[FAILED]" in body or re.search(r"\bFAILED\b", last):
            verdict = "failed"
        elif "[SKIPPED]" in body:
            verdict = "skipped"
        elif re.search(r"passed\s*$", body.strip()):
            verdict = "passed"
        else:
            verdict = "failed"
        results.append((f"{suite}.{current}", verdict))
    for line in text.splitlines():
        m = re.match(r"^Suite: (\S+)", line)
        if m:
            close(); current, buf = None, []; suite = m.group(1); continue
        m = re.match(r"^\s+Test: (\S+) \.\.\.(.*)$", line)
        if m:
            close(); current, buf = m.group(1), [m.group(2)]; continue
        if current is not None:
            buf.append(line)
    close()
    return results

verdicts = {}
for family in ("SCSI", "iSCSI"):
    results = parse(open(f"{work}/{family}.log", errors="replace").read())
    counts = {v: sum(1 for _, x in results if x == v) for v in ("passed", "skipped", "failed")}
    print(f"{family}: passed={counts['passed']} skipped={counts['skipped']} "
          f"failed={counts['failed']} total={len(results)}")
    for name, v in results:
        verdicts[f"{family}/{name}"] = v
    for name, v in results:
        if v == "failed":
            print(f"  failed {family}/{name}")

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
