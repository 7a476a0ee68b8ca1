"""Model behaviour: padding invariance, heads, losses, save/load, errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers import ENCODINGS, hf_config, padded_batch, tiny_config
from torch.testing import assert_close

import roformer
from roformer.data import masking
from roformer.errors import CheckpointError
from roformer.model.config import encoding_of, position_fields, relative_encodings
from roformer.model.masks import KVCache
from roformer.model.model import IGNORE_INDEX
from roformer.model.positions import attention_positions, embedding_positions


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_padding_invariance(encoding: str) -> None:
    """Appending padding (with any ids) changes nothing at the real positions."""
    model = roformer.MaskedLM(tiny_config(position_encoding=encoding)).eval()
    ids = torch.randint(1, 101, (2, 12))
    types = torch.randint(0, 2, (2, 12))
    padded_ids = torch.cat([ids, torch.randint(0, 101, (2, 7))], dim=1)
    padded_types = torch.cat([types, torch.zeros(2, 7, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(2, 12), torch.zeros(2, 7)], dim=1).long()
    with torch.no_grad():
        plain = model(ids, token_type_ids=types).logits
        padded = model(padded_ids, attention_mask=mask, token_type_ids=padded_types).logits
    assert_close(padded[:, :12], plain)


def test_position_encodings_differ_and_none_is_permutation_equivariant() -> None:
    ids = torch.randint(1, 101, (1, 10))
    perm = torch.randperm(10)
    for encoding in ENCODINGS:
        torch.manual_seed(0)
        model = roformer.Backbone(tiny_config(position_encoding=encoding)).eval()
        with torch.no_grad():
            out, shuffled = model(ids).logits, model(ids[:, perm]).logits
        equivariant = torch.allclose(out[:, perm], shuffled, atol=1e-5)
        assert equivariant == (encoding == "none"), encoding


def test_ignore_index_is_the_data_pipelines() -> None:
    """The model keeps its own copy (it must not import roformer.data); both are HF's -100."""
    assert IGNORE_INDEX == masking.IGNORE_INDEX == -100


def test_masked_only_equals_full_logits_at_masked_positions() -> None:
    model = roformer.MaskedLM(tiny_config()).eval()
    batch = padded_batch()
    labels = batch["input_ids"].masked_fill(torch.rand(batch["input_ids"].shape) > 0.3, IGNORE_INDEX)
    with torch.no_grad():
        full = model(**batch, labels=labels)
        sparse = model(**batch, labels=labels, masked_only=True)
    assert_close(sparse.logits, full.logits[labels != IGNORE_INDEX])
    assert_close(sparse.loss, full.loss)
    with pytest.raises(ValueError, match="needs labels"):
        model(**batch, masked_only=True)


def test_heads_and_losses() -> None:
    batch = padded_batch()
    reg = roformer.SequenceClassifier(tiny_config(num_labels=1)).eval()
    target = torch.tensor([0.5, 2.0, -1.0])
    out = reg(**batch, labels=target)
    assert out.logits.shape == (3, 1)
    assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), target))
    cls = roformer.SequenceClassifier(tiny_config(num_labels=3)).eval()
    labels = torch.tensor([2, 0, 1])
    out = cls(**batch, labels=labels)
    assert_close(out.loss, F.cross_entropy(out.logits, labels))
    multi = cls(**batch, labels=torch.tensor([[1.0, 0, 1], [0, 0, 1], [1, 1, 0]]))
    assert multi.loss is not None and multi.loss.ndim == 0
    # one default head for every position encoding (a comparison fine-tunes the same head); the pooler on request
    for encoding in ENCODINGS:
        model = roformer.SequenceClassifier(tiny_config(position_encoding=encoding))
        assert model.config.classifier_head == "mlp" and model.backbone.pooler is None and model.dense is not None
    bert = roformer.SequenceClassifier(tiny_config(position_encoding="learned", classifier_head="pooler"))
    assert bert.backbone.pooler is not None and bert.dense is None


