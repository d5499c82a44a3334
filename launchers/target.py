"""What a launcher runs in each rank: a module (``-m``) or a script path, with its argv.

Shared by ``launchers.mpi`` and ``launchers.ray``; the command-line shape is torchrun's
(``[-m] TARGET [ARGS...]``), so the same words that follow ``torchrun`` follow a launcher.
"""

from __future__ import annotations

import argparse
import importlib
import runpy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_ENTRY_POINTS",
    "Target",
    "add_target_arguments",
    "default_entry_point",
    "exit_code",
    "load_entry_point",
    "target_from_args",
]

DEFAULT_ENTRY_POINTS: dict[str, str] = {"models.train": "models.train:main"}
"""Modules with a Python API ``main(argv) -> dict``: Ray calls it and gathers the dict."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """A program to run in every rank."""

    name: str
    """Module name (with ``is_module``) or path of a Python script."""
    is_module: bool
    """Run ``name`` as ``python -m name`` rather than as a script path."""
    argv: tuple[str, ...] = field(default_factory=tuple)
    """Arguments after the target, as the program sees them in ``sys.argv[1:]``."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("no target: give a script path or -m MODULE")

    def describe(self) -> str:
        """The target as it would be typed after ``python``."""
        head = f"-m {self.name}" if self.is_module else self.name
        return " ".join([head, *self.argv])

    def run_main(self) -> None:
        """Runs the target in this process as ``__main__`` (like ``python [-m] target``).

        ``sys.argv`` is set for the duration and restored after. A script's directory is
        put first on ``sys.path`` as ``python script.py`` would.

        Raises:
            SystemExit: Whatever the target raises, including ``sys.exit(code)``.
            Exception: Whatever the target raises.
        """
        saved_argv, saved_path = sys.argv[:], sys.path[:]
        try:
            if self.is_module:
                sys.argv = [self.name, *self.argv]
                runpy.run_module(self.name, run_name="__main__", alter_sys=True)
            else:
                sys.argv = [self.name, *self.argv]
                runpy.run_path(self.name, run_name="__main__")
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path


def load_entry_point(spec: str) -> Callable[[list[str]], Any]:
    """Imports ``"package.module:function"`` and returns the function.

    Raises:
        ValueError: ``spec`` is not of the form ``module:function``.
        ImportError, AttributeError: The module or function does not exist.
    """
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"entry point {spec!r} is not of the form module:function")
    return getattr(importlib.import_module(module_name), func_name)


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds torchrun's ``[-m] TARGET [ARGS...]`` arguments to a launcher's parser."""
    parser.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="run TARGET as a module (python -m TARGET), e.g. -m models.train",
    )
    parser.add_argument("target", help="script path, or module name with -m")
    parser.add_argument(
        "target_args", nargs=argparse.REMAINDER, help="arguments passed to the target"
    )


def target_from_args(args: argparse.Namespace) -> Target:
    """Builds the :class:`Target` from arguments added by :func:`add_target_arguments`."""
    return Target(name=args.target, is_module=args.module, argv=tuple(args.target_args))


def exit_code(exc: SystemExit) -> int:
    """Maps ``SystemExit.code`` to a process exit code, as the interpreter does."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def default_entry_point(target: Target) -> str | None:
    """The ``main(argv) -> dict`` entry point known for ``target``, or ``None``."""
    return DEFAULT_ENTRY_POINTS.get(target.name) if target.is_module else None
