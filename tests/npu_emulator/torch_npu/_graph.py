"""torch.npu.NPUGraph and torch.npu.graph on the emulated device: capture records every operator on npu tensors (the
aten ops and the emulated torch_npu operators, in order); replay runs them again on the same tensors, writing each
result into the tensor the capture returned, so a captured step reads its static inputs and writes its static
outputs as on the device.

What capture refuses, as ACL's capture mode does: a host <-> device copy (.cpu(), .item(), .tolist(), a host tensor
moved to the npu) and torch.npu.synchronize. A host value an operator's tiling reads (the fused attention's
actual_seq_lengths lists) is frozen at capture: replay reuses it unless NPUGraph.update replaces it, which needs
auto_dispatch_capture=True (torch_npu 2.13's npu/graphs.py: the FIA handler's UPDATE_SPECS). Shapes are static:
a replay cannot change one.
"""

from __future__ import annotations

import functools
import threading

from torch.utils._pytree import tree_flatten

_state = threading.local()

# torch_npu 2.13 _npugraph_handlers/ifa_handler.py: what NPUGraph.update may replace in a recorded FIA call
_UPDATABLE = {"npu_fused_infer_attention_score": ("actual_seq_lengths", "actual_seq_lengths_kv")}


class GraphCaptureError(RuntimeError):
    pass


def capturing():
    """The graph being captured on this thread, or None."""
    return getattr(_state, "graph", None)


def in_operator() -> bool:
    return getattr(_state, "depth", 0) > 0


def refuse(what: str) -> None:
    if capturing() is not None:
        raise GraphCaptureError(f"{what} is not allowed while an NPU graph is being captured (ACL capture mode): "
                                "fill static npu buffers before capture and read outputs after replay")


def _copy_into(recorded, fresh) -> None:
    from torch_npu._device import NPUTensor

    old, new = tree_flatten(recorded)[0], tree_flatten(fresh)[0]
    for o, n in zip(old, new):
        if isinstance(o, NPUTensor) and isinstance(n, NPUTensor) and o is not n:
            o._inner.copy_(n._inner)


class _Record:
    def __init__(self, kind, fn, args, kwargs, out):
        self.kind, self.fn, self.args, self.kwargs, self.out = kind, fn, args, dict(kwargs), out

    def replay(self):
        from torch_npu._device import _dispatch

        _state.depth = getattr(_state, "depth", 0) + 1  # replay records nothing
        try:
            fresh = _dispatch(self.fn, self.args, self.kwargs) if self.kind == "aten" else self.fn(*self.args,
                                                                                                  **self.kwargs)
        finally:
            _state.depth -= 1
        _copy_into(self.out, fresh)


def record_aten(func, args, kwargs, out) -> None:
    g = capturing()
    if g is not None and not in_operator():
        g._records.append(_Record("aten", func, args, kwargs, out))


def graph_op(fn):
    """An emulated torch_npu operator: recorded as one node during capture (its inner work is not)."""
    @functools.wraps(fn)
    def op(*args, **kwargs):
        g = capturing()
        if g is None or in_operator():
            return fn(*args, **kwargs)
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            out = fn(*args, **kwargs)
        finally:
            _state.depth -= 1
        g._records.append(_Record("op", fn, args, kwargs, out))
        return out

    return op


class NPUGraph:
    def __init__(self):
        self._records: list[_Record] = []
        self._captured = False
        self.auto_dispatch_capture = False

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if capturing() is not None:
            raise GraphCaptureError("another NPU graph is being captured on this thread")
        self._records, self._captured = [], False
        _state.graph = self

    def capture_end(self):
        _state.graph = None
        self._captured = True

    def replay(self):
        if not self._captured:
            raise RuntimeError("NPUGraph.replay: nothing has been captured")
        for r in self._records:
            r.replay()

    def update(self, cpu_update_input):
        """torch_npu 2.13: one dict per recorded updatable operator, or one dict for all of them."""
        if not self.auto_dispatch_capture:
            raise RuntimeError("The current graph configuration does not support update,Try to capture by setting "
                               "auto_dispatch_capture=True during capture")
        targets = [r for r in self._records if r.kind == "op" and r.fn.__name__ in _UPDATABLE]
        if len(cpu_update_input) == 1:
            cpu_update_input = [dict(cpu_update_input[0]) for _ in targets]
        if len(cpu_update_input) != len(targets):
            raise RuntimeError(f"Currently, there are {len(targets)} operators that need to be updated by capture, "
                               f"and there are only {len(cpu_update_input)} elements in the incoming cpu_update_input "
                               "list")
        for r, new in zip(targets, cpu_update_input):
            for key in _UPDATABLE[r.fn.__name__]:
                if key in new:
                    r.kwargs[key] = list(new[key])

    def reset(self):
        self._records, self._captured = [], False

    def pool(self):
        return (id(self), 0)

    @property
    def num_nodes(self) -> int:
        return len(self._records)


class graph:
    """torch.npu.graph(npu_graph, pool=None, stream=None, auto_dispatch_capture=False, capture_error_mode='global')"""

    def __init__(self, npu_graph, pool=None, stream=None, auto_dispatch_capture=False, capture_error_mode="global"):
        self.npu_graph = npu_graph
        self.pool = pool
        npu_graph.auto_dispatch_capture = auto_dispatch_capture

    def __enter__(self):
        self.npu_graph.capture_begin(self.pool)
        return self.npu_graph

    def __exit__(self, exc_type, exc, tb):
        self.npu_graph.capture_end()
        return False


def graph_pool_handle():
    return (0, 0)


def is_current_stream_capturing() -> bool:
    return capturing() is not None


def synchronize(device=None):
    refuse("torch.npu.synchronize")

