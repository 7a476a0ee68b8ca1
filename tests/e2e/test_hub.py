"""`roformer push`: the exact folder and card that would be uploaded (--dry-run), and its one-line errors offline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import task_config, tiny_config, tiny_run_config

import roformer
from roformer.cli import main
from roformer.config import load
from roformer.config_yaml import write_yaml
from roformer.train.config import PretrainConfig
from roformer.train.pretrain import pretrain


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("push")
    return pretrain(load(PretrainConfig, tiny_run_config(tmp / "c.yaml", max_steps=4, save_every=0)), tmp / "run")


def test_dry_run_writes_the_model_an_hf_export_and_a_card_from_the_run(run: Path, tmp_path: Path, capsys) -> None:
    glue = tmp_path / "glue"
    glue.mkdir()
    (glue / "results.md").write_text(
        "| task | split | metric | mean |\n|---|---|---|---:|\n| rte | dev | accuracy | 55.2 |\n"
    )
    out = tmp_path / "upload"
    code = main(["push", str(run / "final"), "--repo-id", "me/tiny", "--dry-run", str(out), "--glue", str(glue)])
    assert code == 0 and "nothing uploaded" in capsys.readouterr().out
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert {"README.md", "model.yaml", "model.safetensors", "hf/config.json", "hf/model.safetensors"} <= files
    card = (out / "README.md").read_text()
    final = [e for e in roformer.train.run_dir.read_metrics(run / "metrics.jsonl") if e["event"] == "eval"][-1]
    assert f"final eval loss (held-out text): {final['eval_loss']:.3f}" in card
    assert "- steps: 4;" in card and "```yaml" in card and "| rte | dev | accuracy | 55.2 |" in card
    assert 'AutoModelForMaskedLM.from_pretrained("me/tiny", subfolder="hf")' in card
    # the hf/ folder is what transformers loads: equal to ours
    import transformers

    ours = roformer.load(out).eval()
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(out / "hf").eval()
    ids = torch.randint(5, ours.config.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours(ids).logits)
    assert main(["push", str(run / "final"), "--repo-id", "me/tiny", "--dry-run", str(out)]) == 2  # no overwrite


def test_a_model_transformers_cannot_express_says_so_and_has_no_hf_folder(tmp_path: Path) -> None:
    roformer.MaskedLM(tiny_config(position_encoding="alibi")).save(tmp_path / "alibi")
    assert main(["push", str(tmp_path / "alibi"), "--repo-id", "me/alibi", "--dry-run", str(tmp_path / "up")]) == 0
    card = (tmp_path / "up" / "README.md").read_text()
    assert "transformers cannot load this model: HF RoFormer and BERT have no alibi" in card
    assert "training details unknown" in card and not (tmp_path / "up" / "hf").exists()


def test_one_line_errors_without_token_unreachable_hub_and_bad_input(run: Path, tmp_path: Path, capsys, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    assert main(["push", str(run / "final"), "--repo-id", "me/tiny"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == ["roformer push: error: no Hugging Face token: run `hf auth login`, set HF_TOKEN or pass --token"]
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert main(["push", str(run / "final"), "--repo-id", "me/tiny", "--token", "hf_fake"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("roformer ")]  # no bars
    assert len(errors) == 1 and "could not upload to the hub" in errors[0], errors
    assert main(["push", str(tmp_path / "missing"), "--repo-id", "me/x", "--dry-run", str(tmp_path / "d")]) == 2
    assert main(["push", str(run / "final"), "--repo-id", "me/x", "--dry-run", str(tmp_path / "e"), "--glue",
                 str(tmp_path)]) == 2  # fmt: skip
    assert "no results.md" in capsys.readouterr().err and not (tmp_path / "e").exists()
    other = tmp_path / "other-glue"  # a suite that fine-tuned another model: its scores are not this model's
    (other / "rte").mkdir(parents=True)
    table = "| task | split | metric | mean |\n|---|---|---|---:|\n| rte | dev | acc | 93.1 |\n"
    (other / "results.md").write_text(table)
    write_yaml(other / "rte" / "config.yaml", {"init": str(tmp_path / "another-model" / "final")})
    assert main(["push", str(run / "final"), "--repo-id", "me/x", "--dry-run", str(tmp_path / "f"), "--glue",
                 str(other)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "rte fine-tuned" in err and "another model's" in err and not (tmp_path / "f").exists()
    write_yaml(other / "rte" / "config.yaml", {"init": str(run / "final")})
    assert main(["push", str(run / "final"), "--repo-id", "me/x", "--dry-run", str(tmp_path / "f"), "--glue",
                 str(other)]) == 0  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# A fine-tuned model's card, a model without a tokenizer, invalid repo ids, a full disk, quiet HTTP logging


@pytest.fixture(scope="module")
def finetuned(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-run grid (seeds 0 and 1) on local files whose selected run is the first: seed 0 is given the best score.

    The dev scores are replaced (seed 0: 81.25%, seed 1: 31.25%) so that the selection does not hang on what 3 steps
    learn. data.max_length is 64, above the pretraining length 32 that caps it.
    """
    import csv

    import roformer.tasks.glue as glue_module
    from roformer.train.config import FinetuneConfig
    from roformer.train.finetune import Finetuner, finetune

    tmp = tmp_path_factory.mktemp("finetuned")
    words = "duo tri tet pen hex sep okt non dek elf pane gadi tupo nimu nogi".split()
    files = {}
    for split, n in (("train", 40), ("dev", 11), ("test", 7)):
        files[split] = tmp / f"{split}.csv"
        with files[split].open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"] if split != "test" else ["idx", "sentence"])
            for i in range(n):  # lengths 2 to 14 words: the two seeds' batches hold different numbers of tokens
                sentence = " ".join(words[(i * 7 + j) % len(words)] for j in range(2 + (i * 5) % 13))
                writer.writerow([sentence, i % 2] if split != "test" else [i, sentence])
    yaml = task_config(tmp / "sst2.yaml", run / "final", files, max_steps=3, seeds=[0, 1], log_every=1, batch_size=8)
    seed = {}
    real_compute, real_run_one = glue_module.compute, Finetuner._run_one

    def run_one(self, lr, s, fold):
        seed["current"] = s
        return real_run_one(self, lr, s, fold)

    def compute(names, predictions, labels):
        score = 0.8125 if seed["current"] == 0 else 0.3125
        return {name: score for name in real_compute(names, predictions, labels)}

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Finetuner, "_run_one", run_one)
        patch.setattr(glue_module, "compute", compute)
        results = finetune(load(FinetuneConfig, yaml), tmp / "ft")
    assert results["selected"]["seed"] == 0 and results["runs"][-1]["seed"] == 1  # the selected run is not the last
    return tmp / "ft"


