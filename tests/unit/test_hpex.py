"""Gaudi's fused optimizers (hpu_runtime.api.hpex): numerics against numpy float64 references of
the published update rules, and one fused kernel charged per group instead of per-op costs."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

import hpu_runtime
from hpu_runtime import reset_device
from hpu_runtime.api.hpex import (
    FusedAdamW,
    FusedClipNorm,
    FusedEMA,
    FusedLamb,
    FusedLars,
    FusedResourceApplyMomentum,
    FusedSGD,
)
from tests.integration.launch_helpers import run

SHAPES = [(7, 5), (5,), (3, 4, 2)]
STEPS = 4


def _setup(seed: int = 0):
    """Parameters on the simulated device and per-step gradients (non-integer, seeded)."""
    g = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]
    grads = [[torch.randn(s, generator=g, dtype=torch.float64) * 0.5 for s in SHAPES] for _ in range(STEPS)]
    params = [torch.nn.Parameter(t.float().to("hpu")) for t in init]
    return params, [t.numpy().copy() for t in init], [[t.numpy() for t in step] for step in grads]


def _run(opt, params, grads) -> list[np.ndarray]:
    for step in grads:
        for p, gr in zip(params, step):
            p.grad = torch.from_numpy(gr).float().to("hpu")
        opt.step()
    return [p.detach().double().cpu().numpy() for p in params]


def _close(got, want, rtol=2e-5, atol=2e-6):
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def test_fused_sgd_matches_momentum_sgd_reference() -> None:
    params, w, grads = _setup(1)
    lr, mom, wd, damp = 0.1, 0.9, 1e-2, 0.1
    got = _run(FusedSGD(params, lr=lr, momentum=mom, weight_decay=wd, dampening=damp), params, grads)
    bufs = [None] * len(w)
    for step in grads:
        for i, g in enumerate(step):
            d = g + wd * w[i]
            bufs[i] = d.copy() if bufs[i] is None else mom * bufs[i] + (1 - damp) * d
            w[i] = w[i] - lr * bufs[i]
    _close(got, w)


def test_fused_adamw_matches_intel_adamw_reference() -> None:
    params, w, grads = _setup(2)
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.99, 1e-6, 0.05
    got = _run(FusedAdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd), params, grads)
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    for t, step in enumerate(grads, 1):
        size = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        for i, g in enumerate(step):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            w[i] = w[i] * (1 - wd * lr) - size * m[i] / (np.sqrt(v[i]) + eps)
    _close(got, w)


def test_fused_adamw_without_bias_correction() -> None:
    params, w, grads = _setup(3)
    lr, b1, b2, eps = 1e-2, 0.9, 0.999, 1e-6
    got = _run(FusedAdamW(params, lr=lr, eps=eps, bias_correction=False), params, grads)
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    for step in grads:
        for i, g in enumerate(step):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            w[i] = w[i] - lr * m[i] / (np.sqrt(v[i]) + eps)
    _close(got, w)


@pytest.mark.parametrize("max_grad_norm", [1.0, None])
def test_fused_lamb_matches_lamb_reference(max_grad_norm) -> None:
    params, w, grads = _setup(4)
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-6, 0.01
    got = _run(FusedLamb(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, max_grad_norm=max_grad_norm),
               params, grads)
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    for t, step in enumerate(grads, 1):
        norm = math.sqrt(sum(float((g * g).sum()) for g in step))
        clip = norm / max_grad_norm if max_grad_norm is not None and norm > max_grad_norm else 1.0
        for i, g in enumerate(step):
            g = g / clip
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            u = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps) + wd * w[i]
            ratio = np.linalg.norm(w[i]) / np.linalg.norm(u)
            w[i] = w[i] - lr * ratio * u
    _close(got, w)


def test_fused_lars_over_resource_apply_momentum_matches_lars_reference() -> None:
    """Intel's ResNet-50 recipe: FusedLars(FusedResourceApplyMomentum(...), skip_mask)."""
    params, w, grads = _setup(5)
    lr, mom, wd, eeta, eps = 0.5, 0.9, 1e-3, 1e-3, 1e-8
    mask = [True, False, True]
    inner = FusedResourceApplyMomentum(params, lr=lr, momentum=mom, weight_decay=wd)
    got = _run(FusedLars(inner, mask, eeta=eeta, eps=eps), params, grads)
    assert inner.param_groups[0]["weight_decay"] == wd  # handed back after each step
    bufs = [None] * len(w)
    for step in grads:
        for i, g in enumerate(step):
            if mask[i]:
                wn, gn = np.linalg.norm(w[i]), np.linalg.norm(g)
                trust = eeta * wn / (gn + wd * wn + eps)
                d = -lr * trust * (g + wd * w[i])
            else:
                d = -lr * g
            bufs[i] = d.copy() if bufs[i] is None else mom * bufs[i] + d
            w[i] = w[i] + bufs[i]
    _close(got, w)


