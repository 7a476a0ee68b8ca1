"""accelerate set-up: the process group (also on CPU-only machines), the Accelerator of one run, trackers.

Several processes behave as one: `agree_on_errors` makes a failure that happens on some processes (the main
process building the data, a write on one rank) every process's failure, so none waits forever in a collective; the
process group's collective timeout (`collective_timeout`) is long enough for the first token-store build of a large
corpus, which the other processes wait for.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from roformer.errors import UserError

if TYPE_CHECKING:
    from roformer.train.config import TrainArgs

logger = logging.getLogger(__name__)
T = TypeVar("T")

COLLECTIVE_TIMEOUT_ENV = "ROFORMER_COLLECTIVE_TIMEOUT"  # seconds, for every collective of the process group
DEFAULT_COLLECTIVE_TIMEOUT = 4 * 3600  # a first token-store build of a large corpus, the other processes waiting


def collective_timeout() -> timedelta:
    """How long a process waits in a collective before the group fails (NCCL's default is 10 minutes).

    Raises:
        UserError: ROFORMER_COLLECTIVE_TIMEOUT is not a positive number of seconds.
    """
    raw = os.environ.get(COLLECTIVE_TIMEOUT_ENV)
    try:
        seconds = float(raw) if raw is not None else DEFAULT_COLLECTIVE_TIMEOUT
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise UserError(f"{COLLECTIVE_TIMEOUT_ENV}={raw!r}: expected a positive number of seconds")
    return timedelta(seconds=seconds)


def process_state() -> Any:
    """Accelerate's PartialState (rank, world size) with the CPU process group formed when there is no GPU.

    The first call in a process forms the group, with `collective_timeout()`.
    """
    from accelerate import PartialState

    return PartialState(cpu=not has_accelerator_device(), timeout=collective_timeout())


def gather(value: Any) -> list[Any]:
    """`value` of every process in rank order, on every process (a picklable object; no-op with one process)."""
    if process_state().num_processes == 1:
        return [value]
    from accelerate.utils import gather_object

    return gather_object([value])


def any_process(flag: bool) -> bool:
    """True on every process if `flag` is true on any (one small all-reduce; free with one process)."""
    state = process_state()
    if state.num_processes == 1:
        return flag
    value = torch.tensor(float(flag), device=state.device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


def agree_on_errors(work: Callable[[], T] | None) -> T | None:
    """Run `work` (None: nothing to do on this process), then fail on every process if it failed on any.

    A UserError (bad data, a run stopped for a reason the user must know) on one process is raised on the others
    with the same type and message, so all exit with the same code; another exception keeps its traceback where it
    happened and is a one-line UserError on the others, which would otherwise wait in the next collective.

    Raises:
        UserError: the first failure by rank.
    """
    result, failure, error = None, None, None
    try:
        result = work() if work is not None else None
    except UserError as e:
        failure, error = (type(e), str(e)), e
    except Exception as e:
        first_line = str(e).splitlines()[0] if str(e) else ""
        failure, error = (UserError, f"another process failed: {type(e).__name__}: {first_line}"), e
    if not any_process(failure is not None):  # the common case: one small all-reduce, nothing pickled
        return result
    failures = [f for f in gather(failure) if f is not None]
    if error is not None:
        raise error  # this process's own failure (a bug keeps its traceback)
    kind, message = failures[0]
    raise kind(message)


def run_on_main(work: Callable[[], T]) -> T | None:
    """`work()` on the main process (None elsewhere), every process waiting for it and failing if it fails.

    For what only the main process does (writing files) before all go on: a barrier that also carries the outcome.
    The main process starts only once every process has arrived, so none is still reading what `work` changes (a
    run directory checked for emptiness, a task directory that decides whether to resume).
    """
    state = process_state()
    if state.num_processes > 1:
        state.wait_for_everyone()
    return agree_on_errors(work if state.is_main_process else None)


def broadcast_from_main(value: Any) -> Any:
    """The main process's `value` in every process (a picklable object; no-op with one process)."""
    state = process_state()
    if state.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value])[0]


