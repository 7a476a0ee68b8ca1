"""The `roformer` command line. Bad input ends with one line on stderr and exit code 2, never a traceback.

The CLI parses and prints: each command is a handler (`_convert`) with its arguments beside it
(`_convert_arguments`), listed once in COMMANDS; what a command computes or checks lives in the floors below.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, NoReturn

from roformer.errors import RunStopped, UserError
from roformer.logs import configure_console
from roformer.model.config import ARCHITECTURE_NAMES, POOLINGS
from roformer.version import version_report

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors, and an epilog built only when `--help` asks for it.

    argparse prints the usage block before an error by default. `epilog_of` builds help text that needs heavy
    imports (the task types' modules load torch), which start-up must not pay for.
    """

    epilog_of: Callable[[], str] | None = None

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")

    def format_help(self) -> str:
        if self.epilog_of is not None:
            self.epilog = self.epilog_of()
        return super().format_help()


def _task_types_help() -> str:
    """The task types `data.type` may name, each with its settings section: from their declarations."""
    from roformer.tasks.registry import specs

    types = "; ".join(f"{s.name}{f' (data.{s.section})' if s.section else ''}: {s.summary}" for s in specs().values())
    return f"task types (data.type): {types}."


def _positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a batch size, a token budget, a length)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


