"""Tests of the recipe cache: memory level, disk format, eviction, processes."""

import json
import logging
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from filelock import FileLock

from hpu_runtime.bridge.config import RECIPE_CACHE_ENV as ENV_VAR
from hpu_runtime.bridge.config import RecipeCacheConfig, RuntimeConfig, parse_recipe_cache_config
from hpu_runtime.bridge.recipe import RECIPE_SUFFIX, Recipe, RecipeFormatError, decode_recipe, digest_of, encode_recipe
from hpu_runtime.bridge.recipe_cache import RecipeCache
from hpu_runtime.bridge.recipe_disk import EVICTION_LOCK_NAME, WRITER_THREAD_PREFIX, DiskRecipeCache

DISK_LOGGER = "hpu_runtime.bridge.recipe_disk"

REPO = Path(__file__).resolve().parents[2]
JOIN_TIMEOUT_S = 60


def _recipe(i: int, pad: int = 0) -> Recipe:
    return Recipe(n_ops=i, compile_ns=1000 * i, device_ns=7 * i,
                  meta={"ops": ["aten.mm", "aten.add"], "pad": "x" * pad})


def _cfg(path, size_mb=10.0, clear=False) -> RecipeCacheConfig:
    return RecipeCacheConfig(path=Path(path), clear_at_start=clear, size_mb=size_mb)


def _recipe_files(path) -> list[Path]:
    return sorted(p for p in Path(path).iterdir() if p.name.endswith(RECIPE_SUFFIX))


# -- configuration -------------------------------------------------------------------------

def test_parse_config_ok():
    """path,clear_at_start,size_MB parses; commas inside the path survive."""
    cfg = parse_recipe_cache_config("/tmp/a,b,True, 512")
    assert cfg == RecipeCacheConfig(path=Path("/tmp/a,b"), clear_at_start=True, size_mb=512.0)
    assert cfg.size_bytes == 512 << 20
    assert parse_recipe_cache_config("/x,false,0.5").clear_at_start is False
    four = parse_recipe_cache_config("/x,true,64,true")
    assert (four.path, four.clear_at_start, four.size_mb, four.on_nfs) == (
        Path("/x"), True, 64.0, True)


def test_parse_config_empty_path_disables_disk():
    """An empty path (Gaudi's default ',false,1024,false') means no disk cache."""
    assert parse_recipe_cache_config(",false,1024,false") is None
    assert parse_recipe_cache_config(" ,true,10") is None
    assert RuntimeConfig.from_env({ENV_VAR: ",false,1024,false"}).recipe_cache is None
    assert RecipeCache.from_config(None).disk is None


@pytest.mark.parametrize(
    "value", ["/tmp/x", "/tmp/x,true", ",maybe,10", "/tmp/x,maybe,10", "/tmp/x,true,ten",
              "/tmp/x,true,0", "/tmp/x,true,-3", "/tmp/x,true,inf"])
def test_parse_config_malformed_names_variable(value):
    """A malformed value is a ValueError that names the environment variable."""
    with pytest.raises(ValueError, match=ENV_VAR):
        parse_recipe_cache_config(value)


def test_from_env_malformed_and_unset(tmp_path):
    """RuntimeConfig.from_env: unset -> memory only; malformed -> ValueError naming the variable."""
    assert RuntimeConfig.from_env({}).recipe_cache is None
    with pytest.raises(ValueError, match=ENV_VAR):
        RuntimeConfig.from_env({ENV_VAR: f"{tmp_path},nope,1"})
    cfg = RuntimeConfig.from_env({ENV_VAR: f"{tmp_path},true,2"}).recipe_cache
    assert cfg == RecipeCacheConfig(path=tmp_path, clear_at_start=True, size_mb=2.0)


# -- record format -------------------------------------------------------------------------

def test_encode_decode_round_trip():
    """A record decodes to an equal recipe and is not pickle."""
    d = digest_of("graph-1")
    data = encode_recipe(d, _recipe(3))
    assert decode_recipe(data, d) == _recipe(3)
    assert b"pickle" not in data and data[:4] == b"HPUR"


