"""What the test modules share: the repository's paths, the one tiny model, tiny pretraining runs and their launchers,
two-process launches, fine-tuning configs and tiny random HF models.

Imported as `from helpers import ...` from tests/unit/ and tests/e2e/ alike: tests/conftest.py puts tests/ on
sys.path (pytest's default `prepend` import mode). Fixtures are in tests/conftest.py, not here.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import roformer
from roformer.model.config import encodings

REPO = Path(__file__).resolve().parents[1]
# the real data: ROFORMER_SHARED_DATA, else the data root the shipped configs read (ROFORMER_DATA), else ../shared/data
SHARED_DATA = Path(
    os.environ.get("ROFORMER_SHARED_DATA") or os.environ.get("ROFORMER_DATA") or REPO.parent / "shared" / "data"
)

# --- the tiny model ------------------------------------------------------------------------------------------------

TINY = dict(
    vocab_size=101,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    intermediate_size=48,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    max_position_embeddings=64,
)
VOCAB = TINY["vocab_size"]


def tiny_config(**overrides: Any) -> roformer.ModelConfig:
    """A 2-layer model that runs in milliseconds: TINY, with `overrides` on top."""
    return roformer.ModelConfig(**{**TINY, **overrides})


# the model section of a tiny pretraining run: the tiny model with 2 heads, a feed-forward width of 64 and the
# vocabulary size of TINY_DATA's tokenizer
TINY_MODEL = {**TINY, "vocab_size": 300, "num_heads": 2, "intermediate_size": 64}
TINY_DATA = dict(builtin_documents=300, vocab_size=300, max_seq_len=32, validation_fraction=0.05)


def padded_batch(vocab_size: int = VOCAB, batch: int = 3, length: int = 19, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids with right padding of different lengths and two token types."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row, keep in enumerate(range(length, 0, -max(1, length // batch))):
        if row < batch:
            mask[row, keep:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    types = torch.zeros_like(ids)
    types[:, length // 2 :] = 1
    types = types * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def assert_checkpointing_changes_nothing(build: Callable[[], roformer.Model], batch: dict) -> roformer.Model:
    """Activation checkpointing off and on from the same weights and dropout masks: the same loss, exactly, and the
    same gradients. Returns the second model."""
    results = []
    for on in (False, True):
        torch.manual_seed(0)
        model = build().train()
        model.set_gradient_checkpointing(on)
        torch.manual_seed(1)  # the same dropout masks
        loss = model(**batch).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_off, grads_off), (loss_on, grads_on) = results
    assert torch.equal(loss_off, loss_on)
    for name, grad in grads_off.items():
        torch.testing.assert_close(grads_on[name], grad, msg=name)
    return model


# Every declared position encoding (roformer.model.config.encodings: one module each), and those that add to the
# attention logits (a bias folded into the mask, or Shaw's terms of each layer): linear attention refuses them, HF has
# none of them.
ENCODINGS = tuple(encodings())
BIASED = tuple(name for name, spec in encodings().items() if spec.adds_to_logits)


def short_range(encoding: str, **fields) -> roformer.ModelConfig:
    """A tiny model whose relative encoding saturates within a test (Shaw clips at 5, T5 at 5 of 8 buckets)."""
    if encoding in ("shaw", "t5_bias"):
        fields.setdefault("relative_max_distance", 5)
    if encoding == "t5_bias":
        fields.setdefault("relative_num_buckets", 8)
    return tiny_config(position_encoding=encoding, **fields)


# --- the tiny model in transformers ---------------------------------------------------------------------------------

# our ModelConfig field -> transformers' RoFormerConfig / BertConfig field
HF_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
}


def hf_config(family: str, **kw: Any):
    """The tiny model (intermediate_size 37) as a transformers RoFormerConfig or BertConfig: 2 token types, 3 labels;
    `kw` in transformers' field names on top."""
    import transformers

    tiny = {**TINY, "intermediate_size": 37}
    fields = {hf: tiny[ours] for ours, hf in HF_FIELDS.items()}
    cls = transformers.RoFormerConfig if family == "roformer" else transformers.BertConfig
    return cls(**{**fields, "type_vocab_size": 2, "num_labels": 3, **kw})


# name -> (transformers class, hf_config overrides): the tiny HF models the parity tests convert both ways
HF_CASES = {
    "roformer-model": ("RoFormerModel", {}),
    "roformer-mlm": ("RoFormerForMaskedLM", {}),
    "roformer-cls": ("RoFormerForSequenceClassification", {}),
    "roformer-mlm-emb16-rotv": ("RoFormerForMaskedLM", {"embedding_size": 16, "rotary_value": True}),
    "roformer-cls-emb16-rotv": ("RoFormerForSequenceClassification", {"embedding_size": 16, "rotary_value": True}),
    "roformer-regression": ("RoFormerForSequenceClassification", {"num_labels": 1}),
    "bert-model": ("BertModel", {}),
    "bert-mlm": ("BertForMaskedLM", {}),
    "bert-cls": ("BertForSequenceClassification", {}),
    "bert-mlm-gelu_new": ("BertForMaskedLM", {"hidden_act": "gelu_new"}),
}


