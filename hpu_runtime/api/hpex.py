"""Gaudi's fused optimizers and gradient clipping (``habana_frameworks.torch.hpex``), emulated.

Why users adopt them: a torch optimizer on a Gaudi in lazy mode sends every per-parameter op
of its update (``mul_``, ``add_``, ``addcdiv_``...) through the bridge, each costing host
time to record; a fused optimizer is one TPC kernel per parameter group over lists of
tensors. Here the numerics are computed on the host with plain torch ops (real values), and
the device is charged one fused kernel (:meth:`hpu_runtime.bridge.sim_device.SimDevice.fused_kernel`):
one op's host cost, one roofline over every byte it reads and writes.

As in Intel's implementation, each kernel is preceded and followed by a lazy-mode launch
(``htcore.step_closure._mark_step_if_lazy()`` in Intel's sources), so the optimizer runs
as its own graph.

Semantics follow Intel's public sources (HabanaAI/gaudi-pytorch-bridge,
``python_packages/habana_frameworks/torch/hpex/optimizers/*.py`` and
``hpex/normalization/FusedClipNorm.py``); where the kernel itself is closed, the update rule
is the published algorithm the docstring names:

========================== ===================================================================
name                       update (per parameter ``w`` with gradient ``g``)
========================== ===================================================================
FusedSGD                   ``torch.optim.SGD`` (weight decay, momentum, dampening, Nesterov)
FusedResourceApplyMomentum TensorFlow's ResourceApplyMomentum as Intel's docstring states it:
                           ``m = momentum * m + g; w = w + m``. It applies neither ``lr`` nor
                           weight decay: it expects gradients already scaled by ``-lr`` (what
                           :class:`FusedLars` writes); the first step sets ``m = g``.
FusedLars                  LARS (You et al., "Large Batch Training of Convolutional Networks",
                           2017) before the wrapped optimizer: for masked-in parameters
                           ``trust = eeta*|w| / (|g| + wd*|w| + eps)`` (1 if a norm is 0) and
                           ``g = -lr * trust * (g + wd*w)``; masked-out: ``g = -lr * g``. The
                           wrapped optimizer's weight decay is zeroed during its step.
FusedLamb                  LAMB (You et al., "Large Batch Optimization for Deep Learning", 2019)
                           with global-norm clipping to ``max_grad_norm`` first; decoupled
                           weight decay in the update; trust ratio ``|w|/|u|`` when
                           ``use_lamb`` or ``weight_decay != 0`` (1 if a norm is 0).
FusedAdamW                 AdamW (Loshchilov & Hutter 2019) in Intel's form:
                           ``w *= 1 - lr*wd``, ``w -= lr*sqrt(1-b2^t)/(1-b1^t) * m/(sqrt(v)+eps)``
                           (eps outside the bias correction, unlike ``torch.optim.AdamW``;
                           ``bias_correction=False`` drops both factors).
FusedClipNorm              ``torch.nn.utils.clip_grad_norm_`` (L2 norm, clip coefficient
                           ``max_norm / (norm + 1e-6)`` capped at 1); returns the total norm.
FusedEMA                   an exponential moving average of a model's ``state_dict``
                           (``hpex.movingavrg``): ``ema = d * ema + (1 - d) * value`` with
                           ``d = decay * (1 - exp(-updates / 2000))``, as Intel's
                           ``hpex/movingavrg/FusedEMA.py`` and its ``optimizer_ema`` kernel
                           (``hpu_ops/backend/optimizer_ema_gen.cpp``) compute it.
========================== ===================================================================

On host (non-"hpu") parameters nothing is charged: the update is plain host work.

One module (about 520 lines) for the seven names of Gaudi's ``hpex`` and the fused AdamW op
(``torch.ops.hpu.optimizer_adamw``), as Intel's ``hpex.optimizers``, ``hpex.normalization``
and ``hpex.movingavrg`` are thin over one kernel library: they share the launch-and-charge
helper and the FLOP table, and each class is a short update rule.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable

import torch
from torch.optim import SGD, Optimizer

from ..bridge.runtime import get_device

__all__ = ["FusedSGD", "FusedResourceApplyMomentum", "FusedLars", "FusedLamb", "FusedAdamW", "FusedClipNorm",
           "FusedEMA"]

# Vector FLOPs per element of each kernel (multiply-adds counted as 2); all of them are far
# below the TPC roofline's ridge point, so their time is the HBM traffic.
_FLOPS_PER_ELEMENT = {"sgd": 6, "momentum": 2, "lars": 8, "lamb_norm": 2, "lamb_phase1": 14,
                      "lamb_phase2": 5, "adamw": 12, "clip_norm": 3, "ema": 3}


def _mark_step_if_lazy() -> None:
    dev = get_device()
    if dev.lazy:
        dev.launch("mark_step")


def _kernel(name: str, flops_key: str, reads, writes, numel: int):
    return get_device().fused_kernel(f"hpex.{name}", reads, writes, _FLOPS_PER_ELEMENT[flops_key] * numel)


def _evaluate(closure):
    """The optimizer-step protocol: ``closure()`` under grad mode, or None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _with_grad(group: dict) -> list[torch.Tensor]:
    return [p for p in group["params"] if p.grad is not None]


