"""The length-generalization options of the model (asymmetric ALiBi, the log-length attention scale) and the synthetic
tasks' generators, each against its definition written out here."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

import roformer
from roformer.errors import ConfigError
from roformer.labels import IGNORE_INDEX
from roformer.model.relative import RelativeBias, alibi_slopes
from roformer.tasks.synthetic_floors import commonest_share, position_blind_floor
from roformer.tasks.synthetic_rows import GENERATORS, SyntheticConfig, generate_split, vocabulary, word_level_tokenizer
from tests.helpers import tiny_config

# ----------------------------------------------------------------------------------------------------------------
# Asymmetric ALiBi


def test_asymmetric_alibi_puts_keys_on_the_left_half_a_step_closer() -> None:
    """Ruoss et al. 2023's bidirectional ALiBi (their code's compute_alibi_encodings_biases: the lower triangle + 0.5):
    -m (|i - j| - 0.5) for keys before the query, -m |i - j| for the query itself and keys after it; the symmetric
    form is -m |i - j| on both sides."""
    T, H = 6, 4
    slopes = alibi_slopes(H)
    distance = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # key - query
    for form, offset in (("symmetric", 0.0), ("asymmetric", 0.5)):
        bias = RelativeBias(tiny_config(position_encoding="alibi", num_heads=H, alibi_form=form))(distance)
        for h in range(H):
            for i in range(T):
                for j in range(T):
                    expected = -float(slopes[h]) * (abs(i - j) - (offset if j < i else 0.0))
                    assert bias[0, h, i, j].item() == pytest.approx(expected)


def test_asymmetric_alibi_tells_left_from_right_and_symmetric_does_not() -> None:
    """Without [CLS]/[SEP] anchors, a symmetric ALiBi encoder gives a palindrome's mirrored tokens the same output."""
    ids = torch.tensor([[5, 7, 9, 7, 5]])
    outputs = {}
    for form in ("symmetric", "asymmetric"):
        torch.manual_seed(0)
        model = roformer.Backbone(tiny_config(position_encoding="alibi", alibi_form=form)).eval()
        outputs[form] = model(ids).logits[0]
    torch.testing.assert_close(outputs["symmetric"][1], outputs["symmetric"][3])
    assert not torch.allclose(outputs["asymmetric"][1], outputs["asymmetric"][3], atol=1e-4)


def test_alibi_form_needs_alibi_and_the_log_scale_needs_softmax() -> None:
    with pytest.raises(ConfigError, match="alibi_form is only meaningful"):
        tiny_config(position_encoding="rotary", alibi_form="asymmetric")
    with pytest.raises(ConfigError, match="attention_log_scale"):
        tiny_config(attention="linear", attention_log_scale=32)
    with pytest.raises(ConfigError, match="attention_log_scale"):
        tiny_config(attention_log_scale=1)


# ----------------------------------------------------------------------------------------------------------------
# The log-length attention scale


@pytest.mark.parametrize("encoding", ["rotary", "sinusoidal", "alibi", "t5_bias", "shaw"])
def test_log_length_scale_changes_nothing_up_to_the_trained_length(encoding: str) -> None:
    torch.manual_seed(0)
    plain = roformer.Backbone(tiny_config(position_encoding=encoding)).eval()
    scaled = roformer.Backbone(tiny_config(position_encoding=encoding, attention_log_scale=12)).eval()
    scaled.load_state_dict(plain.state_dict())
    ids = torch.randint(5, 100, (2, 12))
    mask = torch.tensor([[1] * 12, [1] * 7 + [0] * 5])
    torch.testing.assert_close(scaled(ids, mask).logits, plain(ids, mask).logits)


