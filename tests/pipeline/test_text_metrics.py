"""Text metrics against hand-computed values: macro-F1, seqeval span F1 (default and strict), MCC, correlations."""
import math

import pytest

from symfusion.errors import SymfusionError
from symfusion.pipeline.text_metrics import METRICS, get_metric, macro_f1, mcc, pearson_spearman, span_f1


def test_every_metric_returns_named_floats_with_a_score():
    cases = {"macro_f1": ([0, 1], [0, 1]), "mcc": ([0, 1], [0, 1]), "pearson_spearman": ([0.0, 1.0], [0.0, 2.0]),
             "span_f1": ([["B-PER", "O"]], [["B-PER", "O"]])}
    for name, (references, predictions) in cases.items():
        result = METRICS[name](references, predictions)
        assert result["score"] == pytest.approx(1.0) and all(isinstance(v, float) for v in result.values())


def test_macro_f1_is_the_mean_of_per_class_f1():
    # class 0: precision 1, recall 1/2 -> F1 2/3; class 1: precision 2/3, recall 1 -> F1 4/5
    result = macro_f1([0, 0, 1, 1], [0, 1, 1, 1])
    assert result["macro_f1"] == pytest.approx((2 / 3 + 4 / 5) / 2) and result["accuracy"] == pytest.approx(0.75)
    assert result["score"] == result["macro_f1"]


def test_span_f1_counts_entity_spans_micro_averaged():
    references = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG"]]
    predictions = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "O"]]      # ORG span cut short: wrong
    # 3 gold spans, 3 predicted spans, 2 correct -> P = R = F1 = 2/3
    result = span_f1(references, predictions)
    assert result["precision"] == pytest.approx(2 / 3) and result["recall"] == pytest.approx(2 / 3)
    assert result["score"] == pytest.approx(2 / 3)


def test_span_f1_one_wrong_span_in_two_sentences():
    references = [["B-PER", "I-PER", "O"], ["B-LOC", "O"]]
    predictions = [["B-PER", "I-PER", "O"], ["B-ORG", "O"]]
    assert span_f1(references, predictions)["score"] == pytest.approx(0.5)


def test_span_f1_strict_mode_needs_a_b_tag_to_open_a_span():
    references, predictions = [["B-PER", "I-PER", "O"]], [["I-PER", "I-PER", "O"]]
    assert span_f1(references, predictions, mode="default")["score"] == pytest.approx(1.0)   # conlleval: lenient
    assert span_f1(references, predictions, mode="strict")["score"] == pytest.approx(0.0)


def test_mcc_of_a_two_by_two_case():
    # TP=1, FN=1, TN=2, FP=0 -> (1*2 - 0*1) / sqrt(1 * 2 * 2 * 3) = 1/sqrt(3)
    assert mcc([1, 1, 0, 0], [1, 0, 0, 0])["score"] == pytest.approx(1 / math.sqrt(3))
    assert mcc([1, 0, 1, 0], [0, 1, 0, 1])["mcc"] == pytest.approx(-1.0)


def test_pearson_of_a_linear_relation_is_one_and_spearman_sees_any_monotone_one():
    x = [0.0, 1.0, 2.0, 3.0, 4.0]
    linear = pearson_spearman(x, [3 * v - 2 for v in x])
    assert linear["pearson"] == pytest.approx(1.0) and linear["spearman"] == pytest.approx(1.0)
    cubic = pearson_spearman(x, [v ** 3 for v in x])
    assert cubic["spearman"] == pytest.approx(1.0) and cubic["pearson"] < 0.99
    assert cubic["score"] == pytest.approx((cubic["pearson"] + 1.0) / 2)


def test_constant_predictions_give_an_undefined_correlation():
    assert math.isnan(pearson_spearman([1.0, 2.0, 3.0], [0.5, 0.5, 0.5])["score"])


def test_bad_metric_inputs_are_refused():
    with pytest.raises(SymfusionError, match="unknown metric"):
        get_metric("accuracy_top5")
    with pytest.raises(SymfusionError, match="scores token_classification"):
        get_metric("span_f1", "text_classification")
    with pytest.raises(SymfusionError, match="predictions"):
        macro_f1([0, 1], [0])
    with pytest.raises(SymfusionError, match="no examples"):
        mcc([], [])
    with pytest.raises(SymfusionError, match="mode"):
        span_f1([["O"]], [["O"]], mode="lenient")
