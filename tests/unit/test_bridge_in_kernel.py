"""The bridge called from the hpu kernel (NOTE [the bridge in the kernel] in hpu_runtime.bridge.dispatch).

References are torch's own behaviour with no dispatch mode on (what a Gaudi runs) and op
counts worked out by hand from the ops each case dispatches.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
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


class _SpyHooks:
    """The kernel's hooks with a spy on the before hook: each call's op, its signature as
    :func:`~hpu_runtime.bridge.graph_key.op_signature` computes it from the arguments Python
    got, the entry the kernel handed in (None on a signature's first call) and what the hook
    returned.
    ``kernel_check=False``: the kernel has no device (it neither compares a kept entry's output
    bytes with the free HBM nor makes op records itself), so the before hook sees every call
    that has something to check."""

    def __init__(self, kernel_check: bool = True) -> None:
        from hpu_runtime.bridge import dispatch, runtime
        from hpu_runtime.bridge.graph_key import op_signature

        self.calls = []
        before = dispatch._before

        def spy(func, args, kwargs, entry=None):
            call = [str(func), op_signature(args, kwargs), entry, None]
            self.calls.append(call)
            call[3] = before(func, args, kwargs, entry)
            return call[3]

        self._dispatch, self._spy = dispatch, spy
        self._python_only = runtime.python_hooks_only() if not kernel_check else None

    def __enter__(self):
        lib = self._dispatch._kernel_hooks()
        lib.hpu_sim_set_hooks(self._spy, self._dispatch._after, self._dispatch.OpEntry)
        if self._python_only is not None:
            self._python_only.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        d = self._dispatch
        lib = d._kernel_hooks()
        lib.hpu_sim_set_hooks(d._before, d._after, d.OpEntry)
        if self._python_only is not None:
            self._python_only.__exit__(*exc)


def test_the_kernel_hands_back_an_op_entry_exactly_when_the_signature_recurs():
    """The kernel keeps the bridge's entry per (op, signature) and hands it back on a later call
    whose signature is equal up to the Python numbers at the op's scalar inputs (graph inputs in
    lazy mode: NOTE [scalars as graph inputs]), whose type and whether they are 1 still count.
    The reference, worked out by hand from the ops' schemas: ``x * 3.0`` shares ``x * 2.0``'s
    entry (a wrapped number) and ``add(alpha=3)`` shares ``add(alpha=2)``'s; another shape, an
    int where a float was, ``alpha=1`` (a unit's 1 stays a constant), another dtype and another
    value of ``pow``'s exponent (a Scalar constant) each get an entry of their own."""
    hpu.reset_device("gaudi2")
    x, y = torch.randn(4, 3, device="hpu"), torch.randn(5, 3, device="hpu")
    with _SpyHooks(kernel_check=False) as spy:
        for _ in range(2):
            x * 2.0, x * 2, x * 3.0, y * 2.0, x.to(torch.bfloat16) * 2.0
            torch.add(x, x, alpha=2), torch.add(x, x, alpha=3), torch.add(x, x, alpha=1)
            x.pow(2.5), x.pow(3.5)  # Scalar exponents: constants
            x.sum(dim=[0]), x.sum(dim=[1]), torch.cat([x, y]), torch.cat([x, x])
    group = [0, 1, 0, 3, 4, 5, 5, 7, 8, 9, 10, 11, 12, 13]  # the call whose entry each shares
    calls = [c for c in spy.calls if c[0] != "aten._to_copy.default"]
    first, second = calls[:len(calls) // 2], calls[len(calls) // 2:]
    assert len(first) == len(group) and [c[0] for c in first] == [c[0] for c in second]
    assert len({(name, repr(sig)) for name, sig, _, _ in first}) == len(group)  # every call: another signature
    for k, (name, sig, handed, made) in enumerate(first):
        if group[k] == k:
            assert handed is None, name  # first sight
            assert made.facts.name == name and repr(made.sig) == repr(sig)
        else:
            assert handed is first[group[k]][3], name  # the entry of the call it shares
    for k, (name, _, handed, _) in enumerate(second):
        assert handed is first[group[k]][3], name


def test_entries_never_turn_a_transfer_into_device_work():
    """copy_ from the host, then from the device, then from the host again, with equal
    signatures: each host source is a host->device copy (no op), the device source one op."""
    dev = hpu.reset_device("gaudi2")
    host, dst = torch.randn(32), torch.empty(32, device="hpu")
    src = host.to("hpu")
    dev.log = []
    ops = dev.ops_recorded
    dst.copy_(host)
    dst.copy_(src)
    dst.copy_(host)
    assert dev.ops_recorded == ops + 1
    assert [e[0] for e in dev.log if e[0] in ("h2d", "op")] == ["h2d", "op", "h2d"]
    dev.log = None


def test_the_hbm_check_holds_when_the_entry_is_reused():
    """The same factory and the same op with a kept entry are refused once the HBM no longer
    has room for them, before the host allocates (the reference: the HBM's free bytes)."""
    import dataclasses

    import pytest

    from hpu_runtime.device.memory import HPUOutOfMemoryError
    from hpu_runtime.device.spec import get_device_spec

    import traceback

    def refused_before_it_runs(op) -> None:  # by the before hook, not when its result is made resident
        with pytest.raises(HPUOutOfMemoryError) as err:
            op()
        names = [frame.name for frame in traceback.extract_tb(err.value.__traceback__)]
        assert "_before" in names and "_after" not in names, names

    dev = hpu.reset_device(dataclasses.replace(get_device_spec("gaudi2"), hbm_bytes=64 << 20))
    try:
        n = dev.hbm.free_bytes // 4 // 3 + 1  # a third of the free HBM and a bit, in fp32 elements
        keep = [torch.empty(n, device="hpu")]  # seen once: its entry is kept
        a = torch.ones(1, device="hpu")
        keep.append(a.expand(n).contiguous())  # likewise
        refused_before_it_runs(lambda: torch.empty(n, device="hpu"))  # a kept entry: no longer fits
        refused_before_it_runs(lambda: a.expand(n).contiguous())
        del keep
        assert torch.empty(n, device="hpu").shape == (n,)
    finally:
        hpu.reset_device("gaudi2")


def test_a_device_reset_prices_a_kept_entry_for_the_new_device():
    """An entry made on Gaudi2 is priced for first-gen Gaudi after reset_device("gaudi") (the
    reference: the cost model itself for each device, and their MME rates differ)."""
    from hpu_runtime.device.cost_model import op_cost
    from hpu_runtime.device.spec import get_device_spec

    costs = []
    for name in ("gaudi2", "gaudi", "gaudi2"):
        dev = hpu.reset_device(name)
        a, b = torch.randn(64, 128, device="hpu"), torch.randn(128, 32, device="hpu")
        dev.log = []
        out = a @ b
        (op,) = [e[1] for e in dev.log if e[0] == "op"]
        dev.log = None
        with hpu.bridge_disabled():
            expected = op_cost(get_device_spec(name), torch.ops.aten.mm.default, (a, b), {}, out, False)
        assert op.cost == expected
        costs.append(op.cost.device_ns)
    assert costs[0] == costs[2] != costs[1]


def test_storage_io_reads_writes_and_saves_as_worked_out_by_hand():
    """The op record's storages from the kernel library (NOTE [an op's storages, in the kernel
    library]) on a fresh residency, against serials, bytes and saves worked out by hand from
    PyTorch's derivatives.yaml patterns."""
    import pytest

    from hpu_runtime.bridge.op_accounting import _storage_io
    from hpu_runtime.device.memory import HBMModel
    from hpu_runtime.device.residency import Residency
    from hpu_runtime.device.spec import get_device_spec

    io = _storage_io()
    res = Residency(HBMModel.from_spec(get_device_spec("gaudi2")))
    with hpu.bridge_disabled():
        a = torch.randn(4, 8, device="hpu", requires_grad=True)  # fp32: 128 bytes
        b = torch.randn(4, 8, device="hpu")
        host = torch.tensor(2.0)
        out = torch.empty(4, 8, device="hpu")
        pair = (torch.empty(2, device="hpu"), torch.empty(3))  # an hpu and a host result
    # mul(a, b), a requiring grad: reads a and b (each registered at first sight: serials 0, 1),
    # writes a new storage (serial 2), autograd keeps b (the factor of the input that requires grad)
    reads, writes, saves = io(res.state, (a, b), None, out, True, False, "mul", ())
    assert reads == ((0, 128), (1, 128)) and writes == ((2, 128, True, False),) and saves == (1,)
    assert res.hbm.stats().in_use_bytes == 3 * a.untyped_storage().nbytes()
    # in bf16 accounting fp32 counts 2 bytes; a host scalar is no read; positions (0,) of the
    # results kept: the first, the hpu one (the host one is not written on the device)
    reads, writes, saves = io(res.state, (b, host), {"alpha": 1}, pair, True, True, (1,), (0,))
    assert reads == ((1, 64),) and writes == ((3, 4, True, False),) and saves == ()  # nothing requires grad
    # a list argument (cat) and "all": every resident argument kept; the output in place (not
    # allocating) keeps its serial
    with hpu.bridge_disabled():
        c = torch.ones(4, 8, device="hpu", requires_grad=True)
    reads, writes, saves = io(res.state, ([a, c],), {}, out, False, False, "all", "all")
    assert reads == ((0, 128), (4, 128)) and writes == ((2, 128, False, True),) and saves == (0, 4)
    with torch.no_grad():  # grad off: autograd keeps nothing
        assert io(res.state, (a, b), None, out, True, False, "all", "all")[2] == ()
    # host work: nothing on the device read or written
    assert io(res.state, (host,), None, torch.zeros(1), True, False, "all", "all") is None
    with pytest.raises(TypeError, match="args must be a tuple"):
        io(res.state, [a], None, out, True, False, "all", "all")


def test_a_kept_entry_with_nothing_left_to_check_skips_the_before_hook_and_is_still_recorded():
    """A view and an in-place op (no output bytes, no transfer, no factory) are seen by the
    before hook once, and so is an allocating op whose output bytes fit (the kernel compares
    them with the free HBM itself); later calls go straight to the after hook and are recorded
    as before (the reference: the ops and graph-key entries of the first round)."""
    dev = hpu.reset_device("gaudi2")
    x = torch.randn(4, 3, device="hpu")
    rounds = []
    with _SpyHooks() as spy:
        for _ in range(3):
            hpu.mark_step()
            n, ops = len(spy.calls), dev.ops_recorded
            x.t(), x.add_(1.0), x * 2.0
            rounds.append(([c[0] for c in spy.calls[n:]], dev.ops_recorded - ops, _keys(dev)))
    assert rounds[0][0] == ["aten.t.default", "aten.add_.Tensor", "aten.mul.Tensor"]
    assert rounds[1][0] == rounds[2][0] == []  # each skips it
    assert rounds[0][1:] == rounds[1][1:] == rounds[2][1:] == (2, ["aten.t.default", "aten.add_.Tensor",
                                                                   "aten.mul.Tensor"])


def test_the_kernel_compares_a_kept_entrys_output_bytes_with_the_current_device():
    """A kept allocating op skips the before hook while its output fits in the HBM of the device
    get_device() returns, and is refused by the before hook (nothing allocated) when it does not:
    inside using_device() of a private card whose HBM is smaller than the output (the reference:
    the output's bytes by hand, 4 x 3 fp32 = 48, against each card's capacity), then again
    after it."""
    import dataclasses
    import traceback

    import pytest

    from hpu_runtime.bridge.runtime import using_device
    from hpu_runtime.bridge.sim_device import SimDevice
    from hpu_runtime.device.memory import HPUOutOfMemoryError
    from hpu_runtime.device.spec import get_device_spec

    hpu.reset_device("gaudi2")
    x = torch.randn(4, 3, device="hpu")
    small = SimDevice(dataclasses.replace(get_device_spec("gaudi2"), hbm_bytes=40))
    with _SpyHooks() as spy:
        x * 2.0, x * 2.0
        assert [c[0] for c in spy.calls] == ["aten.mul.Tensor"]  # seen once: 48 bytes fit in 96 GB
        with using_device(small):
            with pytest.raises(HPUOutOfMemoryError, match="tried to allocate 48 bytes") as err:
                x * 2.0
        assert "_before" in [f.name for f in traceback.extract_tb(err.value.__traceback__)]
        assert small.hbm.stats().num_allocs == 0
        assert [c[0] for c in spy.calls] == ["aten.mul.Tensor"] * 2  # the kernel handed it to the hook
        x * 2.0
        assert len(spy.calls) == 2  # the process's card again: it fits


def test_storages_freed_on_other_threads_are_counted_exactly():
    """Registrations on one thread and frees (the storages' deaths) on four others, racing: the
    HBM's live bytes and counts end equal to the storages still alive, summed by hand, and
    every serial is distinct (NOTE [the HBM counters, in the kernel library])."""
    from hpu_runtime.device.memory import HBMModel
    from hpu_runtime.device.residency import Residency

    res = Residency(HBMModel(capacity_bytes=1 << 30))
    with hpu.bridge_disabled():
        batches = [[torch.empty(n % 7 + 1) for n in range(b, b + 50)] for b in range(40)]
    kept = [t for batch in batches[::2] for t in batch]
    to_free = batches[1::2]
    serials = [res.register(t.untyped_storage()).serial for batch in batches for t in batch]
    del batches
    go = threading.Event()

    def free(mine):
        go.wait(timeout=30)
        mine.clear()  # the storages die here, on this thread

    threads = [threading.Thread(target=free, args=(to_free[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    go.set()
    with hpu.bridge_disabled():
        more = [torch.empty(3) for _ in range(500)]
    serials += [res.register(t.untyped_storage()).serial for t in more]
    for t in threads:
        t.join(timeout=30)
    to_free.clear()
    alive = kept + more
    stats = res.hbm.stats()
    assert stats.in_use_bytes == sum(t.untyped_storage().nbytes() for t in alive)
    assert stats.active_allocs == len(res.refs) == len(alive)
    assert stats.num_allocs == 40 * 50 + 500 and stats.num_frees == 20 * 50
    assert len(set(serials)) == len(serials) == 40 * 50 + 500


def _small_adam_job(compiled: bool = False):
    """A small MLP on hpu with Adam, and one batch: ``(model, opt, x, y)``; ``compiled``: the
    model under ``torch.compile(backend="hpu_backend")``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("hpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    if compiled:
        torch._dynamo.reset()
        model = torch.compile(model, backend="hpu_backend")
    return model, opt, torch.randn(5, 8).to("hpu"), torch.randint(0, 4, (5,)).to("hpu")


def _three_adam_steps(model, opt, x, y) -> list:
    """Three training steps (``mark_step`` after backward and after the optimizer step); the
    parameters after them, on the host."""
    for _ in range(3):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        hpu.mark_step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        hpu.mark_step()
    with hpu.bridge_disabled():
        return [p.detach().cpu().clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["lazy", "eager", "compile"])
def test_the_kernels_op_records_equal_the_after_hooks(monkeypatch, mode):
    """Three training steps of a small MLP (Adam, ``mark_step`` after backward and after the
    optimizer step), in lazy mode, in eager mode and in eager mode with the model under
    ``torch.compile(backend="hpu_backend")`` (its forward and backward ops in compiled regions),
    with the kernel making the records of kept entries (NOTE [the op record, in the kernel])
    and with the kernel given no device, so that the Python after hook records every op (the
    reference): the same events (op records with their keys, costs, bytes and saves, storages
    renumbered by first appearance; views; regions; launches, one per op in eager mode outside
    the regions), the same simulated host time and graphs, the same parameters; and the kernel
    did make most records itself."""
    from hpu_runtime.bridge import dispatch, runtime

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1" if mode == "lazy" else "0")

    lib = dispatch._kernel_hooks()

    def norm(events):
        seen: dict[int, int] = {}

        def s(serial):
            return seen.setdefault(serial, len(seen))

        out = []
        for e in events:
            if e[0] == "op":
                op = e[1]
                out.append(("op", op.key, op.cost, tuple((s(a), n) for a, n in op.reads),
                            tuple((s(w[0]), *w[1:]) for w in op.writes), tuple(s(a) for a in op.saves)))
            else:
                out.append(e)
        return out

    def run(kernel: bool):
        dev = hpu.reset_device("gaudi2")
        calls = []
        after = dispatch._after

        def spy(*a):
            calls.append(a[0])
            return after(*a)

        lib.hpu_sim_set_hooks(dispatch._before, spy, dispatch.OpEntry)
        python_only = runtime.python_hooks_only()
        if not kernel:
            python_only.__enter__()
        try:
            job = _small_adam_job(compiled=mode == "compile")
            dev.log, dev.graph_log = [], []
            params = _three_adam_steps(*job)
            events, graphs = norm(dev.log), list(dev.graph_log)
            dev.log = dev.graph_log = None
            return events, graphs, dev.card.host_ns, dev.ops_recorded, params, len(calls)
        finally:
            lib.hpu_sim_set_hooks(dispatch._before, dispatch._after, dispatch.OpEntry)
            if not kernel:
                python_only.__exit__(None, None, None)

    kernel, python = run(True), run(False)
    assert sum(e[0] == "op" for e in python[0]) > 100
    eager_launches = sum(e == ("launch", "eager") for e in python[0])
    regions = sum(e[0] == "region" and e[1] is not None for e in python[0])
    if mode == "lazy":
        assert eager_launches == 0 and regions == 0
    elif mode == "eager":
        assert eager_launches == sum(e[0] == "op" for e in python[0]) and regions == 0
    else:
        assert regions == 6 and 0 < eager_launches < sum(e[0] == "op" for e in python[0]) - 20, regions
    assert kernel[:4] == python[:4]
    assert all(torch.equal(a, b) for a, b in zip(kernel[4], python[4]))
    assert kernel[5] < python[5] / 2, (kernel[5], python[5])  # most records made by the kernel


def test_the_kernels_eager_launches_equal_the_launchers(monkeypatch):
    """Eager mode with no event log, so that the kernel launches the ops it records
    (``eager_launch`` in ``csrc/hpu_device.cpp``), against the Python hooks alone (the
    reference: every op recorded by the after hook and launched by ``Launcher.launch``): three
    training steps of a small MLP on a card whose steps run 1.3x slower; the same compute
    stream intervals (start, end, label), host time, launches, recipe-cache counts and order of
    use (the kernel's twin of ``RecipeCache.memory_hit`` makes a hit the most recently used),
    ``recipe_cache`` metric (hits and misses by recipe name, in a local context and globally:
    the kernel's twin of ``metrics.record_recipe_cache``; the names kept in the same order with
    the bound on them lowered to 5, so that the oldest are forgotten), the same parameters; and the kernel
    launched many ops itself (the rest: the first step's new entries, Adam's numbers)."""
    from hpu_runtime.api import metrics
    from hpu_runtime.bridge import launcher as launcher_mod
    from hpu_runtime.bridge import runtime

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    python_launches = []
    launch = launcher_mod.Launcher.launch

    def counted(self, reason, *a):
        python_launches.append(reason)
        return launch(self, reason, *a)

    monkeypatch.setattr(launcher_mod.Launcher, "launch", counted)
    monkeypatch.setattr(metrics, "MAX_NAMED_RECIPES", 5)

    def run(kernel: bool):
        dev = hpu.reset_device("gaudi2")
        dev.card.set_step_slowdown(lambda step: 1_300_000)
        python_launches.clear()
        python_only = runtime.python_hooks_only()
        if not kernel:
            python_only.__enter__()
        try:
            metrics.metric_global("recipe_cache").reset()
            with metrics.metric_localcontext("recipe_cache") as cache_metric:
                params = _three_adam_steps(*_small_adam_job())
            assert dev.launcher.log is None and dev.card.trace is None
            recipes = dev.launcher.recipes
            stats = recipes.stats()
            by_use = [recipes._entries[k].meta["name"] for k in recipes._entries]  # least recently used first
            named = [list(m._hit_by_name) for m in (cache_metric, metrics.metric_global("recipe_cache"))]
            assert len(named[0]) == 5
            return (list(dev.card.compute.intervals), dev.card.host_ns, dev.card.compute.free_ns,
                    dev.launcher.graphs_launched, stats, cache_metric.stats(), by_use,
                    metrics.metric_global("recipe_cache").stats(), named, params, python_launches.count("eager"))
        finally:
            if not kernel:
                python_only.__exit__(None, None, None)

    kernel, python = run(True), run(False)
    assert python[3] > 100 and python[10] == python[3]  # every launch an op's (mark_step finds nothing pending)
    assert kernel[:9] == python[:9]
    assert kernel[5] == python[7] and dict(kernel[5])["TotalHit"] > 50  # the local context counted what the global did
    assert all(torch.equal(a, b) for a, b in zip(kernel[9], python[9]))
    assert python[10] - kernel[10] >= 50, (kernel[10], python[10])  # launched by the kernel (62 here)


def _run_while_held(lock, op) -> list[str]:
    """``op()`` while another thread holds ``lock`` for 0.3 s: the order in which the holder let
    go and the op ended (every wait bounded)."""
    held, events = threading.Event(), []

    def hold():
        with lock:
            held.set()
            threading.Event().wait(0.3)
            events.append("released")

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(10)
    op()
    events.append("op done")
    t.join(10)
    return events


@pytest.mark.parametrize("busy", ["recipe cache", "metrics"])
def test_an_eager_hit_waits_for_a_lock_another_thread_holds_and_is_counted_once(monkeypatch, busy):
    """Eager mode: the kernel takes the recipe cache's lock and the metrics' lock without waiting
    (it holds the GIL); while another thread holds one, the op goes to the Python code, which
    waits for it. The reference, by hand: an op whose recipe is in memory, run while another
    thread holds the lock, ends after that thread let go, and is counted as exactly one hit in
    the cache and in the ``recipe_cache`` metric, as the same op is with the lock free."""
    from hpu_runtime.api import metrics

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    dev = hpu.reset_device("gaudi2")
    try:
        x = torch.ones(4, device="hpu")
        torch.mul(x, x)  # the recipe compiled (a miss)
        recipes, metric = dev.launcher.recipes, metrics.metric_global("recipe_cache")

        def counts():
            return recipes.stats().hits, dict(metric.stats())["TotalHit"]

        before = counts()
        torch.mul(x, x)
        free = counts()
        assert free == (before[0] + 1, before[1] + 1)
        lock = recipes._lock if busy == "recipe cache" else metrics._LOCK
        assert _run_while_held(lock, lambda: torch.mul(x, x)) == ["released", "op done"]
        assert counts() == (free[0] + 1, free[1] + 1)
    finally:
        monkeypatch.undo()
        hpu.reset_device("gaudi2")


def test_a_number_at_a_scalar_input_shares_the_entry_and_each_new_one_is_still_charged(monkeypatch):
    """``x * v`` for new values of ``v`` shares one entry (the number is a graph input in lazy
    mode), yet each value new to the device is copied at the graph's launch (4 bytes) and a
    value already there is not, whether the after hook or the kernel records it; every op's
    graph-key entry says SCALAR_INPUT. In eager mode ``add``'s ``alpha`` (no wrapped number) is a
    constant of each op's key: the calls sharing an entry keep their own values (the reference:
    the values passed, by hand)."""
    from hpu_runtime.bridge.graph_key import SCALAR_INPUT

    dev = hpu.reset_device("gaudi2")
    x = torch.ones(4, device="hpu")
    hpu.mark_step()
    seen = []
    for v in (3.0, 3.0, 4.0, 4.0, 5.0, 3.0):
        dev.log = []
        x * v
        hpu.mark_step()
        seen.append([e[1] for e in dev.log if e[0] == "h2d"])
        ((_, op),) = [e for e in dev.log if e[0] == "op"]
        assert op.key[1][1] == SCALAR_INPUT, op.key
    dev.log = None
    assert seen == [[4], [], [4], [], [4], []]

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    dev = hpu.reset_device("gaudi2")
    try:
        x = torch.ones(4, device="hpu")
        dev.log = []
        for alpha in (2, 3, 2, 5):
            torch.add(x, x, alpha=alpha)
        keys = [e[1].key for e in dev.log if e[0] == "op"]
        dev.log = None
        assert [dict(k[1][2:]).get("alpha") for k in keys] == [2, 3, 2, 5], keys
    finally:
        monkeypatch.undo()
        hpu.reset_device("gaudi2")


@contextlib.contextmanager
def _after_hook_spied(monkeypatch, lazy_mode: str = "0"):
    """A fresh gaudi2 device in eager mode (``lazy_mode="1"``: lazy) whose kernel calls an after
    hook that lists the op of each call it gets; yields ``(device, that list)``, and puts the
    hooks and a lazy device back."""
    from hpu_runtime.bridge import dispatch

    monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy_mode)
    lib = dispatch._kernel_hooks()
    calls = []

    def spy(*a):
        calls.append(a[0])
        return dispatch._after(*a)

    dev = hpu.reset_device("gaudi2")
    lib.hpu_sim_set_hooks(dispatch._before, spy, dispatch.OpEntry)
    try:
        yield dev, calls
    finally:
        lib.hpu_sim_set_hooks(dispatch._before, dispatch._after, dispatch.OpEntry)
        monkeypatch.undo()
        hpu.reset_device("gaudi2")


def test_an_eager_record_with_numbers_in_its_key_holds_for_the_same_numbers_only(monkeypatch):
    """Eager mode: ``add``'s ``alpha`` is a constant of the op's key, and the calls share one kept
    entry, so the kernel makes the record only for a call that passes the numbers the record was
    made with (its pins), compared with their type and bit for bit; any other call goes to the
    after hook, which makes the record anew. The reference, by hand: each key holds its call's
    own alpha (the sign of zero included), and the after hook runs exactly at the first call
    and wherever alpha differs from the call before."""
    import math

    with _after_hook_spied(monkeypatch) as (dev, calls):
        x = torch.ones(4, device="hpu")
        alphas = (2.0, 2.0, 3.0, 3.0, 2.0, 0.0, -0.0, -0.0, 2, 2)
        dev.log, hooked = [], []
        for alpha in alphas:
            before = len(calls)
            torch.add(x, x, alpha=alpha)
            hooked.append(len(calls) > before)
        keys = [e[1].key for e in dev.log if e[0] == "op"]
        dev.log = None
        got = [dict(k[1][2:])["alpha"] for k in keys]
        assert [(type(a), math.copysign(1, a), a) for a in got] == [(type(a), math.copysign(1, a), a) for a in alphas]
        assert hooked == [True, False, True, False, True, True, True, False, True, False], hooked


def test_a_kept_record_is_used_only_on_its_side_of_a_compiled_regions_boundary(monkeypatch):
    """Eager mode: ``x * 2.5`` puts 2.5 on the device as a graph input outside compiled regions
    (a wrapped number: NOTE [scalars as graph inputs]) and keeps it as a constant of the key
    inside one. Called outside, inside, inside, outside, outside, the kernel makes the record
    only where the call before was on the same side (the record it kept was made there); the
    keys, by hand: SCALAR_INPUT outside, 2.5 inside."""
    from hpu_runtime.bridge.graph_key import SCALAR_INPUT

    with _after_hook_spied(monkeypatch) as (dev, calls):
        x = torch.ones(4, device="hpu")
        x * 2.5  # the entry, and 2.5 on the device
        dev.log, hooked = [], []
        for inside in (False, True, True, False, False):
            before = len(calls)
            if inside:
                with dev.compiled_region("r"):
                    x * 2.5
            else:
                x * 2.5
            hooked.append(len(calls) > before)
        keys = [e[1].key[1][1] for e in dev.log if e[0] == "op"]
        dev.log = None
        assert keys == [SCALAR_INPUT, 2.5, 2.5, SCALAR_INPUT, SCALAR_INPUT], keys
        assert hooked == [False, True, False, True, False], hooked


def test_an_op_first_recorded_in_an_hpu_graph_capture_is_recorded_by_the_kernel_after_it(monkeypatch):
    """Lazy mode: ``relu`` first seen while an HPU graph is captured (where the kernel leaves
    every op to the after hook) is recorded by the kernel afterwards, from the second call on
    (the first one outside the capture remakes the kept record for that side), with the same
    key as inside."""
    relu = torch.ops.aten.relu.default
    with _after_hook_spied(monkeypatch, lazy_mode="1") as (dev, calls):
        x = torch.randn(4, 3, device="hpu")
        g = hpu.HPUGraph()
        with hpu.graph(g):
            x.relu()
        inside = calls.count(relu)
        dev.log, hooked = [], []
        for _ in range(3):
            before = calls.count(relu)
            x.relu()
            hooked.append(calls.count(relu) > before)
        keys = {e[1].key for e in dev.log if e[0] == "op"}
        dev.log = None
        assert inside == 1 and hooked == [True, False, False], (inside, hooked)
        assert keys == {("aten.relu.default", ((torch.Size([4, 3]), torch.float32),))}, keys


def test_the_kernel_refuses_a_device_whose_state_it_cannot_read_as_plain_attributes():
    """The kernel reads the pending graph's state in its instance dict (NOTE [the op record, in
    the kernel]): a launcher whose class defines one of those names (here ``region``, which a
    property could compute) is refused with a TypeError naming it, not read wrongly."""
    import pytest

    from hpu_runtime.bridge import dispatch, runtime
    from hpu_runtime.bridge.launcher import Launcher
    from hpu_runtime.bridge.sim_device import SimDevice
    from hpu_runtime.device.lazy_graph import OpRecord
    from hpu_runtime.device.spec import get_device_spec

    class Shadowed(Launcher):
        region = None

    dev = SimDevice(get_device_spec("gaudi2"))
    dev.launcher.__class__ = Shadowed
    lib = dispatch._kernel_hooks()
    try:
        with pytest.raises(TypeError, match="Shadowed.region"):
            lib.hpu_sim_set_device(dev.hbm.counters, dev.ops, OpRecord)
    finally:
        runtime._publish(hpu.get_device())


def test_the_device_lock_behaves_as_threading_rlock():
    """The device's lock (the kernel library's DeviceLock) against threading.RLock, call by
    call: reentrant for its owner, refused to another thread (at once, or after a timeout),
    released only by its owner, and a context manager."""
    dev = hpu.reset_device("gaudi2")
    results = {}
    for name, lock in (("device", dev.lock), ("rlock", threading.RLock())):
        seen = [lock.acquire(), lock.acquire(False), lock._is_owned()]
        other = []
        t = threading.Thread(target=lambda: other.extend([lock.acquire(False), lock.acquire(timeout=0.05)]))
        t.start()
        t.join(10)
        lock.release()
        lock.release()
        seen += other + [lock._is_owned()]
        with pytest.raises(RuntimeError, match="un-acquired"):
            lock.release()
        with lock:
            with lock:
                seen.append(lock._is_owned())
        t = threading.Thread(target=lambda: other.append((lock.acquire(False), lock.release())))
        t.start()
        t.join(10)
        seen.append(other[-1])
        with pytest.raises(ValueError):
            lock.acquire(False, 1.0)
        results[name] = seen
    assert results["device"] == results["rlock"] == [True, True, True, False, False, False, True, (True, None)]
    assert type(dev.lock).__name__ == "DeviceLock"

    from hpu_runtime.bridge.runtime import _publish

    dev.ops.lock = threading.RLock()  # a lock the kernel cannot take in place: refused when published
    try:
        with pytest.raises(TypeError, match="DeviceLock"):
            _publish(dev)
    finally:
        dev.ops.lock = dev.lock
        _publish(dev)


def test_an_op_waits_for_the_device_lock_another_thread_holds():
    """The kernel takes the device's lock in place (no Python call); while another thread holds
    it, a lazy op waits (the GIL released) and is recorded once after that thread let go, with
    the record the same op makes with the lock free (the reference: the free run's record)."""
    dev = hpu.reset_device("gaudi2")
    x = torch.ones(8, device="hpu")
    y = torch.ones(8, device="hpu")
    x.add_(y)  # the entry kept by the kernel
    hpu.mark_step()
    dev.log = []
    x.add_(y)
    free = [e for e in dev.log if e[0] == "op"]
    events = _run_while_held(dev.lock, lambda: x.add_(y))
    ops = [e for e in dev.log if e[0] == "op"]
    dev.log = None
    assert events == ["released", "op done"]
    assert len(free) == 1 and ops == free + free
    assert torch.equal(x.cpu(), torch.full((8,), 4.0))  # 1 + 1 + 1 + 1


def test_a_storage_the_kernel_registers_has_its_bytes_serial_and_id():
    """A result's storage registered by the kernel (its bytes read in C++, its StorageRef's slots
    set in place) against Python's own view of it: the storage's nbytes(), its id, serials
    counting up by one, the HBM's live bytes grown by exactly those bytes; a view's storage is
    the whole storage. A StorageRef subclass with its own __init__ is still called as a class."""
    from hpu_runtime.device.residency import StorageRef

    dev = hpu.reset_device("gaudi2")
    x = torch.ones(64, device="hpu")
    hpu.mark_step()
    live = dev.hbm.live_bytes
    a = x[:10] * 2  # a new storage of 10 floats
    b = torch.cat([x, x])  # 128 floats
    refs = dev.residency.refs
    ra, rb = refs[id(a.untyped_storage())], refs[id(b.untyped_storage())]
    assert (ra.nbytes, rb.nbytes) == (a.untyped_storage().nbytes(), b.untyped_storage().nbytes()) == (40, 512)
    assert (ra.key, rb.key) == (id(a.untyped_storage()), id(b.untyped_storage()))
    assert rb.serial == ra.serial + 1 and ra() is a.untyped_storage()
    assert dev.hbm.live_bytes == live + 40 + 512

    inits = []

    class Counted(StorageRef):
        __slots__ = ()

        def __init__(self, *args):
            inits.append(len(args))
            super().__init__(*args)

    from hpu_runtime.device import native

    register = native.functions()["residency_register"]
    state = dev.residency.state
    storage = torch.zeros(3, device="hpu").untyped_storage()  # registered by the kernel (a factory)
    fresh = torch.empty(0).untyped_storage()  # a host storage no one registered
    rc = register((state[0], state[1], Counted, state[3], state[4]), fresh)
    assert type(rc) is Counted and inits == [2] and rc.nbytes == 0 and rc.key == id(fresh) and rc() is fresh
    assert register(state, storage) is refs[id(storage)] and inits == [2]  # resident already: its ref
    d = x + 1  # the kernel again, with StorageRef
    rd = refs[id(d.untyped_storage())]
    assert type(rd) is StorageRef and rd.nbytes == 256 and rd.serial == rc.serial + 1


@pytest.mark.parametrize("limit", [None, 3])
def test_numbers_new_to_the_device_are_cached_by_the_kernel_as_by_the_after_hook(monkeypatch, limit):
    """``x * v`` with numbers new to the device: the kernel records the op itself (the after hook
    is not called once the entry is kept) and puts each new number in the device's scalar cache,
    one 4-byte copy at the graph's launch per number the cache did not hold, the cache emptied
    when full (``_MEMO_LIMIT``, lowered to 3 here). The reference: the same calls with every
    record made by the after hook (``python_hooks_only``)."""
    from hpu_runtime.bridge import dispatch, op_accounting
    from hpu_runtime.bridge.runtime import python_hooks_only

    if limit is not None:
        monkeypatch.setattr(op_accounting, "_MEMO_LIMIT", limit)
    values = (3.0, 3.0, 4.0, 5.0, 6.0, 3.0, 7, 7, True, 4.0)

    def run(kernel: bool):
        dev = hpu.reset_device("gaudi2")  # publishes the device: the kernel reads the limit then
        calls, copies = [], []
        lib = dispatch._kernel_hooks()

        def after(func, args, kwargs, out, token):
            calls.append((str(func), args[1:2]))
            return dispatch._after(func, args, kwargs, out, token)

        lib.hpu_sim_set_hooks(dispatch._before, after, dispatch.OpEntry)  # (the kernel's entries made anew)
        x = torch.ones(4, device="hpu")
        dev.log = []
        for w in (2.0, 2.5, 9, 8, False, True):  # each type of number's entry kept by the kernel (1 is its own)
            x * w
        hpu.mark_step()
        calls.clear()
        scope = contextlib.nullcontext() if kernel else python_hooks_only()
        try:
            with scope:
                for v in values:
                    dev.log.clear()
                    x * v
                    hpu.mark_step()
                    copies.append([e[1] for e in dev.log if e[0] == "h2d"])
        finally:
            lib.hpu_sim_set_hooks(dispatch._before, dispatch._after, dispatch.OpEntry)
            dev.log = None
        return calls, copies, sorted(map(repr, dev.ops._scalars))

    kernel, python = run(True), run(False)
    assert kernel[0] == [] and len(python[0]) == len(values)
    assert kernel[1:] == python[1:]
    if limit is None:
        assert kernel[1] == [[4], [], [4], [4], [4], [], [4], [], [], []]  # True: 1, a constant of mul's key


def test_pending_ops_is_a_sequence_of_the_records_appended():
    """``Launcher._ops`` (NOTE [records made when read] in hpu_runtime.bridge.launcher) against a
    Python list given the same appends: length, truth, indexing (negative too), slices, iteration
    and ``tuple``; the errors a list raises for a bad index."""
    from hpu_runtime.bridge.device_type import builtins

    pending_ops = builtins()["PendingOps"]
    ops, ref = pending_ops(), []
    assert len(ops) == 0 and not ops and list(ops) == []
    for item in [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)]:
        ops.append(item)
        ref.append(item)
    assert ops and len(ops) == len(ref) == 5 and ops.values_held() == 0
    for i in range(-5, 5):
        assert ops[i] is ref[i]
    for sl in [slice(None), slice(1, 4), slice(None, None, 2), slice(-2, None), slice(4, 0, -1), slice(3, 1)]:
        assert ops[sl] == ref[sl]
    assert list(ops) == ref and tuple(ops) == tuple(ref)
    with pytest.raises(IndexError):
        ops[5]
    with pytest.raises(IndexError):
        ops[-6]
    with pytest.raises(TypeError, match="integers or slices"):
        ops["0"]
    with pytest.raises(TypeError, match="no arguments"):
        pending_ops([1])


def test_records_the_kernel_keeps_as_values_equal_the_after_hooks_when_read(monkeypatch):
    """With no event log (so the kernel keeps its records as values until read, NOTE [records
    made when read]), three training steps of a small MLP in lazy mode, each graph's records read
    at its launch, against the Python after hook recording every op (the reference, through
    ``python_hooks_only``): the same records (keys, costs, bytes and saves, storages renumbered
    by first appearance), the same per-op device times of each launched graph (``graph_log``,
    which reads them), host time and parameters; in the kernel's run most records were still
    values when their launch came, and the launches that read none (recipe-cache hits with no
    collective) left them unmade."""
    from hpu_runtime.bridge import launcher as launcher_mod
    from hpu_runtime.bridge import runtime

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    launch = launcher_mod.Launcher.launch
    seen: list = []
    held: list[int] = []

    def reading(self, reason, *a):
        held.append(self._ops.values_held())
        seen.append(list(self._ops))
        return launch(self, reason, *a)

    def norm(graphs):
        ids: dict[int, int] = {}

        def s(serial):
            return ids.setdefault(serial, len(ids))

        return [[(op.key, op.cost, tuple((s(a), n) for a, n in op.reads),
                  tuple((s(w[0]), *w[1:]) for w in op.writes), tuple(s(a) for a in op.saves)) for op in ops]
                for ops in graphs]

    def run(kernel: bool, read: bool):
        dev = hpu.reset_device("gaudi2")
        seen.clear()
        held.clear()
        if read:
            monkeypatch.setattr(launcher_mod.Launcher, "launch", reading)
        python_only = runtime.python_hooks_only()
        if not kernel:
            python_only.__enter__()
        try:
            dev.graph_log = []
            params = _three_adam_steps(*_small_adam_job())
            assert dev.launcher.log is None
            graphs = [(g.reason, g.ops, g.start_ns, g.device_ns, g.op_times_ns) for g in dev.graph_log]
            dev.graph_log = None
            return norm(seen), graphs, dev.card.host_ns, params, list(held)
        finally:
            monkeypatch.setattr(launcher_mod.Launcher, "launch", launch)
            if not kernel:
                python_only.__exit__(None, None, None)

    kernel, python = run(True, True), run(False, True)
    assert sum(len(g) for g in python[0]) > 100
    assert kernel[:3] == python[:3]
    assert all(torch.equal(a, b) for a, b in zip(kernel[3], python[3]))
    assert sum(kernel[4]) > sum(len(g) for g in kernel[0]) / 2, kernel[4]  # values until read
    assert sum(python[4]) == 0  # the after hook appends records
    # no reads: the records of a hit stay values up to its run (the graph log reads them: off here)
    dev = hpu.reset_device("gaudi2")
    model, opt, x, y = _small_adam_job()
    at_run = []
    run_compute = dev.card.run_compute

    def spied(*a):
        at_run.append((len(dev.launcher._ops), dev.launcher._ops.values_held()))
        return run_compute(*a)

    monkeypatch.setattr(dev.card, "run_compute", spied)
    _three_adam_steps(model, opt, x, y)
    assert len(at_run) == 6 and len(dev.launcher._ops) == 0, at_run
    assert at_run[-2][0] > 10 and at_run[-2][1] == at_run[-2][0], at_run  # the third forward+backward: a hit
