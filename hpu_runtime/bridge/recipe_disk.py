"""The disk recipe cache: the ``PT_HPU_RECIPE_CACHE_CONFIG`` directory shared by processes.

NOTE [disk recipe cache protocol]:
    * One file per recipe (NOTE [recipe record] in :mod:`hpu_runtime.bridge.recipe`).
    * Files are written to a temporary name in the same directory and renamed into place
      (``os.replace`` is atomic), so a reader sees a complete file or none.
    * Writers serialise on an exclusive lock of ``eviction.lock`` in the directory
      (``filelock.FileLock``: ``flock`` on Unix, so a dead holder's lock is released by the
      kernel). Holding the lock, a writer first evicts the oldest recipes (by mtime, then
      name) until the existing recipes plus the new one fit in 0.99 x size_MB, then writes.
      The directory's recipe bytes therefore never exceed the limit, even transiently, and
      after every store they are at most 0.99 x size_MB. Readers take no lock.
    * Stores and eviction run on one background writer thread per ``DiskRecipeCache`` (a
      one-worker ``concurrent.futures.ThreadPoolExecutor``); ``flush()``/``close()`` wait
      for it with a timeout. ``close()`` also runs at exit (the executor is shut down by
      then, so the last stores are written on the exiting thread).
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

import concurrent.futures
import logging
import multiprocessing.util
import os
import stat
import threading
import uuid
from pathlib import Path

from filelock import FileLock

from .config import RecipeCacheConfig
from .recipe import RECIPE_SUFFIX, Recipe, RecipeFormatError, decode_recipe, encode_recipe, name_digest

__all__ = ["EVICTION_LOCK_NAME", "WRITER_THREAD_PREFIX", "DiskRecipeCache"]

logger = logging.getLogger(__name__)

EVICTION_LOCK_NAME = "eviction.lock"
"""The writers' lock file in the cache directory."""
WRITER_THREAD_PREFIX = "recipe-cache-writer"
"""Name prefix of the writer threads (``<prefix>:<directory>_<n>``)."""
_TMP_PREFIX = ".tmp-"
_EVICT_TO_FRACTION = 0.99
_LOCK_POLL_S = 0.005  # filelock retries a held lock at this interval (it never busy-waits)


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
        self._lock = FileLock(self.directory / EVICTION_LOCK_NAME, poll_interval=_LOCK_POLL_S)
        self._state = threading.Lock()  # guards the fields below
        self._closed = False
        self._unpublished: list[tuple[bytes, bytes]] = []
        self._inflight: set[concurrent.futures.Future] = set()
        self._own: dict[bytes, Recipe] = {}
        self._warned: set[str] = set()
        self.stores = 0
        """Recipes written by this process."""
        self.evictions = 0
        """Recipe files deleted by this process's eviction."""
        self._snapshot: dict[bytes, Recipe] = self._take_snapshot()
        self._writer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{WRITER_THREAD_PREFIX}:{self.directory}")
        # NOTE [flush at exit]: multiprocessing's exit hook, not atexit: it runs at a normal
        # interpreter exit *and* when a rank started by fork or a fork server returns (such a
        # child leaves through os._exit, which skips atexit and would drop unpublished recipes).
        self._at_exit = multiprocessing.util.Finalize(self, self._close_at_exit, exitpriority=10)

    # -- reading -----------------------------------------------------------------------
    def path_for(self, digest: bytes) -> Path:
        """File that holds (or would hold) the recipe of this digest."""
        return self.directory / (name_digest(digest).hex() + RECIPE_SUFFIX)

    def lookup(self, digest: bytes) -> Recipe | None:
        """This process's answer for a digest: the snapshot taken at open, or its own stores.

        Never touches the directory, so the answer does not depend on what peers (or this
        process's writer thread) did since the snapshot.
        """
        name = name_digest(digest)
        recipe = self._snapshot.get(name)
        if recipe is not None:
            return recipe
        with self._state:
            return self._own.get(name)

    @property
    def snapshot_size(self) -> int:
        """Number of recipes in the snapshot taken when this object was created."""
        return len(self._snapshot)

    def load(self, digest: bytes) -> Recipe | None:
        """Read a recipe from the directory now; ``None`` on absence, corruption or a
        non-regular file (both logged as a warning). For inspection and tests: the simulated
        cost uses :meth:`lookup`."""
        return self._read(self.path_for(digest), name_digest(digest))

    def directory_bytes(self) -> int:
        """Total size of the (regular) recipe files in the directory, bytes."""
        return sum(size for _, _, size, _ in self._scan())

    # -- writing -----------------------------------------------------------------------
    def store_async(self, digest: bytes, recipe: Recipe) -> None:
        """Remember a recipe for this process and queue it for publishing.

        It becomes an answer of :meth:`lookup` at once; it is written (with the eviction
        before it) on the writer thread at the next :meth:`flush`/:meth:`close`. After
        ``close()`` the store runs synchronously on the calling thread instead.
        """
        name = name_digest(digest)
        data = encode_recipe(digest, recipe)
        with self._state:
            self._own[name] = recipe
            closed = self._closed
            if not closed:
                self._unpublished.append((name, data))
        if closed:  # after close() (e.g. during interpreter exit): write on this thread
            self._store_locked(name, data)

    def store(self, digest: bytes, recipe: Recipe) -> None:
        """Store and publish synchronously on the calling thread (same protocol as the writer)."""
        name = name_digest(digest)
        with self._state:
            self._own[name] = recipe
        self._store_locked(name, encode_recipe(digest, recipe))

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Publish every store made so far and wait until they have been written.

        Returns:
            True if every store was written, False on timeout (logged as a warning).
        """
        with self._state:
            batch, self._unpublished = self._unpublished, []
        submitted = []
        for name, data in batch:
            try:
                submitted.append(self._writer.submit(self._store_logged, name, data))
            except RuntimeError:  # the executor is shut down (interpreter exit): write here
                self._store_logged(name, data)
        with self._state:
            self._inflight.update(submitted)
            waiting = set(self._inflight)
        done, not_done = concurrent.futures.wait(waiting, timeout=timeout)
        with self._state:
            self._inflight -= done
        if not_done:
            logger.warning("recipe cache: flush timed out after %ss with %d stores pending",
                           timeout, len(not_done))
        return not not_done

    def close(self, timeout: float | None = 30.0) -> bool:
        """Flush (publish), then stop the writer thread. Idempotent.

        Returns:
            True if everything was written and the writer stopped within the timeout.
        """
        with self._state:
            if self._closed:
                return not self._inflight
            self._closed = True  # from now on store_async writes on the calling thread
        drained = self.flush(timeout)
        self._writer.shutdown(wait=drained)  # nothing left to wait for unless it timed out
        self._at_exit.cancel()
        return drained

    def clear(self) -> None:
        """Delete every recipe (and stale temporary file) in the directory.

        Directories named ``*.recipe`` are skipped with a warning; the snapshot of this
        object is not changed.
        """
        with self._lock:
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
        with self._lock:
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

    def _store_logged(self, name: bytes, data: bytes) -> None:
        """One store on the writer thread: a failure is logged, never raised."""
        try:
            self._store_locked(name, data)
        except Exception:  # noqa: BLE001 - a failed store must not lose the others
            logger.warning("recipe cache: failed to store a recipe in %s", self.directory, exc_info=True)

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

    def _store_locked(self, name: bytes, data: bytes) -> None:
        """Evict oldest-first until ``data`` fits, then write it, holding the writers' lock."""
        target = self.directory / (name.hex() + RECIPE_SUFFIX)
        budget = int(self.config.size_bytes * _EVICT_TO_FRACTION)
        if len(data) > budget:
            logger.warning("recipe cache: recipe of %d bytes exceeds 0.99 x size_MB (%d bytes);"
                           " not stored", len(data), budget)
            return
        with self._lock:
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
