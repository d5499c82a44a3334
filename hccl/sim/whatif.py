"""What-ifs: a slow card, a degraded or failed link, a dead rank; the same in the planner and live.

A :class:`WhatIf` is part of the simulated cluster, like the topology: the planner takes it
as an argument, a live job from environment variables (:data:`ENV`, which ``models.train``'s
flags set) that every rank reads at process-group creation and must agree on.

Link names: ``R/P`` is scale-out port ``P`` (0-based, among the card's scale-out ports) of the
card of rank ``R``; ``R-Q`` the scale-up link(s) between the cards of ranks ``R`` and ``Q`` of
one box. Factors are slowdowns (>= 1): ``--degraded-link 3/1:4`` runs card 3's second scale-out
port at a quarter of its line rate; ``--slow-card 5:1.5`` makes card 5 take 1.5x as long for
its host and device work in every step.

NOTE [HCL on a down port]
    HCL 1.21 on Gaudi 3 survives a scale-out port going down: it migrates the port's queue
    pairs to the first scale-out port still up (``HclDeviceGaudi3::createMigrationQps``,
    ``hcl/src/platform/gaudi3/hcl_device.cpp``), which then carries both ports' flows. Gaudi2
    and first-generation HCL have no migration: a communicator cannot be created with a port
    down (``HclIDevice``: "Nic(...) is DOWN, can't allocate connection"), and a scale-up link
    has no stand-in on any generation. So ``--failed-link R/P`` on ``hls3`` moves the flows;
    elsewhere, and for ``R-Q`` links, it is the clear error HCL would give, at group creation
    (live) or planning time.

NOTE [a dead rank]
    ``--dead-rank R@S``: the process of rank ``R`` exits at the start of step ``S``. Its peers'
    next collective waits for it until the process group's timeout and fails (HCCL: every wait
    has a timeout), ending the job; torchrun with ``--max-restarts`` then starts every worker
    again: a new rendezvous, and the recipes compiled again (a cold recipe cache) or read from
    ``PT_HPU_RECIPE_CACHE_CONFIG``'s directory (warm). The planner states the simulated cost:
    the steps since the last checkpoint are lost, plus the timeout, the restart and the first
    steps' compile or cache reads (:func:`restart_cost_ns`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["WhatIf", "ENV", "parse_slow_card", "parse_link", "parse_dead_rank", "link_faults", "restart_cost_ns",
           "NONE"]

ENV = {"slow_cards": "HCCL_SIM_SLOW_CARD", "degraded_links": "HCCL_SIM_DEGRADED_LINK",
       "failed_links": "HCCL_SIM_FAILED_LINK", "dead_rank": "HCCL_SIM_DEAD_RANK"}
"""Environment variables of a live job's what-ifs (comma-separated lists, the flags' syntax)."""

_LINK = re.compile(r"^\s*(\d+)\s*([/-])\s*(\d+)\s*$")


def _number(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} {spec!r}: {text!r} is not a number") from None
    if not 1.0 <= value <= 1000.0:  # NaN and inf fail too
        raise ValueError(f"{what} {spec!r}: the factor is a slowdown and must be a finite number in [1, 1,000]"
                         f" (2 = twice as slow), got {text}")
    return value


def parse_slow_card(spec: str) -> tuple[int, float]:
    """``RANK:FACTOR`` -> (rank, factor)."""
    rank, sep, factor = spec.partition(":")
    if not sep or not rank.strip().isdigit():
        raise ValueError(f"--slow-card {spec!r}: expected RANK:FACTOR, e.g. 5:1.5")
    return int(rank), _number(factor, "--slow-card", spec)


def parse_link(spec: str, *, factor: bool) -> tuple[str, int, int, float]:
    """``R/P[:F]`` (scale-out port) or ``R-Q[:F]`` (scale-up link) -> (kind, a, b, factor)."""
    flag = "--degraded-link" if factor else "--failed-link"
    link, sep, f = spec.partition(":")
    m = _LINK.match(link)
    if not m or sep != (":" if factor else ""):
        form = "R/P:FACTOR or R-Q:FACTOR" if factor else "R/P or R-Q"
        raise ValueError(f"{flag} {spec!r}: expected {form} (R/P: scale-out port P of rank R's card; "
                         "R-Q: the scale-up link between ranks R and Q)")
    kind = "out" if m.group(2) == "/" else "up"
    return kind, int(m.group(1)), int(m.group(3)), _number(f, flag, spec) if factor else 0.0


def parse_dead_rank(spec: str) -> tuple[int, int]:
    """``RANK@STEP`` -> (rank, step)."""
    rank, sep, step = spec.partition("@")
    if not sep or not rank.strip().isdigit() or not step.strip().isdigit():
        raise ValueError(f"--dead-rank {spec!r}: expected RANK@STEP, e.g. 3@10")
    return int(rank), int(step)


@dataclass(kw_only=True, slots=True, frozen=True)
class WhatIf:
    """The cluster's departures from health (see the module docstring for the syntax)."""

    slow_cards: tuple[tuple[int, float], ...] = ()
    """(rank, slowdown) of cards slower in every step."""
    degraded_links: tuple[tuple[str, int, int, float], ...] = ()
    """(``"out"`` rank port | ``"up"`` rank rank, slowdown) of links running below line rate."""
    failed_links: tuple[tuple[str, int, int, float], ...] = ()
    """(kind, a, b, 0.0) of links that are down (NOTE [HCL on a down port])."""
    dead_rank: tuple[int, int] | None = None
    """(rank, step) of a process that dies (NOTE [a dead rank])."""

    @classmethod
    def parse(cls, *, slow_cards=(), degraded_links=(), failed_links=(), dead_rank=None) -> WhatIf:
        """From the flags' strings (each a list of specs)."""
        return cls(slow_cards=tuple(parse_slow_card(s) for s in slow_cards),
                   degraded_links=tuple(parse_link(s, factor=True) for s in degraded_links),
                   failed_links=tuple(parse_link(s, factor=False) for s in failed_links),
                   dead_rank=parse_dead_rank(dead_rank) if dead_rank else None)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WhatIf:
        """From :data:`ENV` (comma-separated specs).

        Raises:
            ValueError: a malformed spec, naming the variable.
        """
        env = os.environ if environ is None else environ
        lists = {k: [x for x in env.get(v, "").split(",") if x.strip()] for k, v in ENV.items()}
        try:
            return cls.parse(slow_cards=lists["slow_cards"], degraded_links=lists["degraded_links"],
                             failed_links=lists["failed_links"], dead_rank=(lists["dead_rank"] or [None])[0])
        except ValueError as exc:
            raise ValueError(f"hccl: {exc} (from the {', '.join(v for v in ENV.values() if env.get(v))} "
                             "environment)") from None

    def env(self) -> dict[str, str]:
        """The environment variables that give a live job these what-ifs."""
        def link(k, a, b, f):
            return f"{a}{'/' if k == 'out' else '-'}{b}" + (f":{f:g}" if f else "")
        out = {ENV["slow_cards"]: ",".join(f"{r}:{f:g}" for r, f in self.slow_cards),
               ENV["degraded_links"]: ",".join(link(*x) for x in self.degraded_links),
               ENV["failed_links"]: ",".join(link(*x) for x in self.failed_links),
               ENV["dead_rank"]: f"{self.dead_rank[0]}@{self.dead_rank[1]}" if self.dead_rank else ""}
        return {k: v for k, v in out.items() if v}

    @property
    def any(self) -> bool:
        """True if any what-if is set."""
        return bool(self.slow_cards or self.degraded_links or self.failed_links or self.dead_rank)

    def slow_factor(self, rank: int) -> float:
        """The product of ``rank``'s slow-card factors (1.0 if none)."""
        f = 1.0
        for r, x in self.slow_cards:
            if r == rank:
                f *= x
        return f

    def check(self, world_size: int) -> None:
        """Raise ValueError for a rank outside the job."""
        ranks = [r for r, _ in self.slow_cards] + [x[1] for x in self.degraded_links + self.failed_links] \
            + [x[2] for x in self.degraded_links + self.failed_links if x[0] == "up"] \
            + ([self.dead_rank[0]] if self.dead_rank else [])
        bad = sorted({r for r in ranks if not 0 <= r < world_size})
        if bad:
            raise ValueError(f"what-if names rank(s) {bad} outside the job's {world_size} ranks")

    def describe(self) -> str:
        """One line for summaries."""
        if not self.any:
            return "none"
        parts = [f"card {r} {f:g}x slower" for r, f in self.slow_cards]
        parts += [f"link {a}{'/' if k == 'out' else '-'}{b} {f:g}x slower" for k, a, b, f in self.degraded_links]
        parts += [f"link {a}{'/' if k == 'out' else '-'}{b} down" for k, a, b, _ in self.failed_links]
        if self.dead_rank:
            parts.append(f"rank {self.dead_rank[0]} dies at step {self.dead_rank[1]}")
        return "; ".join(parts)


