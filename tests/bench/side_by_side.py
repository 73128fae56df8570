"""Run a benchmark on two checkouts in turn and compare their medians (run by hand).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m tests.bench.side_by_side \\
        --base /path/to/baseline --rounds 3 -- tests.bench.bench_suite --repeat 3 --no-dask --no-write

Each round runs the benchmark module (``python -m MODULE ARGS``) once with this checkout and once
with ``--base`` on PYTHONPATH, alternating which goes first, so a drift of the machine's load
slows both alike. Every figure the benchmark prints is collected per round: bench_suite's rows
(tensordb's seconds per workload), and the rows of markdown tables whose cells read ``N ms``
(bench_planning: ``ops/workers`` -> total and CPU; a labelled row -> its median and CPU). Per
figure, the median over the rounds of each checkout and their ratio (this / base).
``--this-script`` runs this checkout's copy of the module on both (by its path, the checkout
measured on PYTHONPATH): an option the base's copy lacks (bench_planning's ``--rebind``).
"""
from __future__ import annotations

import argparse
import math
import ast
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
_PLAN_ROW = re.compile(r"^\| (\d+) \| (\d+) \| ([\d.]+) ms \| ([\d.]+) ms")
_LABEL_ROW = re.compile(r"^\| ([^|]+?) \| ([\d.]+) ms \| ([\d.]+) ms")


def figures(out: str) -> dict[str, float]:
    """The figures (milliseconds) one run printed."""
    found: dict[str, float] = {}
    for line in out.splitlines():
        if line.startswith("{'name'"):
            row = ast.literal_eval(line)
            found[row["name"]] = 1e3 * row["tensordb"]
        elif m := _PLAN_ROW.match(line):
            found[f"{m[1]} ops / {m[2]} workers"] = float(m[3])
            found[f"{m[1]} ops / {m[2]} workers, CPU"] = float(m[4])
        elif m := _LABEL_ROW.match(line):
            found[m[1].strip()] = float(m[2])
            found[m[1].strip() + ", CPU"] = float(m[3])
    return found


def run(tree: Path, module: str, args: list[str], this_script: bool = False) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    env["PYTHONPATH"] = str(tree)
    target = [str(HERE / (module.replace(".", "/") + ".py"))] if this_script else ["-m", module]
    done = subprocess.run([sys.executable, *target, *args], cwd=tree, env=env,
                          capture_output=True, text=True, check=True)
    return figures(done.stdout)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--this-script", action="store_true",
                    help="run this checkout's copy of the module on both checkouts")
    ap.add_argument("module")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    trees = {"base": a.base.resolve(), "this": HERE}
    got: dict[str, dict[str, list[float]]] = {"base": {}, "this": {}}
    for r in range(a.rounds):
        order = ("base", "this") if r % 2 == 0 else ("this", "base")
        for which in order:
            for k, v in run(trees[which], a.module, a.args, a.this_script).items():
                got[which].setdefault(k, []).append(v)
        print(f"round {r + 1} of {a.rounds} done", file=sys.stderr, flush=True)
    print(f"| {a.module} | base (ms) | this (ms) | this / base |")
    print("|---|---:|---:|---:|")
    ratios = []
    for k in got["base"]:
        if k not in got["this"]:
            continue
        b, t = statistics.median(got["base"][k]), statistics.median(got["this"][k])
        ratios.append(t / b)
        print(f"| {k} | {b:.1f} | {t:.1f} | {t / b:.3f} |")
    if ratios:
        geo = 2 ** statistics.fmean(math.log2(x) for x in ratios)
        print(f"\nGeometric mean of this / base over {len(ratios)} figures: **{geo:.3f}** "
              f"(medians of {a.rounds} rounds each).")


if __name__ == "__main__":
    main()