@pytest.mark.parametrize("encoding", ["rotary", "alibi", "none"])
def test_log_length_scale_is_the_query_projection_times_log_n_over_log_n0(encoding: str) -> None:
    """Beyond n0 the logits are q k scaled by log n / log n0: the same as a model whose query weights and bias are
    multiplied by it (q = W x + b, and the rotation is linear), for rows of n real tokens."""
    n0, n = 8, 20
    factor = math.log(n) / math.log(n0)
    torch.manual_seed(0)
    # weights at std 0.3, not 0.02: attention far from uniform, so that the scale shows in the outputs
    sharp = {"position_encoding": encoding, "initializer_range": 0.3}
    scaled = roformer.Backbone(tiny_config(**sharp, attention_log_scale=n0)).eval()
    reference = roformer.Backbone(tiny_config(**sharp)).eval()
    unscaled = roformer.Backbone(tiny_config(**sharp)).eval()
    unscaled.load_state_dict(scaled.state_dict())
    state = scaled.state_dict()
    hidden = scaled.config.hidden_size
    for name in list(state):
        if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            state[name] = state[name].clone()
            state[name][:hidden] *= factor  # the query rows of the fused projection
    reference.load_state_dict(state)
    # float64, compared at fp32's default tolerances: the factor itself is a float32 in both
    scaled, reference = scaled.double(), reference.double()
    ids = torch.randint(5, 100, (2, 24))
    mask = torch.tensor([[1] * n + [0] * 4, [1] * n + [0] * 4])
    got = scaled(ids, mask).logits[:, :n]
    torch.testing.assert_close(got, reference(ids, mask).logits[:, :n], rtol=1.3e-6, atol=1e-5)
    assert (got - unscaled.double()(ids, mask).logits[:, :n]).abs().max() > 1e-2  # the scale did something


# ----------------------------------------------------------------------------------------------------------------
# The synthetic tasks


def rows(task: str, length: int, count: int = 200, **settings: object) -> list[tuple[list[str], dict[int, str]]]:
    config = SyntheticConfig(task=task, **settings)  # type: ignore[arg-type]
    rng = random.Random(0)
    return [GENERATORS[task](config, length, rng) for _ in range(count)]


@pytest.mark.parametrize("direction", ["left", "right"])
def test_shift_asks_for_the_symbol_k_away_which_is_never_masked(direction: str) -> None:
    k = 3
    for content, answers in rows("shift", 40, offset=k, direction=direction):
        assert len(content) == 40 and answers
        step = -k if direction == "left" else k
        for i, answer in answers.items():
            assert answer == content[i + step] and i + step not in answers
        assert len(answers) <= max(1, round(0.15 * 40))


def test_missing_duplicate_masks_one_bit_of_a_string_written_twice() -> None:
    for content, answers in rows("missing-duplicate", 30):
        assert content[:15] == content[15:]
        ((at, answer),) = answers.items()
        assert answer == content[at] and answer in ("0", "1")


def test_passkey_binding_asks_for_the_tagged_key_among_distractors() -> None:
    for content, answers in rows("passkey-binding", 64, distractors=2):
        ((at, answer),) = answers.items()
        tag = content.index("[KEY]")
        assert content.count("[KEY]") == 1 and content[at - 1] == "[ASK]" and tag < at - 1
        assert content[tag + 1] == answer
        untagged = [t for i, t in enumerate(content) if t.startswith("k") and i not in (tag + 1, at)]
        assert len(untagged) == 2 * 64 // 16  # the stated count of distractor keys


def test_copying_a_random_key_of_passkey_binding_beats_chance_and_the_commonest_key_is_its_floor() -> None:
    """The distractors are uniform over the keys, the answer's included, and the answer also stands after [KEY]:
    copying a random key of the row is right (1 + d / keys) / (d + 1) of the time (0.2 at 64 tokens, twice chance),
    and the commonest key, whose posterior is proportional to its count, is right at the floor (28.6%)."""
    settings = SyntheticConfig(task="passkey-binding", keys=10, distractors=2, train_lengths=[64, 64])
    rng, copied, commonest, total = random.Random(1), 0, 0.0, 0
    for content, answers in rows("passkey-binding", 64, count=20000, keys=10, distractors=2, train_lengths=[64, 64]):
        ((at, answer),) = answers.items()
        keys = [t for i, t in enumerate(content) if t.startswith("k") and i != at]
        copied += rng.choice(keys) == answer
        counts = Counter(keys)
        top = [key for key, n in counts.items() if n == max(counts.values())]
        commonest += (answer in top) / len(top)  # a tie: any of them, alike
        total += 1
    d = 8  # 2 per 16 tokens
    assert abs(copied / total - (1 + d / 10) / (d + 1)) < 0.01 and copied / total > 1.5 * settings.chance
    floor = position_blind_floor(settings, (64, 64)).accuracy
    assert abs(commonest / total - floor) < 0.01 and round(floor, 3) == 0.286