def test_fused_clip_norm_matches_reference_and_returns_the_norm() -> None:
    params, _, grads = _setup(6)
    for p, g in zip(params, grads[0]):
        p.grad = torch.from_numpy(g * 3.0).float().to("hpu")
    total = FusedClipNorm(params, 1.0).clip_norm(params)
    want_norm = math.sqrt(sum(float(((g * 3.0) ** 2).sum()) for g in grads[0]))
    assert total.item() == pytest.approx(want_norm, rel=1e-5)
    for p, g in zip(params, grads[0]):
        np.testing.assert_allclose(p.grad.double().cpu().numpy(), g * 3.0 / (want_norm + 1e-6), rtol=1e-5, atol=1e-7)
    assert FusedClipNorm(params, 1.0).clip_norm(torch.nn.Parameter(torch.ones(2))).item() == 0.0


def test_fused_optimizer_is_one_kernel_and_saves_host_time() -> None:
    """torch's SGD records per-parameter ops; FusedSGD records one kernel whose bytes are
    every parameter, gradient and momentum buffer read once and parameter and buffer written."""
    def host_and_ops(make):
        dev = reset_device("gaudi2")
        params, _, grads = _setup(7)
        opt = make(params)
        _run(opt, params, grads[:1])  # momentum buffers exist from here on
        hpu_runtime.mark_step()
        for p, g in zip(params, grads[1]):
            p.grad = torch.from_numpy(g).float().to("hpu")
        hpu_runtime.mark_step()
        dev.log = []
        h0, n0 = dev.host_ns, dev.ops_recorded
        opt.step()
        hpu_runtime.mark_step()
        ops = [e[1] for e in dev.log if e[0] == "op"]
        return dev.host_ns - h0, dev.ops_recorded - n0, ops

    host_t, n_t, _ = host_and_ops(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4))
    host_f, n_f, ops = host_and_ops(lambda p: FusedSGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4))
    assert n_f == 1 and n_t >= 3 * len(SHAPES)
    nbytes = sum(int(np.prod(s)) for s in SHAPES) * 4
    assert ops[0].cost.bytes_in == 3 * nbytes and ops[0].cost.bytes_out == 2 * nbytes
    assert host_f < host_t


def test_host_parameters_are_not_charged() -> None:
    dev = reset_device("gaudi2")
    with hpu_runtime.bridge_disabled():
        p = torch.nn.Parameter(torch.randn(4))
        p.grad = torch.randn(4)
    n0 = dev.ops_recorded
    FusedSGD([p], lr=0.1).step()
    assert dev.ops_recorded == n0