def randomised(model):
    """HF inits biases and LayerNorms to constants: randomise every weight so that a mix-up would show."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:  # the fixed sinusoidal table of HF RoFormer
                p.add_(torch.randn_like(p) * 0.02)
    return model


def hf_output(hf_model, batch) -> torch.Tensor:
    """A transformers model's logits (its last hidden state for a bare encoder), without gradients."""
    with torch.no_grad():
        out = hf_model(**batch)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def our_output(model, batch) -> torch.Tensor:
    """Our model's logits (a bare Model's are its last hidden state), without gradients."""
    with torch.no_grad():
        return model(**batch).logits


def make_hf(name: str, seed: int = 0):
    """The HF_CASES model `name`, randomised from `seed`, in eval mode."""
    import transformers

    cls, overrides = HF_CASES[name]
    config = hf_config(name.split("-")[0], **overrides)
    torch.manual_seed(seed)
    return randomised(getattr(transformers, cls)(config).eval())


def paper_rotation_matrix(d: int, m: int, base: float = 10000.0) -> torch.Tensor:
    """R^d_{Theta,m} of paper eq. 15: block-diagonal 2x2 rotations by m * theta_i, theta_i = base^(-2(i-1)/d)."""
    R = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        theta = base ** (-2.0 * i / d)
        c, s = math.cos(m * theta), math.sin(m * theta)
        R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    return R


# --- tiny pretraining runs -------------------------------------------------------------------------------------------


def tiny_run_config(path: Path, model: dict | None = None, data: dict | None = None, **train) -> Path:
    """Write a tiny pretraining YAML (TINY_MODEL, TINY_DATA, 8 steps) to `path` and return it."""
    config = {
        "model": {**TINY_MODEL, **(model or {})},
        "data": {**TINY_DATA, **(data or {})},
        "train": {
            "max_steps": 8,
            "log_every": 1,
            "eval_every": 4,
            "save_every": 4,
            "batch_size": 4,
            "lr": 1e-3,
            "progress": False,
            **train,
        },
    }
    roformer.config_yaml.write_yaml(path, config)
    return path


def train_losses(run: Path) -> list[tuple[int, float]]:
    """(step, loss) of every train event in the run's metrics.jsonl."""
    from roformer.train.run_dir import read_metrics

    return [(e["step"], e["loss"]) for e in read_metrics(run / "metrics.jsonl") if e["event"] == "train"]


