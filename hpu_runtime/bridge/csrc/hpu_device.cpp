// The "hpu" device type of the simulated Gaudi: tensors that say hpu:0, keep CPU storage and run
// the CPU kernels. Built and loaded by hpu_runtime/bridge/device_type.py, which holds
// NOTE [a device type for the simulated Gaudi] (what this file registers and why). The kernel
// also calls the bridge's accounting hooks around each op (NOTE [the bridge in the kernel] in
// hpu_runtime/bridge/dispatch.py).
//
// Invariant used throughout: an hpu tensor's storage is an ordinary CPU storage (CPU allocator,
// CPU data pointer); only the TensorImpl says hpu (its device and its dispatch keys). A CPU view
// of an hpu tensor is a second TensorImpl over the same storage, so whatever a CPU kernel does
// through it (write, resize the storage, take views of it) is done to the hpu tensor's data.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/detail/HPUHooksInterface.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

#include <structmember.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace {

using c10::BackendComponent;
using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::DispatchKey;
using c10::DispatchKeySet;
using c10::IValue;
using c10::Stream;
using c10::TensorImpl;

constexpr DeviceType kHpu = DeviceType::HPU;
const Device kHpu0(kHpu, 0);
const Device kCpu(DeviceType::CPU);
const DispatchKeySet kCpuKernel(DispatchKey::CPU);

// TensorImpl keeps its device and dispatch keys protected; a derived class's member pointers
// reach them on any TensorImpl (standard C++: [class.protected]).
struct Fields : TensorImpl {
  static DispatchKeySet& keys(TensorImpl* t) { return t->*(&Fields::key_set_); }
  static std::optional<Device>& device(TensorImpl* t) { return t->*(&Fields::device_opt_); }
};

// The same keys for another backend: the backend bit moves (Dense, Autograd... follow it) and
// so does the autocast key, which is per device type.
DispatchKeySet move_keys(DispatchKeySet ks, BackendComponent from, BackendComponent to, DispatchKey autocast_from,
                         DispatchKey autocast_to) {
  if (ks.has_backend(from)) ks = ks.remove_backend(from) | DispatchKeySet(to);
  if (ks.has(autocast_from)) ks = ks.remove(autocast_from) | DispatchKeySet(autocast_to);
  return ks;
}

inline DispatchKeySet cpu_keys(DispatchKeySet ks) {
  return move_keys(ks, BackendComponent::HPUBit, BackendComponent::CPUBit, DispatchKey::AutocastHPU,
                   DispatchKey::AutocastCPU);
}

inline DispatchKeySet hpu_keys(DispatchKeySet ks) {
  return move_keys(ks, BackendComponent::CPUBit, BackendComponent::HPUBit, DispatchKey::AutocastCPU,
                   DispatchKey::AutocastHPU);
}

inline bool is_hpu(const at::Tensor& t) { return t.defined() && t.unsafeGetTensorImpl()->is_hpu(); }

// A CPU tensor over an hpu tensor's storage: same storage object, sizes, strides and offset.
at::Tensor cpu_view(const at::Tensor& t) {
  TensorImpl* src = t.unsafeGetTensorImpl();
  auto impl = c10::make_intrusive<TensorImpl>(TensorImpl::VIEW, c10::Storage(src->storage()),
                                              cpu_keys(src->key_set()), src->dtype());
  impl->set_sizes_and_strides(src->sizes(), src->strides(), src->storage_offset());
  if (src->is_wrapped_number()) impl->set_wrapped_number(true);
  // a kernel that may not change this tensor's metadata (a .data / detach alias) fails as on CPU
  impl->set_allow_tensor_metadata_change(src->allow_tensor_metadata_change());
  return at::Tensor(std::move(impl));
}

// A tensor a CPU kernel has just made (no one else holds it yet) becomes an hpu tensor, in place.
inline void make_hpu(TensorImpl* impl) {
  Fields::device(impl) = kHpu0;
  Fields::keys(impl) = hpu_keys(impl->key_set());
}

// One call of the fallback: the hpu arguments swapped for CPU views, and the way back.
struct Call {
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 8> views;  // (CPU view, the hpu tensor it views)
  c10::SmallVector<TensorImpl*, 4> host_args;                    // CPU tensors passed in as they are
  bool host_device = false;                                     // an explicit device=cpu argument

  at::Tensor to_cpu(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (!t.unsafeGetTensorImpl()->is_hpu()) {
      host_args.push_back(t.unsafeGetTensorImpl());
      return t;
    }
    at::Tensor v = cpu_view(t);
    views.emplace_back(v, t);
    return v;
  }

  void arg_to_cpu(IValue& v) {
    if (v.isTensor()) {
      v = to_cpu(v.toTensor());
    } else if (v.isTensorList()) {
      auto in = v.toTensorList();
      c10::List<at::Tensor> out;  // a new list: the caller's list is shared, not ours to change
      out.reserve(in.size());
      for (const at::Tensor& t : in) out.push_back(to_cpu(t));
      v = std::move(out);
    } else if (v.isOptionalTensorList()) {
      auto in = v.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> out;
      out.reserve(in.size());
      for (const std::optional<at::Tensor>& t : in)
        out.push_back(t.has_value() ? std::optional<at::Tensor>(to_cpu(*t)) : std::nullopt);
      v = std::move(out);
    } else if (v.isList()) {  // nested lists, e.g. the Tensor[][] of c10d::allgather_
      auto in = v.toList();
      c10::impl::GenericList out(in.elementType());
      out.reserve(in.size());
      for (IValue e : in) {
        arg_to_cpu(e);
        out.push_back(std::move(e));
      }
      v = std::move(out);
    } else if (v.isDevice()) {
      if (v.toDevice().type() == kHpu)
        v = kCpu;
      else
        host_device = true;
    }
  }

  // An output: the hpu tensor itself if it is one of our views (in-place and out= ops return
  // their argument); a CPU argument stays as it is; anything new becomes hpu, unless the op
  // was asked for a CPU result.
  at::Tensor to_hpu(at::Tensor t) const {
    if (!t.defined()) return t;
    TensorImpl* impl = t.unsafeGetTensorImpl();
    for (const auto& [view, orig] : views)
      if (view.unsafeGetTensorImpl() == impl) return orig;
    if (host_device || !impl->is_cpu()) return t;
    for (TensorImpl* h : host_args)
      if (h == impl) return t;
    make_hpu(impl);
    return t;
  }

  void result_to_hpu(IValue& v) const {
    if (v.isTensor()) {
      v = to_hpu(std::move(v).toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list.set(j, to_hpu(list.get(j)));
    } else if (v.isList()) {
      auto list = v.toList();
      for (size_t j = 0; j < list.size(); ++j) {
        IValue e = list.get(j);
        result_to_hpu(e);
        list.set(j, std::move(e));
      }
    }
  }

  // A mutating op (out=, resize_, set_) may have resized or re-pointed a view: the hpu tensor
  // takes the view's storage, sizes, strides and offset.
  void write_back() const {
    for (const auto& [v, orig] : views) {
      TensorImpl* view = v.unsafeGetTensorImpl();
      TensorImpl* o = orig.unsafeGetTensorImpl();
      if (!view->storage().is_alias_of(o->storage())) {
        o->set_storage_keep_dtype(view->storage());
        Fields::device(o) = kHpu0;  // set_storage_keep_dtype took the storage's (CPU) device
      }
      if (view->sizes() != o->sizes() || view->strides() != o->strides() ||
          view->storage_offset() != o->storage_offset())
        o->set_sizes_and_strides(view->sizes(), view->strides(), view->storage_offset());
    }
  }
};

// Ops that take host tensors beside device ones on any accelerator: index tensors on the CPU.
bool takes_host_indices(const c10::OperatorName& name) {
  const std::string& n = name.name;
  return n == "aten::index" || n == "aten::index_put" || n == "aten::index_put_" || n == "aten::_index_put_impl_" ||
         n == "aten::_unsafe_index" || n == "aten::_unsafe_index_put";
}

// ---- the bridge's hooks (NOTE [the bridge in the kernel] in hpu_runtime/bridge/dispatch.py) ----
// Two Python callables set once by the bridge: before(func, args, kwargs, entry) -> token and
// after(func, args, kwargs, out, token); entry is what an earlier before() returned for the
// same op and signature, if that was an op entry (g_entries below), else None. They are called
// around every aten op on hpu tensors (and every .to("hpu") of a host tensor) on a thread where
// the bridge is active, outside the hooks themselves, and not where the Python dispatch key is
// excluded (torch's own _DisableTorchDispatch, which bridge_disabled() and torch.tensor(...,
// device="hpu") use).
PyObject* g_before = nullptr;
PyObject* g_after = nullptr;
thread_local bool t_active = false;
thread_local int t_inside = 0;

inline bool hooks_on() {
  return t_active && t_inside == 0 && g_after != nullptr &&
         !c10::impl::tls_is_dispatch_key_excluded(DispatchKey::Python);
}

// One argument as Python sees it: dtypes, layouts and memory formats travel as ints in an
// IValue; the schema says which they are.
py::object to_py(const c10::Argument& a, const IValue& v) {
  if (v.isInt()) {
    c10::TypePtr t = a.real_type();
    if (t->kind() == c10::TypeKind::OptionalType) t = t->castRaw<c10::OptionalType>()->getElementType();
    switch (t->kind()) {
      case c10::TypeKind::ScalarTypeType:
        return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(v.toScalarType())));
      case c10::TypeKind::LayoutType:
        return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPLayout(v.toLayout())));
      case c10::TypeKind::MemoryFormatType:
        return py::reinterpret_borrow<py::object>(torch::utils::getTHPMemoryFormat(v.toMemoryFormat()));
      default:
        break;
    }
  }
  return torch::jit::toPyObject(v);
}

// Which arguments Python sees in a dispatch mode: positional ones up to the last that differs
// from its default, keyword-only ones that differ from their default.
std::vector<bool> passed_args(const c10::FunctionSchema& schema, const std::vector<IValue>& argv) {
  const auto& arguments = schema.arguments();
  std::vector<bool> passed(arguments.size(), false);
  int64_t last = -1;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto& a = arguments[i];
    const bool is_default = a.default_value().has_value() && *a.default_value() == argv[i];
    if (a.kwarg_only()) {
      passed[i] = !is_default;
    } else if (!is_default) {
      last = static_cast<int64_t>(i);
    }
  }
  for (int64_t i = 0; i <= last; ++i) passed[i] = true;
  return passed;
}

// The op's arguments as Python sees them in a dispatch mode (passed_args).
py::tuple py_args(const c10::FunctionSchema& schema, const std::vector<IValue>& argv, const std::vector<bool>& passed,
                  py::dict& kwargs) {
  const auto& arguments = schema.arguments();
  size_t npos = 0;
  for (size_t i = 0; i < arguments.size(); ++i)
    if (passed[i] && !arguments[i].kwarg_only()) npos = i + 1;
  py::tuple args(npos);
  for (size_t i = 0; i < npos; ++i) args[i] = to_py(arguments[i], argv[i]);
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (passed[i] && arguments[i].kwarg_only()) kwargs[py::str(arguments[i].name())] = to_py(arguments[i], argv[i]);
  }
  return args;
}

// ---- the op entries the kernel keeps (NOTE [an op's entry, kept by the kernel] in
// hpu_runtime/bridge/dispatch.py) ----
// An op's signature as words: the op, then each argument Python sees, as its position, a tag and
// what graph_key.op_signature keeps of it (a tensor's dtype and sizes, a number's type and value,
// a string's bytes...). Two calls with the same words have equal signatures. The words are the
// key itself, compared in full on a lookup, so no two signatures share an entry.
enum Tag : int64_t { kNone = -1, kTensor = -2, kInt = -3, kDouble = -4, kBool = -5, kString = -6, kDevice = -7,
                     kList = -8, kGenerator = -9, kStorage = -10, kScalarInput = -11 };

PyObject* interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (o == nullptr) throw python_error();
  return o;  // kept for the process
}

bool value_words(const IValue& v, std::vector<int64_t>& w);

// A wrapped number's value (a Python number where the op takes a tensor, which Python gets back
// as that number): a double, int or bool; None for another dtype.
IValue wrapped_value(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kDouble:
      return IValue(*t.const_data_ptr<double>());
    case at::kLong:
      return IValue(*t.const_data_ptr<int64_t>());
    case at::kBool:
      return IValue(*t.const_data_ptr<bool>());
    default:
      return IValue();
  }
}

// The number `v` is as Python gets it: itself (a double, int or bool) or a wrapped number's value
// (not a tensor subclass's); None: not a number.
IValue as_number(const IValue& v) {
  if (v.isDouble() || v.isInt() || v.isBool()) return v;
  if (!v.isTensor() || !v.toTensor().defined()) return IValue();
  const TensorImpl* impl = v.toTensor().unsafeGetTensorImpl();
  if (!impl->is_wrapped_number() || impl->key_set().has(DispatchKey::Python)) return IValue();
  return wrapped_value(v.toTensor());
}

// A tensor: its dtype and sizes. A wrapped number: its value, as that number's words.
bool tensor_words(const at::Tensor& t, std::vector<int64_t>& w) {
  const TensorImpl* impl = t.unsafeGetTensorImpl();
  // a tensor subclass (a fake tensor on hpu reaches this kernel from its own dispatch), or sizes
  // that are symbolic or custom: Python reads them itself
  if (impl->key_set().has(DispatchKey::Python) || impl->has_symbolic_sizes_strides() || impl->is_nested()) return false;
  if (impl->is_wrapped_number()) {
    const IValue n = wrapped_value(t);
    return !n.isNone() && value_words(n, w);
  }
  w.push_back(kTensor);
  w.push_back(static_cast<int64_t>(t.scalar_type()));
  const auto sizes = t.sizes();
  w.push_back(static_cast<int64_t>(sizes.size()));
  w.insert(w.end(), sizes.begin(), sizes.end());
  return true;
}

