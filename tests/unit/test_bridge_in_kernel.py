"""The bridge called from the hpu kernel (NOTE [the bridge in the kernel] in hpu_runtime.bridge.dispatch).

References are torch's own behaviour with no dispatch mode on (what a Gaudi runs) and op
counts worked out by hand from the ops each case dispatches.
"""

from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

import hpu_runtime as hpu
from hpu_runtime.bridge.dispatch import charged_as_one_op


def _keys(dev) -> list[str]:
    """The op names of the pending graph's key, views included."""
    return [k[0] for k in dev.launcher._keys]


def test_ops_are_charged_with_no_dispatch_mode_on_and_take_the_paths_a_gaudi_takes():
    """No Python mode on the stack, and the reshape of a transposed tensor that a view can
    express is torch's _reshape_alias, as with no mode on (a mode makes torch treat every
    tensor as a subclass and use view)."""
    dev = hpu.reset_device("gaudi2")
    a = torch.randn(4, 6, device="hpu")
    assert _get_current_dispatch_mode() is None
    before = dev.ops_recorded
    b = (a + 1).t().reshape(3, 2, 4)  # dims (6, 4) with strides (1, 6): 6 splits into (3, 2)
    assert dev.ops_recorded == before + 1  # the add; the transpose and the reshape are views
    assert _keys(dev)[-3:] == ["aten.add.Tensor", "aten.t.default", "aten._reshape_alias.default"]
    assert torch.equal(b.cpu(), (a.cpu() + 1).t().reshape(3, 2, 4))


def test_parameters_and_subclasses_of_hpu_tensors_under_the_bridge():
    """torch's Parameter(...) and as_subclass detach or alias the tensor with dispatch modes
    stashed and give the result its first Python object: the hooks must not have made one."""

    class Marked(torch.Tensor):
        pass

    hpu.reset_device("gaudi2")
    data = torch.arange(6.0, device="hpu")
    p = torch.nn.Parameter(torch.empty(3, device="hpu"))
    m = data.as_subclass(Marked)
    assert isinstance(p, torch.nn.Parameter) and p.device.type == "hpu" and p.requires_grad
    assert type(m) is Marked and torch.equal(m.cpu(), torch.arange(6.0))


def test_a_python_kernel_is_one_op_and_its_body_is_unseen():
    """A custom op whose body runs three ops: one op record with its hpu kernel wrapped, three
    without (its composite body then reaches the kernel op by op)."""
    lib = "hpu_test_kernel_hooks"

    @torch.library.custom_op(f"{lib}::scaled_sum", mutates_args=())
    def scaled_sum(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x * 2 + y).relu()

    @torch.library.custom_op(f"{lib}::scaled_sum_one", mutates_args=())
    def scaled_sum_one(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x * 2 + y).relu()

    scaled_sum_one.register_kernel("hpu", charged_as_one_op(scaled_sum_one._opoverload, scaled_sum_one._init_fn))
    dev = hpu.reset_device("gaudi2")
    x, y = torch.randn(8, device="hpu"), torch.randn(8, device="hpu")
    n = dev.ops_recorded
    unwrapped = scaled_sum(x, y)
    assert dev.ops_recorded == n + 3  # mul, add, relu
    n = dev.ops_recorded
    wrapped = scaled_sum_one(x, y)
    assert dev.ops_recorded == n + 1 and _keys(dev)[-1] == f"{lib}.scaled_sum_one.default"
    assert torch.equal(wrapped.cpu(), unwrapped.cpu())
    # a profile holds the op the script called, not its body (the reference: the unwrapped op's
    # body, which the profiler records as torch does)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        scaled_sum_one(x, y)
    names = {e.key for e in prof.key_averages()}
    assert f"{lib}::scaled_sum_one" in names and "aten::mul" not in names
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        scaled_sum(x, y)
    assert "aten::mul" in {e.key for e in prof.key_averages()}


def test_hooks_are_off_on_other_threads_and_under_bridge_disabled():
    dev = hpu.reset_device("gaudi2")
    a = torch.randn(16, device="hpu")
    n = dev.ops_recorded
    done = []
    t = threading.Thread(target=lambda: done.append((a * 3).sum()))
    t.start()
    t.join(timeout=60)
    assert done and dev.ops_recorded == n  # the bridge is the importing thread's
    with hpu.bridge_disabled():
        a * 3
    assert dev.ops_recorded == n
    a * 3
    assert dev.ops_recorded == n + 1


def test_host_to_device_copies_are_one_transfer_each():
    """.to("hpu"), torch.tensor(..., device="hpu") and hpu.copy_(host) are each one host->device
    copy of their bytes and no op; a device->device copy_ is an op."""
    dev = hpu.reset_device("gaudi2")
    z = torch.empty(32, device="hpu")
    ops = dev.ops_recorded
    dev.log = []
    host = torch.randn(32)
    x = host.to("hpu")
    y = torch.tensor([1.0, 2.0], device="hpu")
    z.copy_(host)
    assert dev.ops_recorded == ops
    assert [e for e in dev.log if e[0] != "mark"] == [("h2d", 128), ("h2d", 8), ("h2d", 128)]
    z.copy_(x)
    assert dev.ops_recorded == ops + 1
    dev.log = None
    assert torch.equal(z.cpu(), host) and torch.equal(y.cpu(), torch.tensor([1.0, 2.0]))
