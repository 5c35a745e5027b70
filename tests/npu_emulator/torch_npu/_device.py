"""The emulated `npu` device: wrapper tensors over CPU storage, a dispatch mode that routes every
op touching them (or creating tensors on `npu`) to the CPU, and the torch.npu module."""

from __future__ import annotations

import threading
import types
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from torch_npu import _graph


torch.utils.rename_privateuse1_backend("npu")
NPU = torch.device("npu", 0)
aten = torch.ops.aten

_CROSS_DEVICE_OPS = {aten._to_copy.default, aten.copy_.default, aten._local_scalar_dense.default,
                     aten.lift_fresh.default, aten.lift_fresh_copy.default}
_CACHE_TOUCHING_OPS = {aten.permute.default, aten.transpose.int, aten.clone.default, aten.t.default,
                       aten.index.Tensor, aten.index_select.default, aten._to_copy.default}


class NPUTensor(torch.Tensor):
    """A tensor on the emulated npu device; its data is the CPU tensor `_inner`."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(), dtype=inner.dtype,
            device=NPU, requires_grad=False)
        r._inner = inner
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        return f"NPUTensor(device='npu:0', {self._inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types_, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def inner(t: torch.Tensor) -> torch.Tensor:
    """The CPU data of an npu tensor (for the emulated operators)."""
    if not isinstance(t, NPUTensor):
        raise TypeError("expected a tensor on the npu device")
    return t._inner


def wrap(t: torch.Tensor) -> NPUTensor:
    return NPUTensor(t)


# --- the monitor: host copies and cache reshuffles ---------------------------------------------------
class _Monitor:
    def __init__(self):
        self.records: list[tuple] = []
        self.active = False
        self.watched: set[int] = set()


_monitor = _Monitor()


@contextmanager
def monitor(watch: tuple = ()):
    """Records, while active, every device->host copy ('d2h', shape) and every permute / transpose /
    clone / gather / copy of a watched tensor's storage ('cache_op', op name)."""
    _monitor.records = []
    _monitor.watched = {inner(t).untyped_storage().data_ptr() for t in watch}
    _monitor.active = True
    try:
        yield _monitor.records
    finally:
        _monitor.active = False


def _note(func, args):
    if not _monitor.active:
        return
    ts = [a for a in tree_flatten(args)[0] if isinstance(a, NPUTensor)]
    if func in _CACHE_TOUCHING_OPS and any(t._inner.untyped_storage().data_ptr() in _monitor.watched for t in ts):
        _monitor.records.append(("cache_op", str(func), tuple(ts[0].shape)))


# --- dispatch ------------------------------------------------------------------------------------------
def _is_npu_device(d) -> bool:
    return d is not None and torch.device(d).type == "npu"


