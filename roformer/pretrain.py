"""MLM pretraining recipe: `roformer pretrain --config FILE`, one process or many through `accelerate launch`.

The config has three sections, `model:` (a ModelConfig, inline or the path of a configs/model file), `data:` (a
DataConfig) and `train:` (a TrainConfig). A run directory holds:

    config.yaml     the fully resolved config (paths absolute, vocab size from the tokenizer)
    metrics.jsonl   one JSON object per event (train events every log_every steps, eval events)
    tokenizer/      the run's tokenizer
    checkpoints/    step-N: the complete training state (accelerate save_state + trainer_state.json)
    final/          model + tokenizer, loadable with roformer.load and convertible with roformer.to_hf

Determinism (what makes `--resume` exact and launches interchangeable):
- Step `s` trains on the blocks at positions [s*G, (s+1)*G) of a per-epoch seeded permutation, G the global batch
  (batch_size x processes x grad_accum); the data position is a function of the step.
- The whole global batch of a step is masked with one generator seeded by (seed, step), in every process; each
  process then takes its rows. The loss is the sum of masked-token cross-entropies divided by the global number of
  masked tokens, so one process with batch 2B, two with B, or one with B and grad_accum 2 compute the same gradient.
- The global torch RNG (dropout) is reseeded from (seed, step, rank) at every step.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from roformer.config import (
    ConfigError,
    ModelConfig,
    apply_overrides,
    check_types,
    from_dict,
    read_mapping,
    read_yaml,
    resolve_paths,
    write_yaml,
)
from roformer.errors import UserError
from roformer.masking import IGNORE_INDEX, continuation_table, mask_tokens
from roformer.model import MaskedLM
from roformer.pretrain_data import DataConfig, build_mlm_data, build_streaming_mlm_data
from roformer.streaming import StreamPacker
from roformer.tokenizer import jieba_presegmenter, save_tokenizer
from roformer.training import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    FINAL_DIR,
    METRICS_FILE,
    SCHEDULES,
    TOKENIZER_DIR,
    CheckpointManager,
    EpochSampler,
    MetricsWriter,
    finish_micro_step,
    flat_config,
    make_accelerator,
    make_optimizer,
    read_metrics,
    share,
)
from roformer.utils import check_output_dir, staged_output_dir

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"


@dataclass
class TrainConfig:
    """Optimisation, schedule, checkpointing and logging of a pretraining run.

    Attributes:
        max_steps: Optimizer steps (each of batch_size x processes x grad_accum blocks).
        log_every: Steps between train events in metrics.jsonl (loss averaged over the interval).
        eval_every: Steps between evaluations on the validation blocks (fixed mask); 0 = only at the end.
        save_every: Steps between checkpoints; 0 = only at the end.
        seed: Seed of the initial weights, the data order, the masks and dropout.
        lr: Peak learning rate of AdamW.
        batch_size: Blocks per device per micro-batch.
        grad_accum: Micro-batches per optimizer step.
        mixed_precision: `no` (fp32), `bf16` or `fp16` (GPU), through accelerate.
        schedule: `linear` or `cosine` decay to 0 at max_steps after warmup, or `constant`.
        warmup_steps: Linear warmup steps; null = warmup_fraction x max_steps.
        warmup_fraction: Warmup as a fraction of max_steps when warmup_steps is null.
        weight_decay: AdamW decay on >= 2-D weights (none on biases and LayerNorm).
        adam_beta1: AdamW beta1.
        adam_beta2: AdamW beta2 (0.98 in RoBERTa-style recipes).
        adam_eps: AdamW epsilon.
        max_grad_norm: Clip the global gradient norm; null = no clipping (the norm is still logged).
        keep_checkpoints: How many of the newest checkpoints to keep.
        eval_batch_size: Blocks per device in evaluation; null = batch_size.
        report_to: accelerate trackers (`tensorboard`, `wandb`, ...) besides metrics.jsonl, which is always written.
        compile: Wrap the model in torch.compile.
        progress: Show a tqdm progress bar.
    """

    max_steps: int = 1000
    log_every: int = 10
    eval_every: int = 200
    save_every: int = 500
    seed: int = 0
    lr: float = 5e-4
    batch_size: int = 32
    grad_accum: int = 1
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    warmup_steps: int | None = None
    warmup_fraction: float = 0.06
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-6
    max_grad_norm: float | None = 1.0
    keep_checkpoints: int = 2
    eval_batch_size: int | None = None
    report_to: list[str] = field(default_factory=list)
    compile: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        check_types(self)
        positive = ("max_steps", "log_every", "batch_size", "grad_accum", "keep_checkpoints")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "save_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 (0 = only at the end), got {getattr(self, name)}")
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ConfigError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if self.schedule not in SCHEDULES:  # Literal is checked already; kept in sync with training.SCHEDULES
            raise ConfigError(f"schedule must be one of {SCHEDULES}")

    @property
    def warmup(self) -> int:
        """Warmup length in optimizer steps."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return int(self.warmup_fraction * self.max_steps)