NONE = WhatIf()
"""No what-if."""


def link_faults(topo, whatif: WhatIf):
    """``topo`` with ``whatif``'s links (degraded, or down with HCL's handling), as its ``faults``.

    Raises:
        ValueError: a link that does not exist, or a down link HCL cannot run without
            (NOTE [HCL on a down port]).
    """
    if not whatif.degraded_links and not whatif.failed_links:
        return topo
    whatif.check(topo.world_size)
    faults = []
    S, L = topo.scale_out_ports_per_card, topo.cards_per_box
    for kind, a, b, f in whatif.degraded_links + whatif.failed_links:
        name = f"{a}{'/' if kind == 'out' else '-'}{b}"
        if kind == "out":
            if not 0 <= b < S:
                raise ValueError(f"link {name}: card {a} has scale-out ports 0..{S - 1}")
            if not f and topo.generation != "gaudi3":
                raise ValueError(f"hccl: scale-out port {b} of rank {a}'s card is down: HCL on {topo.generation} "
                                 "has no port migration and cannot create the communicator (\"Nic is DOWN, can't "
                                 "allocate connection\"); only Gaudi 3 moves a down port's queue pairs to another")
            if not f and S < 2:
                raise ValueError(f"hccl: scale-out port {b} of rank {a}'s card is down and it has no other")
        else:
            if a // L != b // L or a == b or not topo.scale_up_ports_per_peer:
                raise ValueError(f"link {name}: ranks {a} and {b} are not two cards of one box linked by scale-up ports")
            if not f:
                raise ValueError(f"hccl: the scale-up link between ranks {a} and {b} is down: HCL has no stand-in "
                                 "for a scale-up link; the job cannot run")
        faults.append((kind, a, b, f))
    return dataclasses.replace(topo, faults=tuple(sorted(faults)))


def restart_cost_ns(*, timeout_s: float, steps_lost: int, step_ns: int, rendezvous_s: float,
                    first_steps_extra_ns: int) -> int:
    """Simulated cost of a dead rank under torchrun ``--max-restarts`` (NOTE [a dead rank]), ns:
    the lost steps, the peers' wait until the process-group timeout, a new rendezvous, and the
    extra time of the restarted job's first steps (compiles with a cold recipe cache, cache
    reads with a warm one)."""
    return int(steps_lost * step_ns + timeout_s * 1e9 + rendezvous_s * 1e9 + first_steps_extra_ns)