def test_same_seed_gives_every_position_encoding_the_same_shared_weights() -> None:
    """A parameter of one encoding only (the learned table, the sinusoidal scale, Shaw's embeddings, T5's bias) must
    not shift the draws of any other parameter."""
    states = {}
    for encoding in ENCODINGS:
        torch.manual_seed(0)
        fields = {"shaw_values": True} if encoding == "shaw" else {}
        states[encoding] = roformer.MaskedLM(tiny_config(position_encoding=encoding, **fields)).state_dict()
    reference = states["rotary"]  # a rotary model has no parameter of its positions
    for encoding, state in states.items():
        backbone = roformer.Backbone(tiny_config(position_encoding=encoding))  # where its encoding's weights are
        own = [f"backbone.{name}." for name in (backbone.positions_attribute,) if name]
        own += [f"backbone.embeddings.{name}." for name in (backbone.embeddings.positions_attribute,) if name]
        shared = set(reference) & set(state)
        assert all(name.startswith(tuple(own)) for name in set(reference) ^ set(state)), encoding
        for name in shared:
            torch.testing.assert_close(state[name], reference[name], rtol=0, atol=0, msg=f"{encoding}: {name}")
    assert "backbone.embeddings.position.weight" in states["learned"]
    torch.manual_seed(1)  # another seed, other weights
    other = roformer.MaskedLM(tiny_config()).state_dict()["backbone.embeddings.word.weight"]
    assert not torch.equal(other, reference["backbone.embeddings.word.weight"])


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_encoding_keeps_its_checkpoint_name(encoding: str) -> None:
    """`attention_positions` / `embedding_positions` build it as declared, the backbone (or its embeddings) registers
    it under the name its saved keys have always had (a new encoding: the name its module gives)."""
    config = tiny_config(position_encoding=encoding)
    backbone, spec = roformer.Backbone(config), encoding_of(encoding)
    kept = {"rotary": "rotary", "t5_bias": "relative_bias", "alibi": "relative_bias", "shaw": "shaw"}
    inside = attention_positions(config)
    expected = kept.get(encoding, None if inside is None else inside.attribute)
    assert (inside is not None) == (spec.acts == "attention") and (expected is None) == (spec.acts != "attention")
    children = {name for name, _ in backbone.named_children()}
    assert children - {"embeddings", "layers"} == ({expected} if expected else set())
    if expected is None:
        assert backbone.positions is None
    else:
        assert backbone.positions is getattr(backbone, expected) and backbone.positions.attribute == expected
        # the module keeps its declaration: the kernel the plan reads, and whether it adds to the logits
        assert (backbone.positions.kernel, backbone.positions.adds_to_logits) == (spec.kernel, spec.adds_to_logits)
    on_embeddings = embedding_positions(config)
    absolute = {"learned": "position", "sinusoidal": "sinusoidal"}
    assert (on_embeddings is not None) == (spec.acts == "embeddings")
    if on_embeddings is not None:
        name = absolute.get(encoding, on_embeddings.attribute)
        assert backbone.embeddings.positions is getattr(backbone.embeddings, name)
    else:
        assert backbone.embeddings.positions is None


def test_position_fields_are_those_the_experiments_compared() -> None:
    """The fields marked as the position encoding: the set roformer.study.experiment named by hand before them."""
    before = {
        "position_encoding",
        "rotary_base",
        "rotary_layout",
        "rotary_value",
        "sinusoidal_scale",
        "sinusoidal_scale_learned",
        "max_position_embeddings",
        "rotary_dim",
        "rope_scaling",
        "relative_max_distance",
        "relative_num_buckets",
        "shaw_values",
        "shaw_shared_layers",
    }
    added = {"alibi_form", "attention_log_scale"}  # the length-generalization options (issue 55)
    added |= {"position_settings"}  # the settings an encoding declares as its own (issue 64)
    fields = position_fields()
    assert set(fields) == before | added and len(fields) == len(before | added)
    declared = [f.name for f in dataclasses.fields(roformer.ModelConfig)]
    assert list(fields) == sorted(fields, key=declared.index)  # a stable order: the config's own


def test_every_head_opens_with_the_backbone_and_its_pooler() -> None:
    """`run_backbone`: the hidden states and the pooler's output every head starts from; no pooling with a cache."""
    torch.manual_seed(0)
    model = roformer.TokenClassifier(tiny_config(add_pooler=True)).eval()
    batch = padded_batch()
    with torch.no_grad():
        x, hidden, pooled = model.run_backbone(**batch, output_hidden_states=True)
        out = model.backbone(**batch, output_hidden_states=True)
    assert torch.equal(x, out.logits) and torch.equal(pooled, out.pooled) and len(hidden) == 3
    assert torch.equal(model(**batch).pooled, pooled)
    decoder = roformer.CausalLM(tiny_config(add_pooler=True)).eval()
    with torch.no_grad():
        assert decoder.run_backbone(batch["input_ids"], cache=KVCache())[2] is None