class _Version(argparse.Action):
    """`--version`: built only when asked (reading every installed distribution's metadata takes ~0.1 s), unwrapped."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        print(version_report())
        parser.exit(0)


def _convert_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-hf", metavar="DIR", help="HF save_pretrained directory (or hub name) to import")
    source.add_argument("--to-hf", metavar="DIR", help="roformer model directory to export for transformers")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument(
        "--architecture",
        choices=list(ARCHITECTURE_NAMES),
        help="model class to build (default: the checkpoint's own)",
    )
    parser.add_argument(
        "--rotary-layout", choices=["interleaved", "half"], default="interleaved", help="with --from-hf"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")


def _convert(args: argparse.Namespace) -> None:
    from roformer.data.tokenizer import check_fits, copy_tokenizer_files, load_tokenizer
    from roformer.files import check_output_dir, staged_output_dir
    from roformer.model.hf import from_hf, to_hf
    from roformer.model.model import load

    out = Path(args.out)
    check_output_dir(out, args.overwrite)  # before converting
    if args.from_hf:
        model = from_hf(args.from_hf, architecture=args.architecture, rotary_layout=args.rotary_layout)
        with staged_output_dir(out, args.overwrite) as staging:
            model.save(staging)
            copied = _export_tokenizer(args.from_hf, staging, copy_tokenizer_files)
        kind = f"{model.config.position_encoding} {model.architecture}"
    else:
        source = Path(args.to_hf)
        model = load(source, architecture=args.architecture)
        if any((source / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
            check_fits(load_tokenizer(source), model.config.vocab_size, source)
        hf_model = to_hf(model)
        with staged_output_dir(out, args.overwrite) as staging:
            hf_model.save_pretrained(staging)
            copied = copy_tokenizer_files(source, staging)
        kind = type(hf_model).__name__
    tokenizer = f", tokenizer: {', '.join(copied)}" if copied else ", no tokenizer files found"
    print(f"wrote {kind} ({model.num_parameters():,} parameters) to {out}{tokenizer}")


def _export_tokenizer(source: str, target: Path, copy: Callable[[Path, Path], list[str]]) -> list[str]:
    """Tokenizer of an HF source: the files of a local directory, or a hub tokenizer saved with save_pretrained.

    A word-level Chinese checkpoint (WoBERT, RoFormer-Chinese: roformer.data.tokenizer.word_level_vocab) gets our
    word-level tokenizer of its vocab.txt instead (transformers has no WoBERT class, and its RoFormer tokenizer needs
    rjieba and gives wrong offsets, transformers#12244): jieba words are then read as its pretraining read them.
    """
    from roformer.data.tokenizer import save_tokenizer, word_level_tokenizer

    word_level = word_level_tokenizer(source)
    if word_level is not None:
        save_tokenizer(word_level, target)
        return sorted(p.name for p in target.iterdir() if p.name in ("tokenizer.json", "vocab.txt"))
    if Path(source).is_dir():
        return copy(Path(source), target)
    try:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(source).save_pretrained(target)
    except Exception as e:  # a model without a tokenizer is still a valid conversion
        logging.getLogger(__name__).warning("no tokenizer saved for %s: %s", source, e)
        return []
    from roformer.model.weights import MODEL_CONFIG_FILE, WEIGHTS_FILE

    return sorted(p.name for p in target.iterdir() if p.name not in (MODEL_CONFIG_FILE, WEIGHTS_FILE))


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="roformer model directory (e.g. RUN/final)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument(
        "--format",
        choices=["onnx", "sentence-transformers"],
        default="onnx",
        help="onnx (model.onnx and the tokenizer, for onnxruntime) or sentence-transformers (a folder that "
        "SentenceTransformer(DIR) loads)",
    )
    parser.add_argument(
        "--max-length", type=_positive_int, help="longest sequence accepted (default max_position_embeddings)"
    )
    parser.add_argument("--architecture", choices=list(ARCHITECTURE_NAMES), help="onnx: default the directory's own")
    parser.add_argument("--pooling", choices=POOLINGS, help="sentence-transformers: default pooler for Sim, else mean")
    parser.add_argument("--normalize", action="store_true", help="sentence-transformers: unit-length vectors")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")


def _export(args: argparse.Namespace) -> None:
    from roformer.files import check_output_dir

    check_output_dir(Path(args.out), args.overwrite)
    if args.format == "sentence-transformers":
        _export_sentence_transformers(args)
    else:
        _export_onnx(args)


def _export_sentence_transformers(args: argparse.Namespace) -> None:
    from roformer.data.tokenizer import load_tokenizer
    from roformer.embed import (
        SentenceEncoder,
        check_exportable,
        export_sentence_transformers,
        sentence_transformers_modules,
    )

    if args.architecture:
        raise UserError("--architecture is for ONNX; a sentence-transformers export is the backbone and its pooling")
    sentence_transformers_modules()  # installed? before the model is read
    check_exportable(load_tokenizer(Path(args.model)), args.model)  # a word-level tokenizer, named by its folder
    encoder = SentenceEncoder.load(args.model, args.pooling, args.max_length)
    out = export_sentence_transformers(encoder, args.out, args.normalize, args.overwrite)
    unit = ", unit length" if args.normalize else ""
    print(
        f"wrote {out}: SentenceTransformer({str(out)!r}) gives {encoder.model.config.hidden_size}-dimensional "
        f"vectors ({encoder.pooling} pooling{unit}), texts up to {encoder.max_length} tokens"
    )


def _export_onnx(args: argparse.Namespace) -> None:
    from roformer.data.tokenizer import copy_tokenizer_files
    from roformer.files import staged_output_dir
    from roformer.model.model import load

    out = Path(args.out)
    if args.pooling or args.normalize:
        raise UserError("--pooling and --normalize are for --format sentence-transformers")
    try:
        import onnxscript  # noqa: F401 (torch.onnx's dynamo exporter needs it, and onnx)
    except ImportError as e:
        raise UserError(f"ONNX export needs onnx and onnxscript ({e}): pip install 'roformer-pytorch[onnx]'") from None
    from roformer.model.onnx import ONNX_FILE, export_onnx, output_names

    model = load(args.model, architecture=args.architecture)
    max_length = args.max_length or model.config.max_position_embeddings
    with staged_output_dir(out, args.overwrite) as staging:
        export_onnx(model, staging / ONNX_FILE, max_length)
        model.config.to_yaml(staging / "config.yaml")
        copied = copy_tokenizer_files(Path(args.model), staging)
    tokenizer = f", tokenizer: {', '.join(copied)}" if copied else ", no tokenizer files found"
    print(
        f"wrote {out / ONNX_FILE}: {model.config.position_encoding} {model.architecture}, sequences up to "
        f"{max_length} tokens, outputs {', '.join(output_names(model))}{tokenizer}"
    )


def _push_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", metavar="DIR", help="roformer model directory (a run's final/: its run fills the card)"
    )
    parser.add_argument("--repo-id", required=True, help="hub repository, e.g. user/roformer-small")
    parser.add_argument(
        "--glue", metavar="DIR", help="a `roformer glue` output directory: its dev table goes in the card"
    )
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--token", help="hub token (default: HF_TOKEN or the saved login)")
    parser.add_argument(
        "--dry-run", metavar="DIR", help="write the folder that would be uploaded to DIR; upload nothing"
    )
    parser.add_argument("--overwrite", action="store_true", help="with --dry-run: replace a non-empty DIR")


def _push(args: argparse.Namespace) -> None:
    import tempfile

    from roformer.files import check_output_dir, staged_output_dir
    from roformer.study.hub import check_repo_id, hub_token, push, write_upload_folder

    check_repo_id(args.repo_id)  # before anything is made, the token asked for or the model read
    model_dir, glue = Path(args.model), Path(args.glue) if args.glue else None
    if args.dry_run:
        out = Path(args.dry_run)
        check_output_dir(out, args.overwrite)
        with staged_output_dir(out, args.overwrite) as staging:
            files = write_upload_folder(model_dir, staging, args.repo_id, glue)
        print(f"dry run: {len(files)} files for {args.repo_id} written to {out} (nothing uploaded): {', '.join(files)}")
        return
    token = hub_token(args.token)  # before any work
    with tempfile.TemporaryDirectory() as tmp:
        files = write_upload_folder(model_dir, Path(tmp), args.repo_id, glue)
        url = push(Path(tmp), args.repo_id, token, args.private)
    print(f"uploaded {len(files)} files to {url}")


def _configs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="print this config's path, e.g. pretrain/roformer-tiny or glue/rte")


def _configs(args: argparse.Namespace) -> None:
    from roformer.catalogue import configs_listing, shipped_config

    print(shipped_config(args.name) if args.name else configs_listing())


def _add_run_arguments(parser: argparse.ArgumentParser, config_help: str, default_out: str) -> None:
    parser.add_argument("--config", metavar="FILE", help=config_help)
    parser.add_argument("--output-dir", metavar="DIR", help=f"run directory (default: {default_out})")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, e.g. train.lr=3e-4"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty run directory")


def _config_and_output(args: argparse.Namespace, folder: str, *runs_subdir: str) -> tuple[Path | None, Path]:
    """The --config file (a path, or a shipped name looked up in `folder`) and the output directory.

    The output directory is --output-dir, else runs/<runs_subdir>/<config name>; the caller has checked that one of
    --config and --output-dir is given.
    """
    from roformer.catalogue import find_config

    config = find_config(args.config, folder) if args.config else None
    return config, Path(args.output_dir) if args.output_dir else Path("runs", *runs_subdir, config.stem)


def _pretrain_arguments(parser: argparse.ArgumentParser) -> None:
    _add_run_arguments(
        parser,
        "pretraining YAML, or a shipped config's name (roformer-tiny; see roformer configs)",
        "runs/<config name>",
    )
    parser.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")


def _pretrain(args: argparse.Namespace) -> None:
    from roformer.config import load
    from roformer.train.config import PretrainConfig
    from roformer.train.pretrain import Pretrainer
    from roformer.train.run_dir import RUN_CONFIG_FILE

    if args.config is None and not (args.resume and args.output_dir):
        raise UserError("--config is required (unless --resume --output-dir continues a run from its config.yaml)")
    config_path, out = _config_and_output(args, "pretrain")
    config = load(PretrainConfig, config_path or out / RUN_CONFIG_FILE, args.set)
    trainer = Pretrainer(config, out, resume=args.resume, overwrite=args.overwrite)
    run = trainer.run()
    if trainer.engine.is_main_process:
        print(pretraining_summary(run))


def pretraining_summary(run: Path) -> str:
    """One line for the console at the end of `roformer pretrain`: the final evaluation, the run's pace, the model."""
    from roformer.train.run_dir import FINAL_DIR, METRICS_FILE, read_metrics

    events = read_metrics(run / METRICS_FILE)
    evals = [e for e in events if e.get("event") == "eval"]
    trains = [e for e in events if e.get("event") == "train"]
    lines = []
    if evals:
        last = evals[-1]
        accuracy = f", masked-token accuracy {100 * last['eval_accuracy']:.1f}%" if "eval_accuracy" in last else ""
        lines.append(f"final eval loss {last['eval_loss']:.3f}{accuracy} at step {last['step']}")
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


def _prepare_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", required=True, metavar="FILE", help="pretraining YAML or shipped name (its data: section)"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--overwrite", action="store_true", help="rebuild the store even if it is complete")


