"""Run a subset of torch's own distributed test suite over "hccl" and beside "gloo".

torch ships its distributed tests in the wheel (``torch.testing._internal.distributed.
distributed_test``; torch's ``test/distributed/test_distributed_spawn.py`` drives them with
``BACKEND``, ``WORLD_SIZE``, ``TEMP_DIR`` and ``INIT_METHOD``). This runner does the same for
each backend in a worker process (:mod:`tests.torch_suite.spawn_suite`), then prints
passed/failed/skipped per subset and backend side by side, and every test whose outcome
differs from the reference backend's::

    python -m tests.torch_suite.run_distributed_suite --backend hccl --world-size 2
    python -m tests.torch_suite.run_distributed_suite --backend hccl -k all_reduce
    python -m tests.torch_suite.run_distributed_suite --subsets collectives --list

The subset (``--subsets``, default all of them; ``-k`` narrows it further) is chosen by test
name in :mod:`tests.torch_suite.subsets`: collectives (all_reduce, reduce, broadcast,
all_gather, reduce_scatter, all_to_all, barrier, send/recv, gather/scatter, object
collectives, coalescing), ddp (DistributedDataParallel on CPU modules), comm_hooks (DDP
communication hooks, no_sync, futures) and subgroups (new_group/new_subgroups, DDP on a
changed group). The whole default subset takes 1-2 minutes per backend on 2 cores.

Exit status: 0 when every test the reference passes also passes on the backend, 1 when one
does not, 2 on a usage error. Each worker's full output goes to ``--log-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

from tests.torch_suite.subsets import DEFAULT_SUBSETS, SUBSETS, group_of, select

__all__ = ["SuiteRun", "list_tests", "run_backend", "differences", "ungated", "summary_table", "main"]

ROOT = Path(__file__).resolve().parents[2]
OUTCOMES = ("passed", "failed", "skipped")
_WORKER = "import sys, tests.torch_suite.spawn_suite as s; sys.exit(s.main(sys.argv[1:]))"
_LIST = "import tests.torch_suite.spawn_suite as s; print('\\n'.join(s.all_test_names()))"


@dataclass(kw_only=True, slots=True)
class SuiteRun:
    """One backend's results over a list of tests."""

    backend: str
    """The torch.distributed backend the tests ran over."""
    world_size: int
    """Ranks per test."""
    results: dict[str, dict] = field(default_factory=dict)
    """test name -> ``{"outcome": passed|failed|skipped, "seconds", "message"}``."""
    wall_s: float = 0.0
    """Wall-clock seconds of the whole run."""
    log: str = ""
    """The worker's output file."""

    def outcome(self, name: str) -> str:
        """The outcome of ``name`` ("not run" when the worker never finished it)."""
        return self.results.get(name, {}).get("outcome", "not run")


def _env(backend: str, world_size: int, temp_dir: str, per_test_timeout_s: int, start_method: str,
         ungate: bool = True) -> dict[str, str]:
    """The environment torch's harness reads (as torch's run_test.py sets it for its spawn tests)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    env.update(
        BACKEND=backend,
        WORLD_SIZE=str(world_size),
        TEMP_DIR=temp_dir,
        INIT_METHOD="env://",  # each test still rendezvouses through its own file (TestDistBackend.init_method)
        DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(per_test_timeout_s),
        TORCH_SUITE_START_METHOD=start_method,
        TORCH_SUITE_UNGATE="1" if ungate else "0",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]),
    )
    return env


def list_tests(world_size: int = 2) -> list[str]:
    """Every test name in torch's distributed suite (imports it in a subprocess)."""
    with tempfile.TemporaryDirectory(prefix="torch_suite_") as tmp:
        os.mkdir(os.path.join(tmp, "barrier"))
        proc = subprocess.run(
            [sys.executable, "-c", _LIST], env=_env("gloo", world_size, tmp, 60, "spawn"), cwd=ROOT,
            capture_output=True, text=True, timeout=120,
        )
    if proc.returncode:
        raise RuntimeError(f"could not import torch's distributed suite:\n{proc.stderr[-3000:]}")
    return proc.stdout.split()


