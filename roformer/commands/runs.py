"""The training commands: pretrain, prepare-data, finetune, suite (and its first name glue), experiment."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from roformer.commands.common import Command, add_run_arguments, config_and_output, task_types_help
from roformer.errors import UserError


def pretrain_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(
        parser,
        "pretraining YAML, or a shipped config's name (roformer-tiny; see roformer configs)",
        "runs/<config name>",
    )
    parser.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")


def pretrain_command(args: argparse.Namespace) -> None:
    from roformer.config import check_keys, load
    from roformer.train.config import PretrainConfig
    from roformer.train.run_dir import RUN_CONFIG_FILE

    if args.config is None and not (args.resume and args.output_dir):
        raise UserError("--config is required (unless --resume --output-dir continues a run from its config.yaml)")
    config_path, out = config_and_output(args, "pretrain")
    check_keys(PretrainConfig, config_path or out / RUN_CONFIG_FILE, args.set)  # a typo: refused before torch loads
    config = load(PretrainConfig, config_path or out / RUN_CONFIG_FILE, args.set)
    from roformer.model.pretrained import check_init
    from roformer.train.pretrain import Pretrainer

    if config.init:
        check_init(config.init)
    trainer = Pretrainer(config, out, resume=args.resume, overwrite=args.overwrite)
    run = trainer.run()
    if trainer.engine.is_main_process:
        print(pretraining_summary(run))


def pretraining_summary(run: Path) -> str:
    """One line for the console at the end of `roformer pretrain`: the final evaluation, the run's pace, the model."""
    from roformer.train.run_dir import FINAL_DIR, METRICS_FILE, mlm_evaluation_words, read_metrics

    events = read_metrics(run / METRICS_FILE)
    evals = [e for e in events if e.get("event") == "eval"]
    trains = [e for e in events if e.get("event") == "train"]
    lines = []
    if evals:
        lines.append(f"final {mlm_evaluation_words(evals[-1])}")
    if trains:
        last = trains[-1]
        seconds = last.get("elapsed_sec") or 0.0
        rate = last.get("tokens_seen", 0) / seconds if seconds else 0.0
        lines.append(
            f"{last['step']} steps in {seconds / 60:.1f} min, {last.get('tokens_seen', 0):,} tokens "
            f"({rate:,.0f} tokens/s)"
        )
    paces = [e for e in events if e.get("event") == "throughput"]
    if paces:  # this session's part of the run
        p = paces[-1]
        parts = ("eval", "checkpoint", "log", "stage")
        rest = ", ".join(f"{k} {p[f'{k}_sec']:.1f} s" for k in parts if p[f"{k}_sec"] >= 0.05)
        lines.append(
            f"the run kept {p['kept']:.1%} of its steps' {p['step_tokens_per_sec']:,.0f} tokens/s "
            f"({p['tokens_per_sec']:,.0f} over {p['wall_sec']:.0f} s of wall time; {rest or 'nothing else'})"
        )
    lines.append(f"model: {run / FINAL_DIR} (roformer.load, roformer convert --to-hf)")
    return "pretraining finished: " + "; ".join(lines)


def prepare_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", required=True, metavar="FILE", help="pretraining YAML or shipped name (its data: section)"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--overwrite", action="store_true", help="rebuild the store even if it is complete")


def prepare_data_command(args: argparse.Namespace) -> None:
    from roformer.catalogue import find_config
    from roformer.config import load
    from roformer.data.store import prepare_token_store
    from roformer.train.config import PretrainConfig

    config = load(PretrainConfig, find_config(args.config, "pretrain"), args.set)
    print(prepare_token_store(config.data, replace=args.overwrite))


def finetune_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(
        parser,
        "task YAML, or a shipped task's name (glue/rte, finetune/conll2003)",
        "runs/glue/<task> for GLUE configs, else runs/finetune/<config name>",
    )
    parser.add_argument("--resume", action="store_true", help="continue: finished runs are kept, the last resumes")
    parser.epilog_of = task_types_help


def finetune_command(args: argparse.Namespace) -> None:
    from roformer.config import check_keys, load
    from roformer.train.config import FinetuneConfig
    from roformer.train.run_dir import BEST_DIR, RUN_CONFIG_FILE

    if args.config is None and not (args.resume and args.output_dir):
        raise UserError("--config is required (unless --resume --output-dir continues a job from its config.yaml)")
    config_path, out = config_and_output(args, "glue", "glue")
    if config_path is not None and not args.output_dir and config_path.parent.name != "glue":
        out = Path("runs", "finetune", config_path.stem)  # GLUE tasks keep runs/glue/<task>
    check_keys(FinetuneConfig, config_path or out / RUN_CONFIG_FILE, args.set)  # a typo: refused before torch loads
    config = load(FinetuneConfig, config_path or out / RUN_CONFIG_FILE, args.set)
    from roformer.model.pretrained import check_init
    from roformer.train.finetune import finetune
    from roformer.train.results_card import RESULTS_MARKDOWN_FILE, results_markdown

    if config.init:
        check_init(config.init)
    results = finetune(config, out, overwrite=args.overwrite, resume=args.resume)
    if results:  # the page results.md holds: dev and test beside their baselines (translation: the final BLEU)
        print(results_markdown(results))
        print(f"results in {out} (best model in {out / BEST_DIR}; this page: {out / RESULTS_MARKDOWN_FILE})")