def test_decode_rejects_every_truncation_and_bit_flip():
    """Every strict prefix and every single-byte flip is a RecipeFormatError."""
    d = digest_of("graph-2")
    data = encode_recipe(d, _recipe(5))
    for n in range(len(data)):
        with pytest.raises(RecipeFormatError):
            decode_recipe(data[:n], d)
    for i in range(len(data)):
        if 8 <= i < 12:  # version + reserved: reserved is not checked, skip both
            continue
        flipped = bytearray(data)
        flipped[i] ^= 0xFF
        with pytest.raises(RecipeFormatError):
            decode_recipe(bytes(flipped), d)
    with pytest.raises(RecipeFormatError, match="another digest"):
        decode_recipe(data, digest_of("graph-3"))


def test_recipe_validation():
    """Negative or non-int counters are rejected."""
    with pytest.raises(ValueError, match="n_ops"):
        Recipe(n_ops=-1)
    with pytest.raises(ValueError, match="compile_ns"):
        Recipe(n_ops=1, compile_ns=1.5)


# -- memory level --------------------------------------------------------------------------

def test_memory_hits_and_misses():
    """First lookup misses, after insert the same key hits, another key misses."""
    cache = RecipeCache()
    key = (("aten.mm", (4, 4), "bf16"),)
    assert cache.lookup(key) is None
    cache.insert(key, _recipe(1))
    assert cache.lookup(key) == _recipe(1)
    assert cache.lookup(key) == _recipe(1)
    assert cache.lookup((("aten.mm", (4, 5), "bf16"),)) is None
    s = cache.stats()
    assert (s.hits, s.misses, s.disk_hits, s.entries) == (2, 2, 0, 1)
    cache.reset_stats()
    assert (cache.hits, cache.misses) == (0, 0)
    assert key in cache and len(cache) == 1


def test_memory_keeps_the_most_recently_used_recipes():
    """NOTE [the recipe cache's LRU], worked out by hand: with room for 3 recipes, a 4th drops
    the least recently used one, and a hit (memory_hit, or lookup) makes a recipe the most
    recently used."""
    cache = RecipeCache(max_recipes=3)
    k = [(("aten.mm", (i, 4), "bf16"),) for i in range(5)]
    for i in range(3):
        cache.insert(k[i], _recipe(i + 1))
    assert cache.memory_hit(k[0]) == _recipe(1)  # least to most recent: k1, k2, k0
    cache.insert(k[3], _recipe(4))  # drops k1
    assert [key in cache for key in k] == [True, False, True, True, False]
    assert cache.lookup(k[2]) == _recipe(3)  # k0, k3, k2
    cache.insert(k[4], _recipe(5))  # drops k0
    assert [key in cache for key in k] == [False, False, True, True, True]
    assert cache.lookup(k[0]) is None  # dropped: a miss (the caller compiles again)
    s = cache.stats()
    assert (s.entries, s.evictions, s.hits, s.misses) == (3, 2, 2, 1)
    for bad in (2, 0, 3.0, True):
        with pytest.raises(ValueError, match="max_recipes"):
            RecipeCache(max_recipes=bad)


def test_habana_pgm_lru_max_sets_the_bound_as_the_bridge_reads_it(caplog):
    """The bridge's bounds (HabanaAI/gaudi-pytorch-bridge ``backend/kernel/hpu_recipe_cache.h``):
    30,000 recipes in lazy mode, 100,000 in eager mode; ``HABANA_PGM_LRU_MAX`` replaces them, and
    a number under 3 is raised to 3 (with a warning here); a malformed one is refused by name."""
    assert RuntimeConfig.from_env({}).max_recipes == 30_000
    assert RuntimeConfig.from_env({"PT_HPU_LAZY_MODE": "0"}).max_recipes == 100_000
    assert RuntimeConfig.from_env({"HABANA_PGM_LRU_MAX": " 50 ", "PT_HPU_LAZY_MODE": "0"}).max_recipes == 50
    with caplog.at_level(logging.WARNING):
        assert RuntimeConfig.from_env({"HABANA_PGM_LRU_MAX": "1"}).max_recipes == 3
    assert "HABANA_PGM_LRU_MAX=1" in caplog.text
    for bad in ("lots", "1e5", "2.5"):
        with pytest.raises(ValueError, match="HABANA_PGM_LRU_MAX"):
            RuntimeConfig.from_env({"HABANA_PGM_LRU_MAX": bad})
    with pytest.raises(ValueError, match="HABANA_PGM_LRU_MAX"):
        RuntimeConfig(recipe_lru_max=2)


