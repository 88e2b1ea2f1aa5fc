"""A job's accuracy results as lm-evaluation-harness writes them (`results_*.json`), so that tools
reading lm-eval output read ours: `GET /v1/jobs/{id}/results?format=lm-eval`.

`results` holds the model the job measured: the dense model for `evaluate`, the pruned one for
`prune`. Keys follow lm-eval: `<metric>,<filter>` with the filter `none`. What lm-eval has no
place for (job, method, sparsity, perplexities, the dense accuracy a pruned one compares with)
is under `prunecast`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.methods import DENSE, UNSTRUCTURED, result_method
from core.tables import Job, Result

LM_EVAL_KINDS = ("evaluate", "prune")
"""Kinds whose results describe one model's accuracy: what an lm-eval results file holds."""
ACCURACY_METRICS = ("acc", "acc_norm")
FILTER = "none"  # lm-eval's filter name when no filter is applied
# lm-eval's task versions (the `metadata.version` of each task YAML).
TASK_VERSIONS: dict[str, float] = {
    "arc_easy": 1.0,
    "arc_challenge": 1.0,
    "piqa": 1.0,
    "hellaswag": 1.0,
    "winogrande": 1.0,
    "boolq": 2.0,
    "openbookqa": 1.0,
}


def lm_eval_export(job: Job, rows: Sequence[Result]) -> dict[str, Any]:
    """The lm-eval style document of `job`'s stored results (its own rows, in id order)."""
    request = job.request
    method = (
        DENSE
        if job.kind == "evaluate"
        else result_method(
            str(request.get("method")), str(request.get("pattern", UNSTRUCTURED)), request.get("layout")
        )
    )
    sparsity = 0.0 if job.kind == "evaluate" else request.get("sparsity")
    accuracy = request.get("accuracy") or {}
    own = [row for row in rows if row.metric in ACCURACY_METRICS and row.method == method]

    results: dict[str, dict[str, Any]] = {}
    configs: dict[str, dict[str, Any]] = {}
    samples: dict[str, dict[str, int]] = {}
    higher: dict[str, dict[str, bool]] = {}
    dense: dict[str, dict[str, Any]] = {}
    for row in own:
        task = row.dataset
        protocol = row.protocol
        entry = results.setdefault(task, {"alias": task})
        entry[f"{row.metric},{FILTER}"] = row.value
        entry[f"{row.metric}_stderr,{FILTER}"] = "N/A" if row.stderr is None else row.stderr
        config = configs.setdefault(
            task,
            {
                "task": task,
                "dataset_path": protocol.get("data_source"),
                "test_split": row.split,
                "output_type": "multiple_choice",
                "num_fewshot": protocol.get("num_fewshot", 0),
                "fewshot_delimiter": protocol.get("fewshot_delimiter"),
                "target_delimiter": protocol.get("target_delimiter"),
                "metric_list": [],
                "metadata": {
                    "version": TASK_VERSIONS.get(task),
                    "data_version": protocol.get("data_version"),
                },
            },
        )
        config["metric_list"].append({"metric": row.metric, "aggregation": "mean", "higher_is_better": True})
        samples[task] = {"original": int(protocol.get("docs_in_split") or 0), "effective": int(row.n or 0)}
        higher.setdefault(task, {})[row.metric] = True
        if "dense_result_id" in protocol:
            dense.setdefault(task, {})[f"{row.metric},{FILTER}"] = protocol.get("dense_value")
            dense[task][f"{row.metric}_result_id"] = protocol["dense_result_id"]

    first = own[0].protocol if own else {}
    model_args = f"pretrained={job.model_id}"
    if request.get("revision"):
        model_args += f",revision={request['revision']}"
    if first.get("dtype"):
        model_args += f",dtype={first['dtype']}"
    perplexity = {
        row.dataset: {"ppl": row.value, "seqlen": row.protocol.get("seqlen"), "n_tokens": row.n}
        for row in rows
        if row.metric == "ppl" and row.method == method
    }
    return {
        "results": results,
        "groups": {},
        "configs": configs,
        "versions": {task: TASK_VERSIONS.get(task) for task in results},
        "n-shot": {task: config["num_fewshot"] for task, config in configs.items()},
        "higher_is_better": higher,
        "n-samples": samples,
        "config": {
            "model": "hf",
            "model_args": model_args,
            "batch_size": accuracy.get("batch_size"),
            "device": first.get("device"),
            "limit": accuracy.get("limit"),
            "fewshot_seed": first.get("fewshot_seed"),
        },
        "model_name": job.model_id,
        "model_revision": request.get("revision"),
        "prunecast": {
            "job_id": job.id,
            "kind": job.kind,
            "method": method,
            "sparsity": sparsity,
            "subsample_seed": accuracy.get("subsample_seed"),
            "result_ids": {f"{row.dataset}/{row.metric}": row.id for row in own},
            "dense": dense,
            "perplexity": perplexity,
        },
    }
