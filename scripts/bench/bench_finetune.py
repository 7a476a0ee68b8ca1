"""NER and extractive QA fine-tuning end to end: `roformer finetune` against transformers' `Trainer` (run_ner, run_qa).

    python scripts/bench/bench_finetune.py --task ner --init runs/roformer-base/final --out runs/bench/ner
    python scripts/bench/bench_finetune.py --task qa --init DIR --out runs/bench/qa --train-examples 1002 --epochs 2
    python scripts/bench/bench_finetune.py --task ner --init DIR --out /tmp/b --train-examples 64 --eval-examples 32 \
        --max-steps 4 --batch-size 8 --seeds 0 1 --profile      # a smoke run; --sides hf: the Trainer alone

Both sides start from the same weights and tokenizer (the roformer model directory `--init`; the Trainer gets it
exported once, before any timing, with `roformer convert --to-hf`, and loads it as a user would, with
`AutoModelFor{TokenClassification,QuestionAnswering}.from_pretrained` and `AutoTokenizer.from_pretrained`), read the
same examples (the first `--train-examples` training and `--eval-examples` dev examples, written as files into
`--out/data`), and follow the same recipe: batch size, steps (or epochs), peak learning rate, linear warmup over the
first 10% of the steps then linear decay, AdamW (betas 0.9/0.999, eps 1e-6, weight decay 0.01 on weights), gradient
clipping at 1.0, fp32 on CPU, no evaluation while training and one on dev at the end, the same torch threads. Each
task head starts fresh, drawn by each library's own initialisation under the run's seed.

Data: CoNLL-2003 (`--task ner`, ../shared/data/ner/conll2003: train.txt and valid.txt, sentences in file order) and
CMRC 2018 (`--task qa`, ../shared/data/qa/cmrc2018: the trial set trains, dev evaluates; questions in file order).

Ours: `python -m roformer finetune --config <written into --out> --output-dir ...`, a subprocess, so its wall time is
what a user waits for (start-up, reading and tokenising the data, training, evaluation, writing the run directory).

Theirs: a subprocess of this script (`--side hf`) that does what `run_ner.py` / `run_qa.py` (transformers'
examples/pytorch) do with their default arguments, re-implemented here: the data into a `datasets.Dataset`, tokenised
with `Dataset.map(batched=True)`; NER: `tokenize_and_align_labels` (the tag on the first piece of each word, -100
elsewhere, no padding; `DataCollatorForTokenClassification` pads each batch), label list = the sorted training tags,
seqeval entity scores over the words the model saw; QA: `prepare_train_features` / `prepare_validation_features`
(windows of max_length with doc_stride overlap, the answer's tokens or [CLS] when it is outside the window; every
window padded to max_length, `pad_to_max_length=True` being run_qa's default, batched by `default_data_collator`),
then `postprocess_qa_predictions` (n-best start/end pairs over all windows of a question, the best span's text);
`trainer.save_model()` after training (as both scripts do) and the predictions files of run_qa. The Trainer keeps
its own defaults elsewhere (AdamW fused on CPU, random sampler with a partial last batch, dataloader_num_workers=0).

Metrics: NER entity F1 (HF: seqeval, as run_ner, over the words it saw; ours: roformer.tasks.tagging_metrics,
conlleval's chunks as seqeval reads them, over every dev word; each side is also scored by the other's code: ours'
dev.conll by seqeval, HF's predictions by tagging_metrics). QA: CMRC 2018's official EM and F1 on both sides from
roformer.tasks.qa_metrics.cmrc2018 (needs nltk), so that metric code is not a difference; ours' dev_predictions.json
is rescored here with it too.

Reported per side and seed: wall time of the whole subprocess, training time (ours: the steps' time from
metrics.jsonl; HF: `train_runtime`) and training rows/s (steps x batch / training time; rows are windows for QA),
the dev metrics; then the HF/ours wall-time ratio and, for HF, where the time went. Writes `--out/bench.json` and
`--out/bench.md`; with `--profile`, one more (untimed) run per side under cProfile: `--out/profile-{ours,hf}.txt`.

Differences that remain, each side's own behaviour: ours pads a batch to its longest row (rounded up to 8), run_qa
every window to max_length; ours predicts in order of length, the Trainer in file order; ours cuts a question to
qa.max_query_length (64) tokens, run_qa does not, and ours drops question tokens before taking the n-best starts and
ends (roformer.tasks.qa); ours numbers the NER labels `O` first, run_ner sorts them; ours scores every dev word (those
cut off by max_length predicted `O`), run_ner only the words the model saw (the counts are in bench.json); ours
trains on full batches from per-epoch permutations, the Trainer on a random sampler with a partial last batch; the
Trainer's AdamW is the fused CPU kernel (its default optim), ours the per-tensor one.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
NER_DIR = SHARED / "ner" / "conll2003"
QA_DIR = SHARED / "qa" / "cmrc2018"
IGNORE = -100  # the label of pieces and specials that are not trained or scored (HF's and ours)
DOCSTART = "-DOCSTART-"

# The shared recipe (ours: FinetuneTrainConfig and TrainArgs defaults, set explicitly on both sides).
WARMUP_FRACTION = 0.1
WEIGHT_DECAY = 0.01
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-6
MAX_GRAD_NORM = 1.0


# ----------------------------------------------------------------------------------------------------------------
# Data: the subsets both sides read


def conll_sentences(path: Path) -> list[list[str]]:
    """The sentences of a CoNLL column file, each its word lines (`-DOCSTART-` lines and blank lines dropped)."""
    sentences: list[list[str]] = []
    current: list[str] = []
    for line in path.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n"):
        if not line.strip():
            if current:
                sentences.append(current)
            current = []
        elif line.split()[0] != DOCSTART:
            current.append(line)
    if current:
        sentences.append(current)
    return sentences


def write_conll(sentences: Sequence[list[str]], path: Path) -> None:
    """Word lines of `sentences` with a blank line after each: a CoNLL file both sides read."""
    path.write_text("".join("\n".join(s) + "\n\n" for s in sentences), encoding="utf-8")


def squad_subset(path: Path, limit: int | None) -> tuple[dict[str, Any], int]:
    """The SQuAD-format file `path` cut to its first `limit` questions (all when None), and the count kept."""
    data = json.loads(path.read_text(encoding="utf-8"))
    kept, articles = 0, []
    for article in data["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            room = len(paragraph["qas"]) if limit is None else max(0, min(len(paragraph["qas"]), limit - kept))
            if room:
                paragraphs.append({**paragraph, "qas": paragraph["qas"][:room]})
                kept += room
        if paragraphs:
            articles.append({**article, "paragraphs": paragraphs})
    return {**{k: v for k, v in data.items() if k != "data"}, "data": articles}, kept


def write_subsets(task: str, out: Path, n_train: int | None, n_eval: int | None) -> dict[str, Any]:
    """Write the training and dev subsets into `out/data`; returns their paths and example counts."""
    folder = out / "data"
    folder.mkdir(parents=True, exist_ok=True)
    if task == "ner":
        train = conll_sentences(NER_DIR / "train.txt")[:n_train]
        dev = conll_sentences(NER_DIR / "valid.txt")[:n_eval]
        files = {"train": folder / "train.txt", "dev": folder / "dev.txt"}
        write_conll(train, files["train"])
        write_conll(dev, files["dev"])
        counts = {"train": len(train), "dev": len(dev)}
    else:
        files = {"train": folder / "train.json", "dev": folder / "dev.json"}
        counts = {}
        for split, source, limit in (("train", "cmrc2018_trial.json", n_train), ("dev", "cmrc2018_dev.json", n_eval)):
            subset, counts[split] = squad_subset(QA_DIR / source, limit)
            files[split].write_text(json.dumps(subset, ensure_ascii=False), encoding="utf-8")
    return {"files": {k: str(v) for k, v in files.items()}, "examples": counts}


def read_conll_tagged(path: str) -> dict[str, list[Any]]:
    """Words and tags (the last column) of a CoNLL file, as the columns of a `datasets.Dataset`."""
    sentences = conll_sentences(Path(path))
    rows = [[line.split() for line in s] for s in sentences]
    return {
        "id": [str(i) for i in range(len(rows))],
        "tokens": [[cols[0] for cols in r] for r in rows],
        "ner_tags": [[cols[-1] for cols in r] for r in rows],
    }


def read_squad_flat(path: str) -> dict[str, list[Any]]:
    """One row per question (id, title, context, question, answers: {text, answer_start}): the hub's SQuAD layout."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    columns: dict[str, list[Any]] = {k: [] for k in ("id", "title", "context", "question", "answers")}
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                columns["id"].append(str(qa["id"]))
                columns["title"].append(article.get("title", ""))
                columns["context"].append(paragraph["context"])
                columns["question"].append(qa["question"])
                answers = qa.get("answers", [])
                columns["answers"].append(
                    {"text": [a["text"] for a in answers], "answer_start": [int(a["answer_start"]) for a in answers]}
                )
    return columns


