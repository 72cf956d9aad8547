#!/usr/bin/env python3
"""Result files of the comparison benchmarks, and the tables of docs/benchmarks.md made from them.

  results.py record SCRIPT SAMPLES.tsv OUT.json [KEY=VALUE ...]
      Turns a run's samples (one "round peer workload metric value" line each, tab-separated)
      into OUT.json: every sample, the medians, the ratios to the reference peer and the targets'
      verdicts; prints the run's markdown. KEY=VALUE pairs are the run's facts (command, load
      before and after, commit, ...); defect=TEXT (repeatable) marks a run that does not count
      towards its targets.
  results.py show OUT.json            prints one result file's markdown.
  results.py render [DOC.md]          rewrites every block of DOC.md (docs/benchmarks.md) between
      "<!-- generated: SCRIPT -->" and "<!-- end generated -->" from bench/results/SCRIPT-*.json,
      newest first, so no table there is copied by hand.
  results.py check [DOC.md]           fails if rendering would change DOC.md (a generated
      table edited by hand, or a result file not rendered yet).
"""
import glob
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))



def T(label, metric, a, b, op, bound):
    """A target over any peers and workloads: the sum of the medians of the "peer:workload" terms
    in a, divided by the sum of those in b, compared with bound."""
    split = lambda terms: [tuple(t.split(":", 1)) for t in terms]
    return {"label": label, "metric": metric, "a": split(a), "b": split(b), "op": op,
            "bound": bound}


def target(t):
    """A target as T makes it; the short tuple form (label, workload, metric, peer a, peer b, op,
    bound) compares two peers on one workload."""
    if isinstance(t, dict):
        return t
    label, wl, metric, a, b, op, bound = t
    return T(label, metric, [f"{a}:{wl}"], [f"{b}:{wl}"], op, bound)


