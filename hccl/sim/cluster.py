"""The simulated cluster's condition: variability and what-ifs, as flags and environment.

One place for the command-line flags (``models.train``, the studies) and the environment
variables a live job's ranks read at process-group creation, so the planner and a live run
are told the same thing the same way:

==========================  ==============================  ==================================
flag                        variable                        meaning
==========================  ==============================  ==================================
``--variability``           ``HCCL_SIM_VARIABILITY``        ``off``, ``on`` or ``seed=N,...``
``--slow-card R:F``         ``HCCL_SIM_SLOW_CARD``          card R F x slower every step
``--degraded-link L:F``     ``HCCL_SIM_DEGRADED_LINK``      link L at 1/F of its line rate
``--failed-link L``         ``HCCL_SIM_FAILED_LINK``        link L down (HCL's handling)
``--dead-rank R@S``         ``HCCL_SIM_DEAD_RANK``          rank R's process dies at step S
==========================  ==============================  ==================================

(:mod:`hccl.sim.variability`, :mod:`hccl.sim.whatif` say what each does; repeated flags and
comma-separated variables give several.)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import variability as _var
from .whatif import ENV, NONE, WhatIf

__all__ = ["Cluster", "ALIGN_STEP", "SETTLE_STEPS", "QUIET_STEPS", "add_arguments", "from_args", "from_env"]

ALIGN_STEP = 3
"""A training loop with variability or what-ifs aligns its ranks once, after this many steps
(a barrier, which synchronizes the host: NOTE [planning slower ranks] in
:mod:`hccl.sim.straggler_plan`), as a logging or evaluation point would."""

SETTLE_STEPS = 2
"""Steps after the one holding the alignment barrier's wait that refill every rank's pipeline
before any step is kept (NOTE [the steps after the barrier] in :mod:`hccl.sim.straggler_plan`)."""

QUIET_STEPS = range(ALIGN_STEP, ALIGN_STEP + 1 + SETTLE_STEPS)
"""The step holding the alignment barrier's wait and the settling steps: every card works at its
nominal speed in them (its draw left out; a slow-card what-if still applies), so the kept steps
start from a host sync with every rank's pipeline refilled alike (NOTE [the kept stretch starts
at a sync] in :mod:`hccl.sim.straggler_plan`). The planner and a live run's process group both
leave them quiet."""


@dataclass(frozen=True, slots=True)
class Cluster:
    """Variability and what-ifs of one simulated cluster."""

    variability: _var.Variability = _var.OFF
    whatif: WhatIf = NONE

    @property
    def active(self) -> bool:
        """True if some card or link departs from nominal."""
        return self.variability.active or self.whatif.any

    def env(self) -> dict[str, str]:
        """Environment variables giving a live job this condition (empty values omitted)."""
        out = dict(self.whatif.env())
        v = self.variability
        if v.active:
            d = _var.DEFAULT
            fields = ("seed", "jitter", "slow_prob", "slow_min", "slow_max", "stretch")
            out[_var.ENV] = ",".join(f"{k}={getattr(v, k)!r}" for k in fields
                                     if getattr(v, k) != getattr(d, k) or k == "seed")
        return out

    def key(self) -> str:
        """A canonical string every rank of a job must share (compared at group creation)."""
        v = self.variability
        var = "off" if not v.active else \
            f"{v.seed},{v.jitter!r},{v.slow_prob!r},{v.slow_min!r},{v.slow_max!r},{v.stretch}"
        return f"variability={var};whatif={sorted(self.whatif.env().items())}"

    def describe(self) -> str:
        """Two short lines for summaries."""
        return f"variability: {self.variability.describe()}\nwhat-ifs: {self.whatif.describe()}"


def add_arguments(parser: argparse.ArgumentParser, *, variability: str = "off") -> None:
    """Add the flags of the table above to ``parser`` (``--variability`` defaults to ``variability``)."""
    g = parser.add_argument_group("simulated cluster (variability and what-ifs, hccl.sim.cluster)")
    g.add_argument("--variability", default=variability,
                   help="per-card, per-step slowdowns: off, on (the calibrated model) or seed=N[,jitter=X,"
                        f"slow_prob=P,slow_min=A,slow_max=B,stretch=K] (default: {variability})")
    g.add_argument("--slow-card", action="append", default=[], metavar="RANK:FACTOR",
                   help="this card takes FACTOR x as long every step (repeatable)")
    g.add_argument("--degraded-link", action="append", default=[], metavar="LINK:FACTOR",
                   help="R/P (scale-out port P of rank R) or R-Q (scale-up link) at 1/FACTOR of its rate")
    g.add_argument("--failed-link", action="append", default=[], metavar="LINK",
                   help="this link is down: HCL moves a Gaudi 3 scale-out port's flows, else the job cannot run")
    g.add_argument("--dead-rank", default=None, metavar="RANK@STEP",
                   help="this rank's process dies at the start of that step (live runs; the planner states the cost)")


def from_args(args: argparse.Namespace) -> Cluster:
    """The :class:`Cluster` the flags describe.

    Raises:
        ValueError: a malformed flag, naming it.
    """
    return Cluster(_var.parse(args.variability),
                   WhatIf.parse(slow_cards=args.slow_card, degraded_links=args.degraded_link,
                                failed_links=args.failed_link, dead_rank=args.dead_rank))


def from_env(environ: Mapping[str, str] | None = None) -> Cluster:
    """The :class:`Cluster` of a live job (its environment; default ``os.environ``).

    Raises:
        ValueError: a malformed variable, naming it.
    """
    env = os.environ if environ is None else environ
    try:
        var = _var.parse(env.get(_var.ENV))
    except ValueError as exc:
        raise ValueError(f"hccl: {_var.ENV}: {exc}") from None
    return Cluster(var, WhatIf.from_env(env))


ENV_VARS = (_var.ENV, *ENV.values())
"""Every variable of the table above."""
