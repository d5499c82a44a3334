"""The bucket-size study CLI (launchers.study bucket): files, recommendation, live, Ray, bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from launchers import study

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, *extra, model="resnet50:debug", batch="4", caps="0.01,0.05,1", ws="2,8"):
    out = tmp_path / "study"
    rc = study.main(["bucket", "--model", model, "--batch-size", batch, "--world-sizes", ws,
                     "--bucket-cap-mb", caps, "--topology", "hls2", "--out", str(out), "--no-progress", *extra])
    return rc, out


@pytest.mark.timeout(120)
def test_bucket_study_writes_files_and_a_consistent_recommendation(tmp_path, capsys):
    from hccl.sim.ddp_plan import ddp_buckets
    from hpu_runtime.device.spec import get_device_spec
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    rc, out = _run(tmp_path)
    assert rc == 0, capsys.readouterr().err
    for name in ("study.csv", "study.json", "study.png", "recommendation.md"):
        assert (out / name).stat().st_size > 0
    data = json.loads((out / "study.json").read_text())
    rows = data["rows"]
    keys = {"model", "batch_size", "world_size", "topology", "mode", "bucket_cap_mb", "first_bucket_mb",
            "comm_hook", "lazy_collectives", "gradient_as_bucket_view", "static_graph", "num_buckets",
            "bucket_sizes_bytes", "step_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "graph_launches",
            "samples_per_s_per_card"}
    assert all(keys <= set(r) for r in rows)
    settings = {r["setting"] for r in rows}
    assert {"sweep", "DDP default (25 MB, 1 MB first bucket)", "Gaudi docs: ResNet-50 100 MB",
            "Habana scripts: 256 MB, first bucket 230 MB", "one bucket for all gradients"} <= settings
    assert len(list(csv.DictReader(open(out / "study.csv")))) == len(rows)
    # bucket sizes are DDP's own assignment (checked against DDP itself in tests/unit/test_tracing.py)
    trace = trace_step(resolve_factory("resnet50:debug"), 4, spec=get_device_spec("gaudi2"), autocast=True)
    for r in rows:
        if r["setting"] == "sweep":
            assert r["bucket_sizes_bytes"] == [b.nbytes for b in ddp_buckets(trace, r["bucket_cap_mb"])]
    # the recommendation is the table's best swept cap per world size, its gain against the default row
    recs = {r["world_size"]: r for r in data["recommendation"]}
    assert set(recs) == {2, 8}
    for n, rec in recs.items():
        sweep = [r for r in rows if r["world_size"] == n and r["setting"] == "sweep"]
        best = min(sweep, key=lambda r: (r["step_ns"], r["bucket_cap_mb"]))
        default = next(r for r in rows if r["world_size"] == n and r["setting"].startswith("DDP default"))
        assert rec["best_bucket_cap_mb"] == best["bucket_cap_mb"]
        assert rec["gain_over_default_pct"] == pytest.approx(
            (default["step_ns"] - best["step_ns"]) / default["step_ns"] * 100, abs=1e-3)
        assert f"{n} cards" in (out / "recommendation.md").read_text()
        # the regime the step is in, read off the best row's host and device time
        bound = "host-bound" if best["host_ns"] >= best["compute_ns"] + best["exposed_comm_ns"] else "device-bound"
        assert rec["why"].startswith(f"The step is {bound}"), rec["why"]
    # more buckets, more allreduces: each bucket is one collective and, in lazy mode, one graph cut
    small = min((r for r in rows if r["setting"] == "sweep"), key=lambda r: r["bucket_cap_mb"])
    big = max((r for r in rows if r["setting"] == "sweep"), key=lambda r: r["bucket_cap_mb"])
    assert small["num_buckets"] > big["num_buckets"] and small["graph_launches"] > big["graph_launches"]
    assert "best bucket_cap_mb=" in capsys.readouterr().out


@pytest.mark.timeout(300)
def test_bucket_study_live_points_equal_planned(tmp_path, capsys):
    """--live runs the 2-rank points as torchrun jobs; their steady step equals the planned one."""
    rc, out = _run(tmp_path, "--live", "--live-max-ranks", "2", "--sweep-only", model="mlp:debug", batch="16",
                   caps="0.001", ws="2,8")
    assert rc == 0, capsys.readouterr().err
    rows = json.loads((out / "study.json").read_text())["rows"]
    live = [r for r in rows if "live_step_ns" in r]
    assert [r["world_size"] for r in live] == [2] and len(rows) == 2  # 8 ranks do not fit --live-max-ranks
    assert all(r["live_step_ns"] == r["step_ns"] for r in live)


_USER_MODEL = """
import torch
import torch.nn.functional as F


def factory(batch_size):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 16, 3, padding=1, groups=4), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, 10))
    x, y = torch.randn(batch_size, 3, 16, 16), torch.randint(10, (batch_size,))
    return model, (x,), lambda out: F.cross_entropy(out, y)
