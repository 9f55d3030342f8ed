"""The manifest of a live vLLM model's saved state: the name, shape and dtype of every tensor its
sharded_state loader saves and requires, for ``shardsrv layout ... --check MANIFEST.json``, which
compares it with the table the server lays out and prints every difference. A release that renames
a tensor is found before any weights move.

The two lines, in a vLLM pod (``LLM.collective_rpc`` runs a function on every worker, whose
``model_runner.model`` is the live model; the attribute names are vLLM's worker's):

    from shardsrv.manifest import dump
    llm.collective_rpc(lambda worker: dump(worker.model_runner.model, f"manifest-rank-{worker.rank}.json"))
"""

import json

from . import _TORCH_DTYPES

# The table's dtype names (safetensors'), by str(tensor.dtype).
_NAMES = {"torch." + torch_name: name for name, torch_name in _TORCH_DTYPES.items()}


def manifest(state):
    """[{name, shape, dtype}] of a state dict, in its order, dtypes spelled as the table spells them."""
    return [{"name": name, "shape": list(t.shape), "dtype": _NAMES.get(str(t.dtype), str(t.dtype))}
            for name, t in state.items()]


def dump(model, path):
    """Writes the manifest of what vLLM's ShardedStateLoader.save_model would save for model: its
    state dict without the tensors that alias another (the loader's own _filter_subtensors)."""
    from vllm.model_executor.model_loader.sharded_state_loader import ShardedStateLoader

    with open(path, "w") as f:
        json.dump(manifest(ShardedStateLoader._filter_subtensors(model.state_dict())), f)
