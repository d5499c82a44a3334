"""A user-style model factory for resolve_factory tests (``tests.unit.model_factory_helper:factory``)."""

import torch
import torch.nn.functional as F

NOT_CALLABLE = 42


def factory(batch_size: int, width: int = 4):
    model = torch.nn.Linear(8, width)
    x = torch.randn(batch_size, 8)
    y = torch.randint(width, (batch_size,))
    return model, (x,), lambda out: F.cross_entropy(out, y)


def builder(weights=None, progress=True):
    """A model builder in torchvision's style (weights first): not a factory(batch_size)."""
    raise AssertionError("a model builder must be refused before it is called")


def returns_a_module(batch_size: int):
    return torch.nn.Linear(8, 4)


def bare_input(batch_size: int):
    """One input tensor, not in a tuple (the tracer has always taken it so)."""
    model = torch.nn.Linear(8, 4)
    return model, torch.randn(batch_size, 8), lambda out: out.sum()
