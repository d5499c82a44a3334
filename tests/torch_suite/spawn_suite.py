"""One backend's run of torch's distributed tests: what torch's ``test_distributed_spawn.py``
does (it is not shipped in the wheel), for any backend, "hccl" included.

Import needs the environment torch's harness reads at import time (the runner sets it):
``BACKEND`` (``gloo`` or ``hccl``), ``WORLD_SIZE``, ``TEMP_DIR`` (a folder with ``barrier/``),
``INIT_METHOD`` (``env://``; each test still rendezvouses through its own file), and
optionally ``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT`` (seconds per test) and
``TORCH_SUITE_START_METHOD``. Every test starts ``WORLD_SIZE`` new rank processes, which
find the test class by importing this module.

Run as a worker by :mod:`tests.torch_suite.run_distributed_suite`::

    python -c "import sys, tests.torch_suite.spawn_suite as s; sys.exit(s.main(sys.argv[1:]))" \
        --out results.json test_all_reduce_sum ...

(not ``python -m``: the ranks must find the test class under this module's name, not
``__main__``), which writes ``{"backend", "world_size", "results": {name: {"outcome", "seconds",
"message"}}}`` after every test (so a killed worker leaves what it finished); outcomes are
``passed``, ``failed`` or ``skipped``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys

for _var in ("BACKEND", "WORLD_SIZE", "TEMP_DIR"):
    if _var not in os.environ:
        raise RuntimeError(
            f"{_var} is not set: run torch's suite through"
            " `python -m tests.torch_suite.run_distributed_suite`, which sets BACKEND, WORLD_SIZE and TEMP_DIR"
        )

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if not hasattr(dist.Backend, os.environ["BACKEND"].upper()):
    import hccl  # noqa: F401  - a checkout that is not pip-installed has no torch.backends entry point

from torch.testing._internal.common_distributed import DistTestCases, MultiProcessTestCase  # noqa: E402

# NOTE [hccl's declared features]
# torch's suite decides at import which tests a backend may run from the sets in
# DistTestCases.backend_feature ("Sets showing that something is implemented"; a third-party
# backend adds itself to them). hccl implements DDP and subgroups on CPU tensors as gloo does,
# so it joins "ddp", "subgroup" and "plugin" -- before distributed_test is imported. It does
# not join "gpu"/"cuda": those tests put tensors on CUDA devices. Tests that name gloo itself
# (`BACKEND != "gloo"`, `require_backend_is_available({"gloo"})`) stay skipped for hccl.
if os.environ["BACKEND"] == "hccl":
    for _feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[_feature].add("hccl")
import torch.testing._internal.distributed.distributed_test as _dt  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    Barrier,
    DistributedTest,
    TestDistBackend,
)

__all__ = ["TEST_CLASS", "START_METHOD", "UNGATED", "all_test_names", "main"]

BACKEND = os.environ["BACKEND"]
#: how each test starts its ranks: "forkserver" (default) or "spawn" (torch's own choice);
#: see NOTE [forkserver ranks].
START_METHOD = os.environ.get("TORCH_SUITE_START_METHOD", "forkserver")
if START_METHOD not in ("forkserver", "spawn"):
    raise ValueError(f"TORCH_SUITE_START_METHOD={START_METHOD!r}: use 'forkserver' or 'spawn'")

# NOTE [forkserver ranks]
# torch's harness spawns every rank of every test afresh: each imports torch and the suite
# (about 4 s of CPU here), which would dominate a run on 2 cores. A forkserver that has
# imported this module once forks ready ranks instead. Forked ranks inherit the server's
# environment, not the test's, so TEMP_DIR stays one folder for the whole run (emptied
# before each test) instead of the fresh folder torch's setUp makes per test. For hccl the
# server also imports the process group and the emulator (``hccl.process_group``, which
# imports ``hpu_runtime``), as tests/dist_utils.py's fork server does: otherwise every rank
# of every test imports them at its init_process_group (0.3-1 s of CPU a rank).


def _reset_temp_dir() -> None:
    root = os.environ["TEMP_DIR"]
    for sub in ("barrier", "test_dir", "init_dir"):
        path = os.path.join(root, sub)
        shutil.rmtree(path, ignore_errors=True)
        os.mkdir(path)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """torch's ``TestDistBackendWithSpawn``: each test runs in ``WORLD_SIZE`` new ranks."""

    def setUp(self):
        MultiProcessTestCase.setUp(self)  # TestDistBackend.setUp less its per-test TEMP_DIR
        _reset_temp_dir()
        Barrier.init()
        self.skip_return_code_checks = [self.test_ddp_has_finalized.__wrapped__]
        self._spawn_processes()

    def tearDown(self):
        MultiProcessTestCase.tearDown(self)

    def _spawn_processes(self) -> None:
        if START_METHOD == "spawn":
            return super()._spawn_processes()
        ctx = torch.multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        self._start_processes(ctx.Process)


_PRELOAD = ["tests.torch_suite.spawn_suite", *(["hccl.process_group"] if BACKEND == "hccl" else [])]
"""What the fork server imports before it forks ranks (NOTE [forkserver ranks])."""


# named per backend, as in torch (the spawned ranks find the class by this module-level name)
TestDistBackendWithSpawn.__name__ = TestDistBackendWithSpawn.__qualname__ = f"TestDistBackendWithSpawn{BACKEND.upper()}"
globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn
TEST_CLASS = TestDistBackendWithSpawn


