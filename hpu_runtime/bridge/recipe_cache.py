"""The recipe cache: compiled graphs keyed by their graph key, in memory over an optional disk level.

:class:`RecipeCache` is an in-process map from a hashable graph key (NOTE [graph key] in
:mod:`hpu_runtime.bridge.graph_key`) to a :class:`~hpu_runtime.bridge.recipe.Recipe`,
counting hits and misses. If a :class:`~hpu_runtime.bridge.recipe_disk.DiskRecipeCache` is
attached and the caller gives a stable digest of the key, a memory miss falls through to
the disk level (its snapshot, NOTE [disk recipe cache protocol]) and every insert is also
stored on disk.

NOTE [the recipe cache's LRU]
Gaudi's bridge keeps its in-memory recipes in an LRU of at most 30,000 recipes in lazy mode and
100,000 in eager and torch.compile mode, a number ``HABANA_PGM_LRU_MAX`` replaces (raised to 3
if smaller); inserting into a full cache first drops the least recently used recipe, and a hit
makes a recipe the most recently used (HabanaAI/gaudi-pytorch-bridge,
``backend/kernel/hpu_recipe_cache.h``: ``PGM_LRU_MAX_LAZY_NRECIPES``,
``PGM_LRU_MAX_EAGER_NRECIPES``, ``PGM_LRU_MIN_NRECIPES``; ``backend/kernel/hpu_recipe_cache.cpp``:
``RecipeCacheLRU::insert``, ``get``, the constructor). :class:`RecipeCache` does the same, so a
dropped recipe that is needed again is a miss, compiled and charged again, as on Gaudi. The
bound matters in eager mode, where a Python number the eager bridge hashes into an op's key
(NOTE [scalars as graph inputs] in :mod:`hpu_runtime.bridge.graph_key`) makes a new recipe
whenever it changes: a learning rate scheduled every step reaches torch's SGD as ``add_``'s
``alpha`` and its Adam as the step size in ``addcdiv_``'s ``value``. The README's digits MLP with
SGD and a per-step cosine schedule compiled 10,032 recipes in 2,000 eager steps (3 in lazy mode,
where those numbers are graph inputs), so an unbounded cache would grow for the whole run.
Not modelled: the bridge also drops recipes while the host's memory is above a threshold
(``PT_HPU_HOST_MEMORY_THRESHOLD_PERCENT``, 90%), and never drops a recipe in use.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from .config import MAX_EAGER_RECIPES, MAX_LAZY_RECIPES, MIN_RECIPES, RecipeCacheConfig, default_max_recipes
from .recipe import Recipe
from .recipe_disk import DiskRecipeCache

__all__ = ["MAX_EAGER_RECIPES", "MAX_LAZY_RECIPES", "MIN_RECIPES", "Recipe", "RecipeCache", "RecipeCacheStats",
           "default_max_recipes"]


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
    evictions: int = 0
    """Recipes dropped from memory to make room (NOTE [the recipe cache's LRU])."""


class RecipeCache:
    """In-memory recipe cache with an optional shared disk level.

    A memory miss is answered by ``disk.lookup`` (the disk snapshot taken when the disk
    level was opened, plus this process's own stores), never by the directory's current
    content, so whether a lookup hits, and so whether a compile is charged, is a pure
    function of the lookups and inserts made so far and of the directory's content when
    the disk level was opened (see NOTE [disk recipe cache protocol]).

    Args:
        disk: disk level, or None for memory only.
        max_recipes: recipes kept in memory, the least recently used dropped first (NOTE [the
            recipe cache's LRU]); default lazy mode's bound.

    Raises:
        ValueError: ``max_recipes`` not an integer of at least :data:`MIN_RECIPES`.
    """

    def __init__(self, *, disk: DiskRecipeCache | None = None, max_recipes: int = MAX_LAZY_RECIPES) -> None:
        if not isinstance(max_recipes, int) or isinstance(max_recipes, bool) or max_recipes < MIN_RECIPES:
            raise ValueError(f"RecipeCache: max_recipes must be an integer >= {MIN_RECIPES}, got {max_recipes!r}")
        self.disk = disk
        self.max_recipes = max_recipes
        self._entries: OrderedDict[Hashable, Recipe] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._disk_hits = 0
        self._evictions = 0

    @classmethod
    def from_config(cls, config: RecipeCacheConfig | None, *, max_recipes: int = MAX_LAZY_RECIPES) -> RecipeCache:
        """A memory cache of ``max_recipes`` over a new disk level of ``config`` (memory only if None)."""
        return cls(max_recipes=max_recipes) if config is None else cls(disk=DiskRecipeCache(config),
                                                                       max_recipes=max_recipes)

    def memory_hit(self, key: Hashable) -> Recipe | None:
        """The recipe of a graph key if memory holds it, counted as a hit and made the most
        recently used; None otherwise, with nothing counted (the caller goes on to
        :meth:`lookup`, which counts the miss). The hpu kernel has a twin of this method for a
        cache of this exact class (``recipe_memory_hit`` in ``csrc/hpu_device.cpp``: the same
        reads and counts under ``_lock``, taken without waiting): a change here goes there too."""
        with self._lock:
            recipe = self._entries.get(key)
            if recipe is not None:
                self._hits += 1
                self._entries.move_to_end(key)
            return recipe

    def _keep(self, key: Hashable, recipe: Recipe) -> None:
        """Hold ``recipe`` as the most recently used, dropping the least recently used ones
        while memory is full (NOTE [the recipe cache's LRU]); the caller holds the lock."""
        entries = self._entries
        if key in entries:
            entries.move_to_end(key)
        else:
            while len(entries) >= self.max_recipes:
                entries.popitem(last=False)
                self._evictions += 1
        entries[key] = recipe

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
                    self._keep(key, recipe)
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
            self._keep(key, recipe)
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
            return RecipeCacheStats(hits=self._hits, misses=self._misses, disk_hits=self._disk_hits,
                                    entries=len(self._entries), evictions=self._evictions)

    def reset_stats(self) -> None:
        """Zero the hit/miss/eviction counters (entries are kept)."""
        with self._lock:
            self._hits = self._misses = self._disk_hits = self._evictions = 0

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
