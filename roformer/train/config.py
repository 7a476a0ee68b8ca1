"""The recipes' configs: the `train:` sections (one meaning per field) and the whole run configs.

`TrainArgs` holds every field that pretraining and fine-tuning share, with one meaning in both; `TrainConfig`
(pretraining) and `FinetuneTrainConfig` (fine-tuning) add their own fields and their own defaults. `PretrainConfig`
(`roformer pretrain`, the studies) and `FinetuneConfig` (`roformer finetune`, `roformer suite`) are whole run
configs, read with `roformer.config.load(PretrainConfig, path, overrides)`; the `data:` sections are in
roformer.data.config, the `model:` section is roformer.model.config.ModelConfig.

What the loader and the resume policy must know about a field is in its metadata (roformer.config: PATH, INCLUDE,
MAY_CHANGE_ON_RESUME, ...). A subclass that changes a field's default repeats its metadata (a test checks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar, Literal

from roformer.config import (
    INCLUDE,
    MAY_CHANGE_ON_RESUME,
    MAY_CHANGE_ON_RESUME_QUIETLY,
    MAY_CHANGE_UNTIL_A_RUN_FINISHES,
    PATH,
    PATH_OR_NAME,
    STAGE,
    STAGE_LR_PHASE,
    check_seed,
    check_types,
    field_keys,
    from_dict,
)
from roformer.data.config import DataConfig
from roformer.errors import ConfigError
from roformer.model.config import ModelConfig
from roformer.tasks.config import PLACEHOLDER_VOCABULARY, SECTIONS, FinetuneDataConfig, Vocabulary

SCHEDULES = ("linear", "cosine", "constant", "wsd", "inverse_sqrt")
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


@dataclass
class TrainArgs:
    """Fields shared by pretraining and fine-tuning.

    Attributes:
        seed: Seed of the initial weights (a fine-tuning head), the data order, the masks and dropout.
        lr: Peak learning rate of AdamW.
        batch_size: Examples (blocks) per device per micro-batch.
        grad_accum: Micro-batches per optimizer step.
        mixed_precision: `no` (fp32), `bf16` or `fp16` (GPU), through accelerate; null = the launcher's setting
            (`accelerate launch` config or --mixed_precision), fp32 without one. The effective value is logged.
        schedule: `linear` or `cosine` decay to 0 at the last step after warmup, `constant`, `wsd`
            (warmup-stable-decay: warmup, the peak held, then `decay_fraction` of the steps decaying to 0 in
            `decay_shape`; Hu et al. 2024, MiniCPM; Hägele et al. 2024; mmBERT's recipe), or `inverse_sqrt` (the
            Transformer's: lr x min(s / warmup, sqrt(warmup / s)) at update s = 1, 2, ...; fairseq's
            `inverse_sqrt`; it needs a warmup and does not depend on the run's length).
        decay_fraction: `wsd`: the last fraction of the steps that decays (0.2: Hägele et al.'s cooldown).
        decay_shape: `wsd`: the decay's shape: `linear`, `cosine` or `1-sqrt` (1 - sqrt(progress), which Hägele et
            al. 2024 found to match a cosine schedule's loss at the same length).
        warmup_steps: Linear warmup steps; null = warmup_fraction x steps.
        warmup_fraction: Warmup as a fraction of the steps when warmup_steps is null.
        weight_decay: AdamW decay on >= 2-D weights (none on biases and LayerNorm).
        adam_beta1: AdamW beta1.
        adam_beta2: AdamW beta2 (0.98 in RoBERTa-style recipes).
        adam_eps: AdamW epsilon.
        max_grad_norm: Clip the global gradient norm; null = no clipping (the norm is still logged).
        log_every: Steps between train events in metrics.jsonl (loss and gradient norm averaged over the interval).
        eval_every: Evaluate every N steps and at the last step; 0 = only at the last step; null = at the end of
            every epoch (and at the last step).
        eval_batch_size: Examples per device in evaluation; null = batch_size.
        save_every: Steps between checkpoints; 0 = none before the end of the run.
        keep_checkpoints: How many of the newest checkpoints to keep.
        report_to: accelerate trackers (`tensorboard`, `wandb`, ...) besides metrics.jsonl, which is always written.
        max_bad_steps: Consecutive steps with a non-finite loss or gradient norm (each skipped and logged) after
            which the run stops, naming its last good checkpoint.
        compile: Wrap the model in torch.compile.
        gradient_checkpointing: Recompute each block in the backward pass instead of keeping its activations
            (activation checkpointing): the same losses and gradients, less memory, about a third more compute.
        unpadding: Compute a padded batch's blocks on its real tokens alone (`Model.set_unpadding`): the same values
            at every real token, the padding's share of the work saved (62% of a CoNLL-2003 batch's positions);
            null = on unless `compile` (the real tokens' count changes every batch, and finding them breaks the graph).
        deterministic: `torch.use_deterministic_algorithms`: bitwise-repeatable runs (and resumes) also where
            kernels would accumulate with atomics (Inductor's compiled backward on CPU, many CUDA kernels), at some
            speed; without it such runs repeat to ~1e-7. Eager CPU runs are bitwise-repeatable either way.
        progress: Show a tqdm progress bar.
    """

    seed: int = 0
    lr: float = field(default=5e-4, metadata=STAGE_LR_PHASE)
    # the process layout, under the same global batch (batch_size x processes x grad_accum): the checkpoint and every
    # finished run's record carry it, and a resume under another one is refused (roformer.train.engine)
    batch_size: int = field(default=32, metadata={**MAY_CHANGE_ON_RESUME, **STAGE})
    grad_accum: int = field(default=1, metadata={**MAY_CHANGE_ON_RESUME, **STAGE})
    mixed_precision: Literal["no", "bf16", "fp16"] | None = None
    schedule: Literal["linear", "cosine", "constant", "wsd", "inverse_sqrt"] = field(
        default="linear", metadata=STAGE_LR_PHASE
    )
    warmup_steps: int | None = field(default=None, metadata=STAGE_LR_PHASE)
    warmup_fraction: float = field(default=0.06, metadata=STAGE_LR_PHASE)
    decay_fraction: float = field(default=0.2, metadata=STAGE_LR_PHASE)
    decay_shape: Literal["linear", "cosine", "1-sqrt"] = field(default="1-sqrt", metadata=STAGE_LR_PHASE)
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-6
    max_grad_norm: float | None = 1.0
    log_every: int = field(default=10, metadata=MAY_CHANGE_ON_RESUME)
    eval_every: int | None = field(default=200, metadata=MAY_CHANGE_UNTIL_A_RUN_FINISHES)
    eval_batch_size: int | None = field(default=None, metadata=MAY_CHANGE_ON_RESUME)
    save_every: int = field(default=500, metadata=MAY_CHANGE_ON_RESUME)
    keep_checkpoints: int = field(default=2, metadata=MAY_CHANGE_ON_RESUME)
    report_to: list[str] = field(default_factory=list, metadata=MAY_CHANGE_ON_RESUME_QUIETLY)
    max_bad_steps: int = field(default=20, metadata=MAY_CHANGE_ON_RESUME)
    compile: bool = False
    gradient_checkpointing: bool = field(default=False, metadata=MAY_CHANGE_ON_RESUME)  # same losses, recomputed
    unpadding: bool | None = None
    deterministic: bool = False
    progress: bool = field(default=True, metadata=MAY_CHANGE_ON_RESUME_QUIETLY)

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("log_every", "batch_size", "grad_accum", "keep_checkpoints", "max_bad_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_every is not None and self.eval_every < 0:
            raise ConfigError(f"eval_every must be >= 0 (0 = only at the end) or null, got {self.eval_every}")
        if self.save_every < 0:
            raise ConfigError(f"save_every must be >= 0 (0 = only at the end), got {self.save_every}")
        if self.eval_batch_size is not None and self.eval_batch_size < 1:
            raise ConfigError(f"eval_batch_size must be >= 1 or null, got {self.eval_batch_size}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0 or null, got {self.warmup_steps}")
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ConfigError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if self.schedule == "inverse_sqrt" and (
            self.warmup_steps == 0 or (self.warmup_steps is None and self.warmup_fraction == 0)
        ):
            raise ConfigError("schedule: inverse_sqrt needs a warmup (warmup_steps >= 1, or warmup_fraction > 0)")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ConfigError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        check_seed("seed", self.seed)
        for name in ("adam_beta1", "adam_beta2"):  # AdamW's own check, as a config error rather than a traceback
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.adam_eps <= 0 or self.weight_decay < 0:
            raise ConfigError(
                f"adam_eps must be > 0 and weight_decay >= 0, got {self.adam_eps} and {self.weight_decay}"
            )
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            # a negative norm gives a negative clip coefficient: the update would climb the loss
            raise ConfigError(f"max_grad_norm must be > 0 or null (no clipping), got {self.max_grad_norm}")

    def unpadding_on(self) -> bool:
        """Whether the model computes on real tokens alone: `unpadding`, or when null, unless compiled."""
        return not self.compile if self.unpadding is None else self.unpadding

    def warmup_for(self, steps: int) -> int:
        """Warmup length in optimizer steps for a run of `steps` steps."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return int(self.warmup_fraction * steps)

    def decay_for(self, steps: int) -> int:
        """`wsd`: the decay's length in optimizer steps for a run of `steps` steps (at least one)."""
        return max(1, round(self.decay_fraction * steps))

    @property
    def eval_size(self) -> int:
        """Examples per device in evaluation."""
        return self.eval_batch_size or self.batch_size


@dataclass
class TrainConfig(TrainArgs):
    """Pretraining: the shared fields (see TrainArgs) and the run length.

    Attributes:
        max_steps: Optimizer steps (each of batch_size x processes x grad_accum blocks).
        last_layer_subset: The last block computes the masked positions alone (`MaskedLM.set_last_layer_subset`:
            the same logits, about 5% fewer FLOPs in a 12-layer model at 15% masking); null = on unless `compile`
            (finding the positions breaks the graph) and under FSDP. Dropout in the last block then draws masks for
            those rows only.
    """

    max_steps: int = field(default=1000, metadata=MAY_CHANGE_UNTIL_A_RUN_FINISHES)
    last_layer_subset: bool | None = None

    def last_layer_subset_on(self) -> bool:
        """Whether the masked-only last layer is on: `last_layer_subset`, or when null, unless compiled."""
        return not self.compile if self.last_layer_subset is None else self.last_layer_subset

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {self.max_steps}")


@dataclass
class FinetuneTrainConfig(TrainArgs):
    """Fine-tuning: the shared fields, BERT's recipe as defaults, and the grid of learning rates and seeds.

    Defaults: 3 epochs, batch 32, lr 2e-5, 10% warmup, evaluation at the end of every epoch, no checkpoint inside a
    run (a finished run's record is its checkpoint; `save_every: N` adds them for long runs).

    Attributes:
        epochs: Training epochs (fractional allowed); ignored when max_steps is set.
        max_steps: Optimizer steps (overrides epochs); 0 = evaluate the initial model only.
        lrs: A learning-rate grid: one run per lr and seed, the lr selected by mean dev score (empty: `lr` alone).
        seeds: One fine-tune per seed (head init, data order, dropout; empty: `seed` alone).
        average_last: Average the weights of the run's last N models, one every `average_every` steps (fairseq's
            `--save-interval-updates` with `scripts/average_checkpoints.py --num-update-checkpoints N`; the
            RoFormer and Transformer papers averaged the last 5): the average is scored on dev and test beside the
            best checkpoint and published as `averaged/` (of the selected run). 0 = off. Fewer than N: all of them.
        average_every: Steps between the averaged models (the last step is always one); null = the evaluation
            points (`eval_every`).
        patience: Stop a run once the first dev split's score has not improved for this many evaluations in a row
            (fairseq's `--patience`); `max_steps` (or `epochs`) stays the ceiling. null = never. With `average_last`,
            the averaged models are the last N taken before the run stops.
    """

    lr: float = field(default=2e-5, metadata=STAGE_LR_PHASE)  # the metadata of TrainArgs' fields, kept
    warmup_fraction: float = field(default=0.1, metadata=STAGE_LR_PHASE)
    log_every: int = field(default=50, metadata=MAY_CHANGE_ON_RESUME)
    eval_every: int | None = field(default=None, metadata=MAY_CHANGE_UNTIL_A_RUN_FINISHES)
    save_every: int = field(default=0, metadata=MAY_CHANGE_ON_RESUME)
    epochs: float = field(default=3.0, metadata=MAY_CHANGE_UNTIL_A_RUN_FINISHES)
    max_steps: int | None = field(default=None, metadata=MAY_CHANGE_UNTIL_A_RUN_FINISHES)
    lrs: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    average_last: int = 0  # the points kept are decided at the start of a run: fixed on resume
    average_every: int | None = None
    patience: int | None = field(default=None, metadata=MAY_CHANGE_UNTIL_A_RUN_FINISHES)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patience is not None and self.patience < 1:
            raise ConfigError(f"patience must be >= 1 (evaluations without improvement) or null, got {self.patience}")
        if self.average_last < 0:
            raise ConfigError(f"average_last must be >= 0 (0 = off), got {self.average_last}")
        if self.average_every is not None and self.average_every < 1:
            raise ConfigError(f"average_every must be >= 1 or null (the evaluation points), got {self.average_every}")
        if self.epochs <= 0 and self.max_steps is None:
            raise ConfigError(f"epochs must be > 0, got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 0:
            raise ConfigError(f"max_steps must be >= 0, got {self.max_steps}")
        if any(lr <= 0 for lr in self.lrs):
            raise ConfigError("learning rates must be > 0")
        for seed in self.seeds:
            check_seed("seeds", seed)

    @property
    def grid(self) -> list[tuple[float, int]]:
        """(peak lr, seed) of every run, in order."""
        return [(lr, seed) for lr in (self.lrs or [self.lr]) for seed in (self.seeds or [self.seed])]


# What a pretraining stage may change, per section: the fields marked STAGE (roformer.config), and why the rest may
# not (`Stage`). The evaluation set, the tokenizer and the model's shapes are the run's: curves stay comparable and one
# checkpoint continues the next stage.
STAGE_KEYS = {
    "data": field_keys(DataConfig, "stage", declared=False),
    "model": field_keys(ModelConfig, "stage", declared=False),
    "train": field_keys(TrainConfig, "stage", declared=False),
}
STAGE_LR_KEYS = field_keys(TrainConfig, "lr_phase", declared=False)
_STAGE_REFUSAL = {
    "data": "the tokenizer, the evaluation set and how the corpus is read are the run's",
    "model": "the architecture and vocabulary are the run's: one checkpoint continues the next stage",
    "train": "one optimizer and seed per run",
}


@dataclass
class Stage:
    """One stage of a pretraining run: `steps` optimizer steps under its own keys over the run's sections.

    A stage may change the block length, the corpus, the mask rate (a number or a schedule over the stage) and split,
    the rotary base and `rope_scaling`, the batch size and the learning-rate phase (`STAGE_KEYS`); anything else is
    refused naming the key. A stage that sets any of `lr`, `schedule`, `warmup_*`, `decay_*` runs that schedule over
    its own steps (peak: its lr); the others follow the run's schedule over the whole run.

    Attributes:
        name: The stage's name (events, the `stages/<name>/` model folder).
        steps: Its optimizer steps.
        data: `data:` keys over the run's.
        model: `model:` keys over the run's.
        train: `train:` keys over the run's.
    """

    # paths inside the untyped sections, resolved like the run's (roformer.config.field_keys)
    UNTYPED_KEYS: ClassVar = {"data.paths": PATH, "data.mixture[].paths": PATH}

    name: str
    steps: int
    data: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigError(f"name must be letters, digits, '-', '_' or '.' (a folder name), got {self.name!r}")
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        for section, allowed in STAGE_KEYS.items():
            for key in getattr(self, section):
                if key not in allowed:
                    raise ConfigError(
                        f"{section}.{key} cannot change between stages ({_STAGE_REFUSAL[section]}); a stage may set "
                        f"{section}: {', '.join(allowed)}"
                    )

    @property
    def own_lr_phase(self) -> bool:
        """Whether the stage runs its own learning-rate schedule over its steps."""
        return any(key in self.train for key in STAGE_LR_KEYS)


@dataclass(frozen=True)
class ResolvedStage:
    """A stage with the run's sections under its keys: what its steps train with.

    Attributes:
        name: The stage's name (None: a run without stages, one stage of all its steps).
        index: Its place in the run.
        start: Steps before it.
        steps: Its steps.
        data: Its data section.
        model: Its model section.
        train: Its train section (max_steps: its steps).
        own_lr_phase: Whether it runs its own learning-rate schedule (`Stage.own_lr_phase`).
    """

    name: str | None
    index: int
    start: int
    steps: int
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    own_lr_phase: bool = False

    @property
    def end(self) -> int:
        """Steps done when the stage ends."""
        return self.start + self.steps


@dataclass
class PretrainConfig:
    """A pretraining run: `model`, `data`, `train` sections and an optional `label` (the arm name in comparisons).

    `init` continues pretraining from a model directory (a run's `final/`): its weights start the run and its
    tokenizer is used unless `data.tokenizer` names another (same vocabulary required). The `model` section must
    have the init model's shapes; fields such as `rope_scaling` or dropout may differ (e.g. position interpolation
    followed by a short continued pretraining at a longer `data.max_seq_len`, as in Chen et al. 2023). A stage
    folder of another run (`stages/<name>/`) also carries its optimizer's moments: a branch continues that run's
    AdamW state (mmBERT's decay ablations branch so).

    `stages` runs the steps in stages (`Stage`): the run's length is the sum of their steps (`train.max_steps` is
    set to it), and evaluation stays on the run's `data:` validation blocks under its fixed mask.
    """

    INCLUDE_FILE: ClassVar = True  # `include: FILE` starts from another pretraining config (roformer.config.load)

    model: ModelConfig = field(default_factory=ModelConfig, metadata=INCLUDE)  # or a configs/model file's path
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    label: str | None = field(default=None, metadata=MAY_CHANGE_ON_RESUME)
    init: str | None = field(default=None, metadata=PATH)
    stages: list[Stage] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.init and not self.data.tokenizer:
            self.data = replace(self.data, tokenizer=self.init)
        if self.stages:
            names = [stage.name for stage in self.stages]
            repeated = next((name for name in names if names.count(name) > 1), None)
            if repeated:
                raise ConfigError(f"stages: two stages are named {repeated!r} (each names its own folder)")
            self.train = replace(self.train, max_steps=sum(stage.steps for stage in self.stages))
            if self.train.eval_every is None:
                raise ConfigError("train.eval_every: null (every epoch) is not defined in stages; give a step count")
        _check_learned_length(self.model, self.data, "")  # the run's blocks: evaluation reads them
        for index, stage in enumerate(self.stages):
            _check_no_validation_leak(stage, self.data, f"stages[{index}].data")
        for stage in self.resolved_stages():  # every stage's sections are checked as the run's are
            _check_learned_length(stage.model, stage.data, f"stages[{stage.index}]: " if self.stages else "")

    def resolved_stages(self) -> list[ResolvedStage]:
        """The run's stages with their sections resolved (one unnamed stage of all steps for a run without stages).

        Raises:
            ConfigError: a stage's value fails its section's check, named `stages[i].section.key`.
        """
        if not self.stages:
            return [ResolvedStage(None, 0, 0, self.train.max_steps, self.data, self.model, self.train)]
        resolved, start = [], 0
        for index, stage in enumerate(self.stages):
            sections = {}
            for section in STAGE_KEYS:
                try:
                    sections[section] = replace(getattr(self, section), **getattr(stage, section))
                except ConfigError as e:
                    raise ConfigError(f"stages[{index}].{section}: {e}") from None
            if stage.model and self.model.position_encoding != "rotary":
                key = next(iter(stage.model))
                raise ConfigError(f"stages[{index}].model.{key}: a stage changes it for position_encoding: rotary only")
            train = replace(sections["train"], max_steps=stage.steps)
            resolved.append(
                ResolvedStage(
                    stage.name,
                    index,
                    start,
                    stage.steps,
                    sections["data"],
                    sections["model"],
                    train,
                    stage.own_lr_phase,
                )
            )
            start += stage.steps
        return resolved

    @property
    def arm(self) -> str:
        """The label of the run in comparisons (default: the position encoding)."""
        return self.label or self.model.position_encoding

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML-ready)."""
        sections = {k: asdict(getattr(self, k)) for k in ("model", "data", "train")}
        stages = {"stages": [asdict(stage) for stage in self.stages]} if self.stages else {}
        return {"label": self.label, **({"init": self.init} if self.init else {}), **sections, **stages}


def _check_no_validation_leak(stage: Stage, data: DataConfig, where: str) -> None:
    """A stage's corpus must not train on the run's validation documents, which another split of the files would.

    The run evaluates on the validation split of its own corpus (of each part of its mixture). A stage may read other
    corpora, or the same ones split the same way; not some of the same files split otherwise.
    """
    parts = sorted(sorted(m.paths) for m in data.mixture)
    if "mixture" in stage.data:
        mine = sorted(sorted(m["paths"] if isinstance(m, dict) else m.paths) for m in stage.data["mixture"] or [])
        if mine != parts:
            raise ConfigError(
                f"{where}.mixture: a stage changes the weights of the run's data.mixture, not its corpora (the run's "
                "validation documents come from them)"
            )
    if "paths" in stage.data:
        run_files = set(data.paths) | {p for part in parts for p in part}
        shared = set(stage.data["paths"] or []) & run_files
        if shared and (data.mixture or set(stage.data["paths"]) != set(data.paths)):
            raise ConfigError(
                f"{where}.paths: shares {sorted(shared)[0]} with the run's corpus but splits it otherwise: the run's "
                "validation documents would be trained on (use the run's paths, or corpora apart)"
            )


def _check_learned_length(model: ModelConfig, data: DataConfig, where: str) -> None:
    """Learned positions cannot go beyond their table: refuse blocks longer than it."""
    if not model.holds_positions(data.max_seq_len):
        raise ConfigError(
            f"{where}model.max_position_embeddings={model.max_position_embeddings} is shorter than "
            f"data.max_seq_len={data.max_seq_len} (learned positions cannot go beyond their table)"
        )


def data_section(data: FinetuneDataConfig) -> dict[str, Any]:
    """A fine-tuning data: section as YAML writes it: its fields, then each declared section under its own key."""
    plain = asdict(data)
    sections = plain.pop(SECTIONS)
    return {**plain, **{key: sections.get(key) for key in FinetuneDataConfig.declared_sections()}}


@dataclass
class FinetuneConfig:
    """A fine-tuning job: `init` (the model to start from), `data`, `train`, ModelConfig overrides in `model`.

    `init` is a `final/` of `roformer pretrain`, any `roformer.load`-able directory, or an HF `save_pretrained`
    directory (converted with `from_hf`); it must hold a tokenizer. `model` changes fields such as hidden_dropout
    or classifier_dropout (num_labels comes from the task).
    """

    INCLUDE_FILE: ClassVar = True  # `include: FILE` starts from a shared recipe (configs/glue/recipe.yaml)

    init: str = field(default="", metadata=PATH_OR_NAME)  # an HF hub name is not a path
    data: FinetuneDataConfig = field(default_factory=FinetuneDataConfig)
    train: FinetuneTrainConfig = field(default_factory=FinetuneTrainConfig)
    model: dict[str, Any] = field(default_factory=dict)
    label: str | None = field(default=None, metadata=MAY_CHANGE_ON_RESUME)

    def __post_init__(self) -> None:
        if "num_labels" in self.model:
            raise ConfigError("model.num_labels comes from the task (data.task); remove it")
        spec = self.data.spec
        if not self.init and not spec.own_vocabulary:
            raise ConfigError("init is required: the model directory to fine-tune")
        if self.init and spec.own_vocabulary and not spec.pretrained_init:
            raise ConfigError(
                f"init: type {self.data.type} makes its own vocabulary and trains from scratch: leave it empty"
            )
        if not self.init:
            self.scratch_model(PLACEHOLDER_VOCABULARY)  # the model: section checked now, before any work

    def scratch_model(self, vocabulary: Vocabulary) -> Any:
        """The model trained from scratch (`init:` empty): the `model:` section, the task's vocabulary.

        A `ModelConfig` of the section, or what the type's declaration builds of it (`TaskSpec.scratch_model`:
        translation's encoder-decoder).

        Raises:
            ConfigError: an unknown key or bad value of `model:` (named), or a vocab_size / pad_token_id given
                there (the task's vocabulary decides them).
        """
        for key in ("vocab_size", "pad_token_id"):
            if key in self.model:
                raise ConfigError(f"model.{key} comes from the task's vocabulary; remove it")
        build = self.data.spec.scratch_model
        if build is not None:
            return build(dict(self.model), vocabulary)
        section = {**self.model, "vocab_size": vocabulary.size, "pad_token_id": vocabulary.pad_token_id}
        return from_dict(ModelConfig, section, prefix="model.")

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML-ready)."""
        return {
            "init": self.init,
            "label": self.label,
            "model": dict(self.model),
            "data": data_section(self.data),
            "train": asdict(self.train),
        }
