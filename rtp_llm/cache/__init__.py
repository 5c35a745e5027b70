"""The KV cache: C++ block bookkeeping (KVCacheManager), the one KV buffer (KVBuffer) and its sizing."""

from rtp_llm.cache.kv_buffer import KVBuffer
from rtp_llm.cache.kv_cache_manager import CacheStats, KVCacheManager, OutOfBlocksError, SequenceError
from rtp_llm.cache.sizing import kv_cache_blocks

__all__ = ["CacheStats", "KVBuffer", "KVCacheManager", "OutOfBlocksError", "SequenceError", "kv_cache_blocks"]
