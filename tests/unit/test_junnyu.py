"""RoFormer-Sim, RoFormerV2 and the pooler against JunnYu's port (`roformer==0.4.3`, the one the hub model cards use).

transformers cannot run these models, so the reference is the port itself, run once in its own environment by
`scripts/references/junnyu_goldens.py`: tiny random models, their files as the port saves them, inputs and outputs
(tests/golden/junnyu/README.md). Here the files go through our importer, as a real download would.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from helpers import REPO
from safetensors.torch import load_file
from torch.testing import assert_close

import roformer
from roformer.cli import main
from roformer.model.model import Backbone, CausalLM, MaskedLM

GOLDEN = REPO / "tests" / "golden" / "junnyu"


def golden(name: str) -> tuple[Path, dict[str, torch.Tensor]]:
    return GOLDEN / name, load_file(GOLDEN / name / "io.safetensors")


def inputs(io: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: io[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


def run(model, io: dict[str, torch.Tensor]):
    with torch.no_grad():
        return model(**inputs(io), output_hidden_states=True)


@pytest.mark.parametrize("activation", ["tanh", "linear"])
def test_v1_with_pooler_equals_the_port(activation: str) -> None:
    path, io = golden(f"v1_model_pooler_{activation}")
    model = roformer.from_hf(path)
    assert isinstance(model, Backbone)
    assert model.config.add_pooler and model.config.pooler_activation == activation
    out = run(model, io)
    assert_close(out.logits, io["last_hidden_state"])
    assert_close(torch.stack(out.hidden_states), io["hidden_states"])
    assert_close(out.pooled, io["pooler_output"])


def test_v2_masked_lm_equals_the_port_and_is_never_read_as_v1(tmp_path: Path) -> None:
    path, io = golden("v2_masked_lm")
    model = roformer.from_hf(path)
    assert isinstance(model, MaskedLM)
    c = model.config
    assert (c.norm_type, c.use_bias, c.mlm_head) == ("rms_norm", False, "bare")
    out = run(model, io)
    assert_close(out.logits, io["logits"])
    assert_close(torch.stack(out.hidden_states), io["hidden_states"])
    # a V2 checkpoint whose config lost norm_type / use_bias: the tensors say V2
    plain = tmp_path / "plain"
    shutil.copytree(path, plain)
    config = json.loads((plain / "config.json").read_text())
    del config["norm_type"], config["use_bias"]
    (plain / "config.json").write_text(json.dumps(config))
    assert_close(run(roformer.from_hf(plain), io).logits, io["logits"])
    # a config that claims V1 over V2 tensors is refused in one line
    config["norm_type"] = "layer_norm"
    (plain / "config.json").write_text(json.dumps(config))
    with pytest.raises(roformer.CheckpointError, match="the weights are without LayerNorm weights"):
        roformer.from_hf(plain)
    # transformers builds V1 from a V2 config (norms and biases freshly initialised): such an instance is refused
    hf_model = transformers.RoFormerForMaskedLM(transformers.RoFormerConfig.from_pretrained(path))
    with pytest.raises(roformer.CheckpointError, match="RoFormerV2 config"):
        roformer.from_hf(hf_model)


def test_roformer_sim_decodes_with_the_unilm_mask_and_generates_as_the_port() -> None:
    path, io = golden("sim_causal_lm")
    model = roformer.from_hf(path)
    assert isinstance(model, CausalLM)
    assert model.config.attention_pattern == "unilm" and model.config.pooler_activation == "linear"
    real = io["attention_mask"].bool()
    out = run(model, io)
    assert_close(out.logits[real], io["unilm_logits"][real])
    assert_close(torch.stack(out.hidden_states)[:, real], io["unilm_hidden_states"][:, real])
    assert_close(out.pooled, io["unilm_pooler_output"])
    generated = model.generate(io["gen_prompt_ids"], max_new_tokens=8)
    assert torch.equal(generated, io["gen_output_ids"])
    # the port's forward without a cache is bidirectional: the same checkpoint read as an encoder gives it
    encoder = roformer.from_hf(path, architecture="masked_lm", attention_pattern="bidirectional")
    out = run(encoder, io)
    assert_close(out.logits, io["logits"])
    assert_close(out.pooled, io["pooler_output"])


def test_electra_style_small_model_equals_the_port() -> None:
    path, io = golden("v1_masked_lm_emb16_rotary_value")
    model = roformer.from_hf(path)
    assert model.config.embedding_size == 16 and model.config.rotary_value
    assert_close(run(model, io).logits, io["logits"])


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()))
def test_published_bin_layout_loads_without_a_missing_or_unexpected_key(name: str, tmp_path: Path) -> None:
    """The hub's files are torch.save'd state dicts with the tied copies in them: the same model must come out."""
    path, io = golden(name)
    keys = json.loads((path / "state_dict_keys.json").read_text())
    state = load_file(path / "model.safetensors")
    for removed, kept in keys["tied_duplicates_removed"].items():
        state[removed] = state[kept]
    full = (
        eval(keys["full_state_dict_keys"])
        if isinstance(keys["full_state_dict_keys"], str)
        else keys["full_state_dict_keys"]
    )
    assert set(state) == set(full) - set(keys["ignored_on_save"]), "the golden files name every published key"
    for key, shape in full.items():
        assert key not in state or list(state[key].shape) == shape
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    torch.save(state, tmp_path / "pytorch_model.bin")
    reference = roformer.from_hf(path)
    model = roformer.from_hf(tmp_path)
    for (k, v), (k2, v2) in zip(model.state_dict().items(), reference.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)


def test_convert_imports_every_family_and_refuses_what_hf_cannot_hold(tmp_path: Path, capsys) -> None:
    for name in sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()):
        path, io = golden(name)
        assert main(["convert", "--from-hf", str(path), "--out", str(tmp_path / name)]) == 0
        loaded = roformer.load(tmp_path / name)
        assert_close(run(loaded, io).logits, run(roformer.from_hf(path), io).logits)
    for name, reason in [
        ("v2_masked_lm", "cannot express norm_type: rms_norm"),
        ("v1_model_pooler_tanh", "has no pooler"),
        ("sim_causal_lm", "no UniLM attention mask"),
    ]:
        capsys.readouterr()
        assert main(["convert", "--to-hf", str(tmp_path / name), "--out", str(tmp_path / f"{name}-hf")]) == 2
        err = capsys.readouterr().err.strip()
        assert reason in err and len(err.splitlines()) == 1
        assert not (tmp_path / f"{name}-hf").exists()
    # the ELECTRA-style model is plain V1: it goes to HF and back unchanged
    path, io = golden("v1_masked_lm_emb16_rotary_value")
    assert main(["convert", "--to-hf", str(tmp_path / path.name), "--out", str(tmp_path / "electra-hf")]) == 0
    hf_model = transformers.RoFormerForMaskedLM.from_pretrained(tmp_path / "electra-hf").eval()
    with torch.no_grad():
        assert_close(hf_model(**inputs(io)).logits, io["logits"])


@pytest.mark.parametrize("architecture", [None, "backbone", "masked_lm", "sequence_classification", "causal_lm"])
def test_the_config_read_without_weights_is_the_loaded_models(architecture: str | None) -> None:
    from roformer.model.hf import hf_model_config

    for name in sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()):
        loaded = roformer.from_hf(GOLDEN / name, architecture=architecture)
        assert hf_model_config(str(GOLDEN / name), architecture) == loaded.config, (name, architecture)


def test_a_masked_lm_read_as_a_causal_lm_keeps_its_vocabulary_head(tmp_path: Path) -> None:
    mlm = roformer.from_hf(GOLDEN / "v1_masked_lm_emb16_rotary_value", architecture="masked_lm")
    mlm.save(tmp_path / "mlm")
    lm = roformer.load(tmp_path / "mlm", architecture="causal_lm")
    assert isinstance(lm, CausalLM)
    for key, value in mlm.state_dict().items():
        assert torch.equal(lm.state_dict()[key], value), key