# ----------------------------------------------------------------------------------------------------------------
# Metrics shared by both sides


def seqeval_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Entity precision, recall, F1 and token accuracy by seqeval's default mode (what run_ner reports)."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    return {
        "precision": float(precision_score(gold, predicted, zero_division=0)),
        "recall": float(recall_score(gold, predicted, zero_division=0)),
        "f1": float(f1_score(gold, predicted, zero_division=0)),
        "accuracy": float(accuracy_score(gold, predicted)),
    }


QAMetric = Callable[[dict[str, str], dict[str, list[str]]], dict[str, float]]


def qa_metric() -> tuple[QAMetric, str]:
    """CMRC 2018's official metric (EM, F1 and their mean, as fractions like results.json) both sides are scored with.

    `roformer.tasks.qa_metrics.cmrc2018` (the port of cmrc2018_evaluate.py that ours reports) takes the predictions
    `{question id: text}` and the gold answers `{question id: [texts]}`.
    """
    from roformer.tasks.qa_metrics import cmrc2018

    def fractions(predictions: dict[str, str], gold: dict[str, list[str]]) -> dict[str, float]:
        return {name: value / 100 for name, value in cmrc2018(predictions, gold).items()}  # the script's percent

    return fractions, "roformer.tasks.qa_metrics.cmrc2018"


# ----------------------------------------------------------------------------------------------------------------
# The HF side (a child process): what run_ner / run_qa do


