"""The translation type's parts: parallel files, the joint BPE, token batches, checkpoint averaging, the model of a
`model:` section, token-weighted losses and sacreBLEU's metrics (the run itself: tests/e2e/test_translation.py)."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from roformer.config import from_dict
from roformer.data.sampling import token_batches
from roformer.errors import ConfigError, UserError
from roformer.model.search import SearchConfig
from roformer.model.seq2seq import EncoderDecoder
from roformer.tasks.config import PLACEHOLDER_VOCABULARY, FinetuneDataConfig, Vocabulary
from roformer.tasks.mt_metrics import (
    corpus_scores,
    moses_tokenized_lowercase,
    signatures,
    tokenized_lowercase_bleu,
    tokenized_lowercase_signature,
)
from roformer.tasks.parallel import (
    EOS,
    SPECIALS,
    load_translation_tokenizer,
    read_parallel,
    side_file,
    texts_of,
    train_bpe,
)
from roformer.tasks.translation import TranslationConfig, TranslationTask, encoder_decoder_config
from roformer.tasks.translator import DECODING_FILE, PAPER_SEARCH, Decoding
from roformer.train.averaging import average_states, last_points
from roformer.train.finetune_run import _TokenBatchStep
from roformer.train.recipe import ProcessLayout

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "translation" / "multi30k"
ENGLISH = ["A man runs.", "Two dogs play in the snow.", "A woman reads a red book.", "The cat sleeps."]
GERMAN = ["Ein Mann rennt.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein rotes Buch.", "Die Katze schläft."]


def write_pair(folder: Path, prefix: str, source: list[str], target: list[str], gz: bool = False) -> Path:
    """PREFIX.en and PREFIX.de (the German side gzipped when `gz`), one sentence a line."""
    (folder / f"{prefix}.en").write_text("".join(s + "\n" for s in source), encoding="utf-8")
    text = "".join(t + "\n" for t in target).encode("utf-8")
    if gz:
        (folder / f"{prefix}.de.gz").write_bytes(gzip.compress(text))
    else:
        (folder / f"{prefix}.de").write_bytes(text)
    return folder / prefix


# -- reading parallel files ----------------------------------------------------------------------------------------


def test_pairs_are_read_by_line_number_from_plain_or_gzipped_files(tmp_path: Path) -> None:
    prefix = write_pair(tmp_path, "train", ["  A man runs. ", *ENGLISH[1:]], GERMAN, gz=True)
    pairs = read_parallel(prefix, "en", "de")
    assert pairs.sources == ENGLISH and pairs.targets == GERMAN  # surrounding spaces stripped
    assert pairs.lines == [1, 2, 3, 4] and pairs.target_file.endswith("train.de.gz")
    assert side_file(prefix, "en") == tmp_path / "train.en"  # the plain file when there is one
    (tmp_path / "crlf.en").write_bytes(b"One.\r\nTwo.\r\n")
    (tmp_path / "crlf.de").write_bytes(b"Eins.\nZwei.")  # no final newline
    crlf = read_parallel(tmp_path / "crlf", "en", "de")
    assert crlf.sources == ["One.", "Two."] and crlf.targets == ["Eins.", "Zwei."]
    assert read_parallel(prefix, "en", "de").head(2).targets == GERMAN[:2]


@pytest.mark.parametrize(
    ("source", "target", "message"),
    [
        (ENGLISH, GERMAN[:3], r"train.en has 4 lines and .*train.de 3: parallel files pair their sentences"),
        (ENGLISH[:2] + ["   "] + ENGLISH[3:], GERMAN, r"train.en:3: empty line \(in a pair, with .*train.de:3\)"),
        (ENGLISH, GERMAN[:1] + [""] + GERMAN[2:], r"train.de:2: empty line"),
    ],
)
def test_bad_pairs_name_the_file_and_line(tmp_path: Path, source: list[str], target: list[str], message: str) -> None:
    prefix = write_pair(tmp_path, "train", source, target)
    with pytest.raises(UserError, match=message):
        read_parallel(prefix, "en", "de")


def test_empty_training_pairs_may_be_skipped_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    prefix = write_pair(tmp_path, "train", ENGLISH[:2] + [""] + ENGLISH[3:], GERMAN)
    with caplog.at_level("INFO"):
        pairs = read_parallel(prefix, "en", "de", skip_empty=True)
    assert pairs.sources == ENGLISH[:2] + ENGLISH[3:] and pairs.lines == [1, 2, 4]
    assert "1 pairs with an empty side left out" in caplog.text


def test_a_missing_file_and_a_line_that_is_not_utf8_are_named(tmp_path: Path) -> None:
    prefix = write_pair(tmp_path, "train", ENGLISH, GERMAN)
    with pytest.raises(UserError, match=r"train.fr: file not found \(nor train.fr.gz\)"):
        read_parallel(prefix, "en", "fr")
    (tmp_path / "train.de").write_bytes(b"Ein Mann rennt.\nZwei Hunde\n" + b"Eine Frau \xff liest.\nDie.\n")
    with pytest.raises(UserError, match=r"train.de:3: not UTF-8 \(byte 0xff at column 11\)"):
        read_parallel(prefix, "en", "de")
    (tmp_path / "broken.en.gz").write_bytes(b"not gzip")
    (tmp_path / "broken.de").write_text("x\n")
    with pytest.raises(UserError, match=r"broken.en.gz: cannot read"):
        read_parallel(tmp_path / "broken", "en", "de")


def test_a_byte_order_mark_is_not_text_and_every_line_end_ends_a_line(tmp_path: Path) -> None:
    """A Windows editor's mark (it made a perfect hypothesis score 86.3 BLEU), CR LF, and CR alone (classic Mac OS)."""
    (tmp_path / "train.en").write_bytes(b"\xef\xbb\xbf" + "\r".join(ENGLISH).encode("utf-8") + b"\r")
    (tmp_path / "train.de").write_bytes(gzip.compress(b"\xef\xbb\xbf" + "\r\n".join(GERMAN).encode("utf-8")))
    (tmp_path / "train.de").rename(tmp_path / "train.de.gz")
    pairs = read_parallel(tmp_path / "train", "en", "de")
    assert pairs.sources == ENGLISH and pairs.targets == GERMAN and pairs.lines == [1, 2, 3, 4]
    # a mark inside a line is text (U+FEFF, a zero-width no-break space), and so are the other Unicode line breaks
    inside = ["A \ufeffman runs.", "Two\u2028dogs.", "A\x85woman.", "The\x0ccat."]
    (tmp_path / "odd.en").write_bytes("\n".join(inside).encode("utf-8"))
    (tmp_path / "odd.de").write_bytes("\r".join(GERMAN).encode("utf-8"))
    assert read_parallel(tmp_path / "odd", "en", "de").sources == inside
    (tmp_path / "odd.en").write_bytes(b"\xef\xbb\xbfA man.\rTwo \xc3\xa9 \xff dogs.\rA.\rB.\r")
    with pytest.raises(UserError, match=r"odd.en:2: not UTF-8 \(byte 0xff at column 8\)"):  # columns in bytes
        read_parallel(tmp_path / "odd", "en", "de")


