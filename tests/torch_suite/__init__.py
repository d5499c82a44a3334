"""torch's own distributed test suite (``torch.testing._internal.distributed.distributed_test``)
driven over a chosen backend ("hccl" or "gloo"); see :mod:`tests.torch_suite.run_distributed_suite`."""
