"""Recipe cache: compiled graphs keyed by their graph key, in memory and optionally on disk.

A *recipe* is what the Gaudi graph compiler produces for one graph. Here a recipe is a small
record (op count, simulated compile and device time, free-form JSON metadata); what matters
for the emulator is whether a graph was seen before, because a miss costs a simulated
compile and a hit does not.

Two levels:

* ``RecipeCache``: in-process map from a hashable graph key to a ``Recipe``, counting hits
  and misses. If a ``DiskRecipeCache`` is attached and the caller gives a stable digest of
  the key, a memory miss falls through to the disk level (its snapshot, see the NOTE) and
  every insert is also stored on disk.
* ``DiskRecipeCache``: the ``PT_HPU_RECIPE_CACHE_CONFIG=path,clear_at_start,size_MB``
  directory shared by processes. See NOTE [disk recipe cache protocol].

NOTE [disk recipe cache protocol]:
    * One file per recipe, named ``<sha256 hex of the digest>.recipe``. Content: a fixed
      binary header (magic, format version, payload length, CRC-32 of the payload, the
      32-byte name digest) followed by a UTF-8 JSON payload. Never pickle.
    * Files are written to a temporary name in the same directory and renamed into place
      (``os.replace`` is atomic), so a reader sees a complete file or none.
    * Writers serialise on ``fcntl.flock(LOCK_EX)`` of ``eviction.lock`` in the directory.
      Holding the lock, a writer first evicts the oldest recipes (by mtime, then name) until
      the existing recipes plus the new one fit in 0.99 x size_MB, then writes. The
      directory's recipe bytes therefore never exceed the limit, even transiently, and after
      every store they are at most 0.99 x size_MB. Readers take no lock.
    * Stores and eviction run on one background thread per ``DiskRecipeCache``;
      ``flush()``/``close()`` wait for it with a timeout. ``close()`` also runs at exit.
    * Determinism (the simulated charges of a process never depend on timing): when a
      ``DiskRecipeCache`` is opened it takes a *snapshot* under the lock: every regular,
      valid recipe file in the directory is read, validated and kept in memory. With
      ``clear_at_start`` the directory is cleared under the same lock and the snapshot is
      empty, whatever any other rank does. After opening, the directory is never read for
      an answer: a lookup is a hit exactly for a digest in the snapshot or one this
      process stored itself (answered from its own in-memory copy). A peer's write, a
      peer's eviction or corruption that happens after the snapshot, and this process's
      own background writes, therefore change no answer and no charge. Stores are
      *published* (written, with eviction) only by ``flush()``/``close()`` (and so at
      exit), not as they are made, so a rank cannot see a recipe compiled by a peer of the
      same job just because it opened the cache a little later than that peer; it would
      need the peer to have flushed or exited before it opened. Consequence: the charges
      of a process are a pure function of the script, the config and the directory's
      content when it opened the cache; a second job on the same directory gets disk hits;
      a process killed before its at-exit close publishes nothing.
    * A file that is truncated, has a bad magic/version/CRC, names another digest or holds
      invalid JSON is left out of the snapshot (a miss) with a ``logging`` warning, never
      an exception.
    * Only regular files are recipes. Anything else named ``*.recipe`` (a FIFO, a
      directory, a symlink, a device) is never opened for reading (so a FIFO cannot block),
      never counted in the size and never evicted; it is logged once per cache object.
      ``clear()`` deletes every non-directory ``*.recipe`` entry and skips directories.
    * size_MB is in MiB (1 MB = 1,048,576 bytes) and may be fractional.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import logging
import os
import queue
import stat
import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_VAR",
    "EVICTION_LOCK_NAME",
    "RECIPE_SUFFIX",
    "DiskRecipeCache",
    "Recipe",
    "RecipeCache",
    "RecipeCacheConfig",
    "RecipeCacheStats",
    "RecipeFormatError",
    "decode_recipe",
    "digest_of",
    "encode_recipe",
    "parse_recipe_cache_config",
]

logger = logging.getLogger(__name__)

ENV_VAR = "PT_HPU_RECIPE_CACHE_CONFIG"
EVICTION_LOCK_NAME = "eviction.lock"
RECIPE_SUFFIX = ".recipe"
_TMP_PREFIX = ".tmp-"
_BYTES_PER_MB = 1 << 20
_EVICT_TO_FRACTION = 0.99

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
    """Gaudi's optional RECIPE_CACHE_ON_NFS flag; recorded only (flock is used regardless)."""

    def __post_init__(self) -> None:
        if not str(self.path):
            raise ValueError(f"{ENV_VAR}: the cache path is empty")
        if not isinstance(self.size_mb, (int, float)) or isinstance(self.size_mb, bool) \
                or not 0 < self.size_mb < float("inf"):
            raise ValueError(f"{ENV_VAR}: size_MB must be a number > 0, got {self.size_mb!r}")

    @property
    def size_bytes(self) -> int:
        """The limit in bytes."""
        return int(self.size_mb * _BYTES_PER_MB)


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _parse_bool(text: str, what: str, value: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(
        f"{ENV_VAR}={value!r} is malformed: {what} must be true or false, got {text!r}")


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
        on_nfs = _parse_bool(parts[-1], "recipe_cache_on_nfs", value)
        parts = parts[:-1]
    if len(parts) < 3:
        raise ValueError(
            f"{ENV_VAR}={value!r} is malformed: expected 'path,clear_at_start,size_MB', "
            f"e.g. '/tmp/recipe_cache,false,1024'")
    path = ",".join(parts[:-2]).strip()
    clear_at_start = _parse_bool(parts[-2], "clear_at_start", value)
    size = parts[-1].strip()
    if not _is_number(size):
        raise ValueError(
            f"{ENV_VAR}={value!r} is malformed: size_MB must be a number, got {size!r}")
    size_mb = float(size)
    if not 0 < size_mb < float("inf"):
        raise ValueError(f"{ENV_VAR}={value!r} is malformed: size_MB must be > 0, got {size!r}")
    if not path:
        return None
    return RecipeCacheConfig(path=Path(path), clear_at_start=clear_at_start, size_mb=size_mb,
                             on_nfs=on_nfs)


def digest_of(data: bytes | str) -> bytes:
    """Stable 32-byte digest (SHA-256) of a graph key's canonical bytes or text."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).digest()


def _name_digest(digest: bytes) -> bytes:
    """Normalise a caller's digest of any length to the 32 bytes used for file names."""
    if not isinstance(digest, (bytes, bytearray)) or not digest:
        raise ValueError(f"a recipe digest must be non-empty bytes, got {digest!r}")
    return bytes(digest) if len(digest) == 32 else hashlib.sha256(digest).digest()


def encode_recipe(digest: bytes, recipe: Recipe) -> bytes:
    """Serialise a recipe into the versioned on-disk record (see the module NOTE)."""
    payload = json.dumps(
        {"n_ops": recipe.n_ops, "compile_ns": recipe.compile_ns,
         "device_ns": recipe.device_ns, "meta": dict(recipe.meta)},
        sort_keys=True, separators=(",", ":")).encode("utf-8")
    header = _HEADER.pack(_MAGIC, _FORMAT_VERSION, 0, len(payload),
                          zlib.crc32(payload), _name_digest(digest))
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
    if digest is not None and stored != _name_digest(digest):
        raise RecipeFormatError("record belongs to another digest")
    try:
        obj = json.loads(payload.decode("utf-8"))
        return Recipe(n_ops=obj["n_ops"], compile_ns=obj["compile_ns"],
                      device_ns=obj["device_ns"], meta=obj["meta"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RecipeFormatError(f"bad payload: {exc}") from None


class DiskRecipeCache:
    """The shared on-disk recipe directory of ``PT_HPU_RECIPE_CACHE_CONFIG``.

    Thread-safe; safe across processes sharing the directory (see the module NOTE).

    Answers (:meth:`lookup`) come only from the snapshot taken when the object is created
    and from recipes this object was asked to store, never from the directory as it is
    now, so a process's simulated charges cannot depend on when a peer's write or eviction
    lands. Stores are published to the directory by :meth:`flush`/:meth:`close` (and at
    exit). :meth:`load` reads the directory directly and is for inspection only.
    """

    def __init__(self, config: RecipeCacheConfig) -> None:
        self.config = config
        self.directory = Path(config.path)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.directory / EVICTION_LOCK_NAME
        self._queue: queue.Queue[tuple[bytes, bytes] | None] = queue.Queue()
        self._cond = threading.Condition()
        self._pending = 0
        self._closed = False
        self._unpublished: list[tuple[bytes, bytes]] = []
        self._own: dict[bytes, Recipe] = {}
        self._warned: set[str] = set()
        self.stores = 0
        """Recipes written by this process."""
        self.evictions = 0
        """Recipe files deleted by this process's eviction."""
        self._snapshot: dict[bytes, Recipe] = self._take_snapshot()
        self._thread = threading.Thread(
            target=self._worker, name=f"recipe-cache-writer:{self.directory}", daemon=True)
        self._thread.start()
        atexit.register(self._close_at_exit)

    # -- reading -----------------------------------------------------------------------
    def path_for(self, digest: bytes) -> Path:
        """File that holds (or would hold) the recipe of this digest."""
        return self.directory / (_name_digest(digest).hex() + RECIPE_SUFFIX)

    def lookup(self, digest: bytes) -> Recipe | None:
        """This process's answer for a digest: the snapshot taken at open, or its own stores.

        Never touches the directory, so the answer does not depend on what peers (or this
        process's writer thread) did since the snapshot.
        """
        name = _name_digest(digest)
        recipe = self._snapshot.get(name)
        if recipe is not None:
            return recipe
        with self._cond:
            return self._own.get(name)

    @property
    def snapshot_size(self) -> int:
        """Number of recipes in the snapshot taken when this object was created."""
        return len(self._snapshot)

    def load(self, digest: bytes) -> Recipe | None:
        """Read a recipe from the directory now; ``None`` on absence, corruption or a
        non-regular file (both logged as a warning). For inspection and tests: the simulated
        cost uses :meth:`lookup`."""
        return self._read(self.path_for(digest), _name_digest(digest))

    def directory_bytes(self) -> int:
        """Total size of the (regular) recipe files in the directory, bytes."""
        return sum(size for _, _, size, _ in self._scan())

    # -- writing -----------------------------------------------------------------------
    def store_async(self, digest: bytes, recipe: Recipe) -> None:
        """Remember a recipe for this process and queue it for publishing.

        It becomes an answer of :meth:`lookup` at once; it is written (with the eviction
        before it) on the background thread at the next :meth:`flush`/:meth:`close`. After
        ``close()`` the store runs synchronously on the calling thread instead.
        """
        name = _name_digest(digest)
        data = encode_recipe(digest, recipe)
        with self._cond:
            self._own[name] = recipe
            closed = self._closed
            if not closed:
                self._unpublished.append((name, data))
        if closed:  # after close() (e.g. during interpreter exit): write on this thread
            self._store_locked(name, data)

    def store(self, digest: bytes, recipe: Recipe) -> None:
        """Store and publish synchronously on the calling thread (same protocol as the worker)."""
        name = _name_digest(digest)
        with self._cond:
            self._own[name] = recipe
        self._store_locked(name, encode_recipe(digest, recipe))

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Publish every store made so far and wait until they have been written.

        Returns:
            True if the queue drained, False on timeout (logged as a warning).
        """
        with self._cond:
            batch, self._unpublished = self._unpublished, []
            self._pending += len(batch)
            for item in batch:
                self._queue.put(item)
            done = self._cond.wait_for(lambda: self._pending == 0, timeout=timeout)
        if not done:
            logger.warning("recipe cache: flush timed out after %ss with %d stores pending",
                           timeout, self._pending)
        return done

    def close(self, timeout: float | None = 30.0) -> bool:
        """Flush (publish), then stop the background thread. Idempotent.

        Returns:
            True if everything was written and the thread stopped within the timeout.
        """
        with self._cond:
            if self._closed:
                return not self._thread.is_alive()
            self._closed = True  # from now on store_async writes on the calling thread
        drained = self.flush(timeout)
        self._queue.put(None)
        self._thread.join(timeout)
        atexit.unregister(self._close_at_exit)
        return drained and not self._thread.is_alive()

    def clear(self) -> None:
        """Delete every recipe (and stale temporary file) in the directory.

        Directories named ``*.recipe`` are skipped with a warning; the snapshot of this
        object is not changed.
        """
        with self._locked():
            self._clear_unlocked()

    # -- internals ---------------------------------------------------------------------
    def _warn_once(self, path: str, what: str) -> None:
        if path not in self._warned:
            self._warned.add(path)
            logger.warning("recipe cache: %s is %s, not a regular recipe file; ignoring it",
                           path, what)

    def _clear_unlocked(self) -> None:
        for entry in os.scandir(self.directory):
            if entry.name.endswith(RECIPE_SUFFIX) or entry.name.startswith(_TMP_PREFIX):
                try:
                    if entry.is_dir(follow_symlinks=False):
                        self._warn_once(entry.path, "a directory")
                        continue
                    os.unlink(entry.path)
                except FileNotFoundError:
                    pass

    def _take_snapshot(self) -> dict[bytes, Recipe]:
        """Clear (clear_at_start) or read every valid recipe, holding the writers' lock."""
        snapshot: dict[bytes, Recipe] = {}
        with self._locked():
            if self.config.clear_at_start:
                self._clear_unlocked()
                return snapshot
            for entry in os.scandir(self.directory):
                if not entry.name.endswith(RECIPE_SUFFIX):
                    continue
                try:
                    name = bytes.fromhex(entry.name[:-len(RECIPE_SUFFIX)])
                except ValueError:
                    continue  # not named by a digest: no lookup can ask for it
                if len(name) != 32:
                    continue
                recipe = self._read(Path(entry.path), name)
                if recipe is not None:
                    snapshot[name] = recipe
        return snapshot

    def _read(self, path: Path, name: bytes) -> Recipe | None:
        """Read and validate one recipe file; never blocks on a FIFO, never raises."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP for a symlink, EACCES, ...
            logger.warning("recipe cache: cannot read %s (%s); treating as a miss", path, exc)
            return None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                self._warn_once(str(path), "not a regular file")
                return None
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            data = b"".join(chunks)
        except OSError as exc:
            logger.warning("recipe cache: cannot read %s (%s); treating as a miss", path, exc)
            return None
        finally:
            os.close(fd)
        try:
            return decode_recipe(data, name)
        except RecipeFormatError as exc:
            logger.warning("recipe cache: corrupt recipe file %s (%s); treating as a miss",
                           path, exc)
            return None

    def _close_at_exit(self) -> None:
        self.close(timeout=10.0)

    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            name_digest, data = item
            try:
                self._store_locked(name_digest, data)
            except Exception:  # noqa: BLE001 - a failed store must not kill the worker
                logger.warning("recipe cache: failed to store a recipe in %s",
                               self.directory, exc_info=True)
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def _locked(self) -> _FileLock:
        return _FileLock(self._lock_path)

    def _scan(self) -> list[tuple[int, str, int, str]]:
        """(mtime_ns, name, size, path) of every regular recipe file, oldest first."""
        found = []
        for entry in os.scandir(self.directory):
            if not entry.name.endswith(RECIPE_SUFFIX):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                self._warn_once(entry.path, "not a regular file")
                continue
            found.append((st.st_mtime_ns, entry.name, st.st_size, entry.path))
        found.sort()
        return found

    def _store_locked(self, name_digest: bytes, data: bytes) -> None:
        target = self.directory / (name_digest.hex() + RECIPE_SUFFIX)
        budget = int(self.config.size_bytes * _EVICT_TO_FRACTION)
        if len(data) > budget:
            logger.warning("recipe cache: recipe of %d bytes exceeds 0.99 x size_MB (%d bytes);"
                           " not stored", len(data), budget)
            return
        with self._locked():
            if target.is_dir() and not target.is_symlink():
                self._warn_once(str(target), "a directory")
                return  # cannot replace a directory by a file; this recipe is not stored
            files = [f for f in self._scan() if f[3] != str(target)]
            total = sum(f[2] for f in files)
            for _, _, size, path in files:
                if total + len(data) <= budget:
                    break
                try:
                    os.unlink(path)
                    self.evictions += 1
                except FileNotFoundError:
                    pass
                total -= size
            tmp = self.directory / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
            try:
                with open(tmp, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, target)
            finally:
                if tmp.exists():
                    tmp.unlink()
            self.stores += 1


class _FileLock:
    """Exclusive ``fcntl.flock`` on a lock file, as a context manager."""

    __slots__ = ("_path", "_fd")

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = -1

    def __enter__(self) -> _FileLock:
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self._fd)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = -1


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
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RecipeCache:
        """Build from ``PT_HPU_RECIPE_CACHE_CONFIG`` (memory only if unset or the path is empty).

        Raises:
            ValueError: naming the variable if it is malformed.
        """
        env = os.environ if environ is None else environ
        value = env.get(ENV_VAR, "").strip()
        config = parse_recipe_cache_config(value) if value else None
        return cls() if config is None else cls(disk=DiskRecipeCache(config))

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
        with self._lock:
            recipe = self._entries.get(key)
            if recipe is not None:
                self._hits += 1
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
