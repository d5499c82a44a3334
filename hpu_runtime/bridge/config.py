"""The environment of the simulated Gaudi, read once into one validated, frozen dataclass.

:meth:`RuntimeConfig.from_env` is the only place ``hpu_runtime`` reads its environment
variables (the process's device is created from it, and again at ``reset_device``); every
malformed value is a ``ValueError`` that names the variable. Two variables are read
elsewhere, on purpose: ``HPU_EMULATOR_HABANA_FRAMEWORKS`` by :mod:`hpu_runtime.import_hooks`
(a start-up hook that must import only the standard library and reads it at each lookup),
and ``PT_HPU_ENABLE_LAZY_COLLECTIVES`` by ``hccl``, which owns collectives. One is read at each
call: ``HABANA_VISIBLE_MODULES`` (:func:`visible_modules`), which a launcher such as Ray sets
in a worker after the device may exist.

:class:`RecipeCacheConfig` is the value of ``PT_HPU_RECIPE_CACHE_CONFIG``
(:func:`parse_recipe_cache_config`), the configuration of
:class:`~hpu_runtime.bridge.recipe_disk.DiskRecipeCache`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..device.spec import DeviceSpec, get_device_spec
from .fallback import FallbackPolicy

logger = logging.getLogger(__name__)

__all__ = ["CARDS_PER_BOX", "MAX_EAGER_RECIPES", "MAX_LAZY_RECIPES", "MIN_RECIPES", "RECIPE_CACHE_ENV",
           "RecipeCacheConfig", "RuntimeConfig", "default_max_recipes", "parse_recipe_cache_config",
           "visible_modules"]

MAX_LAZY_RECIPES = 30_000
"""Recipes Gaudi's bridge keeps in memory in lazy mode (NOTE [the recipe cache's LRU] in
:mod:`hpu_runtime.bridge.recipe_cache`)."""
MAX_EAGER_RECIPES = 100_000
"""Recipes it keeps in eager and torch.compile mode (same note)."""
MIN_RECIPES = 3
"""The least ``HABANA_PGM_LRU_MAX`` can make it keep (same note)."""


def default_max_recipes(lazy: bool) -> int:
    """The recipes an in-memory cache keeps when ``HABANA_PGM_LRU_MAX`` is unset: lazy mode's
    bound, or eager and torch.compile mode's."""
    return MAX_LAZY_RECIPES if lazy else MAX_EAGER_RECIPES

CARDS_PER_BOX = 8
"""Gaudi devices in one server, what ``torch.hpu.device_count()`` counts there (SynapseAI's
``synDeviceGetCount``): 8 in an HLS-1, HLS-Gaudi2 or HLS-3 box and an AWS DL1 instance (Intel
Gaudi docs, "Intel Gaudi Network Configuration": eight cards per HLS box; AWS DL1 instance
page: eight Gaudi accelerators). Equal to ``launchers.hl_smi.CARDS_PER_BOX``, which ``hl-smi``
lists and which cannot import this (it imports no torch)."""

RECIPE_CACHE_ENV = "PT_HPU_RECIPE_CACHE_CONFIG"
_BYTES_PER_MB = 1 << 20

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _parse_bool(text: str, error: str) -> bool:
    """``text`` as a yes/no word (1/0, true/false, yes/no, on/off); else ValueError(error)."""
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(error)


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    return _parse_bool(raw, f"{name}={raw!r} must be 0 or 1 (or true/false)")


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _card_of_topology(env: Mapping[str, str]) -> str:
    """The default ``HPU_DEVICE_SPEC``: the generation of the server ``HCCL_TOPOLOGY`` names
    (an ``hls3`` system has Gaudi 3 cards: :func:`get_device_spec` knows the built-in
    topologies' names), else ``gaudi2``. A topology file's cards are not read here (the bridge
    does not import hccl): a group on a file whose boxes hold other cards says to set
    ``HPU_DEVICE_SPEC``."""
    try:
        return get_device_spec(env.get("HCCL_TOPOLOGY", "")).name
    except ValueError:
        return "gaudi2"


