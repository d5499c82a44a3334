"""Deterministic variability: how much slower each card runs in each step.

Real clusters are not made of identical ranks: a card runs a few percent slower in one step
than the next, and now and then a step (or a card) is much slower. Every collective waits for
its slowest member (NOTE [the slowest member starts the collective] in :mod:`hccl.sim.timing`),
so the expected step grows with the number of cards. This module draws, for each (rank, step),
a slowdown factor that scales the card's host and device time in that step (NOTE [a slower
card, step by step] in :mod:`hpu_runtime.device.card`), from a seed, the same in a live run
(each rank draws its own) and in the planner (which needs the slowest of ``n`` draws).

NOTE [the slowdown distribution]
    One uniform ``u`` per (seed, rank, step), from a counter-based 64-bit hash (no state, any
    order, any machine), mapped by a quantile function with two parts:

    - the body (probability ``1 - slow_prob``): ``1 + jitter x t`` with ``t`` triangular on
      [-1, 1], the step-to-step variation of a healthy card;
    - the tail (probability ``slow_prob``): a slow step, ``(1 + jitter) x (1 + x)`` with ``x``
      Pareto (shape 2) from ``slow_min``, capped at ``slow_max``: rare, heavy-tailed.

    The quantile function uses only +, -, x, / and square roots (exactly rounded everywhere),
    and the factor is rounded to parts per million, so every machine draws the same integers.
    Parameters (:data:`DEFAULT`): the jitter and the slow-step rate are calibrated
    (``python -m models.bench_scaling`` names the points); ``slow_max = 0.5`` is Sinha et al.,
    SC22 ("Not All GPUs Are Created Equal": outliers 1.5x slower than the median card);
    ``slow_min``: 8% is Sinha et al.'s average variation among identical GPUs. The Llama 3
    paper's 1-2% diurnal throughput variation moves every card together and does not change
    how a job scales: not modelled.

NOTE [the slowest of n, at scale]
    A single collective's benchmark (``hccl.tools.bench --variability``) needs, per step, the
    largest factor among ``n`` ranks (the DDP planner's stand-in draws every rank instead, as
    it also needs each rank's running sum: NOTE [planning slower ranks] in
    :mod:`hccl.sim.straggler_plan`). Up to :data:`EXACT_RANKS` ranks it draws every rank's
    factor (vectorized) and takes the largest: the same values a live run draws. Beyond, it
    uses the order statistic: the largest of ``n`` independent uniforms is distributed as ``v^(1/n)``, so the slowest card's factor is
    the quantile function at ``v^(1/n)`` for one uniform ``v`` per step (drawn from the seed,
    the step and ``n``). That costs O(1) per step at 65,536 ranks; it is the same distribution
    as the rank-by-rank maximum, not the same sample (the power uses the C library's ``log`` and
    ``expm1``: a last-bit difference between libraries changes a factor only when it falls
    within 1e-16 of a ppm boundary).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Variability", "DEFAULT", "OFF", "EXACT_RANKS", "PPM", "ENV", "STRETCH_STEPS", "parse", "rank_slowdown",
           "slowest_ppm", "world_factors_ppm"]

ENV = "HCCL_SIM_VARIABILITY"
"""A live job's variability: ``off`` (default), ``on`` (:data:`DEFAULT`) or ``seed=N[,field=value...]``."""

PPM = 1_000_000
"""A factor of 1.0 in parts per million."""

EXACT_RANKS = 4096
"""Up to this many ranks the planner draws every rank (NOTE [the slowest of n, at scale])."""

STRETCH_STEPS = 1 << 32
"""Steps between the starts of two stretches of one run (:attr:`Variability.stretch`)."""

_K = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93)


def _uniform(seed: int, a, b, stream: int) -> np.ndarray:
    """Uniforms in (0, 1) (53-bit) from the counter ``(seed, a, b, stream)``; vectorized on a, b."""
    m = np.uint64
    with np.errstate(over="ignore"):
        x = (np.asarray(a, dtype=m) * m(_K[0])) ^ (np.asarray(b, dtype=m) * m(_K[3])) \
            ^ m((seed * _K[1] + stream * _K[2]) % (1 << 64))
        for k in (_K[1], _K[2]):
            x = x ^ (x >> m(31))
            x = x * m(k)
        x = x ^ (x >> m(29))
    return ((x >> m(11)).astype(np.float64) + 0.5) / float(1 << 53)