def _adam_moments(g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, beta1: float, beta2: float) -> None:
    """Adam's moment updates in place: ``m = beta1*m + (1-beta1)*g``, ``v = beta2*v + (1-beta2)*g*g``."""
    m.mul_(beta1).add_(g, alpha=1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)


def _state_tensors(state: dict, params: list[torch.Tensor], *keys: str) -> list[torch.Tensor]:
    return [state[p][k] for p in params for k in keys if isinstance(state[p].get(k), torch.Tensor)]


class FusedSGD(SGD):
    """``habana_frameworks.torch.hpex.optimizers.FusedSGD(params, lr, momentum=0, weight_decay=0,
    dampening=0, nesterov=False)``: ``torch.optim.SGD``'s update, one fused kernel per group.

    Raises:
        ValueError: as ``torch.optim.SGD`` for a negative lr, momentum or weight decay.
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 dampening: float = 0.0, nesterov: bool = False) -> None:
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, foreach=False)

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for group in self.param_groups for p in _with_grad(group)]
        if not params:
            return super().step(closure)
        _mark_step_if_lazy()
        with _kernel("FusedSGD", "sgd", lambda: [*params, *(p.grad for p in params),
                                                 *_state_tensors(self.state, params, "momentum_buffer")],
                     lambda: [*params, *_state_tensors(self.state, params, "momentum_buffer")],
                     sum(p.numel() for p in params)):
            loss = super().step(closure)
        _mark_step_if_lazy()
        return loss


class FusedResourceApplyMomentum(Optimizer):
    """``FusedResourceApplyMomentum(params, lr, momentum=0, weight_decay=0, nesterov=False)``.

    ``m = momentum * m + g; w += m`` (first step ``m = g``): gradients must already carry
    ``-lr`` (see the module table); ``lr``, ``weight_decay`` and ``nesterov`` are kept in the
    param groups for schedulers and :class:`FusedLars`, as in Intel's class.

    Raises:
        ValueError: negative lr, momentum or weight decay; Nesterov without momentum.
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum requires a momentum")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov))

    @torch.no_grad()
    def step(self, closure=None):
        loss = _evaluate(closure)
        for group in self.param_groups:
            params = _with_grad(group)
            if not params:
                continue
            momentum = group["momentum"]
            _mark_step_if_lazy()
            with _kernel("FusedResourceApplyMomentum", "momentum",
                         lambda: [*params, *(p.grad for p in params), *_state_tensors(self.state, params, "momentum_buffer")],
                         lambda: [*params, *_state_tensors(self.state, params, "momentum_buffer")],
                         sum(p.numel() for p in params)):
                for p in params:
                    state = self.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = p.grad.detach().clone()
                        if momentum != 0:
                            state["momentum_buffer"] = buf
                    else:
                        buf.mul_(momentum).add_(p.grad)
                    p.add_(buf)
            _mark_step_if_lazy()
        return loss


