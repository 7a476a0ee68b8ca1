"""MLM pretraining: `roformer pretrain --config FILE`, one process or many through `accelerate launch`.

The config has three sections, `model:` (a ModelConfig, inline or the path of a configs/model file), `data:` (a
DataConfig) and `train:` (a TrainConfig). The run directory (roformer.train.run_dir) holds config.yaml,
metrics.jsonl, tokenizer/, tokenization.json (a token store's corpus only), checkpoints/step-N and final/ (model +
tokenizer).

This module is the pretraining recipe of the engine (roformer.train.engine): the masked global batch of a step
(roformer.data.mlm), its loss, and the evaluation under the fixed mask. The loss of a step is the sum of
masked-token cross-entropies divided by the number of masked tokens of the whole global batch, so one process with
batch 2B, two with B, or one with B and grad_accum 2 compute the same gradient.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from roformer.config import flat_config
from roformer.config_yaml import read_yaml
from roformer.data.config import DataConfig
from roformer.data.masking import IGNORE_INDEX, masked_positions
from roformer.data.mlm import MixtureBlocks, block_source, eval_batch
from roformer.data.packing import block_documents, eval_subset
from roformer.data.sampling import global_batch_size, share
from roformer.data.store import build_mlm_data
from roformer.data.streaming import build_streaming_mlm_data
from roformer.data.token_store import BlockView
from roformer.data.tokenizer import Tokenizer, save_tokenizer, tokenizer_from_json, tokenizer_to_json, vocab_hash
from roformer.errors import UserError, WriteFailed, naming
from roformer.files import atomic_write_text
from roformer.logs import MAIN_ONLY
from roformer.model.model import MaskedLM
from roformer.model.pretrained import load_weights_from
from roformer.model.weights import read_model_config
from roformer.train.config import PretrainConfig, ResolvedStage
from roformer.train.engine import Engine
from roformer.train.evaluate import evaluate_mlm
from roformer.train.interval import MaskCounts, RunState
from roformer.train.launch import agree_on_errors, broadcast_from_main, process_state, run_on_main
from roformer.train.optim import MOMENTS_FILE, apply_moments, read_moments, save_moments
from roformer.train.recipe import ProcessLayout, to_device
from roformer.train.run_dir import (
    CHECKPOINTS_DIR,
    FINAL_DIR,
    METRICS_FILE,
    STAGES_DIR,
    TOKENIZATION_FILE,
    TOKENIZER_DIR,
    RunDir,
    write_model_dir,
)
from roformer.train.sharded import is_sharded
from roformer.train.stages import StagedBatches, blocks_key, lr_multiplier_for, source_groups

logger = logging.getLogger(__name__)


def resolve_config(config: PretrainConfig, tokenizer: Tokenizer) -> PretrainConfig:
    """Fit the config to the tokenizer: its vocabulary size, [PAD] id and hash; no pooler (MLM trains none).

    Raises:
        UserError: the config pins a `data.vocab_hash` that the tokenizer does not have.
    """
    digest = vocab_hash(tokenizer)
    if config.data.vocab_hash not in (None, digest):
        raise UserError(
            f"data.vocab_hash: the tokenizer's vocabulary hashes to {digest}, the config asks for "
            f"{config.data.vocab_hash} (another tokenizer, corpus or vocab_size?)"
        )
    model = replace(config.model, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, add_pooler=False)
    return replace(config, model=model, data=replace(config.data, vocab_hash=digest))


def build_data(config: DataConfig, tokenizer: Tokenizer | None = None) -> Any:
    """The run's data in every process: the tokenizer made once, the token store built once per node.

    The main process builds first (training the tokenizer, filling the cache) while the others wait; a trained
    tokenizer is then sent to them. Next the first process of every other node builds (from the cache when the nodes
    share it, else into its own), then the rest, which find the store built. A failure on any process (bad data, a
    full disk) is every process's failure, in one line (roformer.train.launch.agree_on_errors). `tokenizer` (a later
    stage's data: the run's) is used by every process.
    """
    build = build_streaming_mlm_data if config.streaming else build_mlm_data
    state = process_state()
    main = state.is_main_process
    data = agree_on_errors((lambda: build(config, tokenizer=tokenizer)) if main else None)
    if tokenizer is None and not config.tokenizer:  # trained by the main process: sent to the others
        shared = broadcast_from_main(tokenizer_to_json(data.tokenizer) if main else None)
        tokenizer = None if main else tokenizer_from_json(shared, config.lowercase)
    for node_first in (True, False):
        mine = not main and state.is_local_main_process == node_first
        built = agree_on_errors((lambda: build(config, tokenizer=tokenizer)) if mine else None)
        data = built if mine else data
    return data


class _MaskedStep:
    """One step's masked global batch; each process trains on its rows of every micro-batch."""

    padded_tokens = None  # blocks are full: no padding

    def __init__(
        self,
        ids: torch.Tensor,
        labels: torch.Tensor,
        layout: ProcessLayout,
        mask_rate: float,
        maskable: int,
        documents: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> None:
        self.ids, self.labels, self.layout, self.documents = ids, labels, layout, documents
        self.tokens = ids.numel()
        self.count = int((labels != IGNORE_INDEX).sum())  # masked tokens in the global batch (every process knows)
        self.mask = MaskCounts(mask_rate, self.count, maskable)  # logged: the rate asked for and the one realised
        # accelerator.backward divides by grad_accum and DDP averages over processes: undo both, so the gradient is
        # that of (sum of masked-token losses) / (masked tokens in the global batch).
        self.scale = layout.num_processes * layout.grad_accum / max(self.count, 1)

    def share(self, batch: torch.Tensor, micro: int) -> torch.Tensor:
        """This process's rows of micro-batch `micro`."""
        layout = self.layout
        return share(batch, micro, layout.rank, layout.num_processes, layout.batch_size)

    def micro(self, micro: int) -> tuple[Any, ...]:
        """This process's rows of micro-batch `micro` on the device, with its masked positions and their count.

        Count and positions come from the host copy: on a GPU they would otherwise cost two synchronisations per
        micro-step (`.sum()` to a Python int, `nonzero`). Pinned host memory makes the copies asynchronous. With
        isolated documents, also their (document_ids, position_ids), found on the host.
        """
        y = self.share(self.labels, micro)
        n, positions = int((y != IGNORE_INDEX).sum()), masked_positions(y)
        x = self.share(self.ids, micro)
        isolated = () if self.documents is None else self.documents(x)
        return (*(to_device(t, self.layout.device) for t in (x, y, positions, *isolated)), n)

    def loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        x, y, positions, *isolated, n = batch
        documents = dict(zip(("document_ids", "position_ids"), isolated, strict=True)) if isolated else {}
        out = model(x, labels=y, masked_only=True, masked_positions=positions, **documents)
        # mean over this micro-batch's n tokens -> sum; a micro-batch without masked tokens adds zero
        loss_sum = out.loss * n if n else out.logits.sum() * 0.0
        return loss_sum * self.scale, loss_sum.detach().float() / max(self.count, 1)


class Pretrainer:
    """One pretraining run in a run directory (created, refused, overwritten or resumed).

    The phases are public so that scripts and tests can drive them: the constructor checks the directory and builds
    the data, then `build_model`, `prepare_run_dir`, `starting_state` and `fit` (`run` does all of them and writes
    final/).
    """

    def __init__(
        self,
        config: PretrainConfig,
        output_dir: str | Path,
        resume: bool = False,
        overwrite: bool = False,
    ) -> None:
        self.out = Path(output_dir)
        self.run_dir = RunDir(self.out, overwrite, resume)  # before any data work
        train = config.train
        self.engine = Engine(train, self.out, train.seed, self.out / CHECKPOINTS_DIR, self.out / METRICS_FILE)
        acc = self.engine.accelerator
        self.data = build_data(config.data)
        self.config = resolve_config(config, self.data.tokenizer)
        if resume:
            self._check_resumable()
        self.stages = self.config.resolved_stages()  # one unnamed stage of all steps for a run without stages
        self.mixture_parts: dict[tuple[str, ...], Any] = {}  # each corpus of a mixture, built once
        self.batches = self._staged_batches(acc.num_processes)
        # the run's validation blocks under the one fixed mask, whatever a stage trains on: of its own corpus, or of
        # every corpus of its mixture (whose training splits leave them out)
        validation = self.data.validation
        if config.data.mixture:
            parts = [self.mixture_parts[tuple(m.paths)].validation for m in self.config.data.mixture]
            validation = eval_subset(torch.cat(parts), config.data)
        self.eval_ids, self.eval_labels = eval_batch(validation, self.data.tokenizer, config.data)
        sep = self.data.tokenizer.sep_token_id
        isolated = config.data.packing == "isolated"
        self.documents = partial(block_documents, sep_id=sep) if isolated else None  # of the blocks' ids

    def _staged_batches(self, num_processes: int) -> StagedBatches:
        """The batches of every stage; a stage with other blocks than the run's builds its data here, before step 0."""
        groups, seed = source_groups(self.stages), self.config.train.seed
        sources = []
        for group in range(max(groups) + 1):
            stage = self.stages[groups.index(group)]
            layout = stage.train
            global_batch = global_batch_size(layout.batch_size, num_processes, layout.grad_accum)
            with naming(f"stages[{stage.index}] ({stage.name})" if self.config.stages else "data"):
                sources.append(self._block_source(stage.data, seed, global_batch))
        return StagedBatches(self.stages, sources, self.data.tokenizer, seed, num_processes)

    def _block_source(self, data: DataConfig, seed: int, global_batch: int) -> Any:
        """The training blocks of a data section: the run's own, another corpus's, or a mixture of corpora."""
        if data.mixture:  # every corpus its own store and order, read with the run's tokenizer
            built = []
            for m in data.mixture:
                part = replace(data, source="text", paths=list(m.paths), mixture=[])
                if tuple(m.paths) not in self.mixture_parts:
                    with naming(f"mixture corpus {', '.join(map(str, m.paths))}"):
                        self.mixture_parts[tuple(m.paths)] = build_data(part, self.data.tokenizer)
                built.append(block_source(self.mixture_parts[tuple(m.paths)], part, seed, global_batch))
            return MixtureBlocks(built, [m.weight for m in data.mixture], seed)
        if blocks_key(data) == blocks_key(self.config.data):
            return block_source(self.data, data, seed, global_batch)
        with naming(f"corpus {data.corpus_name}"):
            built = build_data(data, self.data.tokenizer)
        return block_source(built, data, seed, global_batch)

    def _check_resumable(self) -> None:
        """The data must give the run's tokenizer; the config may change only as RunDir's policy allows."""
        saved = read_yaml(self.run_dir.config_file)
        new = self.config.to_dict()
        if saved.get("data", {}).get("vocab_hash") is None:  # written before hashes: the vocab.txt check below
            saved.setdefault("data", {})["vocab_hash"] = new["data"]["vocab_hash"]
        if saved["data"]["vocab_hash"] != new["data"]["vocab_hash"]:
            change = f"data.vocab_hash: {saved['data']['vocab_hash']!r} -> {new['data']['vocab_hash']!r}"
            raise UserError(f"{self.out}: the data gives a different tokenizer than the run's ({change})")
        if saved.get("stages", []) != new.get("stages", []):
            raise UserError(f"{self.out}: stages differ from the run's (stages cannot change on resume)")
        self.run_dir.check_resume(new, saved)
        saved_tokenizer = self.out / TOKENIZER_DIR / "vocab.txt"
        vocab = self.data.tokenizer.get_vocab()
        if saved_tokenizer.is_file():
            tokens = saved_tokenizer.read_text(encoding="utf-8").splitlines()
            if tokens != sorted(vocab, key=vocab.__getitem__):
                raise UserError(f"{self.out}: the data gives a different tokenizer than the run's (files changed?)")

    # -- phases ------------------------------------------------------------------------------------------------

    def prepare_run_dir(self) -> None:
        """Write config.yaml and the tokenizer of a fresh run (--overwrite first clears the directory).

        A resumed run's directory is left as it is, but for tokenization.json when it lacks one.
        """

        def write_tokenizer(run: Path) -> None:
            save_tokenizer(self.data.tokenizer, run / TOKENIZER_DIR)

        run_on_main(lambda: self.run_dir.prepare(self.config.to_dict(), write_more=write_tokenizer))
        run_on_main(self.write_tokenization)

    def write_tokenization(self) -> None:
        """Write tokenization.json when missing: the training text's characters and tokens.

        `roformer compare` shows it beside arms with other tokenizers. Not for a streamed corpus (never counted
        whole) or a token store built before stores counted characters.
        """
        train = getattr(self.data, "train", None)  # StreamingMLMData has documents, not blocks
        statistics = train.store.text_statistics() if isinstance(train, BlockView) else None
        if statistics is not None and not (self.out / TOKENIZATION_FILE).is_file():
            atomic_write_text(self.out / TOKENIZATION_FILE, json.dumps({"split": "train", **statistics}, indent=2))

    def build_model(self) -> None:
        """The initial model (seeded: the same seed gives every arm the same weights where shapes agree), prepared."""
        train = self.config.train
        torch.manual_seed(train.seed)
        model = MaskedLM(self.config.model)
        model.set_last_layer_subset(train.last_layer_subset_on() and not self._fsdp())
        if self.config.init:
            load_weights_from(model, self.config.init)
        self.num_parameters = model.num_parameters()
        staged = len(self.stages) > 1 or self.config.stages
        multiplier = lr_multiplier_for(self.stages, train) if staged else None
        self.engine.setup(model, train.lr, train.max_steps, multiplier)

    def _fsdp(self) -> bool:
        """Whether the model is sharded with FSDP.

        FSDP's hooks run on a block's `forward` alone: the masked-only last layer, another method, is off there.
        """
        from accelerate.utils import DistributedType

        return self.engine.accelerator.distributed_type == DistributedType.FSDP

    def _init_moments(self) -> dict[int, dict[str, Any]] | None:
        """The AdamW state of the stage folder this run branches off, if `init` is one (unsharded models), checked.

        Read before the run directory is written (a damaged file must not cost an existing run or leave a started
        one behind), applied by `starting_state`. Every process reads it (each holds the whole optimizer state) or
        none does: the main process decides whether the file is there, and a failure anywhere is every process's.

        Raises:
            UserError: the moments belong to q/k rows in another rotary layout than this model's, or do not fit it.
            CheckpointError: the file is damaged.
        """
        path = Path(self.config.init or "") / MOMENTS_FILE
        if not self.config.init or not broadcast_from_main(path.is_file() if self.engine.is_main_process else None):
            return None
        if is_sharded(self.engine.model):
            logger.warning("%s: not loaded under FSDP: the optimizer starts afresh", path, extra=MAIN_ONLY)
            return None
        _, saved = read_model_config(Path(self.config.init))
        if saved.rotary_layout != self.config.model.rotary_layout:
            raise UserError(
                f"init: {path} holds moments of q/k rows in rotary_layout {saved.rotary_layout}; set "
                f"model.rotary_layout: {saved.rotary_layout} to continue them"
            )
        return agree_on_errors(lambda: read_moments(self.engine.optimizer, path))

    def starting_state(self, moments: dict[int, dict[str, Any]] | None = None) -> RunState:
        """Load the newest complete checkpoint when resuming; the state to start from (step 0 for a fresh run).

        An accepted resume records its config in config.yaml (`RunDir.record`). A run at step 0 continues `moments`
        (read before the directory was written), or the init's moments read now.
        """
        state = RunState()
        if self.run_dir.resume:
            state = self.engine.resume(self)
            run_on_main(lambda: self.run_dir.record(self.config.to_dict()))
        if state.step == 0:  # a fresh run, or one stopped before its first checkpoint: branching starts here
            moments = moments if moments is not None else self._init_moments()
            if moments is not None:
                count = apply_moments(self.engine.optimizer, moments)
                where = Path(self.config.init or "") / MOMENTS_FILE
                logger.info("continuing the optimizer state of %s (%d parameters)", where, count, extra=MAIN_ONLY)
        return state

    def fit(self, state: RunState) -> RunState:
        """Train to max_steps (evaluating, logging, checkpointing)."""
        engine = self.engine
        engine.start_logging("roformer-pretrain", flat_config(self.config.to_dict()))
        shapes = [f"{b.global_batch} x {s.data.max_seq_len}" for s, b in zip(self.stages, self.batches.batches)]
        if self.config.stages:
            shapes = [f"{stage.name}: {stage.steps} steps of {shape}" for stage, shape in zip(self.stages, shapes)]
        logger.info(
            "%s: %s parameters, %s, global batch %s tokens, %d processes",
            self.config.arm,
            f"{self.num_parameters:,}",
            self.batches.describe(),
            "; ".join(shapes),
            engine.accelerator.num_processes,
        )
        return engine.fit(self, state, report_throughput=True)

    def run(self) -> Path:
        """Every phase, then final/ (model + tokenizer). Returns the run directory.

        The model and optimizer are built before the directory is written: an init that does not load or an
        optimizer setting torch refuses must fail before --overwrite has deleted the run it would replace.
        """
        self.build_model()
        moments = None if self.run_dir.resume else self._init_moments()  # a damaged file: before the directory
        self.prepare_run_dir()
        self.fit(self.starting_state(moments))
        self.save_final()
        self.engine.finish()
        return self.out

    def save_final(self) -> None:
        """Write final/: the trained MaskedLM (gathered from every process) and the tokenizer."""
        steps = self.config.train.max_steps
        try:
            self._write_model(self.out / FINAL_DIR, self.stages)
        except WriteFailed as e:  # the run is done and checkpointed: only final/ is missing
            raise WriteFailed(f"{e}; the checkpoint of step {steps} is intact: --resume writes final/") from None

    def _write_model(self, directory: Path, stages: list[ResolvedStage], moments: bool = False) -> None:
        """Write the model as it is now (gathered from every process), its tokenizer and what it was trained on.

        `pretraining.json` gives the longest block length of `stages` (those trained so far) and their steps;
        `moments` adds the optimizer state (unsharded), which a run branching off this folder continues.
        """
        self.engine.accelerator.wait_for_everyone()
        state = self.engine.full_state_dict()  # a collective under FSDP: every process
        data = self.config.data
        pretraining = {
            "max_seq_len": max(stage.data.max_seq_len for stage in stages),
            "vocab_hash": data.vocab_hash,
            "steps": stages[-1].end,
            **({"stages": [stage.name for stage in stages]} if self.config.stages else {}),
        }
        optimizer = self.engine.optimizer if moments and not is_sharded(self.engine.model) else None

        def write() -> None:
            model = MaskedLM(self.engine.bare_model().config)
            model.load_state_dict(state)
            more = (lambda staging: save_moments(optimizer, staging / MOMENTS_FILE)) if optimizer is not None else None
            write_model_dir(model, self.data.tokenizer, directory, pretraining, more)

        run_on_main(write)

    # -- stages -------------------------------------------------------------------------------------------------

    def enter_stage(self, stage: ResolvedStage) -> None:
        """Rotate as `stage` says (its rotary base and scaling); its batches and layout follow from the step."""
        model = self.engine.bare_model()
        wanted = (stage.model.rotary_base, stage.model.rope_scaling)
        if model.config.position_encoding == "rotary" and wanted != (
            model.config.rotary_base,
            model.config.rope_scaling,
        ):
            model.set_rotary(*wanted)

    def end_stage(self, stage: ResolvedStage, state: RunState) -> dict[str, Any]:
        """Write `stages/<name>/` after a stage's last step: a model folder (an `init:`) with the optimizer state."""
        folder = Path(STAGES_DIR) / stage.name
        t0 = time.perf_counter()
        self._write_model(self.out / folder, self.stages[: stage.index + 1], moments=True)
        return {"folder": str(folder), "tokens_seen": state.tokens_seen, "write_sec": time.perf_counter() - t0}

    # -- the engine's recipe ------------------------------------------------------------------------------------

    def plan(self, step: int) -> _MaskedStep:
        ids, labels = self.batches.step(step)
        maskable = self.batches.maskable(ids, labels)
        return _MaskedStep(ids, labels, self.engine.layout, self.batches.rate_of(step), maskable, self.documents)

    def evaluate(self, step: int) -> list[dict[str, Any]]:
        """Masked-token loss and accuracy on the validation blocks under the fixed mask (all processes)."""
        acc = self.engine.accelerator
        scores = evaluate_mlm(
            self.engine.model,
            self.eval_ids,
            self.eval_labels,
            self.config.train.eval_size,
            acc.device,
            acc.process_index,
            acc.num_processes,
            reduce=lambda t: acc.reduce(t, "sum"),
            documents=self.documents,
        )
        return [scores]

    def epoch_of(self, step: int) -> float:
        return self.batches.epoch_of(step)

    def steps_per_epoch(self) -> float | None:
        return self.batches.steps_per_epoch()

    def save_checkpoint_state(self, directory: Path) -> dict[str, Any]:
        return self.batches.state_dict()

    def load_checkpoint_state(self, directory: Path, state: dict[str, Any], step: int) -> None:
        self.batches.load_state_dict(state, step)

    def micro_batch_loss(self) -> str | None:
        return None  # normalised over the global batch's masked tokens: the same step under any batch_size

    def snapshot_points(self) -> set[int]:
        return set()  # pretraining averages no models: its checkpoints are its record

    def snapshot(self, step: int) -> None:
        raise AssertionError("pretraining keeps no snapshots")

    def converged(self, step: int) -> bool:
        return False  # pretraining runs its steps: its curves are compared at equal steps


def pretrain(config: PretrainConfig, output_dir: str | Path, resume: bool = False, overwrite: bool = False) -> Path:
    """Run MLM pretraining; returns the run directory. See the module docstring for the layout.

    Raises:
        UserError: bad data, an occupied run directory, nothing to resume, a run that cannot be resumed.
    """
    return Pretrainer(config, output_dir, resume=resume, overwrite=overwrite).run()
