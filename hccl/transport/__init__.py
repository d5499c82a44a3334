"""The data plane of the emulated HCCL: moving and reducing real bytes between rank processes.

Owns the transports (shared memory inside a host, token-checked TCP between hosts, MPI), the
engines that run collectives and point-to-point transfers over them, and the reduction
kernels (:mod:`.reduce_ops`). Its declared interfaces are in :mod:`.interface` (``Transport``:
one phase's messages; ``Collectives``: what the face drives); :mod:`.executor` runs a
:mod:`.plan` (plain data the face builds from the time plane's schedules) over any transport;
:mod:`.shm_engine` is the one-host fast path. It knows nothing of simulated time except the ready times it
carries for the torch face.

Must not import: the time plane (:mod:`hccl.sim`), the torch face (:mod:`hccl.process_group`),
``hpu_runtime``, ``launchers`` or ``models``.
"""