def test_mqar_asks_every_key_after_its_pairs() -> None:
    for content, answers in rows("mqar", 48, pairs=4, train_lengths=[16, 48]):
        pairs = {content[2 * i]: content[2 * i + 1] for i in range(4)}
        assert len(answers) == 4 and all(v.startswith("v") for v in pairs.values())
        for at, answer in answers.items():
            assert at >= 8 and pairs[content[at - 1]] == answer


def test_mqar_without_binding_reaches_the_commonest_value_level() -> None:
    """The level every mqar arm sits at (docs): answering the value the row holds most often, whichever key was asked,
    is right E[largest count of 4 values from 16] / 4 = 33.7% of the time (exact, over all 16^4 value draws)."""
    from itertools import product

    exact = sum(max(Counter(draw).values()) for draw in product(range(16), repeat=4)) / 16**4 / 4
    assert round(exact, 3) == 0.337
    settings = SyntheticConfig(task="mqar", symbols=16, pairs=4, train_lengths=[16, 32])
    assert commonest_share(4, 16) == pytest.approx(exact, rel=1e-12)  # the floor the study reads mqar against
    for lengths in ((16, 32), (32, 32), (256, 256)):  # at every length alike
        assert position_blind_floor(settings, lengths).accuracy == pytest.approx(exact, rel=1e-12)
    hits = total = 0
    for content, answers in rows("mqar", 32, count=3000, pairs=4, symbols=16, train_lengths=[16, 32]):
        commonest = Counter(content[1:8:2]).most_common(1)[0][1]
        hits, total = hits + commonest, total + len(answers)  # each answer is right iff it is the guessed value
    assert abs(hits / total - exact) < 0.01