def local_paths(text: str, *extra: Path) -> list[str]:
    """The local paths (absolute, under the home or working directory, or `extra`) that `text` mentions."""
    import re

    found = re.findall(r"(?:^|[\s'\"(\[=:,])(~?/(?:tmp|root|home|Users|work|var|data|mnt)\b[^\s'\",)\]]*)", text)
    markers = [str(p) for p in (Path.home(), Path.cwd(), *extra) if len(p.parts) > 1]
    return found + [m for m in markers if m in text]


def test_card_of_a_finetuned_model_describes_the_selected_run_and_no_local_path(
    finetuned: Path, tmp_path: Path
) -> None:
    out = tmp_path / "upload"
    assert main(["push", str(finetuned / "best"), "--repo-id", "me/tiny-sst2", "--dry-run", str(out)]) == 0
    card = (out / "README.md").read_text()
    train = [e for e in roformer.train.run_dir.read_metrics(finetuned / "metrics.jsonl") if e["event"] == "train"]
    tokens = {seed: [e for e in train if e["seed"] == seed][-1]["tokens_seen"] for seed in (0, 1)}
    assert tokens[0] != tokens[1]  # else the test could not tell the selected run from the last one
    assert f"- steps: 3; tokens: {tokens[0]:,}" in card, card
    assert "task: sst2" in card and "seed 0" in card and "81.25" in card and "31.25" not in card, card
    assert "max sequence length 32" in card and "max sequence length -" not in card, card  # 64 capped at 32
    assert "init: <local>/final" in card and "<local>/train.csv" in card, card
    # the card loads the classifier with its fine-tuned head, which gives our logits
    assert 'AutoModelForSequenceClassification.from_pretrained("me/tiny-sst2", subfolder="hf")' in card, card
    import transformers

    ours = roformer.load(out).eval()
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(out / "hf").eval()
    ids = torch.randint(5, ours.config.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours(ids).logits)
    for path in (p for p in out.rglob("*") if p.is_file() and p.suffix != ".safetensors"):
        assert not local_paths(path.read_text(encoding="utf-8"), finetuned, tmp_path), path


