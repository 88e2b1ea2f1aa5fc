"""`evaluate` jobs: measure a model as it is (dense), store the numbers with their protocol."""

from __future__ import annotations

from app.model_sources import ModelSourceError, resolve_model
from app.schemas import EvaluateJobCreate
from app.tables import Result
from workers.context import JobContext, JobFailure
from workers.environment import run_environment


def run(context: JobContext) -> None:
    from workers.data import DataMissingError, load_wikitext2_test, tokenize_corpus
    from workers.evaluate import EvaluationStopped, effective_seqlen, perplexity
    from workers.loading import ModelLoadError, load_model

    spec = EvaluateJobCreate.model_validate(context.request)
    settings = context.settings
    context.report("loading model", 0.02, spec.model)
    try:
        source = resolve_model(spec.model, settings, spec.revision)
        loaded = load_model(source, settings, dtype=spec.dtype, device=spec.device)
    except (ModelSourceError, ModelLoadError) as error:
        raise JobFailure(str(error)) from error
    environment = run_environment(loaded.device)
    context.set_environment(environment)

    ppl_spec = spec.perplexity
    context.report("loading data", 0.08, ppl_spec.dataset)
    try:
        corpus = load_wikitext2_test(settings)
    except DataMissingError as error:
        raise JobFailure(str(error)) from error
    token_ids = tokenize_corpus(loaded.tokenizer, corpus, settings=settings)
    seqlen = effective_seqlen(loaded.model, ppl_spec.seqlen)

    def progress(done: int, total: int) -> None:
        context.report("perplexity", 0.1 + 0.9 * done / max(total, 1), f"window {done}/{total}")

    try:
        measured = perplexity(
            loaded.model,
            token_ids,
            seqlen=seqlen,
            max_windows=ppl_spec.max_windows,
            batch_size=ppl_spec.batch_size,
            progress=progress,
            should_stop=context.should_stop,
        )
    except EvaluationStopped:
        context.check_stop()
        raise
    except ValueError as error:
        raise JobFailure(f"perplexity: {error}") from error

    context.add_results(
        [
            Result(
                model_id=source.model_id,
                model_revision=loaded.revision,
                method="dense",
                sparsity=0.0,
                metric="ppl",
                dataset=ppl_spec.dataset,
                split=corpus.split,
                value=measured.ppl,
                n=measured.tokens_scored,
                source="measured",
                protocol={
                    "seqlen": measured.seqlen,
                    "requested_seqlen": ppl_spec.seqlen,
                    "windows": measured.windows,
                    "max_windows": ppl_spec.max_windows,
                    "nll_mean": measured.nll_mean,
                    "data_sha256": corpus.sha256,
                    "seed": spec.seed,
                    "dtype": str(loaded.dtype).removeprefix("torch."),
                    "elapsed_s": round(measured.elapsed_s, 3),
                    **environment,
                },
            )
        ]
    )
