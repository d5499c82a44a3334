"""``import habana_frameworks.torch.gpu_migration``: Intel's GPU Migration Toolkit, enabled at
import (what ``PT_HPU_GPU_MIGRATION=1`` does); see :mod:`hpu_runtime.api.gpu_migration`."""

from hpu_runtime.api.gpu_migration import enable as _enable

_enable()
