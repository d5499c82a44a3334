"""``hccl.tools.bench_transport``'s core binding (the benchmark itself runs in
tests/integration/test_bench_live.py)."""

from hccl.tools.bench_transport import core_of


def test_bind_to_core_deals_the_usable_cores_in_order_and_wraps():
    """Rank r gets the r-th of the cores the process may use (here 1, 3 and 6: a restricted
    set, as under ``taskset`` or a cgroup), modulo their number, as ``mpirun --bind-to core
    --map-by core`` deals them."""
    allowed = {6, 1, 3}
    assert [core_of(r, allowed) for r in range(7)] == [1, 3, 6, 1, 3, 6, 1]