# Per script: the peers (reference first), the workloads, the columns and the targets. A target
# compares median(metric of a) / median(metric of b) with a bound.
SPECS = {
    "nbd-compare": {
        "peers": {
            "mariner": "Mariner NBD",
            "nbdkit": "nbdkit file + fua",
            "raw": "raw fio",
            "memory": "nbdkit memory",
            "prev": "previous release NBD",
            "mariner-iscsi": "Mariner iSCSI",
            "prev-iscsi": "previous release iSCSI",
        },
        "workloads": {
            "randwrite-qd1": "4 KiB random write, depth 1",
            "randwrite-qd32": "4 KiB random write, depth 32",
            "randread-qd1-warm": "4 KiB random read, depth 1, warm",
            "randread-qd32-warm": "4 KiB random read, depth 32, warm",
            "randread-qd1-cold": "4 KiB random read, depth 1, cache dropped",
            "randread-qd32-cold": "4 KiB random read, depth 32, cache dropped",
            "randwrite-1x32": "4 KiB random write, 1 job × depth 32",
            "randwrite-4x8": "4 KiB random write, 4 jobs × depth 8",
            "randrw7030-qd32": "70/30 random read/write, depth 32, recently written (read latencies)",
            "randread-qd1-alone": "4 KiB random read, depth 1, alone",
            "randread-qd1-beside-writer": "4 KiB random read, depth 1, beside a depth-32 writer",
            "seqwrite-1m-qd8": "1 MiB sequential write, depth 8",
            "seqread-1m-qd8": "1 MiB sequential read, depth 8",
            "nbdcopy-write-c1": "nbdcopy onto the volume, 1 connection",
            "nbdcopy-write-c4": "nbdcopy onto the volume, 4 connections",
            "nbdcopy-read-c1": "nbdcopy off the volume, 1 connection",
            "nbdcopy-read-c4": "nbdcopy off the volume, 4 connections",
            "sparse-convert": "qemu-img convert of a sparse image",
            "sparse-mkfs": "mkfs.ext4 -E discard through nbdfuse",
            "qemu-write-qd32": "qemu-img bench 4 KiB write, depth 32",
        },
        "columns": [
            ("iops", "IOPS", 0),
            ("p50_us", "p50 µs", 0),
            ("p99_us", "p99 µs", 0),
            ("mean_us", "mean µs", 0),
            ("wb_s", "write-back after, s", 2),
            ("iops_wb", "IOPS incl. write-back", 0),
            ("mbps", "MB/s", 0),
            ("secs", "time s", 2),
            ("lat_us", "latency µs", 0),
            ("cpu_us", "server CPU µs per write", 1),
            ("run_s", "run s", 1),
        ],
        "ratio": ("iops", "Mariner ÷ peer, IOPS"),
        "targets": [
            # issue 16 (NBD speed); reported here so every fair run shows where it stands.
            ("issue 16: depth-1 write p50 ≤ nbdkit-fua's", "randwrite-qd1", "p50_us",
             "mariner", "nbdkit", "<=", 1.0),
            T("issue 16: depth-1 write p50 ≤ 1.1× (raw durable write + nbdkit-memory round trip)",
              "p50_us", ["mariner:randwrite-qd1"], ["raw:randwrite-qd1", "memory:randwrite-qd1"],
              "<=", 1.1),
            ("issue 16: depth-32 write IOPS ≥ 2× nbdkit-fua's", "randwrite-qd32", "iops",
             "mariner", "nbdkit", ">=", 2.0),
            ("issue 16: depth-32 write IOPS incl. write-back ≥ 2× nbdkit-fua's",
             "randwrite-qd32", "iops_wb", "mariner", "nbdkit", ">=", 2.0),
            T("issue 16: qemu-img depth-32 write IOPS, NBD ≥ 0.9× iSCSI's", "iops",
              ["mariner:qemu-write-qd32"], ["mariner-iscsi:qemu-write-qd32"], ">=", 0.9),
            T("issue 16: server CPU per 4 KiB write (qemu-img), NBD ≤ iSCSI's", "cpu_us",
              ["mariner:qemu-write-qd32"], ["mariner-iscsi:qemu-write-qd32"], "<=", 1.0),
            T("issue 16: iSCSI depth-32 write IOPS ≥ 0.95× the previous release's", "iops",
              ["mariner-iscsi:qemu-write-qd32"], ["prev-iscsi:qemu-write-qd32"], ">=", 0.95),
            T("issue 16: iSCSI server CPU per write ≤ the previous release's ÷ 0.95", "cpu_us",
              ["mariner-iscsi:qemu-write-qd32"], ["prev-iscsi:qemu-write-qd32"], "<=", 1.05),
            ("issue 16: warm depth-1 read p50 ≤ 1.1× nbdkit's", "randread-qd1-warm", "p50_us",
             "mariner", "nbdkit", "<=", 1.1),
            ("issue 16: warm depth-32 read IOPS ≥ nbdkit's", "randread-qd32-warm", "iops",
             "mariner", "nbdkit", ">=", 1.0),
            ("issue 16: cold depth-1 read p50 ≤ 1.1× nbdkit's", "randread-qd1-cold", "p50_us",
             "mariner", "nbdkit", "<=", 1.1),
            ("issue 16: cold depth-32 read IOPS ≥ nbdkit's", "randread-qd32-cold", "iops",
             "mariner", "nbdkit", ">=", 1.0),
            ("issue 16: 70/30 read/write depth-32 IOPS ≥ nbdkit-fua's", "randrw7030-qd32",
             "iops", "mariner", "nbdkit", ">=", 1.0),
            T("issue 16: depth-1 reader's p99 beside a depth-32 writer ≤ 2× alone", "p99_us",
              ["mariner:randread-qd1-beside-writer"], ["mariner:randread-qd1-alone"], "<=", 2.0),
            ("issue 16: 1 MiB sequential write MB/s ≥ 0.45× raw O_DIRECT", "seqwrite-1m-qd8",
             "mbps", "mariner", "raw", ">=", 0.45),
            ("issue 16: 1 MiB sequential write MB/s ≥ 0.8× nbdkit-fua's", "seqwrite-1m-qd8",
             "mbps", "mariner", "nbdkit", ">=", 0.8),
            ("issue 16: 1 MiB sequential read MB/s ≥ 0.9× nbdkit file's", "seqread-1m-qd8",
             "mbps", "mariner", "nbdkit", ">=", 0.9),
            T("issue 16: fio 4 jobs × depth 8 IOPS ≥ 1 job × depth 32", "iops",
              ["mariner:randwrite-4x8"], ["mariner:randwrite-1x32"], ">=", 1.0),
            T("issue 16: nbdcopy onto the volume, 4 connections ≥ 0.95× 1 connection's MB/s",
              "mbps", ["mariner:nbdcopy-write-c4"], ["mariner:nbdcopy-write-c1"], ">=", 0.95),
            T("issue 16: nbdcopy off the volume, 4 connections ≥ 0.95× 1 connection's MB/s",
              "mbps", ["mariner:nbdcopy-read-c4"], ["mariner:nbdcopy-read-c1"], ">=", 0.95),
            ("issue 16: qemu-img convert of a sparse image ≤ 1.2× nbdkit file's time",
             "sparse-convert", "secs", "mariner", "nbdkit", "<=", 1.2),
            ("issue 16: mkfs.ext4 -E discard through nbdfuse ≤ 1.2× nbdkit file's time",
             "sparse-mkfs", "secs", "mariner", "nbdkit", "<=", 1.2),
        ],
    },
    "iscsi-compare": {
        "peers": {
            "mariner-iscsi": "Mariner iSCSI",
            "mariner-nbd": "Mariner NBD",
            "tgtd": "tgtd (O_SYNC file)",
        },
        "workloads": {
            "write-qd1": "4 KiB write, depth 1",
            "write-qd32": "4 KiB write, depth 32, ≥ 3× the log",
            "read-qd32": "4 KiB read, depth 32",
        },
        "columns": [
            ("iops", "IOPS", 0),
            ("lat_us", "latency µs", 0),
            ("wb_s", "write-back after, s", 2),
            ("iops_wb", "IOPS incl. write-back", 0),
            ("cpu_us", "server CPU µs per write", 1),
        ],
        "ratio": ("iops", "Mariner iSCSI ÷ peer, IOPS"),
        "targets": [
            ("issue 3: depth-1 write latency ≤ 1.15× Mariner NBD's", "write-qd1", "lat_us",
             "mariner-iscsi", "mariner-nbd", "<=", 1.15),
            ("issue 3: depth-32 write IOPS ≥ 0.8× Mariner NBD's", "write-qd32", "iops",
             "mariner-iscsi", "mariner-nbd", ">=", 0.8),
            ("issue 3: depth-32 write IOPS ≥ 3× tgtd's", "write-qd32", "iops",
             "mariner-iscsi", "tgtd", ">=", 3.0),
            ("the same, IOPS incl. the write-back after the burst", "write-qd32", "iops_wb",
             "mariner-iscsi", "tgtd", ">=", 3.0),
            ("issue 3: depth-32 read IOPS ≥ tgtd's", "read-qd32", "iops",
             "mariner-iscsi", "tgtd", ">=", 1.0),
        ],
    },
}


