"""The scaling study CLI (launchers.study scale): files, rows, causes that add up, bad input."""

from __future__ import annotations

import csv
import json

import pytest

from launchers import study


@pytest.mark.timeout(180)
def test_scale_study_end_to_end(tmp_path, capsys):
    """A debug model from 8 to 512 cards: every file, one row per world size, efficiency 1 at the
    smallest, and the loss's causes adding up to 100 x (1 - efficiency)."""
    out = tmp_path / "scale"
    argv = ["scale", "--model", "resnet50:debug", "--batch-size", "4", "--world-sizes", "8,64,512",
            "--topology", "hls2", "--steps", "4", "--no-progress"]
    rc = study.main([*argv, "--out", str(out), "--jobs", "1"])
    assert rc == 0, capsys.readouterr().err
    for name in ("study.csv", "study.json", "study.png", "summary.md"):
        assert (out / name).stat().st_size > 0
    data = json.loads((out / "study.json").read_text())
    rows = data["rows"]
    assert [r["world_size"] for r in rows] == [8, 64, 512]
    assert len(list(csv.DictReader(open(out / "study.csv")))) == 3
    assert rows[0]["efficiency"] == 1.0
    for r in rows:
        assert r["step_median_ns"] <= r["step_p99_ns"] and r["steps_sampled"] == 4
        lost = sum(r[f"loss_{c}_pts"] for c in ("comm", "batch", "congestion", "waiting"))
        assert lost == pytest.approx(100 * (1 - r["efficiency"]), abs=1e-6)
        assert r["samples_per_s_per_card"] == pytest.approx(4 * 1e9 / r["step_mean_ns"])
    assert rows[-1]["step_p99_ns"] > rows[-1]["step_median_ns"]  # variability on: the sampled steps differ
    text = (out / "summary.md").read_text()
    assert "variability: seed 0" in text and "what-ifs: none" in text and "512 |" in text
    assert "the mean of 4 steps after a host sync" in text  # the stretch the waiting is averaged over
    # the same study planned by two worker processes (--jobs, as large studies run by default)
    assert study.main([*argv, "--out", str(tmp_path / "jobs2"), "--jobs", "2"]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "jobs2" / "study.json").read_text())["rows"] == rows


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, match", [
    (["--world-sizes", "8", "--topology", "nosuch"], "unknown topology 'nosuch'"),
    (["--world-sizes", "8,8"], "repeat"),
    (["--world-sizes", "8", "--global-batch", "12"], "one of them"),
    (["--world-sizes", "8", "--slow-card", "9:2"], "outside the job"),
    (["--world-sizes", "8", "--variability", "jitter=2"], "jitter"),
    (["--world-sizes", "8", "--device-spec", "gaudi2", "--topology", "hls3"], "is a box of gaudi3 cards"),
    (["--world-sizes", "8", "--variability", "off", "--stretches", "2"], "from the variability, which is off"),
])
def test_scale_study_refuses_bad_input(tmp_path, capsys, argv, match):
    """Bad input: exit code 2 and a message naming it, before any work (no output files)."""
    out = tmp_path / "scale"
    args = ["scale", "--model", "mlp:debug", "--batch-size", "8", "--out", str(out), "--no-progress", *argv]
    assert study.main(args) == 2
    assert match in capsys.readouterr().err
    assert not out.exists()


def test_scale_study_refuses_zero_jobs(tmp_path, capsys):
    """``--jobs 0`` is a usage error naming the flag (argparse's exit code 2), before any work."""
    with pytest.raises(SystemExit) as exc:
        study.main(["scale", "--model", "mlp:debug", "--batch-size", "8", "--world-sizes", "8", "--jobs", "0",
                    "--out", str(tmp_path / "scale"), "--no-progress"])
    assert exc.value.code == 2 and "argument --jobs: 0 is not in [1, 1,024] jobs" in capsys.readouterr().err
    assert not (tmp_path / "scale").exists()
    with pytest.raises(SystemExit) as exc:
        study.main(["scale", "--model", "mlp:debug", "--batch-size", "8", "--world-sizes", "8", "--stretches", "0",
                    "--out", str(tmp_path / "scale"), "--no-progress"])
    assert exc.value.code == 2 and "argument --stretches: 0 is not in [1, 1,000] stretches" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_stretches_pool_the_steps_of_separate_studies(tmp_path, capsys):
    """``--stretches 3`` (planned by two worker processes, a stretch of a world size each) gives
    what three one-stretch studies give with the variability's stretches 0, 1 and 2: per world
    size their mean steps, a mean over all their steps, and the efficiency's range from theirs;
    the summary and the files say so."""
    import dataclasses

    from hccl.sim.cluster import Cluster
    from hccl.sim.variability import DEFAULT
    from launchers.study.scale import ScaleConfig, run_scale

    kw = dict(model="resnet50:debug", batch_size=4, world_sizes=(8, 64, 512), topology="hls2", steps=4)
    single = [run_scale(ScaleConfig(**kw, condition=Cluster(dataclasses.replace(DEFAULT, stretch=k))),
                        progress=False, jobs=1) for k in range(3)]
    out = tmp_path / "pooled"
    rc = study.main(["scale", "--model", "resnet50:debug", "--batch-size", "4", "--world-sizes", "8,64,512",
                     "--topology", "hls2", "--steps", "4", "--stretches", "3", "--no-progress", "--jobs", "2",
                     "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = json.loads((out / "study.json").read_text())["rows"]
    for i, r in enumerate(rows):
        means = [s[i]["step_mean_ns"] for s in single]
        assert r["stretch_means_ns"] == means and r["steps_sampled"] == 12
        assert abs(r["step_mean_ns"] - sum(means) / 3) <= 1  # 12 steps' mean (ns, floored)
        effs = [s[i]["efficiency"] for s in single]
        assert (r["efficiency_min"], r["efficiency_max"]) == pytest.approx((min(effs), max(effs)), rel=1e-12)
        assert r["efficiency_min"] - 1e-9 <= r["efficiency"] <= r["efficiency_max"] + 1e-9
    assert rows[-1]["efficiency_min"] < rows[-1]["efficiency_max"]  # the stretches differ
    text = (out / "summary.md").read_text()
    assert "3 stretches of 4 steps" in text and "range over stretches" in text
    assert "efficiency_min" in (out / "study.csv").read_text().splitlines()[0]


@pytest.mark.timeout(120)
def test_scale_study_plans_the_cards_its_topology_holds(tmp_path, capsys):
    """``--topology hls3`` alone plans Gaudi 3 cards (an HLS-3 box holds nothing else), and
    ``--device-spec gaudi`` alone plans them in an HLS-1 box."""
    for flags, device, topology in ((["--topology", "hls3"], "gaudi3", "hls3"),
                                    (["--device-spec", "gaudi"], "gaudi", "hls1")):
        out = tmp_path / device
        rc = study.main(["scale", "--model", "mlp:debug", "--batch-size", "8", "--world-sizes", "8", "--steps", "1",
                         "--no-progress", "--jobs", "1", "--out", str(out), *flags])
        assert rc == 0, capsys.readouterr().err
        config = json.loads((out / "study.json").read_text())["config"]
        assert (config["device_spec"], config["topology"]) == (device, topology)
