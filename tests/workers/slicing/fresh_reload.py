"""Load saved models in a fresh interpreter that cannot import this project, as a user would.

`python -I` from an empty folder, the editable install's finder removed (the project is installed
in this venv), HF_HUB_OFFLINE=1: only torch and transformers are left to load the folder with
`AutoModelForCausalLM.from_pretrained`. Each folder holds `inputs.pt` ({"ids", "prompt",
"new_tokens"}); the interpreter writes `reloaded.pt` next to it: logits, greedy generation with the
KV cache, config and parameter count, or the error loading raised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

SCRIPT = """
import importlib.util, json, sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if not getattr(h, "__module__", "").startswith("__editable__")]
sys.path_importer_cache.clear()
for package in ("workers", "core", "app"):
    if importlib.util.find_spec(package) is not None:
        raise SystemExit(f"the project's {package} is importable: this would not prove a stock load")
import torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(1)
folders, trust = json.loads(sys.argv[1]), sys.argv[2] == "trust"
for folder in folders:
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, trust_remote_code=trust
        ).eval()
    except Exception as error:  # recorded for the test to read
        torch.save({"error": f"{type(error).__name__}: {error}"}, folder + "/reloaded.pt")
        continue
    inputs = torch.load(folder + "/inputs.pt")
    with torch.no_grad():
        logits = model(inputs["ids"]).logits
        generated = model.generate(
            inputs["prompt"], max_new_tokens=inputs["new_tokens"], do_sample=False, use_cache=True,
            pad_token_id=0,
        )
    torch.save({"logits": logits, "generated": generated, "config": model.config.to_dict(),
                "class": type(model).__name__,
                "parameters": sum(p.numel() for p in model.parameters())}, folder + "/reloaded.pt")
"""


def greedy(model: Any, prompt: torch.Tensor, new_tokens: int, use_cache: bool = True) -> torch.Tensor:
    with torch.no_grad():
        generated: torch.Tensor = model.generate(
            prompt, max_new_tokens=new_tokens, do_sample=False, use_cache=use_cache, pad_token_id=0
        )
    return generated


def write_inputs(folder: Path, ids: torch.Tensor, prompt: torch.Tensor, new_tokens: int) -> None:
    torch.save({"ids": ids, "prompt": prompt, "new_tokens": new_tokens}, folder / "inputs.pt")


def reload_fresh(
    folders: list[Path], scratch: Path, *, trust_remote_code: bool = False
) -> list[dict[str, Any]]:
    """What a fresh interpreter without the project got from each folder (see the module docstring)."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "HF_MODULES_CACHE": str(scratch / "modules")}
    completed = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            SCRIPT,
            json.dumps([str(f) for f in folders]),
            "trust" if trust_remote_code else "no",
        ],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return [torch.load(folder / "reloaded.pt") for folder in folders]
