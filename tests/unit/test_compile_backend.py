"""``torch.compile(backend="hpu_backend")``: AOTAutograd's forward and backward graphs as recipes.

References: gradients against the same model run by plain PyTorch (no bridge); recipe and
launch counts against what the documented behaviour says (one recipe per graph, compiled
once, recompiled on a new shape or a guard failure).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import hpu_runtime as hpu
from hpu_runtime.bridge.compile_backend import BACKWARD, FORWARD
from tests.dist_utils import run_ranks


class Net(nn.Module):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)
        self.scale = scale  # a Python constant dynamo specializes on (a guard)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


@pytest.fixture
def eager_device(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    torch._dynamo.reset()
    dev = hpu.reset_device("gaudi2")
    yield dev
    monkeypatch.undo()
    hpu.reset_device("gaudi2")


def _step(model, x):
    for p in model.parameters():
        p.grad = None
    loss = model(x).square().mean()
    loss.backward()
    return loss


def _regions(dev) -> list[tuple[str, int]]:
    return [(g.reason, g.ops) for g in dev.graph_log if g.reason != "eager"]


def test_forward_and_backward_are_one_recipe_each(eager_device):
    """Each step: one forward and one backward region (AOTAutograd's two graphs), compiled at
    the first step only, no per-op host cost inside; gradients equal plain PyTorch's."""
    dev = eager_device
    torch.manual_seed(0)
    model = Net().to("hpu")
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="hpu_backend")
    compiles = []
    for i in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        dev.graph_log = []
        before = dev.compilations
        _step(compiled, x.to("hpu"))
        compiles.append(dev.compilations - before)
        assert [r for r, _ in _regions(dev)] == [FORWARD, BACKWARD]
        with hpu.bridge_disabled():
            _step(ref, x.to("hpu"))
    assert compiles[0] > 0 and compiles[1:] == [0, 0]  # the regions (and the eager ops) hit the cache
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    # inside a region ops accumulate with no per-op host cost: a region costs one launch
    with torch.no_grad():
        x = torch.randn(4, 8).to("hpu")
        compiled(x)  # inference graph: compiled now
        h0 = dev.host_ns
        compiled(x)
    assert dev.host_ns - h0 == dev.spec.graph_launch_ns


def test_new_shape_and_guard_failure_recompile_and_are_charged(eager_device):
    """A new batch size, and a changed Python constant (a guard failure), each give new graphs:
    compiled (and charged on the host) once, cache hits after."""
    dev = eager_device
    model = Net().to("hpu")
    compiled = torch.compile(model, backend="hpu_backend", dynamic=False)
    x4, x6 = torch.randn(4, 8).to("hpu"), torch.randn(6, 8).to("hpu")
    _step(compiled, x4)

    def region_compiles(x) -> int:
        dev.graph_log = []
        before = dev.compilations
        _step(compiled, x)
        eager_ops = sum(1 for g in dev.graph_log if g.reason == "eager")
        return dev.compilations - before, eager_ops

    assert region_compiles(x4)[0] == 0
    new_shape, eager_ops = region_compiles(x6)
    assert new_shape >= 2 and new_shape - eager_ops <= 2  # forward and backward regions recompiled
    assert region_compiles(x6)[0] == 0
    model.scale = 2.0  # dynamo's guard on the constant fails: new graphs with 2.0 baked in
    assert region_compiles(x4)[0] == 2
    assert region_compiles(x4)[0] == 0


def test_ops_outside_compiled_regions_run_eagerly(eager_device):
    """The uncompiled loss and optimizer launch op by op (PT_HPU_LAZY_MODE=0), between regions."""
    dev = eager_device
    model = Net().to("hpu")
    compiled = torch.compile(model, backend="hpu_backend")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8).to("hpu")
    for _ in range(2):
        dev.graph_log = []
        _step(compiled, x)
        opt.step()
    reasons = [g.reason for g in dev.graph_log]
    assert reasons.index(FORWARD) < reasons.index(BACKWARD)
    between = reasons[reasons.index(FORWARD) + 1:reasons.index(BACKWARD)]
    after = reasons[reasons.index(BACKWARD) + 1:]
    assert between and set(between) == {"eager"} and all(g.ops == 1 for g in dev.graph_log if g.reason == "eager")
    assert len(after) == len(list(model.parameters()))  # SGD without momentum: one add_ per parameter