@dataclass(kw_only=True, slots=True, frozen=True)
class Variability:
    """Per-(rank, step) slowdown factors (NOTE [the slowdown distribution]); fractions, not %."""

    seed: int = 0
    """Seed of every draw: the same seed gives the same factors on any machine."""
    jitter: float = 0.10
    """Half-width of the triangular step-to-step variation (0.10: within +-10%, standard deviation
    4.1%); calibrated (``python -m models.bench_scaling --fit``: rms error 0.60 points over
    MLPerf v1.1 HLS-1H ResNet-50 16 -> 32/64/128 and HLS-1 BERT-L phase 1 8 -> 32, against 0.59
    at 8% (a tie, so the value stays), 0.72 at 6%, 0.76 at 12% and 1.15 at 15%, with HCL's box
    iterations in flight sharing the fabric and the steps after the alignment barrier left to
    settle: NOTE [the steps after the barrier] in :mod:`hccl.sim.straggler_plan`). Averaged
    over 8 stretches of draws per point (``--stretches 8``) the fit is no longer a tie: rms
    0.55 points at 10%, 0.61 at 8% and at 12%, 0.80 at 6%."""
    slow_prob: float = 1e-4
    """Probability that a (rank, step) is a slow step. ASSUMPTION, set a priori (not fitted):
    one card in 10,000 steps; at 1,024 cards about one step in ten then has a slow card."""
    slow_min: float = 0.08
    """Smallest extra slowdown of a slow step (0.08: 8% slower; Sinha et al., SC22)."""
    slow_max: float = 0.5
    """Largest extra slowdown of a slow step (0.5: 1.5x; Sinha et al., SC22)."""
    enabled: bool = True
    """False: every factor is 1 (:data:`OFF`)."""
    stretch: int = 0
    """Which stretch of a long run the steps belong to: stretch ``k`` draws step ``s`` as step
    ``s + k x`` :data:`STRETCH_STEPS` of the same seed (the same cluster, later in its run; no
    training run reaches 2**32 steps, so stretches never share a draw). 0: the run's first
    steps, what a live run draws unless told ``stretch=K``. The scaling study's ``--stretches K``
    averages this stretch and the ``K - 1`` after it (NOTE [one stretch is one sample] in
    :mod:`launchers.study.scale`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"variability seed must be an integer >= 0, got {self.seed!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"variability jitter must be in [0, 1), got {self.jitter!r}")
        if not 0 <= self.slow_prob < 1:
            raise ValueError(f"variability slow_prob must be in [0, 1), got {self.slow_prob!r}")
        if not 0 <= self.slow_min <= self.slow_max <= 100:  # NaN and inf fail too
            raise ValueError(f"variability needs 0 <= slow_min <= slow_max <= 100 (a slow step at most 101x as"
                             f" long), got {self.slow_min!r}, {self.slow_max!r}")
        if not isinstance(self.stretch, int) or isinstance(self.stretch, bool) or not 0 <= self.stretch < 1 << 31:
            raise ValueError(f"variability stretch must be an integer in [0, 2**31), got {self.stretch!r}")

    @property
    def active(self) -> bool:
        """True if some factor can differ from 1."""
        return self.enabled and (self.jitter > 0 or self.slow_prob > 0)

    def describe(self) -> str:
        """One line for summaries."""
        if not self.active:
            return "off (every card at its nominal speed)"
        return (f"seed {self.seed}{f' (stretch {self.stretch})' if self.stretch else ''}: step jitter "
                f"+-{self.jitter:.1%} (triangular), slow steps with probability {self.slow_prob:g} taking "
                f"{self.slow_min:.0%} to {self.slow_max:.0%} longer (Pareto tail)")

    def _step(self, step: int) -> int:
        """The counter of ``step`` in this stretch."""
        return step + self.stretch * STRETCH_STEPS

    # -- the quantile function -------------------------------------------------------------------
    def quantile(self, u) -> np.ndarray:
        """Factor (float) at uniform ``u`` (array), NOTE [the slowdown distribution]."""
        u = np.asarray(u, dtype=np.float64)
        p, j = self.slow_prob, self.jitter
        w = np.minimum(u / (1.0 - p), 1.0)
        tri = np.where(w < 0.5, np.sqrt(2.0 * w) - 1.0, 1.0 - np.sqrt(2.0 * (1.0 - w)))
        body = 1.0 + j * tri
        if p <= 0:
            return body
        tail_u = np.maximum(1.0 - u, 1e-300)
        x = np.minimum(self.slow_max, self.slow_min * np.sqrt(p / np.minimum(tail_u, p)))
        return np.where(u < 1.0 - p, body, (1.0 + j) * (1.0 + x))

    def _ppm(self, f) -> np.ndarray:
        return np.rint(np.asarray(f) * PPM).astype(np.int64)

    # -- draws -------------------------------------------------------------------------------------
    def factors_ppm(self, ranks, step: int) -> np.ndarray:
        """Every rank's factor in ``step``, ppm (int64 array the shape of ``ranks``)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if not self.active:
            return np.full(ranks.shape, PPM, dtype=np.int64)
        return self._ppm(self.quantile(_uniform(self.seed, ranks, np.full(ranks.shape, self._step(step)), 0)))

    def factor_ppm(self, rank: int, step: int) -> int:
        """One rank's factor in ``step``, ppm: what a live rank draws."""
        return int(self.factors_ppm(np.asarray([rank]), step)[0])

    def slowest_ppm(self, world_size: int, step: int, *, exclude: int | None = None) -> int:
        """The largest factor among ranks ``0 .. world_size-1`` (but ``exclude``) in ``step``, ppm
        (NOTE [the slowest of n, at scale]); :data:`PPM` for no rank."""
        n = world_size - (exclude is not None)
        if n <= 0 or not self.active:
            return PPM
        if world_size <= EXACT_RANKS:
            r = np.arange(world_size)
            if exclude is not None:
                r = r[r != exclude]
            return int(self.factors_ppm(r, step).max())
        v = float(_uniform(self.seed, np.asarray([n]), np.asarray([self._step(step)]), 1)[0])
        top = -math.expm1(math.log(v) / n)  # 1 - v^(1/n), accurate when tiny
        return int(self._ppm(self.quantile(np.asarray([1.0 - top])))[0])


