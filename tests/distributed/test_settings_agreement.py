"""Ranks configured apart (NOTE [settings agreement] in hccl/agreement.py): every rank gets the
same error naming the setting and each rank's value when the group is created, on one host
and across two emulated hosts, and the job can still create a group whose settings agree."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from tests.dist_utils import run_ranks

_TOPO = """
name = "mine"
cards_per_box = 8
scale_out_line_rate_gbps = {rate}
"""


def _try_new_group() -> str:
    """Create an hccl group: "no error", or the error's type, how long it took and its text."""
    t0 = time.monotonic()
    try:
        dist.new_group(backend="hccl")
        return "no error"
    except Exception as exc:  # noqa: BLE001 - the test reads the text
        return f"{type(exc).__name__} after {time.monotonic() - t0:.1f}s: {exc}"


def _disagree(rank: int, world: int, tmp: str) -> dict:
    """Create one group per setting, with rank 0 configured apart; return each rank's error."""
    import hpu_runtime

    topo = os.path.join(tmp, f"rank{rank}", "topo.toml")  # one name, a different file per rank
    os.makedirs(os.path.dirname(topo), exist_ok=True)
    with open(topo, "w") as f:
        f.write(_TOPO.format(rate=200.0 if rank == 0 else 100.0))
    alike = os.path.join(tmp, f"alike{rank}.toml")  # the same content under another path and layout
    with open(alike, "w") as f:
        f.write(f"# rank {rank}'s copy\n" + (_TOPO.format(rate=100.0) if rank else _TOPO.format(rate=1e2)))
    cases = {
        "HCCL_ALGO": ("ring", None),
        "PT_HCCL_SLICE_SIZE_MB": ("8", None),
        "HCCL_SHM_BUFFER_MB": ("1", None),
        "HCCL_TOPOLOGY": (topo, topo),  # the content differs
        "same topology": (alike, alike),
        "HPU_DEVICE_SPEC": ("gaudi3", None),
        "HCCL_SIM_*": ("1:2", None),  # the simulated cluster's what-ifs (HCCL_SIM_SLOW_CARD here)
    }
    out = {}
    for case, (mine, others) in cases.items():
        name = {"same topology": "HCCL_TOPOLOGY", "HCCL_SIM_*": "HCCL_SIM_SLOW_CARD"}.get(case, case)
        value = mine if rank == 0 else others
        saved = os.environ.get(name)
        if value is not None:
            os.environ[name] = value
        if name == "HPU_DEVICE_SPEC":  # the device is read once per process: start it afresh
            hpu_runtime.reset_device(value or "gaudi2")
        try:
            out[case] = _try_new_group()
        finally:
            if saved is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = saved
            if name == "HPU_DEVICE_SPEC":
                hpu_runtime.reset_device("gaudi2")
    g = dist.new_group(backend="hccl")  # settings agree again: the job goes on
    t = torch.ones(4)
    dist.all_reduce(t, group=g)
    out["after"] = t.tolist()
    return out


_EXPECTED = {
    "HCCL_ALGO": ["ring on rank(s) 0", "(the selection rule) on rank(s) 1"],
    "PT_HCCL_SLICE_SIZE_MB": ["8 on rank(s) 0", "16 on rank(s) 1"],
    "HCCL_SHM_BUFFER_MB": ["1 on rank(s) 0", "2 on rank(s) 1"],
    "HCCL_TOPOLOGY": ["topo.toml (content "],
    "HPU_DEVICE_SPEC": ["gaudi3 (content ", "gaudi2 (content "],
    "HCCL_SIM_*": ["variability=off;whatif=[('HCCL_SIM_SLOW_CARD', '1:2')] on rank(s) 0", "variability=off;whatif=[] on rank(s) 1"],
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env", [{}, {"RANKS_PER_HOST": "1", "HCCL_HOST_ID": "host{host}"}],
                         ids=["one-host", "two-hosts"])
def test_every_rank_names_the_setting_and_each_value(env, tmp_path):
    res = run_ranks(_disagree, 2, str(tmp_path), env=env, pg_timeout=60, timeout=110)
    for rank, r in enumerate(res):
        for name, parts in _EXPECTED.items():
            text = r[name]
            assert text.startswith("SettingsMismatchError"), (rank, name, text)
            assert f"{name}: " in text and all(p in text for p in parts), (rank, name, text)
            assert "timed out" not in text, text
        assert "rank0/topo.toml (content " in r["HCCL_TOPOLOGY"], r
        assert "rank1/topo.toml (content " in r["HCCL_TOPOLOGY"], r
        assert r["same topology"] == "no error"
        assert r["after"] == [2.0] * 4
    for name in _EXPECTED:  # the same message on every rank
        assert res[0][name].split(": ", 1)[1] == res[1][name].split(": ", 1)[1], name


def _card_of_another_generation(rank: int, world: int, tmp: str) -> dict:
    """Every rank asks for Gaudi 2 cards in HLS-3 boxes (settings that agree across ranks but
    not with each other); then a topology file of Gaudi 3 boxes with no card named (the bridge
    reads no topology file: its card stays Gaudi 2); then the HLS-3 box alone, whose card
    follows it."""
    import hpu_runtime

    out = {}
    os.environ.update(HPU_DEVICE_SPEC="gaudi2", HCCL_TOPOLOGY="hls3")
    hpu_runtime.reset_device("gaudi2")
    out["both given"] = _try_new_group()
    del os.environ["HPU_DEVICE_SPEC"]
    topo = os.path.join(tmp, f"g3-{rank}.toml")
    with open(topo, "w") as f:
        f.write('generation = "gaudi3"\ncards_per_box = 8\nscale_out_line_rate_gbps = 200.0\n')
    os.environ["HCCL_TOPOLOGY"] = topo
    out["file card"] = hpu_runtime.reset_device(None).spec.name
    out["file"] = _try_new_group()
    os.environ["HCCL_TOPOLOGY"] = "hls3"
    out["card"] = hpu_runtime.reset_device(None).spec.name  # the device follows the built-in server's name
    g = dist.new_group(backend="hccl")
    t = torch.ones(4)
    dist.all_reduce(t, group=g)
    out["after"] = t.tolist()
    del os.environ["HCCL_TOPOLOGY"]
    hpu_runtime.reset_device("gaudi2")
    return out


@pytest.mark.timeout(120)
def test_a_card_the_topologys_boxes_do_not_hold_is_refused_on_every_rank(tmp_path):
    """A box holds cards of one generation: a group on boxes of another generation than the
    card fails on every rank within seconds, naming both and what to set."""
    res = run_ranks(_card_of_another_generation, 2, str(tmp_path), pg_timeout=60, timeout=110)
    for r in res:
        for case, given, box, fix in (("both given", "gaudi2", "'hls3'", ""),
                                      ("file", "unset", "g3-", "set HPU_DEVICE_SPEC=gaudi3")):
            text = r[case]
            assert text.startswith("ValueError after "), text
            assert float(text.split("after ", 1)[1].split("s:", 1)[0]) < 10, text
            assert f"card is a gaudi2 (HPU_DEVICE_SPEC={given})" in text and "is a box of gaudi3 cards" in text, text
            assert box in text and fix in text, text
        assert r["file card"] == "gaudi2" and r["card"] == "gaudi3" and r["after"] == [2.0] * 4
