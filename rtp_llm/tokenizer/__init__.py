from rtp_llm.tokenizer.tokenizer import Tokenizer

__all__ = ["Tokenizer"]
