// torch.autocast("hpu") for hpu tensors: the AutocastHPU kernels of the ops torch lists for
// out-of-tree backends in ATen/autocast_mode.h (matmuls and convolutions in the region's lower
// precision, reductions, norms and losses in fp32, the promote ops at their widest input), with
// torch's own casting wrapper. See NOTE [autocast on hpu tensors] in hpu_runtime/bridge/autocast.py.
// Its own translation unit: ATen/autocast_mode.h includes all of ATen (most of the build time).

#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace at::autocast {
namespace {

#define HPU_KERNEL(...) KERNEL(c10::DeviceType::HPU, __VA_ARGS__)
#define HPU_LOWER(...) HPU_KERNEL(__VA_ARGS__, lower_precision_fp)
#define HPU_FP32(...) HPU_KERNEL(__VA_ARGS__, fp32)
#define HPU_FP32_SET_OPT_DTYPE(...) HPU_KERNEL(__VA_ARGS__, fp32_set_opt_dtype)
#define HPU_PROMOTE(...) HPU_KERNEL(__VA_ARGS__, promote)
#define HPU_DIFFERENT_REDISPATCH(FUNC, NAME, SIGNATURE, REDISPATCH, POLICY) \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE(c10::DeviceType::HPU, FUNC, NAME, SIGNATURE, REDISPATCH, POLICY)

// ops on no list run in their inputs' dtypes (the CPU wheel has no fallback for this key)
TORCH_LIBRARY_IMPL(_, AutocastHPU, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastHPU, m) {
  AT_FORALL_LOWER_PRECISION_FP(HPU_LOWER)
  AT_FORALL_FP32(HPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(HPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(HPU_DIFFERENT_REDISPATCH)
  AT_FORALL_PROMOTE(HPU_PROMOTE)
  HPU_PROMOTE(cat)
  HPU_PROMOTE(stack)
  HPU_PROMOTE(index_copy)
}

}  // namespace
}  // namespace at::autocast
