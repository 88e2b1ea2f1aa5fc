"""Tiny random causal LMs saved as ordinary transformers folders, built offline in a second.

Unit tests need a real model folder (config, safetensors, tokenizer) that AutoModelForCausalLM
and AutoTokenizer load with no hub access, without paying for a real checkpoint. The tokenizer
is byte-level BPE with no merges: every UTF-8 byte is one token, so any text round-trips.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

BOS, EOS = "<s>", "</s>"
BYTE_TOKENS = 256
VOCAB_SIZE = BYTE_TOKENS + 2  # 256 byte tokens, then BOS, then EOS
BOS_ID, EOS_ID = BYTE_TOKENS, BYTE_TOKENS + 1

# The sizes every decoder-only family below shares.
_DECODER: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=256,
)
# family -> (config class name, small-config defaults). Every config reads tokens the same way.
_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": (
        "LlamaConfig",
        dict(_DECODER),
    ),
    "mistral": (
        "MistralConfig",
        {**_DECODER, "sliding_window": None},
    ),
    "qwen2": (
        "Qwen2Config",
        dict(_DECODER),
    ),
    "phi3": (
        "Phi3Config",
        {**_DECODER, "original_max_position_embeddings": 256},
    ),
    "opt": (
        "OPTConfig",
        dict(
            hidden_size=64,
            word_embed_proj_dim=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=128,
            max_position_embeddings=256,
            dropout=0.0,
            attention_dropout=0.0,
        ),
    ),
    "gpt2": (
        "GPT2Config",
        dict(n_embd=64, n_layer=2, n_head=4, n_inner=128, n_positions=256),
    ),
    "gemma": (  # Gemma-1: Llama's structure, (1 + weight) norms, which slicing refuses
        "GemmaConfig",
        {**_DECODER, "head_dim": 16},
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        {**_DECODER, "head_dim": 16, "sliding_window": 64},
    ),
}
FAMILIES = tuple(_FAMILIES)


def _byte_stand_ins() -> dict[int, str]:
    """GPT-2's map from each byte to the printable character ByteLevel pre-tokenizing emits."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    stand_ins = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(BYTE_TOKENS):
        if byte not in stand_ins:
            stand_ins[byte] = chr(BYTE_TOKENS + shifted)
            shifted += 1
    return stand_ins


def build_byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges; like Llama's tokenizer it prepends one BOS to each text."""
    stand_ins = _byte_stand_ins()
    vocab = {stand_ins[byte]: byte for byte in range(BYTE_TOKENS)}  # token id == byte value
    vocab[BOS], vocab[EOS] = BOS_ID, EOS_ID
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    backend.add_special_tokens([BOS, EOS])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, eos_token=EOS)


def build_tiny_causal_lm(folder: Path, family: str = "llama", seed: int = 0, **config_overrides: Any) -> Path:
    """Save a tiny random `family` model plus byte tokenizer to `folder`; return `folder`."""
    if family not in _FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    class_name, defaults = _FAMILIES[family]
    config_class = getattr(transformers, class_name)
    settings = {
        **defaults,
        "vocab_size": VOCAB_SIZE,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": None,
        **config_overrides,
    }
    config = config_class(**settings)
    if config.vocab_size != VOCAB_SIZE:
        raise ValueError(f"vocab_size must match the byte tokenizer ({VOCAB_SIZE}), got {config.vocab_size}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    build_byte_tokenizer().save_pretrained(folder)
    return folder