def test_a_recipe_dropped_from_a_full_cache_compiles_again(monkeypatch):
    """Eager mode with torch's Adam: with the default bound no recipe is dropped; with
    ``HABANA_PGM_LRU_MAX=3`` memory holds 3 recipes, and an op whose recipe 3 others followed
    since its last launch compiles again (an LRU of 3 has dropped it), each compile a miss
    charged to the host: more than twice the compiles for the same launches."""
    import hpu_runtime as hpu
    from tests.unit.test_bridge_in_kernel import _small_adam_job, _three_adam_steps

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")

    def run(lru: str | None):
        if lru is None:
            monkeypatch.delenv("HABANA_PGM_LRU_MAX", raising=False)
        else:
            monkeypatch.setenv("HABANA_PGM_LRU_MAX", lru)
        dev = hpu.reset_device("gaudi2")
        _three_adam_steps(*_small_adam_job())
        launcher = dev.launcher
        return launcher.recipes.stats(), launcher.compilations, launcher.graphs_launched, dev.card.host_ns

    try:
        (roomy, roomy_compiles, launches, roomy_host), (tight, tight_compiles, tight_launches, tight_host) = (
            run(None), run("3"))
    finally:
        monkeypatch.delenv("HABANA_PGM_LRU_MAX", raising=False)
        monkeypatch.delenv("PT_HPU_LAZY_MODE")
        hpu.reset_device("gaudi2")
    assert roomy.evictions == 0 and roomy.hits > roomy.misses
    assert tight_launches == launches > 100
    assert tight.entries == 3 and tight.evictions == tight.misses - 3
    assert tight_compiles == tight.misses > 2 * roomy_compiles
    assert tight_host > roomy_host  # each compile is charged


# -- disk level, one process ---------------------------------------------------------------

def test_disk_hit_from_fresh_cache(tmp_path):
    """A recipe stored by one cache object is a disk hit for a new one."""
    c1 = RecipeCache(disk=DiskRecipeCache(_cfg(tmp_path)))
    c1.insert("k", _recipe(2), digest=digest_of("k"))
    assert c1.close(timeout=JOIN_TIMEOUT_S)
    c2 = RecipeCache(disk=DiskRecipeCache(_cfg(tmp_path)))
    try:
        assert c2.lookup("k", digest=digest_of("k")) == _recipe(2)
        assert c2.lookup("k", digest=digest_of("k")) == _recipe(2)  # now from memory
        assert c2.lookup("other", digest=digest_of("other")) is None
        s = c2.stats()
        assert (s.hits, s.disk_hits, s.misses) == (2, 1, 1)
    finally:
        assert c2.close(timeout=JOIN_TIMEOUT_S)
    assert (tmp_path / EVICTION_LOCK_NAME).exists()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "flip"])
def test_corrupt_file_is_a_logged_miss(tmp_path, caplog, damage):
    """A damaged recipe file is a miss with a warning for a cache opened on it, then a store
    repairs it."""
    writer = DiskRecipeCache(_cfg(tmp_path))
    d = digest_of("g")
    writer.store(d, _recipe(4))
    assert writer.close(timeout=JOIN_TIMEOUT_S)
    path = writer.path_for(d)
    data = path.read_bytes()
    damaged = {"truncate": data[: len(data) // 2], "garbage": b"\x00garbage" * 9,
               "empty": b"", "flip": data[:-1] + bytes([data[-1] ^ 1])}[damage]
    path.write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger=DISK_LOGGER):
        disk = DiskRecipeCache(_cfg(tmp_path))  # the snapshot reads and rejects the file
    cache = RecipeCache(disk=disk)
    with caplog.at_level(logging.WARNING, logger=DISK_LOGGER):
        assert cache.lookup("g", digest=d) is None
    assert cache.misses == 1
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    cache.insert("g", _recipe(4), digest=d)
    assert cache.close(timeout=JOIN_TIMEOUT_S)
    assert decode_recipe(path.read_bytes(), d) == _recipe(4)


