"""Recognising families: by module structure on the engine side, by config dict on the API side."""

from __future__ import annotations

import subprocess
import sys

import pytest
import transformers
from transformers import AutoModelForCausalLM

from core.families import family_from_config, refusal_reason, stock_layout_refusal, supported_families_text
from core.param_count import predict_sliced_param_count, sliced_width
from tests.workers.slicing.tiny import build, token_ids
from workers.architectures import UnsupportedArchitectureError, detect_family
from workers.slicing.engine import slice_model

SMALL = {"vocab_size": 128, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
SMALL_DECODER = {
    **SMALL,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


@pytest.mark.parametrize(
    ("case", "family"),
    [
        ("llama", "llama"),
        ("mistral", "llama"),
        ("qwen2", "llama"),
        ("qwen3", "llama"),
        ("phi3", "phi3"),
        ("opt", "opt"),
        ("gpt2", "gpt2"),
        ("phi", "phi"),
        ("gpt_neox", "gpt_neox"),
        ("gpt_neox_sequential", "gpt_neox"),
        ("gemma3", "gemma"),
        ("gemma2", "gemma"),
    ],
)
def test_detect_family_recognises_every_supported_architecture(case: str, family: str) -> None:
    assert detect_family(build(case)).name == family


def test_detect_family_goes_by_structure_not_by_name() -> None:
    model = build("llama")
    model.config.model_type = "in_house_llm"
    model.config.architectures = ["InHouseForCausalLM"]

    assert detect_family(model).name == "llama"


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (transformers.BloomConfig(**SMALL, hidden_size=64, n_layer=2, n_head=4), "no adapter recognises"),
        (transformers.Olmo2Config(**SMALL_DECODER), "no norm before attention"),
    ],
)
def test_detect_family_refuses_unsupported_architectures_listing_supported_ones(
    config: transformers.PretrainedConfig, reason: str
) -> None:
    model = AutoModelForCausalLM.from_config(config)

    with pytest.raises(UnsupportedArchitectureError) as raised:
        detect_family(model)

    message = str(raised.value)
    assert type(model).__name__ in message and reason in message
    assert supported_families_text() in message
    for architecture in (
        "LlamaForCausalLM",
        "Phi3ForCausalLM",
        "OPTForCausalLM",
        "GPT2LMHeadModel",
        "PhiForCausalLM",
    ):
        assert architecture in message


def test_a_llama_shaped_model_whose_norm_adds_one_to_its_weight_is_refused() -> None:
    model = AutoModelForCausalLM.from_config(transformers.GemmaConfig(**SMALL_DECODER, head_dim=16))

    with pytest.raises(UnsupportedArchitectureError, match=r"does not compute weight \* x / rms\(x\)"):
        detect_family(model)


def test_a_llama_shaped_model_with_scaled_residuals_is_refused_before_slicing() -> None:
    model = AutoModelForCausalLM.from_config(
        transformers.GraniteConfig(**SMALL_DECODER, residual_multiplier=0.5)
    )

    with pytest.raises(UnsupportedArchitectureError, match="residual structure"):
        slice_model(model, token_ids(2, 8), None, 0.25)


def test_opt_with_projected_embeddings_is_refused_with_the_reason() -> None:
    config = transformers.OPTConfig(
        **SMALL,
        hidden_size=64,
        word_embed_proj_dim=32,
        ffn_dim=128,
        num_hidden_layers=2,
        num_attention_heads=4,
    )

    with pytest.raises(
        UnsupportedArchitectureError, match=r"word_embed_proj_dim \(32\) differs from hidden_size"
    ):
        detect_family(AutoModelForCausalLM.from_config(config))
    assert "word_embed_proj_dim" in str(refusal_reason(config.to_dict()))


@pytest.mark.parametrize(
    ("config", "family"),
    [
        ({"model_type": "mistral"}, "llama"),
        ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, "llama"),
        ({"model_type": "phi3"}, "phi3"),
        ({"architectures": ["OPTForCausalLM"]}, "opt"),
        ({"model_type": "gpt2"}, "gpt2"),
        ({"model_type": "gpt_neox"}, "gpt_neox"),
        ({"architectures": ["PhiForCausalLM"]}, "phi"),
        ({"model_type": "bloom"}, None),
        ({"model_type": "gemma3_text"}, "gemma"),
        ({"architectures": ["Gemma2ForCausalLM"]}, "gemma"),
        ({"model_type": "gemma"}, None),  # Gemma-1: (1 + weight) norms without output norms
        ({"model_type": "olmo2"}, None),
        ({}, None),
    ],
)
def test_family_from_config_reads_model_type_and_architectures(
    config: dict[str, object], family: str | None
) -> None:
    assert family_from_config(config) == family


def test_refusal_reason_is_none_for_supported_configs_and_explains_the_rest() -> None:
    assert refusal_reason({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}) is None
    assert refusal_reason({"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]}) is None
    reason = refusal_reason({"model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"]})
    assert reason is not None and "no norm before attention" in reason and "Supported families" in reason
    multimodal = refusal_reason({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]})
    assert multimodal is not None and "gemma3_text" in multimodal


def test_the_stock_layout_refuses_gemma_naming_its_branch_output_norms() -> None:
    reason = stock_layout_refusal({"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]})

    assert reason is not None and "normalise each branch's output" in reason and "per-layer" in reason
    assert stock_layout_refusal({"model_type": "llama"}) is None


def test_family_and_formula_modules_do_not_import_torch() -> None:
    code = "import sys; import core.families, core.param_count; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize(
    ("hidden", "sparsity", "round_to", "width"),
    [
        (64, 0.0, 8, 64),
        (64, 0.25, 8, 48),
        (576, 0.3, 8, 400),
        (4096, 0.1, 8, 3680),
        (10, 0.3, 1, 7),
        (64, 0.3, 16, 32),
    ],
)
def test_sliced_width_floors_then_rounds_down(
    hidden: int, sparsity: float, round_to: int, width: int
) -> None:
    assert sliced_width(hidden, sparsity, round_to) == width


def test_formula_adds_up_the_sliced_mistral_by_hand() -> None:
    config = build("mistral").config.to_dict()  # V=128, D=64, L=2, 4 heads of 16, 2 KV heads, FFN 128
    vocab, full, d, ffn = 128, 64, 48, 128
    attention = d * (64 + 32 + 32) + 64 * d  # q, k, v read d columns; o writes d rows
    mlp_in = 2 * d * ffn  # gate and up
    first_block = attention + mlp_in + ffn * d + d * d + d * d  # down writes d; two d x d skips
    last_block = attention + mlp_in + ffn * full + d * d + d * full  # head unsliced: down writes D
    expected = vocab * d + first_block + last_block + vocab * full  # norms hold no parameters

    assert predict_sliced_param_count(config, d) == expected
