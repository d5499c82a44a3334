"""A recipe (one compiled graph, as far as the simulation needs it) and its on-disk record.

A *recipe* is what the Gaudi graph compiler produces for one graph. Here a recipe is a small
record (op count, simulated compile and device time, free-form JSON metadata); what matters
for the emulator is whether a graph was seen before, because a miss costs a simulated
compile and a hit does not. The caches are :mod:`hpu_runtime.bridge.recipe_cache` (memory)
and :mod:`hpu_runtime.bridge.recipe_disk` (the shared directory).

NOTE [recipe record]
One file per recipe, named ``<sha256 hex of the digest>.recipe``. Content: a fixed binary
header (magic, format version, payload length, CRC-32 of the payload, the 32-byte name
digest) followed by a UTF-8 JSON payload. Never pickle. :func:`decode_recipe` rejects a
truncated record, a bad magic, version or CRC, a record of another digest and invalid JSON
with :class:`RecipeFormatError`.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RECIPE_SUFFIX", "Recipe", "RecipeFormatError", "decode_recipe", "digest_of", "encode_recipe",
           "name_digest"]

RECIPE_SUFFIX = ".recipe"
"""File name suffix of a recipe record."""

_MAGIC = b"HPURCPE\x00"
_FORMAT_VERSION = 1
# magic (8s), version (H), reserved (H), payload length (I), crc32 (I), digest (32s)
_HEADER = struct.Struct("<8sHHII32s")


class RecipeFormatError(ValueError):
    """A recipe file's bytes are not a valid recipe record."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    """One compiled graph, as far as the simulation needs it.

    Not hashable in general (``meta`` is a dict); compare with ``==``.
    """

    n_ops: int
    """Number of ops in the graph."""
    compile_ns: int = 0
    """Simulated compile time charged when this recipe was built, ns."""
    device_ns: int = 0
    """Simulated device time of one launch, ns (0 if the caller does not store it)."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """JSON-serialisable extra data (e.g. op names); must survive ``json`` round trip."""

    def __post_init__(self) -> None:
        for name in ("n_ops", "compile_ns", "device_ns"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Recipe.{name} must be an int >= 0, got {value!r}")
        if not isinstance(self.meta, Mapping):
            raise ValueError(f"Recipe.meta must be a mapping, got {type(self.meta).__name__}")


def digest_of(data: bytes | str) -> bytes:
    """Stable 32-byte digest (SHA-256) of a graph key's canonical bytes or text."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).digest()


def name_digest(digest: bytes) -> bytes:
    """Normalise a caller's digest of any length to the 32 bytes used for file names."""
    if not isinstance(digest, (bytes, bytearray)) or not digest:
        raise ValueError(f"a recipe digest must be non-empty bytes, got {digest!r}")
    return bytes(digest) if len(digest) == 32 else hashlib.sha256(digest).digest()


def encode_recipe(digest: bytes, recipe: Recipe) -> bytes:
    """Serialise a recipe into the versioned on-disk record (NOTE [recipe record])."""
    payload = json.dumps(
        {"n_ops": recipe.n_ops, "compile_ns": recipe.compile_ns,
         "device_ns": recipe.device_ns, "meta": dict(recipe.meta)},
        sort_keys=True, separators=(",", ":")).encode("utf-8")
    header = _HEADER.pack(_MAGIC, _FORMAT_VERSION, 0, len(payload),
                          zlib.crc32(payload), name_digest(digest))
    return header + payload


def decode_recipe(data: bytes, digest: bytes | None = None) -> Recipe:
    """Parse an on-disk record.

    Args:
        data: the file's bytes.
        digest: if given, the record must have been written for this digest.

    Raises:
        RecipeFormatError: truncated, wrong magic/version, bad CRC, wrong digest, bad JSON.
    """
    if len(data) < _HEADER.size:
        raise RecipeFormatError(f"truncated header: {len(data)} < {_HEADER.size} bytes")
    magic, version, _, length, crc, stored = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise RecipeFormatError("bad magic")
    if version != _FORMAT_VERSION:
        raise RecipeFormatError(f"unsupported format version {version}")
    payload = data[_HEADER.size:]
    if len(payload) != length:
        raise RecipeFormatError(f"payload is {len(payload)} bytes, header says {length}")
    if zlib.crc32(payload) != crc:
        raise RecipeFormatError("CRC mismatch")
    if digest is not None and stored != name_digest(digest):
        raise RecipeFormatError("record belongs to another digest")
    try:
        obj = json.loads(payload.decode("utf-8"))
        return Recipe(n_ops=obj["n_ops"], compile_ns=obj["compile_ns"],
                      device_ns=obj["device_ns"], meta=obj["meta"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RecipeFormatError(f"bad payload: {exc}") from None