def parse_samples(path):
    samples = {}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 5:
                continue
            rnd, peer, wl, metric, value = parts
            samples.setdefault(peer, {}).setdefault(wl, {}).setdefault(metric, []).append(
                [int(rnd), float(value)])
    return samples


def median(values):
    return statistics.median(values) if values else None


def medians(doc):
    out = {}
    for peer, wls in doc["samples"].items():
        for wl, metrics in wls.items():
            for m, vals in metrics.items():
                out.setdefault(peer, {}).setdefault(wl, {})[m] = median([v for _, v in vals])
    return out


def per_round_ratios(doc, wl, metric, a, b):
    return per_round_sums(doc, metric, [(a, wl)], [(b, wl)])


def per_round_sums(doc, metric, a_terms, b_terms):
    """Per round: the sum of a's terms over the sum of b's, rounds where every term was measured."""
    def by_round(terms):
        out = None
        for peer, wl in terms:
            vals = {r: v for r, v in doc["samples"].get(peer, {}).get(wl, {}).get(metric, [])}
            out = vals if out is None else {r: out[r] + vals[r] for r in out if r in vals}
        return out or {}
    ra, rb = by_round(a_terms), by_round(b_terms)
    return [ra[r] / rb[r] for r in sorted(ra) if r in rb and rb[r]]


def term_sum(med, metric, terms):
    vals = [med.get(peer, {}).get(wl, {}).get(metric) for peer, wl in terms]
    return None if any(v is None for v in vals) else sum(vals)


def verdicts(doc):
    spec, med = SPECS[doc["script"]], doc["medians"]
    out = []
    for t in map(target, spec["targets"]):
        op, bound = t["op"], t["bound"]
        x, y = term_sum(med, t["metric"], t["a"]), term_sum(med, t["metric"], t["b"])
        if x is None or y is None or not y:
            continue
        ratio = x / y
        met = ratio <= bound if op == "<=" else ratio >= bound
        rounds = per_round_sums(doc, t["metric"], t["a"], t["b"])
        out.append({"target": t["label"], "ratio": ratio, "bound": f"{op} {bound}", "met": met,
                    "rounds_met": sum(1 for r in rounds if (r <= bound if op == "<=" else r >= bound)),
                    "rounds": len(rounds)})
    return out