@pytest.mark.skipif(not SHARED.is_dir(), reason="Multi30k is not in ../shared/data/translation/multi30k")
def test_multi30k_reads_as_the_issue_describes_it() -> None:
    sizes = {name: len(read_parallel(SHARED / name, "en", "de")) for name in ("train", "val", "test_2016_flickr")}
    assert sizes == {"train": 29000, "val": 1014, "test_2016_flickr": 1000}


# -- the joint BPE -------------------------------------------------------------------------------------------------


def test_the_joint_bpe_is_deterministic_reversible_and_ends_sources_with_eos(tmp_path: Path) -> None:
    pairs = read_parallel(write_pair(tmp_path, "train", ENGLISH * 3, GERMAN * 3), "en", "de")
    tokenizer = train_bpe(texts_of([pairs]), vocab_size=120, min_frequency=1)
    again = train_bpe(texts_of([pairs]), vocab_size=120, min_frequency=1)
    assert tokenizer.get_vocab() == again.get_vocab()  # the same vocabulary on every process and every resume
    assert [tokenizer.convert_ids_to_tokens(i) for i in range(4)] == list(SPECIALS)
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 2, 3)
    for text in ENGLISH + GERMAN + ["Die Frau rennt im Schnee."]:  # a sentence of seen characters
        ids = tokenizer(text)["input_ids"]
        assert ids[-1] == tokenizer.eos_token_id and EOS not in tokenizer.convert_ids_to_tokens(ids[:-1])
        assert tokenizer.decode(ids, skip_special_tokens=True) == text  # exactly: sacreBLEU reads the text
    tokenizer.save_pretrained(tmp_path / "tok")
    loaded = load_translation_tokenizer(tmp_path / "tok")
    assert loaded(GERMAN[2])["input_ids"] == tokenizer(GERMAN[2])["input_ids"] and loaded.eos_token_id == 3