@dataclass
class PretrainConfig:
    """A pretraining run: `model`, `data`, `train` sections and an optional `label` (the arm name in comparisons)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    label: str | None = None

    def __post_init__(self) -> None:
        model, data = self.model, self.data
        if model.position_encoding == "learned" and model.max_position_embeddings < data.max_seq_len:
            raise ConfigError(
                f"model.max_position_embeddings={model.max_position_embeddings} is shorter than "
                f"data.max_seq_len={data.max_seq_len} (learned positions cannot go beyond their table)"
            )

    @property
    def arm(self) -> str:
        """The label of the run in comparisons (default: the position encoding)."""
        return self.label or self.model.position_encoding

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML-ready)."""
        return {"label": self.label, **{k: asdict(getattr(self, k)) for k in ("model", "data", "train")}}


def load_pretrain_config(path: str | Path, overrides: list[str] | None = None) -> PretrainConfig:
    """Read a pretraining YAML, apply `--set` overrides and resolve paths against the file's folder.

    `model:` may be a mapping or the path of a model YAML (e.g. `../model/roformer-tiny.yaml`); overrides like
    `model.hidden_size=128` apply on top of the included file.

    Raises:
        ConfigError: naming the file and key for unknown keys, wrong types and invalid values.
    """
    path = Path(path)
    data = read_mapping(path, "model/data/train sections")
    if isinstance(data.get("model"), str):
        include = path.parent / data["model"]
        if not include.is_file():
            raise ConfigError(f"{path}: model: file not found: {include}")
        model = read_yaml(include) or {}
        data["model"] = model.get("model", model) if isinstance(model, dict) else model
    resolve_paths(data, ["data.paths", "data.validation_paths", "data.tokenizer"], path.parent)
    apply_overrides(data, overrides or [])
    return from_dict(PretrainConfig, data, source=str(path))


# ----------------------------------------------------------------------------------------------------------------
# Batches: a deterministic function of the step