def fmt(v, digits):
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def markdown(doc):
    spec = SPECS[doc["script"]]
    meta = doc["meta"]
    ref = next(iter(spec["peers"]))
    rkey, rlabel = spec["ratio"]
    med = doc["medians"]
    lines = [f"**Run {meta.get('started', '?')}** (commit {meta.get('commit', '?')}, "
             f"result file `bench/results/{doc['file']}`)", ""]
    lines.append(f"Command: `{meta.get('command', '?')}`; load average before "
                 f"{meta.get('load_before', '?')}, after {meta.get('load_after', '?')}.")
    for k in ("setup", "cache", "working_set", "note"):
        if meta.get(k):
            lines.append(f"{k.replace('_', ' ').capitalize()}: {meta[k]}")
    lines.append("")
    if doc.get("defects"):
        lines.append("**Not counted towards any target** — " + "; ".join(doc["defects"]) + ".")
        lines.append("")
    cols = [c for c in spec["columns"]
            if any(c[0] in med.get(p, {}).get(w, {}) for p in med for w in med[p])]
    hdr = ["workload", "peer"] + [c[1] for c in cols] + [rlabel + " (median; rounds min–max)"]
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|---|---|" + "---:|" * (len(cols) + 1))
    for wl, wlabel in spec["workloads"].items():
        first = True
        # The reference: the first peer that ran the workload; the ratio of its main figure
        # (IOPS, else MB/s, else time), named in the cell when not IOPS.
        wref = next((p for p in spec["peers"] if wl in med.get(p, {})), ref)
        wkey = next((k for k in (rkey, "mbps", "secs") if k in med.get(wref, {}).get(wl, {})), rkey)
        unit = {"mbps": " MB/s", "secs": " time"}.get(wkey, "") if wkey != rkey else ""
        for peer, plabel in spec["peers"].items():
            m = med.get(peer, {}).get(wl)
            if m is None:
                continue
            row = [wlabel if first else "", plabel]
            first = False
            row += [fmt(m.get(c[0]), c[2]) for c in cols]
            if peer == wref:
                row.append("")
            else:
                x, y = med.get(wref, {}).get(wl, {}).get(wkey), m.get(wkey)
                rr = per_round_ratios(doc, wl, wkey, wref, peer)
                cell = f"{x / y:.2f}" if x is not None and y else "–"
                if rr:
                    cell += f" ({min(rr):.2f}–{max(rr):.2f})"
                row.append(cell + unit)
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    rounds = meta.get("rounds", "?")
    lines.append(f"Medians of {rounds} interleaved rounds (peer order rotated each round).")
    if doc["verdicts"]:
        lines.append("")
        lines.append("Targets (ratio of the medians; rounds that met it on their own):")
        for v in doc["verdicts"]:
            state = "met" if v["met"] else "**missed**"
            if doc.get("defects"):
                state = "not counted (defect above)"
            lines.append(f"- {v['target']}: {v['ratio']:.2f} ({v['bound']}) — {state}, "
                         f"{v['rounds_met']} of {v['rounds']} rounds")
    return "\n".join(lines)