def interrupted_run(config, out: Path, crash_step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the PretrainConfig `config` into `out` and kill it (KeyboardInterrupt) when it reaches `crash_step`."""
    from roformer.train.engine import Engine
    from roformer.train.pretrain import pretrain

    original = Engine.train_step

    def crash(self, task, step):
        if step == crash_step:
            raise KeyboardInterrupt
        return original(self, task, step)

    with monkeypatch.context() as patch:
        patch.setattr(Engine, "train_step", crash)
        with pytest.raises(KeyboardInterrupt):
            pretrain(config, out)


def run_python(args: list[str]) -> subprocess.CompletedProcess:
    """Run `python ARGS` with the repository importable; returns the finished process (text output)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


def accelerate_launch(program: list[str], launcher: str = "multi-cpu", *options: str) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file configs/accelerate/LAUNCHER.yaml OPTIONS PROGRAM` (e.g. `-m roformer ...`).

    The group meets on a free port (accelerate's default, 29500, would be shared by tests running at once: `-n auto`).
    """
    config = str(REPO / "configs" / "accelerate" / f"{launcher}.yaml")
    port = ["--main_process_port", str(free_port())]
    return run_python(["-m", "accelerate.commands.launch", "--config_file", config, *port, *options, *program])


def run_cli(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """`roformer pretrain ARGS` in this process: (exit code, stderr)."""
    from roformer.cli import main

    code = main(["pretrain", *args])
    return code, capsys.readouterr().err


def finished_run(tmp_path: Path, capsys: pytest.CaptureFixture, save_every: int = 1) -> tuple[Path, Path]:
    """(config, run directory) of a finished 2-step tiny run with checkpoints every `save_every` steps."""
    yaml = tiny_run_config(tmp_path / "c.yaml", max_steps=2, save_every=save_every)
    run = tmp_path / "run"
    assert run_cli(["--config", str(yaml), "--output-dir", str(run)], capsys)[0] == 0
    return yaml, run


# --- two processes ---------------------------------------------------------------------------------------------------

WRAPPER_TAIL = "from roformer.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two(wrapper: Path, args: list[str], env: dict[str, str] | None = None, timeout: float = 180) -> list:
    """Run `python WRAPPER ARGS` as ranks 0 and 1 of one gloo group; returns (exit code, stderr) per rank.

    A rank still running at `timeout` (waiting in a collective) fails the test.
    """
    return launch_processes(2, wrapper, args, env, timeout)


def launch_processes(
    count: int, wrapper: Path, args: list[str], env: dict[str, str] | None = None, timeout: float = 180
) -> list:
    """Run `python WRAPPER ARGS` as ranks 0 to count - 1 of one gloo group (one process: no group at all); returns
    (exit code, stderr) per rank. A rank still running at `timeout` (waiting in a collective) fails the test."""
    port = str(free_port())
    processes = []
    for rank in range(count):
        rank_env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
        if count > 1:
            rank_env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(count), RANK=str(rank),
                            LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(count))  # fmt: skip
        command = [sys.executable, str(wrapper), *args]
        processes.append(subprocess.Popen(command, env=rank_env, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for process in processes:
            _, err = process.communicate(timeout=timeout)
            results.append((process.returncode, err))
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
        pytest.fail(f"a rank was still waiting after {timeout} s (a collective nobody else reached)")
    return results


def write_wrapper(path: Path, patch: str) -> Path:
    """A script for launch_two: RANK, then `patch` (what to break, and on which rank), then `roformer ARGS`."""
    path.write_text("import os, sys\nRANK = int(os.environ.get('RANK', '0'))\n" + patch + "\n" + WRAPPER_TAIL)
    return path


def stop_after(path: Path, step: int) -> Path:
    """A wrapper (write_wrapper) whose main process sends itself SIGTERM after optimizer step `step` (1-based), as a
    scheduler would: every process finishes that step, writes one checkpoint and exits 75."""
    return write_wrapper(
        path,
        "import signal\n"
        "from roformer.train.engine import Engine\n"
        "original = Engine.train_step\n"
        "def train_step(self, recipe, index):\n"
        "    result = original(self, recipe, index)\n"
        f"    if index + 1 == {step} and RANK == 0:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return result\n"
        "Engine.train_step = train_step\n",
    )


def last_line(err: str) -> str:
    """The last `roformer ...` line of a process's stderr (or its end, if it has none)."""
    lines = [line for line in err.strip().splitlines() if line.startswith("roformer ")]
    return lines[-1] if lines else err.strip()[-500:]


# --- fine-tuning -----------------------------------------------------------------------------------------------------


def task_config(path: Path, init: Path, files: dict[str, Path], model: dict | None = None, **train) -> Path:
    """Write a fine-tuning YAML (sst2 from the CSV `files`: train, dev, test; seeds 0 and 1) starting from `init`."""
    config = {
        "model": model or {},
        "init": str(init),
        "data": {
            "task": "sst2",
            "source": "files",
            "train_file": str(files["train"]),
            "validation_file": str(files["dev"]),
            "test_file": str(files["test"]),
            "max_length": 64,
        },
        "train": {
            "epochs": 3,
            "batch_size": 16,
            "lr": 1e-3,
            "seeds": [0, 1],
            "progress": False,
            "log_every": 5,
            **train,
        },
    }
    roformer.config_yaml.write_yaml(path, config)
    return path


# --- a retrieval set -----------------------------------------------------------------------------------------------


def small_beir(folder: Path, documents: int = 60, seed: int = 0) -> Path:
    """A BEIR folder of built-in documents: each query is four consecutive words of its one relevant document.

    Splits: train (2 queries a document for the first 40, each with a judged non-relevant document), dev (one query a
    document for the last 20) and test (10 of those documents again, other words); ids `d0..`, `q0..`.
    """
    import json
    import random

    from roformer.data.builtin import generate_documents

    rng = random.Random(seed)
    texts = [" ".join(d.split()[:30]) for d in generate_documents(documents, seed=seed)]
    corpus = [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(texts)]
    queries, qrels = [], {"train": [], "dev": [], "test": []}

    def ask(split: str, doc: int, negative: int | None = None) -> None:
        words = texts[doc].split()
        start = rng.randrange(max(1, len(words) - 4))
        query = f"q{len(queries)}"
        queries.append({"_id": query, "text": " ".join(words[start : start + 4])})
        qrels[split].append((query, f"d{doc}", 1))
        if negative is not None:
            qrels[split].append((query, f"d{negative}", 0))

    for doc in range(40):
        ask("train", doc, negative=(doc + 1) % 40)
        ask("train", doc)
    for doc in range(40, documents):
        ask("dev", doc)
    for doc in range(40, 50):
        ask("test", doc)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    for name, records in (("corpus", corpus), ("queries", queries)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for split, rows in qrels.items():
        lines = "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows)
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + lines)
    return folder


def stop_in_process(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """SIGTERM to this process after optimizer step `step` (1-based) of the engine."""
    import signal

    from roformer.train.engine import Engine

    original = Engine.train_step

    def train_step(self, recipe, index):  # noqa: ANN001, ANN202
        result = original(self, recipe, index)
        if index + 1 == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(Engine, "train_step", train_step)
