"""A job's accuracy results as lm-evaluation-harness writes them (`results_*.json`), so that tools
reading lm-eval output read ours: `GET /v1/jobs/{id}/results?format=lm-eval`.

`results` holds the model the job measured: the dense model for `evaluate`, the pruned one for
`prune`. Keys follow lm-eval: `<metric>,<filter>`, the filter `none` where the task applies none
(GSM8K's are `strict-match` and `flexible-extract`). What lm-eval has no
place for (job, method, sparsity, perplexities, the dense accuracy a pruned one compares with)
is under `prunecast`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.methods import DENSE, UNSTRUCTURED, result_method
from core.tables import Job, Result
from core.tasks import TASK_CATALOGUE, lm_eval_keys

LM_EVAL_KINDS = ("evaluate", "prune")
"""Kinds whose results describe one model's accuracy: what an lm-eval results file holds."""


def _is_task_score(row: Result) -> bool:
    info = TASK_CATALOGUE.get(row.dataset)
    return info is not None and row.metric in info.metrics


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
    own = [row for row in rows if _is_task_score(row) and row.method == method]

    results: dict[str, dict[str, Any]] = {}
    configs: dict[str, dict[str, Any]] = {}
    samples: dict[str, dict[str, int]] = {}
    higher: dict[str, dict[str, bool]] = {}
    dense: dict[str, dict[str, Any]] = {}
    for row in own:
        task = row.dataset
        info = TASK_CATALOGUE[task]
        protocol = row.protocol
        value_key, stderr_key = lm_eval_keys(row.metric)
        entry = results.setdefault(task, {"alias": task})
        entry[value_key] = row.value
        entry[stderr_key] = "N/A" if row.stderr is None else row.stderr
        config = configs.setdefault(task, _task_config(task, row, protocol))
        metric_name = row.metric.partition(",")[0]
        better = row.metric not in info.lower_is_better
        aggregation = "perplexity" if metric_name == "perplexity" else "mean"
        listed = {"metric": metric_name, "aggregation": aggregation, "higher_is_better": better}
        if listed not in config["metric_list"]:
            config["metric_list"].append(listed)
        samples[task] = {"original": int(protocol.get("docs_in_split") or 0), "effective": int(row.n or 0)}
        higher.setdefault(task, {})[metric_name] = better
        if "dense_result_id" in protocol:
            dense.setdefault(task, {})[value_key] = protocol.get("dense_value")
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
        "versions": {task: TASK_CATALOGUE[task].version for task in results},
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


def _task_config(task: str, row: Result, protocol: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's `configs` entry of one task, from the protocol its first row was scored under."""
    info = TASK_CATALOGUE[task]
    config: dict[str, Any] = {
        "task": task,
        "dataset_path": protocol.get("data_source"),
        "test_split": row.split,
        "output_type": info.output_type,
        "num_fewshot": protocol.get("num_fewshot", 0),
        "fewshot_delimiter": protocol.get("fewshot_delimiter"),
        "target_delimiter": protocol.get("target_delimiter"),
        "metric_list": [],
        "metadata": {"version": info.version, "data_version": protocol.get("data_version")},
    }
    if info.output_type == "generate_until":
        config["generation_kwargs"] = {
            "until": protocol.get("stop_sequences"),
            "max_gen_toks": protocol.get("max_new_tokens"),
            "do_sample": False,
            "temperature": 0.0,
        }
    return config