def test_a_tokenizer_json_without_the_specials_is_refused(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "a": 2}, unk_token="[UNK]")).save(str(tmp_path / "t.json"))
    with pytest.raises(UserError, match=r"t.json: the tokenizer has no <pad>, <unk>, <s>, </s>"):
        load_translation_tokenizer(tmp_path / "t.json")
    with pytest.raises(UserError, match=r"nowhere: tokenizer not found"):
        load_translation_tokenizer(tmp_path / "nowhere")


# -- batches by tokens ---------------------------------------------------------------------------------------------


def test_token_batches_hold_every_row_once_within_the_budget() -> None:
    sizes = [5, 9, 3, 12, 7, 7, 2, 16, 4, 8]
    order = sorted(range(len(sizes)), key=sizes.__getitem__)
    batches = token_batches(sizes, order, max_tokens=24)
    assert sorted(r for b in batches for r in b) == list(range(len(sizes)))
    assert [r for b in batches for r in b] == order  # in the given order
    for batch in batches:
        assert len(batch) * max(sizes[r] for r in batch) <= 24
    # each batch is as full as the budget allows: the next row would have broken it
    for batch, following in zip(batches, batches[1:], strict=False):
        assert (len(batch) + 1) * max(sizes[r] for r in [*batch, following[0]]) > 24
    with pytest.raises(ValueError, match="more than max_tokens"):
        token_batches([30], [0], max_tokens=24)


