"""accelerate set-up: the process group (also on CPU-only machines), the Accelerator of one run, trackers.

Several processes behave as one: `agree_on_errors` makes a failure that happens on some processes (the main
process building the data, a write on one rank) every process's failure, so none waits forever in a collective; the
process group's collective timeout (`collective_timeout`) is long enough for the first token-store build of a large
corpus, which the other processes wait for. Forming the group has its own, short timeout (`rendezvous_timeout`,
`form_process_group`): a process that fails before it joins (a config missing on its node) ends the others within
minutes, in one line each, and they stay responsive to SIGTERM while they wait.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from roformer.errors import UserError, WriteFailed
from roformer.files import is_write_failure, unnamed_write_failure

if TYPE_CHECKING:
    from roformer.train.config import TrainArgs

logger = logging.getLogger(__name__)
T = TypeVar("T")

COLLECTIVE_TIMEOUT_ENV = "ROFORMER_COLLECTIVE_TIMEOUT"  # seconds, for every collective of the process group
DEFAULT_COLLECTIVE_TIMEOUT = 4 * 3600  # a first token-store build of a large corpus, the other processes waiting
RENDEZVOUS_TIMEOUT_ENV = "ROFORMER_RENDEZVOUS_TIMEOUT"  # seconds, for every process to join the process group
DEFAULT_RENDEZVOUS_TIMEOUT = 300  # the nodes of a job start together; importing torch on a slow shared disk is slow
_POLL_SECONDS = 0.2  # how often a waiting process looks again (a short sleep: signal handlers run in between)

# The store of our rendezvous, kept for the life of the process: on rank 0 it holds the TCPStore server that the
# process group's own rendezvous (accelerate's init_process_group, on the same port) then shares.
_rendezvous_store: Any = None


class RendezvousFailed(UserError):
    """The process group did not form: a process never joined (it failed or was not started) or went away."""


def collective_timeout() -> timedelta:
    """How long a process waits in a collective before the group fails (NCCL's default is 10 minutes).

    Raises:
        UserError: ROFORMER_COLLECTIVE_TIMEOUT is not a positive number of seconds.
    """
    return _seconds_from_env(COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT)


def rendezvous_timeout() -> timedelta:
    """How long a process waits for every other one to join the process group before it gives up.

    Separate from `collective_timeout`: a process that failed at start-up never joins, and the others must not wait
    hours for it.

    Raises:
        UserError: ROFORMER_RENDEZVOUS_TIMEOUT is not a positive number of seconds.
    """
    return _seconds_from_env(RENDEZVOUS_TIMEOUT_ENV, DEFAULT_RENDEZVOUS_TIMEOUT)


def _seconds_from_env(name: str, default: float) -> timedelta:
    """A positive number of seconds from environment variable `name`, `default` when it is unset.

    Raises:
        UserError: the variable is set to something else.
    """
    raw = os.environ.get(name)
    try:
        seconds = float(raw) if raw is not None else default
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):  # also refuses nan, which passes every comparison
        raise UserError(f"{name}={raw!r}: expected a positive number of seconds")
    return timedelta(seconds=seconds)


def process_state() -> Any:
    """Accelerate's PartialState (rank, world size) with the CPU process group formed when there is no GPU.

    The first call in a process forms the group: every process joins within `rendezvous_timeout()`
    (`form_process_group`), then accelerate creates the group with `collective_timeout()`.

    Raises:
        RendezvousFailed: a process did not join in time.
    """
    from accelerate import PartialState

    form_process_group()
    return PartialState(cpu=not has_accelerator_device(), timeout=collective_timeout())


def form_process_group() -> None:
    """Wait until every process of a multi-process launch has joined, within `rendezvous_timeout()`.

    torch's own rendezvous (init_process_group) waits for the other processes with the group's collective timeout,
    hours here, in C++ where no signal handler runs: a process that failed before joining held the others, deaf to
    SIGTERM, until then. So every process first checks in at the launch's store (MASTER_ADDR:MASTER_PORT, the one
    torch uses: hosted by rank 0, or by the node-0 agent of `accelerate launch` / torchrun) and waits there, polling
    from Python, for the others. Once all are in, accelerate's init_process_group finds them all and forms the group
    at once. A no-op with one process, outside a torch.distributed launch, or once the group exists.

    Raises:
        RendezvousFailed: the timeout passed with processes missing, the store could not be reached or went away;
            one line that names this process, the others missing, the address and the timeout.
        UserError: ROFORMER_RENDEZVOUS_TIMEOUT is not a positive number of seconds.
    """
    global _rendezvous_store
    if _rendezvous_store is not None:
        return
    env = os.environ
    try:
        world_size, rank, port = int(env.get("WORLD_SIZE", "1")), int(env.get("RANK", "")), int(env["MASTER_PORT"])
    except (KeyError, ValueError):  # not a torch.distributed launch (or MPI): accelerate handles it as before
        return
    import torch.distributed as dist

    if world_size <= 1 or not env.get("MASTER_ADDR") or not dist.is_available() or dist.is_initialized():
        return
    rendezvous = _Rendezvous(rank, world_size, env["MASTER_ADDR"], port, rendezvous_timeout())
    store = rendezvous.connect()
    rendezvous.wait_for_everyone(store)
    _rendezvous_store = store


class _Rendezvous:
    """One process's check-in at the launch's TCPStore, every wait bounded by one deadline and made in Python."""

    def __init__(self, rank: int, world_size: int, host: str, port: int, timeout: timedelta) -> None:
        self.rank, self.world_size, self.host, self.port, self.timeout = rank, world_size, host, port, timeout
        self.deadline = time.monotonic() + timeout.total_seconds()
        # torch's env:// rendezvous: the node-0 agent of torchrun / accelerate launch hosts the store when it says
        # so, else rank 0 does; the same libuv choice, so that the group's rendezvous can share rank 0's server.
        self.agent_store = _env_flag("TORCHELASTIC_USE_AGENT_STORE")
        self.use_libuv = os.environ.get("USE_LIBUV", "1") == "1"
        run = os.environ.get("TORCHELASTIC_RUN_ID", "")
        self.key = f"roformer/rendezvous/{run}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"  # per restart

    def connect(self) -> Any:
        """The store: started here on rank 0 (without torch's blocking wait for the others), else reached.

        Raises:
            RendezvousFailed: the port is taken (rank 0), or nothing answered there before the deadline.
        """
        from torch.distributed import TCPStore

        if self.rank == 0 and not self.agent_store:
            try:
                return TCPStore(
                    self.host,
                    self.port,
                    self.world_size,
                    is_master=True,
                    timeout=self.timeout,
                    wait_for_workers=False,
                    multi_tenant=True,
                    use_libuv=self.use_libuv,
                )
            except RuntimeError as e:
                raise self.failure(f"could not listen on port {self.port}: {_first_line(e)}", waited=False) from None
        # Probe with a plain socket before torch's client connects: torch's connect retries in C++ (deaf to
        # signals) and logs a stack trace per failed attempt; a refused probe costs nothing and says nothing.
        error = "no answer"
        while True:
            try:
                socket.create_connection((self.host, self.port), timeout=max(0.1, min(2.0, self.left()))).close()
                break
            except OSError as e:
                error = e.strerror or str(e) or type(e).__name__
            if self.left() <= 0:
                raise self.failure(
                    f"waited {self.seconds} s for the store of rank 0 at {self.address} ({error}): rank 0 never "
                    "started it (it failed first, or MASTER_ADDR/MASTER_PORT are wrong)"
                )
            time.sleep(min(_POLL_SECONDS, self.left()))
        try:
            return TCPStore(
                self.host,
                self.port,
                is_master=False,
                timeout=timedelta(seconds=max(1.0, self.left())),
                wait_for_workers=False,
                use_libuv=self.use_libuv,
            )
        except RuntimeError as e:
            raise self.failure(f"could not join the store at {self.address}: {_first_line(e)}") from None

    def wait_for_everyone(self, store: Any) -> None:
        """Check in, then wait (short sleeps: SIGTERM is handled at once) until every process has.

        Raises:
            RendezvousFailed: the deadline passed first, or the store went away (the process hosting it ended).
        """
        count = f"{self.key}/count"
        try:
            store.set(f"{self.key}/{self.rank}", "1")
            joined = store.add(count, 1)
            while joined < self.world_size:
                if self.left() <= 0:
                    raise self.failure(self.missing(store, joined))
                time.sleep(min(_POLL_SECONDS, self.left()))
                joined = store.add(count, 0)
        except RuntimeError as e:  # torch's DistError: the connection to the store broke
            raise self.failure(
                f"lost the store at {self.address} ({_first_line(e)}): the process hosting it ended", waited=False
            ) from None

    def missing(self, store: Any, joined: int) -> str:
        """Which processes did not join, for the error (at most 8 named)."""
        absent = []
        for rank in range(self.world_size):
            if not store.check([f"{self.key}/{rank}"]):
                absent.append(rank)
                if len(absent) == 8:
                    break
        names = ", ".join(map(str, absent)) + (", ..." if len(absent) == 8 else "")
        ranks = (
            f"rank {names}"
            if self.world_size - joined == 1
            else f"{self.world_size - joined} processes (ranks {names})"
        )
        return f"waited {self.seconds} s at {self.address} for {ranks}, which never joined"

    def failure(self, what: str, waited: bool = True) -> RendezvousFailed:
        """The one-line error: this process, what went wrong, where to look, and the setting to wait longer."""
        hint = f"; {RENDEZVOUS_TIMEOUT_ENV}=SECONDS waits longer" if waited else ""
        return RendezvousFailed(
            f"the process group did not form: rank {self.rank} of {self.world_size} {what} (a process that fails at "
            f"start-up prints why in its own node's log{hint})"
        )

    @property
    def address(self) -> str:
        """MASTER_ADDR:MASTER_PORT."""
        return f"{self.host}:{self.port}"

    @property
    def seconds(self) -> str:
        """The timeout, in seconds, as the user wrote it."""
        return f"{self.timeout.total_seconds():g}"

    def left(self) -> float:
        """Seconds until the deadline (negative after it)."""
        return self.deadline - time.monotonic()


def _env_flag(name: str) -> bool:
    """True when environment variable `name` is "True" (how torch.distributed.elastic writes its flags)."""
    return os.environ.get(name, "").lower() == "true"


def _first_line(error: BaseException) -> str:
    """An exception's first line (torch's C++ errors continue with a stack trace)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


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
    with the same type and message, so all exit with the same code; a failed write that no writer named (a folder
    made on a full disk) is a WriteFailed (exit 74) on every process; another exception keeps its traceback where it
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
        if is_write_failure(e):
            error = unnamed_write_failure(e)
            failure = (WriteFailed, str(error))
        else:
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