def test_clear_at_start(tmp_path):
    """clear_at_start=True removes recipes written earlier; False keeps them."""
    disk = DiskRecipeCache(_cfg(tmp_path))
    for i in range(3):
        disk.store(digest_of(str(i)), _recipe(i))
    assert disk.close(timeout=JOIN_TIMEOUT_S)
    (tmp_path / ".tmp-123-stale").write_bytes(b"x")
    kept = DiskRecipeCache(_cfg(tmp_path, clear=False))
    assert len(_recipe_files(tmp_path)) == 3
    assert kept.load(digest_of("1")) == _recipe(1)
    assert kept.close(timeout=JOIN_TIMEOUT_S)
    cleared = DiskRecipeCache(_cfg(tmp_path, clear=True))
    assert _recipe_files(tmp_path) == []
    assert not (tmp_path / ".tmp-123-stale").exists()
    assert cleared.load(digest_of("1")) is None
    assert cleared.close(timeout=JOIN_TIMEOUT_S)


def test_eviction_oldest_first_within_limit(tmp_path):
    """Storing past the limit evicts oldest recipes; after each store <= 0.99 x size."""
    size_mb = 0.05
    limit = int(size_mb * (1 << 20))
    disk = DiskRecipeCache(_cfg(tmp_path, size_mb=size_mb))
    n = 40
    for i in range(n):
        disk.store(digest_of(str(i)), _recipe(i, pad=2000))
        assert disk.directory_bytes() <= 0.99 * limit
    assert disk.evictions > 0
    present = [i for i in range(n) if disk.load(digest_of(str(i))) is not None]
    # the survivors are exactly the newest ones
    assert present == list(range(n - len(present), n))
    assert disk.stores - disk.evictions == len(_recipe_files(tmp_path))
    assert disk.close(timeout=JOIN_TIMEOUT_S)


def test_oversized_recipe_is_skipped(tmp_path, caplog):
    """A recipe bigger than the whole budget is not stored (warning), nothing evicted."""
    disk = DiskRecipeCache(_cfg(tmp_path, size_mb=0.001))
    with caplog.at_level(logging.WARNING, logger=DISK_LOGGER):
        disk.store(digest_of("big"), _recipe(1, pad=5000))
    assert _recipe_files(tmp_path) == []
    assert any("exceeds" in r.getMessage() for r in caplog.records)
    assert disk.close(timeout=JOIN_TIMEOUT_S)


def test_flush_waits_for_background_stores(tmp_path):
    """After flush() every queued store is on disk, written by the writer thread; close()
    stops that thread."""
    def writers():
        return [t for t in threading.enumerate()
                if t.name.startswith(f"{WRITER_THREAD_PREFIX}:{tmp_path}") and t.is_alive()]

    disk = DiskRecipeCache(_cfg(tmp_path))
    for i in range(20):
        disk.store_async(digest_of(str(i)), _recipe(i))
    assert _recipe_files(tmp_path) == []  # queued, not yet published
    assert disk.flush(timeout=JOIN_TIMEOUT_S)
    assert len(_recipe_files(tmp_path)) == 20
    assert len(writers()) == 1
    assert disk.close(timeout=JOIN_TIMEOUT_S)
    assert writers() == []
    disk.store_async(digest_of("late"), _recipe(1))  # after close: synchronous
    assert disk.load(digest_of("late")) == _recipe(1)


# -- several processes ---------------------------------------------------------------------

_SCRIPT = textwrap.dedent("""
    import json, sys
    from hpu_runtime.bridge.config import RuntimeConfig
    from hpu_runtime.bridge.recipe import Recipe, digest_of
    from hpu_runtime.bridge.recipe_cache import RecipeCache
    cache = RecipeCache.from_config(RuntimeConfig.from_env().recipe_cache)
    keys = [f"graph-{i}" for i in range(5)]
    out = []
    for k in keys:
        r = cache.lookup(k, digest=digest_of(k))
        out.append(r is not None)
        if r is None:
            cache.insert(k, Recipe(n_ops=len(k), compile_ns=5), digest=digest_of(k))
    s = cache.stats()
    print(json.dumps({"found": out, "hits": s.hits, "disk_hits": s.disk_hits,
                      "misses": s.misses}))
    # no explicit flush: the at-exit close must write the recipes
""")


def _run_script(env_value: str) -> dict:
    env = dict(os.environ, **{ENV_VAR: env_value})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=JOIN_TIMEOUT_S, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_hits_on_disk(tmp_path):
    """A second run with the same config hits on disk; clear_at_start forces misses."""
    first = _run_script(f"{tmp_path},false,16")
    assert first["found"] == [False] * 5 and first["misses"] == 5
    second = _run_script(f"{tmp_path},false,16")
    assert second["found"] == [True] * 5
    assert second["disk_hits"] == 5 and second["misses"] == 0
    third = _run_script(f"{tmp_path},true,16")
    assert third["found"] == [False] * 5


