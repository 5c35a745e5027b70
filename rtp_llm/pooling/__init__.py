"""Pooling: a decoder run for its hidden states instead of the next token (--runner pooling): embeddings, and
scores of cross-encoders and rerankers. Requests are prefills only; no KV block outlives its request."""

from rtp_llm.pooling.config import PoolerConfig, runs_pooling
from rtp_llm.pooling.params import PoolingParams
from rtp_llm.pooling.pooler import Pooler

__all__ = ["PoolerConfig", "PoolingParams", "Pooler", "runs_pooling"]