def run_backend(
    backend: str,
    names: list[str],
    *,
    world_size: int = 2,
    per_test_timeout_s: int = 120,
    total_timeout_s: float = 3600.0,
    start_method: str = "forkserver",
    ungate: bool = True,
    log_dir: str | None = None,
) -> SuiteRun:
    """Run ``names`` over ``backend`` in a worker process; never runs past ``total_timeout_s``.

    torch's harness ends a test's ranks after ``per_test_timeout_s``. Should the worker itself
    hang, it is killed: the test it was in is recorded as failed ("killed") and a new
    worker goes on with the rest while time is left; tests never started are "not run".
    """
    run = SuiteRun(backend=backend, world_size=world_size)
    log_dir = log_dir or tempfile.mkdtemp(prefix="torch_suite_logs_")
    os.makedirs(log_dir, exist_ok=True)
    run.log = os.path.join(log_dir, f"{backend}.log")
    t0 = time.monotonic()
    remaining = list(names)
    with tempfile.TemporaryDirectory(prefix=f"torch_suite_{backend}_") as tmp, open(run.log, "w") as log:
        out = os.path.join(tmp, "results.json")
        temp_dir = os.path.join(tmp, "temp")
        os.mkdir(temp_dir)
        os.mkdir(os.path.join(temp_dir, "barrier"))
        env = _env(backend, world_size, temp_dir, per_test_timeout_s, start_method, ungate)
        while remaining:
            left = total_timeout_s - (time.monotonic() - t0)
            if left <= 5:
                break
            proc = subprocess.Popen([sys.executable, "-c", _WORKER, "--out", out, *remaining], env=env, cwd=ROOT,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            killed = False
            try:
                proc.wait(timeout=min(left, per_test_timeout_s * len(remaining) + 120))
            except subprocess.TimeoutExpired:
                killed = True
                os.killpg(proc.pid, 9)  # the worker's own session: its ranks and forkserver too
                proc.wait()
            report = {}
            if os.path.exists(out):
                with open(out) as f:
                    report = json.load(f)
                os.remove(out)
            run.results.update(report.get("results", {}))
            stuck = report.get("running")
            if stuck:
                why = "worker killed at the runner's time limit" if killed else f"worker exited ({proc.returncode})"
                run.results[stuck] = {"outcome": "failed", "seconds": 0.0, "message": f"{why} while in this test"}
            before = len(remaining)
            remaining = [n for n in remaining if n not in run.results]
            if len(remaining) == before:  # the worker died before starting any test
                log.flush()
                raise RuntimeError(f"the {backend} worker ran no test (exit {proc.returncode}); see {run.log}")
    run.wall_s = time.monotonic() - t0
    return run


def differences(reference: SuiteRun, other: SuiteRun) -> list[tuple[str, str, str, str]]:
    """(test, reference outcome, other outcome, other's message) for tests whose outcomes differ.

    A test that ran ungated on ``other`` (NOTE [ungated tests] in spawn_suite) is marked ``*``.
    """
    rows = []
    for name in sorted(set(reference.results) | set(other.results)):
        a, b = reference.outcome(name), other.outcome(name)
        if a != b:
            star = "*" if other.results.get(name, {}).get("ungated") else ""
            rows.append((name, a, b + star, _first_line(other.results.get(name, {}).get("message", ""))))
    return rows


def ungated(run: SuiteRun) -> dict[str, str]:
    """The tests ``run`` ran although torch gates them to other backends, with torch's reason."""
    return {n: r["ungated"] for n, r in run.results.items() if r.get("ungated")}


_EXC_LINE = re.compile(r"^[\w.]*(Error|Exception|Failure|Timeout\w*)\b: ")


def _first_line(message: str, width: int = 110) -> str:
    """The most telling line of a failure or skip: the first exception line of the first rank's
    traceback (not torch's "Process 0 exited with error code 10" header), else the last line."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    picks = [ln for ln in lines if _EXC_LINE.match(ln) and "exited with error code" not in ln]
    text = picks[0] if picks else (lines[-1] if lines else "")
    return text if len(text) <= width else text[: width - 3] + "..."


def summary_table(runs: list[SuiteRun], names: list[str], subsets: list[str]) -> str:
    """passed / failed / skipped per subset (rows) and backend (columns), plus a total row."""
    headers = ["subset", "tests"] + [f"{r.backend} {o}" for r in runs for o in OUTCOMES]
    rows = []
    groups = {s: [n for n in names if group_of(n, subsets) == s] for s in subsets}
    for label, members in list(groups.items()) + [("total", names)]:
        if not members:
            continue
        row = [label, len(members)]
        for r in runs:
            counts = Counter(r.outcome(n) for n in members)
            row += [counts.get(o, 0) for o in OUTCOMES]
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt="github")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.torch_suite.run_distributed_suite",
        description="Run a subset of torch's distributed tests over a backend, beside a reference backend.",
    )
    parser.add_argument("--backend", default="hccl", help="backend under test (default hccl)")
    parser.add_argument("--reference", default="gloo", help="reference backend run first on the same tests; 'none' to skip")
    parser.add_argument("--world-size", type=int, default=2, help="ranks per test (default 2)")
    parser.add_argument("--subsets", default=",".join(DEFAULT_SUBSETS),
                        help=f"comma-separated groups of tests, of {', '.join(SUBSETS)} (default all)")
    parser.add_argument("-k", dest="pattern", default=None, help="only tests whose name contains / matches this")
    parser.add_argument("--per-test-timeout", type=int, default=120, help="seconds before torch's harness ends a test")
    parser.add_argument("--total-timeout", type=float, default=3600, help="seconds per backend before the run is cut")
    parser.add_argument("--start-method", choices=("forkserver", "spawn"), default="forkserver",
                        help="how ranks start (spawn is torch's own, about 4 s of CPU more per rank)")
    parser.add_argument("--no-ungate", action="store_true",
                        help="keep torch's gates that name other backends (see NOTE [ungated tests] in spawn_suite)")
    parser.add_argument("--log-dir", default=None, help="folder for the workers' output (default: a new temp folder)")
    parser.add_argument("--json", default=None, help="write every backend's results to this file")
    parser.add_argument("--list", action="store_true", help="print the chosen tests and exit")
    args = parser.parse_args(argv)

    subsets = [s.strip() for s in args.subsets.split(",") if s.strip()]
    if args.world_size < 2:
        parser.error("--world-size must be at least 2")
    try:
        names = select(list_tests(args.world_size), subsets, args.pattern)
    except ValueError as exc:
        parser.error(str(exc))
    if not names:
        parser.error(f"no test matches subsets {subsets} and -k {args.pattern!r}")
    if args.list:
        print("\n".join(f"{group_of(n, subsets):12} {n}" for n in names))
        return 0

    backends = ([args.reference] if args.reference not in ("none", "", args.backend) else []) + [args.backend]
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="torch_suite_logs_")
    runs = []
    for backend in backends:
        print(f"running {len(names)} tests over {backend} ({args.world_size} ranks); log: {log_dir}/{backend}.log",
              file=sys.stderr, flush=True)
        run = run_backend(backend, names, world_size=args.world_size, per_test_timeout_s=args.per_test_timeout,
                          total_timeout_s=args.total_timeout, start_method=args.start_method,
                          ungate=not args.no_ungate, log_dir=log_dir)
        print(f"  {backend}: {run.wall_s:.0f} s", file=sys.stderr, flush=True)
        runs.append(run)

    print(f"\ntorch {_torch_version()} distributed_test, world size {args.world_size}, subsets {', '.join(subsets)}"
          + (f", -k {args.pattern}" if args.pattern else ""))
    print(summary_table(runs, names, subsets))
    for run in runs:
        gates = ungated(run)
        if gates:
            counts = Counter(run.outcome(n) for n in gates)
            print(f"\n{run.backend} ran {len(gates)} tests that torch gates to other backends (marked *; "
                  f"--no-ungate keeps the gates): " + ", ".join(f"{counts.get(o, 0)} {o}" for o in OUTCOMES))
    status = 0
    if len(runs) == 2:
        ref, run = runs
        diff = differences(ref, run)
        print(f"\n{len(diff)} tests differ between {ref.backend} and {run.backend}:")
        if diff:
            print(tabulate(diff, headers=["test", ref.backend, run.backend, f"{run.backend} error"], tablefmt="github"))
        if any(a == "passed" and b != "passed" for _, a, b, _ in diff):
            status = 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump({r.backend: {"world_size": r.world_size, "wall_s": r.wall_s, "results": r.results} for r in runs},
                      f, indent=1)
    return status


def _torch_version() -> str:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # pragma: no cover
        return "?"


if __name__ == "__main__":
    sys.exit(main())