// false: an argument the words cannot say exactly (a symbolic size, a complex number, a script
// object...): the call is not keyed, and the bridge computes its signature itself.
bool value_words(const IValue& v, std::vector<int64_t>& w) {
  if (v.isNone()) {
    w.push_back(kNone);
  } else if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      w.push_back(kNone);
    } else if (!tensor_words(t, w)) {
      return false;
    }
  } else if (v.isBool()) {
    w.push_back(kBool);
    w.push_back(v.toBool() ? 1 : 0);
  } else if (v.isInt()) {
    w.push_back(kInt);
    w.push_back(v.toInt());
  } else if (v.isDouble()) {
    const double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    w.push_back(kDouble);
    w.push_back(bits);
  } else if (v.isSymInt()) {
    const auto i = v.toSymInt().maybe_as_int();
    if (!i) return false;
    w.push_back(kInt);
    w.push_back(*i);
  } else if (v.isString()) {
    const std::string& str = v.toStringRef();
    w.push_back(kString);
    w.push_back(static_cast<int64_t>(str.size()));
    for (size_t at = 0; at < str.size(); at += sizeof(int64_t)) {
      int64_t chunk = 0;
      std::memcpy(&chunk, str.data() + at, std::min(sizeof chunk, str.size() - at));
      w.push_back(chunk);
    }
  } else if (v.isDevice()) {
    w.push_back(kDevice);
    w.push_back(static_cast<int64_t>(v.toDevice().type()));
    w.push_back(v.toDevice().index());
  } else if (v.isList()) {  // int, float, bool, tensor and optional-tensor lists alike
    const auto list = v.toListRef();
    w.push_back(kList);
    w.push_back(static_cast<int64_t>(list.size()));
    for (const IValue& x : list) {
      if (x.isList() || !value_words(x, w)) return false;
    }
  } else if (v.isGenerator()) {
    w.push_back(kGenerator);  // any generator: graph_key keeps its type, never its identity
  } else if (v.isStorage()) {
    w.push_back(kStorage);
    w.push_back(static_cast<int64_t>(v.toStorage().nbytes()));
  } else {
    return false;
  }
  return true;
}

// An op's scalar-input positions (OpEntry.value_free: where a Python number is a graph input in
// lazy mode, NOTE [scalars as graph inputs] in hpu_runtime/bridge/graph_key.py), as bits by
// argument index, learnt from its first entry; keyed like the words, by the op's schema.
std::unordered_map<const c10::FunctionSchema*, uint64_t> g_value_free;

// The number at a scalar-input position: its type and whether it is 1 (a value of 1 stays a
// constant where the unit is one), not its value. false: not a number.
bool scalar_input_words(const IValue& v, std::vector<int64_t>& w) {
  const IValue n = as_number(v);
  if (n.isNone()) return false;
  w.push_back(kScalarInput);
  w.push_back(n.isDouble() ? kDouble : n.isBool() ? kBool : kInt);
  w.push_back((n.isDouble() ? n.toDouble() == 1.0 : n.isBool() ? n.toBool() : n.toInt() == 1) ? 1 : 0);
  return true;
}

bool signature_words(const c10::OperatorHandle& op, const std::vector<IValue>& argv, const std::vector<bool>& passed,
                     std::vector<int64_t>& w) {
  const c10::FunctionSchema* schema = &op.schema();
  const auto known = g_value_free.find(schema);
  const uint64_t value_free = known == g_value_free.end() ? 0 : known->second;
  w.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(schema)));
  for (size_t i = 0; i < argv.size(); ++i) {
    if (!passed[i]) continue;
    w.push_back(static_cast<int64_t>(i));
    if (i < 64 && (value_free >> i & 1) && scalar_input_words(argv[i], w)) continue;
    if (!value_words(argv[i], w)) return false;
  }
  return true;
}

// Learn an op's scalar-input positions from its first entry (OpEntry.value_free, a tuple of
// argument indices); true when they were new, so the entry's words must be worked out again.
bool learn_value_free(const c10::OperatorHandle& op, PyObject* entry) {
  static PyObject* const name = interned("value_free");
  const c10::FunctionSchema* schema = &op.schema();
  if (g_value_free.count(schema) != 0) return false;
  py::object positions = py::reinterpret_steal<py::object>(PyObject_GetAttr(entry, name));
  if (!positions) throw python_error();
  uint64_t mask = 0;
  for (const auto& p : py::reinterpret_borrow<py::tuple>(positions)) {
    const auto i = p.cast<size_t>();
    if (i < 64) mask |= uint64_t{1} << i;
  }
  g_value_free.emplace(schema, mask);
  return mask != 0;
}

struct WordsHash {
  size_t operator()(const std::vector<int64_t>& w) const noexcept {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ w.size();
    for (int64_t x : w) {
      h ^= static_cast<uint64_t>(x) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

// signature words -> the bridge's entry for them (a new reference), under the GIL.
std::unordered_map<std::vector<int64_t>, PyObject*, WordsHash> g_entries;
PyTypeObject* g_entry_type = nullptr;
constexpr size_t kMaxEntries = size_t{1} << 16;  // new constants every step must not pile up

bool kernel_fits(PyObject* entry);

// Where a __slots__ attribute lives in its objects (a member descriptor's offset), read once: the
// kernel reads OpEntry's and StorageRef's slots on every op without a getattr.
Py_ssize_t slot_offset(PyTypeObject* type, const char* name) {
  py::object d = py::reinterpret_steal<py::object>(PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), name));
  if (!d) throw python_error();
  if (Py_TYPE(d.ptr()) != &PyMemberDescr_Type) {
    PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, name);
    throw python_error();
  }
  return reinterpret_cast<PyMemberDescrObject*>(d.ptr())->d_member->offset;
}

// The value of the slot at `offset` of `o` (borrowed); AttributeError if it was never set.
PyObject* slot(PyObject* o, Py_ssize_t offset, const char* name) {
  PyObject* v = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + offset);
  if (v == nullptr) {
    PyErr_Format(PyExc_AttributeError, "%s has no %s", Py_TYPE(o)->tp_name, name);
    throw python_error();
  }
  return v;
}

struct EntrySlots {
  Py_ssize_t before = 0, kernel_nbytes = 0, fast = 0;
};
EntrySlots g_entry_slots;

// Whether the before hook has anything to do for a kept entry (OpEntry.before: False once the
// bridge knows it checks nothing: no transfer, no factory size, no output bytes), or only the
// comparison of its output bytes with the free HBM, which the kernel makes itself (kernel_fits).
bool needs_before(PyObject* entry) {
  return slot(entry, g_entry_slots.before, "before") != Py_False && !kernel_fits(entry);
}

void clear_entries() {
  for (auto& kv : g_entries) Py_DECREF(kv.second);
  g_entries.clear();
}

// Every result aliases an argument and nothing is written: a view (detach, alias, t, expand...).
bool pure_view(const c10::FunctionSchema& schema) {
  if (schema.is_mutable() || schema.returns().empty()) return false;
  for (const auto& r : schema.returns())
    if (r.alias_info() == nullptr) return false;
  return true;
}

// ---- the HBM counters and the residency (NOTE [device residency and HBM] in
// hpu_runtime/device/residency.py) ----
// An HBM model's counters are an array('q') of kNumCounters int64s that Python reads and only
// these functions write, under the GIL: each call is atomic, so the HBM needs no lock. A
// residency's state is a tuple (refs, counters, StorageRef, on_free, oom): refs maps
// id(storage) -> StorageRef (a weakref.ref subclass with slots key, nbytes, serial), on_free
// is the weak references' callback (free_callback below), oom(nbytes) builds the
// out-of-memory error.
enum Counter : int { kCapacity, kLive, kPeak, kAllocs, kFrees, kActive, kMaxAlloc, kNextSerial, kNumCounters };

struct Counters {
  Py_buffer view{};
  int64_t* c = nullptr;
  explicit Counters(PyObject* arr) {
    if (PyObject_GetBuffer(arr, &view, PyBUF_WRITABLE | PyBUF_FORMAT) != 0) throw python_error();
    if (view.itemsize != 8 || view.len != kNumCounters * 8 || view.format == nullptr ||
        std::strcmp(view.format, "q") != 0) {
      PyBuffer_Release(&view);
      PyErr_Format(PyExc_TypeError, "HBM counters must be an array('q') of %d items", static_cast<int>(kNumCounters));
      throw python_error();
    }
    c = static_cast<int64_t*>(view.buf);
  }
  Counters(const Counters&) = delete;
  Counters& operator=(const Counters&) = delete;
  ~Counters() { PyBuffer_Release(&view); }
  int64_t& operator[](Counter i) { return c[i]; }
};

// Raise the error oom(nbytes) builds (HPUOutOfMemoryError, naming the request and the HBM).
[[noreturn]] void raise_oom(PyObject* oom, int64_t nbytes) {
  py::object n = py::reinterpret_steal<py::object>(PyLong_FromLongLong(nbytes));
  if (!n) throw python_error();
  PyObject* e = PyObject_CallOneArg(oom, n.ptr());
  if (e == nullptr) throw python_error();
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e)), e);
  Py_DECREF(e);
  throw python_error();
}

void hbm_allocate(Counters& c, int64_t nbytes, PyObject* oom) {
  if (c[kLive] + nbytes > c[kCapacity]) raise_oom(oom, nbytes);
  c[kLive] += nbytes;
  ++c[kAllocs];
  ++c[kActive];
  c[kMaxAlloc] = std::max(c[kMaxAlloc], nbytes);
  c[kPeak] = std::max(c[kPeak], c[kLive]);
}

void hbm_free(Counters& c, int64_t nbytes) {
  c[kLive] -= nbytes;
  ++c[kFrees];
  --c[kActive];
}

int64_t as_int64(PyObject* v) {
  const int64_t n = PyLong_AsLongLong(v);
  if (n == -1 && PyErr_Occurred()) throw python_error();
  return n;
}

bool check_nargs(const char* name, Py_ssize_t nargs, Py_ssize_t want) {
  if (nargs == want) return true;
  PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, want, nargs);
  return false;
}

bool is_str(PyObject* o, const char* s) { return PyUnicode_Check(o) && PyUnicode_CompareWithASCIIString(o, s) == 0; }

// hbm(counters, what, nbytes, extra), what being
//   "check": raise the error extra(nbytes) builds if nbytes more would not fit (HBMModel.check_alloc);
//   "allocate": that check, then account the allocation (HBMModel.allocate);
//   "free": account a release; ValueError naming extra (the device) if more than is live;
//   "reset_peak": the peak to the live bytes; "reset_accumulated": the allocation and free
//   counts to zero (nbytes and extra unused).
PyObject* hbm_py(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!check_nargs("hbm", nargs, 4)) return nullptr;
  Counters c(argv[0]);
  PyObject* what = argv[1];
  const int64_t nbytes = as_int64(argv[2]);
  if (is_str(what, "check")) {
    if (c[kLive] + nbytes > c[kCapacity]) raise_oom(argv[3], nbytes);
  } else if (is_str(what, "allocate")) {
    hbm_allocate(c, nbytes, argv[3]);
  } else if (is_str(what, "free")) {
    if (nbytes > c[kLive]) {
      PyErr_Format(PyExc_ValueError, "%S: freeing %lld bytes but only %lld are live", argv[3],
                   static_cast<long long>(nbytes), static_cast<long long>(c[kLive]));
      return nullptr;
    }
    hbm_free(c, nbytes);
  } else if (is_str(what, "reset_peak")) {
    c[kPeak] = c[kLive];
  } else if (is_str(what, "reset_accumulated")) {
    c[kAllocs] = c[kFrees] = 0;
  } else {
    PyErr_Format(PyExc_ValueError, "hbm: unknown update %R", what);
    return nullptr;
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

struct ResidencyState {
  PyObject* refs;
  PyObject* counters;
  PyObject* ref_type;
  PyObject* on_free;
  PyObject* oom;
};

ResidencyState residency_state(PyObject* state) {
  if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 5 || !PyDict_Check(PyTuple_GET_ITEM(state, 0))) {
    PyErr_SetString(PyExc_TypeError, "a residency's state is (refs: dict, counters, StorageRef, on_free, oom)");
    throw python_error();
  }
  return {PyTuple_GET_ITEM(state, 0), PyTuple_GET_ITEM(state, 1), PyTuple_GET_ITEM(state, 2),
          PyTuple_GET_ITEM(state, 3), PyTuple_GET_ITEM(state, 4)};
}

void set_attr(PyObject* o, PyObject* name, PyObject* v) {
  const int rc = v == nullptr ? -1 : PyObject_SetAttr(o, name, v);
  Py_XDECREF(v);
  if (rc != 0) throw python_error();
}

// A new int (a C++ exception if Python could not make one).
PyObject* new_int(int64_t v) {
  PyObject* o = PyLong_FromLongLong(v);
  if (o == nullptr) throw python_error();
  return o;
}

// A tuple of `n` items, item i made by make(i) (a new reference each; if one throws, the
// tuple goes with the items made so far).
template <class Make>
py::tuple tuple_of(size_t n, Make make) {
  py::tuple t = py::reinterpret_steal<py::tuple>(PyTuple_New(static_cast<Py_ssize_t>(n)));
  if (!t) throw python_error();
  for (size_t i = 0; i < n; ++i) PyTuple_SET_ITEM(t.ptr(), static_cast<Py_ssize_t>(i), make(i));
  return t;
}

// Where StorageRef keeps key, nbytes and serial (its __slots__), read once per type.
struct RefSlots {
  PyTypeObject* type = nullptr;
  Py_ssize_t key = 0, nbytes = 0, serial = 0;
  bool plain_init = false;  // the type's __init__ is weakref.ref's own (which only checks its arguments)
};

const RefSlots& ref_slots(PyObject* ref_type) {
  static RefSlots s;
  auto* type = reinterpret_cast<PyTypeObject*>(ref_type);
  if (s.type != type) {
    RefSlots n;
    n.key = slot_offset(type, "key");
    n.nbytes = slot_offset(type, "nbytes");
    n.serial = slot_offset(type, "serial");
    n.plain_init = PyType_Check(ref_type) && PyType_IsSubtype(type, &_PyWeakref_RefType) &&
                   type->tp_init == _PyWeakref_RefType.tp_init;
    n.type = type;
    Py_INCREF(ref_type);  // held while cached: its address cannot name another type meanwhile
    Py_XDECREF(reinterpret_cast<PyObject*>(s.type));
    s = n;
  }
  return s;
}

// Set a fresh object's slot (it holds nothing yet) to `v`, a new reference.
void set_slot(PyObject* o, Py_ssize_t offset, PyObject* v) {
  if (v == nullptr) throw python_error();
  PyObject** p = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + offset);
  PyObject* old = *p;
  *p = v;
  Py_XDECREF(old);
}

