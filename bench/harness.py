"""What every bench starts from, in one place: the import path and offline environment, the model,
calibration, protocol and store arguments, the dense model and its WikiText-2 tokens, calibration
windows and a pruned copy, the machine's facts (versions, threads, load average, commit), measured
child processes, the in-process app a job runs in, and the JSON report written as it grows.

The benches stay scripts (`python bench/<name>.py`); Python puts bench/ on the path, so each one
starts with `import harness` above its first-party imports. Importing this module puts the
repository root on the path and sets `HF_HUB_OFFLINE=1`: no bench fetches from the hub. Torch is
imported lazily, so the service-side benches (predictions_load.py, law_records.py) stay torch-free.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = REPO_ROOT / "bench" / "out"
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

if TYPE_CHECKING:
    import torch
    from fastapi.testclient import TestClient

    from core.settings import Settings
    from workers.calibration import CalibrationBatch
    from workers.loading import LoadedModel
    from workers.pruning import PruningReport

TERMINAL = ("succeeded", "failed", "canceled")
PG_ADMIN_URL = os.environ.get("PRUNECAST_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


# --- arguments -------------------------------------------------------------------------------------


def parser(doc: str | None, name: str, threads: int | None = 2) -> argparse.ArgumentParser:
    """A bench's parser with what every bench takes: `--out` (bench/out/<name>.json, git-ignored) and,
    unless `threads` is None (a bench whose torch runs in other processes), `--threads`; the module
    docstring as its help."""
    made = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if threads is not None:
        made.add_argument("--threads", type=int, default=threads, help="torch intra-op threads")
    made.add_argument("--out", type=Path, default=OUT_DIR / f"{name}.json", help="the JSON report")
    return made


def add_store_args(made: argparse.ArgumentParser, home: str = "none") -> None:
    """The converted-model cache and the data folder (defaults as `make run` has them), and the
    store's home: `home="required"` for benches that start from a fresh store, `"optional"` for
    those that may keep one, `"none"` for those that run the engine without a store."""
    made.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("PRUNECAST_CACHE_DIR", REPO_ROOT / ".prunecast" / "cache")),
        help="converted-model cache",
    )
    made.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("PRUNECAST_DATA_DIR", REPO_ROOT.parent / "shared" / "data")),
        help="folder holding wikitext-2-raw/ and the packaged task data",
    )
    if home != "none":
        made.add_argument(
            "--home",
            type=Path,
            required=home == "required",
            default=None,
            help="the store (SQLite, migrated) and job files: fresh for a clean run, kept for later benches",
        )


def add_model_args(made: argparse.ArgumentParser, model: str = "smollm2-135m") -> None:
    made.add_argument("--model", default=model, help="packaged alias or local folder")


def add_calibration_args(
    made: argparse.ArgumentParser,
    sequences: int = 32,
    length: int = 256,
    corpus: str = "boolq-passages",
    seed: int | None = None,
) -> None:
    """The calibration a job takes: `--calibration-{corpus,sequences,length,seed}`."""
    made.add_argument("--calibration-corpus", default=corpus, help="a packaged corpus")
    made.add_argument("--calibration-sequences", type=int, default=sequences)
    made.add_argument("--calibration-length", type=int, default=length)
    made.add_argument("--calibration-seed", type=int, default=seed, help="default: the job's seed")


def slicing_parser(doc: str | None, name: str, sparsity: float = 0.25) -> argparse.ArgumentParser:
    """The parser of a bench that calls the slicing engine directly (no job, so no job seed): the
    model, store folders, a 2048 x 4 protocol, `--sparsity`, the calibration's corpus, windows and
    length, and `--seed` of its draw."""
    made = parser(doc, name)
    add_model_args(made)
    add_store_args(made)
    add_protocol_args(made, seqlen=2048, windows=4)
    made.add_argument("--sparsity", type=float, default=sparsity)
    made.add_argument("--calibration-sequences", type=int, default=128)
    made.add_argument("--calibration-length", type=int, default=512)
    made.add_argument("--calibration-corpus", default="boolq-passages")
    made.add_argument("--seed", type=int, default=42)
    return made


def add_protocol_args(made: argparse.ArgumentParser, seqlen: int = 512, windows: int = 4) -> None:
    """The perplexity protocol: WikiText-2 test, `--eval-seqlen` tokens a window, the first
    `--eval-windows` windows."""
    made.add_argument("--eval-seqlen", type=int, default=seqlen)
    made.add_argument("--eval-windows", type=int, default=windows)


def calibration_body(args: argparse.Namespace) -> dict[str, Any]:
    """The `calibration` object of a job body, from `add_calibration_args`' arguments."""
    body: dict[str, Any] = {
        "corpus": args.calibration_corpus,
        "num_sequences": args.calibration_sequences,
        "seqlen": args.calibration_length,
    }
    if args.calibration_seed is not None:
        body["seed"] = args.calibration_seed
    return body


