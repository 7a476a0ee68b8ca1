"""The measuring commands: eval-mlm, probe, attention-distance, embed, translate, compare.

eval-mlm: loss by length; probe: long-context retrieval; attention-distance: the long-term decay of a model's
attention; embed: sentence vectors; translate: an encoder-decoder's translations; compare: runs and probes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from roformer.commands.common import Command, finite_float, positive_int
from roformer.errors import UserError
from roformer.model.config import POOLINGS


def eval_mlm_arguments(parser: argparse.ArgumentParser) -> None:
    from roformer.train.run_dir import LENGTH_FILE

    parser.add_argument("--model", required=True, metavar="DIR", help="a model directory (e.g. runs/x/final)")
    parser.add_argument("--data", metavar="FILE|RUN", help="pretraining config or run dir (default: the model's run)")
    parser.add_argument("--seq-lens", default="128,256,512,1024", metavar="L1,L2", help="lengths to evaluate")
    parser.add_argument("--max-tokens", type=positive_int, default=65536, help="tokens scored at every length")
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--out", metavar="FILE", help=f"JSON results (default: <run>/{LENGTH_FILE})")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing results file")
    parser.add_argument(
        "--rope-scaling",
        metavar="M1,M2",
        help="rotary context scaling methods to compare: none, linear, ntk, yarn, each optionally :FACTOR "
        "(default factor: length / trained length)",
    )
    parser.add_argument(
        "--trained-length", type=positive_int, help="the model's training length (default: from final/)"
    )
    parser.add_argument("--device", help="e.g. cpu, cuda, cuda:1 (default: cuda if available, else cpu)")


def eval_mlm_command(args: argparse.Namespace) -> None:
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


def probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="a model directory (e.g. runs/x/final)")
    parser.add_argument("--probe", required=True, help="passkey, needle (embedding retrieval) or passkey-mlm")
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[128, 256, 512, 1024, 2048])
    parser.add_argument("--samples", type=positive_int, default=50, help="queries (or masked keys) per length")
    parser.add_argument("--distances", type=positive_int, nargs="+", help="passkey-mlm: key-to-copy distances")
    parser.add_argument(
        "--digits-every",
        type=int,
        default=256,
        metavar="N",
        help="passkey-mlm: each of the ten digits once per N tokens (key and distractors); 0: no distractors",
    )
    parser.add_argument(
        "--scaling", default="none", help="rotary context scaling: none, linear, ntk, yarn or self_extend"
    )
    parser.add_argument("--haystack", metavar="DIR", help="text files the filler is cut from (default: builtin)")
    parser.add_argument("--trained-length", type=positive_int, help="the model's training length (for --scaling)")
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", metavar="FILE", help="JSON results")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing results file")
    parser.add_argument("--device", help="e.g. cpu, cuda (default: cuda if available, else cpu)")


def probe_command(args: argparse.Namespace) -> None:
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
        digits_every=args.digits_every,
    )
    result = run_probe(args.model, settings, out=args.out, device=args.device, overwrite=args.overwrite)
    print(probe_results_table(result["rows"]), end="")
    if args.out:
        print(f"written to {args.out}")


def attention_distance_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="a model directory (e.g. runs/x/final)")
    parser.add_argument(
        "--data", required=True, metavar="DIR", help="held-out text: a folder of .txt (or jsonl...) files"
    )
    parser.add_argument(
        "--out", default="attention-distance.json", metavar="FILE", help="JSON results; the plot is FILE with .png"
    )
    parser.add_argument("--length", type=positive_int, default=256, help="tokens per window, [CLS] and [SEP] included")
    parser.add_argument("--samples", type=positive_int, default=32, help="windows of text (fewer if it is shorter)")
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--overwrite", action="store_true", help="replace existing results and plot")
    parser.add_argument("--device", help="e.g. cpu, cuda (default: cuda if available, else cpu)")


def attention_distance_command(args: argparse.Namespace) -> None:
    from roformer.study.decay import DistanceSettings, run_attention_distance
    from roformer.study.markdown import attention_distance_table

    settings = DistanceSettings(length=args.length, samples=args.samples, batch_size=args.batch_size)
    check_encoder_model(args.model)
    result, plot = run_attention_distance(
        args.model, args.data, settings, args.out, device=args.device, overwrite=args.overwrite
    )
    print(attention_distance_table(result) + f"written to {args.out} and {plot}")


def check_encoder_model(model_dir: str) -> None:
    """Refuse an encoder-decoder before the study loads it (it would speak of a tokenizer without [MASK]).

    The study measures one stack's self-attention over text its MLM tokenizer reads.

    Raises:
        UserError: `model_dir` holds an encoder-decoder (any other trouble is the study's to say).
    """
    from roformer.errors import naming
    from roformer.model.weights import MODEL_CONFIG_FILE, read_model_config

    if not (Path(model_dir) / MODEL_CONFIG_FILE).is_file():
        return
    with naming("--model"):
        architecture, _ = read_model_config(model_dir)
    if architecture == "encoder_decoder":
        raise UserError(
            f"--model {model_dir}: an encoder-decoder; attention-distance needs an encoder model (one stack of "
            "self-attention, e.g. a masked LM)"
        )


def embed_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="a model directory (roformer or HF)")
    parser.add_argument("--input", required=True, metavar="FILE", help="texts: .txt (a line each), csv/tsv/jsonl/...")
    parser.add_argument(
        "--out", required=True, metavar="FILE", help="the vectors: .npy or .safetensors, row order kept"
    )
    parser.add_argument("--column", help="the text column of a table or JSON-lines input (default: text)")
    parser.add_argument("--pooling", choices=POOLINGS, help="default: pooler for RoFormer-Sim, else mean")
    parser.add_argument("--normalize", action="store_true", help="unit-length vectors (cosine = dot product)")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--max-length", type=positive_int, help="tokens per text (default 512)")
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


def embed_command(args: argparse.Namespace) -> None:
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


def translate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, metavar="DIR", help="an encoder-decoder directory (a translation run's best/)"
    )
    parser.add_argument("--input", metavar="FILE", help="source sentences, one a line (.gz accepted; default: stdin)")
    parser.add_argument("--out", metavar="FILE", help="the translations, one per input line (default: stdout)")
    parser.add_argument("--beam", type=positive_int, help="beams per sentence, 1 = greedy (default: the run's)")
    parser.add_argument("--length-penalty", type=finite_float, help="sum logprob / length^this (default: the run's)")
    parser.add_argument("--batch-size", type=positive_int, help="sentences per batch (default: the run's)")
    parser.add_argument(
        "--too-long", choices=["error", "truncate"], help="a line longer than the model takes (default: the run's)"
    )
    parser.add_argument("--device", help="e.g. cpu, cuda (default: cuda when there is one)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")


def translate_command(args: argparse.Namespace) -> None:
    from tqdm.auto import tqdm

    from roformer.files import atomic_write_text, check_output_file
    from roformer.study.length_eval import check_device
    from roformer.tasks.parallel import read_lines, split_lines
    from roformer.tasks.translator import Translator

    out = Path(args.out) if args.out else None
    if out is not None:  # before any work: nothing is written for bad input
        if out.exists() and not args.overwrite:
            raise UserError(f"{out}: exists (pass --overwrite to replace it)")
        check_output_file(out)
    if args.device:  # a machine without it: one line now, not a traceback once the model moves there
        check_device(args.device)
    if args.input:
        source = Path(args.input)
        check_input_file(source)
        lines = read_lines(source)
    else:
        source = Path("<stdin>")
        lines = split_lines(sys.stdin.buffer, source)
    settings = {"beam": args.beam, "length_penalty": args.length_penalty, "batch_size": args.batch_size}
    translator = Translator.load(args.model, args.device, **settings, too_long=args.too_long)
    with tqdm(total=len(lines), unit="sent", desc="translate", file=sys.stderr, disable=args.quiet) as bar:
        translations = translator.translate(lines, lambda i: f"{source}:{i + 1}", bar.update)
    text = "".join(line + "\n" for line in translations)
    if out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    atomic_write_text(out, text)
    print(f"{len(translations)} translations written to {out}", file=sys.stderr)


def check_input_file(path: Path) -> None:
    """Refuse an `--input` that is not a file, saying what it is instead.

    Raises:
        UserError: a folder, or nothing at `path`.
    """
    if path.is_dir():
        raise UserError(f"--input {path}: a folder, not a file (one sentence a line)")
    if not path.is_file():
        raise UserError(f"--input {path}: file not found")


def compare_arguments(parser: argparse.ArgumentParser) -> None:
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


def compare_command(args: argparse.Namespace) -> None:
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


# this module's subcommands, in the order `roformer --help` lists them
COMMANDS = (
    Command(
        "eval-mlm", "masked-token loss and accuracy at several sequence lengths", eval_mlm_arguments, eval_mlm_command
    ),
    Command("embed", "sentence vectors of a file of texts with a model's backbone", embed_arguments, embed_command),
    Command(
        "translate",
        "translate a file of sentences (or stdin) with an encoder-decoder, as its run decoded",
        translate_arguments,
        translate_command,
    ),
    Command(
        "probe", "passkey and needle probes of long-context retrieval and MLM by length", probe_arguments, probe_command
    ),
    Command(
        "attention-distance",
        "mean attention logit and weight against token distance, per layer, beside the paper's decay bound",
        attention_distance_arguments,
        attention_distance_command,
    ),
    Command(
        "compare",
        "compare pretraining runs (curves, steps-to-target) and GLUE results",
        compare_arguments,
        compare_command,
    ),
)
