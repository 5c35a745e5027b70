"""Huawei Ascend NPU through torch_npu + CANN.

Detection never crashes: torch_npu may be missing, or present with CANN libraries that do not load; each case
is reported with the reason. On an NPU the KV block size must be one the fused attention kernel accepts for
prefill: 128, 256, 384 or 512 (vllm-ascend fixes 128).
"""

from __future__ import annotations

import importlib.util
import logging

import torch

from rtp_llm.device.attention import TorchRefAttention
from rtp_llm.device.base import Device
from rtp_llm.config.model_config import parse_dtype
from rtp_llm.device.npu import versions
from rtp_llm.device.npu.attention import AscendAttention

log = logging.getLogger(__name__)


def npu_status() -> tuple[bool, str]:
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed (pip install torch-npu matching your torch and CANN versions)"
    try:
        import torch_npu  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:  # CANN libraries missing or mismatched
        return False, (f"torch_npu does not load ({type(exc).__name__}: {exc}); source CANN's set_env.sh and check "
                       "the torch / torch_npu / CANN version pairing")
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        return False, "torch_npu loads but sees no NPU (check npu-smi info and ASCEND_RT_VISIBLE_DEVICES)"
    installed = getattr(torch_npu, "__version__", "")
    if not getattr(torch_npu, "EMULATED", False) and installed.split("+")[0] != versions.TORCH_NPU:
        log.warning("npu: torch_npu %s is installed; rtp-llm's NPU path is checked against torch_npu %s (torch %s), "
                    "see rtp_llm/device/npu/versions.py", installed, versions.TORCH_NPU, versions.TORCH)
    return True, ""


class NpuDevice(Device):
    name = "npu"
    runs_lora = True  # TorchOps.lora_add's torch ops (index_select, mm, index_copy_), checked on the emulator
    collective_backend = "hccl"
    attention_backends = {"torch_ref": TorchRefAttention, "ascend": AscendAttention}
    default_attention = "ascend"
    default_block_size = 128
    # Fused attention in TND layout takes at most 16 query tokens per request in a decode round (vllm-ascend:
    # num_speculative_tokens + 1 <= 16).
    max_decode_query_tokens = 16
    VALID_BLOCK_SIZES = (128, 256, 384, 512)
    # The fused attention in TND layout with a block table runs CANN's prompt-flash tiling, which takes bfloat16 only
    # ("When layout is TND, inputDataType should be bf16": ops-transformer prompt_flash_attention_tiling.cpp) and no
    # float32 (torch_npu 2.13 docs): on Atlas A2/A3 the whole model, its activations and the KV cache run in bfloat16.
    DTYPES = (torch.bfloat16,)

    @classmethod
    def available(cls):
        return npu_status()

    @classmethod
    def self_check(cls) -> list:
        from rtp_llm.device.npu.self_check import check_npu

        return check_npu(npu_status)

    @property
    def torch_device(self) -> torch.device:
        return torch.device("npu", self.index)

    def bind_thread(self) -> None:
        torch.npu.set_device(self.index)

    def synchronize(self) -> None:
        torch.npu.synchronize()

    def memory_info(self):
        return torch.npu.mem_get_info()

    def stream(self):
        return torch.npu.current_stream()

    def model_dtype(self, requested, stored: torch.dtype) -> torch.dtype:
        if requested in (None, "auto"):
            if stored != torch.bfloat16:
                log.info("npu: the checkpoint's weights load as %s; the model, its activations and the KV cache run in "
                         "bfloat16 (cast at load: the fused attention in TND layout takes bfloat16 only)", stored)
            return torch.bfloat16
        dtype = parse_dtype(requested)
        if dtype not in self.DTYPES:
            raise ValueError(f"--dtype {requested}: the NPU (Atlas A2/A3) runs bfloat16 only: the fused attention in TND "
                             "layout takes bfloat16 queries (CANN's prompt-flash tiling refuses float16, and float32 "
                             "is no input dtype of it); use --dtype bfloat16 or auto")
        return dtype

    # The TND tiling takes equal query / key / value head dims of 64 or 128 (ops-transformer
    # prompt_flash_attention_tiling.cpp, CheckInputShapeWhenLayoutIsTND; 192 is for MLA-style models, not run here).
    HEAD_DIMS = (64, 128)

    def check_model(self, cfg) -> None:
        if cfg.head_dim not in self.HEAD_DIMS:
            raise ValueError(f"head_dim {cfg.head_dim} is not supported on NPU: npu_fused_infer_attention_score in TND "
                             f"layout takes head dims {' or '.join(map(str, self.HEAD_DIMS))}; run this model with "
                             "--device cpu")

    def decode_graphs(self, model, kv, attn, block_size: int, max_model_len: int, max_batch: int):
        if self.options.get("npu_graph", "on") == "off":
            return None
        from rtp_llm.device.npu.graph import NpuDecodeGraphs

        return NpuDecodeGraphs(model, kv, attn, block_size, max_model_len, max_batch)

    def validate_block_size(self, block_size: int) -> None:
        if block_size not in self.VALID_BLOCK_SIZES:
            raise ValueError(f"block_size {block_size} is not supported on NPU: npu_fused_infer_attention_score "
                             f"needs a multiple of 128 up to 512 for prefill ({self.VALID_BLOCK_SIZES})")

    def ops(self):
        from rtp_llm.device.npu.ops import NpuOps

        return NpuOps()
