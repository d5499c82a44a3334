"""One training step's ingredients, uniformly for every model: ``(model, inputs, loss_fn)``.

``model(*inputs)`` is the forward pass; ``loss_fn(output)`` the scalar training loss, its
targets held in the closure. :func:`step_factory` makes them for a registered model from
torch factory functions only (no numpy, no data files, no host reads), so it can run under
``FakeTensorMode`` with nothing real allocated. :func:`resolve_factory` turns a user's
spec -- a registered name or ``package.module:factory`` -- into ``factory(batch_size)``.

The same batch layout and loss serve ``models.train`` with real data
(:func:`split_batch`, :func:`task_loss`), per task:

- ``classify``: batch ``(x, y)``; inputs ``(x,)``; cross entropy of the logits against ``y``.
- ``mlm-nsp`` (BERT): batch ``(input_ids, token_type_ids, attention_mask, mlm_labels,
  nsp_labels)``; inputs ``(input_ids, token_type_ids)`` (the attention mask is all ones:
  see :class:`models.bert.BertPretraining`); masked-LM cross entropy (labels -100 ignored)
  plus next-sentence cross entropy, as transformers sums them.
- ``causal-lm`` (GPT-2): batch ``(input_ids, labels)`` with labels already shifted by one;
  inputs ``(input_ids,)``; next-token cross entropy.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from .registry import get_model_entry, build_config, model_names

__all__ = ["TrainingStep", "step_factory", "resolve_factory", "torchvision_step", "split_batch", "task_loss",
           "check_sizes"]


class TrainingStep(NamedTuple):
    """What one training step needs: unpacks as ``model, inputs, loss_fn``."""

    model: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    loss_fn: Callable[[Any], torch.Tensor]


def _field(output: Any, name: str) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output[name]


def split_batch(task: str, batch: Sequence[torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """``(inputs, targets)`` of a dataset batch for ``task`` (see the module docstring)."""
    if task == "classify":
        return (batch[0],), (batch[1],)
    if task == "mlm-nsp":
        ids, types, _attention, mlm, nsp = batch  # no padding: see models.bert.BertPretraining
        return (ids, types), (mlm, nsp)
    if task == "causal-lm":
        return (batch[0],), (batch[1],)
    raise ValueError(f"unknown task {task!r}")


def task_loss(task: str, output: Any, targets: Sequence[torch.Tensor]) -> torch.Tensor:
    """Scalar training loss of ``output`` (a tensor or a transformers ModelOutput).

    ``targets`` may be host tensors: each is copied to the device of the logits first (on the
    simulated Gaudi a host->device copy, as a Gaudi script moves its labels).
    """
    if task == "classify":
        logits = _field(output, "logits")
        return F.cross_entropy(logits, targets[0].to(logits.device))
    if task == "mlm-nsp":
        logits, nsp_logits = output["prediction_logits"], output["seq_relationship_logits"]
        mlm, nsp = (t.to(logits.device) for t in targets)
        mlm_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), mlm.reshape(-1), ignore_index=-100)
        return mlm_loss + F.cross_entropy(nsp_logits, nsp)
    if task == "causal-lm":
        logits = _field(output, "logits")
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[0].to(logits.device).reshape(-1))
    raise ValueError(f"unknown task {task!r}")


def _random_batch(kind, batch_size: int, seq_len: int | None, image_size: int | None) -> tuple[torch.Tensor, ...]:
    b = batch_size
    if kind.task == "classify":
        y = torch.randint(kind.num_classes, (b,))
        if kind.kind == "image":
            return torch.randn(b, 3, image_size, image_size), y
        return torch.randn(b, kind.in_features), y
    t, v = seq_len, kind.vocab_size
    ids = torch.randint(v, (b, t))
    if kind.task == "mlm-nsp":
        types = (torch.arange(t) >= t // 2).long().expand(b, t).contiguous()
        attention = torch.ones(b, t, dtype=torch.long)
        mlm = torch.where(torch.rand(b, t) < 0.15, ids, torch.full_like(ids, -100))
        mlm[:, 0] = ids[:, 0]  # at least one masked position per row
        return ids, types, attention, mlm, torch.randint(2, (b,))
    return ids, torch.randint(v, (b, t))


def step_factory(
    name: str,
    flavour: str | None = None,
    *,
    batch_size: int,
    seq_len: int | None = None,
    image_size: int | None = None,
    **overrides: Any,
) -> TrainingStep:
    """Build registered model ``name`` and a random batch for one training step.

    Works under ``FakeTensorMode`` (model and inputs come from torch factory functions).

    Args:
        flavour: e.g. ``"debug"``; ``None`` is full size.
        batch_size: samples per step (>= 1).
        seq_len: tokens per sample (text models; default: the config's ``seq_len``).
        image_size: pixels per side (image models; default: the config's ``image_size``).
        **overrides: config fields (see the model's config dataclass).

    Returns:
        ``TrainingStep(model, inputs, loss_fn)``: ``loss_fn(model(*inputs))`` is the loss.

    Raises:
        ValueError: unknown model/flavour/field, ``batch_size < 1``, a size <= 0, or
            ``seq_len`` above the model's ``max_positions``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    entry = get_model_entry(name)
    cfg = build_config(name, flavour, **overrides)
    kind = cfg.model_kind()
    seq_len, image_size = check_sizes(name, kind, seq_len=seq_len, image_size=image_size)
    model = entry.build(cfg)
    inputs, targets = split_batch(kind.task, _random_batch(kind, batch_size, seq_len, image_size))
    targets = tuple(t.cpu() for t in targets)  # host labels, as a data loader gives them
    return TrainingStep(model, inputs, lambda output: task_loss(kind.task, output, targets))


def check_sizes(name: str, kind, *, seq_len: int | None, image_size: int | None) -> tuple[int | None, int | None]:
    """Validated ``(seq_len, image_size)`` for model ``name``, defaults filled from ``kind``.

    Raises:
        ValueError: a size <= 0, a size given to the wrong kind of model, or ``seq_len``
            above ``max_positions``.
    """
    if kind.kind == "text":
        if image_size is not None:
            raise ValueError(f"model {name!r} is a text model: image_size does not apply")
        seq_len = kind.seq_len if seq_len is None else seq_len
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if seq_len > kind.max_positions:
            raise ValueError(f"seq_len {seq_len} exceeds model {name!r}'s max_positions {kind.max_positions}")
        return seq_len, None
    if seq_len is not None:
        raise ValueError(f"model {name!r} is a {kind.kind} model: seq_len does not apply")
    if kind.kind == "image":
        image_size = kind.image_size if image_size is None else image_size
        if image_size < 32:
            raise ValueError(f"image_size must be >= 32 for model {name!r}, got {image_size}")
        return None, image_size
    if image_size is not None:
        raise ValueError(f"model {name!r} is a {kind.kind} model: image_size does not apply")
    return None, None


def _registered(spec: str) -> tuple[str, str | None] | None:
    name, _, flavour = spec.partition(":")
    if name not in model_names():
        return None
    return name, (flavour or None)


def resolve_factory(spec: str, **model_kwargs: Any) -> Callable[[int], TrainingStep]:
    """``factory(batch_size) -> (model, inputs, loss_fn)`` for a model spec.

    ``spec`` is one of:

    - a registered name, optionally with a flavour: ``"gpt2"``, ``"resnet50:debug"``;
      ``model_kwargs`` go to :func:`step_factory` (``seq_len``, ``image_size``, config fields);
    - ``"package.module:factory"``: an importable callable taking the batch size (and
      ``model_kwargs``, if any) and returning ``(model, inputs, loss_fn)``;
    - ``"torchvision.models:NAME"``: one of torchvision's image classification builders
      (``torchvision.models.list_models(module=torchvision.models)``), built untrained
      (``weights=None``: nothing is downloaded) and trained on random images
      (:func:`torchvision_step`).

    A name before the colon that is registered wins over a module of the same name.
    Nothing is built until the returned factory is called.

    Raises:
        ValueError: unknown name (the message lists the registered ones), unknown flavour,
            a module that cannot be imported, a missing attribute, a non-callable, a callable
            whose first parameter is ``weights`` or ``pretrained`` (a model builder, which
            would take the batch size for its weights), ``model_kwargs`` the factory does not
            take, or, when the factory is called, a result that is not ``(model, inputs,
            loss_fn)``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"model spec must be a non-empty string, got {spec!r}")
    reg = _registered(spec)
    if reg is not None:
        name, flavour = reg
        entry = get_model_entry(name)
        if flavour is not None and flavour not in entry.flavours:
            raise ValueError(f"model {name!r} has no flavour {flavour!r}; known: {sorted(entry.flavours)}")

        def factory(batch_size: int) -> TrainingStep:
            return step_factory(name, flavour, batch_size=batch_size, **model_kwargs)

        factory.__name__ = f"step_factory[{spec}]"
        return factory
    if ":" not in spec:
        raise ValueError(
            f"unknown model {spec!r}; registered: {', '.join(model_names())}"
            " (or give a user factory as 'package.module:factory')"
        )
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"model spec {spec!r} must look like 'package.module:factory'")
    if module_name == "torchvision" or module_name.startswith("torchvision."):
        from ._torchvision import import_torchvision

        import_torchvision()  # the CPU wheel's workaround (NOTE [torchvision on the CPU torch wheel])
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ValueError(
                f"cannot import module {module_name!r} of model spec {spec!r} (not found; is it on"
                f" PYTHONPATH?); registered models: {', '.join(model_names())}"
            ) from e
        raise ValueError(f"importing module {module_name!r} of model spec {spec!r} failed: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (model spec {spec!r})") from None
    if not callable(obj):
        raise ValueError(f"{spec!r} is a {type(obj).__name__}, not a callable factory(batch_size)")
    if _torchvision_classifier(obj):
        def torchvision_factory(batch_size: int) -> TrainingStep:
            return torchvision_step(obj, batch_size, **model_kwargs)

        torchvision_factory.__name__ = f"torchvision_step[{obj.__name__}]"
        return torchvision_factory
    first = _first_parameter(obj)
    if first in ("weights", "pretrained"):
        raise ValueError(
            f"{spec!r} is a model builder (its first parameter is {first!r}), not a factory(batch_size):"
            f" called with the batch size it would take that for its {first}. Give a function"
            " factory(batch_size) -> (model, inputs, loss_fn) that builds the model and a batch,"
            " or one of torchvision's image classifiers as 'torchvision.models:NAME'")

    _check_takes(spec, obj, model_kwargs)

    def user_factory(batch_size: int) -> TrainingStep:
        return _checked_step(spec, obj(batch_size, **model_kwargs))

    user_factory.__name__ = f"user_factory[{spec}]"
    return user_factory


def _check_takes(spec: str, fn: Callable, kwargs: dict) -> None:
    """Raise ValueError if ``fn(batch_size, **kwargs)`` would not bind (``--seq-len`` given to a
    factory without a ``seq_len`` parameter), naming what it does take."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to check against: the call will tell
        return
    try:
        sig.bind(1, **kwargs)
    except TypeError as e:
        takes = ", ".join(sig.parameters) or "nothing"
        given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise ValueError(f"model factory {spec!r} cannot be called as factory(batch_size, {given}): {e}; its"
                         f" parameters are ({takes}). --seq-len and --image-size reach a factory as seq_len="
                         " and image_size=") from None


def _first_parameter(fn: Callable) -> str | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return None
    return params[0].name if params else None


def _checked_step(spec: str, out: Any) -> TrainingStep:
    """``out`` as a :class:`TrainingStep` (the tracer's own check of a factory's result,
    :func:`hpu_runtime.tools.tracing.step_parts`)."""
    from hpu_runtime.tools.tracing import step_parts

    return TrainingStep(*step_parts(out, repr(spec)))


def _torchvision_image_size(builder: Callable) -> int:
    """Default pixels per side of :func:`torchvision_step`'s images: the crop of the model's
    default ImageNet weights (their ``transforms``' ``crop_size``: 224 for most, 299 for
    Inception v3, 240-600 for EfficientNet), the resolution its published accuracy is measured
    at; 224 if the weights do not say."""
    import torchvision.models as tvm

    try:
        crop = tvm.get_model_weights(builder.__name__).DEFAULT.transforms.keywords["crop_size"]
        return int(crop[0] if isinstance(crop, (tuple, list)) else crop)
    except (AttributeError, KeyError, TypeError, ValueError):
        return 224


def _torchvision_classifier(fn: Callable) -> bool:
    """Whether ``fn`` is one of torchvision's image classification builders (its registry,
    ``torchvision.models.list_models(module=torchvision.models)``; not detection, segmentation,
    video, optical flow or quantized models, whose inputs and losses differ)."""
    if not (getattr(fn, "__module__", "") or "").startswith("torchvision.models."):
        return False
    import torchvision.models as tvm

    name = getattr(fn, "__name__", None)
    return name in tvm.list_models(module=tvm) and tvm.get_model_builder(name) is fn


_INIT_WEIGHTS_BUILDERS = frozenset({"googlenet", "inception_v3"})
"""torchvision builders whose ``init_weights=None`` default emits a ``FutureWarning`` and stands
for ``True`` (torchvision 0.28, ``models/googlenet.py`` and ``models/inception.py``): the step
passes ``True`` unless the caller gives it, so a user who names the model sees no warning about
an argument they never set."""


def torchvision_step(builder: Callable, batch_size: int, *, image_size: int | None = None,
                     num_classes: int = 1000, **builder_kwargs: Any) -> TrainingStep:
    """One training step of a torchvision image classifier: the model untrained
    (``weights=None``, so nothing is downloaded), ``batch_size`` random ``3 x image_size x
    image_size`` images and labels, and the cross entropy of the logits (of the main logits for
    GoogLeNet and Inception v3, whose training output also holds auxiliary ones). The default
    ``image_size`` is the crop of the model's default weights (:func:`_torchvision_image_size`).

    Vision transformers (``vit_*``) are built for ``image_size`` (their ``image_size`` argument,
    torchvision's ``VisionTransformer``). Works under ``FakeTensorMode``.

    Raises:
        ValueError: ``batch_size < 1``, ``image_size < 32``, or ``seq_len`` given.
    """
    if "seq_len" in builder_kwargs:
        raise ValueError(f"{builder.__name__} is an image model: seq_len does not apply")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    size = _torchvision_image_size(builder) if image_size is None else image_size
    if size < 32:
        raise ValueError(f"image_size must be >= 32 for {builder.__name__}, got {size}")
    if builder.__name__.startswith("vit_"):
        builder_kwargs = {"image_size": size, **builder_kwargs}
    if builder.__name__ in _INIT_WEIGHTS_BUILDERS:
        builder_kwargs = {"init_weights": True, **builder_kwargs}
    model = builder(weights=None, num_classes=num_classes, **builder_kwargs)
    x = torch.randn(batch_size, 3, size, size)
    y = torch.randint(num_classes, (batch_size,))

    def loss_fn(output: Any) -> torch.Tensor:
        logits = getattr(output, "logits", output)  # GoogLeNetOutputs / InceptionOutputs in training
        return F.cross_entropy(logits, y.to(logits.device))

    return TrainingStep(model, (x,), loss_fn)
