"""Request bodies of the HTTP API (pydantic), validated before anything reaches the engine.

Fields follow OpenAI's API; a few engine extras (top_k, min_p, repetition_penalty, min_tokens,
ignore_eos, stop_token_ids, allowed_token_ids, bad_words, structured_outputs, guided_*) are accepted as vLLM accepts
them. A field this server does not implement is refused (HTTP 400 naming it, http_errors.py), never dropped: a client asking
for something this server does not do must learn that it did not get it.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from rtp_llm.server.protocol_base import ApiModel, ApiRequest, FieldRule

MAX_N = 16
MAX_STOP = 16
ROLES = ("system", "user", "assistant", "tool", "developer")


class StreamOptions(ApiModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: the usage so far on every chunk


class TextPart(ApiModel):
    type: Literal["text"]
    text: str


class FunctionCall(ApiModel):
    name: str
    arguments: str  # JSON text


class ToolCallItem(ApiModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(ApiModel):
    role: str
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCallItem]] = None  # an assistant turn that called tools
    tool_call_id: Optional[str] = None               # a tool turn: the call it answers
    reasoning_content: Optional[str] = None          # an assistant turn's reasoning, for templates that show it
    # The rest of OpenAI's assistant-message type, so a response's message can be sent back as it came
    # (message.model_dump()): a refusal is what the assistant said; function_call is the legacy single tool call.
    refusal: Optional[str] = None
    function_call: Optional[FunctionCall] = None
    audio: Optional[dict[str, Any]] = None
    annotations: Optional[list[dict[str, Any]]] = None

    @model_validator(mode="after")
    def _assistant_extras(self):
        if self.audio is not None:
            raise FieldRule("audio", "an assistant message's audio is not supported (send audio: null)")
        if self.annotations:
            raise FieldRule("annotations", "an assistant message's annotations are not supported (send null or [])")
        if self.function_call is not None and self.tool_calls:
            raise FieldRule("function_call", "a message gives function_call (legacy) or tool_calls, not both")
        return self

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        # Roles beyond OpenAI's (ROLES) go to the template as vLLM passes them; the template may refuse them.
        if not v or len(v) > 64 or not v.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"role {v!r}: a role is a word of letters, digits, '_' or '-' (e.g. {', '.join(ROLES)})")
        return v

    def text(self) -> str:
        if self.content is None:
            return self.refusal or ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it (transformers' form): tool-call arguments as objects."""
        # content "" rather than None: templates that know no tool calls concatenate it
        msg: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name:
            msg["name"] = self.name
        calls = self.tool_calls or ([ToolCallItem(id="call_0", function=self.function_call)]
                                    if self.function_call is not None else [])
        if calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": _json_or_text(c.function.arguments)}}
                                 for c in calls]
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            msg["reasoning_content"] = self.reasoning_content
        return msg


def _json_or_text(arguments: str):
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


class FunctionDef(ApiModel):
    name: str = Field(..., pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: Optional[str] = None  # rendered by the chat template with the rest of the tool
    parameters: Optional[dict[str, Any]] = None  # a JSON schema of the arguments object
    # Forced calls (tool_choice required / named) always validate. With auto, a strict function's call whose
    # arguments do not validate is not returned as a call (it stays the content the model wrote).
    strict: Optional[bool] = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v):
        if v is not None:
            import jsonschema

            try:
                jsonschema.validators.validator_for(v).check_schema(v)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"not a valid JSON schema: {exc.message}") from None
        return v


