"""LoRA adapters on the server: the names requests may give as `model` (the base's and each adapter's), /v1/models'
adapter entries, and vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter (with
--allow_runtime_lora_updating). An adapter loaded at run time is checked against the base here, at once; the
engine reads it when a request first names it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rtp_llm.lora.adapter import LoRAAdapter, LoRAError, LoRARequest
from rtp_llm.server.http_errors import APIError
from rtp_llm.server.protocol_base import ApiRequest


@dataclass
class LoRAOptions:
    """--enable_lora, --lora_modules (name -> path, ids 1.. in order, as the engine numbers them), --max_lora_rank,
    --allow_runtime_lora_updating; the base checkpoint (to check adapters loaded at run time against)."""
    enabled: bool = False
    modules: dict = field(default_factory=dict)
    max_rank: int = 16
    runtime_updates: bool = False
    model: Optional[str] = None
    model_type: Optional[str] = None
    hf_overrides: Optional[dict] = None


class LoadLoRARequest(ApiRequest):
    lora_name: str
    lora_path: str


class UnloadLoRARequest(ApiRequest):
    lora_name: str
    lora_int_id: Optional[int] = None  # vLLM's clients may send it: it must be the named adapter's


class LoRARegistry:
    def __init__(self, options: LoRAOptions):
        self.options = options
        self.adapters: dict[str, LoRARequest] = {
            name: LoRARequest(name, i, path) for i, (name, path) in enumerate(options.modules.items(), start=1)}
        self._next_id = len(self.adapters) + 1
        self._model_config = None

    def resolve(self, name: str) -> Optional[LoRARequest]:
        return self.adapters.get(name)

    def load(self, body: LoadLoRARequest, base_name: str) -> str:
        if not self.options.enabled:
            raise APIError(400, "LoRA adapters need --enable_lora", param="lora_name")
        name = body.lora_name
        if name in self.adapters or name == base_name:
            raise APIError(400, f"the name {name!r} is taken (unload the adapter first)", param="lora_name")
        request = LoRARequest(name, self._next_id, body.lora_path)
        try:
            LoRAAdapter.load(request, self.model_config(), self.options.max_rank)
        except LoRAError as exc:
            raise APIError(400, str(exc), param="lora_path") from None
        self._next_id += 1
        self.adapters[name] = request
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, body: UnloadLoRARequest, engine) -> str:
        found = self.adapters.get(body.lora_name)
        if found is None:
            raise APIError(404, f"no LoRA adapter named {body.lora_name!r} is loaded", param="lora_name",
                           code="not_found")
        if body.lora_int_id is not None and body.lora_int_id != found.lora_int_id:
            raise APIError(400, f"lora_int_id {body.lora_int_id} is not {body.lora_name!r}'s ({found.lora_int_id})",
                           param="lora_int_id")
        del self.adapters[body.lora_name]
        engine.unload_lora(body.lora_name)  # forgotten there once its running requests are done
        return f"Success: LoRA adapter '{body.lora_name}' removed successfully."

    def model_config(self):
        if self._model_config is None:
            from rtp_llm.models.default_model import default_model_path
            from rtp_llm.models.loader import load_config

            o = self.options
            self._model_config = load_config(o.model or default_model_path(), o.model_type, o.hf_overrides)
        return self._model_config
