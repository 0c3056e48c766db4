#!/usr/bin/python3
"""make bench-compare BASE=<rev>: the hand-off cells of a base revision
against the working tree, side by side on this machine.

Checks BASE out in a git worktree under target/ (removed afterwards) and
builds it there with cargo (into target/bench-base, so that the next
comparison reuses its dependencies); starts one nginx per tree and variant
(run.handoff_nginx), each with its tree's module, lua/, bench/lua and
bench/nginx.conf.tmpl; then runs every hand-off cell of make bench that
both trees have, but inline, in rounds, the two trees alternating cell by
cell. run_worker_thread is the control: the module does not touch it, so
its ratios show the noise. Prints per cell and figure both medians with
their [min–max], the ratio working tree / BASE of the medians and the
median of the rounds' ratios ("paired"), then the paired ratios' median
and range over the module's cells and over run_worker_thread's; the
rounds' figures go to bench/out/compare.json.

  ROUNDS=5 (default) rounds; QUICK=1 runs 200 ms cells instead of 1 s;
  CELLS=PATTERN[,PATTERN...] runs only the cells "variant|C|payload" that
  match one of the shell patterns (tp|8|*, tpb|*|16), with run_worker_thread's
  cells of the same C and payload as the control.
"""

import argparse
import contextlib
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error

sys.dont_write_bytecode = True  # no __pycache__ beside the sources
import figures  # noqa: E402
import run  # noqa: E402
from figures import LABEL, PAYLOAD_LABEL  # noqa: E402
from harness import OUT, REPO, log  # noqa: E402
from procs import MODULE  # noqa: E402
from run import handoff_cell, handoff_nginx, rotated  # noqa: E402

BASE_SRC = REPO / "target/bench-base-src"
BASE_TARGET = REPO / "target/bench-base"
TREES = ("base", "work")
SHOWN = {"rate": "tasks/s", "loop_us": "event-loop CPU µs per task",
         "threads_us": "pool-thread CPU µs per task", "p50": "round-trip p50 µs"}