// The StorageRef of `storage` (a Python storage: weak-referenceable, with nbytes()), made
// resident unless it is: its bytes allocated on the HBM (HPUOutOfMemoryError if they do not
// fit: nothing changes then), the next serial, a weak reference whose callback frees them.
// `nbytes`: the storage's bytes when the caller knows them, else -1 (storage.nbytes() says).
py::object register_storage(const ResidencyState& r, PyObject* storage, PyObject* key, int64_t nbytes = -1) {
  static PyObject* const nbytes_name = interned("nbytes");
  PyObject* found = PyDict_GetItemWithError(r.refs, key);
  if (found != nullptr) return py::reinterpret_borrow<py::object>(found);
  if (PyErr_Occurred()) throw python_error();
  if (nbytes < 0) {
    py::object n = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(storage, nbytes_name));
    if (!n) throw python_error();
    nbytes = as_int64(n.ptr());
  }
  const RefSlots& slots = ref_slots(r.ref_type);
  Counters c(r.counters);
  hbm_allocate(c, nbytes, r.oom);
  py::object ref;
  if (slots.plain_init) {  // the weak reference made by the type's __new__ alone, as calling it would
    py::object args = py::reinterpret_steal<py::object>(PyTuple_Pack(2, storage, r.on_free));
    if (!args) throw python_error();
    ref = py::reinterpret_steal<py::object>(slots.type->tp_new(slots.type, args.ptr(), nullptr));
  } else {
    ref = py::reinterpret_steal<py::object>(PyObject_CallFunctionObjArgs(r.ref_type, storage, r.on_free, nullptr));
  }
  if (!ref) {
    hbm_free(c, nbytes);
    throw python_error();
  }
  set_slot(ref.ptr(), slots.key, Py_NewRef(key));
  set_slot(ref.ptr(), slots.nbytes, PyLong_FromLongLong(nbytes));
  set_slot(ref.ptr(), slots.serial, PyLong_FromLongLong(c[kNextSerial]++));
  if (PyDict_SetItem(r.refs, key, ref.ptr()) != 0) throw python_error();
  return ref;
}

// residency_register(state, storage) -> StorageRef (Residency.register).
PyObject* residency_register_py(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!check_nargs("residency_register", nargs, 2)) return nullptr;
  const ResidencyState r = residency_state(argv[0]);
  py::object key = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(argv[1]));
  if (!key) return nullptr;
  return register_storage(r, argv[1], key.ptr()).release().ptr();
  END_HANDLE_TH_ERRORS
}

// The weak references' callback: a storage died; if its ref is still the one in refs, forget
// it and free its bytes. self: (refs, counters).
PyObject* free_callback(PyObject* self, PyObject* ref) {
  static PyObject* const key_name = interned("key");
  static PyObject* const nbytes_name = interned("nbytes");
  HANDLE_TH_ERRORS
  PyObject* refs = PyTuple_GET_ITEM(self, 0);
  py::object key = py::reinterpret_steal<py::object>(PyObject_GetAttr(ref, key_name));
  if (!key) return nullptr;
  PyObject* found = PyDict_GetItemWithError(refs, key.ptr());
  if (found == nullptr && PyErr_Occurred()) return nullptr;
  if (found == ref) {
    py::object n = py::reinterpret_steal<py::object>(PyObject_GetAttr(ref, nbytes_name));
    if (!n) return nullptr;
    const int64_t nbytes = as_int64(n.ptr());
    if (PyDict_DelItem(refs, key.ptr()) != 0) return nullptr;
    Counters c(PyTuple_GET_ITEM(self, 1));
    if (nbytes <= c[kLive]) hbm_free(c, nbytes);
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef g_free_callback_def = {"free_callback", &free_callback, METH_O,
                                   "A resident storage died: free its HBM bytes (hpu_runtime.device.residency)."};

// residency_on_free(refs, counters) -> the weak references' callback for a residency.
PyObject* residency_on_free_py(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!check_nargs("residency_on_free", nargs, 2)) return nullptr;
  if (!PyDict_Check(argv[0])) {
    PyErr_SetString(PyExc_TypeError, "residency_on_free: refs must be a dict");
    return nullptr;
  }
  { Counters check(argv[1]); }
  py::tuple self = py::make_tuple(py::handle(argv[0]), py::handle(argv[1]));
  return PyCFunction_New(&g_free_callback_def, self.ptr());
  END_HANDLE_TH_ERRORS
}

// The current device's HBM counters (hpu_sim_set_hbm), for the kernel's own check of a kept
// entry's output bytes (kernel_fits below); None: none published.
PyObject* g_hbm = nullptr;

// Whether a kept entry's only check before the op is its output bytes (OpEntry.kernel_nbytes, an
// int: no transfer, no factory size) and they fit in the current device's free HBM. When they do
// not, the before hook runs and raises HPUOutOfMemoryError as it would have.
bool kernel_fits(PyObject* entry) {
  if (g_hbm == nullptr) return false;
  PyObject* v = slot(entry, g_entry_slots.kernel_nbytes, "kernel_nbytes");
  if (v == Py_None) return false;
  const int64_t nbytes = as_int64(v);
  Counters c(g_hbm);
  return nbytes <= c[kCapacity] - c[kLive];
}

// ---- an op record's storages (NOTE [an op's storages, in the kernel library] in
// hpu_runtime/bridge/op_accounting.py) ----
// storage_io(state, args, kwargs, out, allocates, low, saves_in, saves_out) -> (reads, writes,
// saves), or None when the op reads and writes nothing on the device; state: the residency's. A
// builtin function (METH_FASTCALL) that the op record calls from Python, for live and traced ops
// alike.
struct StorageIo {
  ResidencyState r;
  bool low;
  c10::SmallVector<std::pair<int64_t, int64_t>, 4> reads;  // (serial, charged bytes) of each resident argument
  c10::SmallVector<int64_t, 4> serials;                    // every tensor argument's serial, -1: not resident
  c10::SmallVector<bool, 4> grads;                         // and whether it requires grad
};

int64_t charged_nbytes(const at::Tensor& t, bool low) {  // as cost_model.charged_nbytes
  if (low && t.scalar_type() == at::kFloat) return t.numel() * 2;
  return t.numel() * static_cast<int64_t>(t.element_size());
}

// The storage of `t` as Python sees it (t.untyped_storage()), and its StorageRef if resident
// (registering an hpu storage the bridge has not seen made, when `reg`).
py::object storage_ref(const at::Tensor& t, const ResidencyState& r, bool reg) {
  TORCH_CHECK_NOT_IMPLEMENTED(t.has_storage(), "the bridge cannot account a tensor without storage");
  py::object st = py::reinterpret_steal<py::object>(THPStorage_Wrap(t.storage()));
  if (!st) throw python_error();
  py::object key = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(st.ptr()));
  if (!key) throw python_error();
  if (reg) return register_storage(r, st.ptr(), key.ptr(), static_cast<int64_t>(t.storage().nbytes()));
  PyObject* ref = PyDict_GetItemWithError(r.refs, key.ptr());
  if (ref != nullptr) return py::reinterpret_borrow<py::object>(ref);
  if (PyErr_Occurred()) throw python_error();
  return py::object();
}

int64_t serial_of(const py::object& ref) {
  if (!ref) return -1;
  static PyTypeObject* type = nullptr;  // StorageRef, whose slot `serial` the kernel reads
  static Py_ssize_t offset = 0;
  if (Py_TYPE(ref.ptr()) != type) {
    offset = slot_offset(Py_TYPE(ref.ptr()), "serial");
    Py_INCREF(Py_TYPE(ref.ptr()));  // held while cached, as ref_slots holds its type
    Py_XDECREF(reinterpret_cast<PyObject*>(type));
    type = Py_TYPE(ref.ptr());
  }
  return as_int64(slot(ref.ptr(), offset, "serial"));
}
void read_tensor(StorageIo& io, const at::Tensor& t) {
  const bool on_host = t.is_cpu();
  const py::object ref = storage_ref(t, io.r, !on_host);
  const int64_t serial = serial_of(ref);
  io.serials.push_back(serial);
  io.grads.push_back(t.requires_grad());
  if (ref) io.reads.emplace_back(serial, charged_nbytes(t, io.low));
}


// f(item) for each item of `v` if it is a list or tuple, else f(v).
template <class F>
void each_item(PyObject* v, F f) {
  if (PyList_Check(v)) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); ++i) f(PyList_GET_ITEM(v, i));
  } else if (PyTuple_Check(v)) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); ++i) f(PyTuple_GET_ITEM(v, i));
  } else {
    f(v);
  }
}

// The serials of the resident arguments autograd keeps (op_accounting.AUTOGRAD_SAVES).
c10::SmallVector<int64_t, 4> saved_arguments(PyObject* pattern, const StorageIo& io) {
  c10::SmallVector<int64_t, 4> kept;
  const auto& s = io.serials;
  if (is_str(pattern, "all")) {
    for (int64_t x : s)
      if (x >= 0) kept.push_back(x);
  } else if (is_str(pattern, "mul") || is_str(pattern, "div")) {
    if (s.size() >= 2) {
      if (io.grads[0] && s[1] >= 0) kept.push_back(s[1]);
      if (is_str(pattern, "mul") && io.grads[1] && s[0] >= 0) kept.push_back(s[0]);
    }
  } else {
    py::tuple positions = py::reinterpret_borrow<py::tuple>(pattern);
    for (const auto& p : positions) {
      const auto i = p.cast<size_t>();
      if (i < s.size() && s[i] >= 0) kept.push_back(s[i]);
    }
  }
  return kept;
}

bool in_pattern(PyObject* pattern, Py_ssize_t k) {  // saves_out: "all" or positions
  if (is_str(pattern, "all")) return true;
  if (!PyTuple_Check(pattern)) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pattern); ++i)
    if (PyLong_AsSsize_t(PyTuple_GET_ITEM(pattern, i)) == k) return true;
  return false;
}

// An op's storages as an op record holds them (OpRecord.reads, .writes, .saves).
struct OpIo {
  py::tuple reads, writes, saves;
};

struct Write {
  int64_t serial, nbytes;
  bool allocates, kept;
};

// The same storages as plain values, before any Python object is made for them (io_tuples
// makes them): what a deferred record keeps (NOTE [records made when read] in
// hpu_runtime/bridge/launcher.py).
struct OpData {
  c10::SmallVector<std::pair<int64_t, int64_t>, 4> reads;  // (serial, charged bytes)
  c10::SmallVector<Write, 2> writes;
  c10::SmallVector<int64_t, 4> saves;  // the serials autograd keeps
  bool none = false;
};

// The op's storages: `each_arg(f)` calls f on each tensor argument as Python gets them
// (positional, then keyword), `each_out(f)` on each tensor result (storage_io below, from
// Python objects; fast_record, from the kernel's own values).
template <class EachArg, class EachOut>
OpData op_data(const ResidencyState& r, EachArg each_arg, EachOut each_out, bool allocates, bool low,
               PyObject* saves_in, PyObject* saves_out_pattern) {
  StorageIo io{r, low, {}, {}, {}};
  each_arg([&](const at::Tensor& t) { read_tensor(io, t); });
  bool rg = false;
  for (bool g : io.grads) rg = rg || g;
  rg = rg && at::GradMode::is_enabled();
  PyObject* saves_out = rg ? saves_out_pattern : nullptr;
  OpData out;
  Py_ssize_t k = -1;
  each_out([&](const at::Tensor& t) {
    ++k;
    if (t.is_cpu()) return;  // a host result
    const py::object ref = storage_ref(t, r, allocates);
    const bool kept = saves_out != nullptr && in_pattern(saves_out, k);
    out.writes.push_back({serial_of(ref), charged_nbytes(t, low), allocates, kept});
  });
  if (io.reads.empty() && out.writes.empty()) {
    out.none = true;
    return out;
  }
  out.reads = std::move(io.reads);
  if (rg) out.saves = saved_arguments(saves_in, io);
  return out;
}

// The record's tuples of `d` (not none), each made at its final size.
OpIo io_tuples(const OpData& d) {
  OpIo out;
  out.reads = tuple_of(d.reads.size(), [&](size_t i) {  // (serial, nbytes)
    const auto& [serial, nbytes] = d.reads[i];
    return tuple_of(2, [&](size_t j) { return new_int(j == 0 ? serial : nbytes); }).release().ptr();
  });
  out.writes = tuple_of(d.writes.size(), [&](size_t i) {  // (serial, nbytes, allocates, kept)
    const Write& w = d.writes[i];
    return tuple_of(4, [&](size_t j) {
             if (j < 2) return new_int(j == 0 ? w.serial : w.nbytes);
             return Py_NewRef((j == 2 ? w.allocates : w.kept) ? Py_True : Py_False);
           })
        .release()
        .ptr();
  });
  out.saves = tuple_of(d.saves.size(), [&](size_t i) { return new_int(d.saves[i]); });
  return out;
}

// op_data from Python objects: the op's `args` and `kwargs`, its result(s) `out`.
OpData op_data(const ResidencyState& r, PyObject* args, PyObject* kwargs, PyObject* out, bool allocates, bool low,
               PyObject* saves_in, PyObject* saves_out_pattern) {
  auto tensors_of = [](PyObject* v, auto f) {
    each_item(v, [&](PyObject* a) {
      if (THPVariable_Check(a)) f(THPVariable_Unpack(a));
    });
  };
  auto each_arg = [&](auto f) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i) tensors_of(PyTuple_GET_ITEM(args, i), f);
    if (kwargs != Py_None) {
      Py_ssize_t pos = 0;
      PyObject *k, *v;
      while (PyDict_Next(kwargs, &pos, &k, &v)) tensors_of(v, f);
    }
  };
  // the tensors among the results, as op_accounting.out_tensors
  auto each_out = [&](auto f) { tensors_of(out, f); };
  return op_data(r, each_arg, each_out, allocates, low, saves_in, saves_out_pattern);
}

// A tensor Python gets as a tensor (a wrapped number reaches it as a number).
bool python_tensor(const IValue& v) {
  return v.isTensor() && v.toTensor().defined() && !v.toTensor().unsafeGetTensorImpl()->is_wrapped_number();
}

// f on v's tensors as Python gets them: v itself, or a list's items.
template <class F>
void ivalue_tensors(const IValue& v, F f) {
  if (python_tensor(v)) {
    f(v.toTensor());
  } else if (v.isList()) {
    for (const IValue& x : v.toListRef())
      if (python_tensor(x)) f(x.toTensor());
  }
}