def _prepare_data(args: argparse.Namespace) -> None:
    from roformer.catalogue import find_config
    from roformer.config import load
    from roformer.data.store import prepare_token_store
    from roformer.train.config import PretrainConfig

    config = load(PretrainConfig, find_config(args.config, "pretrain"), args.set)
    print(prepare_token_store(config.data, replace=args.overwrite))


def _finetune_arguments(parser: argparse.ArgumentParser) -> None:
    _add_run_arguments(
        parser,
        "task YAML, or a shipped task's name (glue/rte, finetune/conll2003)",
        "runs/glue/<task> for GLUE configs, else runs/finetune/<config name>",
    )
    parser.add_argument("--resume", action="store_true", help="continue: finished runs are kept, the last resumes")
    parser.epilog_of = _task_types_help


def _finetune(args: argparse.Namespace) -> None:
    from roformer.config import load
    from roformer.train.config import FinetuneConfig
    from roformer.train.finetune import finetune
    from roformer.train.run_dir import BEST_DIR, RUN_CONFIG_FILE

    if args.config is None and not (args.resume and args.output_dir):
        raise UserError("--config is required (unless --resume --output-dir continues a job from its config.yaml)")
    config_path, out = _config_and_output(args, "glue", "glue")
    if config_path is not None and not args.output_dir and config_path.parent.name != "glue":
        out = Path("runs", "finetune", config_path.stem)  # GLUE tasks keep runs/glue/<task>
    config = load(FinetuneConfig, config_path or out / RUN_CONFIG_FILE, args.set)
    results = finetune(config, out, overwrite=args.overwrite, resume=args.resume)
    if results:
        runs = len(results["summary"][results["selection_split"]]["score"]["values"])
        over = f"{runs} run(s): seeds x folds" if "fold" in results["selected"] else f"{runs} seed(s)"
        print(
            f"{results['task']}: dev metrics of lr {results['selected']['peak_lr']:g} (mean ± std over {over}, %, "
            "each run at its best dev checkpoint)"
        )
        for split, metrics in results["summary"].items():
            cells = ", ".join(f"{name} {100 * m['mean']:.2f} ± {100 * m['std']:.2f}" for name, m in metrics.items())
            print(f"  {split}: {cells}")
        print(f"results in {out} (best model in {out / BEST_DIR})")