def test_card_of_a_pretrained_model_shows_data_paths_by_name_only(tmp_path: Path) -> None:
    config = tiny_run_config(tmp_path / "c.yaml", max_steps=1, eval_every=0, save_every=0)
    corpus = tmp_path / "corpus"  # a folder: one document per file
    corpus.mkdir()
    for i in range(20):
        (corpus / f"{i}.txt").write_text(" ".join(f"duo tri tet pen {j} hex sep okt non dek elf" for j in range(i, 40)))
    data = {"source": "text", "paths": [str(corpus)], "validation_fraction": 0.1}
    run = pretrain(load(PretrainConfig, tiny_run_config(config, data=data, max_steps=1, save_every=0)), tmp_path / "r")
    out = tmp_path / "upload"
    assert main(["push", str(run / "final"), "--repo-id", "me/tiny", "--dry-run", str(out)]) == 0
    card = (out / "README.md").read_text()
    assert "- data: <local>/corpus; max sequence length 32" in card and "- steps: 1;" in card, card
    for path in (p for p in out.rglob("*") if p.is_file() and p.suffix != ".safetensors"):
        assert not local_paths(path.read_text(encoding="utf-8"), tmp_path), path


def test_local_paths_in_metadata_files_are_scrubbed_and_any_other_is_refused(run: Path, tmp_path: Path, capsys):
    import json
    import shutil

    model = tmp_path / "model"
    shutil.copytree(run / "final", model)
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    tokenizer_config["name_or_path"] = str(tmp_path / "my-tokenizer")  # what transformers may record
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    out = tmp_path / "upload"
    assert main(["push", str(model), "--repo-id", "me/tiny", "--dry-run", str(out)]) == 0
    for path in (out / "tokenizer_config.json", out / "hf" / "tokenizer_config.json"):
        assert json.loads(path.read_text())["name_or_path"] == "<local>/my-tokenizer", path
    (model / "NOTES.txt").write_text(f"trained from {Path.cwd() / 'runs' / 'x'} on my laptop\n")  # not ours to edit
    capsys.readouterr()
    assert main(["push", str(model), "--repo-id", "me/tiny", "--dry-run", str(tmp_path / "up2")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("roformer ")]  # no bars
    assert len(errors) == 1 and f"NOTES.txt would publish the local path {Path.cwd()}" in errors[0], errors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "upload"]  # nothing of up2 written


def test_a_model_without_tokenizer_is_pushed_with_a_one_line_warning(tmp_path: Path, caplog) -> None:
    roformer.MaskedLM(tiny_config()).save(tmp_path / "bare")
    with caplog.at_level("WARNING", logger="roformer"):
        assert main(["push", str(tmp_path / "bare"), "--repo-id", "me/bare", "--dry-run", str(tmp_path / "up")]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name.startswith("roformer")]
    assert len(warnings) == 1 and "no tokenizer" in warnings[0] and "\n" not in warnings[0], warnings
    assert "no tokenizer" in (tmp_path / "up" / "README.md").read_text()


