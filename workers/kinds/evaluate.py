"""`evaluate` jobs: measure a model as it is (dense), store the numbers with their protocol.

Stages: loading model, then perplexity (detail "window i/W") when asked, then accuracy (detail
"<task> i/N") when asked; perplexity and accuracy share the job's progress after loading.
"""

from __future__ import annotations

from core.methods import DENSE
from core.specs.jobs import EvaluateJobCreate
from workers.context import JobContext, JobFailure
from workers.data import DataMissingError, load_wikitext2_test, tokenize_corpus
from workers.environment import run_environment
from workers.evaluation.perplexity import effective_seqlen
from workers.kinds.accuracy_steps import measure_accuracy, plan_tasks
from workers.kinds.rows import accuracy_results, dense_perplexity_result
from workers.kinds.steps import load_for_job, measure_perplexity


def run(context: JobContext) -> None:
    spec = EvaluateJobCreate.model_validate(context.request)
    settings = context.settings
    context.report("loading model", 0.02, spec.model)
    source, loaded = load_for_job(context, spec)
    environment = run_environment(loaded.device, loaded.memory_plan)
    context.set_environment(environment)
    # Check the task data before spending time on perplexity.
    plans = plan_tasks(spec.accuracy, loaded) if spec.accuracy is not None else []
    accuracy_start = 0.1 if spec.perplexity is None else (0.55 if plans else 1.0)

    ppl_spec = spec.perplexity
    if ppl_spec is not None:
        context.report("loading data", 0.08, ppl_spec.dataset)
        try:
            corpus = load_wikitext2_test(settings)
        except DataMissingError as error:
            raise JobFailure(str(error)) from error
        token_ids = tokenize_corpus(loaded.tokenizer, corpus, settings=settings)
        seqlen = effective_seqlen(loaded.model, ppl_spec.seqlen)
        measured = measure_perplexity(
            context,
            loaded.model,
            token_ids,
            ppl_spec,
            seqlen,
            stage="perplexity",
            start=0.1,
            end=accuracy_start,
            precision=ppl_spec.precision,  # a dense model has nothing to pair with: unpaired
            order_seed=spec.seed,
        )
        context.add_results(
            [
                dense_perplexity_result(
                    measured,
                    source=source,
                    loaded=loaded,
                    spec=ppl_spec,
                    corpus=corpus,
                    seed=spec.seed,
                    environment=environment,
                )
            ]
        )

    if spec.accuracy is not None:
        tasks = [plan.name for plan in plans]
        for scored in measure_accuracy(
            context,
            loaded.model,
            loaded.tokenizer,
            spec.accuracy,
            tasks,
            stage="accuracy",
            start=accuracy_start,
            end=1.0,
        ):
            context.add_results(
                accuracy_results(
                    scored,
                    source=source,
                    loaded=loaded,
                    method=DENSE,
                    sparsity=0.0,
                    seed=spec.seed,
                    environment=environment,
                    keep_docs=True,
                )
            )
