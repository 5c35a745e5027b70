"""Request bodies of the pooling routes (--runner pooling): OpenAI's /v1/embeddings, vLLM's /v1/score and
/classify, and the Jina / Cohere /v1/rerank. The same rules as protocol.py: unknown fields refused, text checked,
null = default."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from rtp_llm.server.protocol_base import ApiModel, ApiRequest, FieldRule

MAX_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request


class _Inputs(ApiRequest):
    """A text, texts, token ids or lists of token ids: one pooling request each."""
    model: Optional[str] = None
    input: Union[str, list[str], list[int], list[list[int]]]
    user: Optional[str] = Field(None, max_length=256)
    add_special_tokens: bool = True       # vLLM: for text inputs

    @field_validator("input")
    @classmethod
    def _input(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("input must not be an empty list")
            if not all(isinstance(x, int) for x in v) and len(v) > MAX_INPUTS:
                raise ValueError(f"at most {MAX_INPUTS} inputs per request")
            if any(isinstance(x, (str, list)) and not x for x in v):
                raise ValueError("an input must not be empty")
        elif not v:
            raise ValueError("input must not be empty")
        return v

    def inputs(self) -> list[Union[str, list[int]]]:
        v = self.input
        if isinstance(v, str):
            return [v]
        if all(isinstance(x, int) for x in v):
            return [list(v)]
        return list(v)


class EmbeddingRequest(_Inputs):
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, ge=1)   # Matryoshka: the first N, renormalised
    normalize: Optional[bool] = None      # vLLM: override the model's normalisation


class ClassifyRequest(_Inputs):
    """vLLM's /classify: each input's label probabilities from a *ForSequenceClassification model."""
    activation: bool = True  # vLLM's: false = the raw logits


class ScoreRequest(ApiRequest):
    """vLLM's /score: text_1 scored against each text_2 (one to many), or pairs one to one."""
    model: Optional[str] = None
    text_1: Union[str, list[str]]
    text_2: Union[str, list[str]]
    user: Optional[str] = Field(None, max_length=256)
    activation: bool = True  # vLLM's: false = the raw logit

    @model_validator(mode="after")
    def _pairs(self):
        a = [self.text_1] if isinstance(self.text_1, str) else self.text_1
        b = [self.text_2] if isinstance(self.text_2, str) else self.text_2
        if not a or not b:
            raise FieldRule("text_2" if a else "text_1", "give at least one text on each side")
        if len(a) != 1 and len(a) != len(b):
            raise FieldRule("text_1", f"text_1 has {len(a)} texts and text_2 {len(b)}: give one text_1, or as many "
                                      f"as text_2 (pairs)")
        if max(len(a), len(b)) > MAX_INPUTS:
            raise FieldRule("text_2", f"at most {MAX_INPUTS} pairs per request")
        return self

    def pairs(self) -> list[tuple[str, str]]:
        a = [self.text_1] if isinstance(self.text_1, str) else list(self.text_1)
        b = [self.text_2] if isinstance(self.text_2, str) else list(self.text_2)
        return list(zip(a * len(b) if len(a) == 1 else a, b))


class RerankDocument(ApiModel):
    text: str


class RerankRequest(ApiRequest):
    """Jina's and Cohere's /rerank (vLLM serves it at /rerank, /v1/rerank and /v2/rerank)."""
    model: Optional[str] = None
    query: str
    documents: list[Union[str, RerankDocument]] = Field(..., min_length=1, max_length=MAX_INPUTS)
    top_n: Optional[int] = Field(None, ge=1)
    return_documents: bool = True
    user: Optional[str] = Field(None, max_length=256)

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]
