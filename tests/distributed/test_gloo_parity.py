"""Calls on which torch's own distributed suite found hccl short of gloo: now equal to gloo.

float64 (and int16) collectives, move-only dtypes, ``dist.recv`` without a source,
``all_gather_coalesced``, and irecv posted before the matching isend (batch_isend_irecv).
Random non-integer data; each case runs over hccl and over gloo and the results must match.
"""

from __future__ import annotations

import pytest

from tests.dist_utils import run_ranks


def _collectives(rank, world, dtype_name):
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, dtype_name)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(10 + rank), dtype=torch.float64)
    x = x if dtype.is_floating_point else (x * 100).to(dtype)
    out = {}
    for opname in ("SUM", "MAX", "PRODUCT"):
        t = x.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, opname))
        out[f"allreduce {opname}"] = t
    t = x.clone()
    dist.broadcast(t, src=world - 1)
    out["broadcast"] = t
    outs = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(outs, x)
    out["allgather"] = torch.stack(outs)
    t = torch.empty(10, dtype=dtype)
    dist.reduce_scatter_tensor(t, x[: 10 * world].clone())
    out["reduce_scatter"] = t
    t = torch.empty(10 * world, dtype=dtype)
    dist.all_to_all_single(t, x[: 10 * world].clone())
    out["alltoall"] = t
    if rank == 0:
        dist.send(x, dst=1)
    elif rank == 1:
        t = torch.empty_like(x)
        dist.recv(t, src=0)
        out["send/recv"] = t
    return {k: v.tolist() for k, v in out.items()}


@pytest.mark.timeout(120)
def test_float64_collectives_equal_gloo():
    """float64 allreduce (SUM, MAX, PRODUCT), broadcast, allgather, reduce_scatter, alltoall and
    send/recv give gloo's values (to 1e-12: three ranks may sum in another order)."""
    import torch

    ours = run_ranks(_collectives, 3, "float64")
    ref = run_ranks(_collectives, 3, "float64", backend="gloo")
    for rank, (mine, theirs) in enumerate(zip(ours, ref)):
        assert mine.keys() == theirs.keys()
        for key in mine:
            torch.testing.assert_close(torch.tensor(mine[key], dtype=torch.float64), torch.tensor(theirs[key], dtype=torch.float64),
                                       rtol=1e-12, atol=1e-12, msg=lambda m, key=key, rank=rank: f"rank {rank} {key}: {m}")


@pytest.mark.timeout(120)
def test_int16_collectives_equal_int64_wrapped():
    """int16 (which gloo refuses) gives the int64 results of the same values, wrapped to 16 bits."""
    import torch

    ours = run_ranks(_collectives, 2, "int16")
    wide = run_ranks(_collectives, 2, "int64")
    for mine, ref in zip(ours, wide):
        assert {k: torch.tensor(v).to(torch.int16).tolist() for k, v in ref.items()} == mine


def _move_only(rank, world):
    import torch
    import torch.distributed as dist

    out = {}
    for dtype in (torch.uint16, torch.uint32, torch.float8_e4m3fn):
        x = torch.randn(64, generator=torch.Generator().manual_seed(rank))
        x = x.to(dtype) if dtype.is_floating_point else (x.abs() * 1000).to(dtype)
        name = str(dtype).removeprefix("torch.")
        if rank == 0:
            dist.send(x, dst=1)
        else:
            t = torch.empty_like(x)
            dist.recv(t, src=0)
            out[f"recv {name}"] = t.view(torch.uint8).tolist()
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.uint16))
    except (TypeError, RuntimeError) as exc:
        out["uint16 sum"] = type(exc).__name__
    return out


@pytest.mark.timeout(120)
def test_move_only_dtypes_send_like_gloo_and_refuse_reduction():
    """uint16 / uint32 / float8 go point to point byte for byte as with gloo; reducing them is an
    error on both backends (hccl: a TypeError naming the dtype, before anything is sent)."""
    ours = run_ranks(_move_only, 2)
    ref = run_ranks(_move_only, 2, backend="gloo")
    assert {k: v for k, v in ours[1].items() if k.startswith("recv")} == {k: v for k, v in ref[1].items() if k.startswith("recv")}
    assert ours[0]["uint16 sum"] == "TypeError" and ref[0]["uint16 sum"] == "RuntimeError"


def _any_source(rank, world):
    import torch
    import torch.distributed as dist

    if rank == 0:
        got = {}
        for _ in range(world - 1):
            t = torch.empty(3, 5, dtype=torch.float64)
            src = dist.recv(t, tag=7)
            got[src] = t.tolist()
        return got
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    dist.send(x, dst=0, tag=7)
    return None


