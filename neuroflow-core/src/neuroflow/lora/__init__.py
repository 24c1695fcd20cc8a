"""LoRA fine-tuning: low-rank adapters on frozen Linear/Conv2d layers, fused into the weights after training."""

from neuroflow.lora.adapter import LoRAAdapter, LoRAConv2d, LoRAError, LoRALinear
from neuroflow.lora.apply import apply_lora, mark_only_lora_as_trainable
from neuroflow.lora.fusion import fuse, unfuse

__all__ = ["LoRAAdapter", "LoRAConv2d", "LoRAError", "LoRALinear", "apply_lora", "fuse",
           "mark_only_lora_as_trainable", "unfuse"]
