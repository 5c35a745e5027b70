"""Emulated torch_npu: the documented math of each operator on CPU tensors, plus its documented
constraints. See tests/npu_emulator/README.md."""

EMULATED = True
__version__ = "emulated"

from torch_npu import _device  # noqa: E402  (sets up the npu device and torch.npu)
from torch_npu._device import monitor  # noqa: E402,F401
from torch_npu._moe_ops import (  # noqa: E402,F401
    npu_grouped_matmul,
    npu_moe_gating_top_k_softmax,
    npu_moe_init_routing_v2,
    npu_moe_token_unpermute,
)
from torch_npu._ops import (  # noqa: E402,F401
    _npu_reshape_and_cache,
    npu_add_rms_norm,
    npu_convert_weight_to_int4pack,
    npu_fused_infer_attention_score,
    npu_rms_norm,
    npu_rotary_mul,
    npu_scatter_pa_kv_cache,
    npu_swiglu,
    npu_top_k_top_p,
    npu_weight_quant_batchmatmul,
)

npu = _device.npu_module


def _graphed(names):
    """Each emulated operator is one node of an NPU graph being captured (torch_npu/_graph.py)."""
    from torch_npu import _graph

    g = globals()
    for name in names:
        g[name] = _graph.graph_op(g[name])


_graphed(["npu_grouped_matmul", "npu_moe_gating_top_k_softmax", "npu_moe_init_routing_v2", "npu_moe_token_unpermute",
          "_npu_reshape_and_cache", "npu_add_rms_norm", "npu_convert_weight_to_int4pack",
          "npu_fused_infer_attention_score", "npu_rms_norm", "npu_rotary_mul", "npu_scatter_pa_kv_cache",
          "npu_swiglu", "npu_top_k_top_p", "npu_weight_quant_batchmatmul"])


def npu_fusion_attention(*args, **kwargs):
    """Present so that libraries probing torch_npu (transformers) import; not emulated."""
    raise NotImplementedError("npu_fusion_attention is not emulated (the engine uses npu_fused_infer_attention_score)")


npu_fusion_attention.not_emulated = True  # exists in torch_npu; its signature is not checked
