"""The model-directory commands: convert (HF <-> roformer), export (ONNX, sentence-transformers), push, configs."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

from roformer.commands.common import Command, positive_int
from roformer.errors import UserError
from roformer.model.config import ARCHITECTURE_NAMES, POOLINGS


def convert_arguments(parser: argparse.ArgumentParser) -> None:
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


def convert_command(args: argparse.Namespace) -> None:
    from roformer.data.tokenizer import check_fits, copy_tokenizer_files, load_tokenizer
    from roformer.files import check_output_dir, staged_output_dir
    from roformer.model.hf import from_hf, to_hf
    from roformer.model.model import load
    from roformer.tasks.parallel import load_translation_tokenizer

    out = Path(args.out)
    check_output_dir(out, args.overwrite)  # before converting
    if args.from_hf:
        model = from_hf(args.from_hf, architecture=args.architecture, rotary_layout=args.rotary_layout)
        with staged_output_dir(out, args.overwrite) as staging:
            model.save(staging)
            copied = _export_tokenizer(args.from_hf, staging, copy_tokenizer_files)
        kind = f"{_encodings(model.config)} {model.architecture}"
    else:
        source = Path(args.to_hf)
        model = load(source, architecture=args.architecture)
        if any((source / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
            # an encoder-decoder's tokenizer (one joint vocabulary) must fit both halves; it is a translation
            # tokenizer (no [MASK] to ask for: roformer.tasks.parallel)
            halves = [getattr(model.config, half) for half in ("encoder", "decoder") if hasattr(model.config, half)]
            tokenizer = load_translation_tokenizer(source) if halves else load_tokenizer(source)
            check_fits(tokenizer, min(c.vocab_size for c in halves or [model.config]), source)
        hf_model = to_hf(model)
        with staged_output_dir(out, args.overwrite) as staging:
            hf_model.save_pretrained(staging)
            copied = copy_tokenizer_files(source, staging)
        kind = type(hf_model).__name__
    tokenizer = f", tokenizer: {', '.join(copied)}" if copied else ", no tokenizer files found"
    print(f"wrote {kind} ({model.num_parameters():,} parameters) to {out}{tokenizer}")


def _encodings(config: object) -> str:
    """A config's position encoding; an encoder-decoder's as encoder/decoder (rotary/rotary)."""
    if hasattr(config, "encoder"):
        return f"{config.encoder.position_encoding}/{config.decoder.position_encoding}"
    return config.position_encoding


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


def export_arguments(parser: argparse.ArgumentParser) -> None:
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
        "--max-length", type=positive_int, help="longest sequence accepted (default max_position_embeddings)"
    )
    parser.add_argument("--architecture", choices=list(ARCHITECTURE_NAMES), help="onnx: default the directory's own")
    parser.add_argument("--pooling", choices=POOLINGS, help="sentence-transformers: default pooler for Sim, else mean")
    parser.add_argument("--normalize", action="store_true", help="sentence-transformers: unit-length vectors")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")


def export_command(args: argparse.Namespace) -> None:
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


def push_arguments(parser: argparse.ArgumentParser) -> None:
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


def push_command(args: argparse.Namespace) -> None:
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


def configs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="print this config's path, e.g. pretrain/roformer-tiny or glue/rte")


def configs_command(args: argparse.Namespace) -> None:
    from roformer.catalogue import configs_listing, shipped_config

    print(shipped_config(args.name) if args.name else configs_listing())


# this module's subcommands, in the order `roformer --help` lists them
COMMANDS = (
    Command(
        "convert", "convert between HF transformers checkpoints and roformer models", convert_arguments, convert_command
    ),
    Command(
        "export",
        "export a model directory for deployment (ONNX, for onnxruntime; sentence-transformers)",
        export_arguments,
        export_command,
    ),
    Command(
        "push", "upload a model directory to the Hugging Face hub, with a model card", push_arguments, push_command
    ),
    Command(
        "configs", "list the shipped configs (their names work as --config values)", configs_arguments, configs_command
    ),
)
