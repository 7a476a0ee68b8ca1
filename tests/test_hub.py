"""`roformer push`: the exact folder and card that would be uploaded (--dry-run), and its one-line errors offline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from test_pretrain import tiny_run_config

import roformer
from roformer.cli import main
from roformer.config import load, write_yaml
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
