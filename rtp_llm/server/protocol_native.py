"""Request bodies of the native route (RTP-LLM's prompt + generate_config) and of /tokenize and /detokenize;
the same rules as protocol.py (unknown fields refused, text checked)."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import AliasChoices, Field, field_validator, model_validator

from rtp_llm.server.protocol import MAX_N, MAX_STOP, ChatMessage, Tool
from rtp_llm.server.protocol_base import ApiModel, ApiRequest, FieldRule


class GenerateConfig(ApiModel):
    """RTP-LLM's generate_config (the subset this engine implements)."""
    max_new_tokens: int = Field(256, ge=1)
    min_new_tokens: int = Field(0, ge=0)
    temperature: float = Field(1.0, ge=0, le=2)
    top_k: int = Field(0, ge=-1)
    top_p: float = Field(1.0, gt=0, le=1)
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0, le=10)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    random_seed: Optional[int] = Field(None, ge=0, le=2**62)
    stop_words_str: list[str] = Field(default_factory=list, max_length=MAX_STOP)
    stop_words_list: list[list[int]] = Field(default_factory=list, max_length=MAX_STOP)
    num_return_sequences: int = Field(1, ge=1, le=MAX_N)
    return_incremental: bool = False
    ignore_eos: bool = False
    timeout_ms: Optional[int] = Field(None, gt=0)

    @field_validator("stop_words_list")
    @classmethod
    def _single_token_stops(cls, v):
        if any(len(x) != 1 for x in v):
            raise ValueError("stop_words_list entries must be single token ids ([[id], ...])")
        return v


class NativeRequest(ApiRequest):
    prompt: str
    generate_config: GenerateConfig = Field(default_factory=GenerateConfig)
    yield_generator: bool = False


class TokenizeRequest(ApiRequest):
    model: Optional[str] = None  # vLLM's clients send it: the served model's name
    prompt: Optional[str] = Field(None, validation_alias=AliasChoices("prompt", "content"))  # llama.cpp: content
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: Optional[bool] = None     # default: true for a prompt, false for messages (vLLM's)
    add_generation_prompt: Optional[bool] = None  # messages only (default true)
    tools: Optional[list[Tool]] = None                      # with messages: rendered as chat completions do
    chat_template_kwargs: Optional[dict[str, Any]] = None
    return_token_strs: bool = False                          # vLLM: the vocabulary strings of the ids too

    @model_validator(mode="after")
    def _one(self):
        if (self.prompt is None) == (self.messages is None):
            raise FieldRule("prompt" if self.prompt is not None else "messages",
                            "give exactly one of prompt or messages")
        if self.messages is None and (self.tools is not None or self.chat_template_kwargs is not None
                                      or self.add_generation_prompt is not None):
            raise FieldRule(next(f for f in ("tools", "chat_template_kwargs", "add_generation_prompt")
                                 if getattr(self, f) is not None),
                            "tools, chat_template_kwargs and add_generation_prompt go with messages")
        return self


class DetokenizeRequest(ApiRequest):
    model: Optional[str] = None
    tokens: list[int]