def _writer(directory: str, size_mb: float, rank: int, n: int, pad: int, results) -> None:
    disk = DiskRecipeCache(RecipeCacheConfig(path=Path(directory), clear_at_start=False,
                                             size_mb=size_mb))
    for i in range(n):
        disk.store_async(digest_of(f"r{rank}-{i}"), _recipe(i, pad=pad))
    ok = disk.close(timeout=JOIN_TIMEOUT_S)
    results.put((rank, ok, disk.stores, disk.evictions))


def _run_writers(directory, size_mb, n, pad, monitor_limit=None):
    ctx = mp.get_context("fork")  # children use only the stdlib + this module
    results = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(directory), size_mb, r, n, pad, results))
             for r in range(8)]
    for p in procs:
        p.start()
    max_seen = 0
    try:
        if monitor_limit is not None:
            lock = FileLock(Path(directory) / EVICTION_LOCK_NAME)  # the writers' lock
            while any(p.is_alive() for p in procs):
                with lock:  # no writer can be between an eviction and its write
                    sizes = [e.stat().st_size for e in os.scandir(directory)
                             if e.name.endswith(RECIPE_SUFFIX) and e.is_file(follow_symlinks=False)]
                max_seen = max(max_seen, sum(sizes))
                procs[0].join(timeout=0.01)
        out = [results.get(timeout=JOIN_TIMEOUT_S) for _ in procs]
        for p in procs:
            p.join(timeout=JOIN_TIMEOUT_S)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return out, max_seen


def test_eight_writers_lose_nothing(tmp_path):
    """8 processes storing into one directory under the limit: every recipe is readable."""
    n = 15
    out, _ = _run_writers(tmp_path, 10.0, n, pad=100)
    assert all(ok for _, ok, _, _ in out)
    assert sum(e for *_, e in out) == 0
    reader = DiskRecipeCache(_cfg(tmp_path, size_mb=10.0))
    for r in range(8):
        for i in range(n):
            assert reader.load(digest_of(f"r{r}-{i}")) == _recipe(i, pad=100)
    assert len(_recipe_files(tmp_path)) == 8 * n
    assert reader.close(timeout=JOIN_TIMEOUT_S)


def test_eight_writers_never_exceed_limit(tmp_path):
    """8 processes overflowing the limit: size stays <= limit at every locked sample."""
    size_mb = 0.1
    limit = int(size_mb * (1 << 20))
    n = 20
    out, max_seen = _run_writers(tmp_path, size_mb, n, pad=2000, monitor_limit=limit)
    assert all(ok for _, ok, _, _ in out)
    stores = sum(s for _, _, s, _ in out)
    evictions = sum(e for *_, e in out)
    assert stores == 8 * n
    assert evictions > 0
    assert max_seen <= limit
    files = _recipe_files(tmp_path)
    assert sum(f.stat().st_size for f in files) <= 0.99 * limit
    assert len(files) == stores - evictions  # nothing lost beyond what was evicted
    for f in files:
        decode_recipe(f.read_bytes())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


# -- determinism: answers come from the snapshot taken at open -------------------------------

def test_peer_store_after_snapshot_is_a_miss(tmp_path):
    """A recipe a peer publishes after this cache opened is a miss here (a compile is
    charged), however soon it lands; a cache opened afterwards hits it."""
    mine = RecipeCache(disk=DiskRecipeCache(_cfg(tmp_path)))
    peer = DiskRecipeCache(_cfg(tmp_path))
    x = digest_of("X")
    peer.store(x, _recipe(3))  # synchronous: the file is complete before the lookup
    assert peer.load(x) == _recipe(3)
    try:
        assert mine.lookup("X", digest=x) is None
        assert mine.stats().misses == 1 and mine.stats().disk_hits == 0
        fresh = RecipeCache(disk=DiskRecipeCache(_cfg(tmp_path)))
        assert fresh.lookup("X", digest=x) == _recipe(3)
        assert fresh.stats().disk_hits == 1
        assert fresh.close(timeout=JOIN_TIMEOUT_S)
    finally:
        assert peer.close(timeout=JOIN_TIMEOUT_S)
        assert mine.close(timeout=JOIN_TIMEOUT_S)


