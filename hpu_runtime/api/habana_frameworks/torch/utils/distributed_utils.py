"""``habana_frameworks.torch.utils.distributed_utils``: Gaudi's older home of ``initialize_distributed_hpu``."""

from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu  # noqa: F401