def _hf_training_args(job: dict[str, Any], steps: int) -> Any:
    import torch
    import transformers

    return transformers.TrainingArguments(
        output_dir=job["output_dir"], do_train=True, do_eval=True,
        per_device_train_batch_size=job["batch_size"], per_device_eval_batch_size=job["eval_batch_size"],
        max_steps=steps, learning_rate=job["lr"], lr_scheduler_type="linear",
        warmup_steps=int(WARMUP_FRACTION * steps),  # ours: int(warmup_fraction x steps)
        weight_decay=WEIGHT_DECAY, adam_beta1=ADAM_BETAS[0], adam_beta2=ADAM_BETAS[1], adam_epsilon=ADAM_EPS,
        max_grad_norm=MAX_GRAD_NORM, eval_strategy="no", save_strategy="no", logging_steps=50, report_to=[],
        seed=job["seed"], dataloader_num_workers=0, disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
    )  # fmt: skip


def _hf_steps(job: dict[str, Any], rows: int) -> int:
    """Optimizer steps: --max-steps, else the Trainer's count for the epochs (a partial last batch per epoch)."""
    if job["max_steps"] is not None:
        return job["max_steps"]
    return max(1, math.ceil(job["epochs"] * math.ceil(rows / job["batch_size"])))


def train_and_save(trainer: Any, clock: dict[str, float]) -> Any:
    """`trainer.train()`, then what run_ner and run_qa write after it (model, train metrics, state), both timed.

    Returns:
        The training's result (`train_runtime` among its metrics).
    """
    result = trainer.train()
    clock["train"] = time.perf_counter()
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    clock["save"] = time.perf_counter()
    return result


def hf_ner(job: dict[str, Any], clock: dict[str, float]) -> dict[str, Any]:
    """run_ner: tokenize_and_align_labels, DataCollatorForTokenClassification, Trainer, seqeval."""
    import datasets
    import transformers

    transformers.set_seed(job["seed"])
    raw = {split: datasets.Dataset.from_dict(read_conll_tagged(job["files"][split])) for split in ("train", "dev")}
    label_list = sorted({tag for tags in raw["train"]["ner_tags"] for tag in tags})  # run_ner: strings, sorted
    label_to_id = {label: i for i, label in enumerate(label_list)}
    config = transformers.AutoConfig.from_pretrained(job["hf_init"], num_labels=len(label_list), finetuning_task="ner")
    tokenizer = transformers.AutoTokenizer.from_pretrained(job["hf_init"], use_fast=True)
    model = transformers.AutoModelForTokenClassification.from_pretrained(job["hf_init"], config=config)
    model.config.label2id = dict(label_to_id)
    model.config.id2label = dict(enumerate(label_list))
    clock["load"] = time.perf_counter()

    def tokenize_and_align_labels(batch: dict[str, list[Any]]) -> Any:
        encoded = tokenizer(batch["tokens"], truncation=True, max_length=job["max_length"], is_split_into_words=True)
        all_labels = []
        for i, tags in enumerate(batch["ner_tags"]):
            labels, previous = [], None
            for word in encoded.word_ids(batch_index=i):
                # a special token, or a piece after the first of its word: not trained (label_all_tokens=False)
                labels.append(IGNORE if word is None or word == previous else label_to_id[tags[word]])
                previous = word
            all_labels.append(labels)
        encoded["labels"] = all_labels
        return encoded

    train = raw["train"].map(tokenize_and_align_labels, batched=True, desc="Running tokenizer on train dataset")
    dev = raw["dev"].map(tokenize_and_align_labels, batched=True, desc="Running tokenizer on validation dataset")
    clock["data"] = time.perf_counter()
    shared: dict[str, Any] = {}

    def compute_metrics(prediction: transformers.EvalPrediction) -> dict[str, float]:
        predicted_ids = np.argmax(prediction.predictions, axis=2)
        pairs = [
            [(label_list[p], label_list[g]) for p, g in zip(row_p, row_g) if g != IGNORE]
            for row_p, row_g in zip(predicted_ids, prediction.label_ids)
        ]
        predicted = [[p for p, _ in sentence] for sentence in pairs]
        gold = [[g for _, g in sentence] for sentence in pairs]
        shared["seen_words"] = sum(len(s) for s in gold)
        try:  # the project's scorer on the same lists: shows that the metric code is not a difference
            from roformer.tasks.tagging_metrics import tag_scores

            shared["roformer_tagging_metrics"] = tag_scores(gold, predicted)
        except ImportError:
            pass
        return seqeval_scores(gold, predicted)

    trainer = transformers.Trainer(
        model=model, args=_hf_training_args(job, _hf_steps(job, len(train))), train_dataset=train, eval_dataset=dev,
        processing_class=tokenizer, data_collator=transformers.DataCollatorForTokenClassification(tokenizer),
        compute_metrics=compute_metrics,
    )  # fmt: skip
    result = train_and_save(trainer, clock)
    metrics = trainer.evaluate()
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    clock["eval"] = time.perf_counter()
    dev_words = sum(len(t) for t in raw["dev"]["ner_tags"])
    scores = {
        k.removeprefix("eval_"): v for k, v in metrics.items() if k[5:] in ("precision", "recall", "f1", "accuracy")
    }
    return {
        "dev": scores,
        "train_rows": len(train),
        "steps": trainer.state.global_step,
        "train_runtime": result.metrics["train_runtime"],
        "labels": label_list,
        "dev_words": dev_words,
        "dev_words_scored": shared.get("seen_words"),
        "dev_roformer_tagging_metrics": shared.get("roformer_tagging_metrics"),
    }