def _suite_command(runs_subdir: str) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[..., None]]:
    """The options and the handler of `roformer suite`, whose runs go under runs/<runs_subdir>/ by default.

    `roformer glue` is the same command under its first name, its runs under runs/glue/.
    """

    def arguments(parser: argparse.ArgumentParser) -> None:
        config = "suite YAML, or a shipped suite's name (glue/all, finetune/chinese-cpu)"
        _add_run_arguments(parser, config, f"runs/{runs_subdir}/<config name>")
        parser.add_argument("--resume", action="store_true", help="continue: finished tasks and runs are kept")

    return arguments, lambda args: _run_suite(args, runs_subdir)


def _run_suite(args: argparse.Namespace, runs_subdir: str) -> None:
    """Every task of a suite (any task types), one table and one submission."""
    from roformer.study.markdown import glue_suite_table
    from roformer.study.suite import run_suite
    from roformer.train.run_dir import SUBMISSION_DIR

    if args.config is None:
        raise UserError("--config is required")
    config_path, out = _config_and_output(args, "glue", runs_subdir)
    results = run_suite(config_path, out, args.set, overwrite=args.overwrite, resume=args.resume)
    if results:
        print(glue_suite_table(results) + f"results in {out} (submission files in {out / SUBMISSION_DIR})")


