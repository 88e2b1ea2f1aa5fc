"""Code that exported per-layer checkpoints carry: it imports only torch, safetensors and
transformers (and its siblings, relatively), so a folder holding these files loads with
`AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)` where prunecast is not
installed. The engine imports the same files, so there is one definition of the sliced modules.
"""