DEFAULT = Variability()
"""The calibrated model the studies use unless told ``--variability off``."""

OFF = Variability(enabled=False)
"""No variability: every card at its nominal speed (the planner's default outside studies)."""


def parse(text: str | None) -> Variability:
    """``off`` / ``on`` / ``seed=N,jitter=0.01,slow_prob=1e-4,slow_min=0.08,slow_max=0.5,stretch=K``
    (any subset, the rest from :data:`DEFAULT`) -> :class:`Variability`.

    Raises:
        ValueError: an unknown field or a bad value, naming it.
    """
    text = (text or "off").strip().lower()
    if text in ("", "off", "0", "false", "none"):
        return OFF
    if text in ("on", "1", "true", "default"):
        return DEFAULT
    fields = {"seed": int, "jitter": float, "slow_prob": float, "slow_min": float, "slow_max": float, "stretch": int}
    values = {}
    for item in text.split(","):
        key, sep, val = (x.strip() for x in item.partition("="))
        if not sep or key not in fields:
            raise ValueError(f"variability {text!r}: expected off, on or field=value pairs with fields "
                             f"{', '.join(fields)}; got {item!r}")
        try:
            values[key] = fields[key](val)
        except ValueError:
            raise ValueError(f"variability {text!r}: {key}={val!r} is not a number") from None
    return dataclasses.replace(DEFAULT, **values)


def rank_slowdown(var: Variability, whatif, rank: int, *, quiet: range = range(0)):
    """``step -> ppm`` of ``rank``'s card: its draw times its slow-card what-if; None if always 1.
    In the steps of ``quiet`` (a training loop's :data:`hccl.sim.cluster.QUIET_STEPS`) the draw
    is nominal and only the what-if applies."""
    slow = whatif.slow_factor(rank) if whatif is not None else 1.0
    if not var.active and slow == 1.0:
        return None

    def factor(step: int) -> int:
        return int(round((PPM if step in quiet else var.factor_ppm(rank, step)) * slow))
    return factor


def world_factors_ppm(var: Variability, whatif, world_size: int, step: int, *, quiet: range = range(0)) -> np.ndarray:
    """Every rank's factor in ``step``, ppm, its slow-card what-if included (int64 array of
    ``world_size``, rank ``r`` at index ``r``): what each rank's :func:`rank_slowdown` with the
    same ``quiet`` gives."""
    f = var.factors_ppm(np.arange(world_size), step) if step not in quiet else np.full(world_size, PPM, np.int64)
    slow = [(r, x) for r, x in (whatif.slow_cards if whatif is not None else ()) if r < world_size]
    if not slow:
        return f
    scaled = f.astype(np.float64)
    for r, x in slow:
        scaled[r] *= x
    return np.rint(scaled).astype(np.int64)


def slowest_ppm(var: Variability, whatif, world_size: int, step: int, *, exclude: int | None = None) -> int:
    """The largest of the ``world_size`` ranks' factors in ``step`` (ppm), slow cards included,
    ``exclude`` left out."""
    slow = [(r, f) for r, f in (whatif.slow_cards if whatif is not None else ()) if r < world_size and r != exclude]
    if not slow:
        return var.slowest_ppm(world_size, step, exclude=exclude)
    if world_size <= EXACT_RANKS:
        f = world_factors_ppm(var, whatif, world_size, step)
        if exclude is not None:
            f[exclude] = 0
        return int(f.max())
    rest = var.slowest_ppm(world_size - len({r for r, _ in slow}) - (exclude is not None), step)
    return max([rest] + [int(round(var.factor_ppm(r, step) * whatif.slow_factor(r))) for r, _ in slow])