def test_peer_eviction_or_damage_after_snapshot_changes_nothing(tmp_path):
    """A recipe present when the cache opened stays a hit after a peer evicts or damages
    its file: the charge is decided by the snapshot."""
    setup = DiskRecipeCache(_cfg(tmp_path))
    a, b = digest_of("a"), digest_of("b")
    setup.store(a, _recipe(1))
    setup.store(b, _recipe(2))
    assert setup.close(timeout=JOIN_TIMEOUT_S)
    cache = RecipeCache(disk=DiskRecipeCache(_cfg(tmp_path)))
    assert cache.disk.snapshot_size == 2
    cache.disk.path_for(a).unlink()  # evicted by a peer
    cache.disk.path_for(b).write_bytes(b"junk")  # damaged by someone
    assert cache.lookup("a", digest=a) == _recipe(1)
    assert cache.lookup("b", digest=b) == _recipe(2)
    assert cache.stats().disk_hits == 2
    assert cache.close(timeout=JOIN_TIMEOUT_S)


def test_own_stores_answer_from_memory_and_publish_at_flush(tmp_path):
    """A process's own stores are answers at once (even with the in-memory level emptied,
    as reset_device does) whether or not its writer has written them; they reach the
    directory at flush()."""
    cache = RecipeCache(disk=DiskRecipeCache(_cfg(tmp_path)))
    for i in range(5):
        cache.insert(f"k{i}", _recipe(i + 1), digest=digest_of(f"k{i}"))
    assert _recipe_files(tmp_path) == []  # not published yet: no peer can see them
    cache.clear()  # forget the memory level
    assert all(cache.lookup(f"k{i}", digest=digest_of(f"k{i}")) == _recipe(i + 1)
               for i in range(5))
    assert cache.stats().disk_hits == 5
    assert cache.flush(timeout=JOIN_TIMEOUT_S)
    assert len(_recipe_files(tmp_path)) == 5
    assert cache.close(timeout=JOIN_TIMEOUT_S)


def test_clear_at_start_snapshot_is_empty_for_every_rank(tmp_path):
    """With clear_at_start every opener's snapshot is empty, whatever the directory holds
    or whichever rank cleared first; a rank's unpublished stores survive a later rank's
    clear and are published at close."""
    old = DiskRecipeCache(_cfg(tmp_path))
    old.store(digest_of("old"), _recipe(1))
    assert old.close(timeout=JOIN_TIMEOUT_S)
    rank0 = RecipeCache(disk=DiskRecipeCache(_cfg(tmp_path, clear=True)))
    rank0.insert("new", _recipe(2), digest=digest_of("new"))
    rank1 = RecipeCache(disk=DiskRecipeCache(_cfg(tmp_path, clear=True)))  # opens later
    for rank in (rank0, rank1):
        assert rank.disk.snapshot_size == 0
        assert rank.lookup("old", digest=digest_of("old")) is None
    assert rank1.lookup("new", digest=digest_of("new")) is None
    assert rank0.close(timeout=JOIN_TIMEOUT_S) and rank1.close(timeout=JOIN_TIMEOUT_S)
    assert [p.name for p in _recipe_files(tmp_path)] == [
        digest_of("new").hex() + RECIPE_SUFFIX]


# -- non-regular entries named *.recipe ------------------------------------------------------

@pytest.mark.timeout(30)
def test_fifo_named_like_a_recipe_is_a_miss_not_a_hang(tmp_path, caplog):
    """A FIFO at a recipe's path is never opened for a blocking read: a logged miss; a
    store then replaces it."""
    d = digest_of("fifo")
    probe = DiskRecipeCache(_cfg(tmp_path))
    os.mkfifo(probe.path_for(d))
    with caplog.at_level(logging.WARNING, logger=DISK_LOGGER):
        cache = RecipeCache(disk=DiskRecipeCache(_cfg(tmp_path)))
        assert cache.lookup("fifo", digest=d) is None
        assert probe.load(d) is None
    assert any("not a regular file" in r.getMessage() for r in caplog.records)
    assert probe.directory_bytes() == 0
    cache.insert("fifo", _recipe(5), digest=d)
    assert cache.close(timeout=JOIN_TIMEOUT_S)
    assert probe.load(d) == _recipe(5)
    assert probe.close(timeout=JOIN_TIMEOUT_S)


