"""LoRA adapters served beside the base model: PEFT adapters loaded and checked against the base (adapter.py), their
deltas added to the base layers' outputs row by row for the rows of each adapter (layers.py), and which adapters are
resident (manager.py)."""

from rtp_llm.lora.adapter import LoRAAdapter, LoRARequest
from rtp_llm.lora.manager import LoRAManager

__all__ = ["LoRAAdapter", "LoRAManager", "LoRARequest"]
