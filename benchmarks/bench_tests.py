"""The fast test target (`make test-fast`) timed side by side in one run: on a committed tree (HEAD by
default, its package and tests unpacked with `git archive` into a temporary folder: nothing in this
checkout changes) and on the working tree, in the order ref, tree, tree, ref (one round is one of each;
--rounds 2, the default, is that ABBA order), so that a machine that speeds up or slows down over the
minutes of a run weighs on both trees alike.

    .venv/bin/python benchmarks/bench_tests.py              # HEAD and the working tree, ABBA
    .venv/bin/python benchmarks/bench_tests.py --ref HEAD~1 --rounds 1

    .venv/bin/python benchmarks/bench_tests.py --same-env   # both under this shell's environment

Each run is its tree's Makefile test-fast line (`python -m pytest [its options] -m "not browser and not
pretrained and not slow" tests`, quiet and without pytest's cache) from that tree's root, so that tree's
package is the one imported, under the environment that tree's Makefile gives it: a Makefile that says
``unexport PYTHONDONTWRITEBYTECODE`` lets Python keep its bytecode, one that does not leaves this shell's
setting. With ``--same-env`` both run under this shell's environment and the ref's pytest options, so that
the ratio is the code's alone. Before the first run, each tree's tests are collected once (untimed), so
that a run that keeps bytecode finds it compiled, as a second `make test-fast` does. Printed per tree: the
package imported, whether bytecode is kept, and the command; per run: wall time, the children's CPU time,
pytest's summary line, and the load average before and after; then, per round and over all of them, the
ratios of the wall times and of the CPU times. Not a timed test: wall times depend on what else runs on
the machine (on a shared virtual machine also on the time the host gives to other guests, `st` in vmstat:
2-18 % here), so read them with the load averages and the CPU times (on a shared 2-core machine a load
above 2 means waiting for a core).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["-q", "-p", "no:cacheprovider"]
FAST = ["-m", "pytest", "-m", "not browser and not pretrained and not slow", "tests"]  # a Makefile without the target


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def unpack(ref: str, into: Path) -> str:
    """``git archive ref`` unpacked into ``into``; returns the commit it names."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.Popen(["git", "archive", ref], cwd=ROOT, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        raise SystemExit(f"git archive {ref} failed")
    helpers = into / "tests" / "helpers.py"
    if not helpers.exists() and any("from helpers import" in p.read_text() for p in (into / "tests").glob("*.py")):
        # a commit that took a test file's import of tests/helpers.py before the file itself
        shutil.copy(ROOT / "tests" / "helpers.py", helpers)
        print(f"note: {ref} imports tests/helpers.py without holding it; the working tree's copy is used")
    return commit


def makefile_lines(tree: Path) -> list[str]:
    """The lines of ``tree``'s Makefile (none where it has no Makefile)."""
    makefile = tree / "Makefile"
    return makefile.read_text().splitlines() if makefile.is_file() else []


def keeps_bytecode(tree: Path) -> bool:
    """Whether ``tree``'s Makefile lets Python write bytecode whatever the environment says."""
    return "unexport PYTHONDONTWRITEBYTECODE" in makefile_lines(tree)


def fast_target(tree: Path) -> list[str]:
    """The arguments of ``python`` in ``tree``'s Makefile test-fast recipe (``$(PY) -m pytest ...``)."""
    lines = makefile_lines(tree)
    for i, line in enumerate(lines):
        if line.startswith("test-fast:"):
            recipe = lines[i + 1].strip()
            if recipe.startswith("$(PY) -m pytest"):
                return shlex.split(recipe)[1:]
    return FAST


def prepared(label: str, tree: Path, same_env: bool, target: list[str]) -> tuple[str, Path, dict, list[str]]:
    """What each run of the fast target (``python`` arguments ``target``) in ``tree`` needs: its label, the
    tree, its environment and its arguments (quiet, without pytest's cache). Prints the package that tree
    imports and whether it keeps bytecode, and collects its tests once (untimed), so that a run that keeps
    bytecode finds it compiled."""
    target = target[:2] + QUIET + target[2:]  # after "-m pytest"
    env = {k: v for k, v in os.environ.items() if k != "ATTNRES_ROOT"}  # each tree finds its own data/
    if not same_env and keeps_bytecode(tree):
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    bytecode = "bytecode kept" if "PYTHONDONTWRITEBYTECODE" not in env else "no bytecode written"
    package = subprocess.run(
        [sys.executable, "-c", "import attnres_helpers; print(attnres_helpers.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"{label}: {bytecode}, package {package}")
    print(f"    python {shlex.join(target)}")
    subprocess.run([sys.executable, *target, "--collect-only"], cwd=tree, env=env, capture_output=True)  # warm-up
    return label, tree, env, target


def timed(label: str, tree: Path, env: dict, target: list[str]) -> tuple[float, float] | None:
    """One run of :func:`prepared`'s command: prints its lines and returns its wall and CPU times (None
    where pytest ran no tests: an error while collecting them)."""
    before_load, cpu0 = load(), resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    out = subprocess.run([sys.executable, *target], cwd=tree, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    lines = [line for line in out.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    print(f"{label}: {wall:.1f} s wall, {cpu:.1f} s CPU")
    print(f"    pytest: {lines[-1].strip('= ') if lines else out.stdout[-500:]!r}")
    print(f"    {before_load} before, {load()} after")
    return (wall, cpu) if lines else None


def ratios(ref: str, ref_runs: list[tuple[float, float]], tree_runs: list[tuple[float, float]]) -> str:
    """The ratios ref / working tree of the summed wall times and of the summed CPU times."""
    (ref_wall, ref_cpu), (wall, cpu) = (map(sum, zip(*runs)) for runs in (ref_runs, tree_runs))
    return f"ratio {ref} / working tree {ref_wall / wall:.2f}x wall, {ref_cpu / cpu:.2f}x CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="HEAD", help="the committed tree to compare with (default HEAD)")
    parser.add_argument(
        "--same-env",
        action="store_true",
        help="both trees under this shell's environment, whatever their Makefiles say",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of one run each, ABBA order (default 2)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {load()}")
    with tempfile.TemporaryDirectory(prefix="bench-tests-") as tmp:
        commit = unpack(args.ref, Path(tmp))
        ref_target = fast_target(Path(tmp))
        trees = {
            "ref": prepared(f"{args.ref} ({commit})", Path(tmp), args.same_env, ref_target),
            "tree": prepared("working tree", ROOT, args.same_env, ref_target if args.same_env else fast_target(ROOT)),
        }
        times: dict[str, list[tuple[float, float]]] = {"ref": [], "tree": []}
        for round_ in range(args.rounds):
            for which in ("ref", "tree") if round_ % 2 == 0 else ("tree", "ref"):
                label, tree, env, target = trees[which]
                result = timed(f"round {round_ + 1}, {label}", tree, env, target)
                if result is None:
                    raise SystemExit("no ratio: a run stopped while collecting its tests (above)")
                times[which].append(result)
            print(f"round {round_ + 1}: {ratios(args.ref, times['ref'][-1:], times['tree'][-1:])}")
    print(f"all {args.rounds} rounds, sums of the runs: {ratios(args.ref, times['ref'], times['tree'])}")


if __name__ == "__main__":
    main()