class FusedLars(Optimizer):
    """``FusedLars(optimizer, skip_mask, eeta=0.001, eps=1e-8)``: LARS gradient scaling, then
    ``optimizer.step()`` (Intel's ResNet-50 wraps :class:`FusedResourceApplyMomentum`).

    Args:
        optimizer: the wrapped optimizer; its param groups are this optimizer's.
        skip_mask: one truthy/falsy entry per parameter of each group (indexed by position in
            the group, as Intel's class does): truthy = apply LARS and weight decay.

    Raises:
        ValueError: ``skip_mask`` shorter than a parameter group.
    """

    def __init__(self, optimizer: Optimizer, skip_mask, eeta: float = 0.001, eps: float = 1e-8) -> None:
        self.optim = optimizer
        self.eeta, self.eps, self.skip_mask = eeta, eps, list(skip_mask)
        for group in optimizer.param_groups:
            if len(self.skip_mask) < len(group["params"]):
                raise ValueError(f"FusedLars: skip_mask has {len(self.skip_mask)} entries but a parameter group "
                                 f"has {len(group['params'])} parameters")
        defaults = dict(optimizer.defaults, skip_mask=self.skip_mask, eeta=eeta, eps=eps)
        super().__init__(optimizer.param_groups, defaults)
        self.state = optimizer.state

    def zero_grad(self, set_to_none: bool = False) -> None:
        self.optim.zero_grad(set_to_none)

    def step(self, closure=None):
        loss = _evaluate(closure)
        decays = []
        with torch.no_grad():
            for group in self.optim.param_groups:
                wd = group.get("weight_decay", 0.0)
                decays.append(wd)
                group["weight_decay"] = 0.0
                items = [(p, self.skip_mask[i]) for i, p in enumerate(group["params"]) if p.grad is not None]
                if not items:
                    continue
                params = [p for p, _ in items]
                _mark_step_if_lazy()
                with _kernel("FusedLars", "lars", [*params, *(p.grad for p in params)], [p.grad for p in params],
                             sum(p.numel() for p in params)):
                    lr = group["lr"]
                    for p, lars in items:
                        g = p.grad
                        if lars:  # tensors only: no host read (and traceable under FakeTensorMode)
                            w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
                            trust = torch.where((w_norm > 0) & (g_norm > 0),
                                                self.eeta * w_norm / (g_norm + wd * w_norm + self.eps), 1.0)
                            g.add_(p, alpha=wd).mul_(trust * -lr)
                        else:
                            g.mul_(-lr)
                _mark_step_if_lazy()
        try:
            self.optim.step()
        finally:
            for group, wd in zip(self.optim.param_groups, decays):
                group["weight_decay"] = wd
        return loss


