from rtp_llm.layers.attention.ascend.backend import AscendAttention

__all__ = ["AscendAttention"]