def postprocess_qa_predictions(
    examples: Any,
    features: Any,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best: int,
    max_answer_length: int,
    output_dir: str | None = None,
    prefix: str | None = None,
) -> dict[str, str]:
    """utils_qa.postprocess_qa_predictions (SQuAD v1: an answer for every question), re-implemented.

    For every question, over all of its windows: the `n_best` highest start and end logits give candidate spans
    (inside the context, end not before start, at most `max_answer_length` tokens); the best-scoring one (start +
    end logit) is the answer, its characters cut from the context by the offsets. Its n-best list and the answers
    are written to `output_dir` as run_qa does.
    """
    features_of: dict[int, list[int]] = collections.defaultdict(list)
    index_of = {example_id: i for i, example_id in enumerate(examples["id"])}
    for i, example_id in enumerate(features["example_id"]):
        features_of[index_of[example_id]].append(i)
    offsets_of = features["offset_mapping"]
    answers: dict[str, str] = collections.OrderedDict()
    nbest_json: dict[str, list[dict[str, Any]]] = collections.OrderedDict()
    for index, example in enumerate(examples):
        candidates = []
        for f in features_of[index]:
            starts, ends, offsets = start_logits[f], end_logits[f], offsets_of[f]
            best_starts = np.argsort(starts)[-1 : -n_best - 1 : -1].tolist()
            best_ends = np.argsort(ends)[-1 : -n_best - 1 : -1].tolist()
            for s in best_starts:
                for e in best_ends:
                    outside = s >= len(offsets) or e >= len(offsets)
                    if outside or offsets[s] is None or offsets[e] is None or len(offsets[s]) < 2:
                        continue  # beyond the window, or not a context token
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    candidates.append(
                        {
                            "offsets": (offsets[s][0], offsets[e][1]),
                            "score": starts[s] + ends[e],
                            "start_logit": starts[s],
                            "end_logit": ends[e],
                        }
                    )
        kept = sorted(candidates, key=lambda c: c["score"], reverse=True)[:n_best]
        context = example["context"]
        for c in kept:
            first, last = c.pop("offsets")
            c["text"] = context[first:last]
        if not kept or (len(kept) == 1 and kept[0]["text"] == ""):  # utils_qa's stand-in when nothing is left
            kept.insert(0, {"text": "empty", "start_logit": 0.0, "end_logit": 0.0, "score": 0.0})
        scores = np.array([c.pop("score") for c in kept])
        probabilities = np.exp(scores - scores.max())
        probabilities /= probabilities.sum()
        for probability, c in zip(probabilities, kept):
            c["probability"] = probability
        answers[example["id"]] = kept[0]["text"]
        nbest_json[example["id"]] = [
            {k: float(v) if isinstance(v, np.floating) else v for k, v in c.items()} for c in kept
        ]
    if output_dir is not None:
        name = "" if prefix is None else f"{prefix}_"
        Path(output_dir, f"{name}predictions.json").write_text(json.dumps(answers, indent=4) + "\n")
        Path(output_dir, f"{name}nbest_predictions.json").write_text(json.dumps(nbest_json, indent=4) + "\n")
    return answers