// op_data from the kernel's own values: the passed arguments `argv` and the `nret` results at
// the end of `stack` (Python gets one result as itself, a list's items included, and several as
// a tuple whose tensors count, not its lists' items).
OpData op_data(const ResidencyState& r, const std::vector<IValue>& argv, const std::vector<bool>& passed,
               const torch::jit::Stack& stack, size_t nret, bool allocates, bool low, PyObject* saves_in,
               PyObject* saves_out_pattern) {
  auto each_arg = [&](auto f) {
    for (size_t i = 0; i < argv.size(); ++i)
      if (passed[i]) ivalue_tensors(argv[i], f);
  };
  auto each_out = [&](auto f) {
    for (size_t j = stack.size() - nret; j < stack.size(); ++j) {
      if (nret == 1) {
        ivalue_tensors(stack[j], f);
      } else if (python_tensor(stack[j])) {
        f(stack[j].toTensor());
      }
    }
  };
  return op_data(r, each_arg, each_out, allocates, low, saves_in, saves_out_pattern);
}

PyObject* storage_io(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!check_nargs("storage_io", nargs, 8)) return nullptr;
  PyObject *args = argv[1], *kwargs = argv[2];
  if (!PyTuple_Check(args) || (kwargs != Py_None && !PyDict_Check(kwargs))) {
    PyErr_SetString(PyExc_TypeError, "storage_io: args must be a tuple, kwargs a dict or None");
    return nullptr;
  }
  const OpData d = op_data(residency_state(argv[0]), args, kwargs, argv[3], argv[4] == Py_True, argv[5] == Py_True,
                           argv[6], argv[7]);
  if (d.none) Py_RETURN_NONE;
  const OpIo io = io_tuples(d);
  return PyTuple_Pack(3, io.reads.ptr(), io.writes.ptr(), io.saves.ptr());
  END_HANDLE_TH_ERRORS
}

// ---- the pending graph (hpu_runtime/bridge/launcher.py) ----
// An attribute name, interned once per place it is used.
#define NAME(s)                                       \
  ([] {                                               \
    static PyObject* const interned_name = interned(s); \
    return interned_name;                             \
  }())

py::object get(PyObject* o, PyObject* name) {
  py::object v = py::reinterpret_steal<py::object>(PyObject_GetAttr(o, name));
  if (!v) throw python_error();
  return v;
}

void append(PyObject* list, PyObject* item) {
  if (PyList_Append(list, item) != 0) throw python_error();
}


// An object's plain attributes (the pending graph's, the card's, the accounting's), read and
// written in its instance dict: no getattr per access. hpu_sim_set_device checks that the
// class defines none of the names the kernel uses (no property could hide behind the dict).
struct Attrs {
  py::object obj, dict;
  explicit Attrs(PyObject* o) : obj(py::reinterpret_borrow<py::object>(o)) {
    dict = py::reinterpret_steal<py::object>(PyObject_GenericGetDict(o, nullptr));
    if (!dict) throw python_error();
  }
  PyObject* operator[](PyObject* name) const {  // borrowed
    PyObject* v = PyDict_GetItemWithError(dict.ptr(), name);
    if (v == nullptr) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_AttributeError, "%s has no attribute %U", Py_TYPE(obj.ptr())->tp_name, name);
      throw python_error();
    }
    return v;
  }
  void set(PyObject* name, PyObject* v) const {
    if (PyDict_SetItem(dict.ptr(), name, v) != 0) throw python_error();
  }
  void add(PyObject* name, PyObject* by) const {  // x += by (Python ints)
    py::object v = py::reinterpret_steal<py::object>(PyNumber_Add((*this)[name], by));
    if (!v) throw python_error();
    set(name, v.ptr());
  }
};

// ---- the pending graph's records, made when read (NOTE [records made when read] in
// hpu_runtime/bridge/launcher.py) ----
// OpRecord(mk, cost, reads, writes, saves) of `type` (a tuple subclass): its items set in place.
py::object make_record(PyObject* type, PyObject* mk, PyObject* cost, const OpData& d) {
  OpIo io = io_tuples(d);
  PyTypeObject* record_type = reinterpret_cast<PyTypeObject*>(type);
  py::object op = py::reinterpret_steal<py::object>(record_type->tp_alloc(record_type, 5));
  if (!op) throw python_error();
  PyObject* const items[5] = {Py_NewRef(mk), Py_NewRef(cost), io.reads.release().ptr(), io.writes.release().ptr(),
                              io.saves.release().ptr()};
  for (Py_ssize_t i = 0; i < 5; ++i) PyTuple_SET_ITEM(op.ptr(), i, items[i]);
  return op;
}

// One op of the pending graph: its record, or what makes it (mk, cost, storages).
struct PendingEntry {
  PyObject* made = nullptr;  // the record (a reference), or null until it is read
  PyObject* mk = nullptr;    // references while `made` is null
  PyObject* cost = nullptr;
  OpData data;
};

// Launcher._ops: a sequence of OpRecord (len, [i], [i:j], iteration, append) whose records
// the kernel adds as values and makes at their first read.
struct PendingOpsObject {
  PyObject_HEAD
  std::vector<PendingEntry>* entries;
  PyObject* record_type;  // the OpRecord type of the entries not made yet (a reference), or null
};

PyTypeObject* g_pending_ops_type = nullptr;

PyObject* pending_ops_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  if (PyTuple_GET_SIZE(args) != 0 || (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0)) {
    PyErr_SetString(PyExc_TypeError, "PendingOps() takes no arguments");
    return nullptr;
  }
  auto* self = reinterpret_cast<PendingOpsObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->entries = new (std::nothrow) std::vector<PendingEntry>();
  self->record_type = nullptr;
  if (self->entries == nullptr) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return reinterpret_cast<PyObject*>(self);
}

// The record at `i` (in range), made now if it was not: borrowed.
PyObject* pending_ops_at(PendingOpsObject* self, size_t i) {
  PendingEntry& e = (*self->entries)[i];
  if (e.made == nullptr) {
    e.made = make_record(self->record_type, e.mk, e.cost, e.data).release().ptr();
    Py_CLEAR(e.mk);
    Py_CLEAR(e.cost);
    e.data = OpData();
  }
  return e.made;
}

Py_ssize_t pending_ops_len(PyObject* o) {
  return static_cast<Py_ssize_t>(reinterpret_cast<PendingOpsObject*>(o)->entries->size());
}

PyObject* pending_ops_item(PyObject* o, Py_ssize_t i) {
  HANDLE_TH_ERRORS
  auto* self = reinterpret_cast<PendingOpsObject*>(o);
  if (i < 0 || static_cast<size_t>(i) >= self->entries->size()) {
    PyErr_SetString(PyExc_IndexError, "PendingOps index out of range");
    return nullptr;
  }
  return Py_NewRef(pending_ops_at(self, static_cast<size_t>(i)));
  END_HANDLE_TH_ERRORS
}

PyObject* pending_ops_subscript(PyObject* o, PyObject* key) {
  HANDLE_TH_ERRORS
  auto* self = reinterpret_cast<PendingOpsObject*>(o);
  const Py_ssize_t n = static_cast<Py_ssize_t>(self->entries->size());
  if (PyIndex_Check(key)) {
    Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred()) return nullptr;
    return pending_ops_item(o, i < 0 ? i + n : i);
  }
  if (!PySlice_Check(key)) {
    PyErr_Format(PyExc_TypeError, "PendingOps indices must be integers or slices, not %.200s", Py_TYPE(key)->tp_name);
    return nullptr;
  }
  Py_ssize_t start, stop, step;
  if (PySlice_Unpack(key, &start, &stop, &step) < 0) return nullptr;
  const Py_ssize_t len = PySlice_AdjustIndices(n, &start, &stop, step);
  py::list out(len);
  for (Py_ssize_t k = 0, i = start; k < len; ++k, i += step)
    PyList_SET_ITEM(out.ptr(), k, Py_NewRef(pending_ops_at(self, static_cast<size_t>(i))));
  return out.release().ptr();
  END_HANDLE_TH_ERRORS
}

constexpr size_t kPendingReserve = 64;  // entries held from the first push (a graph's ops, most often)

// A new, empty entry at the end.
PendingEntry& pending_ops_add(PendingOpsObject* self) {
  if (self->entries->capacity() == 0) self->entries->reserve(kPendingReserve);
  return self->entries->emplace_back();
}

void pending_ops_push(PendingOpsObject* self, PyObject* op) { pending_ops_add(self).made = Py_NewRef(op); }

PyObject* pending_ops_append(PyObject* o, PyObject* op) {
  HANDLE_TH_ERRORS
  pending_ops_push(reinterpret_cast<PendingOpsObject*>(o), op);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// Empty it in place, keeping its capacity (Launcher.launch and eager_launch, once a graph is
// launched).
void pending_ops_empty(PendingOpsObject* self) {
  c10::SmallVector<PyObject*, 3 * kPendingReserve> refs;
  for (const PendingEntry& e : *self->entries)
    for (PyObject* r : {e.made, e.mk, e.cost})
      if (r != nullptr) refs.push_back(r);
  self->entries->clear();  // emptied before any release can run Python code
  for (PyObject* r : refs) Py_DECREF(r);
}

void pending_ops_dealloc(PyObject* o) {
  auto* self = reinterpret_cast<PendingOpsObject*>(o);
  if (self->entries != nullptr) {
    pending_ops_empty(self);
    delete self->entries;
  }
  Py_XDECREF(self->record_type);
  PyTypeObject* type = Py_TYPE(o);
  type->tp_free(o);
  Py_DECREF(type);  // a heap type: its instances hold it
}

PyObject* pending_ops_clear(PyObject* o, PyObject*) {
  pending_ops_empty(reinterpret_cast<PendingOpsObject*>(o));
  Py_RETURN_NONE;
}

PyObject* pending_ops_repr(PyObject* o) {
  return PyUnicode_FromFormat("<PendingOps of %zd ops>", pending_ops_len(o));
}

PyObject* pending_ops_values_held(PyObject* o, PyObject*) {
  auto* self = reinterpret_cast<PendingOpsObject*>(o);
  Py_ssize_t n = 0;
  for (const PendingEntry& e : *self->entries) n += e.made == nullptr;
  return PyLong_FromSsize_t(n);
}

PyMethodDef g_pending_ops_methods[] = {
    {"append", &pending_ops_append, METH_O, "Add a record at the end."},
    {"clear", &pending_ops_clear, METH_NOARGS, "Remove every record (the capacity is kept)."},
    {"values_held", &pending_ops_values_held, METH_NOARGS, "How many records are held as values, not made yet."},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot g_pending_ops_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(&pending_ops_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(&pending_ops_dealloc)},
    {Py_tp_repr, reinterpret_cast<void*>(&pending_ops_repr)},
    {Py_tp_methods, g_pending_ops_methods},
    {Py_sq_length, reinterpret_cast<void*>(&pending_ops_len)},
    {Py_sq_item, reinterpret_cast<void*>(&pending_ops_item)},
    {Py_mp_length, reinterpret_cast<void*>(&pending_ops_len)},
    {Py_mp_subscript, reinterpret_cast<void*>(&pending_ops_subscript)},
    {Py_tp_doc, const_cast<char*>("The pending graph's op records, in issue order: a sequence whose records the hpu "
                                  "kernel adds as plain values and makes when first read.")},
    {0, nullptr}};

PyType_Spec g_pending_ops_spec = {"hpu_runtime.PendingOps", sizeof(PendingOpsObject), 0, Py_TPFLAGS_DEFAULT,
                                  g_pending_ops_slots};

// An op record not made yet (fast_record): its graph-key entry, cost, storages, OpRecord type.
struct Deferred {
  PyObject* mk;
  PyObject* cost;
  OpData& data;
  PyObject* type;
};

// Launcher.append_op without its launches: one op record joins the pending graph (its
// dependency on a collective's output, its log event, the op count, the host's time per op);
// returns 1 when eager mode launches it at once, 2 when the graph reached
// PT_HPU_MAX_COMPOUND_OP_SIZE, else 0. The record is `op`, or, when `op` is null, the one
// `later` describes: made now if the graph's dependency or log needs it (or _ops is not a
// PendingOps of its type), else kept as values in _ops until read.
int launcher_append(const Attrs& l, const Attrs& card, PyObject* op, const Deferred* later = nullptr) {
  static PyObject* const one = PyLong_FromLong(1);
  PyObject* ops = l[NAME("_ops")];
  auto* deferred_to = Py_TYPE(ops) == g_pending_ops_type ? reinterpret_cast<PendingOpsObject*>(ops) : nullptr;
  const bool has_deps = PyDict_GET_SIZE(card[NAME("ready_after")]) > 0;
  PyObject* log = l[NAME("log")];
  py::object made;
  if (op == nullptr && (has_deps || log != Py_None || deferred_to == nullptr ||
                        (deferred_to->record_type != nullptr && deferred_to->record_type != later->type))) {
    made = make_record(later->type, later->mk, later->cost, later->data);
    op = made.ptr();
  }
  if (has_deps) {
    static PyObject* const dependency_ns = interned("dependency_ns");
    py::object dep = py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(card.obj.ptr(), dependency_ns, op));
    if (!dep) throw python_error();
    const int later_dep = PyObject_RichCompareBool(dep.ptr(), l[NAME("_dep_ns")], Py_GT);
    if (later_dep < 0) throw python_error();
    if (later_dep) l.set(NAME("_dep_ns"), dep.ptr());
  }
  if (log != Py_None) {
    py::object event = py::make_tuple("op", py::handle(op));
    append(log, event.ptr());
  }
  l.add(NAME("ops_recorded"), one);
  PyObject* pending = l[NAME("pending")];
  const bool no_region = l[NAME("region")] == Py_None;
  const int lazy = PyObject_IsTrue(l[NAME("lazy")]);
  if (lazy < 0) throw python_error();
  const bool accumulate = lazy || !no_region;
  if (PyList_GET_SIZE(pending) == 0) l.set(NAME("_host_start"), card[NAME("host_ns")]);
  card.add(NAME("host_ns"), l[accumulate ? NAME("_op_host_ns") : NAME("_eager_ns")]);
  append(pending, op != nullptr ? PyTuple_GET_ITEM(op, 1) : later->cost);
  append(l[NAME("_keys")], op != nullptr ? PyTuple_GET_ITEM(op, 0) : later->mk);
  if (op == nullptr) {  // kept as values (NOTE [records made when read])
    if (deferred_to->record_type == nullptr) deferred_to->record_type = Py_NewRef(later->type);
    PendingEntry& e = pending_ops_add(deferred_to);
    e.mk = Py_NewRef(later->mk);
    e.cost = Py_NewRef(later->cost);
    e.data = std::move(later->data);
  } else if (deferred_to != nullptr) {
    pending_ops_push(deferred_to, op);
  } else {
    append(ops, op);
  }
  if (!accumulate) return 1;
  const Py_ssize_t most = PyLong_AsSsize_t(l[NAME("max_compound_ops")]);
  if (most == -1 && PyErr_Occurred()) throw python_error();
  return most > 0 && no_region && PyList_GET_SIZE(pending) >= most ? 2 : 0;
}

