"""The calibrated constants of the device model and the seed's host-time measurement.

:data:`CONSTANTS` are the ``DeviceSpec`` fields fitted to published throughput of runs whose
host is off the critical path (NOTE [calibration] in :mod:`hpu_runtime.device.spec`), each on
one row of :data:`models.published_runs.ROWS`; :func:`fit_device_constants` fits them again.
:func:`seed_host_ms` runs the seed "HPU Graphs for Training" MNIST ``Net`` in its three
variants (no HPU graphs, ``make_graphed_callables``, capture/replay) and
:func:`fit_host_constants` solves the host costs from its three published times (NOTE [host
costs]). Simulated times are integer ns (ms where named).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .published_runs import ROWS, Row, load_figures, published_figure, simulate_row

__all__ = ["CONSTANTS", "SEED_HOST_MS", "Calibrated", "fit_device_constants", "fit_host_constants", "seed_host_ms"]


@dataclass(frozen=True, slots=True)
class Calibrated:
    """A device constant fitted to one published figure (NOTE [calibration] in
    :mod:`hpu_runtime.device.spec`)."""

    field: str
    """The ``DeviceSpec`` field."""
    devices: tuple[str, ...]
    """The generations whose spec takes the fitted value."""
    row: int
    """Index in :data:`ROWS` of the figure it is fitted on."""
    bounds: tuple[float, float]
    """Where the fit searches."""
    rises: bool = True
    """Throughput rises with the constant (an efficiency); else it falls (a tile size)."""

    @property
    def name(self) -> str:
        return f"{self.field} ({', '.join(self.devices)})"


CONSTANTS: tuple[Calibrated, ...] = (
    Calibrated("mme_efficiency", ("gaudi2", "gaudi3"), 2, (0.05, 1.0)),
    Calibrated("mme_tile", ("gaudi2", "gaudi3"), 1, (1, 2048), rises=False),
    Calibrated("mme_efficiency", ("gaudi",), 7, (0.05, 1.0)),
    Calibrated("mme_tile", ("gaudi",), 4, (1, 2048), rises=False),
    Calibrated("op_overhead_ns", ("gaudi",), 6, (0, 200_000), rises=False),
)
"""The calibrated device constants, each fitted on one figure; every other row is a prediction."""

SEED_HOST_MS = {"lazy": 4.8, "make_graphed_callables": 3.9, "capture/replay": 1.3}
"""Seed hpu-graphs-for-training: host time per step of its MNIST Net on first-gen Gaudi, ms."""


def _spec(values: dict, device: str):
    """The device's spec with the calibrated constants in ``values`` (keyed like
    :data:`CONSTANTS`) that apply to it."""
    from hpu_runtime.device.spec import get_device_spec

    return dataclasses.replace(get_device_spec(device), **{c.field: values[c] for c in CONSTANTS
                                                          if device in c.devices and c in values})


def _ratio(row: Row, figures: list[dict], cache: dict, values: dict) -> float:
    fig = published_figure(figures, row)
    published = fig["throughput_samples_per_s"] / (1 if fig.get("per_card") else row.cards)
    return simulate_row(row, cache, _spec(values, row.device)).samples_per_s / published


def fit_device_constants(rounds: int = 3, cache: dict | None = None, log=print) -> dict:
    """Fit :data:`CONSTANTS` jointly: each by bisection on its own figure (simulated /
    published = 1), the others held, for ``rounds`` rounds. Returns ``{Calibrated: value}``."""
    from hpu_runtime.device.spec import get_device_spec

    figures = load_figures()
    cache = {} if cache is None else cache
    values = {c: getattr(get_device_spec(c.devices[0]), c.field) for c in CONSTANTS}
    for r in range(rounds):
        for c in CONSTANTS:
            row = ROWS[c.row]
            whole = isinstance(c.bounds[0], int)
            lo, hi = c.bounds
            for _ in range(20):
                mid = (lo + hi) // 2 if whole else (lo + hi) / 2
                if (_ratio(row, figures, cache, {**values, c: mid}) < 1.0) == c.rises:
                    lo = mid
                else:
                    hi = mid
                if whole and hi - lo <= 1:
                    break
            values[c] = (lo + hi) // 2 if whole else round((lo + hi) / 2, 4)
            log(f"  round {r + 1}: {c.name} = {values[c]} (on {row.label})")
    return values


def fit_host_constants(device: str = "gaudi") -> dict:
    """Solve the host costs from the seed's three host times (NOTE [host costs] in
    :mod:`hpu_runtime.device.spec`): per variant, the mechanism counts of one steady step
    (accumulated ops, launches + replays, host->device copies) times the unknowns equal the
    published time less the PCIe bytes' time. Returns ``host_op_ns``, ``graph_launch_ns``
    (= ``graph_replay_ns``) and ``h2d_copy_ns`` (= ``host_read_ns``)."""
    import numpy as np

    counts = seed_host_ms(device, counts=True)
    a = np.array([[c["ops"], c["launches"] + c["replays"], c["copies"]] for c in counts.values()], dtype=float)
    b = np.array([SEED_HOST_MS[k] * 1e6 - c["pcie_ns"] for k, c in counts.items()])
    op, launch, copy = np.linalg.solve(a, b)
    return {"host_op_ns": round(op), "graph_launch_ns": round(launch), "h2d_copy_ns": round(copy)}


def seed_host_ms(device: str = "gaudi", batch: int = 200, steps: int = 4, counts: bool = False) -> dict:
    """Simulated host time per step (ms) of the seed's MNIST Net in its three variants; with
    ``counts``, each variant's mechanism counts per steady step instead (``ops``,
    ``launches``, ``replays``, ``copies``, ``pcie_ns``, ``host_ns``)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    import hpu_runtime as hpu
    from hpu_runtime.device.cost_model import pcie_ns

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.dropout = nn.Linear(784, 128), nn.Linear(128, 10), nn.Dropout(0.5)

        def forward(self, x):
            x = self.dropout(F.relu(self.fc1(torch.flatten(x, 1))))
            return F.log_softmax(self.fc2(x), dim=1)

    g = torch.Generator().manual_seed(0)
    with hpu.bridge_disabled():
        data = [(torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g))
                for _ in range(steps + 3)]
    out = {}
    for variant in SEED_HOST_MS:
        dev = hpu.reset_device(device)
        torch.manual_seed(0)
        model = Net().to("hpu")
        opt = torch.optim.Adadelta(model.parameters(), lr=0.1)
        if variant == "capture/replay":
            si = torch.randn(batch, 1, 28, 28, device="hpu")
            st = torch.randint(0, 10, (batch,), device="hpu")
            opt.zero_grad(set_to_none=True)
            graph = hpu.HPUGraph()
            with hpu.graph(graph):
                F.nll_loss(model(si), st).backward()
                opt.step()

            def step(x, y):
                si.copy_(x.to("hpu"))
                st.copy_(y.to("hpu"))
                graph.replay()
        else:
            fwd = model if variant == "lazy" else hpu.make_graphed_callables(
                model, (torch.randn(batch, 1, 28, 28, device="hpu"),))

            def step(x, y):
                x, y = x.to("hpu"), y.to("hpu")
                opt.zero_grad(set_to_none=True)
                F.nll_loss(fwd(x), y).backward()
                hpu.mark_step()
                opt.step()
                hpu.mark_step()
        for x, y in data[:3]:
            step(x, y)
        dev.begin_step()
        hosts = []
        for x, y in data[3:]:
            before = (dev.ops_recorded, dev.graphs_launched, dev.replays)
            dev.log = []
            step(x, y)
            copies = [ev[1] for ev in dev.log if ev[0] == "h2d"]
            dev.log = None
            hosts.append(dev.end_step().host_ns)
            after = (dev.ops_recorded, dev.graphs_launched, dev.replays)
        if len(set(hosts[-2:])) != 1:
            raise RuntimeError(f"{variant}: no steady state in {steps} steps: host ns {hosts}")
        if counts:
            ops, launches, replays = (a - b for a, b in zip(after, before))
            out[variant] = {"ops": ops, "launches": launches, "replays": replays, "copies": len(copies),
                            "pcie_ns": sum(pcie_ns(dev.spec, n) for n in copies), "host_ns": hosts[-1]}
        else:
            out[variant] = hosts[-1] / 1e6
    hpu.reset_device()
    return out
