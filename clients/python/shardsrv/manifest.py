"""The manifest of a live model's saved state: the name, shape and dtype of every tensor an engine's
sharded_state loader saves and requires, and its check against the table the server lays out. A
release that renames or reshapes a tensor is found before any weights move.

The two lines, in a vLLM pod (``LLM.collective_rpc`` runs a function on every worker, whose
``model_runner.model`` is the live model; the attribute names are vLLM's worker's):

    from shardsrv.manifest import dump
    llm.collective_rpc(lambda worker: dump(worker.model_runner.model, f"manifest-rank-{worker.rank}.json"))

SGLang's ``Engine.collective_rpc`` calls a scheduler method by name and takes no function, so in an
SGLang pod the manifest is read from what the engine saves instead (``saved``; this writes every
rank's weights to DIR; the scheduler reads all three arguments):

    import json; from shardsrv.manifest import saved
    engine.save_sharded_model(path=DIR, pattern=None, max_size=None)
    for r in range(tp): json.dump(saved(DIR, r), open(f"manifest-rank-{r}.json", "w"))

``check`` compares a manifest with the server's table. The comparison is ``shardsrv layout
--check``'s, run as a subprocess, so that it is written once (in Go) and this module reports
exactly what the command prints. ``manifest`` and ``saved`` need only the standard library;
``dump`` runs where the engine's torch and loader are.
"""

import glob
import json
import os
import struct
import subprocess
import tempfile

from . import _TORCH_DTYPES

__all__ = ["CheckError", "check", "dump", "manifest", "saved"]

# The table's dtype names (safetensors'), by str(tensor.dtype).
_NAMES = {"torch." + torch_name: name for name, torch_name in _TORCH_DTYPES.items()}

# The flag of ``shardsrv layout`` that carries each member of a layout (docs/contract.md); vLLM's
# MoE options have vLLM's own flag names.
_LAYOUT_FLAGS = {"engine": "--engine", "engine_version": "--engine-version", "tensor_parallel_size": "--tp",
                 "tp_rank": "--rank", "data_parallel_size": "--dp", "dp_rank": "--dp-rank", "dtype": "--dtype",
                 "enable_expert_parallel": "--ep", "prefill_context_parallel_size": "--prefill-context-parallel-size",
                 "pcp_rank": "--pcp-rank", "enable_eplb": "--enable-eplb",
                 "num_redundant_experts": "--num-redundant-experts",
                 "expert_placement_strategy": "--expert-placement-strategy"}


def manifest(state):
    """[{name, shape, dtype}] of a state dict, in its order, dtypes spelled as the table spells them."""
    return [{"name": name, "shape": list(t.shape), "dtype": _NAMES.get(str(t.dtype), str(t.dtype))}
            for name, t in state.items()]


def dump(model, path):
    """Writes the manifest of what vLLM's ShardedStateLoader.save_model would save for model: its
    state dict without the tensors that alias another or are empty (the loader's own
    _filter_subtensors)."""
    from vllm.model_executor.model_loader.sharded_state_loader import ShardedStateLoader

    with open(path, "w") as f:
        json.dump(manifest(ShardedStateLoader._filter_subtensors(model.state_dict())), f)


def saved(directory, rank, pattern="model-rank-{rank}-part-{part}.safetensors"):
    """The manifest of the files a sharded_state save wrote for rank into directory (the loaders'
    default pattern), read from their safetensors headers alone."""
    out = []
    for path in sorted(glob.glob(os.path.join(directory, pattern.format(rank=rank, part="*")))):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        out += [{"name": name, "shape": t["shape"], "dtype": t["dtype"]} for name, t in header.items()]
    return out


class CheckError(Exception):
    """``shardsrv layout --check`` failed before comparing (no server, no such checkpoint, a bad
    layout): its message."""


def check(entries, checkpoint, layout, server=None, binary=None):
    """The differences between the table the server lays out for layout (as ``Client.layout`` takes
    it: {"engine": "vllm", "tensor_parallel_size": 8, "tp_rank": 3, ...}) and a manifest (a list as
    ``manifest`` returns, or the path of its JSON), one line each as ``shardsrv layout --check``
    prints them: missing, extra, shape and dtype. [] when they agree.

    binary is the shardsrv command (default $SHARDSRV_BIN, else shardsrv on PATH); server its
    --server (default $SHARDSRV_SERVER, else the command's default); a token comes from
    $SHARDSRV_TOKEN, as the command reads it."""
    args = [binary or os.environ.get("SHARDSRV_BIN", "shardsrv"), "layout", "--checkpoint", checkpoint]
    if server is not None:
        args += ["--server", server]
    for key, value in layout.items():
        if key not in _LAYOUT_FLAGS:
            raise ValueError(f"shardsrv: layout member {key!r}: one of {sorted(_LAYOUT_FLAGS)}")
        if isinstance(value, bool):  # the command's switches take their value after "="
            args.append(f"{_LAYOUT_FLAGS[key]}={str(value).lower()}")
        else:
            args += [_LAYOUT_FLAGS[key], str(value)]
    with tempfile.TemporaryDirectory() as tmp:
        path = entries
        if not isinstance(entries, (str, os.PathLike)):
            path = os.path.join(tmp, "manifest.json")
            with open(path, "w") as f:
                json.dump(entries, f)
        run = subprocess.run(args + ["--check", os.fspath(path)], capture_output=True, text=True)
    if run.returncode == 0:
        return []
    differences = run.stdout.splitlines()
    if not differences:  # the command prints differences alone on stdout, and fails after them
        raise CheckError(run.stderr.strip())
    return differences