def git(*args):
    return subprocess.run(["git", "-C", str(REPO), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def base_tree(commit):
    """The tree of `commit` with its module built: (source dir, module)."""
    if BASE_SRC.exists():  # left by an interrupted run
        shutil.rmtree(BASE_SRC)
    git("worktree", "prune")
    git("worktree", "add", "--detach", str(BASE_SRC), commit)
    try:
        log(f"building {commit[:10]} in {BASE_SRC.relative_to(REPO)}")
        subprocess.run(["cargo", "build", "--release"], cwd=BASE_SRC, check=True,
                       env=dict(os.environ, CARGO_TARGET_DIR=str(BASE_TARGET)))
        yield BASE_SRC, BASE_TARGET / "release/libngx_threadpool.so"
    finally:
        git("worktree", "remove", "--force", str(BASE_SRC))


def common_cells(ngs, cells, plan):
    """The cells (variant, C, payload) whose variant and payload both trees
    answer (ngs: tree → variant → nginx; a variant whose nginx did not
    start in a tree is not there). Each pair runs once at C = 64 first,
    which also warms up (JIT, run_worker_thread's VMs, modules)."""
    answered = {}
    for v, _, p in cells:
        if (v, p) in answered:
            continue
        answered[v, p] = all(v in tree for tree in ngs.values())
        try:
            for tree in ngs.values() if answered[v, p] else ():
                handoff_cell(tree[v], v, 64, p, plan["warmup_ms"])
        except urllib.error.HTTPError as e:
            if e.code != 400:  # bench_handoff.lua's answer to what it lacks
                raise
            answered[v, p] = False
        if not answered[v, p]:
            log(f"{LABEL[v]}, {PAYLOAD_LABEL[p]}: not in both trees, left out")
    return [(v, c, p) for v, c, p in cells if answered[v, p]]


def selected(cells, patterns):
    """The cells matching one of the comma-separated shell patterns of
    "variant|C|payload", with run_worker_thread's cells of the same C and
    payload as the control; all of them without patterns."""
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    if not pats:
        return cells
    chosen = [(v, c, p) for v, c, p in cells
              if any(fnmatch.fnmatchcase(f"{v}|{c}|{p}", pat) for pat in pats)]
    hit = {(c, p) for _, c, p in chosen}
    return [(v, c, p) for v, c, p in cells
            if (v, c, p) in chosen or (v == "rwt" and (c, p) in hit)]


def paired(rounds, key, k):
    """The median of the rounds' ratios working tree / BASE of figure k in
    cell `key`: the trees ran the cell one after the other in each round,
    so a machine whose load moves from round to round moves this less
    than the ratio of the medians."""
    return figures.median(figures.ratio(w[k], b[k])
                          for b, w in zip(rounds["base"][key], rounds["work"][key]))


def spread(ratios):
    """The median and [min–max] of some ratios."""
    xs = [x for x in ratios if x is not None]
    if not xs:
        return "–"
    return f"{figures.f_ratio(figures.median(xs))} [{min(xs):.2f}–{max(xs):.2f}]"


def tables(cells, rounds):
    """One table per shown figure: each cell's medians [min–max], their
    ratio and the paired one; then the paired ratios over the module's
    cells and over run_worker_thread's, which the module does not touch
    (the noise)."""
    out = []
    for k, what in SHOWN.items():
        rows, by_kind = [], {"module": [], "rwt": []}
        for v, c, p in cells:
            key = f"{v}|{c}|{p}"
            base, work = (figures.medians(rounds[t][key]) for t in TREES)
            pair = paired(rounds, key, k)
            by_kind["rwt" if v == "rwt" else "module"].append(pair)
            rows.append([f"{LABEL[v]}, {PAYLOAD_LABEL[p]}, C={c}",
                         figures.f_spread(base, k), figures.f_spread(work, k),
                         figures.f_ratio(figures.ratio(work[k], base[k])),
                         figures.f_ratio(pair)])
        out.append(f"### {what}\n\n"
                   + figures.table(["cell", "BASE", "working tree", "working tree / BASE",
                                    "paired"], rows)
                   + f"\nPaired ratios: the module's cells {spread(by_kind['module'])}, "
                   f"run_worker_thread's {spread(by_kind['rwt'])}.\n")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="the git revision to compare with")
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS") or 5))
    ap.add_argument("--quick", action="store_true",
                    default=os.environ.get("QUICK", "") not in ("", "0"),
                    help="200 ms cells (also QUICK=1)")
    ap.add_argument("--cells", default=os.environ.get("CELLS", ""),
                    help="only the cells variant|C|payload matching these "
                    "comma-separated shell patterns (also CELLS=...)")
    args = ap.parse_args()
    if not MODULE.exists():
        sys.exit(f"{MODULE} missing: run `make build` first")
    plan = run.PLANS["quick" if args.quick else "full"]
    commit = git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    work = git("describe", "--always", "--dirty")
    notes = []
    if git("diff", "--stat", commit, "--", "bench/lua", "bench/nginx.conf.tmpl"):
        notes.append("bench/lua or bench/nginx.conf.tmpl differ between the trees: "
                     "the ratios include the harness's changes.")
    rounds = {t: {} for t in TREES}
    failed = {}
    load = run.loadavg()
    # make bench's hand-off cells but inline
    cells = selected([cell for group in run.handoff_groups() for cell in group
                      if cell[0] != "inline"], args.cells)
    if not cells:
        sys.exit(f"no hand-off cell matches CELLS={args.cells}")
    with base_tree(commit) as (src, module), \
            handoff_nginx("compare-base", cells, tree=src, module=module) as base_ngs, \
            handoff_nginx("compare-work", cells) as work_ngs:
        ngs = dict(base=base_ngs, work=work_ngs)
        cells = common_cells(ngs, cells, plan)
        for rnd in range(args.rounds):
            log(f"round {rnd + 1}/{args.rounds}: {len(cells)} cells")
            for i, (v, c, p) in enumerate(cells):
                key = f"{v}|{c}|{p}"
                for t in rotated(TREES, rnd + i):
                    r = handoff_cell(ngs[t][v], v, c, p, plan["handoff_ms"])
                    rounds[t].setdefault(key, []).append(figures.per_task(r))
                    if r["failed"]:
                        failed[t, key] = failed.get((t, key), 0) + r["failed"]
        notes += [f"A worker of {t} died during the run: see {ng.prefix}/logs."
                  for t, tree in ngs.items() for ng in tree.values() if not ng.alive()]
    notes += [f"{t}: {key} failed {n} tasks" for (t, key), n in failed.items()]
    (OUT / "compare.json").write_text(json.dumps(
        dict(base=args.base, commit=commit, work=work, plan=plan, rounds=rounds), indent=1))
    print(f"\n## make bench-compare: working tree ({work}) / BASE {args.base} "
          f"({commit[:10]})\n\n"
          f"{args.rounds} round(s) of {plan['handoff_ms']} ms per cell, the trees "
          f"alternating; medians [min–max] of the rounds. Load average "
          f"{' '.join(load)} before, {' '.join(run.loadavg())} after "
          f"({time.strftime('%Y-%m-%d %H:%M')}).\n")
    print(figures.md_others({f"{t}|{k}": rs for t in TREES for k, rs in rounds[t].items()},
                            os.cpu_count()))
    print(tables(cells, rounds))
    for n in notes:
        print(f"- {n}")


if __name__ == "__main__":
    main()