@pytest.mark.parametrize("form", ["lazy", "eager"])
def test_hpu_optimizer_adamw_matches_intels_formula_as_one_kernel(form: str) -> None:
    """``torch.ops.hpu.optimizer_adamw`` (DeepSpeed's HPU FusedAdam calls it) in lazy mode's form (a
    float decay multiplier) and eager mode's (a tensor and a flag), against numpy float64 of Intel's
    kernel: ``m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; w = w*wd + neg_step*m/(sqrt(v)+eps)``."""
    dev = reset_device("gaudi2")
    params, w, grads = _setup(11)
    b1, b2, eps, wd, neg_step = 0.9, 0.99, 1e-6, 1 - 1e-2 * 0.05, -0.01
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    mw = [np.zeros_like(x) for x in w]
    vw = [np.zeros_like(x) for x in w]
    step_t = torch.tensor([neg_step]).to("hpu")
    for step in grads:
        g = [torch.from_numpy(x).float().to("hpu") for x in step]
        hpu_runtime.mark_step()
        dev.log = []
        with torch.no_grad():
            if form == "lazy":
                torch.ops.hpu.optimizer_adamw(g, params, m, v, step_t, b1, b2, eps, wd)
            else:
                torch.ops.hpu.optimizer_adamw(g, params, m, v, step_t, b1, b2, eps, torch.tensor([wd]).to("hpu"), True)
        hpu_runtime.mark_step()
        ops = [e[1] for e in dev.log if e[0] == "op"]
        nbytes = sum(int(np.prod(sh)) for sh in SHAPES) * 4
        assert len(ops) == 1 and ops[0].key[0] == "hpu.optimizer_adamw"
        assert ops[0].cost.bytes_in == 4 * nbytes and ops[0].cost.bytes_out == 3 * nbytes
        for i, gr in enumerate(step):
            mw[i] = b1 * mw[i] + (1 - b1) * gr
            vw[i] = b2 * vw[i] + (1 - b2) * gr * gr
            w[i] = w[i] * wd + neg_step * mw[i] / (np.sqrt(vw[i]) + eps)
    _close([p.detach().double().cpu().numpy() for p in params], w)
    _close([t.double().cpu().numpy() for t in m], mw)


def test_hpu_optimizer_adamw_refuses_bad_lists_and_fp8_moments() -> None:
    reset_device("gaudi2")
    p, g = [torch.ones(3, device="hpu")], [torch.ones(3, device="hpu")]
    step = torch.tensor([-0.1]).to("hpu")
    with pytest.raises(RuntimeError, match="can not process empty weight vector"):
        torch.ops.hpu.optimizer_adamw([], [], [], [], step, 0.9, 0.99, 1e-6, 1.0)
    with pytest.raises(RuntimeError, match="same length, got 1, 1, 0, 1"):
        torch.ops.hpu.optimizer_adamw(g, p, [], [torch.zeros(3, device="hpu")], step, 0.9, 0.99, 1e-6, 1.0)
    with pytest.raises(NotImplementedError, match="fp8 moments"):
        torch.ops.hpu.optimizer_adamw(g, p, [torch.zeros(3, device="hpu")], [torch.zeros(3, device="hpu")], step,
                                      0.9, 0.99, 1e-6, 1.0, [torch.ones(1, device="hpu")], [torch.ones(1, device="hpu")])
    assert torch.equal(p[0].cpu(), torch.ones(3))  # nothing was written


def _bn_net() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("hpu")


