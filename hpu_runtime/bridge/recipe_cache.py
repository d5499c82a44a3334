"""The recipe cache: compiled graphs keyed by their graph key, in memory over an optional disk level.

:class:`RecipeCache` is an in-process map from a hashable graph key (NOTE [graph key] in
:mod:`hpu_runtime.bridge.graph_key`) to a :class:`~hpu_runtime.bridge.recipe.Recipe`,
counting hits and misses. If a :class:`~hpu_runtime.bridge.recipe_disk.DiskRecipeCache` is
attached and the caller gives a stable digest of the key, a memory miss falls through to
the disk level (its snapshot, NOTE [disk recipe cache protocol]) and every insert is also
stored on disk.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from .config import RecipeCacheConfig
from .recipe import Recipe
from .recipe_disk import DiskRecipeCache

__all__ = ["Recipe", "RecipeCache", "RecipeCacheStats"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RecipeCacheStats:
    """Counters of one ``RecipeCache``."""

    hits: int
    """Lookups answered from memory or disk."""
    misses: int
    """Lookups that found nothing (the caller compiles)."""
    disk_hits: int
    """The subset of ``hits`` answered from disk."""
    entries: int
    """Recipes held in memory."""


class RecipeCache:
    """In-memory recipe cache with an optional shared disk level.

    A memory miss is answered by ``disk.lookup`` (the disk snapshot taken when the disk
    level was opened, plus this process's own stores), never by the directory's current
    content, so whether a lookup hits, and so whether a compile is charged, is a pure
    function of the lookups and inserts made so far and of the directory's content when
    the disk level was opened (see NOTE [disk recipe cache protocol]).

    Args:
        disk: disk level, or None for memory only.
    """

    def __init__(self, *, disk: DiskRecipeCache | None = None) -> None:
        self.disk = disk
        self._entries: dict[Hashable, Recipe] = {}
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._disk_hits = 0

    @classmethod
    def from_config(cls, config: RecipeCacheConfig | None) -> RecipeCache:
        """A memory cache over a new disk level of ``config`` (memory only if None)."""
        return cls() if config is None else cls(disk=DiskRecipeCache(config))

    def memory_hit(self, key: Hashable) -> Recipe | None:
        """The recipe of a graph key if memory holds it, counted as a hit; None otherwise, with
        nothing counted (the caller goes on to :meth:`lookup`, which counts the miss)."""
        with self._lock:
            recipe = self._entries.get(key)
            if recipe is not None:
                self._hits += 1
            return recipe

    def lookup(self, key: Hashable, *, digest: bytes | Callable[[], bytes] | None = None
               ) -> Recipe | None:
        """Find the recipe of a graph key, counting a hit or a miss.

        Args:
            key: hashable graph key (in-process identity).
            digest: stable bytes digest of the same key, or a function computing it (called
                only on a memory miss); needed to consult the disk level.

        Returns:
            The recipe, or None on a miss.
        """
        recipe = self.memory_hit(key)
        if recipe is not None:
            return recipe
        if self.disk is not None and digest is not None:
            recipe = self.disk.lookup(digest() if callable(digest) else digest)
            if recipe is not None:
                with self._lock:
                    self._entries[key] = recipe
                    self._hits += 1
                    self._disk_hits += 1
                return recipe
        with self._lock:
            self._misses += 1
        return None

    def insert(self, key: Hashable, recipe: Recipe, *,
               digest: bytes | Callable[[], bytes] | None = None) -> None:
        """Remember a freshly compiled recipe; also hand it to the disk level if a digest is
        given (published to the directory at ``flush()``/``close()``/exit)."""
        with self._lock:
            self._entries[key] = recipe
        if self.disk is not None and digest is not None:
            self.disk.store_async(digest() if callable(digest) else digest, recipe)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def hits(self) -> int:
        """Lookups answered from memory or disk."""
        return self._hits

    @property
    def misses(self) -> int:
        """Lookups that found nothing."""
        return self._misses

    def stats(self) -> RecipeCacheStats:
        """Snapshot of the counters."""
        with self._lock:
            return RecipeCacheStats(hits=self._hits, misses=self._misses,
                                    disk_hits=self._disk_hits, entries=len(self._entries))

    def reset_stats(self) -> None:
        """Zero the hit/miss counters (entries are kept)."""
        with self._lock:
            self._hits = self._misses = self._disk_hits = 0

    def clear(self) -> None:
        """Forget the in-memory entries (the disk level is untouched)."""
        with self._lock:
            self._entries.clear()

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Publish the disk stores made so far and wait for them; True if none is pending
        (always True without disk)."""
        return True if self.disk is None else self.disk.flush(timeout)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Flush and stop the disk writer thread; True on a clean stop."""
        return True if self.disk is None else self.disk.close(timeout)
