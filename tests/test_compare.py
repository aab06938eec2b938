"""symfusion-compare: agreement within tolerance, readable differences, and exit codes."""
import csv

from symfusion.report.compare import main


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def run_dirs(tmp_path, ours, theirs):
    write(tmp_path / "run" / "table2.csv", ours)
    write(tmp_path / "ref" / "table2.csv", theirs)
    (tmp_path / "figs").mkdir(exist_ok=True)
    return [str(tmp_path / "run"), "--reference", str(tmp_path / "ref"), "--figures", str(tmp_path / "figs"),
            "--reference-figures", str(tmp_path / "figs")]


ROW = {"method": "simple", "ours_none": "50.0", "ours_full": "52.0", "ours_effect": "helps"}


def test_identical_runs_agree(tmp_path, capsys):
    assert main(run_dirs(tmp_path, [ROW], [ROW]) + ["--exact"]) == 0
    assert "1 file(s) agree" in capsys.readouterr().out


def test_a_number_beyond_the_tolerance_is_reported(tmp_path, capsys):
    changed = dict(ROW, ours_full="53.0")
    assert main(run_dirs(tmp_path, [changed], [ROW]) + ["--tolerance", "0.5"]) == 1
    out = capsys.readouterr().out
    assert "ours_full: 53 vs reference 52" in out
    assert main(run_dirs(tmp_path, [changed], [ROW]) + ["--tolerance", "2"]) == 0


def test_changed_words_and_row_counts_are_reported(tmp_path, capsys):
    assert main(run_dirs(tmp_path, [dict(ROW, ours_effect="hurts")], [ROW])) == 1
    assert "'hurts' vs reference 'helps'" in capsys.readouterr().out
    assert main(run_dirs(tmp_path, [ROW, ROW], [ROW])) == 1
    assert "2 rows, reference has 1" in capsys.readouterr().out


def test_missing_run_dir_is_a_one_line_error(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_timing_columns_are_not_compared(tmp_path):
    row = dict(ROW, seconds="1.0")
    assert main(run_dirs(tmp_path, [dict(row, seconds="9.0")], [row]) + ["--exact"]) == 0