def qa_features(tokenizer: Any, max_length: int, doc_stride: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """run_qa's `prepare_train_features` and `prepare_validation_features` for `tokenizer`, as `Dataset.map` functions.

    Every question with its context becomes windows of `max_length` tokens (the context cut with `doc_stride` tokens
    of overlap, all padded to max_length). Training windows are labelled with the answer's first and last tokens,
    or with the [CLS] position when the answer is not inside; validation windows keep their question's id and the
    character offsets of their context tokens (None elsewhere) for post-processing.
    """
    pad_on_right = tokenizer.padding_side == "right"
    context_id = 1 if pad_on_right else 0

    def windows(batch: dict[str, list[Any]]) -> Any:
        questions = [q.lstrip() for q in batch["question"]]  # leading blanks would only take room from the context
        first, second = (questions, batch["context"]) if pad_on_right else (batch["context"], questions)
        return tokenizer(
            first, second, truncation="only_second" if pad_on_right else "only_first", max_length=max_length,
            stride=doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True,
            padding="max_length",  # run_qa's pad_to_max_length=True
        )  # fmt: skip

    def prepare_train_features(batch: dict[str, list[Any]]) -> Any:
        encoded = windows(batch)
        sample_of = encoded.pop("overflow_to_sample_mapping")
        all_offsets = encoded.pop("offset_mapping")
        encoded["start_positions"], encoded["end_positions"] = [], []
        for i, offsets in enumerate(all_offsets):
            ids = encoded["input_ids"][i]
            cls = ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in ids else 0
            sequence = encoded.sequence_ids(i)
            answer = batch["answers"][sample_of[i]]
            start, end = cls, cls  # no answer in this window: the [CLS] position
            if answer["answer_start"]:
                first_char = answer["answer_start"][0]
                last_char = first_char + len(answer["text"][0])
                lo = 0  # the window's first and last context tokens
                while sequence[lo] != context_id:
                    lo += 1
                hi = len(ids) - 1
                while sequence[hi] != context_id:
                    hi -= 1
                if offsets[lo][0] <= first_char and offsets[hi][1] >= last_char:  # the answer is inside
                    while lo < len(offsets) and offsets[lo][0] <= first_char:
                        lo += 1
                    while offsets[hi][1] >= last_char:
                        hi -= 1
                    start, end = lo - 1, hi + 1
            encoded["start_positions"].append(start)
            encoded["end_positions"].append(end)
        return encoded

    def prepare_validation_features(batch: dict[str, list[Any]]) -> Any:
        encoded = windows(batch)
        sample_of = encoded.pop("overflow_to_sample_mapping")
        encoded["example_id"] = []
        for i in range(len(encoded["input_ids"])):
            sequence = encoded.sequence_ids(i)
            encoded["example_id"].append(batch["id"][sample_of[i]])
            # offsets of the question and specials are None: post-processing keeps context spans only
            encoded["offset_mapping"][i] = [
                o if sequence[k] == context_id else None for k, o in enumerate(encoded["offset_mapping"][i])
            ]
        return encoded

    return prepare_train_features, prepare_validation_features


def hf_qa(job: dict[str, Any], clock: dict[str, float]) -> dict[str, Any]:
    """run_qa: prepare_train_features, prepare_validation_features, default_data_collator, Trainer, post-processing."""
    import datasets
    import transformers

    transformers.set_seed(job["seed"])
    raw = {split: datasets.Dataset.from_dict(read_squad_flat(job["files"][split])) for split in ("train", "dev")}
    tokenizer = transformers.AutoTokenizer.from_pretrained(job["hf_init"], use_fast=True)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(job["hf_init"])
    clock["load"] = time.perf_counter()
    max_length = min(job["max_length"], tokenizer.model_max_length)
    prepare_train_features, prepare_validation_features = qa_features(tokenizer, max_length, job["doc_stride"])
    columns = raw["train"].column_names
    train = raw["train"].map(
        prepare_train_features, batched=True, remove_columns=columns, desc="Running tokenizer on train dataset"
    )
    dev = raw["dev"].map(
        prepare_validation_features,
        batched=True,
        remove_columns=columns,
        desc="Running tokenizer on validation dataset",
    )
    clock["data"] = time.perf_counter()
    trainer = transformers.Trainer(
        model=model, args=_hf_training_args(job, _hf_steps(job, len(train))), train_dataset=train,
        processing_class=tokenizer, data_collator=transformers.default_data_collator,
    )  # fmt: skip
    result = train_and_save(trainer, clock)
    # QuestionAnsweringTrainer.evaluate: the evaluation loop without metrics (example_id and offset_mapping are not
    # model inputs: the Trainer drops them from the batches), then post-processing and the metric
    output = trainer.predict(dev)
    clock["eval_forward"] = time.perf_counter()
    start_logits, end_logits = output.predictions[:2]
    answers = postprocess_qa_predictions(
        raw["dev"], dev, start_logits, end_logits, job["n_best"], job["max_answer_length"], job["output_dir"], "eval"
    )
    metric, source = qa_metric()
    dev_metrics = metric(dict(answers), {i: a["text"] for i, a in zip(raw["dev"]["id"], raw["dev"]["answers"])})
    trainer.log_metrics("eval", dev_metrics)
    trainer.save_metrics("eval", dev_metrics)
    clock["eval"] = time.perf_counter()
    return {
        "dev": dev_metrics,
        "metric_source": source,
        "train_rows": len(train),
        "dev_rows": len(dev),
        "steps": trainer.state.global_step,
        "train_runtime": result.metrics["train_runtime"],
    }


def hf_child(job_file: Path) -> None:
    """The `--side hf` process: one Trainer job; its results (with phase timings) into job["result_file"]."""
    clock = {"start": time.perf_counter()}
    job = json.loads(job_file.read_text())
    import torch
    import transformers

    torch.set_num_threads(job["threads"])
    transformers.logging.set_verbosity_warning()
    clock["imports"] = time.perf_counter()
    result = (hf_ner if job["task"] == "ner" else hf_qa)(job, clock)
    names = list(clock)
    result["phases_sec"] = {b: clock[b] - clock[a] for a, b in zip(names, names[1:])}
    result["threads"] = torch.get_num_threads()
    Path(job["result_file"]).write_text(json.dumps(result, indent=2, default=float))


# ----------------------------------------------------------------------------------------------------------------
# The parent: data, both sides per seed, the report


def child_env(threads: int) -> dict[str, str]:
    """Both sides' environment: the same threads, nothing downloaded."""
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM=env.get("TOKENIZERS_PARALLELISM", "true"),
    )  # fmt: skip
    return env


def effective_max_length(init: Path, max_length: int) -> int:
    """max_length as ours caps it: at the length the init was pretrained at, and at a learned position table."""
    from roformer.model.pretrained import pretrained_config
    from roformer.train.run_dir import pretraining_length

    pretrained = pretraining_length(init)
    if pretrained is not None:
        max_length = min(max_length, pretrained)
    config = pretrained_config(str(init), "token_classification", 2)
    if config.position_encoding == "learned":
        max_length = min(max_length, config.max_position_embeddings)
    return max_length


