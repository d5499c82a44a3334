"""Shared helpers of the launcher tests: a clean environment, subprocess runs with timeouts,
and checks that a failed job left no process or shared-memory segment behind."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = "tests/integration/scripts/tiny_ddp.py"
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_LAUNCH_PREFIXES = ("OMPI_", "PMI_", "TORCHELASTIC", "RAY_")


def clean_env() -> dict[str, str]:
    """This environment without any launcher's variables, one thread per rank, repo importable."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS and not k.startswith(_LAUNCH_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return env


def free_port() -> int:
    """A TCP port on loopback that nothing listened on a moment ago (for a job's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], timeout: float = 90, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``cmd`` in the repository with :func:`clean_env` (plus ``env``), output captured.

    Raises:
        subprocess.TimeoutExpired: still running after ``timeout`` wall seconds; it was stopped
            as :meth:`Background.kill` stops a job (so torchrun's ranks go with it, where a
            SIGKILL of torchrun alone would leave them running), and the exception carries the
            output so far.
    """
    with Background(cmd, timeout, env) as job:
        return job.result()


class Background:
    """``cmd`` started now (as :func:`run` would run it, output captured); :meth:`result`
    waits for it. Lets a test overlap a reference job with a mostly single-core wait (a Ray
    driver or cluster starting). Never outlives its ``with`` block: killed there if still
    running.

    Output goes to temporary files, not pipes: nobody reads a pipe while the test waits on
    something else, and a job that filled one would stall. ``timeout`` (wall seconds from the
    start) limits the job, not the test's other waits: a job that ended before :meth:`result`
    is called is returned whatever the time (a slow sweep beside a finished reference once made
    the reference look timed out, in CI)."""

    def __init__(self, cmd: list[str], timeout: float = 90, env: dict[str, str] | None = None) -> None:
        self.timeout, self.deadline = timeout, time.monotonic() + timeout
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env={**clean_env(), **(env or {})}, stdout=self._out,
                                     stderr=self._err, text=True)
        self._done: subprocess.CompletedProcess[str] | None = None
        self._expired: subprocess.TimeoutExpired | None = None  # what result() raised, raised again

    def result(self) -> subprocess.CompletedProcess[str]:
        """Waits (until ``timeout`` seconds after the start) and returns the finished process;
        raises ``subprocess.TimeoutExpired`` (the process stopped by :meth:`kill`, its output so
        far attached) if it is still running past it, and again on any later call."""
        if self._done is None and self._expired is None:
            try:
                self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                out, err = self._read()
                self._expired = subprocess.TimeoutExpired(self.proc.args, self.timeout, output=out, stderr=err)
            else:
                self._done = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, *self._read())
        if self._expired is not None:
            raise self._expired
        return self._done

    def _read(self) -> tuple[str, str]:
        texts = []
        for f in (self._out, self._err):
            f.seek(0)
            texts.append(f.read())
            f.close()
        return texts[0], texts[1]

    def kill(self) -> None:
        """SIGTERM (torchrun passes it on to its ranks), SIGKILL 10 s later."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._done is None and self._expired is None:
            self.kill()
            self._out.close()
            self._err.close()


def torchrun_cmd(n: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", *args]


def torchrun(n: int, *args: str) -> subprocess.CompletedProcess[str]:
    return run(torchrun_cmd(n, *args), timeout=150)


def rank_pids(output: str) -> dict[int, int]:
    return {int(r): int(p) for r, p in re.findall(r"rank (\d+) of \d+ is pid (\d+)", output)}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


JOB_SHM_PREFIXES = ("hccl_", "mpich_shm_")


def shm_names(prefixes: tuple[str, ...] = JOB_SHM_PREFIXES) -> set[str]:
    """Shared-memory files a job of ours could leave: hccl's segments and (under mpiexec or
    mpi4py) MPICH's. A test whose job cannot start MPI passes ``("hccl_",)``, so that an MPI
    job running beside it is not counted against it."""
    return {p.name for p in Path("/dev/shm").glob("*") if p.name.startswith(prefixes)}


def _shm_in_use() -> set[str]:
    """Names under /dev/shm that some live process holds open or mapped (read from
    /proc/*/fd and /proc/*/maps). Tests run side by side (pytest -n), so another job's
    segments exist while that job runs: a leak is a segment nobody holds."""
    held: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    held.add(line.split("/dev/shm/", 1)[1].split(" ", 1)[0])
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    held.add(target[len("/dev/shm/"):].split(" ", 1)[0])
        except OSError:  # the process ended while being read
            continue
    return held


def _leaked(before: set[str], prefixes: tuple[str, ...]) -> set[str]:
    listed = shm_names(prefixes) - before
    if not listed:
        return listed
    held = _shm_in_use()
    # listed again after the scan: a segment unlinked meanwhile is not a leak
    return (listed & shm_names(prefixes)) - held


def assert_no_new_shm(before: set[str], within_s: float = 5.0,
                      prefixes: tuple[str, ...] = JOB_SHM_PREFIXES) -> None:
    """No segment created since ``before`` survives unheld: hccl unlinks its segments
    within milliseconds of the rendezvous and MPICH at the end of its job, so a new
    segment that no live process holds past the deadline is a leak. Segments that other
    jobs running side by side still hold are not counted; ``prefixes`` as in :func:`shm_names`."""
    deadline = time.monotonic() + within_s
    while (left := _leaked(before, prefixes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"shared-memory segments left behind: {sorted(left)}"


def assert_all_gone(pids: list[int], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "rank processes left behind"