def test_fused_ema_matches_the_moving_average_reference() -> None:
    """YOLOX's use: ``FusedEMA(model, 0.9998)``, then ``update(model)`` after each optimizer step.
    Reference (numpy float64): ``d = decay * (1 - exp(-n / 2000))``, ``ema = d * ema + (1 - d) * w``
    for every floating-point state entry; BatchNorm's integer counter keeps the copy's value."""
    from habana_frameworks.torch.hpex.movingavrg import FusedEMA as GaudiName

    assert GaudiName is FusedEMA
    reset_device("gaudi2")
    net = _bn_net()
    ema = FusedEMA(net, 0.9998, updates=10)
    assert not ema.ema.training and ema.ema is not net
    want = {k: v.detach().double().cpu().numpy().copy() for k, v in ema.ema.state_dict().items()}
    g = torch.Generator().manual_seed(4)
    for n in range(11, 14):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn(p.shape, generator=g).to("hpu"))
        net(torch.randn(5, 4, generator=g).to("hpu"))  # train mode: running stats and the counter move
        ema.update(net)
        d = 0.9998 * (1 - math.exp(-n / 2000))
        for k, v in net.state_dict().items():
            if v.dtype.is_floating_point:
                want[k] = d * want[k] + (1 - d) * v.detach().double().cpu().numpy()
    assert ema.updates == 13
    got = ema.ema.state_dict()
    for k, w in want.items():
        np.testing.assert_allclose(got[k].double().cpu().numpy(), w, rtol=1e-6, atol=1e-7, err_msg=k)
    assert got["1.num_batches_tracked"].item() == 0 and net.state_dict()["1.num_batches_tracked"].item() == 3
    assert [t.data_ptr() for t in ema.updated_ema] == [t.data_ptr() for t in got.values()]


def test_fused_ema_is_one_kernel_over_a_ddp_wrapped_model_and_refuses_a_mismatch() -> None:
    """Under DDP the average is of ``.module``; an update is one kernel reading the model's and
    the average's floating-point entries and writing the average's; a model whose state
    differs in count or shape is refused by name, before anything changes."""
    dev = reset_device("gaudi2")
    net = _bn_net()
    ddp = torch.nn.parallel.DistributedDataParallel
    fake_ddp = ddp.__new__(ddp)  # a DDP instance without a process group: .module is all FusedEMA reads
    torch.nn.Module.__init__(fake_ddp)
    fake_ddp.module = net
    ema = FusedEMA(fake_ddp)
    assert list(ema.ema.state_dict()) == list(net.state_dict())
    hpu_runtime.mark_step()
    dev.log = []
    ema.update(net)
    ops = [e[1] for e in dev.log if e[0] == "op"]
    floats = sum(v.numel() for v in net.state_dict().values() if v.dtype.is_floating_point) * 4
    assert len(ops) == 1 and ops[0].cost.bytes_in == 2 * floats and ops[0].cost.bytes_out == floats
    before = [t.clone() for t in ema.updated_ema]
    with pytest.raises(RuntimeError, match="3 entries and the EMA's 7"):
        ema.update(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(1, 1, bias=False)).to("hpu"))
    with pytest.raises(RuntimeError, match=r"entry 0 has shape \(2, 4\) in the model and \(3, 4\)"):
        ema.update(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(3)).to("hpu"))
    assert all(torch.equal(a, b) for a, b in zip(before, ema.updated_ema)) and ema.updates == 1
    with pytest.raises(ValueError, match="Invalid decay value: -0.5"):
        FusedEMA(net, -0.5)


@pytest.mark.timeout(300)
def test_bench_hpex_prints_its_table_on_debug_models() -> None:
    """The fused optimizers record fewer ops and a shorter simulated step than torch's."""
    proc = run([sys.executable, "-m", "hpu_runtime.tools.bench_hpex", "--flavour", "debug"], timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in proc.stdout.splitlines()
            if line.split()[:1] in (["resnet50"], ["bert-large"])}
    assert set(rows) == {("resnet50", "sgd"), ("resnet50", "fused-sgd"), ("bert-large", "adamw"),
                         ("bert-large", "fused-adamw"), ("bert-large", "fused-lamb")}
    for base, fused in ((("resnet50", "sgd"), ("resnet50", "fused-sgd")),
                        (("bert-large", "adamw"), ("bert-large", "fused-adamw")),
                        (("bert-large", "adamw"), ("bert-large", "fused-lamb"))):
        ops, step_ms = int(rows[fused][1]), float(rows[fused][3])
        assert ops < int(rows[base][1]) and step_ms < float(rows[base][3]), (base, fused, rows)