@pytest.mark.parametrize("power", [None, 0.01])
def test_mqar_query_places_are_uniform_or_zoologys_power_law(power: float | None) -> None:
    places = (64 - 2) // 2  # one pair, then (key, [MASK]) places
    counts = [0] * places
    for content, answers in rows("mqar", 64, count=6000, pairs=1, train_lengths=[4, 64], query_gap_power=power):
        ((at, answer),) = answers.items()
        assert content[at - 1] == content[0] and answer == content[1]
        counts[(at - 3) // 2] += 1
    weights = [1.0] * places if power is None else [(g + 1) ** (power - 1) for g in range(places)]
    for g in (0, 1, places // 2):
        assert abs(counts[g] / 6000 - weights[g] / sum(weights)) < 0.015


@pytest.mark.parametrize("length", [16, 256])
@pytest.mark.parametrize("power", [0.01, 1e3])
def test_mqar_power_law_places_every_query_once_and_a_large_power_does_not_overflow(power: float, length: int) -> None:
    for content, answers in rows("mqar", length, count=300, pairs=4, train_lengths=[16, 32], query_gap_power=power):
        pairs = {content[2 * i]: content[2 * i + 1] for i in range(4)}
        assert len(answers) == 4 and sorted(pairs.values()) == sorted(answers.values())  # four distinct places
        assert all(pairs[content[at - 1]] == answer for at, answer in answers.items())


def test_splits_are_a_function_of_the_seed_with_masks_at_the_answers() -> None:
    settings = SyntheticConfig(task="shift", randomized_positions=400)
    ids = {t: i for i, t in enumerate(vocabulary(settings))}
    one, two = (generate_split(settings, ids, 50, (8, 32), seed=5) for _ in range(2))
    assert one == two and one != generate_split(settings, ids, 50, (8, 32), seed=6)
    for row, labels, positions in zip(one.ids, one.labels, one.positions, strict=True):
        assert row[0] == ids["[CLS]"] and row[-1] == ids["[SEP]"] and 10 <= len(row) <= 34
        assert all((t == ids["[MASK]"]) == (label != IGNORE_INDEX) for t, label in zip(row, labels, strict=True))
        assert positions == sorted(set(positions)) and len(positions) == len(row) and positions[-1] < 400


def test_the_vocabulary_is_one_id_per_token() -> None:
    settings = SyntheticConfig(task="passkey-binding")
    tokens = vocabulary(settings)
    tokenizer = word_level_tokenizer(tokens)
    assert len(tokenizer) == len(tokens) and tokenizer.pad_token_id == 0 and tokenizer.mask_token_id == 4
    assert tokenizer("[KEY] k3 s1", add_special_tokens=False)["input_ids"] == [
        tokens.index(t) for t in ("[KEY]", "k3", "s1")
    ]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"train_lengths": [8]}, "train_lengths"),
        ({"train_lengths": [32, 8]}, "train_lengths"),
        ({"test_multiples": [2, 2]}, "test_multiples"),
        ({"mask_rate": 0.0}, "mask_rate"),
        ({"task": "mqar", "pairs": 4, "train_lengths": [8, 32]}, "at least 16"),
        ({"randomized_positions": 100}, "randomized_positions"),
        ({"symbols": 1}, "symbols"),
        ({"task": "mqar", "query_gap_power": 0.0}, "query_gap_power"),
        ({"task": "shift", "query_gap_power": 0.01}, "query_gap_power"),
        ({"task": "mqar", "pairs": 20, "train_lengths": [80, 84]}, r"pairs \(20\) must be <= symbols \(16\)"),
    ],
)
def test_impossible_settings_are_refused(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SyntheticConfig(**settings)


def test_chance_levels() -> None:
    assert SyntheticConfig(task="shift", symbols=16).chance == 1 / 16
    assert SyntheticConfig(task="missing-duplicate").chance == 1 / 2
    assert SyntheticConfig(task="passkey-binding", keys=10).chance == 1 / 10


def test_an_arm_may_run_some_of_the_experiment_s_seeds_in_a_task_study() -> None:
    """Three seeds for the arms that decide a comparison, one for the rest (arms.<label>.seeds)."""
    from roformer.config import from_dict
    from roformer.study.experiment_config import PretrainExperimentConfig, TaskStudyConfig

    arms = {"rotary": {"set": []}, "none": {"set": ["model.position_encoding=none"], "seeds": [0]}}
    experiment = from_dict(TaskStudyConfig, {"tasks": ["shift.yaml"], "arms": arms, "seeds": [0, 1, 2]})
    assert [experiment.arm_runs_seed("rotary", s) for s in (0, 1, 2)] == [True, True, True]
    assert [experiment.arm_runs_seed("none", s) for s in (0, 1, 2)] == [True, False, False]
    for seeds in ([3], [], [0, 0]):
        with pytest.raises(ConfigError, match="arms.none.seeds must be distinct seeds of the experiment's"):
            from_dict(TaskStudyConfig, {"tasks": ["shift.yaml"], "arms": {**arms, "none": {"seeds": seeds}}})
    with pytest.raises(ConfigError, match="an arm's own seeds are a task study's"):
        from_dict(PretrainExperimentConfig, {"arms": {"a": "p.yaml", "b": {"config": "p.yaml", "seeds": [0]}}})


def test_arms_may_differ_in_an_encoding_s_own_settings(tmp_path) -> None:  # noqa: ANN001
    """p_rope's unrotated fraction is a key under model.position_settings: a position field, as its encoding is."""
    from roformer.config_yaml import write_yaml
    from roformer.study.experiment_config import load_experiment_config
    from roformer.study.task_study import load_task_arms

    arms = {
        "rotary": {},
        "p_rope": {"set": ["model.position_encoding=p_rope"]},
        "p_rope-half": {
            "set": ["model.position_encoding=p_rope", "model.position_settings.p_rope.unrotated_fraction=0.5"]
        },
    }
    write_yaml(tmp_path / "study.yaml", {"tasks": ["synthetic/shift"], "arms": arms})
    experiment = load_experiment_config(tmp_path / "study.yaml")
    loaded = load_task_arms(experiment, tmp_path / "study.yaml")["shift"]
    assert loaded["p_rope-half"].model["position_settings"]["p_rope"]["unrotated_fraction"] == 0.5
    write_yaml(
        tmp_path / "bad.yaml", {"tasks": ["synthetic/shift"], "arms": {"a": {}, "b": {"set": ["model.hidden_size=32"]}}}
    )
    with pytest.raises(ConfigError, match="differ in model.hidden_size"):
        load_task_arms(load_experiment_config(tmp_path / "bad.yaml"), tmp_path / "bad.yaml")


def test_the_projection_at_the_asked_positions_alone_gives_the_same_loss() -> None:
    """mqar-zoology's `masked_logits_only`: MaskedLM's masked_only under the task's loss, the loss unchanged."""
    from dataclasses import replace

    from helpers import REPO

    from roformer.config import load
    from roformer.train.config import FinetuneConfig
    from roformer.train.finetune import task_inputs

    small = ["data.synthetic.symbols=40", "data.synthetic.values=40", "data.synthetic.train_examples=64"]
    config = load(FinetuneConfig, REPO / "configs" / "synthetic" / "mqar-zoology.yaml", small)
    assert config.data.synthetic.masked_logits_only
    task, tokenizer, model_config = task_inputs(config)
    torch.manual_seed(0)
    model = roformer.MaskedLM(model_config)
    split = task.encode(tokenizer, config.data.max_length)["train"]
    batch = task.collate(split, list(range(8)), tokenizer.pad_token_id, config.data.max_length)
    sparse = task.loss(model, batch)
    task.settings = replace(task.settings, masked_logits_only=False)
    torch.testing.assert_close(sparse, task.loss(model, batch))
    # and evaluation predicts the asked positions from their logits alone, as from the whole (B, T, V)
    sparse_predictions = task.predictions(
        roformer.MaskedLM.forward(model, **batch, masked_only=True).logits, split, list(range(8))
    )
    assert sparse_predictions == task.predictions(task.outputs(model, batch), split, list(range(8)))
    task.settings = replace(task.settings, masked_logits_only=True)
    assert task.outputs(model, batch).dim() == 2


def test_a_task_study_s_runs_as_separate_commands_are_the_experiment_s_runs(tmp_path) -> None:  # noqa: ANN001
    """scripts/tools/study_runs.py writes each unfinished run's config as the experiment resolves it (arm, study,
    seed)."""
    import subprocess
    import sys
    from dataclasses import replace

    from helpers import REPO

    from roformer.config import load
    from roformer.study.experiment_config import load_experiment_config
    from roformer.study.task_study import load_task_arms, run_path
    from roformer.train.config import FinetuneConfig

    study = REPO / "configs" / "experiments" / "length-generalization-extension.yaml"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "tools" / "study_runs.py"),
            str(study),
            str(tmp_path),
            "--set",
            "train.max_steps=3",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [line.split() for line in done.stdout.splitlines()]
    experiment = load_experiment_config(study)
    arms = load_task_arms(experiment, study, ["train.max_steps=3"])
    assert len(lines) == len(experiment.seeds) * sum(len(a) for a in arms.values())
    config, directory = lines[-1]
    task, label, seed = "missing-duplicate", "alibi-asymmetric", 2
    assert directory == str(run_path(tmp_path, task, label, seed))
    expected = arms[task][label]
    expected = replace(expected, train=replace(expected.train, seed=seed, seeds=[]))
    assert load(FinetuneConfig, config).to_dict() == expected.to_dict()