def test_hidden_states_and_backbone_output() -> None:
    model = roformer.MaskedLM(tiny_config(num_layers=3))
    out = model(**padded_batch(), output_hidden_states=True)
    assert len(out.hidden_states) == 4 and out.hidden_states[-1].shape == (3, 19, 32)
    assert model(**padded_batch()).hidden_states is None


def test_tied_decoder_and_init() -> None:
    model = roformer.MaskedLM(tiny_config())
    assert model.decoder_weight is model.backbone.embeddings.word.weight
    assert model.backbone.embeddings.word.weight[0].abs().sum() == 0  # padding row
    std = model.backbone.layers[0].ffn_in.weight.std().item()
    assert 0.015 < std < 0.025
    untied = roformer.MaskedLM(tiny_config(tie_word_embeddings=False))
    assert untied.decoder_weight is not untied.backbone.embeddings.word.weight


def test_learned_positions_beyond_table_fail_clearly() -> None:
    model = roformer.Backbone(tiny_config(position_encoding="learned", max_position_embeddings=16))
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=16"):
        model(torch.ones(1, 17, dtype=torch.long))
    assert tiny_config(position_encoding="learned", max_position_embeddings=16).position_limit == 16
    for encoding in [e for e in ENCODINGS if not encoding_of(e).limited]:  # no length limit
        config = tiny_config(position_encoding=encoding, max_position_embeddings=16)
        assert config.position_limit is None and config.holds_positions(10**6)
        model = roformer.Backbone(config)
        assert model(torch.ones(1, 300, dtype=torch.long)).logits.shape == (1, 300, 32)


def test_bf16_forward_keeps_dtype() -> None:
    model = roformer.MaskedLM(tiny_config()).to(torch.bfloat16)
    out = model(**padded_batch())
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.logits).all()


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_save_load_round_trip_is_exact(encoding: str, tmp_path) -> None:
    model = roformer.MaskedLM(
        tiny_config(position_encoding=encoding, sinusoidal_scale_learned=encoding == "sinusoidal")
    )
    model.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "model.yaml"]
    loaded = roformer.load(tmp_path)
    assert type(loaded) is roformer.MaskedLM and loaded.config == model.config
    for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b)
    batch = padded_batch()
    assert torch.equal(model.eval()(**batch).logits, loaded(**batch).logits)


def test_load_as_another_architecture(tmp_path) -> None:
    mlm = roformer.MaskedLM(tiny_config(position_encoding="learned"))
    mlm.save(tmp_path)
    cls = roformer.load(tmp_path, architecture="sequence_classification", num_labels=5, classifier_head="pooler")
    assert isinstance(cls, roformer.SequenceClassifier) and cls.out.out_features == 5
    assert torch.equal(cls.backbone.layers[1].ffn_in.weight, mlm.backbone.layers[1].ffn_in.weight)
    assert cls.backbone.pooler is not None  # BERT head: pooler freshly initialised
    backbone = roformer.load(tmp_path, architecture="backbone")
    assert torch.equal(backbone.embeddings.word.weight, mlm.backbone.embeddings.word.weight)


