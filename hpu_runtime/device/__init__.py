"""The device model: one simulated Gaudi card as hardware and time, pure and deterministic.

Owns:

* ``spec``: the constants of each generation (:class:`~hpu_runtime.device.spec.DeviceSpec`);
* ``cost_model``: the roofline cost of one op, copies over PCIe, a compile;
* ``timeline``: streams (in-order queues of busy intervals), the step breakdown, spans;
* ``memory``: the HBM model (live and peak bytes, the out-of-memory error);
* ``lazy_graph``: a lazy-mode graph as data (op records over storage serials) and its
  fused device time;
* ``residency``: which tensor storages are on the simulated HBM, and their serials;
* ``native``: the kernel library's C functions the HBM counters and the residency run on,
  handed here by ``import hpu_runtime`` (the bridge builds the library);
* ``card``: the card's clocks: host cursor, compute and collective streams, collective
  dependencies, graphs with collectives inside, step windows.

Every time is an integer of simulated nanoseconds; nothing here reads a wall clock or the
environment.

Must not import: ``hpu_runtime.bridge``, ``hpu_runtime.api``, ``hpu_runtime.tools`` (the
planes above it), nor ``hccl``, ``launchers`` or ``models``: the device model knows no aten
dispatch, no recipes, no configuration and no network. ``tests/unit/test_layering.py``
checks these rules.
"""