def test_a_token_batch_step_is_the_mean_over_all_its_tokens() -> None:
    """Four batches of different token counts (2 processes x 2 micro-batches): the shares add up to the mean over the
    step's tokens, and each batch's weighted loss is its tokens' sum over the step's mean count."""
    tokens = {0: [1.0, 2.0], 1: [3.0, 4.0, 5.0, 6.0], 2: [7.0], 3: [8.0, 9.0, 10.0]}  # per batch: its token losses
    batches = [[0], [1], [2], [3]]

    def task_loss(model: object, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["losses"].mean()  # a mean over the batch's tokens, as the task's loss is

    def batch_of(rows: list[int]) -> dict[str, torch.Tensor]:
        return {"losses": torch.tensor(tokens[rows[0]])}

    everything = [v for values in tokens.values() for v in values]
    shares = 0.0
    for rank in range(2):
        layout = ProcessLayout(rank, 2, batch_size=1, grad_accum=2, device=torch.device("cpu"))
        step = _TokenBatchStep(batches, batch_of, lambda rows: len(tokens[rows[0]]), lambda rows: 0, [0] * 4,
                               layout, task_loss)  # fmt: skip
        for micro in range(2):
            loss, share = step.loss(None, step.micro(micro))
            index = micro * 2 + rank
            assert loss.item() == pytest.approx(sum(tokens[index]) / (len(everything) / 4))
            shares += share.item()
    assert shares == pytest.approx(sum(everything) / len(everything))


# -- checkpoint averaging ------------------------------------------------------------------------------------------


def test_checkpoint_averaging_is_the_mean_of_the_weights() -> None:
    states = [
        {"w": torch.full((2, 3), float(i)), "b": torch.tensor([i, 2.0 * i]), "n": torch.tensor(int(i))}
        for i in (1.0, 2.0, 6.0)
    ]
    averaged = average_states(states)
    assert torch.equal(averaged["w"], torch.full((2, 3), 3.0)) and torch.equal(averaged["b"], torch.tensor([3.0, 6.0]))
    assert averaged["n"] == 6 and averaged["n"].dtype == torch.int64  # counts are not averaged: the newest
    torch.manual_seed(0)
    halves = [{"x": torch.randn(4, 4, dtype=torch.bfloat16)} for _ in range(5)]
    mean = torch.stack([h["x"].double() for h in halves]).mean(0).to(torch.bfloat16)
    assert torch.equal(average_states(halves)["x"], mean) and average_states(halves)["x"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="different tensors"):
        average_states([{"x": torch.zeros(1)}, {"y": torch.zeros(1)}])
    with pytest.raises(ValueError, match="no state"):
        average_states([])
    assert last_points({200, 400, 600, 800}, 3) == [400, 600, 800] and last_points({5}, 3) == [5]
    assert last_points({1, 2}, 0) == []


# -- the model of a `model:` section -------------------------------------------------------------------------------


def test_the_model_section_is_both_halves_with_the_task_vocabulary() -> None:
    vocabulary = Vocabulary(size=100, pad_token_id=0, bos_token_id=2, eos_token_id=3)
    section = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "decoder": {"num_layers": 3}}
    config = encoder_decoder_config(section, vocabulary)
    assert (config.encoder.num_layers, config.decoder.num_layers) == (2, 3)
    assert config.encoder.vocab_size == config.decoder.vocab_size == 100 and config.share_embeddings
    assert (config.decoder_start_token_id, config.eos_token_id) == (2, 3)
    assert config.decoder.cross_attention and config.decoder.attention_pattern == "causal"
    assert not encoder_decoder_config({**section, "share_embeddings": False}, vocabulary).share_embeddings


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"hidden_sise": 32}, "unknown key 'model.hidden_sise'"),
        ({"encoder": {"num_layerz": 2}}, "unknown key 'model.encoder.num_layerz'"),
        ({"decoder": {"vocab_size": 9}}, "model.decoder.vocab_size comes from the task's vocabulary"),
        ({"eos_token_id": 1}, "model.eos_token_id comes from the task's vocabulary"),
        ({"encoder": 3}, "model.encoder: expected a mapping"),
        ({"share_embeddings": "yes"}, "model.share_embeddings must be true or false"),
        ({"encoder": {"embedding_size": 16}}, "share_embeddings needs one vocabulary"),
    ],
)
def test_a_bad_model_section_names_its_key(section: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        encoder_decoder_config(section, PLACEHOLDER_VOCABULARY)


# -- settings ------------------------------------------------------------------------------------------------------


def data_section(**extra: object) -> dict:
    return {"type": "translation", "source_lang": "en", "target_lang": "de", "train_prefix": "a/train",
            "validation_prefix": "a/val", **extra}  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"translation": {"beam": 0}}, "translation: beam must be >= 1, got 0"),
        ({"translation": {"eval_beam": 0}}, "translation: eval_beam must be >= 1, got 0"),
        ({"translation": {"max_len_b": -1}}, "translation: max_len_b must be >= 0, got -1"),
        ({"translation": {"max_len_a": -0.5}}, "translation: max_len_a must be >= 0, got -0.5"),
        ({"translation": {"max_tokens": 0}}, "max_tokens must be >= 1"),
        ({"translation": {"label_smoothing": 1.0}}, "label_smoothing must be in"),
        ({"translation": {"too_long": "drop"}}, "too_long"),
        ({"target_lang": "en"}, "source_lang and target_lang are both 'en'"),
        ({"source_lang": None}, "source_lang is required"),
        ({"validation_prefix": None}, "validation_prefix is required"),
        ({"train_file": "x.tsv"}, "train_file: type translation reads parallel files by prefix"),
        ({"translation": {"max_source_words": 0}}, "max_source_words must be >= 1"),
        ({"translation": {"long_test_pairs": 0}}, "long_test_pairs must be >= 1"),
        ({"translation": {"vocab_size": 500_000_000}}, "vocab_size must be <= 1,000,000 .*, got 500,000,000"),
        ({"translation": {"length_penalty": float("nan")}}, "'translation.length_penalty' must be a finite number"),
    ],
)
def test_bad_translation_settings_name_their_key(extra: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_dict(FinetuneDataConfig, data_section(**extra))


@pytest.mark.parametrize("field", ["length_penalty", "max_len_a"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_decoding_settings_are_finite_numbers(field: str, value: float, tmp_path: Path) -> None:
    """As a config's are: nan passes every range check and reorders the beams without a word."""
    with pytest.raises(UserError, match=f"{field} must be a finite number, got {value}"):
        Decoding.from_dict({field: value})
    (tmp_path / DECODING_FILE).write_text(json.dumps({field: value}))  # Python's json writes NaN and Infinity
    with pytest.raises(UserError, match=f"translation.json: not decoding settings \\({field} must be a finite"):
        Decoding.read(tmp_path)


# translation.json as runs wrote it: the search's keys under their users' names, first
WRITTEN = {"beam": 2, "length_penalty": 0.6, "early_stopping": True, "max_len_a": 1.2, "max_len_b": 10,
           "max_length": 32, "too_long": "error", "batch_size": 8, "pad_to_multiple_of": 8, "source_lang": "en",
           "target_lang": "de"}  # fmt: skip


def test_one_search_object_behind_the_config_translation_json_and_the_command_s_flags(tmp_path: Path) -> None:
    """`data.translation`'s `beam` / `eval_beam` / `max_len_b`, translation.json's keys and `--beam`: SearchConfig."""
    config = TranslationConfig(beam=5, eval_beam=2, max_len_b=7)
    final = SearchConfig(num_beams=5, length_penalty=0.6, early_stopping=True, max_new_tokens=7, max_len_a=1.2)
    assert config.search() == final and config.search(final=False) == replace(final, num_beams=2)
    assert TranslationConfig().search() == PAPER_SEARCH == Decoding().search
    (tmp_path / DECODING_FILE).write_text(json.dumps(WRITTEN))
    read = Decoding.read(tmp_path)
    assert read.search == replace(PAPER_SEARCH, num_beams=2) and (read.max_length, read.batch_size) == (32, 8)
    assert json.loads(read.to_json()) == WRITTEN and list(json.loads(read.to_json())) == list(WRITTEN)  # key order
    overridden = read.overridden({"beam": 1, "length_penalty": 1.0, "batch_size": 2})
    assert overridden == replace(read, search=replace(read.search, num_beams=1, length_penalty=1.0), batch_size=2)
    with pytest.raises(UserError, match="^beam must be >= 1, got 0$"):
        read.overridden({"beam": 0})
    with pytest.raises(UserError, match="unknown decoding settings: num_beams"):
        read.overridden({"num_beams": 2})
    (tmp_path / DECODING_FILE).write_text(json.dumps({**WRITTEN, "max_len_b": -1, "later_key": 1}))
    with pytest.raises(UserError, match=r"translation.json: not decoding settings \(max_len_b must be >= 0, got -1\)"):
        Decoding.read(tmp_path)


def test_a_split_s_search_is_the_split_s_and_its_batches_hold_tensors_only(tmp_path: Path) -> None:
    """The dev split decodes with `eval_beam` during training, `valid` and `test` with `beam`: each as generate does."""
    write_pair(tmp_path, "train", ENGLISH * 3, GERMAN * 3)
    write_pair(tmp_path, "val", ENGLISH[:2], GERMAN[:2])
    section = data_section(train_prefix=str(tmp_path / "train"), validation_prefix=str(tmp_path / "val"),
                           test_prefix=str(tmp_path / "val"))  # fmt: skip
    data = from_dict(FinetuneDataConfig, {**section, "translation": {"vocab_size": 120, "beam": 3, "max_len_b": 4}})
    task = TranslationTask.from_config(data)
    tokenizer = task.tokenizer()
    config = encoder_decoder_config({"hidden_size": 32, "num_layers": 1, "num_heads": 2}, Vocabulary.of(tokenizer))
    facts = task.check_model(config)
    assert facts.eos_id == config.eos_token_id  # what the task learns of the model, not state it keeps
    encoded = task.encode(tokenizer, 32, facts)
    beam = replace(PAPER_SEARCH, num_beams=3, max_new_tokens=4)
    searches = {name: split.search for name, split in encoded.items()}
    assert searches == {"train": None, "dev": replace(beam, num_beams=1), "test": beam, "valid": beam}
    torch.manual_seed(0)
    model = EncoderDecoder(config).eval()
    for name in ("dev", "valid"):
        batch = task.collate(encoded[name], [0, 1], tokenizer.pad_token_id, 32)
        assert all(isinstance(value, torch.Tensor) for value in batch.values())
        outputs = task.outputs(model, batch, encoded[name])
        expected = model.generate(batch["input_ids"], batch["attention_mask"], search=searches[name])
        assert torch.equal(outputs["ids"], expected) and set(outputs) == {"ids", "nll", "tokens"}


def test_the_language_keys_belong_to_the_translation_type() -> None:
    data = from_dict(FinetuneDataConfig, data_section())
    assert data.translation == TranslationConfig() and data.source == "files"
    with pytest.raises(ConfigError, match="train_prefix: is for type: translation"):
        from_dict(FinetuneDataConfig, {"type": "classification", "train_file": "a", "validation_file": "b",
                                       "train_prefix": "x"})  # fmt: skip
    hub = from_dict(FinetuneDataConfig, {**data_section(train_prefix=None, validation_prefix=None),
                                         "hub_name": "wmt/wmt14", "hub_config": "de-en"})  # fmt: skip
    assert hub.source == "hub"


# -- metrics -------------------------------------------------------------------------------------------------------


def test_bleu_and_chrf_are_sacrebleu_s_with_its_signatures() -> None:
    import sacrebleu

    hypotheses = ["Ein Mann läuft.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]
    scores = corpus_scores(hypotheses, GERMAN[:3])
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [GERMAN[:3]]).score, abs=1e-12)
    chrf = sacrebleu.corpus_chrf(hypotheses, [GERMAN[:3]], word_order=2).score
    assert scores["chrf"] == pytest.approx(chrf, abs=1e-12)
    assert corpus_scores(GERMAN, GERMAN)["bleu"] == pytest.approx(100.0)
    signature = signatures()
    assert signature["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert signature["chrf"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no|version:")
    with pytest.raises(ValueError, match="2 hypotheses for 3 references"):
        corpus_scores(hypotheses[:2], GERMAN[:3])


def test_the_tokenized_lower_cased_bleu_is_moses_then_sacrebleu_without_tokenization() -> None:
    """Case, punctuation normalisation and Moses' splitting do not count; words do (Multi30k's lc.norm.tok BLEU)."""
    assert moses_tokenized_lowercase(["Ein Mann mit „Hut“ läuft – schnell, oder?"], "de") == [
        'ein mann mit " hut " läuft - schnell , oder ?'
    ]  # „ “ become ", the en dash -, and the punctuation stands apart
    assert tokenized_lowercase_bleu(["ein MANN rennt ."], ["Ein Mann rennt."], "de") == pytest.approx(100.0)
    hypotheses = ["Ein Mann läuft.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]
    scores = corpus_scores(hypotheses, GERMAN[:3], "de")
    assert 0 < scores["bleu_tok_lc"] < 100 and set(scores) == {"bleu", "chrf", "bleu_tok_lc"}
    assert "bleu_tok_lc" not in corpus_scores(hypotheses, GERMAN[:3])  # no language: the detokenized scores alone
    assert tokenized_lowercase_signature().startswith("nrefs:1|case:mixed|eff:no|tok:none|smooth:exp|version:")
    with pytest.raises(ValueError, match="2 hypotheses for 3 references"):
        tokenized_lowercase_bleu(hypotheses[:2], GERMAN[:3], "de")


# -- the length split ----------------------------------------------------------------------------------------------


def test_a_length_split_trains_on_short_sources_and_tests_on_the_longer_rest(tmp_path: Path) -> None:
    english = ["A man runs.", "Two big dogs play in the deep snow.", "A cat.", "A woman reads a red book today."]
    write_pair(tmp_path, "train", english, GERMAN)
    write_pair(tmp_path, "val", ENGLISH[:2], GERMAN[:2])
    section = data_section(train_prefix=str(tmp_path / "train"), validation_prefix=str(tmp_path / "val"))
    data = from_dict(FinetuneDataConfig, {**section, "translation": {"max_source_words": 3, "long_test_pairs": 1}})
    task = TranslationTask.from_config(data)
    assert task.texts["train"].sources == ["A man runs.", "A cat."]  # 3 and 2 words: kept, in file order
    assert task.texts["train"].targets == [GERMAN[0], GERMAN[2]] and task.texts["train"].lines == [1, 3]
    assert task.texts["long"].sources == [english[1]] and task.texts["long"].lines == [2]  # the first longer pair
    assert task.test_splits == ["valid", "long"]
    too_long = {**section, "translation": {"max_source_words": 8}}
    with pytest.raises(UserError, match="no training pair of .*train.en has a source of more than 8 words"):
        TranslationTask.from_config(from_dict(FinetuneDataConfig, too_long))


def test_the_paired_bootstrap_is_sacrebleu_s_and_marks_equal_outputs(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    import sacrebleu

    from roformer.study.translation_study import paired_bootstrap

    references = GERMAN * 10
    good = GERMAN[:3] * 10 + ["Die Katze schläft nicht."] * 10
    bad = ["Ein Mann.", "Zwei Hunde.", "Eine Frau.", "Die Katze."] * 10
    with caplog.at_level(logging.INFO):
        test = paired_bootstrap({"good": good, "same": list(good), "bad": bad}, references)
    assert not [r for r in caplog.records if r.name == "sacrebleu"], "sacreBLEU's progress lines are not kept quiet"
    assert logging.getLogger("sacrebleu").level == logging.NOTSET  # and its level is given back
    assert test["baseline"] == "good" and "bs:1000" in test["signature"]
    systems = test["systems"]
    assert systems["good"]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(good, [references]).score)
    assert systems["good"]["p_value"] is None and not systems["good"]["identical"]
    assert systems["same"]["identical"] and systems["same"]["p_value"] is None  # sacreBLEU would say 0.001
    assert systems["bad"]["bleu"] < systems["good"]["bleu"] and systems["bad"]["p_value"] < 0.05


def fake_run(folder: Path, seed: int, dev: dict[str, float], test: list[str]) -> Path:
    """A finished translation run's files as a study reads them: results.json, metrics.jsonl, the hypotheses."""
    import json

    run = {"peak_lr": 1e-3, "seed": seed, "dev": {"dev": {"bleu": dev["best"]}}}
    run["averaged"] = {"dev": {"dev": {"bleu": dev["averaged"]}}}
    folder.mkdir(parents=True)
    results = {"selected": {"peak_lr": 1e-3, "seed": seed}, "runs": [run]}
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "metrics.jsonl").write_text(json.dumps({"event": "train", "elapsed_sec": 10.0 + seed}) + "\n")
    for model in ("best", "averaged"):
        (folder / "hypotheses" / model).mkdir(parents=True)
        (folder / "hypotheses" / model / "test.de").write_text("".join(line + "\n" for line in test))
    return folder


def test_a_translation_comparison_picks_best_seeds_by_dev_and_leaves_out_arms_not_run(tmp_path: Path) -> None:
    import sacrebleu

    from roformer.study.translation_study import compare_translations, translation_markdown

    references = GERMAN * 5
    sources = ENGLISH * 5
    worse = ["Ein Mann.", "Zwei Hunde spielen.", "Eine Frau liest.", "Die Katze."] * 5
    runs = {
        # seed 0 translates the test set perfectly but its averaged model is worse on dev: seed 1 is the best
        "rotary": [
            fake_run(tmp_path / "rotary-seed0", 0, {"best": 30.0, "averaged": 10.0}, references),
            fake_run(tmp_path / "rotary-seed1", 1, {"best": 5.0, "averaged": 20.0}, worse),
        ],
        "none": [tmp_path / "none-seed0", fake_run(tmp_path / "none-seed1", 1, {"best": 1, "averaged": 1}, worse)],
        "learned": [tmp_path / "learned-seed0", tmp_path / "learned-seed1"],  # nothing finished yet
    }
    summary = compare_translations(runs, [0, 1], {"test": sources}, {"test": references}, "de")
    assert summary["model"] == "averaged" and list(summary["arms"]) == ["rotary", "none"]
    rotary = summary["arms"]["rotary"]
    assert rotary["seeds"] == [0, 1] and rotary["dev_bleu"] == [10.0, 20.0] and rotary["seconds"] == [10.0, 11.0]
    bleu = [sacrebleu.corpus_bleu(h, [references]).score for h in (references, worse)]
    assert rotary["splits"]["test"]["bleu"]["seeds"] == pytest.approx(bleu)
    lowercase = [sacrebleu.corpus_bleu(h, [references], lowercase=True).score for h in (references, worse)]
    assert rotary["splits"]["test"]["bleu_lc"]["seeds"] == pytest.approx(lowercase)
    assert "case:lc" in summary["bleu_lc_signature"]
    tokenized = [tokenized_lowercase_bleu(h, references, "de") for h in (references, worse)]
    assert rotary["splits"]["test"]["bleu_tok_lc"]["seeds"] == pytest.approx(tokenized)
    assert "tok:none" in summary["bleu_tok_lc_signature"]
    assert (
        summary["arms"]["none"]["seeds"] == [1]
        and summary["arms"]["none"]["splits"]["test"]["bleu"]["interval"] is None
    )
    assert summary["best_seeds"] == {"rotary": 1, "none": 1}  # by the averaged model's dev BLEU, not by test
    test = summary["bootstrap"]["test"]["systems"]
    assert test["rotary"]["bleu"] == pytest.approx(bleu[1]) and test["none"]["identical"]
    assert sum(b["sentences"] for b in rotary["splits"]["test"]["buckets"].values()) == len(sources)
    assert summary["bucket_sentences"]["test"] == {
        k: b["sentences"] for k, b in rotary["splits"]["test"]["buckets"].items()
    }
    text = translation_markdown("multi30k", {**summary, "languages": "en-de", "max_source_words": None}, [0, 1])
    assert "| rotary | 2 | 59." in text and "| none | 1 |" in text and "tok:none" in text and "| identical |" in text
    (tmp_path / "rotary-seed1" / "hypotheses" / "averaged" / "test.de").write_text("one line\n")
    with pytest.raises(UserError, match="rotary-seed1/hypotheses/averaged/test.de: 1 hypotheses for 20 sources"):
        compare_translations(runs, [0, 1], {"test": sources}, {"test": references}, "de")