@pytest.mark.timeout(30)
def test_directory_named_like_a_recipe_does_not_stop_eviction(tmp_path, caplog):
    """A directory named *.recipe (the oldest entry) is skipped by eviction, size
    accounting and clear(), with a warning; stores keep working within the limit."""
    size_mb = 0.05
    limit = int(size_mb * (1 << 20))
    odd = [tmp_path / "junk.recipe", tmp_path / (digest_of("d").hex() + RECIPE_SUFFIX)]
    for p in odd:
        p.mkdir()
        os.utime(p, ns=(0, 0))  # oldest: eviction meets it first
    with caplog.at_level(logging.WARNING, logger=DISK_LOGGER):
        disk = DiskRecipeCache(_cfg(tmp_path, size_mb=size_mb))
        for i in range(40):
            disk.store(digest_of(str(i)), _recipe(i, pad=2000))
            assert disk.directory_bytes() <= 0.99 * limit
        disk.store(digest_of("d"), _recipe(1))  # its path is a directory: skipped
        assert disk.evictions > 0
        assert disk.load(digest_of("39")) == _recipe(39, pad=2000)
        assert disk.close(timeout=JOIN_TIMEOUT_S)
        cleared = DiskRecipeCache(_cfg(tmp_path, size_mb=size_mb, clear=True))
        assert cleared.close(timeout=JOIN_TIMEOUT_S)
    assert all(p.is_dir() for p in odd)
    assert _recipe_files(tmp_path) == sorted(odd)
    assert any("not a regular file" in r.getMessage() or "a directory" in r.getMessage()
               for r in caplog.records)


def _store_and_return(directory: str, n: int) -> None:
    """A forked rank that stores recipes and returns without closing its cache."""
    disk = DiskRecipeCache(RecipeCacheConfig(path=Path(directory), clear_at_start=False, size_mb=16))
    for i in range(n):
        disk.store_async(digest_of(f"forked-{i}"), _recipe(i))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_forked_rank_that_just_returns_publishes_its_recipes(tmp_path, method):
    """A rank started by fork or a fork server leaves through os._exit (no atexit); its pending
    recipes are still published (NOTE [flush at exit] in recipe_disk.py)."""
    ctx = mp.get_context(method)
    p = ctx.Process(target=_store_and_return, args=(str(tmp_path), 4))
    p.start()
    p.join(JOIN_TIMEOUT_S)
    assert p.exitcode == 0
    assert len(_recipe_files(tmp_path)) == 4
    reader = DiskRecipeCache(RecipeCacheConfig(path=tmp_path, clear_at_start=False, size_mb=16))
    try:
        assert all(reader.lookup(digest_of(f"forked-{i}")) is not None for i in range(4))
    finally:
        reader.close()


def test_a_graph_key_hashes_and_compares_as_the_plain_tuple_of_its_items():
    """``GraphKey`` (NOTE [a graph key's hash] in hpu_runtime.bridge.launcher) against CPython's
    own ``hash(tuple(items))`` and tuple equality: empty, one item, items whose hash is -1's
    (-2), nested signatures with sizes and dtypes, a long key; past the kernel's cache of item
    hashes (more distinct entries than it keeps) the values stay right; a recipe stored under one
    is found under the other, either way round; and a key survives pickling."""
    import pickle

    import torch

    from hpu_runtime.bridge.launcher import GraphKey

    sig = ("aten.addmm.default", ((torch.Size([128]), torch.float32), (torch.Size([32, 64]), torch.bfloat16)))
    cases = [[], [-1], [sig], [sig, ("view", 3), -1, 2.5, "x", None], [("op", i) for i in range(300)]]
    cases.append([("many", i) for i in range(70_000)])  # more than the kernel keeps (1 << 16)
    cases.append([("many", i) for i in range(3)])  # entries from before the cache was emptied
    for items in cases:
        key, plain = GraphKey(items), tuple(items)
        assert hash(key) == hash(plain) and key == plain and plain == key and isinstance(key, tuple)
        assert pickle.loads(pickle.dumps(key)) == plain
    cache = RecipeCache(disk=None)
    cache.insert(GraphKey([sig, sig]), _recipe(1))
    cache.insert((sig,), _recipe(2))
    assert cache.lookup((sig, sig)) == _recipe(1) and cache.lookup(GraphKey([sig])) == _recipe(2)
    assert cache.stats().hits == 2
