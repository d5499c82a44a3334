"""``habana_frameworks.torch.core.quantization``: the inference set-up calls (``htcore`` re-exports them).

As in Intel's module (HabanaAI/gaudi-pytorch-bridge,
``python_packages/habana_frameworks/torch/core/quantization.py``):

* :func:`hpu_set_inference_env` (and its older name :func:`hpu_set_env`), called before the
  model moves to the card, returns the model with each ``Conv2d`` followed by a
  ``BatchNorm2d`` folded into one ``Conv2d`` (Intel's ``internal/fuse_conv_bn.py``): the
  simulated card then runs one convolution where it ran a convolution and a normalization, as
  Gaudi does. The model comes back unchanged (with a warning, as Intel's prints one) when it is
  in training mode, has a parameter off the CPU, or cannot be traced by ``torch.fx``; without a
  model they return None. The fold itself is torch's
  (:func:`torch.nn.utils.fusion.fuse_conv_bn_eval`).
* The graph-compiler flags Intel's versions also set (inference mode, the 3-D matmul reshape)
  and the fp8 side (:func:`hpu_inference_initialize` marking parameters as constants,
  quantization statistics) are not modelled: those calls are accepted and change nothing.
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn

__all__ = ["hpu_set_inference_env", "hpu_set_env", "hpu_inference_initialize", "hpu_initialize",
           "hpu_teardown_inference_env", "hpu_reset_env"]

log = logging.getLogger(__name__)


def _fuse_conv_bn(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (eval mode, on the CPU) with every ``Conv2d`` -> ``BatchNorm2d`` pair
    whose convolution output feeds only the normalization folded into one ``Conv2d``; ``model``
    itself where the fold does not apply (see the module docstring)."""
    if model.training:
        log.warning("hpu_set_inference_env: conv+bn fusion applies to a model in eval mode; model left as it is")
        return model
    if any(not p.is_cpu for p in model.parameters()):
        log.warning("hpu_set_inference_env: conv+bn fusion runs only before the model moves to the card; "
                    "model left as it is")
        return model
    try:
        gm = torch.fx.symbolic_trace(copy.deepcopy(model))
    except Exception:  # noqa: BLE001 - any tracing failure means: not fx-traceable, as Intel's
        log.warning("hpu_set_inference_env: the model cannot be traced by torch.fx; conv+bn fusion skipped")
        return model
    modules = dict(gm.named_modules())
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or type(modules[node.target]) is not nn.BatchNorm2d:
            continue
        conv_node = node.args[0]
        if (not isinstance(conv_node, torch.fx.Node) or conv_node.op != "call_module"
                or type(modules[conv_node.target]) is not nn.Conv2d or len(conv_node.users) > 1):
            continue
        fused = torch.nn.utils.fusion.fuse_conv_bn_eval(modules[conv_node.target], modules[node.target])
        parent, _, name = conv_node.target.rpartition(".")
        setattr(modules[parent], name, fused)
        modules[conv_node.target] = fused
        node.replace_all_uses_with(conv_node)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


def hpu_set_inference_env(model: nn.Module | None = None) -> nn.Module | None:
    """Prepare inference before the model moves to the card: returns ``model`` with its
    conv+bn pairs folded (a new ``torch.fx.GraphModule``; ``model`` is not changed), or None
    without a model."""
    if model is not None:
        return _fuse_conv_bn(model)
    return None


def hpu_set_env(model: nn.Module | None = None) -> nn.Module | None:
    """Intel's older name of :func:`hpu_set_inference_env` (same behaviour)."""
    return hpu_set_inference_env(model)


def hpu_inference_initialize(model=None, mark_only_scales_as_const: bool = False, optimizer=None,
                             args=None) -> None:
    """Accepted after the model moved to the card; marking parameters as constants (an fp8 and
    graph-compiler matter) is not modelled."""


def hpu_initialize(model=None, mark_only_scales_as_const: bool = False, optimizer=None, args=None) -> None:
    """Intel's older name of :func:`hpu_inference_initialize` (accepted, not modelled)."""


def hpu_teardown_inference_env() -> None:
    """Accepted at the end of inference (the flags it clears are not modelled)."""


def hpu_reset_env() -> None:
    """Intel's older name of :func:`hpu_teardown_inference_env` (accepted)."""