// A lock taken without waiting (lock.acquire(False)) and released at the end of the scope: the
// kernel never blocks on a Python lock while it holds the GIL and the device's lock; a lock
// another thread holds sends the caller back to the Python code, which waits for it.
struct TryLock {
  PyObject* lock;
  bool held = false;
  explicit TryLock(PyObject* l) : lock(l) {
    static PyObject* const acquire = interned("acquire");
    py::object r = py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(lock, acquire, Py_False));
    if (!r) throw python_error();
    held = r.ptr() == Py_True;
  }
  TryLock(const TryLock&) = delete;
  TryLock& operator=(const TryLock&) = delete;
  ~TryLock() {
    if (!held) return;
    static PyObject* const release = interned("release");
    PyObject* r = PyObject_CallMethodNoArgs(lock, release);
    if (r == nullptr) {
      PyErr_WriteUnraisable(lock);
    } else {
      Py_DECREF(r);
    }
  }
};

// The class a module defines, looked up once; a class that defines one of `plain` (a property
// would be bypassed by the instance-dict reads of Attrs) is refused with a TypeError.
PyObject* plain_class(const char* module, const char* name, std::initializer_list<const char*> plain) {
  PyObject* m = PyImport_ImportModule(module);
  if (m == nullptr) throw python_error();
  PyObject* cls = PyObject_GetAttrString(m, name);
  Py_DECREF(m);
  if (cls == nullptr) throw python_error();
  for (const char* attr : plain) {
    if (PyObject_HasAttrString(cls, attr)) {
      Py_DECREF(cls);
      PyErr_Format(PyExc_TypeError, "the hpu kernel reads %s.%s as a plain attribute, but the class defines it", name, attr);
      throw python_error();
    }
  }
  return cls;  // kept for the process
}

// RecipeCache.memory_hit(key) (hpu_runtime/bridge/recipe_cache.py) for a cache of that exact
// class: the recipe memory holds for `key` (borrowed), counted as a hit and made the most
// recently used; or null with nothing counted: a miss (Launcher.launch looks it up again and
// counts it), or a cache whose lock another thread holds (the caller leaves the launch to
// Launcher.launch, which waits for it).
py::object recipe_memory_hit(PyObject* recipes, PyObject* key) {
  static PyObject* const cls = plain_class("hpu_runtime.bridge.recipe_cache", "RecipeCache", {"_lock", "_entries", "_hits"});
  static PyObject* const one = PyLong_FromLong(1);
  if (reinterpret_cast<PyObject*>(Py_TYPE(recipes)) != cls) {  // a subclass may count otherwise: its own method
    static PyObject* const memory_hit = interned("memory_hit");
    py::object r = py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(recipes, memory_hit, key));
    if (!r) throw python_error();
    return r.is_none() ? py::object() : r;
  }
  const Attrs cache(recipes);
  TryLock lock(cache[NAME("_lock")]);
  if (!lock.held) return py::object();
  PyObject* entries = cache[NAME("_entries")];  // an OrderedDict: a dict to read
  PyObject* recipe = PyDict_GetItemWithError(entries, key);
  if (recipe == nullptr) {
    if (PyErr_Occurred()) throw python_error();
    return py::object();
  }
  py::object kept = py::reinterpret_borrow<py::object>(recipe);
  cache.add(NAME("_hits"), one);
  static PyObject* const move_to_end = interned("move_to_end");
  py::object r = py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(entries, move_to_end, key));
  if (!r) throw python_error();
  return kept;
}

// metrics.record_recipe_cache(True, name) (hpu_runtime/api/metrics.py): one hit counted on the
// global recipe_cache metric and on every local context's, `name` made the most recently
// counted of each one's RecipeHit names, the oldest forgotten past MAX_NAMED_RECIPES
// (Metric._add_lookup). Returns false, having counted nothing, when the metrics' lock is held
// by another thread or a target is not exactly a Metric; the caller then calls the function.
bool record_recipe_hit(PyObject* name) {
  static PyObject* const globals = [] {
    PyObject* m = PyImport_ImportModule("hpu_runtime.api.metrics");
    if (m == nullptr) throw python_error();
    PyObject* d = PyModule_GetDict(m);  // borrowed from the module, which sys.modules keeps
    Py_INCREF(d);
    Py_DECREF(m);
    return d;
  }();
  static PyObject* const metric_cls = plain_class("hpu_runtime.api.metrics", "Metric", {});
  static PyObject* const one = PyLong_FromLong(1);
  const auto global = [](PyObject* n) {
    PyObject* v = PyDict_GetItemWithError(globals, n);
    if (v == nullptr) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_AttributeError, "hpu_runtime.api.metrics has no %U", n);
      throw python_error();
    }
    return v;
  };
  TryLock lock(global(NAME("_LOCK")));
  if (!lock.held) return false;
  PyObject* const kind = NAME("recipe_cache");
  PyObject* first = PyDict_GetItemWithError(global(NAME("_GLOBAL")), kind);
  PyObject* locals = PyDict_GetItemWithError(global(NAME("_LOCAL")), kind);
  if (first == nullptr || locals == nullptr || !PyList_CheckExact(locals)) {
    if (PyErr_Occurred()) throw python_error();
    return false;
  }
  const Py_ssize_t n = PyList_GET_SIZE(locals);
  for (Py_ssize_t i = -1; i < n; ++i) {
    if (reinterpret_cast<PyObject*>(Py_TYPE(i < 0 ? first : PyList_GET_ITEM(locals, i))) != metric_cls) return false;
  }
  const Py_ssize_t most = PyLong_AsSsize_t(global(NAME("MAX_NAMED_RECIPES")));
  if (most == -1 && PyErr_Occurred()) throw python_error();
  for (Py_ssize_t i = -1; i < n; ++i) {
    PyObject* m = i < 0 ? first : PyList_GET_ITEM(locals, i);
    set_attr(m, NAME("_hits"), PyNumber_Add(get(m, NAME("_hits")).ptr(), one));
    if (name == Py_None) continue;
    py::object named = get(m, NAME("_hit_by_name"));
    PyObject* count = PyDict_GetItemWithError(named.ptr(), name);
    if (count == nullptr && PyErr_Occurred()) throw python_error();
    py::object next = py::reinterpret_steal<py::object>(count != nullptr ? PyNumber_Add(count, one) : PyLong_FromLong(1));
    if (!next) throw python_error();
    if (count != nullptr && PyDict_DelItem(named.ptr(), name) != 0) throw python_error();  // to the end, as pop
    if (PyDict_SetItem(named.ptr(), name, next.ptr()) != 0) throw python_error();
    if (PyDict_GET_SIZE(named.ptr()) > most) {
      Py_ssize_t pos = 0;
      PyObject *oldest, *value;
      if (PyDict_Next(named.ptr(), &pos, &oldest, &value)) {
        py::object key = py::reinterpret_borrow<py::object>(oldest);
        if (PyDict_DelItem(named.ptr(), key.ptr()) != 0) throw python_error();
      }
    }
  }
  return true;
}

// Launcher.launch("eager", 0) of the one op launcher_append has just added, when that launch
// touches nothing but the recipe cache's memory, its metric and the compute stream: no new
// scalars to copy, no log, no graph log, no lazy collective, no trace of the stream, a recipe
// already in memory (RecipeCache.memory_hit; a miss compiles, in Python). The twin of the
// general launch in hpu_runtime/bridge/launcher.py for that case (NOTE [the op record, in the
// kernel]): the hit counted by the cache and by metrics.record_recipe_cache, as
// Launcher._recipe counts it, the op's device time at the step's speed (Card.run_compute) from
// max(host time, the pending graph's collective dependency) on, the pending graph emptied.
// Returns false, having changed nothing, when the launch is not such a case; the caller then
// calls Launcher.launch.
bool eager_launch(const Attrs& l, const Attrs& card) {
  static PyObject* const zero = PyLong_FromLong(0);
  static PyObject* const one = PyLong_FromLong(1);
  if (l[NAME("log")] != Py_None || l[NAME("graph_log")] != Py_None) return false;
  const int scalars = PyObject_RichCompareBool(l[NAME("new_scalars")], zero, Py_NE);
  if (scalars != 0) {
    if (scalars < 0) throw python_error();
    return false;
  }
  PyObject* colls = l[NAME("_colls")];
  PyObject* keys = l[NAME("_keys")];
  if (!PyList_Check(colls) || PyList_GET_SIZE(colls) != 0 || !PyList_Check(keys) || PyList_GET_SIZE(keys) != 1)
    return false;
  PyObject* compute = card[NAME("compute")];  // a Stream (slots: read by getattr)
  if (get(compute, NAME("trace")).ptr() != Py_None) return false;
  py::object key = py::reinterpret_steal<py::object>(PyTuple_Pack(1, PyList_GET_ITEM(keys, 0)));
  if (!key) throw python_error();
  // Launcher._recipe's lookup when it hits (a cache whose lock another thread holds: left to
  // Launcher.launch, nothing counted)
  py::object recipe = recipe_memory_hit(l[NAME("recipes")], key.ptr());
  if (!recipe) return false;  // a miss (Launcher.launch counts it and compiles), or the cache's lock busy
  py::object name;  // recipe.meta.get("name", "recipe")
  {
    py::object meta = get(recipe.ptr(), NAME("meta"));
    if (PyDict_CheckExact(meta.ptr())) {
      PyObject* n = PyDict_GetItemWithError(meta.ptr(), NAME("name"));
      if (n == nullptr && PyErr_Occurred()) throw python_error();
      name = py::reinterpret_borrow<py::object>(n != nullptr ? n : NAME("recipe"));
    } else {
      name = py::reinterpret_steal<py::object>(PyObject_CallMethod(meta.ptr(), "get", "ss", "name", "recipe"));
      if (!name) throw python_error();
    }
  }
  if (!record_recipe_hit(name.ptr())) {  // the recipe_cache metric (Launcher._recipe's hit), by the function
    static PyObject* const record = [] {
      PyObject* m = PyImport_ImportModule("hpu_runtime.api.metrics");
      if (m == nullptr) throw python_error();
      PyObject* f = PyObject_GetAttrString(m, "record_recipe_cache");
      Py_DECREF(m);
      if (f == nullptr) throw python_error();
      return f;  // kept for the process
    }();
    py::object r = py::reinterpret_steal<py::object>(PyObject_CallFunctionObjArgs(record, Py_True, name.ptr(), nullptr));
    if (!r) throw python_error();
  }
  // Card.run_compute(max(host_ns, _dep_ns), recipe.device_ns, f"{name} (eager)"): Stream.run
  const int64_t ready = std::max(as_int64(card[NAME("host_ns")]), as_int64(l[NAME("_dep_ns")]));
  const int64_t ppm = as_int64(card[NAME("device_ppm")]);
  const int64_t nominal = as_int64(get(recipe.ptr(), NAME("device_ns")).ptr());
  constexpr int64_t kPpm = 1000000;  // Card's _PPM
  const int64_t ns = ppm == kPpm ? nominal : static_cast<int64_t>(static_cast<__int128>(nominal) * ppm / kPpm);
  const int64_t start = std::max(ready, as_int64(get(compute, NAME("free_ns")).ptr()));
  const int64_t end = start + ns;
  const py::int_ start_o(static_cast<long long>(start)), end_o(static_cast<long long>(end));
  set_attr(compute, NAME("free_ns"), py::object(end_o).release().ptr());
  if (ns > 0) {
    static PyObject* const eager = interned(" (eager)");
    py::object label = py::reinterpret_steal<py::object>(PyUnicode_CheckExact(name.ptr())
                                                             ? PyUnicode_Concat(name.ptr(), eager)
                                                             : PyUnicode_FromFormat("%S (eager)", name.ptr()));
    if (!label) throw python_error();
    py::object span = py::reinterpret_steal<py::object>(PyTuple_Pack(3, start_o.ptr(), end_o.ptr(), label.ptr()));
    if (!span) throw python_error();
    py::object intervals = get(compute, NAME("intervals"));
    append(intervals.ptr(), span.ptr());
    if (PyList_GET_SIZE(intervals.ptr()) > as_int64(get(compute, NAME("fold_at")).ptr())) {  // Stream.run's check
      py::object on_full = get(compute, NAME("on_full"));  // Card.fold_intervals: NOTE [a long step window, folded]
      if (!on_full.is_none()) {
        py::object r = py::reinterpret_steal<py::object>(PyObject_CallNoArgs(on_full.ptr()));
        if (!r) throw python_error();
      }
    }
  }
  l.add(NAME("graphs_launched"), one);
  l.set(NAME("last_recipe"), recipe.ptr());
  auto empty_list = [&](PyObject* name) {
    py::object empty = py::reinterpret_steal<py::object>(PyList_New(0));
    if (!empty) throw python_error();
    l.set(name, empty.ptr());
  };
  empty_list(NAME("pending"));
  empty_list(NAME("_keys"));
  PyObject* ops = l[NAME("_ops")];
  if (Py_TYPE(ops) == g_pending_ops_type) {
    pending_ops_empty(reinterpret_cast<PendingOpsObject*>(ops));  // in place, as Launcher.launch empties it
  } else {
    empty_list(NAME("_ops"));
  }
  l.set(NAME("_dep_ns"), zero);
  if (PyDict_GET_SIZE(card[NAME("ready_after")]) > 0) {
    static PyObject* const forget = interned("forget_dependencies_before");
    py::object r = py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(card.obj.ptr(), forget, start_o.ptr()));
    if (!r) throw python_error();
  }
  return true;
}

