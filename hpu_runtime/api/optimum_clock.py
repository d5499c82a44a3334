"""optimum-habana's and transformers' throughput figures on the simulated Gaudi clock.

``GaudiTrainer`` times training and evaluation with ``time.time()`` and reports
``{split}_runtime``, ``{split}_samples_per_second``, ``{split}_steps_per_second`` and
``{split}_tokens_per_second`` (``optimum.habana.utils.speed_metrics``). On a Gaudi those
figures are the device's; on the emulator the wall clock measures a CPU. When
``optimum.habana.transformers.trainer`` is imported, :mod:`hpu_runtime.import_hooks` calls
:func:`patch_trainer_module`, which

* gives that module a ``time`` whose ``time()`` also notes the simulated host clock
  (:attr:`SimDevice.host_ns`, simulated ns) at each instant it returns (a dict lookup per
  call; nothing is written to the timeline), and
* wraps its ``speed_metrics`` so the runtime and rates it reports are computed from the
  simulated clock between the same instants, with the wall-clock runtime kept as
  ``{split}_wall_runtime`` and ``{split}_clock: "simulated Gaudi"`` saying which is which.

With ``--adjust_throughput`` the trainer also measures the time it spends logging, evaluating
and saving (``log_evaluate_save_time``, with ``HabanaGenerationTime``, whose clock is the
simulated one here, below) and leaves it out of the rates: so do the simulated rates. Instants
the patched ``time()`` did not serve leave the metrics as optimum-habana computed them.

transformers' own ``Trainer`` (which Hugging Face's Gaudi guide runs on hpu unchanged, picking
the device and ``hpu_backend`` itself) reports the same figures through
``transformers.trainer_utils.speed_metrics``, which reads the end instant itself.
:func:`patch_transformers_trainer` gives ``transformers.trainer`` the same noting ``time`` and
wraps its ``speed_metrics``: the simulated runtime runs from the noted start to the simulated
host clock when the metrics are taken. It is applied only in a process running the emulator
(when ``transformers.trainer`` is imported after ``hpu_runtime``, or by ``import hpu_runtime``
if it was imported before: ``import_hooks.patch_imported``). In either trainer, a run whose simulated clock did
not move (a model kept on the CPU) keeps its wall-clock figures.

Text generation (optimum-habana's ``examples/text-generation/run_generation.py`` and
``GaudiGenerationMixin.generate``) times itself with ``HabanaGenerationTime``
(``optimum.habana.utils.misc``), which reads ``time.perf_counter()``: its first-token latency
(taken after ``torch.hpu.synchronize()``), its per-token latencies (host instants, as the host
runs ahead of the card in lazy mode) and the script's throughput. When that module is imported,
:func:`patch_misc_module` gives it a ``time`` whose ``perf_counter()`` (:class:`_GenerationClock`)
counts wall seconds (from the module's import) until the simulated card first holds a
tensor, then advances with the simulated host clock only (its value at that instant, plus
simulated ns since, over 1e9): one monotonic clock, so a timer that spans the model's load and
its move to the card (the script's "Model initialization") counts the host's loading in wall
time, and every figure of generation on the card is the simulated Gaudi's, the same on any
machine under any load, to the last bit: every value the clock returns is offset by 2**19
seconds, so all lie in one binade (for six days of wall plus simulated time) and a
difference of two of them depends on the simulated ns alone, never on when the switch came. A
warning says when it switches. Its ``time()`` is the same clock, and everything else is the
``time`` module's.

optimum-habana's diffusers pipelines (``GaudiStableDiffusionPipeline`` and the others under
``optimum.habana.diffusers.pipelines``) time their generation with ``time.time()`` and report
``throughput`` (samples per second, after warm-up batches, adjusted for warm-up inference steps
by ``optimum.habana.utils.misc``). :func:`patch_pipeline_module` gives each pipeline module the
same clock as ``misc`` (one shared :class:`_GenerationClock`), so the adjustment and the
throughput are on the simulated clock too.
"""

from __future__ import annotations

import logging
import threading
import time as _time
from types import ModuleType

from ..bridge.runtime import get_device

__all__ = ["CLOCK", "patch_trainer_module", "patch_transformers_trainer", "patch_misc_module",
           "patch_pipeline_module"]

log = logging.getLogger(__name__)

CLOCK = "simulated Gaudi"
"""Value of ``{split}_clock`` in the patched metrics."""

_KEEP = 64  # instants remembered (the trainer asks for a handful per run)


class _NotingTime:
    """The ``time`` module, whose ``time()`` remembers the simulated host clock at each value it returns."""

    def __init__(self) -> None:
        self.sim_ns: dict[float, int] = {}

    def time(self) -> float:
        now = _time.time()
        self.sim_ns[now] = get_device().host_ns
        if len(self.sim_ns) > _KEEP:
            self.sim_ns.pop(next(iter(self.sim_ns)))
        return now

    def __getattr__(self, name: str):
        return getattr(_time, name)


def _on_simulated_clock(result: dict, split: str, runtime: float, whole: float, **counts) -> dict:
    """``result`` (a ``speed_metrics`` dict) with its runtime ``whole`` and its rates over
    ``runtime`` (simulated seconds), the wall runtime kept as ``{split}_wall_runtime``;
    ``result`` as it is when the simulated clock did not move (nothing ran on the card)."""
    if whole <= 0:
        return result
    result[f"{split}_wall_runtime"] = result.pop(f"{split}_runtime")
    result[f"{split}_runtime"] = round(whole, 6)
    result[f"{split}_clock"] = CLOCK
    for name, count in counts.items():
        key = f"{split}_{name}_per_second"
        if key in result or (count is not None and name == "tokens"):
            result[key] = round(count / runtime, 3) if count is not None and runtime > 0 else 0.0
    return result