def suite_command(runs_subdir: str) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[..., None]]:
    """The options and the handler of `roformer suite`, whose runs go under runs/<runs_subdir>/ by default.

    `roformer glue` is the same command under its first name, its runs under runs/glue/.
    """

    def arguments(parser: argparse.ArgumentParser) -> None:
        config = "suite YAML, or a shipped suite's name (glue/all, finetune/chinese-cpu)"
        add_run_arguments(parser, config, f"runs/{runs_subdir}/<config name>")
        parser.add_argument("--resume", action="store_true", help="continue: finished tasks and runs are kept")

    return arguments, lambda args: _run_suite(args, runs_subdir)


def _run_suite(args: argparse.Namespace, runs_subdir: str) -> None:
    """Every task of a suite (any task types), one table and one submission."""
    from roformer.config import check_override_keys
    from roformer.train.config import FinetuneConfig

    if args.config is None:
        raise UserError("--config is required")
    config_path, out = config_and_output(args, "glue", runs_subdir)
    check_override_keys(FinetuneConfig, args.set)  # overrides of every task: refused before torch is imported
    from roformer.study.markdown import glue_suite_table
    from roformer.study.suite import run_suite
    from roformer.train.run_dir import SUBMISSION_DIR

    results = run_suite(config_path, out, args.set, overwrite=args.overwrite, resume=args.resume)
    if results:
        print(glue_suite_table(results) + f"results in {out} (submission files in {out / SUBMISSION_DIR})")


def experiment_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="experiment YAML, or a shipped experiment's name")
    parser.add_argument("--output-dir", metavar="DIR", help="default: runs/experiments/<config name>")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override every arm")
    parser.add_argument(
        "--compare-only",
        action="store_true",
        help="a task study (tasks:): train nothing, tabulate the runs that finished (a study in progress)",
    )


def experiment_command(args: argparse.Namespace) -> None:
    if args.config is None:
        raise UserError("--config is required")
    config_path, out = config_and_output(args, "experiments", "experiments")
    check_arm_override_keys(config_path, args.set)
    from roformer.study.experiment import run_experiment
    from roformer.study.outputs import COMPARE_DIR, REPORT_FILE, SUMMARY_MARKDOWN_FILE

    summary = run_experiment(config_path, out, args.set, compare_only=args.compare_only)
    if summary:
        report = f"\nreport: {out / REPORT_FILE} (runs in {out})"
        print((out / COMPARE_DIR / SUMMARY_MARKDOWN_FILE).read_text() + report)


def check_arm_override_keys(path: Path, overrides: list[str]) -> None:
    """Refuse an unknown key of an experiment's `--set` (an override of every arm) before torch is imported.

    The arms are pretraining configs, or, in a task study (a file with a `tasks:` key, as
    roformer.study.experiment_config.experiment_config_class tells them apart), fine-tuning configs.

    Raises:
        ConfigError: the file does not read, or an override's key is unknown (naming the nearest known one).
    """
    from roformer.config import check_override_keys
    from roformer.config_yaml import read_mapping
    from roformer.train.config import FinetuneConfig, PretrainConfig

    if overrides:
        check_override_keys(FinetuneConfig if "tasks" in read_mapping(path) else PretrainConfig, overrides)


# this module's subcommands, in the order `roformer --help` lists them
COMMANDS = (
    Command(
        "pretrain",
        "MLM pretraining from a YAML config (also under accelerate launch)",
        pretrain_arguments,
        pretrain_command,
    ),
    Command(
        "prepare-data",
        "build the token store of a pretraining config (before training)",
        prepare_data_arguments,
        prepare_data_command,
    ),
    Command(
        "finetune",
        "fine-tune on one task: GLUE, NER, QA, multiple choice, your own files (every lr and seed of the config)",
        finetune_arguments,
        finetune_command,
    ),
    Command(
        "suite",
        "fine-tune every task of a suite (any task types) and write one table and one submission",
        *suite_command("suites"),
    ),
    Command("glue", "roformer suite under its first name (runs under runs/glue/)", *suite_command("glue")),
    Command(
        "experiment",
        "run both arms (and seeds) of an experiment, then compare",
        experiment_arguments,
        experiment_command,
    ),
)
