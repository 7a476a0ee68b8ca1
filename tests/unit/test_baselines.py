"""Trivial baselines (roformer.tasks.baselines) and the results page that reads every split against its own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from roformer.tasks.baselines import commonest, constant_predictions, label_guess, scored
from roformer.tasks.glue_metrics import compute
from roformer.train.results_card import results_markdown


def evaluate_with(metrics: tuple[str, ...]):  # noqa: ANN201
    return lambda split, predictions: compute(metrics, predictions, split.labels)


def test_the_majority_class_comes_from_training_and_is_scored_on_the_split() -> None:
    train = SimpleNamespace(labels=[1, 1, 0, 1, 2])
    dev = SimpleNamespace(labels=[0, 0, 1, 2])  # training's majority is dev's minority: 25%
    guess = label_guess(train.labels)
    assert guess.kind == "majority_class" and guess.predict(dev) == [1, 1, 1, 1]
    baseline = scored(guess, dev, evaluate_with(("accuracy",)))
    assert baseline == {"kind": "majority_class", "accuracy": 0.25, "score": 0.25}


def test_a_constant_score_has_no_correlation() -> None:
    train = SimpleNamespace(labels=[1.0, 2.0, 3.0])
    dev = SimpleNamespace(labels=[0.0, 4.0, 2.5])
    guess = label_guess(train.labels)
    assert guess.kind == "training_mean" and guess.predict(dev) == [2.0, 2.0, 2.0]
    baseline = scored(guess, dev, evaluate_with(("pearson", "spearman")))
    assert baseline["pearson"] == 0.0 and baseline["spearman"] == 0.0  # NaN for a constant: no information


def test_ties_take_the_first_label_seen_and_label_sets_are_values() -> None:
    assert commonest([2, 1, 1, 2]) == 2
    guess = label_guess([[0, 1], [1], [0, 1]])
    assert guess.kind == "commonest_label_set" and guess.predict(SimpleNamespace(labels=[None])) == [[0, 1]]
    assert label_guess([None, None]) is None  # an unlabelled training split has no baseline


def test_constant_predictions_are_one_answer_over_several_rows() -> None:
    assert constant_predictions([3, 3, 3]) and constant_predictions([[0], [0]])
    assert not constant_predictions([3]) and not constant_predictions([3, 4])


def results(**extra: object) -> dict:
    summary = {"dev": {m: {"mean": 0.5, "std": 0.01, "values": [0.49, 0.51]} for m in ("accuracy", "score")}}
    run = {"peak_lr": 2e-5, "seed": 1, "best_step": 30, "steps": 90, "stopped_at": 60}
    return {
        "task": "rte",
        "init": "runs/pretrain/final",
        "selected": {"peak_lr": 2e-5, "seed": 1, "best_step": 30},
        "runs": [run],
        "summary": summary,
        **extra,
    }


def test_the_results_page_reads_every_split_beside_its_baseline() -> None:
    page = results_markdown(
        results(
            baseline={"dev": {"kind": "majority_class", "accuracy": 0.527, "score": 0.527}},
            test={"test": {m: {"mean": 0.6, "std": 0.0, "values": [0.6, 0.6]} for m in ("accuracy", "score")}},
        )
    )
    assert page.startswith("# rte: fine-tuned from `runs/pretrain/final`")
    assert "the best dev checkpoint at step 30 of 90, stopped at step 60 (train.patience)" in page
    assert "| dev | 50.00 ± 1.00 | 50.00 ± 1.00 |" in page
    assert "| dev: majority class (baseline) | 52.70 | 52.70 |" in page
    assert "| test | 60.00 ± 0.00 | 60.00 ± 0.00 |" in page and "test: " not in page  # no baseline: no row


def test_a_synthetic_split_is_read_against_its_position_blind_floor() -> None:
    floor = {"kind": "position_blind", "accuracy": 0.36}
    page = results_markdown(results(splits={"dev": {"baseline": floor}}))
    assert "| dev: position blind (baseline) | 36.00 | - |" in page


@pytest.mark.parametrize("percent", [True, False])
def test_translation_ends_with_the_final_bleu_of_both_models_and_the_search(percent: bool) -> None:
    scores = {"bleu": 27.1, "chrf": 55.0, "bleu_tok_lc": 38.2, "loss": 2.5, "bleu_tok_lc_recipe": "Moses"}
    translation = {
        "languages": "en-de",
        "search": {"beam": 5, "length_penalty": 1.0, "batch_size": 64},
        "eval_beam": 1,
        "best": {"test": scores},
        "averaged": {"test": {**scores, "bleu": 28.0}},
        "signatures": {"bleu": "nrefs:1|tok:13a"},
    }
    page = results_markdown(results(metrics_in_percent=percent, translation=translation))
    assert "| best | test | 27.10 | 55.00 | 38.20 | 2.500 |" in page
    assert "| averaged | test | 28.00 |" in page
    assert "Search: beam 5, length_penalty 1.0 (dev BLEU during training: beam 1)." in page
    assert "`nrefs:1|tok:13a`" in page and "BLEU tok. lc: Moses." in page