def protocol_body(args: argparse.Namespace) -> dict[str, Any]:
    """The `perplexity` protocol of a job body, from `add_protocol_args`' arguments."""
    return {"seqlen": args.eval_seqlen, "max_windows": args.eval_windows}


# --- the machine -----------------------------------------------------------------------------------


def simulation_protocol(args: argparse.Namespace, seqlen: int) -> dict[str, Any]:
    """The protocol of the simulation benches: `--calibration` BoolQ passages (seed 42) and the first
    `--windows` WikiText-2 test windows, both of `seqlen` tokens, fp32 on `--threads`."""
    return {
        "calibration": f"boolq-passages {args.calibration} x {seqlen}, seed 42",
        "evaluation": f"wikitext2 test, first {args.windows} windows of {seqlen}",
        "dtype": "float32",
        "threads": args.threads,
    }


def commit() -> str:
    """The commit the bench ran from, `+dirty` when the tree had changes ("unknown" outside git)."""

    def git(*words: str) -> str:
        done = subprocess.run(["git", *words], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    try:
        head, dirty = (
            git("rev-parse", "--short", "HEAD"),
            git("status", "--porcelain", "--untracked-files=no"),
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head


def machine_facts(with_torch: bool = True) -> dict[str, Any]:
    """What a reader needs to weigh a number: versions, threads, cores, load average, commit."""
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "commit": commit(),
    }
    if with_torch:
        import torch
        import transformers

        facts |= {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "torch_threads": torch.get_num_threads(),
        }
    return facts


def use_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def cpu_seconds() -> float:
    """User plus system CPU time of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_bytes() -> int:
    """Peak RSS of this process so far, as the kernel counts it (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


# --- the report ------------------------------------------------------------------------------------


def start_report(with_torch: bool = True, **fields: Any) -> dict[str, Any]:
    """A report that opens with the machine's facts and the load average at the start."""
    facts = machine_facts(with_torch)
    return {**fields, "environment": facts, "load_average_start": facts["load_average"]}


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write the report whole, through a scratch file: a reader never sees half of one, and a later
    step's failure loses none of what was already written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(path.suffix + ".partial")
    scratch.write_text(json.dumps(report, indent=2, default=str) + "\n")
    scratch.replace(path)


def finish_report(path: Path, report: dict[str, Any]) -> None:
    """Stamp the load average at the end and write the report."""
    report["load_average_end"] = list(os.getloadavg())
    write_report(path, report)
    print(f"wrote {path}", flush=True)


# --- models and data -------------------------------------------------------------------------------


def parse_engine(made: argparse.ArgumentParser) -> tuple[argparse.Namespace, Settings]:
    """Parse an engine-only bench's arguments, put torch on `--threads` and return the settings of
    its `add_store_args` folders: what every such bench does first."""
    args = made.parse_args()
    use_threads(args.threads)
    return args, settings_for(args)


def settings_for(args: argparse.Namespace) -> Settings:
    """Settings for an engine-only bench: the cache and data folders of `add_store_args`."""
    from core.settings import Settings

    return Settings(cache_dir=args.cache_dir, data_dir=args.data_dir)


def load_dense(model: str, settings: Settings, dtype: str = "float32") -> LoadedModel:
    """The dense model on the CPU, as a worker loads it (packaged alias or local folder)."""
    from core.model_sources import resolve_model
    from workers.loading import load_model

    return load_model(resolve_model(model, settings), settings, dtype=dtype, device="cpu")


def wikitext_ids(loaded: LoadedModel, settings: Settings) -> torch.Tensor:
    """The WikiText-2 test split as one token stream, tokenized as the perplexity jobs do."""
    from workers.data import load_wikitext2_test, tokenize_corpus

    return tokenize_corpus(loaded.tokenizer, load_wikitext2_test(settings), settings=settings)


def add_models_args(
    made: argparse.ArgumentParser, models: tuple[str, ...] = ("smollm2-135m", "gemma-3-270m")
) -> None:
    """`--models` and the folders they and their data are read from (`add_store_args`, no store): for
    the benches that run one protocol on several models in turn."""
    made.add_argument("--models", nargs="+", default=list(models), help="packaged aliases or local folders")
    add_store_args(made)


def sample_calibration(tokens: torch.Tensor, count: int, length: int, seed: int) -> torch.Tensor:
    """`count` windows of `length` tokens at seeded random offsets into a 1-D token stream."""
    import torch

    if tokens.numel() < length:
        raise ValueError(f"calibration corpus has {tokens.numel()} tokens, fewer than one window of {length}")
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, tokens.numel() - length + 1, (count,), generator=generator)
    return torch.stack([tokens[start : start + length] for start in starts.tolist()])  # (count, length)


def calibration_batch(
    tokenizer: Any, settings: Settings, count: int, length: int, seed: int, corpus: str = "boolq-passages"
) -> CalibrationBatch:
    """`count` seeded windows of a packaged corpus, drawn as a job draws them (tokens cached)."""
    from workers.calibration import build_calibration, calibration_corpus

    text = calibration_corpus(corpus, None, settings)
    return build_calibration(
        tokenizer, text, num_sequences=count, seqlen=length, seed=seed, settings=settings
    )


def calibration_for(
    loaded: LoadedModel, settings: Settings, args: argparse.Namespace, seed: int
) -> CalibrationBatch:
    """The windows `add_calibration_args`' arguments ask for; `seed` where `--calibration-seed` is unset."""
    chosen = seed if args.calibration_seed is None else args.calibration_seed
    sequences, length = args.calibration_sequences, args.calibration_length
    return calibration_batch(loaded.tokenizer, settings, sequences, length, chosen, args.calibration_corpus)


def prune_copy(
    dense: LoadedModel,
    method: str,
    sparsity: float,
    calibration: CalibrationBatch,
    pattern: str = "unstructured",
) -> tuple[LoadedModel, PruningReport, float]:
    """A fresh copy of `dense` pruned on `calibration` (engine batch 8), its report and the pruning's
    wall seconds: the dense model stays as it was, for the benches that compare the two."""
    from workers.loading import load_copy
    from workers.pruning import prune_model

    pruned = load_copy(dense)
    started = time.perf_counter()
    ids, mask = calibration.input_ids, calibration.attention_mask
    report = prune_model(
        pruned.model, method, sparsity, pattern=pattern, calibration_ids=ids, attention_mask=mask
    )
    return pruned, report, time.perf_counter() - started


# --- measured child processes ----------------------------------------------------------------------


def child_env(args: argparse.Namespace, root: Path | None) -> dict[str, str]:
    """The environment of a measured child: offline, the bench's `add_store_args` folders (so every
    side reads the same converted model), importing the checkout `root` (None: leave the path be)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for folder in ("cache_dir", "data_dir"):
        env[f"PRUNECAST_{folder.upper()}"] = str(getattr(args, folder).resolve())
    return env | ({} if root is None else {"PYTHONPATH": str(root)})


def child_json(command: list[str], cwd: Path, env: dict[str, str], timeout_s: float, label: str = "") -> Any:
    """Run a child that prints its measurement as JSON on its last line; raise with its stderr tail
    (and `label`, what it measured) if it fails, so a bench never records half a comparison."""
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{label or command[0]} in {cwd} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the in-process app ----------------------------------------------------------------------------


def migrated_home(home: Path, args: argparse.Namespace, model_roots: Sequence[Path] = ()) -> Settings:
    """An embedded install in `home` with `add_store_args`' folders, its SQLite store migrated."""
    from core.migrate import upgrade
    from core.settings import Settings

    home.mkdir(parents=True, exist_ok=True)
    roots = list(model_roots)
    settings = Settings(
        home=home, cache_dir=args.cache_dir, data_dir=args.data_dir, model_roots=roots, log_format="console"
    )
    upgrade(settings.store_url)
    return settings


def embedded_store(args: argparse.Namespace) -> Settings:
    """The settings of an embedded install in `args.home`, its store migrated, torch on `args.threads`."""
    use_threads(args.threads)
    return migrated_home(args.home, args)


def kept_or_scratch_store(
    args: argparse.Namespace, stack: contextlib.ExitStack, prefix: str, model_roots: Sequence[Path] = ()
) -> Settings:
    """An embedded install in `args.home`, kept for later benches, or else in a temporary folder
    deleted when `stack` closes; its store migrated."""
    home = args.home or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    return migrated_home(home, args, model_roots)


@contextlib.contextmanager
def scratch_database(admin_url: str = PG_ADMIN_URL) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database (its SQLAlchemy URL), dropped afterwards, as the tests'
    `pg_url` makes one: the benches of the server deployment's store."""
    import psycopg

    from core.migrate import upgrade

    name = f"prunecast_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        upgrade(f"{base}/{name}")
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def follow(
    client: TestClient, job_id: str, timeout_s: float, poll_s: float = 2.0, seen: list[Any] | None = None
) -> Any:
    """Poll a job until it ends or `timeout_s` passes, printing each new stage (and adding it, timed,
    to `seen`); the job as last read, for the benches that record a failed job and go on."""
    started, last = time.perf_counter(), None
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if (job["stage"], job["detail"]) != last:
            last, elapsed = (job["stage"], job["detail"]), round(time.perf_counter() - started, 1)
            print(f"[{elapsed:8.1f}s] {job['kind']} {job['stage']}: {job['detail']}", flush=True)
            if seen is not None:
                seen.append({"t_s": elapsed, **{key: job[key] for key in ("stage", "progress", "detail")}})
        if job["status"] in TERMINAL or time.perf_counter() - started > timeout_s:
            return job
        time.sleep(poll_s)


def run(client: TestClient, job_id: str, timeout_s: float, poll_s: float = 2.0) -> dict[str, Any]:
    """Follow a job to its end, printing each new stage; exit the bench if it does not succeed."""
    started = time.perf_counter()
    job = follow(client, job_id, timeout_s, poll_s)
    if job["status"] != "succeeded":
        raise SystemExit(f"job {job_id} {job['status']}: {job['error']}")
    return {"id": job_id, "status": job["status"], "wall_s": round(time.perf_counter() - started, 1)}


def submit(client: TestClient, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Post a job, follow it to its end and return its wall time and result rows."""
    response = client.post("/v1/jobs", json=body)
    if response.status_code != 202:
        raise SystemExit(f"job refused ({response.status_code}): {response.text}")
    job = run(client, response.json()["id"], timeout_s)
    rows = client.get(f"/v1/jobs/{job['id']}/results", params={"limit": 500}).json()["items"]
    return {**job, "rows": rows}