class FusedLamb(Optimizer):
    """``FusedLamb(params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
    weight_decay=0.01, amsgrad=False, adam_w_mode=True, grad_averaging=True,
    set_grad_none=True, max_grad_norm=1.0, use_lamb=False, fused=False, dtype=None)``.

    Three kernels per step as in Intel's class: the global gradient norm (all groups), then
    per group phase 1 (moments and the Adam step) and phase 2 (trust ratio and update). State
    ``exp_avg``/``exp_avg_sq`` is float32; ``step`` counts per group.

    Raises:
        RuntimeError: ``amsgrad=True`` (not supported by Intel's either) or a sparse gradient.
    """

    def __init__(self, params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, amsgrad: bool = False, adam_w_mode: bool = True,
                 grad_averaging: bool = True, set_grad_none: bool = True, max_grad_norm: float | None = 1.0,
                 use_lamb: bool = False, fused: bool = False, dtype: torch.dtype | None = None) -> None:
        if amsgrad:
            raise RuntimeError("FusedLamb does not support the AMSGrad variant.")
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                                      weight_decay=weight_decay, grad_averaging=grad_averaging,
                                      max_grad_norm=max_grad_norm))
        self.adam_w_mode, self.set_grad_none, self.use_lamb = adam_w_mode, set_grad_none, use_lamb
        self.fused, self.dtype = fused, dtype

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = _evaluate(closure)
        grads = [p.grad for g in self.param_groups for p in _with_grad(g)]
        if any(g.is_sparse for g in grads):
            raise RuntimeError("Lamb does not support sparse gradients, consider SparseAdam instead.")
        if not grads:
            return loss
        max_norm = self.defaults["max_grad_norm"]
        clip = 1.0
        if max_norm is not None:  # tensors only: no host read (and traceable under FakeTensorMode)
            with _kernel("FusedLamb.norm", "lamb_norm", grads, [], sum(g.numel() for g in grads)):
                total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
                clip = torch.where(total > max_norm, total / max_norm, 1.0)
        for group in self.param_groups:
            params = _with_grad(group)
            if not params:
                continue
            group["step"] = group.get("step", 0) + 1
            b1, b2 = group["betas"]
            t, wd, eps = group["step"], group["weight_decay"], group["eps"]
            bc1, bc2 = (1 - b1 ** t, 1 - b2 ** t) if group["bias_correction"] else (1.0, 1.0)
            beta3 = 1 - b1 if group["grad_averaging"] else 1.0
            numel = sum(p.numel() for p in params)
            _mark_step_if_lazy()
            updates = []
            for p in params:
                st = self.state[p]
                if not st:
                    st["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
                    st["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            with _kernel("FusedLamb.phase1", "lamb_phase1",
                         [*params, *(p.grad for p in params), *_state_tensors(self.state, params, "exp_avg", "exp_avg_sq")],
                         _state_tensors(self.state, params, "exp_avg", "exp_avg_sq"), numel):
                for p in params:
                    st = self.state[p]
                    g = p.grad.float() / clip
                    st["exp_avg"].mul_(b1).add_(g, alpha=beta3)
                    st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
                    u = (st["exp_avg"] / bc1) / ((st["exp_avg_sq"] / bc2).sqrt() + eps)
                    if wd != 0.0:
                        u.add_(p.float(), alpha=wd)
                    updates.append(u)
            _mark_step_if_lazy()
            with _kernel("FusedLamb.phase2", "lamb_phase2", params, params, numel):
                for p, u in zip(params, updates):
                    if self.use_lamb or wd != 0.0:
                        w_norm, u_norm = torch.linalg.vector_norm(p.float()), torch.linalg.vector_norm(u)
                        ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
                        u = u * ratio
                    p.add_(u.to(p.dtype), alpha=-group["lr"])
            _mark_step_if_lazy()
        return loss


class FusedAdamW(Optimizer):
    """``FusedAdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
    bias_correction=True)``: one kernel per group (formula in the module table).

    A param group may carry ``correct_bias`` instead of ``bias_correction`` (old checkpoints,
    as Intel's class accepts).

    Raises:
        ValueError: lr < 0, a beta outside [0, 1), eps < 0.
        RuntimeError: a sparse gradient.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, bias_correction: bool = True) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr} - should be >= 0.0")
        for i in (0, 1):
            if not 0.0 <= betas[i] < 1.0:
                raise ValueError(f"Invalid beta parameter: {betas[i]} - should be in [0.0, 1.0[")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps} - should be >= 0.0")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      bias_correction=bias_correction))

    @torch.no_grad()
    def step(self, closure=None):
        loss = _evaluate(closure)
        for group in self.param_groups:
            params = _with_grad(group)
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam")
            _mark_step_if_lazy()
            for p in params:
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            group["step"] = group.get("step", 0) + 1
            b1, b2 = group["betas"]
            correct = group["bias_correction"] if "bias_correction" in group else group["correct_bias"]
            step_size = group["lr"]
            if correct:
                step_size *= math.sqrt(1 - b2 ** group["step"]) / (1 - b1 ** group["step"])
            decay = 1.0 - group["weight_decay"] * group["lr"]
            states = _state_tensors(self.state, params, "exp_avg", "exp_avg_sq")
            with _kernel("FusedAdamW", "adamw", [*params, *(p.grad for p in params), *states], [*params, *states],
                         sum(p.numel() for p in params)):
                for p in params:
                    st = self.state[p]
                    st["step"] += 1
                    m, v = st["exp_avg"], st["exp_avg_sq"]
                    _adam_moments(p.grad, m, v, b1, b2)
                    if decay != 1.0:
                        p.mul_(decay)
                    p.addcdiv_(m, v.sqrt().add_(group["eps"]), value=-step_size)
            _mark_step_if_lazy()
        return loss


class FusedClipNorm:
    """``FusedClipNorm(parameters, max_norm)``; ``clip_norm(parameters)`` clips in place.

    ``clip_norm`` takes the parameters (an iterable, or one tensor) whose ``.grad`` to clip by
    their total L2 norm, as ``torch.nn.utils.clip_grad_norm_(parameters, max_norm)`` does, and
    returns that total norm as a 0-d float32 tensor (``tensor(0.)`` when no gradient exists).
    The ``parameters`` given to the constructor are not used (as in Intel's class).
    """

    def __init__(self, parameters: Iterable[torch.nn.Parameter], max_norm: float) -> None:
        self.max_norm = float(max_norm)
        self.norm_type = 2.0

    def clip_norm(self, parameters) -> torch.Tensor:
        if isinstance(parameters, torch.Tensor):
            grads = [parameters.grad] if parameters.grad is not None else []
        else:
            grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        _mark_step_if_lazy()
        with torch.no_grad(), _kernel("FusedClipNorm", "clip_norm", grads, grads, sum(g.numel() for g in grads)):
            total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
            coef = torch.clamp(self.max_norm / (total + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coef.to(g.dtype))
        _mark_step_if_lazy()
        return total


_WRAPPERS = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)


class FusedEMA:
    """``habana_frameworks.torch.hpex.movingavrg.FusedEMA(model, decay=0.9999, updates=0)``: an
    exponential moving average of ``model``'s ``state_dict`` (YOLOX's model EMA on Gaudi).

    ``ema`` is a copy of the model (of its ``.module`` under DDP or DataParallel) in eval mode;
    :meth:`update` takes ``model``'s current ``state_dict`` values, in order, and updates every
    floating-point entry of ``ema``'s to ``d * ema + (1 - d) * value`` with
    ``d = decay * (1 - exp(-updates / 2000))`` (``updates`` counts calls, from ``updates``),
    as one fused kernel between two lazy-mode launches. Integer buffers (BatchNorm's
    ``num_batches_tracked``) keep the copy's value, as YOLOX's reference ``ModelEMA`` does
    (Intel's kernel source does not say what it does with them).

    Attributes:
        ema: the averaged model. decay: ``updates -> d``. updates: update count.
        updated_ema: ``ema``'s ``state_dict`` values, in order (what the kernel writes).

    Raises:
        ValueError: a negative ``decay`` (at construction).
        RuntimeError: :meth:`update` with a model whose ``state_dict`` has another number of
            entries, or an entry of another shape, than ``ema``'s.
    """

    def __init__(self, model: torch.nn.Module, decay: float = 0.9999, updates: float = 0) -> None:
        if not 0.0 <= decay:
            raise ValueError(f"Invalid decay value: {decay}")
        self.ema = copy.deepcopy(model.module if isinstance(model, _WRAPPERS) else model).eval()
        self.decay = lambda x: decay * (1 - math.exp(-x / 2000))
        self.updates = updates
        self.updated_ema = list(self.ema.state_dict().values())

    def update(self, model: torch.nn.Module) -> None:
        """One EMA step towards ``model``'s current ``state_dict``."""
        values = list(model.state_dict().values())
        if len(values) != len(self.updated_ema):
            raise RuntimeError(f"FusedEMA.update: the model's state_dict has {len(values)} entries and the"
                               f" EMA's {len(self.updated_ema)}: they must match, in order")
        for i, (v, e) in enumerate(zip(values, self.updated_ema)):
            if v.shape != e.shape:
                raise RuntimeError(f"FusedEMA.update: state_dict entry {i} has shape {tuple(v.shape)} in the"
                                   f" model and {tuple(e.shape)} in the EMA")
        pairs = [(v, e) for v, e in zip(values, self.updated_ema) if e.dtype.is_floating_point]
        _mark_step_if_lazy()
        self.updates += 1
        d = self.decay(self.updates)
        with torch.no_grad(), _kernel("FusedEMA", "ema", [*(v for v, _ in pairs), *(e for _, e in pairs)],
                                      [e for _, e in pairs], sum(e.numel() for _, e in pairs)):
            for v, e in pairs:
                e.mul_(d).add_(v.detach().to(e.dtype), alpha=1.0 - d)
        _mark_step_if_lazy()

    def update_attr(self, model: torch.nn.Module, include=(), exclude=("process_group", "reducer")) -> None:
        """Copy ``model``'s public attributes (not starting with ``_``) onto ``ema``: those named in
        ``include`` if it is not empty, never those in ``exclude``."""
        for k, v in model.__dict__.items():
            if (include and k not in include) or k.startswith("_") or k in exclude:
                continue
            setattr(self.ema, k, v)


def optimizer_adamw(gradient_vec, weight_vec, exp_avg_vec, exp_avg_sq_vec, neg_step_t: torch.Tensor, beta1: float,
                    beta2: float, epsilon: float, weight_decay, has_weight_decay: bool | None = None,
                    exp_avg_scales=None, exp_avg_sq_scales=None) -> None:
    """``torch.ops.hpu.optimizer_adamw``: Gaudi's fused AdamW kernel over lists of tensors, in place
    (what DeepSpeed's HPU ``FusedAdam`` calls), as one fused kernel.

    Per tensor, as Intel's kernel computes it (HabanaAI/gaudi-pytorch-bridge,
    ``hpu_ops/backend/optimizer_adamw_gen.cpp``): ``m = beta1*m + (1-beta1)*g``,
    ``v = beta2*v + (1-beta2)*g*g``, ``w = w*weight_decay`` (when there is weight decay) then
    ``w += neg_step * m / (sqrt(v) + epsilon)``. ``weight_decay`` is the multiplier
    ``1 - lr*wd``: a float in lazy mode's schema (decay when it is not 1), a tensor with
    ``has_weight_decay`` in eager mode's (``kernels_register.cpp`` / ``eager_custom_op_register.cpp``).

    Raises:
        RuntimeError: lists of different lengths, or no weights (Intel's messages).
        NotImplementedError: fp8 moment scales (``exp_avg_scales``): not emulated.
    """
    n = len(weight_vec)
    if not (len(gradient_vec) == n == len(exp_avg_vec) == len(exp_avg_sq_vec)):
        raise RuntimeError(f"optimizer_adamw : expects the four tensor lists to have the same length, got "
                           f"{len(gradient_vec)}, {n}, {len(exp_avg_vec)}, {len(exp_avg_sq_vec)}")
    if n == 0:
        raise RuntimeError("optimizer_adamw : can not process empty weight vector")
    if (exp_avg_scales is None) != (exp_avg_sq_scales is None):
        raise RuntimeError("optimizer_adamw : expects both or neighter scales to be set")
    if exp_avg_scales is not None:
        raise NotImplementedError("torch.ops.hpu.optimizer_adamw with fp8 moments (exp_avg_scales) is not emulated")
    if has_weight_decay is None:  # lazy mode's schema: a float multiplier
        has_weight_decay = weight_decay != 1.0
    numel = sum(w.numel() for w in weight_vec)
    with torch.no_grad(), get_device().fused_kernel(
            "hpu.optimizer_adamw", [*gradient_vec, *weight_vec, *exp_avg_vec, *exp_avg_sq_vec],
            [*weight_vec, *exp_avg_vec, *exp_avg_sq_vec], _FLOPS_PER_ELEMENT["adamw"] * numel):
        for g, w, m, v in zip(gradient_vec, weight_vec, exp_avg_vec, exp_avg_sq_vec):
            _adam_moments(g, m, v, beta1, beta2)
            if has_weight_decay:
                w.mul_(weight_decay)
            w.add_(m / (v.sqrt() + epsilon) * neg_step_t)
