"""The body of POST /v1/responses (OpenAI's Responses API as the openai client and the Agents SDK send it). The same
rules as protocol.py: a field this server does not implement is a 400 naming it, null means the default.

Input items: messages (a string or input_text / output_text / refusal parts), function_call, function_call_output
and reasoning items, the shapes a previous response's output comes back in."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field, model_validator

from rtp_llm.server.protocol import MAX_STOP, FunctionDef, JsonSchemaFormat
from rtp_llm.server.protocol_base import ApiModel, ApiRequest, FieldRule


class InputText(ApiModel):
    type: Literal["input_text"]
    text: str


class OutputText(ApiModel):
    type: Literal["output_text"]
    text: str
    annotations: Optional[list[dict[str, Any]]] = None  # what a previous answer carried: none here
    logprobs: Optional[list[dict[str, Any]]] = None

    @model_validator(mode="after")
    def _plain(self):
        if self.annotations:
            raise FieldRule("annotations", "output_text annotations are not supported (send null or [])")
        return self


class RefusalPart(ApiModel):
    type: Literal["refusal"]
    refusal: str


class MessageItem(ApiModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[str, list[Union[InputText, OutputText, RefusalPart]]]
    id: Optional[str] = None
    status: Optional[str] = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.refusal if isinstance(p, RefusalPart) else p.text for p in self.content)


class FunctionCallItem(ApiModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: Optional[str] = None
    status: Optional[str] = None


class FunctionCallOutputItem(ApiModel):
    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, list[InputText]]
    id: Optional[str] = None
    status: Optional[str] = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningText(ApiModel):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(ApiModel):
    type: Literal["reasoning"]
    id: Optional[str] = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: Optional[list[ReasoningText]] = None
    status: Optional[str] = None

    def text(self) -> str:
        return "".join(p.text for p in self.content or self.summary)


InputItem = Union[MessageItem, FunctionCallItem, FunctionCallOutputItem, ReasoningItem]


class FunctionTool(FunctionDef):
    """The Responses API's function tool: the function's fields at the top level."""
    type: Literal["function"]


class NamedTool(ApiModel):
    type: Literal["function"]
    name: str


class TextFormat(ApiModel):
    """text.format: text, json_object, or json_schema with its fields at the top level (name, schema, strict,
    description)."""
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None
    description: Optional[str] = None

    @model_validator(mode="after")
    def _schema(self):
        if self.type == "json_schema" and (not self.name or self.schema_ is None):
            raise FieldRule("format", "text.format json_schema needs a name and a schema")
        return self


class TextOptions(ApiModel):
    format: Optional[TextFormat] = None


class ReasoningOptions(ApiModel):
    effort: Optional[Literal["none", "minimal", "low", "medium", "high"]] = None
    summary: Optional[str] = None

    @model_validator(mode="after")
    def _summary(self):
        if self.summary is not None:
            raise FieldRule("summary", "reasoning summaries are not produced here (the reasoning comes back whole "
                                       "as a reasoning item); send null")
        return self


class ResponsesRequest(ApiRequest):
    model: Optional[str] = None
    input: Union[str, list[InputItem]]
    instructions: Optional[str] = None
    tools: Optional[list[FunctionTool]] = Field(None, max_length=128)
    tool_choice: Union[Literal["none", "auto", "required"], NamedTool, None] = None
    parallel_tool_calls: bool = True
    text: Optional[TextOptions] = None
    reasoning: Optional[ReasoningOptions] = None
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    store: bool = True
    previous_response_id: Optional[str] = None
    stream: bool = False
    metadata: Optional[dict[str, str]] = Field(None, max_length=16)  # kept with the response, returned as given
    user: Optional[str] = Field(None, max_length=256)
    truncation: Literal["auto", "disabled"] = "disabled"  # auto: the oldest turns dropped until the input fits
    include: Optional[list[str]] = Field(None, max_length=0)  # nothing extra to include: an empty list only
    # vLLM's extras, as on chat
    seed: Optional[int] = Field(None, ge=0, le=2**62)
    stop: Union[str, list[str], None] = Field(None, max_length=MAX_STOP)

    @model_validator(mode="after")
    def _input(self):
        if isinstance(self.input, list) and not self.input:
            raise FieldRule("input", "input must not be an empty list")
        if isinstance(self.input, str) and not self.input:
            raise FieldRule("input", "input must not be empty")
        names = [t.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise FieldRule("tools", "tools: two functions have the same name")
        if self.tool_choice not in (None, "none") and not names:
            raise FieldRule("tool_choice", "tool_choice needs tools")
        if isinstance(self.tool_choice, NamedTool) and self.tool_choice.name not in names:
            raise FieldRule("tool_choice", f"tool_choice names {self.tool_choice.name!r}, which is not among the tools")
        return self

    def response_format(self) -> Optional[dict]:
        """text.format as chat's response_format."""
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": JsonSchemaFormat(name=fmt.name, schema=fmt.schema_,
                                                                       strict=fmt.strict,
                                                                       description=fmt.description).model_dump(
            by_alias=True, exclude_none=True)}
