"""Sharded training state through torch.distributed.checkpoint (DCP): written by N processes, read by any number.

Under FSDP2 every parameter and every optimizer moment is a DTensor of which each process holds one slice. What
the engine checkpoints of such a model goes through torch's own machinery, which reshards on load:

- `get_state_dict` names the model's tensors and the optimizer's state by parameter name (the FQN, wrapper prefixes
  removed), not by the optimizer's parameter ids, so a checkpoint does not depend on how the parameters were grouped
  or numbered by the process that wrote it;
- `dcp.save` writes each process's slices with their offsets in the whole tensor (one `.distcp` file per process)
  and one `.metadata` file describing the whole tensors;
- `dcp.load` fills whatever slices the loading processes hold (the state dict of the model as it is sharded now
  serves as the template), reading the parts of the files that overlap them: 2 processes' checkpoint loads on 1 or
  on 3 (tested on CPU with gloo, tests/e2e/test_elastic.py), an unsharded model loads it whole;
- `set_state_dict` puts the values in place, the optimizer's by parameter name again.

The optimizer state is flattened (`flatten_optimizer_state_dict`, as torchtitan and OLMo-core save it): one key per
parameter and moment (`state.<parameter name>.exp_avg`) and per parameter's group setting
(`param_groups.<parameter name>.lr`), so the files say what they hold. A process may hold an empty slice (the 2-row
token-type table over 3 processes): tested.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SHARDED_DIR = "sharded"  # inside a checkpoint: DCP's `.metadata` and one `__R_0.distcp` per process R that wrote it


def is_sharded(model: torch.nn.Module) -> bool:
    """True when the model's parameters are DTensors (FSDP2's `fully_shard`, or accelerate's FSDP2 `prepare`)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _torch_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's wrapper (whose `step` would go through a gradient scaler)."""
    return getattr(optimizer, "optimizer", optimizer)


def sharded_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, Any]]:
    """{"model": ..., "optimizer": ...}: this process's slices of both, named by parameter, as DCP saves them.

    An optimizer that has not stepped yet gets its (zero) state first: torch's state-dict API makes it.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, _torch_optimizer(optimizer), options=_options())
    return {"model": model_state, "optimizer": optimizer_state}


def save_sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Write the model's and the optimizer's state into `directory` (every process of the group calls this).

    Raises:
        CheckpointException: a write failed on some process (DCP's error, carrying each rank's exception).
    """
    import torch.distributed.checkpoint as dcp

    dcp.save(sharded_state_dict(model, optimizer), checkpoint_id=str(directory))


def load_sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Load what `save_sharded_state` wrote, under any number of processes (every process calls this).

    The current state dicts are the template: `dcp.load` reads into this process's slices of them the parts of the
    saved slices that overlap, then `set_state_dict` puts them in place.

    Raises:
        RuntimeError: a file is missing or unreadable on some process, or the checkpoint lacks a tensor the model or
            optimizer has (another model): the first process's reason, in one line, on every process (DCP's
            CheckpointException is a BaseException, which the checkpoint fallback would not catch).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = sharded_state_dict(model, optimizer)
    try:
        dcp.load(state, checkpoint_id=str(directory))
    except CheckpointException as e:
        raise RuntimeError(f"{directory}: {_first_failure(e)}") from None
    set_state_dict(
        model,
        _torch_optimizer(optimizer),
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=_options(),
    )


def _first_failure(error: BaseException) -> str:
    """The first process's reason of a DCP failure ({rank: (exception, traceback)}), in one line."""
    failures = getattr(error, "failures", None) or {}
    for rank in sorted(failures):
        reason = failures[rank][0] if isinstance(failures[rank], tuple) else failures[rank]
        text = str(reason).strip().splitlines()
        return f"rank {rank}: {type(reason).__name__}: {text[0] if text else ''}"
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
