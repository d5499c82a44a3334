"""Files the project writes survive a killed or failing writer (NOTE [atomic files] in
hpu_runtime/files.py): the old file or the new one, never a torn one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpu_runtime.files import atomic_open, atomic_write

REPO = Path(__file__).resolve().parents[2]

# the children load hpu_runtime/files.py by path (it is standard library only): no torch import
_LOAD = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("files", sys.argv[2])
files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(files)
"""

_MID_WRITE = _LOAD + r"""
with files.atomic_open(sys.argv[1]) as f:
    f.write('{"new": [' + ",".join(["1"] * 200_000))  # half a JSON document, flushed to the file
    f.flush()
    print("mid", flush=True)
    sys.stdin.readline()  # killed here
    f.write("]}")
"""

_LOOP = _LOAD + r"""
for i in range(10**9):
    files.atomic_write(sys.argv[1], json.dumps({"i": i, "pad": "x" * (i % 7 * 100_000)}))
    print(i, flush=True)
"""


def _start(code: str, target: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, str(target), str(REPO / "hpu_runtime" / "files.py")],
                            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_a_writer_killed_mid_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text(json.dumps({"old": True}))
    target.chmod(0o640)
    proc = _start(_MID_WRITE, target)
    try:
        assert proc.stdout.readline().strip() == "mid"  # the new data is half written
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir() if p.name != "summary.json"][0].startswith(".summary.json.")
    atomic_write(target, json.dumps({"new": True}))
    assert json.loads(target.read_text()) == {"new": True}
    assert target.stat().st_mode & 0o777 == 0o640  # the old file's permissions carry over


@pytest.mark.timeout(120)
@pytest.mark.parametrize("after", [1, 7, 30])
def test_a_writer_killed_at_any_moment_leaves_a_whole_file(tmp_path, after):
    """A writer rewriting its file in a loop, killed after its ``after``-th write: the file is one
    of the documents it wrote, whole."""
    target = tmp_path / "out.json"
    proc = _start(_LOOP, target)
    try:
        for _ in range(after):
            last = int(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    doc = json.loads(target.read_text())
    assert doc["i"] >= last and doc["pad"] == "x" * (doc["i"] % 7 * 100_000)


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "table.csv"
    target.write_text("old\n")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_open(target, newline="") as f:
            f.write("new,half")
            raise RuntimeError("boom")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_new_file_and_binary(tmp_path):
    assert atomic_write(tmp_path / "a.bin", b"\x00\x01").read_bytes() == b"\x00\x01"
    with pytest.raises(ValueError, match="mode must be"):
        with atomic_open(tmp_path / "b", "a"):
            pass