// launcher_append(launcher, op) -> 0, 1 or 2 (Launcher.append_op, launcher_append above).
PyObject* launcher_append_py(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!check_nargs("launcher_append", nargs, 2)) return nullptr;
  if (!PyTuple_Check(argv[1]) || PyTuple_GET_SIZE(argv[1]) < 2) {
    PyErr_SetString(PyExc_TypeError, "launcher_append: op must be an OpRecord");
    return nullptr;
  }
  const Attrs launcher(argv[0]);
  const Attrs card(launcher[NAME("card")]);
  return PyLong_FromLong(launcher_append(launcher, card, argv[1]));
  END_HANDLE_TH_ERRORS
}

// ---- the device's lock (hpu_runtime.bridge.sim_device.SimDevice.lock) ----
// A reentrant lock, as threading.RLock, that the kernel takes without a Python call: an owner
// (thread id), a count and an OS lock. Its state changes only under the GIL; a thread that must
// wait for the OS lock releases the GIL while it waits.
struct DeviceLockObject {
  PyObject_HEAD
  PyThread_type_lock lock;
  unsigned long owner;
  unsigned long count;
};

PyTypeObject* g_device_lock_type = nullptr;

// Take the lock (blocking, or not); `timeout` in seconds, -1: none. false: not taken (a Python
// error is set only for an interrupted wait, which cannot happen here: the wait is not
// interruptible, as threading.RLock's is not without a signal handler that raises).
bool device_lock_acquire(DeviceLockObject* self, bool blocking, double timeout) {
  const unsigned long me = PyThread_get_thread_ident();
  if (self->count > 0 && self->owner == me) {
    ++self->count;
    return true;
  }
  PyLockStatus r = PyThread_acquire_lock_timed(self->lock, 0, 0);
  if (r != PY_LOCK_ACQUIRED && blocking) {
    const PY_TIMEOUT_T us = timeout < 0 ? -1 : static_cast<PY_TIMEOUT_T>(timeout * 1e6);
    Py_BEGIN_ALLOW_THREADS r = PyThread_acquire_lock_timed(self->lock, us, 0);
    Py_END_ALLOW_THREADS
  }
  if (r != PY_LOCK_ACQUIRED) return false;
  self->owner = me;
  self->count = 1;
  return true;
}

// false (RuntimeError set): this thread does not hold the lock.
bool device_lock_release(DeviceLockObject* self) {
  if (self->count == 0 || self->owner != PyThread_get_thread_ident()) {
    PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
    return false;
  }
  if (--self->count == 0) {
    self->owner = 0;
    PyThread_release_lock(self->lock);
  }
  return true;
}

PyObject* device_lock_new(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<DeviceLockObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->lock = PyThread_allocate_lock();
  self->owner = 0;
  self->count = 0;
  if (self->lock == nullptr) {
    Py_DECREF(self);
    PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
    return nullptr;
  }
  return reinterpret_cast<PyObject*>(self);
}

void device_lock_dealloc(PyObject* o) {
  auto* self = reinterpret_cast<DeviceLockObject*>(o);
  if (self->lock != nullptr) {
    if (self->count > 0) PyThread_release_lock(self->lock);
    PyThread_free_lock(self->lock);
  }
  PyTypeObject* type = Py_TYPE(o);
  type->tp_free(o);
  Py_DECREF(type);
}

PyObject* device_lock_acquire_py(PyObject* o, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"blocking", "timeout", nullptr};
  int blocking = 1;
  double timeout = -1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|pd:acquire", const_cast<char**>(names), &blocking, &timeout))
    return nullptr;
  if (!blocking && timeout != -1) {
    PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
    return nullptr;
  }
  if (timeout < 0 && timeout != -1) {
    PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
    return nullptr;
  }
  return PyBool_FromLong(device_lock_acquire(reinterpret_cast<DeviceLockObject*>(o), blocking != 0, timeout));
}

PyObject* device_lock_enter(PyObject* o, PyObject*) {
  device_lock_acquire(reinterpret_cast<DeviceLockObject*>(o), true, -1);  // blocking, no timeout: always taken
  Py_RETURN_TRUE;
}

PyObject* device_lock_release_py(PyObject* o, PyObject*) {
  if (!device_lock_release(reinterpret_cast<DeviceLockObject*>(o))) return nullptr;
  Py_RETURN_NONE;
}

PyObject* device_lock_exit(PyObject* o, PyObject*) { return device_lock_release_py(o, nullptr); }

PyObject* device_lock_is_owned(PyObject* o, PyObject*) {
  auto* self = reinterpret_cast<DeviceLockObject*>(o);
  return PyBool_FromLong(self->count > 0 && self->owner == PyThread_get_thread_ident());
}

PyMethodDef g_device_lock_methods[] = {
    {"acquire", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&device_lock_acquire_py)),
     METH_VARARGS | METH_KEYWORDS, "acquire(blocking=True, timeout=-1) -> bool, as threading.RLock.acquire."},
    {"release", &device_lock_release_py, METH_NOARGS, "Release once; RuntimeError if this thread does not hold it."},
    {"__enter__", &device_lock_enter, METH_NOARGS, "acquire()"},
    {"__exit__", &device_lock_exit, METH_VARARGS, "release()"},
    {"_is_owned", &device_lock_is_owned, METH_NOARGS, "Whether this thread holds the lock."},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot g_device_lock_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(&device_lock_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(&device_lock_dealloc)},
    {Py_tp_methods, g_device_lock_methods},
    {Py_tp_doc, const_cast<char*>("The simulated device's reentrant lock, which the hpu kernel takes without a Python "
                                  "call (threading.RLock's acquire, release and context manager).")},
    {0, nullptr}};

PyType_Spec g_device_lock_spec = {"hpu_runtime.DeviceLock", sizeof(DeviceLockObject), 0, Py_TPFLAGS_DEFAULT,
                                  g_device_lock_slots};

// ---- the op record of a kept entry, in the kernel (NOTE [the op record, in the kernel] in
// hpu_runtime/bridge/op_accounting.py) ----
// The current device (hpu_sim_set_device): its accounting, what the record needs of it, and
// the OpRecord type.
struct CurrentDevice {
  Attrs accounting, launcher, card;
  py::object residency, scalars, lock, op_record;
  int64_t gen;
  Py_ssize_t scalar_limit;

  CurrentDevice(PyObject* acc, PyObject* op_record_type)
      : accounting(acc), launcher(accounting[NAME("launcher")]), card(launcher[NAME("card")]) {
    // the names the kernel reads in the instance dicts must be plain attributes (Attrs)
    static const std::pair<const Attrs CurrentDevice::*, std::vector<const char*>> plain[] = {
        {&CurrentDevice::accounting, {"_in_kernel", "fp32_as_bf16", "launcher", "residency", "_scalars", "lock", "gen"}},
        {&CurrentDevice::launcher, {"card", "_dep_ns", "log", "ops_recorded", "pending", "region", "lazy", "_host_start",
                                    "_op_host_ns", "_eager_ns", "_keys", "_ops", "max_compound_ops", "capture",
                                    "new_scalars", "graph_log", "_colls", "recipes", "graphs_launched", "last_recipe"}},
        {&CurrentDevice::card, {"ready_after", "host_ns", "compute", "device_ppm"}}};
    for (const auto& [member, names] : plain) {
      const Attrs& f = this->*member;
      for (const char* name : names) {
        if (PyObject_HasAttrString(reinterpret_cast<PyObject*>(Py_TYPE(f.obj.ptr())), name)) {
          PyErr_Format(PyExc_TypeError, "the hpu kernel reads %s.%s as a plain attribute, but the class defines it",
                       Py_TYPE(f.obj.ptr())->tp_name, name);
          throw python_error();
        }
        f[interned(name)];  // present
      }
    }
    residency = get(accounting[NAME("residency")], NAME("state"));
    scalars = py::reinterpret_borrow<py::object>(accounting[NAME("_scalars")]);
    lock = py::reinterpret_borrow<py::object>(accounting[NAME("lock")]);
    if (Py_TYPE(lock.ptr()) != g_device_lock_type) {  // the kernel takes it in place (Locked)
      PyErr_Format(PyExc_TypeError, "the hpu kernel takes the device's lock in place: it must be a DeviceLock, not %s",
                   Py_TYPE(lock.ptr())->tp_name);
      throw python_error();
    }
    op_record = py::reinterpret_borrow<py::object>(op_record_type);
    gen = as_int64(accounting[NAME("gen")]);
    if (!PyAnySet_CheckExact(scalars.ptr())) {
      PyErr_SetString(PyExc_TypeError, "the hpu kernel needs OpAccounting._scalars to be a set");
      throw python_error();
    }
    py::object module = py::reinterpret_steal<py::object>(PyImport_ImportModule("hpu_runtime.bridge.op_accounting"));
    if (!module) throw python_error();
    scalar_limit = static_cast<Py_ssize_t>(as_int64(get(module.ptr(), interned("_MEMO_LIMIT")).ptr()));
  }
};
// shared: a record that waits for the device's lock (the GIL released) keeps its device alive
// while another thread publishes a new one. Never destroyed: its Python objects must not be
// released after the interpreter has finalized, at the library's static destruction.
std::shared_ptr<const CurrentDevice>& g_device = *new std::shared_ptr<const CurrentDevice>();

// The device's lock (a DeviceLock: CurrentDevice checks) while the kernel records an op, taken
// in place with no Python call; waiting for it releases the GIL.
struct Locked {
  DeviceLockObject* lock;
  explicit Locked(const CurrentDevice& d) : lock(reinterpret_cast<DeviceLockObject*>(d.lock.ptr())) {
    device_lock_acquire(lock, true, -1);  // blocking with no timeout: it returns once it holds the lock
  }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;
  ~Locked() { device_lock_release(lock); }  // held by this thread since the constructor: cannot fail
};

bool truth(PyObject* v) {
  const int t = PyObject_IsTrue(v);
  if (t < 0) throw python_error();
  return t != 0;
}

// A number as Python gets it (a wrapped number's too), or null: not a number.
py::object python_number(const IValue& v) {
  const IValue n = as_number(v);
  if (n.isDouble()) return py::float_(n.toDouble());
  if (n.isBool()) return py::bool_(n.toBool());
  if (n.isInt()) return py::int_(n.toInt());
  return py::object();
}

// The Python numbers the op puts on the device, as (type, value) keys of the device's scalar
// cache (OpAccounting._scalars): one at each scalar-input position (`at`, OpEntry.fast's
// (position, name, unit_is_constant) triples, as OpAccounting._scalars_as_inputs reads them; a
// value of 1 stays a constant where the unit is).
c10::SmallVector<py::object, 2> device_scalars(PyObject* at, const std::vector<IValue>& argv,
                                               const std::vector<bool>& passed) {
  static PyObject* const one = PyLong_FromLong(1);
  c10::SmallVector<py::object, 2> keys;
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(at); ++k) {
    PyObject* input = PyTuple_GET_ITEM(at, k);
    const Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(input, 0));
    if (i == -1 && PyErr_Occurred()) throw python_error();
    if (i < 0 || static_cast<size_t>(i) >= argv.size() || !passed[i]) continue;
    const py::object v = python_number(argv[i]);
    if (!v) continue;
    if (PyTuple_GET_ITEM(input, 2) == Py_True) {
      const int is_one = PyObject_RichCompareBool(v.ptr(), one, Py_EQ);
      if (is_one < 0) throw python_error();
      if (is_one) continue;
    }
    keys.push_back(py::make_tuple(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(v.ptr()))), v));
  }
  return keys;
}

// OpAccounting._scalar_to_device for each key: a value's first use joins the pending graph's
// batch of scalars (Launcher.new_scalars), copied host->device at its launch; the cache is
// emptied first when it holds d.scalar_limit values (op_accounting._MEMO_LIMIT).
void scalars_to_device(const CurrentDevice& d, const c10::SmallVector<py::object, 2>& keys) {
  static PyObject* const one = PyLong_FromLong(1);
  for (const py::object& key : keys) {
    const int in = PySet_Contains(d.scalars.ptr(), key.ptr());
    if (in < 0) throw python_error();
    if (in) continue;
    if (PySet_GET_SIZE(d.scalars.ptr()) >= d.scalar_limit && PySet_Clear(d.scalars.ptr()) != 0) throw python_error();
    if (PySet_Add(d.scalars.ptr(), key.ptr()) != 0) throw python_error();
    d.launcher.add(NAME("new_scalars"), one);
  }
}

// Whether the call passes, at each pinned position (op_accounting._pinned: a scalar input whose
// number is a constant of the record's graph-key entry), the same number, of the same type
// (floats compared bit for bit: -0.0 is not 0.0).
bool pins_hold(PyObject* pins, const std::vector<IValue>& argv, const std::vector<bool>& passed) {
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(pins); ++k) {
    PyObject* pin = PyTuple_GET_ITEM(pins, k);
    const Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(pin, 0));
    if (i == -1 && PyErr_Occurred()) throw python_error();
    if (i < 0 || static_cast<size_t>(i) >= argv.size() || !passed[i]) return false;
    const py::object v = python_number(argv[i]);
    PyObject* want = PyTuple_GET_ITEM(pin, 1);
    if (!v || Py_TYPE(v.ptr()) != Py_TYPE(want)) return false;
    if (PyFloat_CheckExact(want)) {
      const double a = PyFloat_AS_DOUBLE(v.ptr()), b = PyFloat_AS_DOUBLE(want);
      if (std::memcmp(&a, &b, sizeof a) != 0) return false;
      continue;
    }
    const int eq = PyObject_RichCompareBool(v.ptr(), want, Py_EQ);
    if (eq < 0) throw python_error();
    if (!eq) return false;
  }
  return true;
}