@dataclass(frozen=True, kw_only=True, slots=True)
class RecipeCacheConfig:
    """Parsed ``PT_HPU_RECIPE_CACHE_CONFIG``."""

    path: Path
    """Cache directory (created if missing)."""
    clear_at_start: bool
    """Delete existing recipes when the cache is opened."""
    size_mb: float
    """Directory size limit in MiB (> 0)."""
    on_nfs: bool = False
    """Gaudi's optional RECIPE_CACHE_ON_NFS flag; recorded only (the same file lock is used regardless)."""

    def __post_init__(self) -> None:
        if not str(self.path):
            raise ValueError(f"{RECIPE_CACHE_ENV}: the cache path is empty")
        if not isinstance(self.size_mb, (int, float)) or isinstance(self.size_mb, bool) \
                or not 0 < self.size_mb < float("inf"):
            raise ValueError(f"{RECIPE_CACHE_ENV}: size_MB must be a number > 0, got {self.size_mb!r}")

    @property
    def size_bytes(self) -> int:
        """The limit in bytes."""
        return int(self.size_mb * _BYTES_PER_MB)


def _field_bool(text: str, what: str, value: str) -> bool:
    return _parse_bool(text, f"{RECIPE_CACHE_ENV}={value!r} is malformed: {what} must be true or false, got {text!r}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_recipe_cache_config(value: str) -> RecipeCacheConfig | None:
    """Parse the Gaudi ``PT_HPU_RECIPE_CACHE_CONFIG`` value.

    Format: ``path,clear_at_start,size_MB`` with an optional fourth field
    ``recipe_cache_on_nfs`` (true/false, accepted and recorded, not otherwise used), as in
    the Gaudi "Runtime Environment Variables" page. The path may contain commas; the
    trailing fields are split off from the right. An empty path means disk caching is
    disabled (recent Gaudi releases default to ``,false,1024,false``).

    Args:
        value: e.g. ``"/tmp/recipes,false,1024"``.

    Returns:
        The config, or None if the path is empty.

    Raises:
        ValueError: naming ``PT_HPU_RECIPE_CACHE_CONFIG`` if the value is malformed.
    """
    parts = value.split(",")
    on_nfs = False
    if (len(parts) >= 4 and parts[-1].strip().lower() in _TRUE | _FALSE
            and _is_number(parts[-2].strip())):
        on_nfs = _field_bool(parts[-1], "recipe_cache_on_nfs", value)
        parts = parts[:-1]
    if len(parts) < 3:
        raise ValueError(
            f"{RECIPE_CACHE_ENV}={value!r} is malformed: expected 'path,clear_at_start,size_MB', "
            f"e.g. '/tmp/recipe_cache,false,1024'")
    path = ",".join(parts[:-2]).strip()
    clear_at_start = _field_bool(parts[-2], "clear_at_start", value)
    size = parts[-1].strip()
    if not _is_number(size):
        raise ValueError(
            f"{RECIPE_CACHE_ENV}={value!r} is malformed: size_MB must be a number, got {size!r}")
    size_mb = float(size)
    if not 0 < size_mb < float("inf"):
        raise ValueError(f"{RECIPE_CACHE_ENV}={value!r} is malformed: size_MB must be > 0, got {size!r}")
    if not path:
        return None
    return RecipeCacheConfig(path=Path(path), clear_at_start=clear_at_start, size_mb=size_mb,
                             on_nfs=on_nfs)


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeConfig:
    """What ``hpu_runtime`` takes from the environment (Gaudi's variable names).

    Raises:
        ValueError: from ``__post_init__`` (or :meth:`from_env`), naming the variable whose
            value is out of range or malformed.
    """

    lazy: bool = True
    """``PT_HPU_LAZY_MODE``: 1 (default) accumulates ops into graphs; 0 is eager, and so is
    2, which SynapseAI 1.x scripts set for eager mode."""
    max_compound_ops: int = 0
    """``PT_HPU_MAX_COMPOUND_OP_SIZE``: launch the pending graph at this many ops (0 = no limit)."""
    device_spec: str = "gaudi2"
    """``HPU_DEVICE_SPEC``: the simulated generation (``gaudi``, ``gaudi2``, ``gaudi3``, or a
    server name such as ``hls2``); unset, the generation of the built-in server ``HCCL_TOPOLOGY``
    names, else ``gaudi2``."""
    recipe_cache: RecipeCacheConfig | None = None
    """``PT_HPU_RECIPE_CACHE_CONFIG=path,clear_at_start,size_MB``: the disk recipe cache
    (None: memory only, also for an empty path)."""
    place_on_cpu: frozenset[str] = frozenset()
    """``PT_HPU_PLACE_ON_CPU``: comma-separated ops to run as CPU fallback (``aten::`` optional)."""
    log_fallback: bool = False
    """Print each CPU fallback: ``LOG_LEVEL_PT_FALLBACK`` at 0 or 1 (Gaudi's levels 0-6,
    0 most verbose) and ``ENABLE_CONSOLE`` true."""
    autocast_fp32_on_host: bool = False
    """``PT_HPU_AUTOCAST_FP32_ON_HOST``: ``autocast("hpu")`` regions compute in fp32 on the
    host and are charged as bf16 (NOTE [fp32 on the host, bf16 on the device])."""
    autocast_lower_precision_ops_list: str | None = None
    """``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST``: a file naming, one per line, the ops autocast
    runs in bf16/fp16 (NOTE [Gaudi's autocast op lists] in :mod:`hpu_runtime.bridge.autocast`)."""
    autocast_fp32_ops_list: str | None = None
    """``PT_HPU_AUTOCAST_FP32_OPS_LIST``: a file naming the ops autocast runs in fp32 (same note)."""
    gpu_migration: bool = False
    """``PT_HPU_GPU_MIGRATION``: Intel's GPU Migration Toolkit (:mod:`hpu_runtime.api.gpu_migration`)."""
    gpu_migration_fp16_to_bf16: bool = False
    """``PT_HPU_CONVERT_FP16_TO_BF16_FOR_MIGRATION``: the toolkit runs float16 autocast regions in
    bfloat16 (HabanaAI/Model-References ``PyTorch/examples/gpu_migration/computer_vision/
    classification/torchvision/README.md``; default off: float16 stays float16)."""
    gpu_migration_log_dir: str | None = None
    """Where the toolkit logs its conversions: ``$HABANA_LOGS/gpu_migration_logs`` (``HABANA_LOGS``
    defaulting to ``~/.habana_logs``) when ``GPU_MIGRATION_LOG_LEVEL`` is set and not 0; None: no log."""
    recipe_lru_max: int | None = None
    """``HABANA_PGM_LRU_MAX``: recipes the in-memory recipe cache keeps (at least :data:`MIN_RECIPES`,
    as the bridge raises a smaller number); None: the bridge's bound for the mode (NOTE [the recipe cache's
    LRU] in :mod:`hpu_runtime.bridge.recipe_cache`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_compound_ops, int) or isinstance(self.max_compound_ops, bool) \
                or self.max_compound_ops < 0:
            raise ValueError(f"PT_HPU_MAX_COMPOUND_OP_SIZE={self.max_compound_ops!r} must be an integer >= 0")
        try:
            get_device_spec(self.device_spec)
        except ValueError as exc:
            raise ValueError(f"HPU_DEVICE_SPEC={self.device_spec!r}: {exc}") from None
        if self.recipe_cache is not None and not isinstance(self.recipe_cache, RecipeCacheConfig):
            raise ValueError(f"{RECIPE_CACHE_ENV}: expected a RecipeCacheConfig, got {self.recipe_cache!r}")
        if self.recipe_lru_max is not None and (not isinstance(self.recipe_lru_max, int)
                                                or isinstance(self.recipe_lru_max, bool)
                                                or self.recipe_lru_max < MIN_RECIPES):
            raise ValueError(f"HABANA_PGM_LRU_MAX={self.recipe_lru_max!r} must be an integer >= {MIN_RECIPES}")
        if any(not isinstance(n, str) or not n or "::" in n for n in self.place_on_cpu):
            raise ValueError(f"PT_HPU_PLACE_ON_CPU: op names must be short names such as 'digamma', "
                             f"got {sorted(self.place_on_cpu)!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RuntimeConfig:
        """Read and validate every variable (``os.environ`` by default; unset = default).

        Raises:
            ValueError: naming the first malformed variable.
        """
        env = os.environ if environ is None else environ
        mode = _int(env, "PT_HPU_LAZY_MODE", 1)
        if mode not in (0, 1, 2):
            raise ValueError(f"PT_HPU_LAZY_MODE={mode} must be 0 or 1 (2: eager, as SynapseAI 1.x scripts set it)")
        recipe_value = env.get(RECIPE_CACHE_ENV, "").strip()
        names = {n.strip().split("::", 1)[-1] for n in env.get("PT_HPU_PLACE_ON_CPU", "").split(",")}
        migration_log = _int(env, "GPU_MIGRATION_LOG_LEVEL", 0)
        if migration_log < 0:
            raise ValueError(f"GPU_MIGRATION_LOG_LEVEL={migration_log} must be 0 (no log) or more")
        logs = env.get("HABANA_LOGS", "").strip() or os.path.join(os.path.expanduser("~"), ".habana_logs")
        lru_max = _int(env, "HABANA_PGM_LRU_MAX", 0) if env.get("HABANA_PGM_LRU_MAX", "").strip() else None
        if lru_max is not None and lru_max < MIN_RECIPES:  # as RecipeCacheLRU's constructor does
            logger.warning("HABANA_PGM_LRU_MAX=%d: the recipe cache keeps at least %d recipes; using %d", lru_max,
                           MIN_RECIPES, MIN_RECIPES)
            lru_max = MIN_RECIPES
        level = _int(env, "LOG_LEVEL_PT_FALLBACK", 6)
        if not 0 <= level <= 6:
            raise ValueError(f"LOG_LEVEL_PT_FALLBACK={level} must be a Gaudi log level, 0 to 6")
        return cls(
            lazy=mode == 1,
            max_compound_ops=_int(env, "PT_HPU_MAX_COMPOUND_OP_SIZE", 0),
            device_spec=env.get("HPU_DEVICE_SPEC", "").strip() or _card_of_topology(env),
            recipe_cache=parse_recipe_cache_config(recipe_value) if recipe_value else None,
            place_on_cpu=frozenset(n for n in names if n),
            log_fallback=level <= 1 and _bool(env, "ENABLE_CONSOLE", False),
            autocast_fp32_on_host=_bool(env, "PT_HPU_AUTOCAST_FP32_ON_HOST", False),
            autocast_lower_precision_ops_list=env.get("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "").strip() or None,
            autocast_fp32_ops_list=env.get("PT_HPU_AUTOCAST_FP32_OPS_LIST", "").strip() or None,
            gpu_migration=_bool(env, "PT_HPU_GPU_MIGRATION", False),
            gpu_migration_fp16_to_bf16=_bool(env, "PT_HPU_CONVERT_FP16_TO_BF16_FOR_MIGRATION", False),
            gpu_migration_log_dir=os.path.join(logs, "gpu_migration_logs") if migration_log else None,
            recipe_lru_max=lru_max,
        )

    @property
    def spec(self) -> DeviceSpec:
        """The :class:`~hpu_runtime.device.spec.DeviceSpec` named by ``device_spec``."""
        return get_device_spec(self.device_spec)

    @property
    def max_recipes(self) -> int:
        """Recipes the in-memory recipe cache keeps: ``HABANA_PGM_LRU_MAX``, else the bridge's
        bound for the mode (30,000 in lazy mode, 100,000 in eager and torch.compile mode)."""
        return self.recipe_lru_max if self.recipe_lru_max is not None else default_max_recipes(self.lazy)

    @property
    def fallback(self) -> FallbackPolicy:
        """The CPU-fallback policy of ``place_on_cpu`` and ``log_fallback``."""
        return FallbackPolicy(place_on_cpu=self.place_on_cpu, log=self.log_fallback)


VISIBLE_MODULES_ENV = "HABANA_VISIBLE_MODULES"


def visible_modules(environ: Mapping[str, str] | None = None) -> tuple[int, ...] | None:
    """The Gaudi module ids ``HABANA_VISIBLE_MODULES`` lists (comma separated, e.g. ``"0,1"``;
    Ray sets one per worker), or None when it is unset or empty. Read at each call.

    Ids are not limited to a server's 0-7: a Ray node may declare more simulated cards (a local
    Ray of 16 workers hands out ids 0-15).

    Raises:
        ValueError: naming the variable, for an entry that is not a non-negative integer, or a
            repeated one.
    """
    env = os.environ if environ is None else environ
    raw = env.get(VISIBLE_MODULES_ENV, "").strip()
    if not raw:
        return None
    ids = []
    for part in raw.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) in ids:
            raise ValueError(f"{VISIBLE_MODULES_ENV}={raw!r}: expected distinct module ids (integers >= 0), "
                             f"comma separated, got {part!r}")
        ids.append(int(part))
    return tuple(ids)