def _simulated(clock: _NotingTime, original):
    def speed_metrics(split, start_time, end_time, num_samples=None, num_steps=None, num_tokens=None,
                      start_time_after_warmup=None, log_evaluate_save_time=None, **kwargs):
        result = original(split, start_time, end_time, num_samples=num_samples, num_steps=num_steps,
                          num_tokens=num_tokens, start_time_after_warmup=start_time_after_warmup,
                          log_evaluate_save_time=log_evaluate_save_time, **kwargs)
        begin = start_time if start_time_after_warmup is None else start_time_after_warmup
        if begin not in clock.sim_ns or end_time not in clock.sim_ns:
            return result
        runtime = (clock.sim_ns[end_time] - clock.sim_ns[begin]) / 1e9
        if log_evaluate_save_time is not None:  # simulated too: HabanaGenerationTime's (patch_misc_module)
            runtime -= log_evaluate_save_time
        whole = (clock.sim_ns[end_time] - clock.sim_ns[start_time]) / 1e9
        return _on_simulated_clock(result, split, runtime, whole, samples=num_samples, steps=num_steps,
                                   tokens=num_tokens)

    speed_metrics.__wrapped__ = original
    return speed_metrics


def _simulated_transformers(clock: _NotingTime, original):
    def speed_metrics(split, start_time, num_samples=None, num_steps=None, num_tokens=None):
        result = original(split, start_time, num_samples=num_samples, num_steps=num_steps, num_tokens=num_tokens)
        begin = clock.sim_ns.get(start_time)
        if begin is None:
            return result
        runtime = (get_device().host_ns - begin) / 1e9
        return _on_simulated_clock(result, split, runtime, runtime, samples=num_samples, steps=num_steps,
                                   tokens=num_tokens)

    speed_metrics.__wrapped__ = original
    return speed_metrics


def patch_trainer_module(module: ModuleType) -> None:
    """Put the simulated clock under ``module``'s ``time`` and ``speed_metrics`` (optimum-habana's
    ``optimum.habana.transformers.trainer``; idempotent)."""
    if isinstance(getattr(module, "time", None), _NotingTime):
        return
    clock = _NotingTime()
    module.time = clock
    if hasattr(module, "speed_metrics"):
        module.speed_metrics = _simulated(clock, module.speed_metrics)


def patch_transformers_trainer(module: ModuleType) -> None:
    """Put the simulated clock under ``transformers.trainer``'s ``time`` and ``speed_metrics``
    (idempotent)."""
    if isinstance(getattr(module, "time", None), _NotingTime) or not hasattr(module, "speed_metrics"):
        return
    clock = _NotingTime()
    module.time = clock
    module.speed_metrics = _simulated_transformers(clock, module.speed_metrics)


class _GenerationClock:
    """The ``time`` module, whose ``perf_counter()`` (wall seconds) follows the simulated host
    clock from the first instant the simulated card holds a tensor (see the module docstring).
    A :func:`~hpu_runtime.reset_device` (the simulated clock starts again from 0) rebases it, so
    it never goes back."""

    _OFFSET = float(2 ** 19)
    """Added to every value: one binade for all of them, so differences are exact (see the
    module docstring)."""

    def __init__(self) -> None:
        self._base: tuple[float, int] | None = None  # (clock value, simulated host ns) at the switch
        self._last = self._OFFSET
        self._wall0 = _time.perf_counter()
        self._lock = threading.Lock()

    def perf_counter(self) -> float:
        with self._lock:
            if self._base is None:
                now = self._OFFSET + (_time.perf_counter() - self._wall0)
                dev = get_device()
                if dev.hbm.live_bytes > 0:
                    self._base = (max(now, self._last), dev.host_ns)
                    log.warning("hpu_runtime: optimum-habana's timers (HabanaGenerationTime, the diffusers "
                                "pipelines' throughput) read the simulated Gaudi clock from now on: their latency and "
                                "throughput figures are the simulated card's")
                self._last = max(now, self._last)
                return self._last
            wall, sim = self._base
            host_ns = get_device().host_ns
            if host_ns < sim:  # the device was reset: its clock starts again
                self._base = (self._last, host_ns)
                wall, sim = self._base
            self._last = wall + (host_ns - sim) / 1e9
            return self._last

    time = perf_counter  # the pipelines' time.time(): the same clock

    def __getattr__(self, name: str):
        return getattr(_time, name)


_GENERATION_CLOCK = _GenerationClock()
"""The process's one generation clock: ``misc`` and the pipelines share it."""


def patch_misc_module(module: ModuleType) -> None:
    """Put the generation clock under ``module``'s ``time`` (``optimum.habana.utils.misc``, whose
    ``HabanaGenerationTime`` reads ``time.perf_counter()``); idempotent."""
    if not isinstance(getattr(module, "time", None), _GenerationClock):
        module.time = _GENERATION_CLOCK


def patch_pipeline_module(module: ModuleType) -> None:
    """Put the generation clock under an optimum-habana diffusers pipeline module's ``time``
    (a module that imported the ``time`` module); idempotent."""
    if getattr(module, "time", None) is _time:
        module.time = _GENERATION_CLOCK
