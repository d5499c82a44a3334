"""``launchers.mpi.abort_job`` lets Hydra read a rank's last stderr line before MPI_Abort."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap

import pytest

from launchers.mpi import _unread_bytes
from tests.integration.launch_helpers import REPO, clean_env


def test_unread_bytes_counts_what_the_reader_has_not_taken() -> None:
    r, w = os.pipe()
    try:
        assert _unread_bytes(w) == 0
        os.write(w, b"x" * 1234)
        assert _unread_bytes(w) == 1234 and _unread_bytes(r) == 1234
        os.read(r, 1000)
        assert _unread_bytes(w) == 234
    finally:
        os.close(r)
        os.close(w)


def test_unread_bytes_of_a_regular_file_is_zero(tmp_path) -> None:
    with open(tmp_path / "f", "wb") as f:
        f.write(b"abc")
        f.flush()
        assert _unread_bytes(f.fileno()) == 0


_CHILD = textwrap.dedent("""
    import os, sys
    from launchers.mpi import abort_job

    class Comm:
        def Abort(self, code):
            os.write(1, b"aborted\\n")
            os._exit(code)

    sys.stderr.write("rank 0: last words\\n")
    os.write(1, b"ready\\n")
    abort_job(Comm(), 7, limit_s=60)
""")


@pytest.mark.timeout(60)
def test_abort_waits_until_the_last_stderr_line_is_read() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], cwd=REPO, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        # While nobody reads stderr, the child must not abort: stdout stays silent.
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        assert not ready, "MPI_Abort was called before the stderr line was read"
        assert proc.stderr.readline() == b"rank 0: last words\n"
        assert proc.stdout.readline() == b"aborted\n"
        assert proc.wait(timeout=30) == 7
    finally:
        proc.kill()
        proc.wait()
