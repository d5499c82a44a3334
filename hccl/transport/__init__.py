"""The data plane of the emulated HCCL: moving and reducing real bytes between rank processes.

Owns the transports (shared memory inside a host, token-checked TCP between hosts, MPI), the
engines that run collectives and point-to-point transfers over them, and the reduction
kernels (:mod:`.reduce_ops`). It knows nothing of simulated time except the ready times it
carries for the torch face.

Must not import: the time plane (:mod:`hccl.sim`), the torch face (:mod:`hccl.process_group`),
``hpu_runtime``, ``launchers`` or ``models``.
"""