def _dispatch(func, args, kwargs):
    flat = tree_flatten((args, kwargs))[0]
    npu_args = [a for a in flat if isinstance(a, NPUTensor)]
    to_npu = _is_npu_device(kwargs.get("device"))
    if not npu_args and not to_npu:
        return func(*args, **kwargs)
    if func not in _CROSS_DEVICE_OPS:
        for a in flat:
            if isinstance(a, torch.Tensor) and not isinstance(a, NPUTensor) and a.dim() > 0:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                                   f"npu:0 and {a.device}! (op {func})")
    _note(func, args)
    by_id = {id(a._inner): a for a in npu_args}
    un_args = tree_map(lambda a: a._inner if isinstance(a, NPUTensor) else a, args)
    un_kwargs = tree_map(lambda a: a._inner if isinstance(a, NPUTensor) else a, kwargs)
    if to_npu:
        un_kwargs["device"] = torch.device("cpu")

    if func is aten._to_copy.default:
        src_npu = isinstance(args[0], NPUTensor)
        dst = kwargs.get("device")
        if src_npu and dst is not None and not _is_npu_device(dst):
            _graph.refuse("a device -> host copy (.cpu(), .tolist(), .numpy())")
            if _monitor.active:
                _monitor.records.append(("d2h", tuple(args[0].shape)))
            return func(*un_args, **un_kwargs)  # a plain host tensor
        if not src_npu and not _graph.in_operator():
            _graph.refuse("a host -> device copy")
        out = wrap(func(*un_args, **un_kwargs))
        _graph.record_aten(func, args, kwargs, out)
        return out
    if func is aten._local_scalar_dense.default:
        _graph.refuse(".item()")
        if _monitor.active:
            _monitor.records.append(("d2h", tuple(args[0].shape)))
        return func(*un_args, **un_kwargs)
    if func is aten.copy_.default:
        dst, src = args[0], args[1]
        if isinstance(src, NPUTensor) != isinstance(dst, NPUTensor) and not _graph.in_operator():
            _graph.refuse("a host <-> device copy_")
        if isinstance(src, NPUTensor) and not isinstance(dst, NPUTensor) and _monitor.active:
            _monitor.records.append(("d2h", tuple(src.shape)))
        if isinstance(dst, NPUTensor):
            dst._inner.copy_(src._inner if isinstance(src, NPUTensor) else src)
            _graph.record_aten(func, args, kwargs, dst)
            return dst
        return dst.copy_(src._inner)

    out = func(*un_args, **un_kwargs)

    def rewrap(o):
        if isinstance(o, torch.Tensor) and not isinstance(o, NPUTensor):
            mutated = by_id.get(id(o))  # in-place ops hand back the tensor they mutated
            return mutated if mutated is not None else wrap(o)
        return o

    result = tree_map(rewrap, out)
    _graph.record_aten(func, args, kwargs, result)
    return result


class _NpuMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


# --- torch.npu ------------------------------------------------------------------------------------------
_bound = threading.local()
_TOTAL = 64 << 30


def _set_device(index=0):
    idx = index.index if isinstance(index, torch.device) else int(index or 0)
    if idx != 0:
        raise RuntimeError(f"npu:{idx} is not available (the emulator has one NPU)")
    if not getattr(_bound, "mode", None):
        _bound.mode = _NpuMode()
        _bound.mode.__enter__()  # stays pushed for the thread's life, as the real device binding does


class _Stream:
    def __init__(self, device=None, priority=0):
        self.device = NPU

    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Event:
    def __init__(self, enable_timing=False, blocking=False):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass


npu_module = types.ModuleType("torch.npu")
npu_module.is_available = lambda: True
npu_module.device_count = lambda: 1
npu_module.set_device = _set_device
npu_module.current_device = lambda: 0
npu_module.synchronize = _graph.synchronize
npu_module.NPUGraph = _graph.NPUGraph
npu_module.graph = _graph.graph
npu_module.graph_pool_handle = _graph.graph_pool_handle
npu_module.is_current_stream_capturing = _graph.is_current_stream_capturing
npu_module.Stream = _Stream
npu_module.Event = _Event
npu_module.current_stream = lambda device=None: _Stream()
npu_module.mem_get_info = lambda device=None: (_TOTAL // 2, _TOTAL)
npu_module.memory_allocated = lambda device=None: 0
npu_module.max_memory_allocated = lambda device=None: 0
npu_module.empty_cache = lambda: None
npu_module.is_initialized = lambda: True
npu_module._is_in_bad_fork = lambda: False
npu_module.manual_seed = lambda seed: None
npu_module.manual_seed_all = lambda seed: None
torch._register_device_module("npu", npu_module)
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=False)


# C++ code paths take a device guard and query backend hooks for the tensor's device; torch lets a
# Python backend register both for PrivateUse1 (the emulated npu holds no real device state).
class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


_GUARD, _HOOKS = _Guard(), _Hooks()
torch._C._acc.register_python_privateuseone_hook(_HOOKS)
torch._C._acc.register_python_privateuseone_device_guard(_GUARD)
