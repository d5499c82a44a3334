"""Collectives HCCL has no algorithm of its own for, built from those it has.

gather is moved (and timed) as an allgather whose non-root outputs are dropped, scatter as
one broadcast of the root's whole list, the fused coalesced forms as one
``all_gather_into_tensor`` / ``reduce_scatter_tensor`` of a concatenated buffer, and a sparse
COO allreduce (SUM, as gloo takes it: DDP's sparse embedding gradients) as allgathers of every
rank's indices and values, summed and coalesced. Each
returns the Work of the collective that moved the bytes, its outputs replaced by the
caller's tensors.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .collectives import real_views
from .transport.reduce_ops import check_dtype

__all__ = ["CompositeMixin"]


def _broadcast_opts(root: int) -> dist.BroadcastOptions:
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    return opts


class CompositeMixin:
    """gather, scatter and the fused coalesced allgather/reduce_scatter."""

    def gather(self, output_tensors, input_tensors, opts=None):
        """``dist.gather``: root's ``output_tensors[0][r]`` receives rank r's ``input_tensors[0]``.

        Moved (and timed) as an allgather whose non-root outputs are dropped: HCCL has no
        gather of its own, and the allgather's time bounds it from above.
        """
        root = opts.rootRank if opts is not None else 0
        originals = output_tensors[0] if output_tensors else []
        output_tensors = [real_views("gather", None, outs) for outs in output_tensors]
        input_tensors = real_views("gather", None, input_tensors)
        self._check("gather", outputs=output_tensors, inputs=input_tensors, root=root)
        inp = input_tensors[0]
        if self._rank == root:
            outs = output_tensors[0]
        else:
            with self._emulator_ops():
                outs = [torch.empty_like(inp) for _ in range(self._world_size)]
        work = self.allgather([outs], [inp])
        if self._rank == root:
            work.replace_outputs(list(originals))
        return work

    def scatter(self, output_tensors, input_tensors, opts=None):
        """``dist.scatter``: rank r's ``output_tensors[0]`` receives root's ``input_tensors[0][r]``.

        Moved (and timed) as one broadcast of root's whole list, each rank keeping its chunk:
        HCCL has no scatter of its own.
        """
        root = opts.rootRank if opts is not None else 0
        original = output_tensors[0] if output_tensors else None
        output_tensors = real_views("scatter", None, output_tensors)
        input_tensors = [real_views("scatter", None, ins) for ins in input_tensors]
        self._check("scatter", outputs=output_tensors, inputs=input_tensors, root=root)
        out = output_tensors[0]
        n, m = self._world_size, out.numel()
        with self._emulator_ops():
            if self._rank == root:
                buf = torch.cat([t.reshape(-1) for t in input_tensors[0]])
            else:
                buf = torch.empty(n * m, dtype=out.dtype)
        work = self.broadcast([buf], _broadcast_opts(root))
        with self._emulator_ops(), torch.no_grad():
            out.copy_(buf[self._rank * m : (self._rank + 1) * m].view(out.shape))
        work.replace_outputs([original])
        return work

    def _allreduce_sparse(self, t: torch.Tensor):
        """SUM of a sparse COO tensor over ranks, in place (gloo's result, coalesced): the
        ranks' entry counts, then their indices and values (padded to the largest count) are
        allgathered, concatenated and coalesced."""
        check_dtype(t.values(), "allreduce tensor (sparse values)")
        n = self._world_size
        with self._emulator_ops(), torch.no_grad():
            mine = t.coalesce()
            idx, val = mine.indices(), mine.values()
            count = torch.tensor([idx.shape[1]], dtype=torch.int64)
            counts = [torch.empty_like(count) for _ in range(n)]
        self.allgather([counts], [count])
        with self._emulator_ops(), torch.no_grad():
            sizes = [int(c) for c in counts]
            m = max(sizes)
            idx_p = torch.zeros(idx.shape[0], m, dtype=idx.dtype)
            idx_p[:, : sizes[self._rank]] = idx
            val_p = torch.zeros((m, *val.shape[1:]), dtype=val.dtype)
            val_p[: sizes[self._rank]] = val
            idxs = [torch.empty_like(idx_p) for _ in range(n)]
            vals = [torch.empty_like(val_p) for _ in range(n)]
        self.allgather([idxs], [idx_p])
        work = self.allgather([vals], [val_p])
        with self._emulator_ops(), torch.no_grad():
            total = torch.sparse_coo_tensor(torch.cat([i[:, :k] for i, k in zip(idxs, sizes)], dim=1),
                                            torch.cat([v[:k] for v, k in zip(vals, sizes)]), t.shape)
            t.copy_(total.coalesce())
        work.replace_outputs([t])
        return work

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """``all_gather_into_tensor`` of several tensors fused into one buffer (one collective)."""
        return self._fused("allgather", outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """``reduce_scatter_tensor`` of several tensors fused into one buffer (one collective)."""
        return self._fused("reduce_scatter", outputs, inputs, opts)

    def _fused(self, kind: str, outputs, inputs, opts):
        if len(outputs) != len(inputs) or not outputs:
            raise ValueError(f"hccl: coalesced {kind} needs matching, non-empty output and input lists")
        one = self._allgather_base if kind == "allgather" else self._reduce_scatter_base
        if len({t.dtype for t in list(outputs) + list(inputs)}) != 1:
            works = [one(o, i, opts) for o, i in zip(outputs, inputs)]
            return works[-1]
        n = self._world_size
        with self._emulator_ops():
            if kind == "allgather":
                fused_in = torch.cat([i.reshape(-1) for i in inputs])
                fused_out = torch.empty(n * fused_in.numel(), dtype=fused_in.dtype)
            else:  # rank-major chunks of every input, concatenated per rank
                per = [o.numel() for o in outputs]
                fused_in = torch.cat(
                    [i.reshape(n, -1)[r] for r in range(n) for i, m in zip(inputs, per)]
                ) if sum(per) else torch.empty(0, dtype=outputs[0].dtype)
                fused_out = torch.empty(sum(per), dtype=outputs[0].dtype)
        work = one(fused_out, fused_in, opts)
        with self._emulator_ops():
            if kind == "allgather":
                total = fused_in.numel()
                rows = fused_out.view(n, total) if total else fused_out.view(n, 0)
                off = 0
                for o, i in zip(outputs, inputs):
                    m = i.numel()
                    o.view(n, m).copy_(rows[:, off : off + m])
                    off += m
            else:
                off = 0
                for o in outputs:
                    o.view(-1).copy_(fused_out[off : off + o.numel()])
                    off += o.numel()
        work.replace_outputs(list(outputs))
        return work