class Tool(ApiModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(ApiModel):
    name: str


class NamedToolChoice(ApiModel):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(ApiModel):
    """OpenAI's json_schema format. `name` identifies the schema (OpenAI gives it no other effect); `strict` false or
    absent is enforced exactly too (a stronger guarantee than asked). `description` is accepted as OpenAI and vLLM
    accept it: like the schema itself it is not shown to the model (the grammar enforces the schema; docs/api.md)."""
    name: str = Field(..., min_length=1, max_length=64)
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(ApiModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None

    @model_validator(mode="after")
    def _schema(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format type json_schema needs a json_schema object")
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(f"response_format type {self.type} takes no json_schema")
        return self


class StructuredOutputsRequest(ApiModel):
    """vLLM's structured_outputs request field (exactly one member)."""
    json_: Union[dict[str, Any], str, None] = Field(None, alias="json")
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    disable_any_whitespace: bool = False


# The request fields that constrain the output; a request uses at most one.
STRUCTURED_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar")


class _Sampling(ApiRequest):
    model: Optional[str] = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Union[str, list[str], None] = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    seed: Optional[int] = Field(None, ge=0, le=2**62)
    user: Optional[str] = Field(None, max_length=256)  # the end user's id: in the request's log line
    # engine extras
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0, le=10)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: Optional[list[int]] = None
    logit_bias: Optional[dict[str, float]] = None  # OpenAI: token id (as a string key) -> bias in [-100, 100]
    allowed_token_ids: Optional[list[int]] = Field(None, min_length=1)  # vLLM
    bad_words: Optional[list[str]] = Field(None, max_length=MAX_STOP)   # vLLM
    return_token_ids: bool = False            # vLLM: prompt and output token ids in the response
    return_tokens_as_token_ids: bool = False  # vLLM: logprob tokens as "token_id:<id>"
    prompt_logprobs: Optional[int] = Field(None, ge=-1)  # vLLM: each prompt token's logprob and this many top (-1: all)
    # Structured outputs: OpenAI's response_format, vLLM's structured_outputs and its older guided_* names.
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputsRequest] = None
    guided_json: Union[dict[str, Any], str, None] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None

    @model_validator(mode="after")
    def _token_ids_spelling(self):
        if self.return_tokens_as_token_ids and (self.logprobs is None or self.logprobs is False):  # 0 asks
            raise FieldRule("return_tokens_as_token_ids", "return_tokens_as_token_ids spells the tokens of logprobs: it needs logprobs")
        return self

    @model_validator(mode="after")
    def _prompt_logprobs(self):
        if self.prompt_logprobs is not None and self.stream:
            raise FieldRule("prompt_logprobs", "prompt_logprobs is not available with stream=true (as in vLLM)")
        return self

    @model_validator(mode="after")
    def _stream_options(self):
        if self.stream_options is not None and not self.stream:
            raise FieldRule("stream_options", "stream_options is only allowed with stream=true")
        return self

    @model_validator(mode="after")
    def _one_constraint(self):
        used = [f for f in STRUCTURED_FIELDS if getattr(self, f) is not None
                and not (f == "response_format" and self.response_format.type == "text")]
        if len(used) > 1:
            raise FieldRule(used[1], f"give at most one of {', '.join(used)}")
        return self

    def structured(self) -> tuple[Optional[dict], Optional[str]]:
        """The output constraint as StructuredOutputs' fields, and the request field that asked for it."""
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            return {"json_object": True}, "response_format"
        if rf is not None and rf.type == "json_schema":
            schema = rf.json_schema.schema_
            return {"json": schema if schema is not None else {}}, "response_format.json_schema"
        so = self.structured_outputs
        if so is not None:
            fields = {k: v for k, v in {"json": so.json_, "regex": so.regex, "choice": so.choice,
                                        "grammar": so.grammar, "json_object": so.json_object}.items() if v}
            if so.disable_any_whitespace:
                fields["disable_any_whitespace"] = True
            return fields, "structured_outputs"
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                          ("guided_grammar", "grammar")):
            if getattr(self, name) is not None:
                return {key: getattr(self, name)}, name
        return None, None

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v):
        seen: set[int] = set()
        for key, bias in (v or {}).items():
            try:
                token = int(key)
            except ValueError:
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
            if token in seen:  # "5" and "05": one bias would be dropped
                raise ValueError(f"logit_bias names token {token} twice")
            seen.add(token)
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {key}")
        return v

    def logit_bias_ids(self) -> Optional[dict[int, float]]:
        return None if not self.logit_bias else {int(k): float(v) for k, v in self.logit_bias.items()}

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        return v

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=-1)  # -1: the whole vocabulary (within --max_logprobs)
    add_generation_prompt: bool = True
    tools: Optional[list[Tool]] = Field(None, max_length=128)
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: Optional[dict[str, Any]] = None  # more template variables, e.g. enable_thinking
    continue_final_message: bool = False  # vLLM: the answer continues the last (assistant) message, left open
    echo: bool = False                    # vLLM: the answer starts with that last message's text

    @model_validator(mode="after")
    def _continue(self):
        if self.continue_final_message and self.add_generation_prompt:
            raise FieldRule("continue_final_message", "continue_final_message and add_generation_prompt cannot both be true (set "
                             "add_generation_prompt=false to continue the last message)")
        if self.echo and self.messages[-1].role != "assistant":
            raise FieldRule("echo", "echo repeats the last message when it is the assistant's being continued; the last "
                             f"message here is {self.messages[-1].role!r}")
        return self

    @model_validator(mode="after")
    def _logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldRule("top_logprobs", "top_logprobs needs logprobs=true")
        return self

    @model_validator(mode="after")
    def _tools(self):
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise FieldRule("tools", "tools: two functions have the same name")
        choice = self.tool_choice
        if choice not in (None, "none") and not names:
            raise FieldRule("tool_choice", "tool_choice needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise FieldRule("tool_choice", f"tool_choice names {choice.function.name!r}, which is not among the tools")
        if isinstance(choice, NamedToolChoice) or choice == "required":
            used = self.structured()[1]
            # response_format shapes a text answer (OpenAI): a forced call is none, so it does not apply here
            if used is not None and not used.startswith("response_format"):
                raise FieldRule("tool_choice", f"tool_choice {'required' if choice == 'required' else 'naming a function'} "
                                 f"constrains the answer; it cannot be combined with {used}")
        return self

    def effective_tool_choice(self) -> str:
        """none | auto | required | named (OpenAI's default: auto when there are tools)."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or ("auto" if self.tools else "none")


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int = Field(16, ge=1)
    logprobs: Optional[int] = Field(None, ge=-1)  # -1: the whole vocabulary (within --max_logprobs)
    echo: bool = False  # the prompt first; with logprobs, the prompt tokens' logprobs first (the first one null)
    suffix: Optional[str] = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be an empty list")
            if all(isinstance(x, list) for x in v) and any(not x for x in v):
                raise ValueError("a token-id prompt must not be empty")
            if len(v) > 64 and not all(isinstance(x, int) for x in v):
                raise ValueError("at most 64 prompts per request")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v):
        if v:
            raise ValueError("suffix is not supported")
        return v

    def prompts(self) -> list[Union[str, list[int]]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)