"""


@pytest.mark.timeout(300)
def test_bucket_study_live_runs_a_model_of_the_users_own(tmp_path, capsys, monkeypatch):
    """'for MY model, confirmed by real processes': a factory in the user's own module (found in
    the working directory) runs live as models.train --model my_model:factory, and each cap's
    live step equals the planned one."""
    (tmp_path / "my_model.py").write_text(_USER_MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m launchers.study` finds it there
    rc, out = _run(tmp_path, "--live", "--live-max-ranks", "2", "--sweep-only", model="my_model:factory",
                   batch="4", caps="0.001,25", ws="2")
    assert rc == 0, capsys.readouterr().err
    rows = json.loads((out / "study.json").read_text())["rows"]
    assert [r["bucket_cap_mb"] for r in rows] == [0.001, 25.0] and rows[0]["num_buckets"] > rows[1]["num_buckets"]
    assert all(r["live_step_ns"] == r["step_ns"] for r in rows)


@pytest.mark.timeout(200)
def test_bucket_study_compile_mode_traces_per_cap_and_runs_live_in_that_mode(tmp_path, capsys, monkeypatch):
    """--mode compile plans each cap from a step compiled for that cap (DDPOptimizer breaks the
    graph into more pieces at a smaller cap: more compiled regions launched), and --live runs
    models.train --mode compile (live == planned in compile mode: test_live_vs_planned.py; here
    the job's command is captured instead of run)."""
    import subprocess

    from launchers.study import bucket

    commands = []

    def fake_run(cmd, **_kw):
        commands.append(cmd)
        summary = cmd[cmd.index("--summary") + 1]
        steps = int(cmd[cmd.index("--max-steps") + 1])  # the study asks for the steps it planned
        Path(summary).write_text(json.dumps({"epochs": [{"sim_steps": [{"step_ns": 99}] * steps,
                                                          "sim_job_steps": [123] * steps}]}))  # the study varies
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(bucket.subprocess, "run", fake_run)
    rc, out = _run(tmp_path, "--mode", "compile", "--live", "--live-max-ranks", "2", "--sweep-only",
                   caps="1,5", ws="2")
    assert rc == 0, capsys.readouterr().err
    rows = json.loads((out / "study.json").read_text())["rows"]
    assert [(r["mode"], r["bucket_cap_mb"]) for r in rows] == [("compile", 1.0), ("compile", 5.0)]
    assert rows[0]["graph_launches"] > rows[1]["graph_launches"]
    assert len(commands) == 2 and all(c[c.index("--mode") + 1] == "compile" for c in commands)
    assert all(r["live_step_ns"] == 123 for r in rows)


@pytest.mark.timeout(240)
def test_bucket_study_on_an_embedded_ray_cluster(tmp_path, capsys):
    """--ray spreads the points as Ray tasks; the rows equal the local ones."""
    pytest.importorskip("ray")
    rc, out = _run(tmp_path, "--ray", caps="0.05", ws="8")
    assert rc == 0, capsys.readouterr().err
    ray_rows = json.loads((out / "study.json").read_text())["rows"]
    rc, out2 = _run(tmp_path / "local", caps="0.05", ws="8")
    assert rc == 0
    local_rows = json.loads((out2 / "study.json").read_text())["rows"]
    assert ray_rows == local_rows


def _one_box_topology(tmp_path) -> str:
    text = (ROOT / "hccl" / "sim" / "topologies" / "hls2.toml").read_text()
    path = tmp_path / "one_box.toml"
    path.write_text(text.replace('name = "hls2"', 'name = "one-box"\nnum_boxes = 1', 1))
    return str(path)


@pytest.mark.parametrize("args, message", [
    (["--model", "no-such-model"], "registered: .*resnet50"),
    (["--bucket-cap-mb", "0"], r"0 is not a finite number in \(0, "),
    (["--bucket-cap-mb", "inf"], "inf is not a finite number"),
    (["--bucket-cap-mb", ","], "empty list"),
    (["--world-sizes", "0"], r"0 is not in \[1, "),
    (["--topology", "no-such-topology"], "no-such-topology"),
    (["--mode", "turbo"], "unknown mode"),
    (["--mode", "compile", "--bucket-cap-mb", "0.5"], "DDPOptimizer refuses"),
    (["--comm-hook", "int4"], "unknown comm hook"),
    (["--topology", "hls2,hls3", "--device-spec", "gaudi2"], "--topology hls3: no box of the other setting holds"),
])
def test_bucket_study_bad_input_fails_before_work(args, message, tmp_path, capsys):
    base = {"--model": "resnet50:debug", "--batch-size": "4", "--world-sizes": "8", "--bucket-cap-mb": "25",
            "--topology": "hls2", "--out": str(tmp_path / "never")}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    argv = ["bucket", "--no-progress"] + [x for kv in base.items() for x in kv]
    import re

    try:
        rc = study.main(argv)
    except SystemExit as exc:  # argparse rejects malformed lists itself
        rc = exc.code
    assert rc == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "never").exists()


def test_bucket_study_world_size_the_topology_cannot_place(tmp_path, capsys):
    topo = _one_box_topology(tmp_path)
    rc = study.main(["bucket", "--model", "resnet50:debug", "--batch-size", "4", "--world-sizes", "16",
                     "--topology", topo, "--out", str(tmp_path / "never"), "--no-progress"])
    assert rc == 2
    assert "cannot hold world size 16" in capsys.readouterr().err


def test_bucket_study_pairs_each_topology_with_its_own_cards():
    """A box holds cards of one generation: with topologies alone each brings its own card; with
    devices too, each topology is paired with the devices it holds (hccl.sim.topology)."""
    from launchers.study.bucket import StudyConfig, topology_devices

    cfg = StudyConfig(model="mlp:debug", batch_size=4, topologies=("hls2", "hls3", "dl1"), device_specs=())
    assert topology_devices(cfg) == [("hls2", "gaudi2"), ("hls3", "gaudi3"), ("dl1", "gaudi")]
    cfg = StudyConfig(model="mlp:debug", batch_size=4, topologies=("hls1", "hls1h", "hls3"),
                      device_specs=("gaudi", "gaudi3"))
    assert topology_devices(cfg) == [("hls1", "gaudi"), ("hls1h", "gaudi"), ("hls3", "gaudi3")]