def _experiment_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="experiment YAML, or a shipped experiment's name")
    parser.add_argument("--output-dir", metavar="DIR", help="default: runs/experiments/<config name>")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override every arm")


def _experiment(args: argparse.Namespace) -> None:
    from roformer.study.experiment import run_experiment
    from roformer.study.outputs import COMPARE_DIR, REPORT_FILE, SUMMARY_MARKDOWN_FILE

    if args.config is None:
        raise UserError("--config is required")
    config_path, out = _config_and_output(args, "experiments", "experiments")
    summary = run_experiment(config_path, out, args.set)
    if summary:
        report = f"\nreport: {out / REPORT_FILE} (runs in {out})"
        print((out / COMPARE_DIR / SUMMARY_MARKDOWN_FILE).read_text() + report)


def _eval_mlm_arguments(parser: argparse.ArgumentParser) -> None:
    from roformer.train.run_dir import LENGTH_FILE

    parser.add_argument("--model", required=True, metavar="DIR", help="a model directory (e.g. runs/x/final)")
    parser.add_argument("--data", metavar="FILE|RUN", help="pretraining config or run dir (default: the model's run)")
    parser.add_argument("--seq-lens", default="128,256,512,1024", metavar="L1,L2", help="lengths to evaluate")
    parser.add_argument("--max-tokens", type=_positive_int, default=65536, help="tokens scored at every length")
    parser.add_argument("--batch-size", type=_positive_int, default=8)
    parser.add_argument("--out", metavar="FILE", help=f"JSON results (default: <run>/{LENGTH_FILE})")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing results file")
    parser.add_argument(
        "--rope-scaling",
        metavar="M1,M2",
        help="rotary context scaling methods to compare: none, linear, ntk, yarn, each optionally :FACTOR "
        "(default factor: length / trained length)",
    )
    parser.add_argument(
        "--trained-length", type=_positive_int, help="the model's training length (default: from final/)"
    )
    parser.add_argument("--device", help="e.g. cpu, cuda, cuda:1 (default: cuda if available, else cpu)")


def _eval_mlm(args: argparse.Namespace) -> None:
    from roformer.study.length_eval import LengthEvalSettings, parse_lengths, parse_rope_scalings, run_length_eval
    from roformer.study.markdown import length_results_table

    settings = LengthEvalSettings(
        seq_lens=parse_lengths(args.seq_lens),
        max_tokens=args.max_tokens,
        batch_size=args.batch_size,
        rope_scalings=parse_rope_scalings(args.rope_scaling) if args.rope_scaling else None,
        trained_length=args.trained_length,
    )
    results, out = run_length_eval(
        args.model, args.data, settings, out=args.out, overwrite=args.overwrite, device=args.device
    )
    print(length_results_table(results) + f"written to {out}")


def _probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="a model directory (e.g. runs/x/final)")
    parser.add_argument("--probe", required=True, help="passkey, needle (embedding retrieval) or passkey-mlm")
    parser.add_argument("--lengths", type=_positive_int, nargs="+", default=[128, 256, 512, 1024, 2048])
    parser.add_argument("--samples", type=_positive_int, default=50, help="queries (or masked keys) per length")
    parser.add_argument("--distances", type=_positive_int, nargs="+", help="passkey-mlm: key-to-copy distances")
    parser.add_argument(
        "--scaling", default="none", help="rotary context scaling: none, linear, ntk, yarn or self_extend"
    )
    parser.add_argument("--haystack", metavar="DIR", help="text files the filler is cut from (default: builtin)")
    parser.add_argument("--trained-length", type=_positive_int, help="the model's training length (for --scaling)")
    parser.add_argument("--batch-size", type=_positive_int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", metavar="FILE", help="JSON results")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing results file")
    parser.add_argument("--device", help="e.g. cpu, cuda (default: cuda if available, else cpu)")


