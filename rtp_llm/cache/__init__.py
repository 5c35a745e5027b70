"""The KV cache: C++ block bookkeeping (KVCacheManager) and the one KV buffer (KVBuffer)."""

from rtp_llm.cache.kv_buffer import KVBuffer
from rtp_llm.cache.kv_cache_manager import CacheStats, KVCacheManager, OutOfBlocksError, SequenceError

__all__ = ["CacheStats", "KVBuffer", "KVCacheManager", "OutOfBlocksError", "SequenceError"]
