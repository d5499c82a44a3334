"""``habana_frameworks.torch.utils.debug`` (``htdebug``): importable, as scripts import it.

Gaudi's module holds private debugging helpers of the real bridge; none is emulated. For the
emulator's own diagnostics use ``hpu_runtime.api.metrics`` (CPU fallbacks, compilations) and
``hpu_runtime.api.trace`` (a Chrome trace of the simulated timeline).
"""
