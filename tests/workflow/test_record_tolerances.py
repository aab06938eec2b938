"""scripts/record_tolerances.py: the cells another run of the same code moved become the reference's recorded tolerances."""
import csv
import importlib.util
from pathlib import Path

import yaml

from symfusion.pipeline.report.compare import main as compare

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("record_tolerances", ROOT / "scripts" / "record_tolerances.py")
record = importlib.util.module_from_spec(spec)
spec.loader.exec_module(record)

ROW = {"method": "simple", "ours_none": "50.0", "ours_full": "52.0", "ours_effect": "helps"}


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def runs(tmp_path, other_row):
    write(tmp_path / "other" / "results" / "table2.csv", [other_row])
    (tmp_path / "other" / "figures").mkdir(parents=True)
    write(tmp_path / "ref" / "table2.csv", [ROW])
    (tmp_path / "ref" / "figures").mkdir()
    return [str(tmp_path / "other" / "results"), str(tmp_path / "other" / "figures"), str(tmp_path / "ref")]


def test_round_up_keeps_two_significant_digits_and_never_rounds_down():
    assert record.round_up(0.8123) == 0.82 and record.round_up(1.05) == 1.1 and record.round_up(0.00123) == 0.0013
    assert record.round_up(0.0) == 0.0


def test_a_moved_cell_becomes_its_columns_tolerance_and_the_compare_then_passes(tmp_path, capsys):
    args = runs(tmp_path, dict(ROW, ours_full="52.81", ours_none="50.2"))
    compare_args = [args[0], "--figures", args[1], "--reference", args[2]]
    assert compare(compare_args) == 1
    assert record.main(args + ["--why", "the native kernels"]) == 0
    written = yaml.safe_load((tmp_path / "ref" / "tolerances.yaml").read_text())
    assert written["tolerances"] == {"table2.csv": {"ours_full": 0.82}}          # 50.2 is within the default 0.5
    assert written["why"] == "the native kernels"
    assert compare(compare_args) == 0
    assert compare(compare_args + ["--exact"]) == 1


def test_a_differing_word_is_reported_not_tolerated(tmp_path, capsys):
    args = runs(tmp_path, dict(ROW, ours_effect="no detectable change"))
    assert record.main(args + ["--why", "x"]) == 1
    assert "ours_effect" in capsys.readouterr().out
    written = yaml.safe_load((tmp_path / "ref" / "tolerances.yaml").read_text())
    assert written["differing_words"] == {"table2.csv": ["ours_effect"]}


def test_a_file_it_did_not_write_is_never_overwritten(tmp_path, capsys):
    args = runs(tmp_path, dict(ROW, ours_full="60.0"))
    (tmp_path / "ref" / "tolerances.yaml").write_text("mine: true\n")
    assert record.main(args + ["--why", "x"]) == 2
    assert (tmp_path / "ref" / "tolerances.yaml").read_text() == "mine: true\n"
    assert capsys.readouterr().err.startswith("error: ")


def test_runs_that_agree_write_nothing(tmp_path):
    args = runs(tmp_path, dict(ROW, ours_full="52.3"))
    assert record.main(args + ["--why", "x"]) == 0
    assert not (tmp_path / "ref" / "tolerances.yaml").exists()


def test_a_verdict_the_compares_rule_allows_is_no_differing_word(tmp_path, capsys):
    border = dict(ROW, effect="1.6", effect_pairs="3", effect_pairs_low="0.2", effect_pairs_high="3.0")
    write(tmp_path / "other" / "results" / "table2.csv", [dict(border, ours_effect="no detectable change")])
    (tmp_path / "other" / "figures").mkdir(parents=True)
    write(tmp_path / "ref" / "table2.csv", [border])
    (tmp_path / "ref" / "figures").mkdir()
    args = [str(tmp_path / "other" / "results"), str(tmp_path / "other" / "figures"), str(tmp_path / "ref")]
    assert record.main(args + ["--why", "x"]) == 0                     # borderline over pairs: nothing to record
    assert not (tmp_path / "ref" / "tolerances.yaml").exists()
    # a moved endpoint recorded as a tolerance makes the verdict resting on it borderline too
    one_pair = dict(ROW, effect="0.9", effect_low="0.6", effect_high="1.2")
    write(tmp_path / "other" / "results" / "table2.csv", [dict(one_pair, effect_low="-0.1", ours_effect="no detectable change")])
    write(tmp_path / "ref" / "table2.csv", [one_pair])
    assert record.main(args + ["--why", "x"]) == 0
    written = yaml.safe_load((tmp_path / "ref" / "tolerances.yaml").read_text())
    assert written["tolerances"] == {"table2.csv": {"effect_low": 0.7}} and "differing_words" not in written
    assert compare([args[0], "--figures", args[1], "--reference", args[2]]) == 0