def test_load_errors(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        roformer.load(tmp_path / "nope")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="from_hf"):
        roformer.load(tmp_path / "hf")
    model = roformer.MaskedLM(tiny_config())
    model.save(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupt"):
        roformer.load(tmp_path / "m")
    weights.unlink()
    with pytest.raises(CheckpointError, match="weights file not found"):
        roformer.load(tmp_path / "m")
    model.save(tmp_path / "m2")
    cfg = tmp_path / "m2" / "model.yaml"
    cfg.write_text(cfg.read_text().replace("hidden_size: 32", "hidden_size: 64"))
    with pytest.raises(CheckpointError, match="shape mismatch"):
        roformer.load(tmp_path / "m2")
    cfg.write_text(cfg.read_text().replace("hidden_size: 64", "hiden_size: 32"))
    with pytest.raises(CheckpointError, match="unknown key 'config.hiden_size'"):
        roformer.load(tmp_path / "m2")
    with pytest.raises(roformer.ConfigError, match="unknown ModelConfig field 'nope'"):
        roformer.load(tmp_path / "m", nope=1)


def test_a_flipped_byte_in_a_saved_model_is_caught_by_its_checksum(tmp_path) -> None:
    """safetensors loads a flipped byte inside the tensor data without a word: model.yaml records the sha256."""
    import yaml

    roformer.MaskedLM(tiny_config()).save(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 1  # inside the last tensor
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors does not match its checksum in model.yaml"):
        roformer.load(tmp_path)
    meta = yaml.safe_load((tmp_path / "model.yaml").read_text())
    del meta["weights"]  # a directory saved before model.yaml recorded it (or the user's explicit choice) loads
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(meta))
    assert roformer.load(tmp_path).config == roformer.MaskedLM(tiny_config()).config


@pytest.mark.parametrize("version, message", [(99, "model format 99, this roformer reads format 1"), ("x", "positive")])
def test_a_model_of_a_newer_format_is_refused_in_one_line(
    tmp_path, capsys: pytest.CaptureFixture, version: object, message: str
) -> None:
    """model.yaml's format_version is read: a later roformer's directory is refused, not misread."""
    import yaml

    from roformer.cli import main

    roformer.MaskedLM(tiny_config()).save(tmp_path)
    meta = yaml.safe_load((tmp_path / "model.yaml").read_text())
    assert meta["format_version"] == 1
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({**meta, "format_version": version}))
    with pytest.raises(CheckpointError, match=message):
        roformer.load(tmp_path)
    assert main(["convert", "--to-hf", str(tmp_path), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err and not (tmp_path / "hf").exists()
    del meta["format_version"]  # written before the field existed: format 1
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(meta))
    assert roformer.load(tmp_path).config == roformer.MaskedLM(tiny_config()).config


def test_state_dict_names_are_readable() -> None:
    keys = set(roformer.MaskedLM(tiny_config(embedding_size=16)).state_dict())
    assert "backbone.layers.0.attn.qkv.weight" in keys and "backbone.embeddings.project.weight" in keys
    assert not any("LayerNorm" in k for k in keys)


@pytest.mark.parametrize(
    "fields",
    [{"position_encoding": encoding} for encoding in ENCODINGS]
    + [
        {"position_encoding": "rotary", "rotary_dim": 8, "rotary_value": True},
        {"position_encoding": "rotary", "attention": "linear"},
        {"position_encoding": "shaw", "shaw_values": True, "relative_max_distance": 6},
    ],
)
def test_position_ids_make_a_left_padded_row_equal_itself_unpadded(fields: dict) -> None:
    """Left padding shifts every token's index; position_ids (cumsum of the mask - 1) give them back their positions."""
    config = tiny_config(vocab_size=50, num_heads=2, max_position_embeddings=32, **fields)
    torch.manual_seed(0)
    model = roformer.MaskedLM(config).eval()
    ids = torch.randint(5, 50, (1, 9))
    pad = 4
    padded = torch.cat([torch.zeros(1, pad, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones_like(ids)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = model(ids).logits
        left = model(padded, attention_mask=mask, position_ids=positions).logits[:, pad:]
        shifted = model(padded, attention_mask=mask).logits[:, pad:]
        default = model(ids, position_ids=torch.arange(9)[None]).logits
    torch.testing.assert_close(left, alone)
    torch.testing.assert_close(default, alone, rtol=0, atol=0)
    # RoPE scores depend on m - n only (paper eq. 16): a shift by the padding changes nothing unless v is rotated
    # too or the positions are absolute; there position_ids are needed
    spec = encoding_of(fields["position_encoding"])
    relative_only = spec.name in relative_encodings() and not fields.get("rotary_value")
    if relative_only or spec.acts == "nothing":
        assert torch.allclose(shifted, alone, atol=1e-5)
    if spec.acts == "embeddings" or fields.get("rotary_value"):
        assert not torch.allclose(shifted, alone, atol=1e-5)


def test_position_ids_equal_hf_bert_position_ids() -> None:
    import transformers

    config = hf_config("bert", vocab_size=50, num_attention_heads=2, intermediate_size=48, max_position_embeddings=32)
    hf = transformers.BertModel(config).eval()
    ours = roformer.from_hf(hf)
    ids = torch.randint(1, 50, (2, 11))
    positions = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3]])  # packed docs
    with torch.no_grad():
        expected = hf(ids, position_ids=positions).last_hidden_state
        got = ours(ids, position_ids=positions).logits
    torch.testing.assert_close(got, expected)