def make_accelerator(args: TrainArgs, project_dir: Path) -> Any:
    """An Accelerator for one run: trackers checked, CPU process groups formed, quiet non-main processes.

    The `train:` section is the single source of accumulation, clipping and batch size: a launcher config that sets
    them differently is refused, DeepSpeed's `auto` values are filled from it. `train.mixed_precision: null` takes
    the launcher's precision (fp32 without one); the effective precision is logged.

    Raises:
        UserError: a tracker that is unknown or not installed, fp16 without a GPU, a conflicting launcher config.
    """
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    check_run_settings(args)
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if args.mixed_precision is not None and launcher not in (None, "no", args.mixed_precision):
        logger.warning("train.mixed_precision=%s overrides the launcher's %s", args.mixed_precision, launcher)
    if args.deterministic:
        # cuBLAS needs a fixed workspace for repeatable results (read when cuBLAS initialises, so set it first)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if torch.cuda.is_available():
        # TF32 tensor cores for fp32 matmuls (10 mantissa bits; what PyTorch Lightning and HF enable for training)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    reset_accelerator_state()
    accelerator = Accelerator(
        # On a machine without GPUs, processes started by torchrun / `accelerate launch --multi_gpu` must still
        # form a group (gloo); accelerate only does that for CPU when told so.
        cpu=not has_accelerator_device(),
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.grad_accum,
        log_with=args.report_to or None,
        project_dir=str(project_dir),
        kwargs_handlers=[InitProcessGroupKwargs(timeout=collective_timeout())],
    )
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None:
        fill_deepspeed_config(plugin.deepspeed_config, args)
    if not accelerator.is_main_process:  # one process speaks for all
        import datasets

        logging.getLogger().setLevel(logging.WARNING)
        datasets.disable_progress_bars()
    logger.info("mixed precision: %s", accelerator.mixed_precision)
    return accelerator


def check_run_settings(args: TrainArgs) -> None:
    """What `make_accelerator` refuses, without building one: for recipes to check before they write anything.

    Raises:
        UserError: a tracker that is unknown or not installed, a conflicting launcher config, FSDP or fp16 without
            a GPU.
    """
    check_trackers(args.report_to)
    check_launcher_settings(args, os.environ)
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and not has_accelerator_device():
        # accelerate enables FSDP only on accelerator process groups: on CPU it would drop the plugin silently and
        # train as plain data parallel (unsharded checkpoints included)
        raise UserError(
            "the launcher asks for FSDP, which accelerate runs only on GPUs; on CPU use "
            "configs/accelerate/multi-cpu.yaml (data parallel)"
        )
    if args.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise UserError("train.mixed_precision: fp16 needs a GPU (use bf16 or no on CPU)")


def check_launcher_settings(args: TrainArgs, environ: Mapping[str, str]) -> None:
    """Refuse an accelerate launcher config whose accumulation or (DeepSpeed) clipping differs from `train:`.

    accelerate would otherwise let the launcher's value win silently (e.g. 8x the optimizer steps of the recipe).

    Raises:
        UserError: naming both values.
    """
    steps = environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
    if steps not in (None, "auto") and steps != str(args.grad_accum):
        raise UserError(
            f"the accelerate config sets gradient_accumulation_steps={steps} but train.grad_accum={args.grad_accum}: "
            "remove it from the launcher config (train: is the single source) or make them equal"
        )
    clipping = environ.get("ACCELERATE_GRADIENT_CLIPPING")
    if environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and clipping not in (None, "auto", "none"):
        ours = args.max_grad_norm or 0.0
        if float(clipping) != ours:
            raise UserError(
                f"the accelerate config sets gradient_clipping={clipping} but "
                f"train.max_grad_norm={args.max_grad_norm}: "
                "remove it from the launcher config (train: is the single source) or make them equal"
            )


def fill_deepspeed_config(config: dict[str, Any], args: TrainArgs) -> None:
    """Fill a DeepSpeed config's `auto` (or missing) batch, accumulation and clipping values from `train:`.

    We pass no dataloader to `prepare` (batches are built per step), so DeepSpeed cannot infer the micro-batch.
    """
    values = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "gradient_accumulation_steps": args.grad_accum,
        "gradient_clipping": args.max_grad_norm or 0.0,  # 0: no clipping in DeepSpeed
    }
    for key, value in values.items():
        if config.get(key, "auto") == "auto":
            config[key] = value


def reset_accelerator_state() -> None:
    """Forget the settings of an earlier run in this process (accelerate keeps one global state per process).

    Several runs in one process (the experiment runner, notebooks, tests) may differ in mixed precision or
    accumulation; the process group (PartialState) is kept.
    """
    from accelerate.state import AcceleratorState, GradientState

    for state in (AcceleratorState, GradientState):
        reset = getattr(state, "_reset_state", None)
        if reset is not None:
            reset()


def has_accelerator_device() -> bool:
    """True when a GPU (or another torch accelerator such as MPS or XPU) is present."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return accelerator.is_available()
    return torch.cuda.is_available()


def check_trackers(report_to: list[str]) -> None:
    """Every requested tracker must be installed (accelerate would drop a missing one silently)."""
    if not report_to:
        return
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    available = {str(t.value) for t in get_available_trackers()}
    for name in report_to:
        if name not in {t.value for t in LoggerType}:
            raise UserError(f"train.report_to: unknown tracker {name!r} (known: {', '.join(LoggerType.list())})")
        if name != "all" and name not in available:
            raise UserError(f"train.report_to: {name} is not installed (pip install {name})")