class StepBatches:
    """The masked global batch of every optimizer step, and each process's share of it (in-memory blocks).

    Args:
        blocks: (N, T) training blocks.
        tokenizer: The tokenizer (special ids, [MASK], vocabulary size, `##` continuations).
        data: The data config (mask rate, whole-word masking).
        seed: Seed of the data order and the masks.
        batch_size: Blocks per process per micro-batch.
        num_processes: Processes.
        grad_accum: Micro-batches per step.
    """

    def __init__(
        self,
        blocks: torch.Tensor,
        tokenizer: Any,
        data: DataConfig,
        seed: int,
        batch_size: int,
        num_processes: int = 1,
        grad_accum: int = 1,
    ) -> None:
        self.blocks = blocks
        self.seed = seed
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.grad_accum = grad_accum
        self.global_batch = batch_size * num_processes * grad_accum
        self.mask_args = mlm_mask_args(tokenizer, data)
        self.sampler = EpochSampler(max(len(blocks), 1), self.global_batch, seed)

    def describe(self) -> str:
        """A few words on the data for the log."""
        return f"{len(self.blocks)} train blocks"

    def epoch_of(self, step: int) -> float:
        """Epochs completed at the start of `step` (fractional)."""
        return step * self.global_batch / len(self.blocks)

    def indices(self, step: int) -> torch.Tensor:
        """(G,) block indices of `step` (see EpochSampler)."""
        return self.sampler.indices(step)

    def blocks_of(self, step: int) -> torch.Tensor:
        """(G, T) unmasked blocks of `step`."""
        return self.blocks[self.indices(step)]

    def step(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked (G, T) ids and labels of `step`, identical in every process."""
        generator = torch.Generator().manual_seed((self.seed << 32) + step)
        return mask_tokens(self.blocks_of(step), generator=generator, **self.mask_args)

    def share(self, batch: torch.Tensor, micro: int, rank: int) -> torch.Tensor:
        """Rows of micro-batch `micro` for process `rank` (chunk micro * processes + rank of the global batch)."""
        return share(batch, micro, rank, self.num_processes, self.batch_size)

    def state_dict(self) -> dict[str, Any]:
        """Nothing to save: the data position is a function of the step."""
        return {}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Nothing to restore (see state_dict)."""


class StreamBatches(StepBatches):
    """Global batches read from a stream (data.streaming): steps come in order; the position is checkpointed."""

    def __init__(self, packer: StreamPacker, tokenizer: Any, data: DataConfig, seed: int, batch_size: int,
                 num_processes: int = 1, grad_accum: int = 1) -> None:  # fmt: skip
        super().__init__(torch.zeros(0, 0), tokenizer, data, seed, batch_size, num_processes, grad_accum)
        self.packer = packer
        self.next_step = 0

    def describe(self) -> str:
        """A few words on the data for the log."""
        return "streamed training blocks"

    def epoch_of(self, step: int) -> float:
        """The epoch the stream is in (whole number: a stream's length is unknown)."""
        return float(self.packer.epoch)

    def blocks_of(self, step: int) -> torch.Tensor:
        """The next G blocks of the stream; `step` must be the next step."""
        if step != self.next_step:
            raise RuntimeError(f"streamed batches come in order: expected step {self.next_step}, got {step}")
        self.next_step += 1
        return self.packer.blocks(self.global_batch)

    def state_dict(self) -> dict[str, Any]:
        """The stream position after the last step taken."""
        return self.packer.state_dict()

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Continue the stream after `step` steps."""
        self.packer.load_state_dict(state)
        self.next_step = step


def mlm_mask_args(tokenizer: Any, data: DataConfig) -> dict[str, Any]:
    """Keyword arguments of `mask_tokens` for a tokenizer and a data config (without ids and generator)."""
    return {
        "mask_token_id": tokenizer.mask_token_id,
        "vocab_size": len(tokenizer),
        "special_ids": sorted(set(tokenizer.all_special_ids)),
        "rate": data.mask_rate,
        "continuation": continuation_table(tokenizer) if data.whole_word_mask else None,
    }


def eval_batch(blocks: torch.Tensor, tokenizer: Any, data: DataConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation blocks under the one fixed evaluation mask (seeded by data.eval_mask_seed)."""
    generator = torch.Generator().manual_seed(data.eval_mask_seed)
    return mask_tokens(blocks, generator=generator, **mlm_mask_args(tokenizer, data))


@torch.no_grad()
def evaluate_mlm(
    model: torch.nn.Module,
    ids: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int,
    device: torch.device,
    rank: int = 0,
    num_processes: int = 1,
    reduce: Any = None,
) -> dict[str, float]:
    """Masked-token loss and accuracy over pre-masked blocks; each process takes a contiguous share of the rows.

    Sums (not means) are reduced across processes, so the result equals one process's exactly.

    Returns:
        {"eval_loss": mean cross-entropy per masked token, "eval_accuracy": top-1 accuracy, "eval_tokens": count}.
    """
    was_training = model.training
    model.eval()
    rows = torch.arange(len(ids)).tensor_split(num_processes)[rank]
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for chunk in rows.split(batch_size):
        x, y = ids[chunk].to(device), labels[chunk].to(device)
        n = int((y != IGNORE_INDEX).sum())
        if n == 0:
            continue
        out = model(x, labels=y, masked_only=True)
        target = y[y != IGNORE_INDEX]
        totals += torch.stack(
            [out.loss.double() * n, (out.logits.argmax(-1) == target).sum().double(), torch.tensor(n, device=device)]
        )
    if reduce is not None:
        totals = reduce(totals)
    model.train(was_training)
    count = max(totals[2].item(), 1.0)
    return {
        "eval_loss": totals[0].item() / count,
        "eval_accuracy": totals[1].item() / count,
        "eval_tokens": int(totals[2].item()),
    }


# ----------------------------------------------------------------------------------------------------------------
# The run


def resolve_config(config: PretrainConfig, tokenizer: Any) -> PretrainConfig:
    """Fit the model section to the data: vocabulary of the tokenizer, [PAD] id, no pooler (MLM trains none)."""
    model = replace(config.model, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, add_pooler=False)
    return replace(config, model=model)


def _config_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    keys = sorted(set(old) | set(new))
    diffs = []
    for key in keys:
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += _config_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return diffs


class Pretrainer:
    """One pretraining run in a run directory (created, refused, overwritten or resumed)."""

    def __init__(
        self,
        config: PretrainConfig,
        output_dir: str | Path,
        resume: bool = False,
        overwrite: bool = False,
    ) -> None:

        self.out = Path(output_dir)
        self.resume = resume
        if resume and overwrite:
            raise UserError("--resume and --overwrite exclude each other")
        if resume and not (self.out / CONFIG_FILE).is_file():
            raise UserError(f"{self.out}: nothing to resume (no {CONFIG_FILE})")
        if not resume:
            check_output_dir(self.out, overwrite)
        train = config.train
        self.accelerator = make_accelerator(train.mixed_precision, train.grad_accum, train.report_to, self.out)
        with self.accelerator.main_process_first():
            build = build_streaming_mlm_data if config.data.streaming else build_mlm_data
            self.data = build(config.data)
        self.config = resolve_config(config, self.data.tokenizer)
        if resume:
            self._check_resumable()
        shape = (train.seed, train.batch_size, self.accelerator.num_processes, train.grad_accum)
        if config.data.streaming:
            transform = jieba_presegmenter() if config.data.jieba else None
            packer = StreamPacker(
                self.data.documents, train.seed, self.data.tokenizer, config.data.max_seq_len, transform
            )
            self.batches: StepBatches = StreamBatches(packer, self.data.tokenizer, config.data, *shape)
        else:
            self.batches = StepBatches(self.data.train, self.data.tokenizer, config.data, *shape)
        self.eval_ids, self.eval_labels = eval_batch(self.data.validation, self.data.tokenizer, config.data)

    # -- set-up ------------------------------------------------------------------------------------------------

    def _check_resumable(self) -> None:
        saved = read_yaml(self.out / CONFIG_FILE)
        new = self.config.to_dict()
        fixed = [d for d in _config_differences(saved, new) if not d.startswith(("train.", "label"))]
        if fixed:
            raise UserError(f"{self.out}: cannot resume with a different model or data config ({'; '.join(fixed)})")
        for diff in _config_differences(saved, new):
            logger.warning("resuming with a changed setting: %s", diff)
        saved_tokenizer = self.out / TOKENIZER_DIR / "vocab.txt"
        vocab = self.data.tokenizer.get_vocab()
        if saved_tokenizer.is_file():
            tokens = saved_tokenizer.read_text(encoding="utf-8").splitlines()
            if tokens != sorted(vocab, key=vocab.__getitem__):
                raise UserError(f"{self.out}: the data gives a different tokenizer than the run's (files changed?)")

    def _prepare_run_dir(self) -> None:
        """Write config.yaml and the tokenizer (fresh runs; an --overwrite run first clears the directory)."""
        if self.accelerator.is_main_process and not self.resume:
            if self.out.exists():
                shutil.rmtree(self.out)
            self.out.mkdir(parents=True)
            write_yaml(self.out / CONFIG_FILE, self.config.to_dict())
            save_tokenizer(self.data.tokenizer, self.out / TOKENIZER_DIR)
        self.accelerator.wait_for_everyone()

    def _build_model(self) -> None:
        train = self.config.train
        torch.manual_seed(train.seed)  # the same seed gives both arms the same initial weights where shapes agree
        model = MaskedLM(self.config.model)
        self.num_parameters = model.num_parameters()
        optimizer, self.scheduler = make_optimizer(
            model, train.lr, train.weight_decay, (train.adam_beta1, train.adam_beta2), train.adam_eps,
            train.warmup, train.max_steps, train.schedule,
        )  # fmt: skip
        if train.compile:
            model = torch.compile(model)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.accelerator.register_for_checkpointing(self.scheduler)
        self.checkpoints = CheckpointManager(self.out / CHECKPOINTS_DIR, train.keep_checkpoints)

    def _restore(self) -> dict[str, Any]:
        """Load the newest complete checkpoint; returns the trainer state (step 0 for a fresh run)."""
        state = {"step": 0, "tokens_seen": 0, "elapsed_sec": 0.0}
        latest = self.checkpoints.latest() if self.resume else None
        if latest is None:
            if self.resume:
                logger.info("no complete checkpoint in %s: starting from step 0", self.out)
            return state
        step, path = latest
        self.accelerator.load_state(str(path))
        state.update(json.loads((path / TRAINER_STATE).read_text()))
        self.batches.load_state_dict(state.pop("data_state", {}), step)
        if state.get("global_batch", self.batches.global_batch) != self.batches.global_batch:
            raise UserError(
                f"{path}: saved with a global batch of {state['global_batch']} blocks, now "
                f"{self.batches.global_batch} (same batch_size x processes x grad_accum needed to resume)"
            )
        if self.accelerator.is_main_process:
            _truncate_metrics(self.out / METRICS_FILE, step)
        self.accelerator.wait_for_everyone()
        logger.info("resumed from %s (step %d)", path, step)
        return state

    # -- training ----------------------------------------------------------------------------------------------

    def run(self) -> Path:
        """Train to max_steps (evaluating, logging, checkpointing), then write final/. Returns the run directory."""
        from tqdm.auto import tqdm

        acc, train = self.accelerator, self.config.train
        self._prepare_run_dir()
        self._build_model()
        state = self._restore()
        if acc.is_main_process:
            self.metrics = MetricsWriter(self.out / METRICS_FILE)
        acc.init_trackers("roformer-pretrain", config=flat_config(self.config.to_dict()))
        start = state["step"]
        logger.info(
            "%s: %s parameters, %s, global batch %d x %d tokens, %d processes",
            self.config.arm,
            f"{self.num_parameters:,}",
            self.batches.describe(),
            self.batches.global_batch,
            self.config.data.max_seq_len,
            acc.num_processes,
        )
        bar = tqdm(total=train.max_steps, initial=start, disable=not (acc.is_main_process and train.progress))
        interval = _Interval()
        tokens_per_step = self.batches.global_batch * self.config.data.max_seq_len
        for step in range(start, train.max_steps):
            loss, grad_norm, data_sec, step_sec = self._train_step(step)
            state["tokens_seen"] += tokens_per_step
            state["elapsed_sec"] += step_sec
            interval.add(loss, grad_norm, data_sec, step_sec, tokens_per_step)
            done = step + 1
            bar.update(1)
            if done % train.log_every == 0 or done == train.max_steps:
                event = interval.event(done, acc.reduce, self.last_lr, state)
                event["epoch"] = round(self.batches.epoch_of(done), 4)
                bar.set_postfix(loss=f"{event['loss']:.4f}", tok_s=f"{event['tokens_per_sec']:.0f}")
                self._log(event, done)
            if (train.eval_every and done % train.eval_every == 0) or done == train.max_steps:
                self._log({"event": "eval", "step": done, **self.evaluate(), "elapsed_sec": state["elapsed_sec"]}, done)
            if (train.save_every and done % train.save_every == 0) or done == train.max_steps:
                self._save_checkpoint(done, state)
        bar.close()
        self._save_final()
        acc.end_training()
        if acc.is_main_process:
            self.metrics.close()
        return self.out

    def _train_step(self, step: int) -> tuple[torch.Tensor, float, float, float]:
        """One optimizer step. Returns (this process's share of the global loss, grad norm, data sec, step sec)."""
        acc = self.accelerator
        self.last_lr = self.scheduler.get_last_lr()[0]  # the rate this step uses (logged with its loss)
        t0 = time.perf_counter()
        ids, labels = self.batches.step(step)
        count = int((labels != IGNORE_INDEX).sum())  # masked tokens in the global batch (every process knows it)
        data_sec = time.perf_counter() - t0
        torch.manual_seed((self.config.train.seed << 32) + step * 4096 + acc.process_index)  # dropout
        self.model.train()
        # accelerator.backward divides by grad_accum and DDP averages over processes: undo both, so the gradient is
        # that of (sum of masked-token losses) / (masked tokens in the global batch).
        scale = acc.num_processes * self.config.train.grad_accum / max(count, 1)
        local = torch.zeros((), device=acc.device)
        grad_norm = 0.0
        for micro in range(self.config.train.grad_accum):
            t1 = time.perf_counter()
            x = self.batches.share(ids, micro, acc.process_index).to(acc.device, non_blocking=True)
            y = self.batches.share(labels, micro, acc.process_index).to(acc.device, non_blocking=True)
            n = int((y != IGNORE_INDEX).sum())
            data_sec += time.perf_counter() - t1
            with acc.accumulate(self.model):
                out = self.model(x, labels=y, masked_only=True)
                # mean over this micro-batch's n tokens -> sum; a micro-batch without masked tokens adds zero
                loss_sum = out.loss * n if n else out.logits.sum() * 0.0
                acc.backward(loss_sum * scale)
                local += loss_sum.detach().float() / max(count, 1)
                norm = finish_micro_step(
                    acc, self.model, self.optimizer, self.scheduler, self.config.train.max_grad_norm
                )
                grad_norm = grad_norm if norm is None else norm
        return local, grad_norm, data_sec, time.perf_counter() - t0

    def evaluate(self) -> dict[str, float]:
        """Masked-token loss and accuracy on the validation blocks under the fixed mask (all processes)."""
        acc = self.accelerator
        batch_size = self.config.train.eval_batch_size or self.config.train.batch_size
        return evaluate_mlm(
            self.model,
            self.eval_ids,
            self.eval_labels,
            batch_size,
            acc.device,
            acc.process_index,
            acc.num_processes,
            reduce=lambda t: acc.reduce(t, "sum"),
        )

    def _log(self, event: dict[str, Any], step: int) -> None:
        if self.accelerator.is_main_process:
            self.metrics.write(event)
        numbers = {k: v for k, v in event.items() if isinstance(v, int | float) and k not in ("step", "event")}
        prefix = "eval/" if event.get("event") == "eval" else "train/"
        self.accelerator.log({prefix + k.removeprefix("eval_"): v for k, v in numbers.items()}, step=step)

    def _save_checkpoint(self, step: int, state: dict[str, Any]) -> None:
        acc = self.accelerator
        if acc.is_main_process:
            self.checkpoints.begin(step)
        acc.wait_for_everyone()
        tmp = self.checkpoints.tmp_path(step)
        acc.save_state(str(tmp))
        if acc.is_main_process:
            trainer_state = {
                **state,
                "step": step,
                "global_batch": self.batches.global_batch,
                "data_state": self.batches.state_dict(),
            }
            (tmp / TRAINER_STATE).write_text(json.dumps(trainer_state))
            self.checkpoints.commit(step)
        acc.wait_for_everyone()

    def _save_final(self) -> None:
        acc = self.accelerator
        acc.wait_for_everyone()
        model = acc.unwrap_model(self.model)
        state = acc.get_state_dict(self.model)  # gathers sharded (FSDP/ZeRO) weights
        if acc.is_main_process:
            model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
            final = MaskedLM(model.config)
            final.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in state.items()})
            with staged_output_dir(self.out / FINAL_DIR, overwrite=True) as staging:
                final.save(staging)
                save_tokenizer(self.data.tokenizer, staging)
        acc.wait_for_everyone()