@pytest.mark.timeout(120)
def test_recv_from_any_source_names_the_sender_like_gloo():
    """``dist.recv(t)`` without ``src`` takes each sender's message once and returns its rank."""
    ours = run_ranks(_any_source, 3)
    ref = run_ranks(_any_source, 3, backend="gloo", pg_timeout=90)
    assert ours[0] == ref[0]
    assert sorted(ours[0]) == [1, 2]


def _all_gather_coalesced(rank, world):
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(rank)
    inputs = [torch.randn(2, 3, generator=g), torch.randn(0), torch.randn(5, generator=g)]
    outs = [[torch.zeros_like(t) for t in inputs] for _ in range(world)]
    dist.all_gather_coalesced(outs, inputs)
    try:
        dist.all_gather_coalesced(outs[:1], inputs)  # one output list for 3 ranks
    except (ValueError, RuntimeError) as exc:
        bad = str(exc)
    t = torch.ones(1)
    dist.all_reduce(t)  # the group goes on after the refused call
    return [[o.tolist() for o in per_rank] for per_rank in outs], bad, t.item()


@pytest.mark.timeout(120)
def test_all_gather_coalesced_equals_gloo():
    """``all_gather_coalesced`` (``outputs[r][i]`` = rank r's input i, an empty one among them)."""
    ours = run_ranks(_all_gather_coalesced, 3)
    ref = run_ranks(_all_gather_coalesced, 3, backend="gloo")
    assert [o[0] for o in ours] == [o[0] for o in ref]
    assert "3 output lists" in ours[0][1] and ours[0][2] == 3.0