def ours_config(args: argparse.Namespace, data: dict[str, Any], seed: int, path: Path) -> None:
    """The `roformer finetune` config of one seed, written to `path` (absolute paths)."""
    import yaml

    files = data["files"]
    common = {"train_file": files["train"], "validation_file": files["dev"], "max_length": args.max_length}
    if args.task == "ner":
        section = {"type": "token_classification", "task": "conll2003", **common, "tagging": {"format": "conll"}}
    else:
        qa = {"doc_stride": args.doc_stride, "max_answer_length": args.max_answer_length, "metric": "cmrc2018"}
        section = {"type": "question_answering", "task": "cmrc2018", **common, "qa": qa}
    length = {"max_steps": args.max_steps} if args.max_steps is not None else {"epochs": args.epochs}
    train = {
        **length, "batch_size": args.batch_size, "eval_batch_size": args.eval_batch_size, "lr": args.lr,
        "lrs": [args.lr], "seeds": [seed], "warmup_fraction": WARMUP_FRACTION, "weight_decay": WEIGHT_DECAY,
        "adam_beta1": ADAM_BETAS[0], "adam_beta2": ADAM_BETAS[1], "adam_eps": ADAM_EPS,
        "max_grad_norm": MAX_GRAD_NORM, "eval_every": 0, "save_every": 0, "progress": False,
    }  # fmt: skip
    config = {"init": str(Path(args.init).resolve()), "data": section, "train": train}
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))


def _rescore_ours(task: str, run_dir: Path, data: dict[str, Any]) -> dict[str, Any] | None:
    """Ours' dev predictions scored with the HF side's metric function, when a predictions file is found."""
    folders = sorted((run_dir / "predictions").glob("*"))
    if not folders:
        return None
    if task == "ner":
        conll = folders[0] / "dev.conll"
        if not conll.is_file():
            return None
        rows = [[line.split() for line in s] for s in conll_sentences(conll)]
        gold = [[cols[-2] for cols in r] for r in rows]
        predicted = [[cols[-1] for cols in r] for r in rows]
        return {"metric": "seqeval", **seqeval_scores(gold, predicted)}
    predictions = folders[0] / "dev_predictions.json"  # {question id: answer text}, CMRC's format
    if not predictions.is_file():
        return None
    dev = read_squad_flat(data["files"]["dev"])
    metric, source = qa_metric()
    answers = {i: a["text"] for i, a in zip(dev["id"], dev["answers"])}
    return {"metric": source, **metric(json.loads(predictions.read_text(encoding="utf-8")), answers)}


def run_ours(
    args: argparse.Namespace, data: dict[str, Any], seed: int, env: dict[str, str], profiler: Sequence[str] = ()
) -> dict[str, Any]:
    """One `roformer finetune` job (a subprocess); its wall time, training time and dev metrics.

    `profiler`: arguments of python before `-m roformer` (`-m cProfile -o FILE`: a profiled, untimed run).
    """
    out = Path(args.out)
    name = f"ours-seed{seed}" + ("-profiled" if profiler else "")
    config = out / "configs" / f"{name}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    ours_config(args, data, seed, config)
    run_dir = out / name
    log = out / f"{name}.log"
    command = [sys.executable, *profiler, "-m", "roformer", "finetune", "--config", str(config)]
    command += ["--output-dir", str(run_dir), "--overwrite"]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    with log.open("w") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"roformer finetune failed (exit {done.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    results = json.loads((run_dir / "results.json").read_text())
    run = results["runs"][0]
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [e for e in events if e.get("event") in ("eval", "train") and "elapsed_sec" in e]
    train_sec = timed[-1]["elapsed_sec"] if timed else math.nan
    trains = [e for e in events if e.get("event") == "train"]
    epoch = trains[-1].get("epoch") if trains else None  # rounded to 3 decimals: the row count is approximate
    return {
        "wall": wall,
        "load_average_before": load,
        "train_rows": f"~{round(run['steps'] * args.batch_size / epoch)}" if epoch else None,
        "train_sec": train_sec,
        "steps": run["steps"],
        "dev": run["dev"][results.get("selection_split", "dev")],
        "max_length": results.get("max_length"),
        "padding_fraction_last_interval": trains[-1].get("padding_fraction") if trains else None,
        "rescored": _rescore_ours(args.task, run_dir, data),
    }


