"""``habana_frameworks.torch.distributed``: see :mod:`.hccl`."""