class _Interval:
    """Sums over the steps between two train events."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = None
        self.grad_norm = 0.0
        self.data_sec = 0.0
        self.step_sec = 0.0
        self.tokens = 0
        self.steps = 0

    def add(self, loss: torch.Tensor, grad_norm: float, data_sec: float, step_sec: float, tokens: int) -> None:
        self.loss = loss if self.loss is None else self.loss + loss
        self.grad_norm += grad_norm
        self.data_sec += data_sec
        self.step_sec += step_sec
        self.tokens += tokens
        self.steps += 1

    def event(self, step: int, reduce: Any, lr: float, state: dict[str, Any]) -> dict[str, Any]:
        """The train event of the interval (loss reduced over processes), then reset."""
        loss = reduce(self.loss, "sum").item() / self.steps
        event = {
            "event": "train",
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": self.grad_norm / self.steps,
            "tokens_seen": state["tokens_seen"],
            "tokens_per_sec": self.tokens / max(self.step_sec, 1e-9),
            "elapsed_sec": state["elapsed_sec"],
            "data_fraction": self.data_sec / max(self.step_sec, 1e-9),
        }
        self.reset()
        return event


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop events after `step` (a resumed run produces them again), rewriting the file atomically."""
    if not path.is_file():
        return
    events = [e for e in read_metrics(path) if e.get("step", 0) <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    tmp.replace(path)


def pretrain(config: PretrainConfig, output_dir: str | Path, resume: bool = False, overwrite: bool = False) -> Path:
    """Run MLM pretraining; returns the run directory. See the module docstring for the layout.

    Raises:
        UserError: bad data, an occupied run directory, nothing to resume, a run that cannot be resumed.
    """
    return Pretrainer(config, output_dir, resume=resume, overwrite=overwrite).run()


__all__ = [
    "PretrainConfig",
    "Pretrainer",
    "StepBatches",
    "TrainConfig",
    "eval_batch",
    "evaluate_mlm",
    "load_pretrain_config",
    "pretrain",
]
