"""Bootstrap intervals: the resampled metrics are the task metrics, and the verdicts follow the intervals."""
import numpy as np
import pytest

from symfusion.pipeline.tasks.text_encoding import per_example_record
from symfusion.pipeline.text_metrics import macro_f1, mcc, pearson_spearman, span_f1
from symfusion.pipeline.uncertainty import interval, paired_effect, resamples, score_interval, scores, verdict

RNG = np.random.default_rng(0)


def whole(n):
    return np.arange(n)[None, :]


@pytest.mark.parametrize("metric,function", [("macro_f1", macro_f1), ("mcc", mcc)])
def test_classification_metrics_on_the_full_sample_equal_the_task_metric(metric, function):
    reference = RNG.integers(0, 4, 300).tolist()
    prediction = [r if RNG.random() < 0.6 else int(RNG.integers(0, 4)) for r in reference]
    record = per_example_record("text_classification", prediction, reference, list(range(300)))
    assert scores(metric, record, whole(300))[0] == pytest.approx(function(reference, prediction)["score"], abs=1e-12)


def test_correlation_on_the_full_sample_equals_the_task_metric():
    reference = RNG.normal(size=200).tolist()
    prediction = [r + RNG.normal() for r in reference]
    record = per_example_record("regression", prediction, reference, list(range(200)))
    expected = pearson_spearman(reference, prediction)["score"]
    assert scores("pearson_spearman", record, whole(200))[0] == pytest.approx(expected, abs=1e-12)


def test_span_f1_from_per_sentence_counts_equals_seqeval():
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    references = [[tags[i] for i in RNG.integers(0, 5, 12)] for _ in range(80)]
    predictions = [[t if RNG.random() < 0.7 else tags[int(RNG.integers(0, 5))] for t in sentence]
                   for sentence in references]
    record = per_example_record("token_classification", predictions, references, list(range(80)))
    assert scores("span_f1", record, whole(80))[0] == pytest.approx(span_f1(references, predictions)["score"],
                                                                     abs=1e-12)


def test_per_example_records_come_back_in_the_examples_own_order():
    record = per_example_record("text_classification", [10, 20, 30], [1, 2, 3], order=[2, 0, 1])
    assert record == {"prediction": [20, 30, 10], "reference": [2, 3, 1]}


def test_identical_models_have_a_zero_interval_and_no_detectable_change():
    record = {"correct": RNG.integers(0, 2, 500).tolist()}
    found = paired_effect("accuracy", [(record, record, "t")])
    assert found["effect"] == 0 and found["low"] == 0 == found["high"] and found["verdict"] == "no detectable change"


def test_a_real_difference_is_detected_and_its_interval_covers_it():
    without = {"correct": (RNG.random(2000) < 0.5).astype(int).tolist()}
    with_ = {"correct": [1 if c or RNG.random() < 0.2 else 0 for c in without["correct"]]}
    found = paired_effect("accuracy", [(with_, without, "t")], scale=100)
    truth = 100 * (np.mean(with_["correct"]) - np.mean(without["correct"]))
    assert found["effect"] == pytest.approx(truth) and found["low"] < truth < found["high"]
    assert found["verdict"] == "helps" and found["low"] > 0
    flipped = paired_effect("accuracy", [(without, with_, "t")], scale=100)
    assert flipped["verdict"] == "hurts"


def test_a_tiny_difference_on_few_examples_is_not_detectable():
    without = {"correct": [1, 0] * 25}
    with_ = {"correct": [1, 1] + [1, 0] * 24}
    assert paired_effect("accuracy", [(with_, without, "t")])["verdict"] == "no detectable change"


def test_resamples_are_seeded_per_test_set_and_losses_are_better_lower():
    assert np.array_equal(resamples(50, "a"), resamples(50, "a"))
    assert not np.array_equal(resamples(50, "a"), resamples(50, "b"))
    assert verdict(-0.3, -0.1, lower_is_better=True) == "helps" and verdict(-0.3, -0.1) == "hurts"
    low, high = score_interval("accuracy", {"correct": [1, 0] * 100}, "t", scale=100)
    assert low < 50 < high


def test_the_interval_is_the_central_95_percent_of_the_finite_differences():
    """Differences 0..1000: the 2.5% and 97.5% quantiles are 25 and 975 (a 90% interval would say 50 and 950);
    NaN resamples are left out, not spread into the interval (issue 59: a 90% interval passed every test)."""
    differences = np.arange(1001, dtype=float)
    assert interval(differences) == pytest.approx((25.0, 975.0), abs=1e-9)
    assert interval(np.concatenate([differences, [np.nan, np.inf]])) == interval(differences)
    assert interval(differences, confidence=0.5) == pytest.approx((250.0, 750.0), abs=1e-9)
    assert all(np.isnan(interval(np.array([np.nan, np.nan]))))
    assert verdict(0.0, 2.0) == verdict(-2.0, 0.0) == "no detectable change"     # an interval touching 0