def _irecv_before_isend(rank, world):
    import torch
    import torch.distributed as dist

    ops = []
    got = {}
    for peer in range(world):
        if peer == rank:
            continue
        got[peer] = torch.empty(300_000, dtype=torch.float64)  # several outbox chunks
        ops.append(dist.P2POp(dist.irecv, got[peer], peer, tag=peer))
        x = torch.randn(300_000, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
        ops.append(dist.P2POp(dist.isend, x, peer, tag=rank))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    t = torch.ones(1)
    dist.all_reduce(t)
    return {p: (v.sum().item(), v[:3].tolist()) for p, v in got.items()}, t.item()


@pytest.mark.timeout(120)
def test_irecv_posted_before_isend_on_every_rank_equals_gloo():
    """Every rank posts its irecvs before its isends (torch's batch_isend_irecv on CPU): no rank
    blocks in irecv, and the messages equal gloo's."""
    ours = run_ranks(_irecv_before_isend, 3)
    ref = run_ranks(_irecv_before_isend, 3, backend="gloo")
    assert ours == ref


def _nobody_sends(rank, world):
    import time

    import torch
    import torch.distributed as dist

    from tests.dist_utils import giving_up, stay_silent

    if rank == 0:
        t0 = time.monotonic()
        with giving_up():
            try:
                dist.recv(torch.empty(4), tag=3)
            except RuntimeError as exc:
                return f"{time.monotonic() - t0:.1f} {exc}"
        return "no error"
    stay_silent()  # alive, sends nothing
    return None


@pytest.mark.timeout(60)
def test_recv_from_any_source_that_never_comes_times_out_naming_it():
    """A receive from any source that no rank sends to ends with the group's timeout, not a hang."""
    res = run_ranks(_nobody_sends, 2, pg_timeout=3, expect_errors=True)
    status, text = res[0]
    assert status == "ok", res
    secs, _, msg = text.partition(" ")
    assert float(secs) >= 2.5, "the group's 3 s timeout must not fire early"
    assert "timed out" in msg and "recv from any source" in msg, text


def _sparse_and_refused(rank, world):
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(rank)
    dense = torch.randn(6, 4, generator=g) * (torch.rand(6, 4, generator=g) > 0.5)
    sparse = dense.to_sparse()
    dist.all_reduce(sparse)  # gloo takes a sparse COO SUM (DDP's sparse embedding gradients)
    out = {"sparse": sparse.to_dense().tolist(), "refused": {}}
    if dist.get_backend() != "hccl":
        return out
    bad = {"expanded": torch.ones(1, 4).expand(3, 4), "csr": dense.to_sparse_csr(),
           "quantized": torch.quantize_per_tensor(dense, 0.1, 0, torch.quint8)}
    for name, t in bad.items():
        for coll in ("allreduce", "broadcast"):
            try:
                dist.all_reduce(t) if coll == "allreduce" else dist.broadcast(t, src=0)
                out["refused"][f"{name} {coll}"] = "accepted"
            except (TypeError, ValueError) as exc:
                out["refused"][f"{name} {coll}"] = str(exc)
            after = torch.full((3,), float(rank))
            dist.all_reduce(after)  # the group stays usable
            assert after.tolist() == [float(sum(range(world)))] * 3
    return out


@pytest.mark.timeout(120)
def test_sparse_allreduce_equals_gloo_and_refused_tensors_leave_the_group_usable():
    """A sparse COO allreduce gives gloo's sum; an expanded view (which gloo writes into,
    corrupting the heap), a CSR or a quantized tensor is refused by name on every rank before
    anything moves, and the next collective works."""
    import torch

    ours = run_ranks(_sparse_and_refused, 2)
    ref = run_ranks(_sparse_and_refused, 2, backend="gloo")
    for mine, theirs in zip(ours, ref):
        torch.testing.assert_close(torch.tensor(mine["sparse"]), torch.tensor(theirs["sparse"]))
        refused = mine["refused"]
        assert all(v != "accepted" for v in refused.values()), refused
        assert "share memory" in refused["expanded allreduce"] and "layout sparse_csr" in refused["csr broadcast"]
        assert "quint8" in refused["quantized allreduce"]


def _complex(rank, world):
    import torch
    import torch.distributed as dist

    def mk(seed, shape=(3, 2)):
        return torch.randn(shape, dtype=torch.complex64, generator=torch.Generator().manual_seed(seed))

    out = {}
    x = mk(rank)
    dist.reduce(x, dst=0)
    if rank == 0:
        out["reduce"] = x
    t = torch.empty(3, 2, dtype=torch.complex64)
    dist.reduce_scatter(t, [mk(10 * rank + i) for i in range(world)])
    out["reduce_scatter"] = t
    t = torch.empty(3, 2, dtype=torch.complex64)
    dist.reduce_scatter_tensor(t, mk(100 + rank, (3 * world, 2)), op=dist.ReduceOp.AVG)
    out["reduce_scatter_tensor AVG"] = t
    # a functional collective (DTensor, FSDP2) calls the group itself, with no real view made
    t = torch.ops._c10d_functional.all_gather_into_tensor(mk(rank), world, dist.group.WORLD.group_name)
    out["functional all_gather"] = torch.ops._c10d_functional.wait_tensor(t)
    return {k: torch.view_as_real(v).tolist() for k, v in out.items()}


@pytest.mark.timeout(120)
def test_complex_collectives_equal_gloo():
    """Complex tensors torch's front-end hands the backend as they are (reduce, reduce_scatter,
    reduce_scatter_tensor, a functional all_gather): gloo reduces them, so hccl does, as
    their real and imaginary parts; the results are gloo's."""
    import torch

    ours = run_ranks(_complex, 2)
    ref = run_ranks(_complex, 2, backend="gloo")
    for rank, (mine, theirs) in enumerate(zip(ours, ref)):
        assert mine.keys() == theirs.keys() and len(mine) == 4 - rank
        for key in mine:
            torch.testing.assert_close(torch.tensor(mine[key]), torch.tensor(theirs[key]), rtol=1e-6, atol=1e-6,
                                       msg=lambda m, key=key, rank=rank: f"rank {rank} {key}: {m}")


def _complex_gather_and_refusals(rank, world):
    import torch
    import torch.distributed as dist

    x = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64) * (rank + 1)
    outs = [torch.empty_like(x) for _ in range(world)] if rank == 0 else None
    dist.gather(x, outs, dst=0)
    refused = []
    for op in (dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
        try:
            dist.reduce(x.clone(), dst=0, op=op)
        except TypeError as e:
            refused.append(str(e))
    y = torch.ones(2)
    dist.all_reduce(y)  # the group is still usable
    return [o.tolist() for o in outs] if outs else None, refused, y.tolist()


@pytest.mark.timeout(120)
def test_complex_gather_and_the_reductions_complex_numbers_do_not_have():
    """gather moves complex tensors (gloo refuses them: 'Invalid scalar type'); MAX and PRODUCT
    of complex tensors are refused on every rank, naming the op, before anything moves, and the
    group stays usable."""
    res = run_ranks(_complex_gather_and_refusals, 2)
    assert res[0][0] == [[1 + 2j, 3 - 4j], [2 + 4j, 6 - 8j]] and res[1][0] is None
    for _, refused, y in res:
        assert [m.rsplit("not ", 1)[1] for m in refused] == ["MAX", "PRODUCT"], refused
        assert all("of complex tensors takes SUM or AVG" in m for m in refused)
        assert y == [2.0, 2.0]
