#!/usr/bin/env python3
"""Issue 18's verdicts over bench/index-compare.sh results (called by bench/index-sweep.sh).

  index-sweep.py agree SYNC ROUND.json ...
      exits 0 if every target has the same verdict in every round given, 3 if not.
  index-sweep.py table CELLS OUT.json COMMIT
      CELLS: one "budget sync seed round1.json,round2.json[,...]" line per cell. Prints the
      table (each rate the median over the cell's rounds) and every target's verdict, and
      writes OUT.json.

A target is judged on the median over the rounds of its per-round ratio (BOSC against the
peer of the same round). The median of three ratios is on a bound's side exactly when two of
them are, so when two rounds agree a third cannot change the verdict: the sweep runs a third
only when they disagree, and the verdicts are those three rounds would give.
"""
import json
import os
import statistics
import sys

# Inserts at each sync interval: (x redb, x fjall).
NEED = {1000: (20, 1.0), 100: (10, 1.0), 10: (2, 0.8)}


def rate(e, phase):
    p = ((e or {}).get("run") or {}).get(phase) or {}
    return p.get("ops_per_s_committed") or p.get("ops_per_s")


def cpu(e):
    r = (e or {}).get("run") or {}
    ops = sum((r.get(p) or {}).get("ops", 0) for p in ("insert", "update"))
    s = sum((r.get(p) or {}).get("process_cpu_s", 0) for p in ("insert", "update"))
    return s * 1e6 / ops if ops else None


def point(e, k):
    return (((e or {}).get("run") or {}).get("point") or {}).get(k)


def engines(path):
    en = json.load(open(path))["engines"]
    row = {}
    for name, key in (("bosc", "bosc-btree"), ("redb", "redb"), ("fjall", "fjall")):
        e = en.get(key)
        row[name] = {"insert": rate(e, "insert"), "update": rate(e, "update"),
                     "p50": point(e, "p50_us"), "p99": point(e, "p99_us"), "cpu_us": cpu(e)}
    return row


def ratio(a, b):
    return a / b if a and b else None


def targets(sync, row):
    """(name, measured, op, bound) of every target for one round's engines."""
    out = []
    B, R, F = row["bosc"], row["redb"], row["fjall"]
    xr, xf = NEED.get(sync, (None, None))
    if xr is not None:
        out.append(("inserts / redb", ratio(B["insert"], R["insert"]), ">=", xr))
        out.append(("inserts / fjall", ratio(B["insert"], F["insert"]), ">=", xf))
    out.append(("updates / fjall", ratio(B["update"], F["update"]), ">=", 0.8))
    out.append(("point p50 / fjall", ratio(B["p50"], F["p50"]), "<=", 1.0))
    out.append(("point p99 / fjall", ratio(B["p99"], F["p99"]), "<=", 2.0))
    return out


def met(got, op, bound):
    return got is not None and (got >= bound if op == ">=" else got <= bound)


def median(values):
    """The median of the values, None if any is missing (a round without a result)."""
    if not values or any(v is None for v in values):
        return None
    return statistics.median(values)


def agree(sync, paths):
    rounds = [targets(sync, engines(p)) for p in paths]
    for i, (name, _, op, bound) in enumerate(rounds[0]):
        verdicts = {met(r[i][1], op, bound) for r in rounds}
        if len(verdicts) > 1:
            print(f"rounds disagree on {name}: "
                  + ", ".join(f"{r[i][1]:.2f}" if r[i][1] is not None else "–" for r in rounds),
                  file=sys.stderr)
            return 3
    return 0


def table(cells_path, out_path, commit):
    cells = [line.split() for line in open(cells_path) if line.strip()]
    rows, verdicts = [], []
    for budget, sync, seed, files in cells:
        paths = files.split(",")
        rounds = [engines(p) for p in paths]
        row = {"budget_mib": int(budget), "sync_every": int(sync), "seed": int(seed),
               "rounds": [os.path.basename(p) for p in paths]}
        for name in ("bosc", "redb", "fjall"):
            row[name] = {k: median([r[name][k] for r in rounds])
                         for k in ("insert", "update", "p50", "p99", "cpu_us")}
            row[name]["insert_rounds"] = [r[name]["insert"] for r in rounds]
            row[name]["update_rounds"] = [r[name]["update"] for r in rounds]
        rows.append(row)
        per_round = [targets(int(sync), r) for r in rounds]
        for i, (name, _, op, bound) in enumerate(per_round[0]):
            ratios = [t[i][1] for t in per_round]
            got = median(ratios)
            verdicts.append({"target": f"budget {budget} MiB, every {sync}, seed {seed}: {name}",
                             "measured": got, "rounds": ratios, "bound": f"{op} {bound}",
                             "met": met(got, op, bound)})
    fmt = lambda v, d=0: "–" if v is None else f"{v:,.{d}f}"
    print("Medians over each cell's rounds (rounds in alternating engine order).\n")
    print("| budget | sync every | seed | rounds | inserts/s BOSC · redb · fjall | updates/s BOSC · fjall "
          "| point p50/p99 µs BOSC · fjall | CPU µs/op BOSC · redb · fjall |")
    print("|---:|---:|---:|---:|---|---|---|---|")
    for w in rows:
        B, R, F = w["bosc"], w["redb"], w["fjall"]
        print(f"| {w['budget_mib']} MiB | {w['sync_every']} | {w['seed']} | {len(w['rounds'])} "
              f"| {fmt(B['insert'])} · {fmt(R['insert'])} · {fmt(F['insert'])} "
              f"| {fmt(B['update'])} · {fmt(F['update'])} "
              f"| {fmt(B['p50'])}/{fmt(B['p99'])} · {fmt(F['p50'])}/{fmt(F['p99'])} "
              f"| {fmt(B['cpu_us'], 1)} · {fmt(R['cpu_us'], 1)} · {fmt(F['cpu_us'], 1)} |")
    print()
    for t in verdicts:
        each = " / ".join(fmt(r, 2) for r in t["rounds"])
        print(f"- {t['target']}: {fmt(t['measured'], 2)} ({t['bound']}; rounds {each}) — "
              f"{'met' if t['met'] else '**missed**'}")
    n = sum(t["met"] for t in verdicts)
    print(f"\n{n} of {len(verdicts)} targets met (commit {commit})")
    json.dump({"script": "index-sweep", "commit": commit, "cells": rows, "targets": verdicts},
              open(out_path, "w"), indent=1)
    print(f"wrote {out_path}", file=sys.stderr)
    return 0


def main(argv):
    if len(argv) >= 3 and argv[0] == "agree":
        return agree(int(argv[1]), argv[2:])
    if len(argv) == 4 and argv[0] == "table":
        return table(*argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
