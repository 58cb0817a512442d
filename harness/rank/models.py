"""Model presets: transformers configs built from dicts in conf/model/, random init, synthetic tokens.

Weights never come from a hub: every model is built from its config with random init (under
`deepspeed.zero.Init` in the worker, so each rank only ever holds its ZeRO-3 shard).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from harness.contract.schema import ModelConfig, choices
from harness.contract.schema.groups import ModelShape

FAMILIES = choices(ModelConfig, "family")
# Each family's transformers config and causal-LM classes (the families themselves: harness/contract/schema/).
TRANSFORMERS_CLASSES = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "llama": ("LlamaConfig", "LlamaForCausalLM")}


def hf_config(model_cfg: Mapping[str, Any]):
    """The transformers config object for a preset (`family` + `config` kwargs)."""
    import transformers

    family = model_cfg["family"]
    if family not in FAMILIES:
        from harness.contract.errors import ConfigError
        raise ConfigError("model.family", f"unknown family {family!r}; expected one of {FAMILIES}")
    config_cls = getattr(transformers, TRANSFORMERS_CLASSES[family][0])
    return config_cls(**dict(model_cfg["config"]))


def model_factory(model_cfg: Mapping[str, Any]) -> Callable[[], torch.nn.Module]:
    """A function that instantiates the preset's causal LM with random init.

    Call it under `deepspeed.zero.Init`; make the factory before entering it: zero.Init patches
    tensor construction, and transformers' lazy imports (which pull in torch._dynamo) fail under it.
    """
    import transformers

    config = hf_config(model_cfg)
    model_cls = getattr(transformers, TRANSFORMERS_CLASSES[model_cfg["family"]][1])
    return lambda: model_cls(config)


def count_parameters(model_cfg: Mapping[str, Any]) -> int:
    """Exact parameter count, from a meta-device instance (no memory, works for 70B shapes)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(model_cfg))
    return sum(p.numel() for p in model.parameters())


def flops_per_token(shape: ModelShape, n_params: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 x (matmul parameters) + 12 x layers x seq x heads x head_dim.

    The first term counts forward (2) and backward (4) FLOPs of every weight matmul; the input
    embedding is a lookup, so its parameters are excluded (unless tied to the output head). The
    second term is attention's QK^T and AV products (PaLM, appendix B), without a causal discount.
    """
    hidden, heads = shape.hidden_size, shape.num_attention_heads
    head_dim = shape.head_dim or hidden // heads
    matmul_params = n_params if shape.tie_word_embeddings else n_params - shape.vocab_size * hidden
    return 6.0 * matmul_params + 12.0 * shape.num_hidden_layers * seq_len * heads * head_dim


def synthetic_batch(generator: torch.Generator, micro_batch: int, seq_len: int, vocab_size: int,
                    device: torch.device) -> torch.Tensor:
    """Random token ids from a seeded host generator: the same seed gives the same batches on every arm
    and every device type (a few KB copied per step)."""
    ids = torch.randint(0, vocab_size, (micro_batch, seq_len), generator=generator)
    return ids.to(device, non_blocking=True)