// The record of an op whose kept entry carries its record for this state (OpEntry.fast), made
// here: true, or false when the after hook must make it (another device, the other side of a
// compiled region's boundary, other numbers than the record's pins, a capture, bf16 emulation, a
// fused kernel's body); a number new to the device joins the scalar cache here, as the after
// hook's record puts it there. In eager mode outside compiled regions the op is then launched
// at once, as Launcher.append_op does (eager_launch, else Launcher.launch).
bool fast_record(PyObject* entry, const c10::FunctionSchema& schema, const std::vector<IValue>& argv,
                 const std::vector<bool>& passed, const torch::jit::Stack& stack, size_t nret) {
  const std::shared_ptr<const CurrentDevice> device = g_device;
  if (device == nullptr) return false;
  const CurrentDevice& d = *device;
  // (gen, view, allocates, mk, cost, saves_in, saves_out, scalar_at, in_region, pins)
  PyObject* f = slot(entry, g_entry_slots.fast, "fast");
  if (f == Py_None) return false;
  if (as_int64(PyTuple_GET_ITEM(f, 0)) != d.gen) return false;
  const Attrs& acc = d.accounting;
  const Attrs& launcher = d.launcher;
  if (as_int64(acc[NAME("_in_kernel")]) != 0 || truth(acc[NAME("fp32_as_bf16")]) ||
      launcher[NAME("capture")] != Py_None)
    return false;
  // made inside a compiled region or outside, as the op is called now (an eager key's numbers
  // differ: NOTE [scalars as graph inputs])
  const bool in_region = launcher[NAME("region")] != Py_None;
  if ((PyTuple_GET_ITEM(f, 8) == Py_True) != in_region) return false;
  const bool lazy = truth(launcher[NAME("lazy")]);
  if (!pins_hold(PyTuple_GET_ITEM(f, 9), argv, passed)) return false;
  const c10::SmallVector<py::object, 2> scalars = device_scalars(PyTuple_GET_ITEM(f, 7), argv, passed);
  // the first argument Python gets (OpAccounting.record's args[0]) is a host tensor
  const bool on_host = !argv.empty() && passed[0] && !schema.arguments()[0].kwarg_only() && python_tensor(argv[0]) &&
                       argv[0].toTensor().is_cpu();
  PyObject* mk = PyTuple_GET_ITEM(f, 3);
  Locked locked(d);
  if (PyTuple_GET_ITEM(f, 1) == Py_True) {  // a view: part of the graph's key in lazy mode (Launcher.append_view)
    if (!on_host && lazy && !in_region) {
      append(launcher[NAME("_keys")], mk);
      PyObject* log = launcher[NAME("log")];
      if (log != Py_None) {
        py::object event = py::make_tuple("view", py::handle(mk));
        append(log, event.ptr());
      }
    }
    return true;
  }
  const bool allocates = PyTuple_GET_ITEM(f, 2) == Py_True;
  if (!allocates && on_host) return true;  // in place on a host tensor: host work
  OpData data;
  try {
    data = op_data(residency_state(d.residency.ptr()), argv, passed, stack, nret, allocates, false,
                   PyTuple_GET_ITEM(f, 5), PyTuple_GET_ITEM(f, 6));
  } catch (const python_error&) {  // the after hook makes the record again and says why (an OOM, a bad tensor)
    PyErr_Clear();
    return false;
  } catch (const py::error_already_set&) {
    return false;
  } catch (const c10::Error&) {
    return false;
  }
  if (data.none) return true;  // host work
  scalars_to_device(d, scalars);
  const Deferred later{mk, PyTuple_GET_ITEM(f, 4), data, d.op_record.ptr()};
  const int launch = launcher_append(launcher, d.card, nullptr, &later);
  if (launch == 1 && eager_launch(launcher, d.card)) return true;
  if (launch != 0) {
    py::object r = py::reinterpret_steal<py::object>(
        launch == 1 ? PyObject_CallMethod(launcher.obj.ptr(), "launch", "si", "eager", 0)
                    : PyObject_CallMethod(launcher.obj.ptr(), "launch", "s", "max_compound_op_size"));
    if (!r) throw python_error();
  }
  return true;
}

template <PyObject* (*F)(PyObject*, PyObject* const*, Py_ssize_t)>
constexpr PyCFunction fastcall() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(F));
}

// ---- the graph key's hash (NOTE [a graph key's hash] in hpu_runtime/bridge/launcher.py) ----
// The hashes of the items graph keys hold (graph-key entries: tuples whose hash CPython does not
// keep), by object, each object held while its hash is: an address cannot name another object
// meanwhile. Emptied when it holds kMaxItemHashes.
constexpr size_t kMaxItemHashes = 1 << 16;
std::unordered_map<PyObject*, Py_hash_t>& g_item_hashes = *new std::unordered_map<PyObject*, Py_hash_t>();

Py_hash_t item_hash(PyObject* o) {
  const auto it = g_item_hashes.find(o);
  if (it != g_item_hashes.end()) return it->second;
  const Py_hash_t h = PyObject_Hash(o);
  if (h == -1) throw python_error();
  if (g_item_hashes.size() >= kMaxItemHashes) {
    std::vector<PyObject*> held;
    held.reserve(g_item_hashes.size());
    for (const auto& [obj, _] : g_item_hashes) held.push_back(obj);
    g_item_hashes.clear();  // emptied before any release can run Python code
    for (PyObject* obj : held) Py_DECREF(obj);
  }
  g_item_hashes.emplace(Py_NewRef(o), h);
  return h;
}

// tuple_hash(items: list | tuple) -> int: hash(tuple(items)), as CPython's tuple computes it
// (Objects/tupleobject.c, tuplehash: xxHash's round over the items' hashes, 64-bit constants), the
// items' hashes read from g_item_hashes.
PyObject* tuple_hash_py(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  static_assert(sizeof(Py_uhash_t) == 8, "tuple_hash follows CPython's 64-bit tuplehash");
  if (!check_nargs("tuple_hash", nargs, 1)) return nullptr;
  PyObject* items = argv[0];
  if (!PyList_Check(items) && !PyTuple_Check(items)) {
    PyErr_SetString(PyExc_TypeError, "tuple_hash: items must be a list or a tuple");
    return nullptr;
  }
  constexpr Py_uhash_t kPrime1 = 11400714785074694791ULL, kPrime2 = 14029467366897019727ULL,
                       kPrime5 = 2870177450012600261ULL;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  PyObject** item = PySequence_Fast_ITEMS(items);
  Py_uhash_t acc = kPrime5;
  for (Py_ssize_t i = 0; i < n; ++i) {
    const Py_uhash_t lane = static_cast<Py_uhash_t>(item_hash(item[i]));
    acc += lane * kPrime2;
    acc = (acc << 31) | (acc >> 33);
    acc *= kPrime1;
  }
  acc += static_cast<Py_uhash_t>(n) ^ (kPrime5 ^ 3527539UL);
  if (acc == static_cast<Py_uhash_t>(-1)) return PyLong_FromSsize_t(1546275796);
  return PyLong_FromSsize_t(static_cast<Py_hash_t>(acc));
  END_HANDLE_TH_ERRORS
}

// The library's builtin functions, handed to Python by hpu_sim_builtins().
PyMethodDef g_builtins[] = {
    {"storage_io", fastcall<&storage_io>(), METH_FASTCALL, "An op record's storages (hpu_runtime.bridge.op_accounting)."},
    {"hbm", fastcall<&hbm_py>(), METH_FASTCALL, "An update of HBMModel's counters (hpu_runtime.device.memory)."},
    {"residency_register", fastcall<&residency_register_py>(), METH_FASTCALL,
     "Residency.register (hpu_runtime.device.residency)."},
    {"residency_on_free", fastcall<&residency_on_free_py>(), METH_FASTCALL,
     "A residency's weak-reference callback (hpu_runtime.device.residency)."},
    {"launcher_append", fastcall<&launcher_append_py>(), METH_FASTCALL,
     "Launcher.append_op without its launches (hpu_runtime.bridge.launcher)."},
    {"tuple_hash", fastcall<&tuple_hash_py>(), METH_FASTCALL,
     "hash(tuple(items)), the items' hashes kept (hpu_runtime.bridge.launcher.GraphKey)."},
    {nullptr, nullptr, 0, nullptr}};

struct Inside {
  Inside() { ++t_inside; }
  ~Inside() { --t_inside; }
};

// The hooks run with torch-function handling off (NOTE [the bridge's hot path]), as
// torch._C.DisableTorchFunction() sets it.
struct NoTorchFunction {
  at::impl::TorchFunctionDisabledState old = at::impl::PythonTorchFunctionTLS::get_disabled_state();
  NoTorchFunction() {
    at::impl::PythonTorchFunctionTLS::set_disabled_state(at::impl::TorchFunctionDisabledState::ALL_DISABLED);
  }
  ~NoTorchFunction() { at::impl::PythonTorchFunctionTLS::set_disabled_state(old); }
};

// Whether an op's CPU kernel runs with the GIL kept (NOTE [the GIL around a small op] in
// hpu_runtime/bridge/dispatch.py): an aten op whose tensor arguments hold at most
// kKeepGilBytes. Releasing and taking the GIL back costs about as much as such an op's kernel,
// and while it is released every tensor whose C++ reference count passes between one and two
// takes the GIL for its Python object (c10/util/intrusive_ptr.h, incref_pyobject).
constexpr int64_t kKeepGilBytes = int64_t{1} << 18;

bool keeps_gil(const c10::OperatorHandle& op, const std::vector<IValue>& argv) {
  static const std::string aten = "aten::";
  const std::string& name = op.schema().name();
  if (name.compare(0, aten.size(), aten) != 0) return false;
  int64_t nbytes = 0;
  auto add = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
      nbytes = kKeepGilBytes + 1;  // not a size to count on
      return;
    }
    nbytes += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
  };
  for (const IValue& v : argv) {
    if (v.isTensor()) {
      add(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) add(t);
    } else if (v.isList() || v.isOptionalTensorList()) {
      return false;  // nested or optional lists: not a small op worth counting
    }
    if (nbytes > kKeepGilBytes) return false;
  }
  return true;
}

// Run `run` (which leaves the op's results on `stack`) between the two hooks.
template <class F>
void hooked(const c10::OperatorHandle& op, torch::jit::Stack* stack, F run) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  // neither the hooks' ops nor the kernel's own are the user's profile (NOTE [the emulator's
  // own work is not the user's profile] in hpu_runtime/bridge/dispatch.py)
  // (only with a callback registered: switching RecordFunction rebuilds the thread's callbacks)
  std::optional<at::RecordFunctionGuard> unrecorded;
  if (at::hasCallbacks()) unrecorded.emplace(false);
  pybind11::gil_scoped_acquire gil;
  // Declared after the GIL is taken, so released before it is: a tensor whose last C++
  // reference beside its Python object goes with `argv` drops that object's reference under
  // the GIL, not by taking it again (c10/util/intrusive_ptr.h, decref_pyobject).
  std::vector<IValue> argv(stack->end() - nargs, stack->end());
  const std::vector<bool> passed = passed_args(schema, argv);
  // the op and its arguments as Python objects, made only for a call of a Python hook
  py::dict kwargs = py::reinterpret_steal<py::dict>(py::handle());
  py::tuple args;
  bool made = false;
  auto python_args = [&] {
    if (!made) kwargs = py::dict(), args = py_args(schema, argv, passed, kwargs), made = true;
  };
  std::vector<int64_t> words;
  words.reserve(32);
  bool keyed = signature_words(op, argv, passed, words);
  PyObject* entry = nullptr;
  if (keyed) {
    const auto it = g_entries.find(words);
    if (it != g_entries.end()) entry = it->second;
  }
  py::object token;
  if (entry != nullptr && !needs_before(entry)) {
    token = py::reinterpret_borrow<py::object>(entry);
  } else {
    Inside in;
    NoTorchFunction off;
    python_args();
    PyObject* t = PyObject_CallFunctionObjArgs(g_before, torch::detail::getTorchApiFunction(op).ptr(), args.ptr(),
                                               kwargs.ptr(), entry != nullptr ? entry : Py_None, nullptr);
    if (t == nullptr) throw python_error();
    token = py::reinterpret_steal<py::object>(t);
  }
  if (keyed && entry == nullptr && Py_TYPE(token.ptr()) == g_entry_type) {
    if (learn_value_free(op, token.ptr())) {
      words.clear();
      keyed = signature_words(op, argv, passed, words);
    }
    if (keyed) {
      if (g_entries.size() >= kMaxEntries) clear_entries();
      g_entries.emplace(std::move(words), token.inc_ref().ptr());
    }
  }
  {
    Inside in;
    std::optional<pybind11::gil_scoped_release> nogil;
    if (!keeps_gil(op, argv)) nogil.emplace();
    run();
  }
  const size_t nret = schema.returns().size();
  Inside in;
  NoTorchFunction off;
  if (Py_TYPE(token.ptr()) == g_entry_type && fast_record(token.ptr(), schema, argv, passed, *stack, nret)) return;
  python_args();
  py::object out;
  if (pure_view(schema)) {
    // A view's output is not passed (None): the record needs only its arguments, and wrapping
    // it would give it a Python object, which torch's own detach()/alias() for a Parameter or
    // as_subclass() must not find (they run with dispatch modes stashed, where the dispatch
    // mode never saw them).
    out = py::none();
  } else if (nret == 1) {
    out = torch::jit::toPyObject((*stack)[stack->size() - 1]);
  } else {
    py::tuple t(nret);
    for (size_t j = 0; j < nret; ++j) t[j] = torch::jit::toPyObject((*stack)[stack->size() - nret + j]);
    out = std::move(t);
  }
  PyObject* r = PyObject_CallFunctionObjArgs(g_after, torch::detail::getTorchApiFunction(op).ptr(), args.ptr(),
                                             kwargs.ptr(), out.ptr(), token.ptr(), nullptr);
  if (r == nullptr) throw python_error();
  Py_DECREF(r);
}

// Every op on hpu tensors: run the CPU kernel on CPU views, hand back hpu tensors. As on an
// accelerator, a host tensor beside hpu ones must be a 0-d scalar (or an index).
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  Call call;
  for (size_t i = stack->size() - schema.arguments().size(); i < stack->size(); ++i) call.arg_to_cpu((*stack)[i]);
  if (!call.views.empty() && !call.host_device) {
    for (TensorImpl* h : call.host_args) {
      TORCH_CHECK(h->dim() == 0 || takes_host_indices(schema.operator_name()),
                  "Expected all tensors to be on the same device, but found at least two devices, hpu:0 and cpu! (",
                  schema.operator_name(), " on the simulated Gaudi: move the host tensor with .to(\"hpu\"))");
    }
  }
  op.redispatchBoxed(kCpuKernel, stack);
  for (size_t i = stack->size() - schema.returns().size(); i < stack->size(); ++i) call.result_to_hpu((*stack)[i]);
  if (schema.is_mutable()) call.write_back();
}