def markdown_index(doc):
    """bench/index-compare.sh's result file: one run of each engine, no rounds."""
    lines = [f"**Run {doc['run']}** (result file `bench/results/{doc['file']}`)", "",
             f"Parameters: {doc['params']}", "",
             "| engine | insert ops/s | insert: queued blocks, commit s | insert ops/s with the commit "
             "| update ops/s | update: queued blocks, commit s | update ops/s with the commit "
             "| point p50 / p99 µs | reopen s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rates = {}
    for e, r in doc["engines"].items():
        run, reopen = r.get("run"), r.get("reopen")
        if not run:
            lines.append(f"| {e} | failed | | | | | | | |")
            continue
        row = [e]
        for ph in ("insert", "update"):
            p = run[ph]
            with_commit = p.get("ops_per_s_committed", p["ops_per_s"])
            rates[(e, ph)] = with_commit
            row.append(f"{p['ops_per_s']:,.0f}")
            if p.get("commit_s") is None:
                row += ["– (nothing queued)", f"{p['ops_per_s']:,.0f}"]
            else:
                row += [f"{p['queued_blocks']:,}, {p['commit_s']:.2f}", f"{with_commit:,.0f}"]
        row.append(f"{run['point']['p50_us']:.0f} / {run['point']['p99_us']:.0f}")
        requeued = ((reopen or {}).get("notes") or {}).get("pending_requeued")
        row.append("–" if not reopen else f"{reopen['reopen_s']:.2f}" +
                   (f" ({requeued:,} requeued)" if requeued is not None else ""))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for a, b in (("bosc-btree", "redb"), ("bosc-btree", "fjall"), ("bosc-hash", "plain-hash")):
        if (a, "insert") in rates and (b, "insert") in rates:
            lines.append(f"- {a} ÷ {b}, rates with the commit paid: inserts "
                         f"{rates[(a, 'insert')] / rates[(b, 'insert')]:.2f}×, updates "
                         f"{rates[(a, 'update')] / rates[(b, 'update')]:.2f}×")
    if doc.get("note"):
        lines += ["", doc["note"]]
    return "\n".join(lines)


def record(script, samples_path, out_path, pairs):
    if script not in SPECS:
        sys.exit(f"unknown script {script}")
    meta, defects = {}, []
    for p in pairs:
        k, _, v = p.partition("=")
        if k == "defect":
            defects.append(v)
        else:
            meta[k] = v
    doc = {"script": script, "file": os.path.basename(out_path), "meta": meta,
           "defects": defects, "samples": parse_samples(samples_path)}
    doc["medians"] = medians(doc)
    doc["verdicts"] = verdicts(doc)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(markdown(doc))
    print()
    print(target_lines(doc))


def target_lines(doc):
    """One line per target of the script: "target X: measured Y -> met/missed", or not measured."""
    got = {v["target"]: v for v in doc["verdicts"]}
    lines = []
    for t in map(target, SPECS[doc["script"]]["targets"]):
        v = got.get(t["label"])
        if v is None:
            lines.append(f"target {t['label']}: not measured in this run")
            continue
        state = "met" if v["met"] else "missed"
        note = " (not counted: run has a defect)" if doc.get("defects") else ""
        lines.append(f"target {t['label']}: measured {v['ratio']:.2f} ({v['bound']}) -> {state}, "
                     f"{v['rounds_met']} of {v['rounds']} rounds{note}")
    return "\n".join(lines)


def load(path):
    with open(path) as f:
        doc = json.load(f)
    doc["file"] = os.path.basename(path)
    if doc["script"] not in SPECS:
        return doc
    # Recomputed, so a change of the targets or the table applies to every stored run.
    doc["medians"] = medians(doc)
    doc["verdicts"] = verdicts(doc)
    return doc


def render(doc_path, check=False):
    text = open(doc_path).read()
    pat = re.compile(r"(<!-- generated: ([a-z-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)

    def block(m):
        script = m.group(2)
        files = sorted(glob.glob(os.path.join(HERE, "results", f"{script}-*.json")), reverse=True)
        show = markdown if script in SPECS else markdown_index
        parts = [show(load(f)) for f in files]
        body = "\n\n".join(parts) if parts else f"(no result files bench/results/{script}-*.json)"
        return (m.group(1) + "<!-- written by bench/results.py render from bench/results/; "
                "do not edit by hand -->\n\n" + body + "\n\n" + m.group(4))

    new, n = pat.subn(block, text)
    if check:
        if new != text:
            sys.exit(f"{doc_path}: a generated block differs from bench/results/ "
                     "(edited by hand, or not rendered since a run): run bench/results.py render")
        print(f"{doc_path}: {n} generated blocks match bench/results/")
        return
    with open(doc_path, "w") as f:
        f.write(new)
    print(f"{doc_path}: {n} generated blocks rewritten")


def main(argv):
    if len(argv) >= 2 and argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    if len(argv) >= 5 and argv[1] == "record":
        record(argv[2], argv[3], argv[4], argv[5:])
    elif len(argv) == 3 and argv[1] == "show":
        doc = load(argv[2])
        print(markdown(doc) if doc["script"] in SPECS else markdown_index(doc))
    elif len(argv) in (2, 3) and argv[1] in ("render", "check"):
        doc = argv[2] if len(argv) == 3 else os.path.join(HERE, "..", "docs", "benchmarks.md")
        render(doc, check=argv[1] == "check")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
