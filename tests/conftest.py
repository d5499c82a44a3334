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


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU this process can keep busy (:func:`tests.scheduling.usable_cpus`),
    not xdist's count of physical cores; ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides where set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    from tests.scheduling import usable_cpus

    return usable_cpus()


def pytest_unconfigure(config):
    """The run's worker count and the machine's CPUs, after pytest's last line (where a CI log's
    tail shows them)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or getattr(config, "workerinput", None) is not None:
        return
    from tests.scheduling import usable_cpus

    try:
        import psutil

        cores = f", psutil: {psutil.cpu_count(logical=False)} physical / {psutil.cpu_count()} logical"
    except ImportError:
        cores = ""
    workers = len(getattr(config.option, "tx", None) or []) or "none"
    reporter.write_line(f"xdist workers: {workers} (usable CPUs: {usable_cpus()}{cores})")


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
