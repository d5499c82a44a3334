import os
import sys

# Spawned ranks import test modules by name: make the project root importable.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
# Several ranks share 2 cores: one intra-op thread each avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    from tests.scheduling import SLOW

    config.addinivalue_line(
        "markers", f"{SLOW}: an end-to-end case of 20 s or more on 2 cores; dealt to the xdist workers first"
        " (tests/scheduling.py)")


def pytest_collection_modifyitems(config, items):
    """On an xdist worker, each worker's share starts with the modules that hold slow tests
    (:mod:`tests.scheduling`; the suite runs ``--dist worksteal``, pyproject.toml: xdist sets
    a worker's own ``dist`` option to "no", so the mode cannot be read here, and the order is
    harmless under the other modes)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    from tests.scheduling import deal_slow_modules_first

    items[:] = deal_slow_modules_first(items, int(workerinput["workercount"]))