def set_torch_flags(args: TrainArgs) -> None:
    """The process-wide torch settings of a training run, set before its accelerator (the engine calls this).

    They outlive the run (torch has no scope for them), which is why they are set here, in the open, and not as a
    side effect of building something: deterministic algorithms when `train.deterministic`, TF32 matmuls on a GPU.
    """
    if args.deterministic:
        # cuBLAS needs a fixed workspace for repeatable results (read when cuBLAS initialises, so set it first)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if torch.cuda.is_available():
        # TF32 tensor cores for fp32 matmuls (10 mantissa bits; what PyTorch Lightning and HF enable for training)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def make_accelerator(args: TrainArgs, project_dir: Path) -> Any:
    """An Accelerator for one run: trackers checked, CPU process groups formed, quiet non-main processes.

    The `train:` section is the single source of accumulation, clipping and batch size: a launcher config that sets
    them differently is refused, DeepSpeed's `auto` values are filled from it. `train.mixed_precision: null` takes
    the launcher's precision (fp32 without one); the effective precision is logged.

    Raises:
        UserError: a tracker that is unknown or not installed, fp16 without a GPU, a conflicting launcher config.
        RendezvousFailed: a process did not join the process group in time.
    """
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    check_run_settings(args)
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if args.mixed_precision is not None and launcher not in (None, "no", args.mixed_precision):
        logger.warning("train.mixed_precision=%s overrides the launcher's %s", args.mixed_precision, launcher)
    reset_accelerator_state()
    form_process_group()  # every process joins within the short rendezvous timeout first
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
