"""Argument parsers the study commands share (numbers, lists, booleans, the model flags)."""

from __future__ import annotations

import argparse
import os

from hpu_runtime.cli_args import count, real

__all__ = ["size", "ranks", "pixels", "mb", "env_mode", "env_flag", "add_model_args", "add_fabric_arg", "list_of",
           "boolean", "first_mb"]


size = count(1, 1 << 20)
"""A per-card batch or a sequence length."""
ranks = count(1, 1 << 24, "ranks")
"""A world size."""
pixels = count(8, 8192, "pixels")
"""Pixels per side of an image."""
mb = real(0.0, 1e6, "MB", lo_open=True)
"""A size in MiB (``bucket_cap_mb``)."""


def env_mode() -> str:
    raw = os.environ.get("PT_HPU_LAZY_MODE", "1").strip() or "1"
    if raw not in ("0", "1"):
        raise SystemExit(f"PT_HPU_LAZY_MODE={raw!r} must be 0 or 1")
    return "lazy" if raw == "1" else "eager"


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def add_model_args(p: argparse.ArgumentParser, *, batch_required: bool = True) -> None:
    """The model flags every study command shares."""
    p.add_argument("--model", required=True,
                   help="registered name (name:flavour for a flavour) or package.module:factory")
    p.add_argument("--batch-size", type=size, required=batch_required, default=None, help="per-card batch")
    p.add_argument("--seq-len", type=size, default=None, help="tokens per sample (text models)")
    p.add_argument("--image-size", type=pixels, default=None, help="pixels per side (image models)")


def list_of(kind, name: str):
    def parse(text: str) -> tuple:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{name}: empty list")
        return tuple(kind(t) for t in items)
    return parse


def boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def first_mb(text: str) -> float | None:
    return None if text.strip().lower() in ("default", "none") else mb(text)


def add_fabric_arg(p: argparse.ArgumentParser) -> None:
    """``--fabric topology|ideal``: the topology file's scale-out fabric or an ideal one."""
    p.add_argument("--fabric", default="topology", choices=["topology", "ideal"],
                   help="the topology file's scale-out fabric (ECMP contention) or an ideal one")
