"""Every collective of the "hccl" backend against a numpy reference, world sizes 1-4, all dtypes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.dist_utils import run_ranks

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64]
OPS = {
    "SUM": dist.ReduceOp.SUM,
    "AVG": dist.ReduceOp.AVG,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "PRODUCT": dist.ReduceOp.PRODUCT,
}
# 7 elements take the one-round small path; 70,000 the sliced path (buffer set to 0.25 MB).
SIZES = [7, 70_000]


def _input(rank: int, case: int, numel: int, dtype: torch.dtype, product: bool = False) -> torch.Tensor:
    """Random data: non-integer for floating dtypes (integers in [-4, 4] would hide a wrong
    reduction order or a misplaced chunk), small integers otherwise; factors of a PRODUCT
    stay near magnitude 1."""
    g = np.random.default_rng(1000 * case + rank)
    if dtype.is_floating_point:
        vals = g.choice([-1.0, 1.0], numel) * g.uniform(0.5, 1.5, numel) if product else g.standard_normal(numel)
    else:
        vals = g.choice([-2, -1, 1, 2], numel) if product else g.integers(-4, 5, numel)
    return torch.from_numpy(vals.astype(np.float64)).to(dtype)


def _reduce_np(arrays: list[np.ndarray], op: str, floating: bool) -> np.ndarray:
    stack = np.stack(arrays).astype(np.float64)
    if op in ("SUM", "AVG"):
        out = stack.sum(0)
        if op == "AVG":
            out = out / len(arrays) if floating else np.trunc(out / len(arrays))
        return out
    return {"MIN": stack.min(0), "MAX": stack.max(0), "PRODUCT": stack.prod(0)}[op]


def _close(actual: torch.Tensor, expected: np.ndarray, what: str, failures: list[str]) -> None:
    exp = torch.from_numpy(np.asarray(expected, dtype=np.float64))
    # reduced in the emulator's order and precision, vs float64 in numpy: a few roundings
    tol = {torch.bfloat16: 3e-2, torch.float16: 4e-3, torch.float32: 1e-5}.get(actual.dtype, 0.0)
    got = actual.to(torch.float64).reshape(exp.shape)
    if not torch.allclose(got, exp, rtol=tol, atol=2 * tol):
        bad = (got - exp).abs().argmax().item()
        failures.append(f"{what}: element {bad} is {got.flatten()[bad].item()}, expected {exp.flatten()[bad].item()}")


def _all_collectives(rank: int, world: int) -> list[str]:
    failures: list[str] = []
    case = 0
    for dtype in DTYPES:
        floating = dtype.is_floating_point
        dname = str(dtype).removeprefix("torch.")
        for numel in SIZES:
            for opname, op in OPS.items():
                case += 1
                prod = opname == "PRODUCT"
                t = _input(rank, case, numel, dtype, prod)
                dist.all_reduce(t, op=op)
                ref = _reduce_np([_input(r, case, numel, dtype, prod).double().numpy() for r in range(world)], opname, floating)
                _close(t, ref, f"allreduce {opname} {dname} n={numel}", failures)

            case += 1
            root = world - 1
            t = _input(rank, case, numel, dtype)
            dist.broadcast(t, src=root)
            _close(t, _input(root, case, numel, dtype).double().numpy(), f"broadcast {dname} n={numel}", failures)

            case += 1
            t = _input(rank, case, numel, dtype)
            dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
            if rank == 0:
                ref = _reduce_np([_input(r, case, numel, dtype).double().numpy() for r in range(world)], "SUM", floating)
                _close(t, ref, f"reduce {dname} n={numel}", failures)
            else:
                _close(t, _input(rank, case, numel, dtype).double().numpy(), f"reduce non-root unchanged {dname}", failures)

            case += 1
            outs = [torch.empty(numel, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, _input(rank, case, numel, dtype))
            for r in range(world):
                _close(outs[r], _input(r, case, numel, dtype).double().numpy(), f"all_gather {dname} from {r}", failures)

            case += 1
            out = torch.empty(world * numel, dtype=dtype)
            dist.all_gather_into_tensor(out, _input(rank, case, numel, dtype))
            ref = np.concatenate([_input(r, case, numel, dtype).double().numpy() for r in range(world)])
            _close(out, ref, f"all_gather_into_tensor {dname} n={numel}", failures)

            for opname in ("SUM", "MAX"):
                case += 1
                ins = [_input(rank, case * 10 + q, numel, dtype) for q in range(world)]
                out = torch.empty(numel, dtype=dtype)
                dist.reduce_scatter(out, ins, op=OPS[opname])
                ref = _reduce_np([_input(r, case * 10 + rank, numel, dtype).double().numpy() for r in range(world)], opname, floating)
                _close(out, ref, f"reduce_scatter {opname} {dname} n={numel}", failures)

            case += 1
            full = _input(rank, case, numel * world, dtype)
            out = torch.empty(numel, dtype=dtype)
            dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.SUM)
            ref = _reduce_np(
                [_input(r, case, numel * world, dtype).double().numpy()[rank * numel : (rank + 1) * numel] for r in range(world)],
                "SUM",
                floating,
            )
            _close(out, ref, f"reduce_scatter_tensor {dname} n={numel}", failures)

            case += 1
            # uneven all_to_all_single: rank p sends (q + 1) * rows_unit rows to rank q
            unit = max(1, numel // 50)
            in_splits = [(q + 1) * unit for q in range(world)]
            out_splits = [(rank + 1) * unit] * world
            inp = _input(rank, case, sum(in_splits) * 2, dtype).view(-1, 2)
            out = torch.empty(sum(out_splits), 2, dtype=dtype)
            dist.all_to_all_single(out, inp, out_splits, in_splits)
            pieces = []
            for p in range(world):
                src = _input(p, case, sum(in_splits) * 2, dtype).view(-1, 2)
                off = sum(in_splits[:rank])
                pieces.append(src[off : off + in_splits[rank]].double().numpy())
            _close(out, np.concatenate(pieces), f"all_to_all_single {dname} n={numel}", failures)
    dist.barrier()
    return failures


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_collectives_match_numpy(world):
    """allreduce (5 ops), broadcast, reduce, all_gather(_into_tensor), reduce_scatter(_tensor), all_to_all vs numpy."""
    results = run_ranks(_all_collectives, world, timeout=200, env={"HCCL_SHM_BUFFER_MB": "0.25"})
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, "\n".join(failures[:20])


def _coalesced_and_barrier(rank: int, world: int) -> list:
    pg = dist.group.WORLD
    a = torch.full((5,), float(rank + 1))
    b = torch.full((3, 2), float(2 * rank))
    work = pg.allreduce_coalesced([a, b], dist.AllreduceCoalescedOptions())
    fut = work.get_future()
    assert isinstance(fut, torch.futures.Future)
    value = fut.wait()
    dist.barrier()
    return [a.tolist(), b.flatten().tolist(), [v.shape for v in value], work.wait()]


@pytest.mark.timeout(120)
def test_allreduce_coalesced_future_and_barrier():
    """allreduce_coalesced fuses tensors into one buffer; get_future() holds the outputs."""
    res = run_ranks(_coalesced_and_barrier, 3)
    for a, b, shapes, waited in res:
        assert a == [6.0] * 5
        assert b == [6.0] * 6
        assert shapes == [torch.Size([5]), torch.Size([3, 2])]
        assert waited is True


def _p2p_and_coalescing(rank: int, world: int) -> list[str]:
    failures: list[str] = []
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for numel in (5, 300_000):  # one outbox, then many chunks
            mine = _input(rank, 7000 + numel, numel, dtype)
            got = torch.empty(numel, dtype=dtype)
            # every rank posts its send first: sends must not block the receives behind them
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, got, prv)])
            for r in reqs:
                r.wait()
            _close(got, _input(prv, 7000 + numel, numel, dtype).double().numpy(), f"isend/irecv ring {dtype} n={numel}", failures)
    if rank == 0:
        dist.send(torch.arange(10.0), dst=1)
    elif rank == 1:
        t = torch.empty(10)
        dist.recv(t, src=0)
        _close(t, np.arange(10.0), "send/recv", failures)
    pg = dist.group.WORLD
    before = len(pg.history)
    a, b = torch.full((4,), float(rank)), torch.full((3,), 1.0)
    with dist._coalescing_manager():
        dist.all_reduce(a)
        dist.all_reduce(b)
    expected = float(sum(range(world)))
    _close(a, np.full(4, expected), "coalesced allreduce a", failures)
    _close(b, np.full(3, float(world)), "coalesced allreduce b", failures)
    colls = [r for r in pg.history[before:] if r.kind == "allreduce"]
    if len(colls) != 1:
        failures.append(f"coalescing manager issued {len(colls)} allreduces, expected one fused")
    x, y = torch.full((2,), float(rank)), torch.full((3,), float(10 * rank))
    ox, oy = torch.empty(2 * world), torch.empty(3 * world)
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(ox, x)
        dist.all_gather_into_tensor(oy, y)
    _close(ox, np.repeat(np.arange(world, dtype=float), 2), "coalesced all_gather x", failures)
    _close(oy, np.repeat(10.0 * np.arange(world), 3), "coalesced all_gather y", failures)
    ix, iy = torch.arange(2.0 * world), torch.arange(3.0 * world)
    rx, ry = torch.empty(2), torch.empty(3)
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(rx, ix)
        dist.reduce_scatter_tensor(ry, iy)
    _close(rx, world * np.arange(2.0 * world)[2 * rank : 2 * rank + 2], "coalesced reduce_scatter x", failures)
    _close(ry, world * np.arange(3.0 * world)[3 * rank : 3 * rank + 3], "coalesced reduce_scatter y", failures)
    return failures


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_send_recv_and_coalescing_manager(world):
    """isend/irecv rings (any post order), send/recv, and coalesced calls fused into one collective."""
    results = run_ranks(_p2p_and_coalescing, world, timeout=100)
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, "\n".join(failures[:20])


def _subgroups(rank: int, world: int) -> list:
    evens = dist.new_group([0, 2])
    odds = dist.new_group([1])
    t = torch.full((5,), float(rank + 1))
    if rank in (0, 2):
        dist.all_reduce(t, group=evens)
    else:
        dist.all_reduce(t, group=odds)
    dist.destroy_process_group(evens)
    dist.destroy_process_group(odds)
    w = torch.ones(2)
    dist.all_reduce(w)  # the default group still works
    return [t[0].item(), w[0].item()]


@pytest.mark.timeout(120)
def test_subgroups_reduce_within_and_can_be_destroyed():
    res = run_ranks(_subgroups, 3)
    assert res == [[4.0, 3.0], [2.0, 3.0], [4.0, 3.0]]
