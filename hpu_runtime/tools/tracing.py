"""One training step of a model at full size, traced without data (the traced step).

:func:`training_step` is the step every driver runs (``models.train`` live, the tracer here):
inputs copied to the device, forward and loss, ``zero_grad(set_to_none=True)``, backward,
``mark_step()``, ``optimizer.step()``, ``mark_step()``.

:func:`trace_step` runs that step under torch's ``FakeTensorMode`` (shapes and dtypes only:
no storage is allocated and nothing is computed) with the lazy-mode bridge charging a
private :class:`~hpu_runtime.bridge.sim_device.SimDevice`, whose event log (NOTE [op records and storage
serials] in :mod:`hpu_runtime.device.lazy_graph`) becomes a :class:`StepTrace`. Post-accumulate-grad
hooks mark when each parameter's gradient is produced. One warm-up step first creates the
optimizer state (and, in the ``hpu_graphs`` mode, captures the model's HPU graphs), so the
traced step is a steady-state step. :func:`prepare_model` sets a model up for its mode as a
Gaudi script does (``models.train`` calls it too).

Why here, in ``tools/``: the tracer drives the bridge (as a dispatch mode over fake tensors,
on a private device lent the process's place with
:func:`~hpu_runtime.bridge.runtime.using_device`), the
API (``mark_step``, the ``hpex`` optimizers) and the device model together, so it sits
above all three planes, with the planner side that consumes its traces
(:mod:`hpu_runtime.tools.replay`, ``hccl.sim.ddp_plan``, the study CLIs). The live driver
``models.train`` imports :func:`training_step` from here so both run the same step.

Simulated times are integer ns; ``wall_s`` fields are wall-clock seconds on this machine.
(A little over 400 lines: the step, its modes and optimizers and the tracer stay together.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..bridge import dispatch as bridge
from ..bridge.runtime import config, get_device, using_device
from ..bridge.sim_device import SimDevice
from ..device.lazy_graph import OpRecord
from ..device.spec import DeviceSpec
from .replay import map_records, replay_device

__all__ = ["MODES", "OPTIMIZERS", "ParamInfo", "StepTrace", "ddp_graph_split", "ddp_parameters", "make_optimizer",
           "portable", "prepare_model", "step_parts", "trace_step", "training_step"]

MODES = ("lazy", "hpu_graphs", "eager", "compile")
"""Execution modes: ``PT_HPU_LAZY_MODE=1``; lazy mode with the model's forward and backward
as HPU graphs (:func:`prepare_model`: captured once, then replayed with no per-op host
cost; the loss, DDP's hooks and the optimizer stay lazy); ``PT_HPU_LAZY_MODE=0``; and
``torch.compile`` (``PT_HPU_LAZY_MODE=0`` with the model compiled by ``hpu_backend``: its
forward and backward graphs are compiled regions, one recipe each with no per-op host cost;
the loss, DDP's reducer and the optimizer eager; see :mod:`hpu_runtime.bridge.compile_backend`)."""


def prepare_model(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """``model`` set up for ``mode`` before DDP wraps it, as a Gaudi script does.

    ``"hpu_graphs"``: the model's forward (and so its backward) is cached as HPU graphs per
    input signature, as the seed "HPU Graphs for Training" recommends for training:
    ``ModuleCacher(max_graphs=10)(model=model, inplace=True)``. Other modes: unchanged
    (``compile`` compiles the DDP-wrapped model, after this).

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if mode == "hpu_graphs":
        from ..bridge.hpu_graphs import ModuleCacher

        ModuleCacher(max_graphs=10)(model=model, inplace=True)
    return model


def training_step(model: torch.nn.Module, inputs: tuple, loss_fn: Callable, optimizer, *,
                  autocast: bool = False) -> torch.Tensor:
    """One training step on the simulated Gaudi; returns the loss (detached, on the device).

    Args:
        model: the (DDP-wrapped or plain) model, its parameters on ``"hpu"``; in the
            ``"compile"`` mode, the ``torch.compile``'d model (its graphs run as compiled
            regions, see :mod:`hpu_runtime.bridge.compile_backend`).
        inputs: host tensors; each is copied to the device (``.to("hpu")``, charged as PCIe).
        loss_fn: ``loss_fn(model(*inputs)) -> scalar loss``.
        optimizer: any ``torch.optim`` optimizer over the model's parameters.
        autocast: forward and loss under ``torch.autocast("hpu", dtype=torch.bfloat16)``,
            as Habana's ``--autocast`` recipes run (see :mod:`hpu_runtime.bridge.autocast`).
    """
    from ..api.hpu import mark_step

    device = get_device()
    dev = [t.to("hpu") for t in inputs]
    with torch.autocast("hpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(model(*dev))
    device.mark(("phase", "forward_end"))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    device.mark(("phase", "backward_end"))
    mark_step()
    optimizer.step()
    mark_step()
    return loss.detach()


@dataclass(frozen=True, slots=True)
class ParamInfo:
    """A trainable parameter in DDP's order.

    Attributes:
        name: qualified name (the first, for a parameter tied to several modules).
        numel: elements.
        dtype: e.g. ``"torch.float32"``.
        nbytes: bytes of its gradient.
        grad_serial: storage serial of its gradient in the traced step's event log.
    """

    name: str
    numel: int
    dtype: str
    nbytes: int
    grad_serial: int

    @property
    def torch_dtype(self) -> torch.dtype:
        """``dtype`` as a ``torch.dtype``."""
        return getattr(torch, self.dtype.removeprefix("torch."))


@dataclass(slots=True)
class StepTrace:
    """A traced steady-state training step (see module docstring).

    Attributes:
        spec: the device the costs were computed for.
        mode: one of :data:`MODES`.
        autocast: forward and loss ran under bf16 autocast.
        lazy_collectives: ``PT_HPU_ENABLE_LAZY_COLLECTIVES`` was on when traced (recorded for
            the planner; the trace itself has no collectives).
        batch_size: per-card batch.
        events: the step's event log, in order (see :class:`~hpu_runtime.bridge.sim_device.SimDevice`).
        params: trainable parameters in DDP's order.
        frozen: names of parameters that do not require grad (DDP skips them).
        peak_hbm_bytes: simulated HBM high-water mark over the traced steps, bytes.
        wall_s: wall-clock seconds the trace took on this machine.
        ddp_split: compile mode under DDP: the ``(first_bucket_bytes, bucket_bytes)`` at
            which DDPOptimizer broke the model's graph (see :func:`trace_step`); None: one
            graph (no DDP, or another mode).
    """

    spec: DeviceSpec
    mode: str
    lazy_collectives: bool
    batch_size: int
    autocast: bool
    events: list
    params: list[ParamInfo]
    frozen: list[str] = field(default_factory=list)
    peak_hbm_bytes: int = 0
    wall_s: float = 0.0
    ddp_split: tuple[int, int] | None = None


def portable(trace: StepTrace) -> StepTrace:
    """A copy of ``trace`` that pickles (to ship to other processes, e.g. Ray tasks).

    Graph-key entries only identify recipes, and may hold arguments that do not pickle (a
    user op's objects), so each distinct entry becomes a distinct int. Timing is unchanged.
    """
    ids: dict = {}

    def plain(key: object) -> int:
        return ids.setdefault(key, len(ids))

    return map_records(trace, lambda op: op._replace(key=plain(op.key)), view=plain)


def ddp_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """``(name, parameter)`` in the order DDP's reducer indexes them.

    As ``DistributedDataParallel._build_params_for_reducer`` (torch 2.13): modules in
    ``named_modules()`` order, each module's own parameters that require grad, a parameter
    shared by several modules (tied) counted once at its first occurrence.
    """
    seen: set[int] = set()
    out = []
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append((f"{mname}.{pname}" if mname else pname, p))
    return out


@contextlib.contextmanager
def _fake_tensors_look_real():
    """Hide fake tensors from transformers' ``is_tracing`` while tracing.

    transformers takes other code paths when it sees a FakeTensor (it materialises the
    causal mask it skips for real tensors), so the traced step would not run the ops a live
    step runs. Nothing else is changed; without transformers this does nothing.
    """
    import sys

    utils = sys.modules.get("transformers.utils.import_utils")
    original = getattr(utils, "is_fake_tensor", None)
    if original is None:
        yield
        return
    utils.is_fake_tensor = lambda x: False
    try:
        yield
    finally:
        utils.is_fake_tensor = original


def step_parts(made: object, name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], Callable]:
    """``(model, inputs, loss_fn)`` of what step factory ``name`` returned: a tuple of an
    ``nn.Module``, its input tensors (a tuple or list, or one tensor alone) and a callable.

    Raises:
        ValueError: anything else, naming what the factory returned.
    """
    if isinstance(made, tuple) and len(made) == 3:
        inputs = made[1] if isinstance(made[1], (tuple, list)) else (made[1],)
        if (isinstance(made[0], torch.nn.Module) and all(isinstance(t, torch.Tensor) for t in inputs)
                and callable(made[2])):
            return made[0], tuple(inputs), made[2]
    got = type(made).__name__ if not isinstance(made, (tuple, list)) else \
        f"a {type(made).__name__} of ({', '.join(type(x).__name__ for x in made)})"
    raise ValueError(f"model factory {name} returned {got}; it must return (model, inputs, loss_fn): an"
                     " nn.Module, a tuple of input tensors for model(*inputs), and loss_fn(output) -> scalar loss")


@contextlib.contextmanager
def _init_on_fake_tensors():
    """Let a model's weights be initialised on fake tensors while its factory runs.

    torch 2.13's ``nn.init.trunc_normal_`` samples by rejection: it redraws until no value lies
    outside ``[a, b]`` and asks ``mask.any()`` of the data each round (``_no_grad_trunc_normal_``
    in ``torch/nn/init.py``). A fake tensor has no data to answer that host read
    (``DataDependentOutputException``), so no model that initialises with it could be traced:
    torchvision's ViT, Swin, ConvNeXt, MaxViT, GoogLeNet and Inception v3. torch already
    makes it a no-op on meta tensors ("no storage, so sampling is a no-op"); inside the block it
    is one on fake tensors too, and unchanged on every other tensor.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    init = torch.nn.init
    original = init._no_grad_trunc_normal_

    def trunc_normal(tensor, *args, **kwargs):
        return tensor if isinstance(tensor, FakeTensor) else original(tensor, *args, **kwargs)

    init._no_grad_trunc_normal_ = trunc_normal
    try:
        yield
    finally:
        init._no_grad_trunc_normal_ = original


def _to_fake(factory_name: str, model: torch.nn.Module, inputs: tuple, fake_mode) -> tuple:
    """NOTE [a factory that reads tensor data]
    A factory that reads tensor data while it builds cannot run on fake tensors: a model whose
    architecture is computed with torch ops (torchvision's RegNet computes its widths with
    ``torch.pow`` and ``.tolist()``; vision transformers' reference code takes its stochastic
    depth rates from ``torch.linspace(...)``, item by item). :func:`trace_step` then calls it
    once more with real tensors on the card (host memory for its weights, which is said in a
    warning) and swaps every parameter, buffer and input of the result for a fake tensor of the
    same shape, dtype and device (tied parameters stay tied). The tensors the loss function
    keeps (its targets) stay real and are made fake where the step uses them
    (``allow_non_fake_inputs``). The step traced is the same; only the build costs memory.

    Returns the fake inputs; ``model`` is changed in place.
    """
    fakes: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor, param: bool = False) -> torch.Tensor:
        if id(t) not in fakes:
            f = fake_mode.from_tensor(t)
            fakes[id(t)] = torch.nn.Parameter(f, requires_grad=t.requires_grad) if param else f
        return fakes[id(t)]

    nbytes = sum(t.nbytes for t in {id(t): t for t in (*model.parameters(), *model.buffers())}.values())
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                module._parameters[name] = fake(p, param=True)
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = fake(b)
    fake_mode.allow_non_fake_inputs = True  # the loss function's own tensors
    warnings.warn(f"model factory {factory_name} reads tensor data while it builds, so it was built with real tensors"
                  f" ({nbytes / 2**20:,.1f} MiB of parameters and buffers in host memory) and then traced on"
                  " fake ones (NOTE [a factory that reads tensor data] in hpu_runtime.tools.tracing)", stacklevel=3)
    return tuple(fake(t) for t in inputs)


@contextlib.contextmanager
def _traced_device(dev: SimDevice):
    """Route the bridge to ``dev`` inside the block (a process-wide swap, see :func:`using_device`;
    the process's own device is untouched and restored after)."""
    was_active = bridge.is_active()
    if was_active:
        bridge.deactivate()
    try:
        with using_device(dev):
            yield
    finally:
        if was_active:
            bridge.activate()


OPTIMIZERS = ("sgd", "adamw", "fused-sgd", "fused-adamw", "fused-lamb", "fused-lars", "none")
"""Optimizers a traced step can use: torch's SGD (momentum) and AdamW; Gaudi's fused
``hpex`` ones (:mod:`hpu_runtime.api.hpex`), which run as one kernel per parameter group
(``fused-lars``: ``FusedLars`` over ``FusedResourceApplyMomentum``, as Habana's MLPerf
ResNet-50 builds it, LARS on every weight but batch-norm and bias); and ``none``: no update
and no ``zero_grad``, so gradients accumulate: a gradient-accumulation micro-step."""


class _Accumulate:
    """The optimizer of a gradient-accumulation micro-step: nothing to update, nothing zeroed."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self) -> None:
        pass


def make_optimizer(name: str, named: list[tuple[str, torch.nn.Parameter]], lr: float, momentum: float):
    """The optimizer :data:`OPTIMIZERS` names, over ``named`` ``(name, parameter)`` pairs (the
    names choose ``fused-lars``' LARS mask), as the tracer and ``models.train`` build it.

    Raises:
        ValueError: an unknown name.
    """
    from ..api import hpex

    params = [p for _, p in named]
    if name == "none":
        return _Accumulate()
    if name == "fused-lars":
        skip = ("bn", "bias", "downsample.1", "norm")
        base = hpex.FusedResourceApplyMomentum(params, lr=lr, momentum=momentum, weight_decay=5e-5)
        return hpex.FusedLars(base, [not any(k in n for k in skip) for n, _ in named])
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "fused-sgd":
        return hpex.FusedSGD(params, lr=lr, momentum=momentum)
    if name == "fused-adamw":
        return hpex.FusedAdamW(params, lr=lr)
    if name == "fused-lamb":
        return hpex.FusedLamb(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")


def trace_step(factory: Callable[[int], tuple], batch_size: int, *, spec: DeviceSpec,
               mode: str = "lazy", lazy_collectives: bool = False, optimizer: str = "sgd",
               lr: float = 0.05, momentum: float = 0.9, autocast: bool = False,
               ddp_bucket_cap_mb: float | None = None, ddp_first_bucket_mb: float | None = None) -> StepTrace:
    """Trace one steady-state training step of ``factory(batch_size)`` without data.

    Args:
        factory: ``factory(batch_size) -> (model, inputs, loss_fn)``; called under
            ``FakeTensorMode`` with ``hpu`` as the default device, so it must build everything
            with torch factories (the inputs are then taken as host batches).
        batch_size: per-card batch.
        spec: the simulated device.
        mode: one of :data:`MODES`.
        lazy_collectives: recorded in the trace for the planner.
        optimizer: one of :data:`OPTIMIZERS` (``"sgd"``: momentum, as ``models.train``).
        autocast: bf16 autocast of forward and loss (as :func:`training_step`).
        ddp_bucket_cap_mb: compile mode only: the model is compiled as
            ``torch.compile(DDP(model, bucket_cap_mb=...), backend="hpu_backend")`` compiles
            it, broken by DDPOptimizer at these bucket boundaries (MiB; its first bucket is
            ``ddp_first_bucket_mb``, default ``dist._DEFAULT_FIRST_BUCKET_BYTES``). None:
            one graph, as without DDP. The planner needs a trace made for its cap.
        ddp_first_bucket_mb: see ``ddp_bucket_cap_mb``.

    Returns:
        The :class:`StepTrace`; compile costs are left out (a steady-state step hits the
        recipe cache).

    A factory that reads tensor data while it builds is built once more with real tensors
    (NOTE [a factory that reads tensor data]); ``nn.init.trunc_normal_`` is not such a read
    (:func:`_init_on_fake_tensors`).

    Raises:
        ValueError: unknown mode or optimizer, non-positive batch, a factory that does not
            return ``(nn.Module, tuple of tensors, callable)`` (:func:`step_parts`), a DDP cap outside compile
            mode or one smaller than its first bucket (DDPOptimizer refuses it), a model
            torch.compile leaves uncompiled under DDP (one of torch's own modules, e.g. a bare
            ``nn.Sequential``), or a compile-mode model of which dynamo compiled nothing.
    """
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode, unset_fake_temporarily

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch size must be a positive int, got {batch_size!r}")
    split = ddp_graph_split(ddp_bucket_cap_mb, ddp_first_bucket_mb) if ddp_bucket_cap_mb is not None else None
    if split is not None and mode != "compile":
        raise ValueError(f"ddp_bucket_cap_mb breaks compiled graphs; it needs mode 'compile', not {mode!r}")
    wall0 = time.perf_counter()
    dev = replay_device(spec, mode, fallback=config().fallback)
    with _traced_device(dev), FakeTensorMode(allow_non_fake_inputs=False) as fake_mode:
        try:
            with torch.device("hpu"), _init_on_fake_tensors():  # the model on the card, as a live script moves it
                made = factory(batch_size)  # (fake tensors cannot be .to()'d)
            real = False
        except DataDependentOutputException:
            real = True  # NOTE [a factory that reads tensor data]
            with unset_fake_temporarily(), torch.device("hpu"):
                made = factory(batch_size)
        name = getattr(factory, "__name__", repr(factory))
        model, inputs, loss_fn = step_parts(made, name)
        if real:
            inputs = _to_fake(name, model, inputs, fake_mode)
        inputs = tuple(t.cpu() for t in inputs)  # host batches: the step copies them to the card
        named = ddp_parameters(model)
        frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
        prepare_model(model, mode)
        bridge.activate(fake=True)
        try:
            for t in (*model.parameters(), *model.buffers()):  # on the card, already there when the step starts
                dev.make_resident(t)
            opt = make_optimizer(optimizer, named, lr, momentum)
            index = {id(p): i for i, (_, p) in enumerate(named)}
            grad_serial: dict[int, int] = {}

            def hook(p: torch.Tensor) -> None:
                i = index[id(p)]
                grad_serial[i] = dev.serial_of(p.grad)
                dev.mark(("grad_ready", i))

            handles = [p.register_post_accumulate_grad_hook(hook) for _, p in named]
            stepped = _compiled(model, split) if mode == "compile" else model
            run = _step_runner(stepped, inputs, loss_fn, opt, autocast)
            with _fake_tensors_look_real():
                run()  # warm-up: optimizer state
                run()  # and the scalars a later step reuses are on the device (NOTE [scalars as graph inputs])
                dev.begin_step()
                dev.hbm.reset_peak()
                dev.log = []
                run()
                dev.end_step()
            events, dev.log = dev.log, None
            if mode == "compile" and not any(ev[0] == "region" for ev in events):
                raise ValueError("compile mode: dynamo compiled no graph of this model")
            for h in handles:
                h.remove()
        finally:
            bridge.deactivate()
    params = [ParamInfo(name=n, numel=p.numel(), dtype=str(p.dtype), nbytes=p.numel() * p.element_size(),
                        grad_serial=grad_serial.get(i, -1)) for i, (n, p) in enumerate(named)]
    return StepTrace(spec=spec, mode=mode, lazy_collectives=lazy_collectives, batch_size=batch_size, autocast=autocast,
                     events=events, params=params, frozen=frozen, peak_hbm_bytes=dev.hbm.peak_bytes,
                     wall_s=time.perf_counter() - wall0, ddp_split=split)


def ddp_graph_split(bucket_cap_mb: float | None, first_bucket_mb: float | None = None) -> tuple[int, int]:
    """``(first_bucket_bytes, bucket_bytes)`` at which DDPOptimizer breaks a model compiled under
    ``DDP(model, bucket_cap_mb=...)``: DDP's ``bucket_bytes_cap`` (``bucket_cap_mb`` MiB, None:
    DDP's default 25 MiB) and ``dist._DEFAULT_FIRST_BUCKET_BYTES`` when DDPOptimizer is made
    (``first_bucket_mb`` MiB, None: torch's value), as ``torch/_dynamo/convert_frame.py`` builds it.

    Raises:
        ValueError: a non-positive size, or a first bucket larger than the cap (torch's
            DDPOptimizer raises an AssertionError for it: "First bucket should be
            smaller/equal to other buckets").
    """
    import torch.distributed as dist

    mb = 1024 * 1024
    cap = 25.0 if bucket_cap_mb is None else bucket_cap_mb
    for name, v in (("bucket_cap_mb", cap), ("first_bucket_mb", first_bucket_mb)):
        if v is not None and not v > 0:
            raise ValueError(f"{name} must be > 0, got {v!r}")
    first = dist._DEFAULT_FIRST_BUCKET_BYTES if first_bucket_mb is None else int(first_bucket_mb * mb)
    if first > int(cap * mb):
        raise ValueError(f"torch.compile of a DDP model needs bucket_cap_mb ({cap:g} MiB) >= the first bucket"
                         f" ({first / mb:g} MiB, dist._DEFAULT_FIRST_BUCKET_BYTES): torch's DDPOptimizer refuses"
                         " a smaller cap")
    return first, int(cap * mb)


def _compiled(model: torch.nn.Module, split: tuple[int, int] | None):
    """``model`` compiled as the live step compiles it: ``hpu_backend``, behind DDPOptimizer's
    graph breaks when ``split`` is given. Dynamo's caches are reset first (every traced model
    is a new object: its compiled code would otherwise pile up to dynamo's recompile limit,
    after which dynamo silently stops compiling)."""
    import torch._dynamo

    from ..bridge.compile_backend import hpu_backend

    torch._dynamo.reset()
    backend = hpu_backend
    if split is not None:
        from torch._dynamo import trace_rules
        from torch._dynamo.backends.distributed import DDPOptimizer

        if trace_rules.check(type(model).forward):
            raise ValueError(f"under DDP, torch.compile leaves {type(model).__name__} uncompiled: dynamo skips the"
                             " forward of torch's own modules (torch/nn) when DDP calls it; wrap the model in a"
                             " module of your own")

        backend = DDPOptimizer(bucket_bytes_cap=split[1], backend_compile_fn=hpu_backend,
                               first_bucket_cap=split[0]).compile_fn
    return torch.compile(model, backend=backend)


def _step_runner(model, inputs, loss_fn, opt, autocast: bool) -> Callable[[], None]:
    def fresh_inputs() -> tuple:  # a new host batch every step, as a data loader gives
        bridge.deactivate()  # the bridge only: the fake mode below it stays on
        try:
            return tuple(t.clone() for t in inputs)
        finally:
            bridge.activate(fake=True)

    return lambda: training_step(model, fresh_inputs(), loss_fn, opt, autocast=autocast)
