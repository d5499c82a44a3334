"""Benchmarks and CLIs of the emulated HCCL (``python -m hccl.tools.bench``, ``bench_transport``).

They use the torch face and the time plane like any user; nothing in ``hccl`` imports them.
"""
