"""The table-driven argument checks of the process group's collectives (no processes)."""

import pytest
import torch

from hccl.checks import SIGNATURES, Call, check


def _call(name, **kw):
    return Call(name, 4, 1, **kw)


def test_every_signature_has_rules_or_is_barrier():
    """Each collective the face exposes is in the table."""
    for name in ("allreduce", "reduce", "broadcast", "allgather", "all_gather_into_tensor", "reduce_scatter",
                 "reduce_scatter_tensor", "alltoall", "all_to_all_single", "gather", "scatter", "send", "recv"):
        assert SIGNATURES[name], name
    assert SIGNATURES["barrier"] == ()


@pytest.mark.parametrize("name,kw,exc,match", [
    ("allreduce", dict(tensors=[torch.ones(2), torch.ones(2)], op=1), ValueError, "exactly 1"),
    ("allreduce", dict(tensors=[torch.ones(2, dtype=torch.uint16)], op=1), TypeError, "cannot be reduced"),
    ("allreduce_coalesced", dict(tensors=[torch.ones(2), torch.ones(2, dtype=torch.float64)], op=1), TypeError,
     "one dtype"),
    ("reduce", dict(tensors=[torch.ones(2)], op=1, root=4), ValueError, "root rank 4 out of range"),
    ("broadcast", dict(tensors=[], root=0), ValueError, "at least one"),
    ("allgather", dict(outputs=[[torch.ones(2)] * 3], inputs=[torch.ones(2)]), ValueError, "expected world size 4"),
    ("allgather", dict(outputs=[[torch.ones(3)] * 4], inputs=[torch.ones(2)]), ValueError, "does not match"),
    ("all_gather_into_tensor", dict(outputs=[torch.ones(7)], inputs=[torch.ones(2)]), ValueError, "expected 8"),
    ("reduce_scatter_tensor", dict(outputs=[torch.ones(2)], inputs=[torch.ones(9)], op=1), ValueError,
     "expected 8"),
    ("alltoall", dict(outputs=[[torch.ones(1)] * 4], inputs=[[torch.ones(1, dtype=torch.int32)] * 4]), TypeError,
     "one dtype"),
    ("gather", dict(outputs=[[torch.ones(1)] * 4], inputs=[torch.ones(1)], root=0), ValueError, "not the root"),
    ("scatter", dict(outputs=[torch.ones(1)], inputs=[[torch.ones(2)] * 4], root=1), ValueError, "does not match"),
    # the same element count in another shape: gloo refuses it, Gaudi's copy back fails on it
    ("scatter", dict(outputs=[torch.ones(3, 4)], inputs=[[torch.ones(4, 3)] * 4], root=1), ValueError,
     r"scatter input tensor \(\(4, 3\), torch.float32\) does not match the output \(\(3, 4\)"),
    ("allgather", dict(outputs=[[torch.ones(6)] * 4], inputs=[torch.ones(2, 3)]), ValueError, "does not match"),
    ("reduce_scatter", dict(outputs=[torch.ones(2, 2)], inputs=[[torch.ones(4)] * 4], op=1), ValueError,
     "does not match"),
    ("send", dict(tensors=[torch.ones(1, dtype=torch.complex64)]), TypeError, "unsupported dtype"),
])
def test_bad_arguments(name, kw, exc, match):
    """Each rule refuses its case with a message naming the collective."""
    with pytest.raises(exc, match=match):
        check(_call(name, **kw))


def test_good_arguments_pass():
    """Well-formed calls pass every rule."""
    check(_call("allgather", outputs=[[torch.ones(2)] * 4], inputs=[torch.ones(2)]))
    check(_call("reduce_scatter", outputs=[torch.ones(2)], inputs=[[torch.ones(2)] * 4], op=1))
    check(_call("gather", outputs=[], inputs=[torch.ones(1)], root=0))  # not the root: no outputs
    check(_call("scatter", outputs=[torch.ones(2)], inputs=[[torch.ones(2)] * 4], root=1))