@pytest.mark.parametrize("repo_id", ["a/b/c", "", "../../etc", "me/x-", "me/a..b"])
def test_invalid_repo_ids_are_refused_before_anything_is_built(
    run: Path, tmp_path: Path, capsys, monkeypatch, repo_id: str
) -> None:
    import huggingface_hub

    import roformer.model.model

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the repo id was checked")

    monkeypatch.setattr(roformer.model.model, "load", no_load)
    assert main(["push", str(run / "final"), "--repo-id", repo_id, "--dry-run", str(tmp_path / "out")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("roformer push: error: --repo-id") and "repository id" in errors[0]
    assert list(tmp_path.iterdir()) == []  # nothing written, no staging left
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", no_load)  # the real push: refused as early
    assert main(["push", str(run / "final"), "--repo-id", repo_id, "--token", "hf_fake"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("roformer push: error: --repo-id"), errors


def fill_the_disk(monkeypatch: pytest.MonkeyPatch, where: str) -> str:
    """Make the write of `where` fail with ENOSPC; returns the name of the file (or folder) that fails."""
    import errno
    import shutil

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "model file":  # the first file copied from the model directory
        monkeypatch.setattr(shutil, "copyfile", full)
        return "model.safetensors"
    if where == "card":
        real_write_text = Path.write_text
        monkeypatch.setattr(
            Path,
            "write_text",
            lambda self, *a, **k: full() if self.name == "README.md" else real_write_text(self, *a, **k),
        )
        return "README.md"
    import transformers

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full)
    return "hf"


@pytest.mark.parametrize("where", ["model file", "card", "hf export"])
def test_a_full_disk_during_dry_run_is_one_line_exit_74_and_keeps_the_existing_folder(
    run: Path, tmp_path: Path, capsys, monkeypatch, where: str
) -> None:
    out = tmp_path / "upload"
    out.mkdir()
    (out / "README.md").write_text("the previous dry run\n")
    name = fill_the_disk(monkeypatch, where)
    argv = ["push", str(run / "final"), "--repo-id", "me/tiny", "--dry-run", str(out), "--overwrite"]
    assert main(argv) == 74
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"roformer push: stopped: cannot write {out} ({name}): "), errors
    assert "No space left on device" in errors[0] and ".tmp" not in errors[0], errors
    assert [p.name for p in tmp_path.iterdir()] == ["upload"] and [p.name for p in out.iterdir()] == ["README.md"]
    assert (out / "README.md").read_text() == "the previous dry run\n"


@pytest.mark.parametrize("where", ["model file", "card", "hf export"])
def test_a_full_disk_before_an_upload_is_one_line_exit_74_and_uploads_nothing(
    run: Path, capsys, monkeypatch, where: str
) -> None:
    import huggingface_hub

    def no_upload(*args, **kwargs):
        raise AssertionError("uploaded after a failed write")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", no_upload)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", no_upload)
    name = fill_the_disk(monkeypatch, where)
    assert main(["push", str(run / "final"), "--repo-id", "me/tiny", "--token", "hf_fake"]) == 74
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("roformer push: stopped: cannot write "), errors
    assert f"/{name}: " in errors[0] and errors[0].endswith("; nothing was uploaded"), errors


def test_push_prints_no_http_request_lines(run: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """The CLI logs at INFO: httpx's and huggingface_hub's per-request INFO lines must not reach stderr."""
    import logging
    import sys

    import huggingface_hub

    uploaded = {}

    def create_repo(self, repo_id, **kwargs):
        logging.getLogger("httpx").info('HTTP Request: POST https://huggingface.co/api/repos/create "HTTP/1.1 200 OK"')
        logging.getLogger("httpcore.http11").info("send_request_headers.started")
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, folder_path, repo_id, **kwargs):
        logging.getLogger("huggingface_hub.utils._http").info("Request abc: POST https://huggingface.co/api/x")
        logging.getLogger("httpx").info('HTTP Request: POST https://huggingface.co/api/commit "HTTP/1.1 200 OK"')
        uploaded.update({p.name: p.read_text() for p in Path(folder_path).glob("*.md")})

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    # what the CLI's logging.basicConfig(level=INFO) does outside pytest (pytest's handlers make it a no-op here)
    handler, root_level = logging.StreamHandler(sys.stderr), logging.root.level
    logging.root.setLevel(logging.INFO)  # setLevel, not an attribute: it clears the loggers' cached levels
    logging.root.addHandler(handler)
    levels = {name: logging.getLogger(name).level for name in ("httpx", "httpcore", "huggingface_hub")}
    try:
        assert main(["push", str(run / "final"), "--repo-id", "me/tiny", "--token", "hf_fake"]) == 0
    finally:
        logging.root.removeHandler(handler)
        logging.root.setLevel(root_level)
    captured = capsys.readouterr()
    assert "uploaded" in captured.out and "https://huggingface.co/me/tiny" in captured.out
    assert "HTTP Request" not in captured.err and "Request abc" not in captured.err, captured.err
    assert "send_request_headers" not in captured.err and "README.md" in uploaded
    assert {name: logging.getLogger(name).level for name in levels} == levels  # restored after the push