def _compiled_autograd(rank, world):
    import os

    import torch
    from torch import nn

    import hpu_runtime as hpu
    from habana_frameworks.torch.dynamo.compile_backend.experimental import enable_compiled_autograd

    os.environ["PT_HPU_LAZY_MODE"] = "0"
    dev = hpu.reset_device("gaudi2")
    enable_compiled_autograd()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to("hpu")
    compiled = torch.compile(model, backend="hpu_backend")
    x = torch.randn(4, 8).to("hpu")
    for _ in range(2):
        dev.graph_log = []
        compiled(x).square().mean().backward()
    return {"regions": [g.reason for g in dev.graph_log if g.reason != "eager"],
            "grads": [p.grad.tolist() for p in model.parameters()], "x": x.tolist(),
            "state": {k: v.tolist() for k, v in model.state_dict().items()}}


@pytest.mark.timeout(120)
def test_enable_compiled_autograd_compiles_backward_as_one_region():
    """With Gaudi's ``enable_compiled_autograd()`` the whole backward (the loss's too, and the
    gradient accumulation) is one compiled region; gradients equal plain PyTorch's. (In a
    fresh process: it changes dynamo's process-wide settings, as on Gaudi.)"""
    (out,) = run_ranks(_compiled_autograd, 1, backend=None, timeout=100)
    assert out["regions"] == [FORWARD, BACKWARD]
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model.load_state_dict({k: torch.tensor(v) for k, v in out["state"].items()})
    x = torch.tensor(out["x"])
    with hpu.bridge_disabled():
        for _ in range(2):
            model(x).square().mean().backward()
    for p, g in zip(model.parameters(), out["grads"]):
        torch.testing.assert_close(p.grad, torch.tensor(g))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # importing inductor: torch.jit.script_method's
def test_default_inductor_refuses_hpu_naming_hpu_backend(eager_device):
    """Intel's support matrix: torch.compile(backend="inductor") is unsupported on Gaudi, the
    backend "must be set as hpu_backend". Inductor given hpu tensors says so, before any code
    generation (it used to fail inside it with ``KeyError: 'hpu'``); the same model compiles
    with hpu_backend."""
    torch.manual_seed(0)
    model = Net().to("hpu")
    x = torch.randn(4, 8, device="hpu")
    with pytest.raises(Exception, match='backend="hpu_backend"') as err:
        torch.compile(model)(x)
    assert "KeyError" not in str(err.value)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(model, backend="hpu_backend")(x).cpu(), model(x).cpu())


def test_lazy_mode_warns_once_that_gaudi_runs_hpu_backend_in_eager_mode(eager_device, monkeypatch):
    """hpu_backend with PT_HPU_LAZY_MODE=1 warns once per process, naming the variable Gaudi's
    support matrix asks for; in eager mode (PT_HPU_LAZY_MODE=0) it does not warn."""
    import warnings

    from hpu_runtime.bridge import compile_backend

    monkeypatch.setattr(compile_backend, "_warned_lazy", False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning fails the eager-mode compile
            torch.compile(Net(), backend="hpu_backend")(torch.randn(4, 8))
        monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
        torch._dynamo.reset()
        hpu.reset_device("gaudi2")
        with pytest.warns(UserWarning, match="PT_HPU_LAZY_MODE=0"):
            torch.compile(Net(), backend="hpu_backend")(torch.randn(4, 8))
        torch._dynamo.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per process
            torch.compile(Net(2.0), backend="hpu_backend")(torch.randn(4, 8))
    finally:
        torch._dynamo.reset()