def run_hf(
    args: argparse.Namespace, data: dict[str, Any], seed: int, env: dict[str, str], profiler: Sequence[str] = ()
) -> dict[str, Any]:
    """One Trainer job (this script with `--side hf`, a subprocess); its wall time, phases and dev metrics."""
    out = Path(args.out)
    name = f"hf-seed{seed}" + ("-profiled" if profiler else "")
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    job = {
        "task": args.task, "hf_init": str(out / "hf-init"), "files": data["files"], "seed": seed,
        "max_length": args.max_length, "batch_size": args.batch_size, "eval_batch_size": args.eval_batch_size,
        "lr": args.lr, "max_steps": args.max_steps, "epochs": args.epochs, "doc_stride": args.doc_stride,
        "max_answer_length": args.max_answer_length, "n_best": 20, "threads": args.threads,
        "output_dir": str(folder), "result_file": str(folder / "bench_result.json"),
    }  # fmt: skip
    job_file = out / "configs" / f"{name}.json"
    job_file.parent.mkdir(parents=True, exist_ok=True)
    job_file.write_text(json.dumps(job, indent=2))
    log = out / f"{name}.log"
    load = os.getloadavg()[0]
    start = time.perf_counter()
    with log.open("w") as f:
        command = [sys.executable, *profiler, str(Path(__file__).resolve()), "--side", "hf", "--job", str(job_file)]
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"the Trainer job failed (exit {done.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    result = json.loads(Path(job["result_file"]).read_text())
    return {"wall": wall, "load_average_before": load, "train_sec": result["train_runtime"], **result}


