"""`evaluate` jobs: measure a model as it is (dense), store the numbers with their protocol."""

from __future__ import annotations

from app.schemas import EvaluateJobCreate
from app.tables import Result
from workers.context import JobContext, JobFailure
from workers.data import DataMissingError, load_wikitext2_test, tokenize_corpus
from workers.environment import run_environment
from workers.evaluate import effective_seqlen
from workers.kinds.steps import load_for_job, measure_perplexity, perplexity_protocol


def run(context: JobContext) -> None:
    spec = EvaluateJobCreate.model_validate(context.request)
    settings = context.settings
    context.report("loading model", 0.02, spec.model)
    source, loaded = load_for_job(context, spec)
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
    measured = measure_perplexity(
        context, loaded.model, token_ids, ppl_spec, seqlen, stage="perplexity", start=0.1, end=1.0
    )

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
                    **perplexity_protocol(measured, ppl_spec, corpus, loaded.dtype, spec.seed),
                    **environment,
                },
            )
        ]
    )