def _probe(args: argparse.Namespace) -> None:
    from roformer.study.markdown import probe_results_table
    from roformer.study.probes import ProbeSettings, run_probe

    settings = ProbeSettings(
        probe=args.probe,
        lengths=args.lengths,
        samples=args.samples,
        scaling=args.scaling,
        distances=args.distances,
        haystack=args.haystack,
        trained_length=args.trained_length,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    result = run_probe(args.model, settings, out=args.out, device=args.device, overwrite=args.overwrite)
    print(probe_results_table(result["rows"]), end="")
    if args.out:
        print(f"written to {args.out}")


def _embed_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="a model directory (roformer or HF)")
    parser.add_argument("--input", required=True, metavar="FILE", help="texts: .txt (a line each), csv/tsv/jsonl/...")
    parser.add_argument(
        "--out", required=True, metavar="FILE", help="the vectors: .npy or .safetensors, row order kept"
    )
    parser.add_argument("--column", help="the text column of a table or JSON-lines input (default: text)")
    parser.add_argument("--pooling", choices=POOLINGS, help="default: pooler for RoFormer-Sim, else mean")
    parser.add_argument("--normalize", action="store_true", help="unit-length vectors (cosine = dot product)")
    parser.add_argument("--batch-size", type=_positive_int, default=32)
    parser.add_argument("--max-length", type=_positive_int, help="tokens per text (default 512)")
    parser.add_argument(
        "--jieba",
        action="store_const",
        const=True,
        default=None,
        help="segment Chinese into words first (default: as the tokenizer says; word-level models imply it)",
    )
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--device", help="e.g. cpu, cuda, cuda:1 (default: this process's accelerator, else cpu)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output file")


def _embed(args: argparse.Namespace) -> None:
    from roformer.embed import SentenceEncoder, check_vectors_path, read_texts, write_vectors
    from roformer.train.launch import process_state, run_on_main

    out = check_vectors_path(args.out, args.overwrite)
    texts = read_texts(args.input, args.column)
    state = process_state()
    encoder = SentenceEncoder.load(
        args.model, args.pooling, args.max_length, args.jieba, device=args.device or state.device
    )
    vectors = encoder.encode(texts, args.batch_size, args.normalize, args.precision, progress=sys.stderr.isatty())
    run_on_main(lambda: write_vectors(out, vectors))
    if state.is_main_process:
        shape = " x ".join(map(str, vectors.shape))
        print(
            f"{shape} vectors ({encoder.pooling} pooling{', unit length' if args.normalize else ''}) written to {out}"
        )


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directories (pretraining, fine-tuning, a roformer glue suite folder) or roformer probe JSON files",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--baseline", metavar="LABEL", help="the baseline arm (default: the first non-rotary one)")
    parser.add_argument("--targets", metavar="L1,L2", help="target eval losses (default: baseline's final + offsets)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")


def _compare(args: argparse.Namespace) -> None:
    from roformer.study.compare import compare
    from roformer.study.outputs import SUMMARY_MARKDOWN_FILE

    targets = None
    if args.targets:
        try:
            targets = [float(t) for t in args.targets.split(",")]
        except ValueError:
            raise UserError(f"--targets: expected comma-separated numbers, got {args.targets!r}") from None
    compare(args.runs, args.out, baseline=args.baseline, targets=targets, overwrite=args.overwrite)
    written = ", ".join(sorted(path.name for path in Path(args.out).iterdir()))  # what this comparison drew
    print((Path(args.out) / SUMMARY_MARKDOWN_FILE).read_text() + f"\nwritten to {args.out} ({written})")


