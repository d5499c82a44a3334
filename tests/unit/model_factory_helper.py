"""A user-style model factory for resolve_factory tests (``tests.unit.model_factory_helper:factory``)."""

import torch
import torch.nn.functional as F

NOT_CALLABLE = 42


def factory(batch_size: int, width: int = 4):
    model = torch.nn.Linear(8, width)
    x = torch.randn(batch_size, 8)
    y = torch.randint(width, (batch_size,))
    return model, (x,), lambda out: F.cross_entropy(out, y)