def profile(args: argparse.Namespace, data: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    """One more job per side under cProfile (first seed, not timed): the top functions by cumulative time, as text."""
    import pstats

    out, files = Path(args.out), {}
    for side in args.sides:
        stats = out / f"profile-{side}.prof"
        run = run_ours if side == "ours" else run_hf
        run(args, data, args.seeds[0], env, ("-m", "cProfile", "-o", str(stats)))
        text = out / f"profile-{side}.txt"
        with text.open("w") as f:
            pstats.Stats(str(stats), stream=f).sort_stats("cumulative").print_stats(60)
            pstats.Stats(str(stats), stream=f).sort_stats("tottime").print_stats(30)
        files[side] = str(text)
    return files


def export_hf(init: Path, target: Path, env: dict[str, str]) -> None:
    """The init as an HF checkpoint + tokenizer (`roformer convert --to-hf`): the user's one-time step, untimed."""
    command = [sys.executable, "-m", "roformer", "convert", "--to-hf", str(init), "--out", str(target), "--overwrite"]
    subprocess.run(command, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL)


def _mean_std(values: list[float], scale: float) -> str:
    values = [scale * v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def report(args: argparse.Namespace, bench: dict[str, Any]) -> str:
    """The markdown tables of a finished benchmark."""
    metrics = ["precision", "recall", "f1", "accuracy"] if args.task == "ner" else ["exact_match", "f1"]
    scale = 100  # every score is a fraction (results.json's), shown in percent
    lines = [
        f"### {args.task}: roformer finetune vs transformers Trainer ({bench['setup']['reference']})",
        "",
        f"init {args.init}; {bench['data']['examples']['train']} train / {bench['data']['examples']['dev']} dev "
        f"examples; max length {args.max_length}; batch {args.batch_size} (eval {args.eval_batch_size}); "
        f"{'steps ' + str(args.max_steps) if args.max_steps is not None else 'epochs ' + str(args.epochs)}; "
        f"lr {args.lr}; seeds {args.seeds}; {args.threads} threads; torch {bench['setup']['torch']}, "
        f"transformers {bench['setup']['transformers']}",
        "",
        "| side | seed | wall s | train s | train rows | steps | train rows/s | job rows/s | load before | "
        + " | ".join(f"dev {m}" for m in metrics)
        + " |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(metrics),
    ]
    for side in ("ours", "hf"):
        for run in bench["runs"].get(side, []):
            rows = run["steps"] * args.batch_size
            scores = " | ".join(f"{scale * run['dev'].get(m, math.nan):.2f}" for m in metrics)
            lines.append(
                f"| {side} | {run['seed']} | {run['wall']:.1f} | {run['train_sec']:.1f} | {run.get('train_rows', '-')}"
                f" | {run['steps']} | {rows / run['train_sec']:.1f} | {rows / run['wall']:.1f}"
                f" | {run['load_average_before']:.2f} | {scores} |"
            )
    summary = bench["summary"]
    lines += ["", "| side | mean wall s | mean train s | " + " | ".join(f"dev {m}" for m in metrics) + " |"]
    lines.append("|---|---:|---:|" + "---:|" * len(metrics))
    for side, s in summary["sides"].items():
        cells = " | ".join(s["dev"][m] for m in metrics)
        lines.append(f"| {side} | {s['wall']:.1f} | {s['train_sec']:.1f} | {cells} |")
    if summary.get("wall_ratio_hf_over_ours") is not None:
        lines += ["", f"HF wall / ours wall: **{summary['wall_ratio_hf_over_ours']:.2f}x** (target >= 1.3x); "]
        lines[-1] += f"HF training time / ours: {summary['train_ratio_hf_over_ours']:.2f}x"
    lines += ["", "Where the time went (s):", ""]
    for side in ("ours", "hf"):
        for run in bench["runs"].get(side, []):
            if side == "hf":
                phases = ", ".join(f"{k} {v:.1f}" for k, v in run["phases_sec"].items())
                lines.append(f"- HF seed {run['seed']}: {phases}")
            else:
                rest = run["wall"] - run["train_sec"]
                lines.append(f"- ours seed {run['seed']}: training steps {run['train_sec']:.1f}, the rest {rest:.1f}")
    lines += [
        "",
        "HF phases: imports = torch + transformers; load = tokenizer and model (with transformers' lazy imports of "
        "the model code); data = reading + Dataset.map; train = trainer.train(); save = save_model/metrics/state; "
        "eval_forward = the prediction loop (QA); eval = evaluation (NER: loop + seqeval; QA: post-processing + "
        "metric). Ours' rest = start-up, reading and tokenising, the end-of-run evaluation (its predictions are "
        "the ones written), writing the run directory.",
    ]
    for run in bench["runs"].get("hf", []):
        if run.get("dev_words_scored") is not None and run["dev_words_scored"] != run["dev_words"]:
            lines.append(f"- HF seed {run['seed']} scored {run['dev_words_scored']} of {run['dev_words']} dev words")
    for side in ("ours", "hf"):
        for run in bench["runs"].get(side, []):
            checks = {"ours": run.get("rescored"), "hf": run.get("dev_roformer_tagging_metrics")}[side]
            if checks:
                what = "ours rescored by the HF side's metric" if side == "ours" else "HF scored by tagging_metrics"
                numbers = ", ".join(f"{k} {scale * v:.2f}" for k, v in checks.items() if isinstance(v, float))
                lines.append(f"- seed {run['seed']}, {what}: {numbers}")
    return "\n".join(lines)


def summarise(bench: dict[str, Any], metrics: list[str], scale: float) -> dict[str, Any]:
    """Mean wall and training time per side, dev metrics as mean ± std over seeds, the HF/ours ratios."""
    sides = {}
    for side, runs in bench["runs"].items():
        if runs:
            sides[side] = {
                "wall": statistics.mean(r["wall"] for r in runs),
                "train_sec": statistics.mean(r["train_sec"] for r in runs),
                "dev": {m: _mean_std([r["dev"].get(m) for r in runs], scale) for m in metrics},
            }
    summary: dict[str, Any] = {"sides": sides}
    if "ours" in sides and "hf" in sides:
        summary["wall_ratio_hf_over_ours"] = sides["hf"]["wall"] / sides["ours"]["wall"]
        summary["train_ratio_hf_over_ours"] = sides["hf"]["train_sec"] / sides["ours"]["train_sec"]
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=("ner", "qa"))
    parser.add_argument("--init", help="a roformer model directory with its tokenizer (a pretraining run's final/)")
    parser.add_argument(
        "--out", type=lambda p: str(Path(p).resolve()), help="output folder: data, configs, run folders, bench.json"
    )
    parser.add_argument("--train-examples", type=int, default=None, help="first N training sentences/questions")
    parser.add_argument("--eval-examples", type=int, default=None, help="first M dev sentences/questions")
    parser.add_argument("--max-steps", type=int, default=None, help="optimizer steps (else --epochs)")
    parser.add_argument("--epochs", type=float, default=1.0, help="epochs when --max-steps is not given")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-batch-size", type=int, default=None, help="default: --batch-size (both sides)")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--max-length", type=int, default=None, help="default: 128 (ner), 512 (qa); capped as ours")
    parser.add_argument("--doc-stride", type=int, default=128, help="qa: overlap of a long context's windows")
    parser.add_argument("--max-answer-length", type=int, default=30, help="qa: longest answer span in tokens")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of both sides (default: all cores)")
    parser.add_argument("--profile", action="store_true", help="then one cProfile'd run per side (profile-*.txt)")
    parser.add_argument("--sides", nargs="+", choices=("ours", "hf"), default=["ours", "hf"])
    parser.add_argument("--side", choices=("hf",), help=argparse.SUPPRESS)  # internal: the Trainer child
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side is None and not (args.task and args.init and args.out):
        parser.error("--task, --init and --out are required")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.side == "hf":
        hf_child(Path(args.job))
        return
    import torch
    import transformers

    args.threads = args.threads or os.cpu_count() or 1
    args.eval_batch_size = args.eval_batch_size or args.batch_size
    asked = args.max_length or (128 if args.task == "ner" else 512)
    args.max_length = effective_max_length(Path(args.init), asked)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = child_env(args.threads)
    data = write_subsets(args.task, out, args.train_examples, args.eval_examples)
    if "hf" in args.sides:
        export_hf(Path(args.init), out / "hf-init", env)
    bench: dict[str, Any] = {
        "setup": {
            "reference": "run_ner.py" if args.task == "ner" else "run_qa.py",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "max_length_asked": asked,
            **{k: v for k, v in vars(args).items() if k not in ("side", "job")},
        },
        "data": data,
        "runs": {side: [] for side in args.sides},
    }
    for seed in args.seeds:  # the sides alternate, so that a drift of the machine's speed touches both
        for side in args.sides:
            run = (run_ours if side == "ours" else run_hf)(args, data, seed, env)
            bench["runs"][side].append({"seed": seed, **run})
            if side == "ours" and run.get("max_length") not in (None, args.max_length):
                print(f"warning: ours cut examples at {run['max_length']}, the Trainer at {args.max_length}")
            print(f"{side} seed {seed}: wall {run['wall']:.1f}s, dev {run['dev']}", flush=True)
    if args.profile:
        bench["profiles"] = profile(args, data, env)
    metrics = ["precision", "recall", "f1", "accuracy"] if args.task == "ner" else ["exact_match", "f1"]
    bench["summary"] = summarise(bench, metrics, 100)
    (out / "bench.json").write_text(json.dumps(bench, indent=2, default=float))
    text = report(args, bench)
    (out / "bench.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
