"""Tiny random models of every supported family, built in memory (no files, no hub).

Norm scales, norm biases and linear biases are randomised so that folding them is really tested
(HF initialises scales to 1 and biases to 0, which would make folding a no-op).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import transformers
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

VOCAB = 128
HIDDEN = 64
_COMMON = {
    "vocab_size": VOCAB,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "initializer_range": 0.1,
}
_DECODER = {
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}

CONFIGS: dict[str, Callable[[], PretrainedConfig]] = {
    "llama": lambda: transformers.LlamaConfig(**_DECODER, **_COMMON, tie_word_embeddings=True),
    "llama_biases": lambda: transformers.LlamaConfig(
        **{**_DECODER, "num_hidden_layers": 3}, **_COMMON, attention_bias=True, mlp_bias=True
    ),
    "mistral": lambda: transformers.MistralConfig(**_DECODER, **_COMMON, sliding_window=None),
    "qwen2": lambda: transformers.Qwen2Config(**_DECODER, **_COMMON),  # q/k/v biases
    "qwen3": lambda: transformers.Qwen3Config(**_DECODER, **_COMMON, head_dim=16, tie_word_embeddings=True),
    "phi3": lambda: transformers.Phi3Config(**_DECODER, **_COMMON, original_max_position_embeddings=64),
    "opt": lambda: transformers.OPTConfig(
        hidden_size=HIDDEN,
        word_embed_proj_dim=HIDDEN,
        ffn_dim=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        **_COMMON,
    ),
    "opt_no_bias": lambda: transformers.OPTConfig(
        hidden_size=HIDDEN,
        word_embed_proj_dim=HIDDEN,
        ffn_dim=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        enable_bias=False,
        **_COMMON,
    ),
    "gpt2": lambda: transformers.GPT2Config(
        n_embd=HIDDEN, n_layer=3, n_head=4, n_inner=128, n_positions=64, **_COMMON
    ),
    "phi": lambda: transformers.PhiConfig(
        **{**_DECODER, "num_key_value_heads": 4}, **_COMMON, partial_rotary_factor=0.5, qk_layernorm=True
    ),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        rotary_pct=0.5,
        **_COMMON,
    ),
    "gpt_neox_sequential": lambda: transformers.GPTNeoXConfig(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        use_parallel_residual=False,
        tie_word_embeddings=True,
        **_COMMON,
    ),
    # Norms on both branch outputs, (1 + weight) scales, sliding and full attention layers, q/k norms.
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **{**_DECODER, "num_hidden_layers": 3},
        **_COMMON,
        head_dim=16,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    ),
    # Gemma-2: attention and final-logit soft-capping, no q/k norms.
    "gemma2": lambda: transformers.Gemma2Config(
        **_DECODER,
        **_COMMON,
        head_dim=16,
        sliding_window=4,
        attn_logit_softcapping=20.0,
        final_logit_softcapping=15.0,
    ),
}
# One representative per supported architecture, for the slower end-to-end tests.
FAMILY_CASES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "opt", "gpt2", "phi", "gpt_neox", "gemma3")
ALL_CASES = tuple(CONFIGS)


def build(case: str, seed: int = 0) -> PreTrainedModel:
    """A tiny fp32 model in eval mode with randomised norm scales and biases."""
    return build_from_config(CONFIGS[case](), seed)


def build_from_config(config: PretrainedConfig, seed: int = 0) -> PreTrainedModel:
    """A tiny fp32 model of `config` in eval mode with randomised norm scales and biases."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            is_norm = "norm" in name or ".ln_" in name
            if is_norm and name.endswith("weight"):
                parameter.copy_(0.5 + torch.rand(parameter.shape, generator=generator))
            elif name.endswith("bias"):
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model


def token_ids(rows: int, length: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (rows, length), generator=generator)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected||_F / ||expected||_F."""
    return float((actual.double() - expected.double()).norm() / expected.double().norm())


@torch.no_grad()
def logits(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits


@torch.no_grad()
def mean_nll(model: PreTrainedModel, ids: torch.Tensor) -> float:
    """Mean next-token negative log-likelihood; exp() of it is the perplexity."""
    scores = model(input_ids=ids).logits[:, :-1].double()  # (B, T-1, V)
    return float(
        torch.nn.functional.cross_entropy(scores.reshape(-1, scores.shape[-1]), ids[:, 1:].reshape(-1))
    )