# NOTE [ungated tests]
# Some tests are gated on a list of torch's in-tree backends, not on a capability: "Test
# requires backend hccl to be one of {'gloo'}", "get_future is only supported on mpi, nccl
# and gloo", "GLOO Batch Send Recv CPU", "Only MPI supports CPU all_to_all". Their bodies use
# CPU tensors, so for hccl they run anyway (TORCH_SUITE_UNGATE=0 keeps torch's gates): this
# class gets a copy of the test without torch's skip flag, and UNGATED keeps torch's reason
# (the results say which tests ran ungated). torch keeps one skip reason per test, the last
# decorator's, so a gate may hide another reason (an exact world size, say): a test is
# ungated only if, in a second copy of torch's suite imported as for gloo (or mpi, for the
# MPI-only gates), no decorator skips it. Skips decided inside the ranks (GPU counts, world
# sizes) still apply. A few bodies build their model only under `BACKEND == "gloo"` (their
# CPU branch; _CPU_BRANCH): those run with the suite's BACKEND reading "gloo" inside the
# body, over the hccl process group set up before it.
_GATES = {  # torch's reason -> the backend whose copy of the suite must not skip the test
    r"^Test requires backend \w+ to be one of ": "gloo",
    r"^get_future is only supported on ": "gloo",
    r"^GLOO Batch Send Recv CPU$": "gloo",
    r"^Only Nccl & Gloo backend support DistributedDataParallel$": "gloo",
    r"^Only MPI supports (CPU )?all_to_all": "mpi",
}
_CPU_BRANCH = re.compile(r"^test_accumulate_gradients_no_sync")
UNGATED: dict[str, str] = {}


def _suite_as(backend: str):
    """A second, private copy of torch's distributed_test module, imported with BACKEND=backend."""
    import importlib.util

    spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    module = importlib.util.module_from_spec(spec)
    saved = os.environ["BACKEND"]
    os.environ["BACKEND"] = backend
    try:
        spec.loader.exec_module(module)
    finally:
        os.environ["BACKEND"] = saved
    return module


def _ungated(fn, cpu_branch: bool):
    def run(self):
        if not cpu_branch:
            return fn(self)
        _dt.BACKEND = "gloo"
        try:
            return fn(self)
        finally:
            _dt.BACKEND = BACKEND

    run = functools.wraps(fn)(run)
    run.__unittest_skip__ = False
    return run


if BACKEND == "hccl" and os.environ.get("TORCH_SUITE_UNGATE", "1") != "0":
    _copies: dict = {}
    for _name in dir(DistributedTest._DistTestBase):
        _fn = getattr(DistributedTest._DistTestBase, _name)
        _why = getattr(_fn, "__unittest_skip_why__", "")
        if not (_name.startswith("test_") and getattr(_fn, "__unittest_skip__", False)):
            continue
        _ref = next((b for g, b in _GATES.items() if re.search(g, _why)), None)
        if _ref is None:
            continue
        if _ref not in _copies:
            _copies[_ref] = _suite_as(_ref)
        if getattr(getattr(_copies[_ref].DistributedTest._DistTestBase, _name), "__unittest_skip__", False):
            continue  # skipped for the reference backend too: another reason may hide behind the gate
        _cpu = bool(_CPU_BRANCH.search(_name))
        setattr(TestDistBackendWithSpawn, _name, _ungated(_fn, _cpu))
        UNGATED[_name] = _why + (" (body run through its gloo/CPU branch)" if _cpu else "")
    del _copies


def all_test_names() -> list[str]:
    """Every test method name of torch's ``DistributedTest._DistTestBase``."""
    return sorted(n for n in dir(DistributedTest._DistTestBase) if n.startswith("test_"))


def _short(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else text[: limit // 4] + "\n...\n" + text[-3 * limit // 4 :]


def main(argv: list[str]) -> int:
    import argparse
    import json
    import time
    import unittest

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the results (rewritten after every test)")
    parser.add_argument("names", nargs="+", help="test method names")
    args = parser.parse_args(argv)

    report = {"backend": BACKEND, "world_size": int(os.environ["WORLD_SIZE"]), "results": {}}

    def save() -> None:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.out)

    class Collect(unittest.TestResult):
        def startTest(self, test):
            super().startTest(test)
            self._t0 = time.monotonic()
            name = test.id().rsplit(".", 1)[-1]
            report["running"] = name
            save()
            print(f"[{BACKEND}] {name} ...", end=" ", file=sys.stderr, flush=True)

        def _put(self, test, outcome, message=""):
            name = test.id().rsplit(".", 1)[-1]
            secs = round(time.monotonic() - self._t0, 2)
            report["results"][name] = {"outcome": outcome, "seconds": secs, "message": _short(message)}
            if name in UNGATED:
                report["results"][name]["ungated"] = UNGATED[name]
            report.pop("running", None)
            save()
            print(f"{outcome} ({secs:.1f} s)", file=sys.stderr, flush=True)

        def addSuccess(self, test):
            super().addSuccess(test)
            self._put(test, "passed")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._put(test, "failed", self._exc_info_to_string(err, test))

        def addError(self, test, err):
            super().addError(test, err)
            self._put(test, "failed", self._exc_info_to_string(err, test))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._put(test, "skipped", str(reason))

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._put(test, "passed", "expected failure")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._put(test, "failed", "unexpected success")

    suite = unittest.TestSuite(TEST_CLASS(n) for n in args.names)
    save()
    suite.run(Collect())
    return 0