class Command(NamedTuple):
    """A subcommand: its name, its one-line help, what adds its arguments, and what runs it."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], None]


# Every subcommand, in the order `roformer --help` lists them.
COMMANDS = (
    Command("convert", "convert between HF transformers checkpoints and roformer models", _convert_arguments, _convert),
    Command(
        "export",
        "export a model directory for deployment (ONNX, for onnxruntime; sentence-transformers)",
        _export_arguments,
        _export,
    ),
    Command("push", "upload a model directory to the Hugging Face hub, with a model card", _push_arguments, _push),
    Command("configs", "list the shipped configs (their names work as --config values)", _configs_arguments, _configs),
    Command(
        "pretrain", "MLM pretraining from a YAML config (also under accelerate launch)", _pretrain_arguments, _pretrain
    ),
    Command(
        "prepare-data",
        "build the token store of a pretraining config (before training)",
        _prepare_data_arguments,
        _prepare_data,
    ),
    Command(
        "finetune",
        "fine-tune on one task: GLUE, NER, QA, multiple choice, your own files (every lr and seed of the config)",
        _finetune_arguments,
        _finetune,
    ),
    Command(
        "suite",
        "fine-tune every task of a suite (any task types) and write one table and one submission",
        *_suite_command("suites"),
    ),
    Command("glue", "roformer suite under its first name (runs under runs/glue/)", *_suite_command("glue")),
    Command(
        "experiment",
        "run both arms (and seeds) of an experiment, then compare",
        _experiment_arguments,
        _experiment,
    ),
    Command("eval-mlm", "masked-token loss and accuracy at several sequence lengths", _eval_mlm_arguments, _eval_mlm),
    Command("embed", "sentence vectors of a file of texts with a model's backbone", _embed_arguments, _embed),
    Command("probe", "passkey and needle probes of long-context retrieval and MLM by length", _probe_arguments, _probe),
    Command(
        "compare",
        "compare pretraining runs (curves, steps-to-target) and GLUE results",
        _compare_arguments,
        _compare,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of all subcommands."""
    parser = _Parser(prog="roformer", description="RoFormer and BERT baseline: convert, pretrain, fine-tune, compare.")
    parser.add_argument("--version", action=_Version, nargs=0, help="show the versions (and a clash) and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in COMMANDS:
        subparser = sub.add_parser(command.name, help=command.help)
        command.add_arguments(subparser)
        subparser.set_defaults(func=command.handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    configure_console(int(os.environ.get("RANK", "0")))
    args = build_parser().parse_args(argv)
    code = _run(args)
    if _close_process_group():
        _exit_now(code)
    return code


def _run(args: argparse.Namespace) -> int:
    """Run the command; bad input and stopped runs become one line on stderr and their exit code."""
    from roformer.train.faults import StopAtOnce

    try:
        with StopAtOnce():
            args.func(args)
    except RunStopped as e:  # preempted, disk full, diverged: its own exit code for schedulers
        print(f"roformer {args.command}: stopped: {e}", file=sys.stderr)
        return e.exit_code
    except UserError as e:
        print(f"roformer {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"roformer {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from roformer.files import is_write_failure, unnamed_write_failure

        if not is_write_failure(e):
            raise  # a bug: its traceback
        stopped = unnamed_write_failure(e)  # outside the staged and atomic writers: still one line and 74
        print(f"roformer {args.command}: stopped: {stopped}", file=sys.stderr)
        return stopped.exit_code
    return 0


def _close_process_group() -> bool:
    """Destroy the process group of a multi-process command; True if there was one.

    No barrier first: a process that ends on its own (its failure not shared) must not wait for the others.
    """
    if "torch" not in sys.modules:  # reporting commands never load torch
        return False
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.destroy_process_group()
    return True


def _exit_now(code: int) -> None:
    """End a multi-process command without C++ static destructors.

    At interpreter shutdown a process of a finished gloo run can still abort (SIGABRT, "terminate called without an
    active exception": a communication thread destroyed while joinable; seen twice in 2-process tests, even after
    destroying the group), and the launcher then reports a failed run. Python's own exit work is done first:
    atexit handlers (temporary token stores), then the output is flushed.
    """
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
