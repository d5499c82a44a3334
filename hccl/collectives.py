"""The collectives face of :class:`~hccl.process_group.ProcessGroupHCCL`.

Each method is the same few lines: check the arguments against the collective's signature
(:data:`hccl.checks.SIGNATURES`), take flat views of the buffers, and hand a ``body`` that
moves the bytes to :meth:`ProcessGroupHCCL._run`, which times the collective and returns its
Work. Collectives HCCL has no algorithm of its own for (gather, scatter, the fused
coalesced forms) are built from these in :mod:`hccl.composite`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import checks
from ._buffers import flat, writeback
from .checks import Call
from .transport.reduce_ops import check_dtype, reduce_op_code, reduce_op_name
from .work import HcclWork

__all__ = ["CollectivesMixin", "real_views"]


_SUM = reduce_op_code(dist.ReduceOp.SUM)
_AVG = reduce_op_code(dist.ReduceOp.AVG)


def real_views(name: str, op: int | None, tensors: list) -> list:
    """``tensors`` with each complex tensor as its real view (``torch.view_as_real``: the same
    storage, a trailing dimension of 2), as ProcessGroupNCCL and torch's own front-end move
    them; ``op`` None: a collective that only moves data. A SUM or AVG of complex numbers is the
    SUM or AVG of their real and imaginary parts. torch's front-end makes the views itself for
    most collectives, but hands the backend complex tensors for reduce, reduce_scatter,
    reduce_scatter_tensor and gather, and so do calls on the group itself (functional
    collectives, DDP's join hook): gloo takes them, so hccl does.

    Raises:
        TypeError: a complex tensor reduced with another op (MIN, MAX, PRODUCT: not elementwise
            on the parts), before anything is sent.
    """
    if not any(t.is_complex() for t in tensors):
        return tensors
    if op is not None and op not in (_SUM, _AVG):
        raise TypeError(f"hccl: {name} of complex tensors takes SUM or AVG (reduced as real and imaginary"
                        f" parts), not {reduce_op_name(op)}")
    with torch._C._DisableTorchDispatch():  # a view for the transport, not device work
        return [torch.view_as_real(t) if t.is_complex() else t for t in tensors]


def _op(opts) -> int:
    """The reduce-op wire code of ``opts`` (SUM without options); ValueError for an unsupported op."""
    return reduce_op_code(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)


def _root(opts) -> int:
    return opts.rootRank if opts is not None else 0


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _allreduce_args(tensors, opts):
    """``(tensor list, AllreduceOptions or None)`` from any of ProcessGroup.allreduce's overloads:
    a tensor or a list, with options or a bare ``ReduceOp``."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    if opts is not None and not isinstance(opts, dist.AllreduceOptions):
        op, opts = opts, dist.AllreduceOptions()
        opts.reduceOp = op
    return tensors, opts


class CollectivesMixin:
    """allreduce, reduce, broadcast, allgather, reduce_scatter, alltoall, barrier (and the
    tensor, coalesced and single-buffer forms torch calls them by)."""

    def _check(self, name: str, **args) -> None:
        checks.check(Call(name, self._world_size, self._rank, **args))

    # ---- reductions -------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None, op=None, timeout=None):  # noqa: ARG002 - timeout: as the group's
        """In place on each tensor of ``tensors``: reduce across ranks (SUM/AVG/MIN/MAX/PRODUCT).

        Also takes pybind's convenience forms ``allreduce(tensor_or_list, op)``: DDP's join
        hook calls ``process_group.allreduce(tensor)`` directly.
        """
        tensors, opts = _allreduce_args(tensors, opts if op is None else op)
        return self.allreduce_coalesced(tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        """Allreduce several tensors of one dtype fused into one buffer (one collective)."""
        op = _op(opts)
        if len(tensors) == 1 and tensors[0].layout == torch.sparse_coo and op == _SUM:
            return self._allreduce_sparse(tensors[0])
        outputs, tensors = tensors, real_views("allreduce", op, tensors)
        self._check("allreduce_coalesced" if len(tensors) != 1 else "allreduce", tensors=tensors, op=op)
        dcode = check_dtype(tensors[0])
        with torch._C._DisableTorchDispatch():
            buf = torch.cat([flat(t) for t in tensors]) if len(tensors) > 1 else flat(tensors[0])

        def body(ready, what):
            ready_all = self._coll.allreduce(buf, op, self._meta("allreduce", dcode, buf.numel(), op, 0, ready), what)
            off = 0
            for t in tensors:
                if len(tensors) > 1:
                    t.copy_(buf[off : off + t.numel()].view(t.shape))
                else:
                    writeback(t, buf)
                off += t.numel()
            return ready_all

        return self._run("allreduce", buf.numel() * buf.element_size(), outputs, body, dtype_bytes=buf.element_size())

    def reduce(self, tensors, opts=None):
        """Reduce ``tensors[0]`` of every rank into root's ``tensors[0]``."""
        op, root = _op(opts), _root(opts)
        outputs, tensors = tensors, real_views("reduce", op, tensors)
        self._check("reduce", tensors=tensors, op=op, root=root)
        t = tensors[0]
        buf = flat(t)

        def body(ready, what):
            meta = self._meta("reduce", check_dtype(t), buf.numel(), op, root, ready)
            ready_all = self._coll.reduce(buf, op, root, meta, what)
            if self._rank == root:
                writeback(t, buf)
            return ready_all

        return self._run("reduce", _nbytes([t]), outputs, body, root=root, dtype_bytes=t.element_size())

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """``output_tensors[i]`` = op over ranks of their ``input_tensors[i][this rank]``."""
        op = _op(opts)
        real_outs = real_views("reduce_scatter", op, output_tensors)
        real_ins = [real_views("reduce_scatter", op, ins) for ins in input_tensors]
        self._check("reduce_scatter", outputs=real_outs, inputs=real_ins, op=op)

        def body(ready, what):
            ready_all = None
            for i, (out, ins) in enumerate(zip(real_outs, real_ins)):
                buf = flat(out)
                meta = self._meta("reduce_scatter", check_dtype(out), out.numel(), op, 0, ready, i)
                ready_all = self._coll.reduce_scatter(buf, [flat(t) for t in ins], op, meta, what)
                writeback(out, buf)
            return ready_all

        return self._run("reduce_scatter", _nbytes(output_tensors) * self._world_size, output_tensors, body)

    def _reduce_scatter_base(self, output, input, opts=None):
        """``reduce_scatter_tensor``: ``input`` holds world_size chunks of ``output``'s size."""
        op = _op(opts)
        outputs = [output]
        output, input = real_views("reduce_scatter_tensor", op, [output, input])
        self._check("reduce_scatter_tensor", outputs=[output], inputs=[input], op=op)
        m = output.numel()
        in_flat, buf = flat(input), flat(output)
        chunks = [in_flat[r * m : (r + 1) * m] for r in range(self._world_size)]

        def body(ready, what):
            meta = self._meta("reduce_scatter", check_dtype(output), m, op, 0, ready)
            ready_all = self._coll.reduce_scatter(buf, chunks, op, meta, what)
            writeback(output, buf)
            return ready_all

        return self._run("reduce_scatter", _nbytes([input]), outputs, body)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        work = None
        for o, i in zip(outputs, inputs):
            work = self._reduce_scatter_base(o, i, opts)
        return work

    # ---- data movement ------------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        """Every rank's ``tensors[i]`` becomes root's (``opts.rootRank``)."""
        root = _root(opts)
        outputs, tensors = tensors, real_views("broadcast", None, tensors)
        self._check("broadcast", tensors=tensors, root=root)

        def body(ready, what):
            ready_all = None
            for i, t in enumerate(tensors):
                buf = flat(t)
                meta = self._meta("broadcast", check_dtype(t), buf.numel(), 0, root, ready, i)
                ready_all = self._coll.broadcast(buf, root, meta, what)
                if self._rank != root:
                    writeback(t, buf)
            return ready_all

        return self._run("broadcast", _nbytes(tensors), outputs, body, root=root, dtype_bytes=tensors[0].element_size())

    def allgather(self, output_tensors, input_tensors, opts=None):
        """``output_tensors[i][r]`` receives rank r's ``input_tensors[i]``."""
        outputs = [o for outs in output_tensors for o in outs]
        output_tensors = [real_views("allgather", None, outs) for outs in output_tensors]
        input_tensors = real_views("allgather", None, input_tensors)
        self._check("allgather", outputs=output_tensors, inputs=input_tensors)

        def body(ready, what):
            ready_all = None
            for i, (outs, inp) in enumerate(zip(output_tensors, input_tensors)):
                flats = [flat(o) for o in outs]
                meta = self._meta("allgather", check_dtype(inp), inp.numel(), 0, 0, ready, i)
                ready_all = self._coll.allgather(flats, flat(inp), meta, what)
                for o, f in zip(outs, flats):
                    writeback(o, f)
            return ready_all

        return self._run("allgather", _nbytes(input_tensors), outputs, body)

    def _allgather_base(self, output, input, opts=None):
        """``all_gather_into_tensor``: ``output`` (world_size x input) gets every rank's input."""
        outputs = [output]
        output, input = real_views("all_gather_into_tensor", None, [output, input])
        self._check("all_gather_into_tensor", outputs=[output], inputs=[input])
        out_flat = flat(output)
        m = input.numel()
        views = [out_flat[r * m : (r + 1) * m] for r in range(self._world_size)]

        def body(ready, what):
            meta = self._meta("allgather", check_dtype(input), m, 0, 0, ready)
            ready_all = self._coll.allgather(views, flat(input), meta, what)
            writeback(output, out_flat)
            return ready_all

        return self._run("allgather", _nbytes([input]), outputs, body)

    all_gather_single = _allgather_base

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """``dist.all_gather_coalesced``: ``output_lists[r][i]`` receives rank r's ``input_list[i]``
        (moved as :meth:`allgather` of several inputs: one collective, one Work)."""
        n = self._world_size
        if len(output_lists) != n or any(len(outs) != len(input_list) for outs in output_lists):
            raise ValueError(
                f"hccl: all_gather_coalesced needs {n} output lists (one per rank) of {len(input_list)} tensors"
                f" each, got {[len(outs) for outs in output_lists]}"
            )
        return self.allgather([[output_lists[r][i] for r in range(n)] for i in range(len(input_list))], input_list, opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        work = None
        for o, i in zip(outputs, inputs):
            work = self._allgather_base(o, i, opts)
        return work

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """``output_tensors[q]`` receives rank q's ``input_tensors[this rank]``."""
        outputs = list(output_tensors)
        output_tensors = real_views("alltoall", None, outputs)
        input_tensors = real_views("alltoall", None, list(input_tensors))
        self._check("alltoall", outputs=[output_tensors], inputs=[input_tensors])
        outs = [flat(t) for t in output_tensors]
        ins = [flat(t) for t in input_tensors]
        return self._alltoall(outs, ins, outputs, _nbytes(input_tensors), outs[0].element_size(),
                              lambda: [writeback(t, f) for t, f in zip(output_tensors, outs)])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """``all_to_all_single``: split ``input`` along dim 0 by ``input_split_sizes`` (or evenly)."""
        n = self._world_size
        outputs = [output]
        output, input = real_views("all_to_all_single", None, [output, input])
        self._check("all_to_all_single", outputs=[output], inputs=[input])
        in_rows = input.shape[0] if input.dim() else 0
        out_rows = output.shape[0] if output.dim() else 0
        in_splits = list(input_split_sizes) or checks.even_splits(in_rows, n, "input")
        out_splits = list(output_split_sizes) or checks.even_splits(out_rows, n, "output")
        checks.check_splits("input", in_splits, in_rows, n)
        checks.check_splits("output", out_splits, out_rows, n)
        row_in = input[0].numel() if in_rows else 0
        row_out = output[0].numel() if out_rows else 0
        in_flat, out_flat = flat(input), flat(output)
        ins, outs, o1, o2 = [], [], 0, 0
        for q in range(n):
            ins.append(in_flat[o1 : o1 + in_splits[q] * row_in])
            outs.append(out_flat[o2 : o2 + out_splits[q] * row_out])
            o1 += in_splits[q] * row_in
            o2 += out_splits[q] * row_out
        return self._alltoall(outs, ins, outputs, _nbytes([input]), input.element_size(),
                              lambda: writeback(output, out_flat))

    all_to_all_single = alltoall_base

    def _alltoall(self, outs, ins, outputs, nbytes: int, dtype_bytes: int, finish) -> HcclWork:
        """Move an alltoall of flat per-peer views; times it on the (n x n) element counts."""
        dcode = check_dtype(ins[0]) if ins else check_dtype(outputs[0])
        splits: list[list[int]] = []

        def body(ready, what):
            # every driver returns every rank's (n x n) element counts with the ready times
            ready_all, splits[:] = self._coll.alltoall(outs, ins, self._meta("alltoall", dcode, 0, 0, 0, ready), what)
            finish()
            return ready_all

        return self._run("alltoall", nbytes, outputs, body, splits=splits, dtype_bytes=dtype_bytes)

    def barrier(self, opts=None):
        """Wait for every rank (simulated: a small synchronisation on the collective stream)."""

        def body(ready, what):
            return self._coll.barrier(self._meta("barrier", 0, 0, 0, 0, ready), what)

        work = self._run("barrier", 0, [], body)
        self._device.synchronize()
        return work
