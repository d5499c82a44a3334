"""Sweeps over a job's flags and their result table: pure, no Ray, no processes.

``launchers.ray --sweep KEY=V1,V2`` expands the sweep with :func:`parse_sweep`, runs one job
per setting (a Ray Tune trial, :mod:`launchers.ray_tune`) with :func:`sweep_argv`'s
arguments, picks each job's columns with :func:`summary_columns` and writes the table with
:func:`format_table`.
"""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Sequence
from typing import Any

__all__ = ["format_table", "parse_sweep", "summary_columns", "sweep_argv"]


def parse_sweep(specs: Sequence[str]) -> list[dict[str, str]]:
    """Expands ``["KEY=V1,V2", "K2=A,B"]`` into the product of settings, in order.

    Raises:
        ValueError: A spec has no ``=``, no key, or no value.
    """
    axes: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip().lstrip("-")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key or not vals:
            raise ValueError(f"--sweep {spec!r} is not of the form KEY=V1,V2,...")
        axes.append((key, vals))
    keys = [k for k, _ in axes]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(v for _, v in axes))]


def sweep_argv(argv: Sequence[str], setting: dict[str, str]) -> tuple[str, ...]:
    """Appends ``--key value`` per setting (underscores become dashes; argparse keeps the
    last occurrence, so this overrides an earlier value)."""
    extra: list[str] = []
    for key, value in setting.items():
        extra += [f"--{key.replace('_', '-')}", value]
    return (*argv, *extra)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def summary_columns(summary: dict[str, Any], metrics: Sequence[str] | None) -> dict[str, Any]:
    """Picks table columns from a summary: the dotted paths in ``metrics``, or (when
    ``metrics`` is empty) every top-level number and every number under ``final``
    (``models.train`` keeps its end-of-run metrics there)."""
    if not metrics:
        row = {k: v for k, v in summary.items() if _is_number(v)}
        final = summary.get("final")
        if isinstance(final, dict):
            row.update({f"final.{k}": v for k, v in final.items() if _is_number(v)})
        return row
    row = {}
    for path in metrics:
        value: Any = summary
        for part in path.split("."):
            if isinstance(value, dict):
                value = value.get(part)
            elif isinstance(value, list) and part.lstrip("-").isdigit() and value:
                value = value[int(part)]
            else:
                value = None
        row[path] = value
    return row


def format_table(rows: Sequence[dict[str, Any]], fmt: str) -> str:
    """Renders rows as ``markdown`` or ``csv``; columns in order of first appearance."""
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.6g}"
        return "" if value is None else str(value)

    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([cell(row.get(c)) for c in columns])
        return out.getvalue()
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"