void hpu_fallback(const c10::OperatorHandle& op, DispatchKeySet, torch::jit::Stack* stack) {
  if (hooks_on()) return hooked(op, stack, [&] { run_on_cpu(op, stack); });
  run_on_cpu(op, stack);
}

void check_device(std::optional<Device> device) {
  TORCH_CHECK(!device || device->type() != kHpu || device->index() <= 0,
              "the simulated Gaudi has one card per process, hpu:0; got ", *device);
}

at::Tensor empty_impl(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                     std::optional<Device> device, std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  check_device(device);
  TORCH_CHECK(!layout || *layout == at::kStrided, "hpu tensors are strided; got layout ", *layout);
  at::Tensor t = at::detail::empty_generic(size, c10::GetCPUAllocator(), DispatchKeySet(DispatchKey::HPU),
                                           dtype.value_or(c10::get_default_dtype_as_scalartype()), memory_format);
  Fields::device(t.unsafeGetTensorImpl()) = kHpu0;
  return t;
}

at::Tensor empty_strided_impl(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout> layout, std::optional<Device> device, std::optional<bool>) {
  check_device(device);
  TORCH_CHECK(!layout || *layout == at::kStrided, "hpu tensors are strided; got layout ", *layout);
  at::Tensor t = at::detail::empty_strided_generic(size, stride, c10::GetCPUAllocator(),
                                                   DispatchKeySet(DispatchKey::HPU),
                                                   dtype.value_or(c10::get_default_dtype_as_scalartype()));
  Fields::device(t.unsafeGetTensorImpl()) = kHpu0;
  return t;
}

// copy_ between any of hpu and CPU (its composite form would ask for _copy_from, which has no
// CPU kernel): a CPU copy between views.
at::Tensor& copy_impl(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  at::Tensor dst = is_hpu(self) ? cpu_view(self) : self;
  at::_ops::copy_::redispatch(kCpuKernel, dst, is_hpu(src) ? cpu_view(src) : src, non_blocking);
  return self;
}

// A direct (unboxed) kernel's call between the bridge's hooks: its arguments boxed for them,
// `impl` run, its result left for the after hook.
template <class Impl, class... Args>
void hooked_direct(const c10::OperatorHandle& op, Impl impl, const Args&... args) {
  torch::jit::Stack st;
  torch::jit::push(st, args...);
  hooked(op, &st, [&] {
    torch::jit::drop(st, sizeof...(Args));
    st.emplace_back(impl());
  });
}

c10::OperatorHandle aten_op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// The direct kernels, between the bridge's hooks when they are on.
at::Tensor hpu_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                     std::optional<Device> device, std::optional<bool> pin, std::optional<at::MemoryFormat> fmt) {
  if (!hooks_on()) return empty_impl(size, dtype, layout, device, pin, fmt);
  static const c10::OperatorHandle op = aten_op("aten::empty", "memory_format");
  at::Tensor out;
  hooked_direct(op, [&] { return out = empty_impl(size, dtype, layout, device, pin, fmt); }, size, dtype, layout,
                device, pin, fmt);
  return out;
}

at::Tensor hpu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout> layout, std::optional<Device> device, std::optional<bool> pin) {
  if (!hooks_on()) return empty_strided_impl(size, stride, dtype, layout, device, pin);
  static const c10::OperatorHandle op = aten_op("aten::empty_strided", "");
  at::Tensor out;
  hooked_direct(op, [&] { return out = empty_strided_impl(size, stride, dtype, layout, device, pin); }, size, stride,
                dtype, layout, device, pin);
  return out;
}

at::Tensor& hpu_copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (!hooks_on()) return copy_impl(self, src, non_blocking);
  static const c10::OperatorHandle op = aten_op("aten::copy_", "");
  hooked_direct(op, [&] { return copy_impl(self, src, non_blocking); }, self, src, non_blocking);
  return self;
}

// .to("hpu") of a host tensor reaches the dispatcher as the host's _to_copy (the host tensor
// decides the kernel): between the hooks as one transfer, its empty + copy_ inside it.
void host_to_copy(const c10::OperatorHandle& op, DispatchKeySet, torch::jit::Stack* stack) {
  auto run = [&] { op.callBoxedForDispatchKey(DispatchKey::CompositeExplicitAutograd, *stack); };
  if (hooks_on()) {
    const IValue& device = (*stack)[stack->size() - 7 + 3];  // _to_copy(self, *, dtype, layout, device, ...)
    if (device.isDevice() && device.toDevice().type() == kHpu) return hooked(op, stack, run);
  }
  run();
}

// One compute queue: a tensor used on another stream needs no bookkeeping (NOTE [streams and
// events] in hpu_runtime/api/hpu.py).
void hpu_record_stream(at::Tensor&, Stream) {}

thread_local c10::StreamId current_stream = 0;
std::atomic<c10::StreamId> next_stream{1};

// Streams are ids (the default stream is 0), events are no-ops: simulated time is the bridge's.
struct HpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return kHpu; }
  Device exchangeDevice(Device d) const override {
    check_device(d);
    return kHpu0;
  }
  Device getDevice() const override { return kHpu0; }
  void setDevice(Device d) const override { check_device(d); }
  void uncheckedSetDevice(Device) const noexcept override {}
  Stream getStream(Device) const noexcept override { return Stream(Stream::UNSAFE, kHpu0, current_stream); }
  Stream getDefaultStream(Device) const override { return Stream(Stream::DEFAULT, kHpu0); }
  Stream getNewStream(Device, int) const override { return Stream(Stream::UNSAFE, kHpu0, next_stream++); }
  Stream getStreamFromGlobalPool(Device, bool) const override {
    return Stream(Stream::UNSAFE, kHpu0, next_stream++);
  }
  Stream exchangeStream(Stream s) const noexcept override {
    auto old = current_stream;
    current_stream = s.id();
    return Stream(Stream::UNSAFE, kHpu0, old);
  }
  DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const Stream&, const DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const DeviceIndex) const noexcept override {}
  bool queryStream(const Stream&) const override { return true; }
  void synchronizeStream(const Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const DeviceIndex) const override {}
};

// The accelerator hooks: hpu is this process's accelerator, with one card; host memory is
// "pinned" memory and the CPU generator is the card's (hpu random ops run CPU kernels).
struct HpuHooks final : at::HPUHooksInterface {
  explicit HpuHooks(at::HPUHooksArgs) {}
  void init() const override {}
  bool hasHPU() const override { return true; }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  DeviceIndex deviceCount() const override { return 1; }
  void setCurrentDevice(DeviceIndex d) const override { check_device(Device(kHpu, d)); }
  DeviceIndex getCurrentDevice() const override { return 0; }
  DeviceIndex exchangeDevice(DeviceIndex d) const override {
    check_device(Device(kHpu, d));
    return 0;
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex d) const override { return exchangeDevice(d); }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  Device getDeviceFromPtr(void*) const override { return kHpu0; }
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  const at::Generator& getDefaultGenerator(DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(DeviceIndex) const override { return at::detail::createCPUGenerator(); }
};

at::Tensor cpu_view_op(const at::Tensor& t) { return is_hpu(t) ? cpu_view(t) : t; }

// The fallback is also the hpu kernel of every aten op with a CPU kernel or a composite-explicit
// one (and no composite-implicit one: those decompose above autograd and must keep doing so).
// Structured ops would otherwise run their composite form for other backends (an empty output,
// then the out= op through the fallback: one more boxed call), and composite-explicit kernels
// would run on hpu tensors, where some (alias, _unsafe_view, unsqueeze...) build a TensorImpl
// over the storage directly: with CPU storage it would say cpu while carrying hpu keys.
struct DirectKernels {
  std::unique_ptr<torch::Library> lib;
  DirectKernels() {
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", DispatchKey::HPU, __FILE__, __LINE__);
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const auto& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      if (!op || op->hasKernelForDispatchKey(DispatchKey::HPU) ||
          op->hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd) ||
          !(op->hasKernelForDispatchKey(DispatchKey::CPU) ||
            op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
            op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional)))
        continue;
      std::string n = name.name.substr(6);
      if (!name.overload_name.empty()) n += "." + name.overload_name;
      lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&hpu_fallback>());
    }
  }
};

}  // namespace

// DDP's timer for hpu modules (its runtime stats in _get_ddp_logging_data): host timestamps, as
// Habana's hccl library registers one for kHPU. Without it torch's DDP warns on every rank
// that "Time stats are currently only collected for CPU and CUDA devices". Wall-clock stats of
// DDP's own logging, never simulated time.
namespace c10d {
namespace {
class HpuTimer final : public Timer {
 public:
  explicit HpuTimer(c10::Device) {}
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const int64_t from = getTimeRef(start), to = getTimeRef(end);
    if (from == kUnsetTime || to == kUnsetTime || to < from) return std::nullopt;
    return to - from;
  }
};
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kHPU, HpuTimer);
}  // namespace
}  // namespace c10d

C10_REGISTER_GUARD_IMPL(HPU, HpuGuardImpl);
// hpu storages are host memory (UntypedStorage(n, device="hpu"), pinned buffers)
REGISTER_ALLOCATOR(c10::DeviceType::HPU, c10::GetCPUAllocator());

namespace at {
C10_REGISTER_CLASS(HPUHooksRegistry, HPUHooks, ::HpuHooks)
}

TORCH_LIBRARY_IMPL(_, HPU, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&hpu_fallback>()); }

TORCH_LIBRARY_IMPL(aten, HPU, m) {
  m.impl("empty.memory_format", TORCH_FN(hpu_empty));
  m.impl("empty_strided", TORCH_FN(hpu_empty_strided));
  m.impl("copy_", TORCH_FN(hpu_copy_));
  m.impl("record_stream", TORCH_FN(hpu_record_stream));
}

TORCH_LIBRARY_IMPL(aten, CPU, m) {
  m.impl("_to_copy", torch::CppFunction::makeFromBoxedFunction<&host_to_copy>());
}

TORCH_LIBRARY(hpu_sim, m) { m.def("cpu_view(Tensor(a) self) -> Tensor(a)", &cpu_view_op); }

namespace {
// after the registrations above (same file: initialised in order), so their ops are skipped
const DirectKernels direct_kernels;

// at::detail::getHPUHooks() makes its hooks object once, from the registry, at its first call.
// A process that asked for the accelerator before loading this library (torch.accelerator,
// dist.init_process_group("gloo") before `import habana_frameworks.torch`) holds the
// interface's default, which says no HPU is built: backward of hpu tensors then fails with
// "Cannot access accelerator device when none is available". That object is replaced in
// place by ours (the same size: neither has data members), so the HPU is this process's
// accelerator whenever the library is loaded.
static_assert(sizeof(HpuHooks) == sizeof(at::HPUHooksInterface), "HpuHooks must stay as small as its interface");
struct InstallHooks {
  InstallHooks() {
    auto& hooks = const_cast<at::HPUHooksInterface&>(at::detail::getHPUHooks());
    if (dynamic_cast<HpuHooks*>(&hooks) == nullptr) {
      hooks.~HPUHooksInterface();
      new (&hooks) HpuHooks(at::HPUHooksArgs{});
    }
  }
};
const InstallHooks install_hooks;
}  // namespace

// The bridge's switches (called through ctypes.PyDLL, with the GIL held).
extern "C" {
void hpu_sim_set_hooks(PyObject* before, PyObject* after, PyObject* entry_type) {
  Py_XINCREF(before);
  Py_XINCREF(after);
  Py_XINCREF(entry_type);
  Py_XDECREF(g_before);
  Py_XDECREF(g_after);
  Py_XDECREF(reinterpret_cast<PyObject*>(g_entry_type));
  g_before = before;
  g_after = after;
  g_entry_type = reinterpret_cast<PyTypeObject*>(entry_type);
  clear_entries();
  if (entry_type != nullptr && PyType_Check(entry_type)) {
    try {
      g_entry_slots = {slot_offset(g_entry_type, "before"), slot_offset(g_entry_type, "kernel_nbytes"),
                       slot_offset(g_entry_type, "fast")};
      return;
    } catch (const python_error&) {
      PyErr_Print();
    }
  }
  Py_XDECREF(g_after);
  g_after = nullptr;  // no hooks rather than wrong reads
}
void hpu_sim_set_active(int on) { t_active = on != 0; }
int hpu_sim_hooks_on() { return hooks_on() ? 1 : 0; }
// {name: builtin function} of g_builtins.
PyObject* hpu_sim_builtins() {
  PyObject* d = PyDict_New();
  if (d == nullptr) return nullptr;
  const std::tuple<PyTypeObject**, PyType_Spec*, const char*> types[] = {
      {&g_device_lock_type, &g_device_lock_spec, "DeviceLock"}, {&g_pending_ops_type, &g_pending_ops_spec, "PendingOps"}};
  for (const auto& [type, spec, name] : types) {  // each class made once per process
    if (*type == nullptr) *type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(spec));
    if (*type == nullptr || PyDict_SetItemString(d, name, reinterpret_cast<PyObject*>(*type)) != 0) {
      Py_DECREF(d);
      return nullptr;
    }
  }
  for (PyMethodDef* m = g_builtins; m->ml_name != nullptr; ++m) {
    PyObject* f = PyCFunction_New(m, nullptr);
    if (f == nullptr || PyDict_SetItemString(d, m->ml_name, f) != 0) {
      Py_XDECREF(f);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(f);
  }
  return d;
}
// The current device (hpu_runtime.bridge.runtime): its HBM counters (an array('q'),
// hpu_runtime.device.memory), its OpAccounting and the OpRecord type; all None: none. A device
// the kernel cannot read is refused with a TypeError (CurrentDevice), the previous one kept.
void hpu_sim_set_device(PyObject* counters, PyObject* accounting, PyObject* op_record) {
  try {
    std::unique_ptr<CurrentDevice> dev;
    if (accounting != Py_None) dev = std::make_unique<CurrentDevice>(accounting, op_record);
    g_device = std::move(dev);
  } catch (const python_error&) {
    return;  // the Python error stays set: ctypes (PyDLL) raises it
  }
  PyObject* old = g_hbm;
  g_hbm = counters == Py_None ? nullptr : counters;
  Py_XINCREF(g_hbm);
  Py_XDECREF(old);
}
void hpu_sim_inside(int delta) { t_inside += delta; }
}
