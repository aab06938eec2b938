"""symfusion-compare: agreement within tolerance, readable differences, and exit codes."""
import csv
import json
import math

from symfusion.pipeline.report.compare import compare_rows, main, row_label


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


def full_run(tmp_path, name, figures_link=True):
    """A run folder with every artefact and a report.md that shows its figures (as the pipeline writes)."""
    run, figures = tmp_path / name / "results" / "p", tmp_path / name / "figures" / "p"
    for table in ("table1.csv", "table2.csv", "multimodel.csv"):
        write(run / table, [ROW])
    for data in ("fig3_ablation.csv", "fig4_distance.csv", "fig5_barrier.csv", "fig6_layers.csv"):
        write(figures / data, [ROW])
    link = "![Figure 3](../../figures/p/fig3_ablation.png)\n" if figures_link else ""
    (run / "report.md").write_text("# symfusion reproduction report\n\n" + link)
    return run, figures


def test_figures_are_found_from_the_runs_own_report_wherever_compare_runs(tmp_path, capsys, monkeypatch):
    run, _ = full_run(tmp_path, "a")
    ref, ref_figures = full_run(tmp_path, "b")
    monkeypatch.chdir(tmp_path / "b")                       # not the run's folder
    assert main([str(run), "--reference", str(ref), "--reference-figures", str(ref_figures), "--exact"]) == 0
    assert "7 file(s) agree" in capsys.readouterr().out
    bare, _ = full_run(tmp_path, "c", figures_link=False)
    assert main([str(bare), "--reference", str(ref), "--reference-figures", str(ref_figures)]) == 2
    assert "pass --figures" in capsys.readouterr().err


def test_a_missing_or_extra_artefact_is_a_difference(tmp_path, capsys):
    run, figures = full_run(tmp_path, "a")
    ref, ref_figures = full_run(tmp_path, "b")
    args = [str(run), "--reference", str(ref), "--reference-figures", str(ref_figures), "--exact"]
    (run / "table1.csv").unlink()
    assert main(args) == 1
    assert "table1.csv: missing from the run" in capsys.readouterr().out
    for table in ("table2.csv", "multimodel.csv"):
        (run / table).unlink()
    for data in ("fig3_ablation.csv", "fig4_distance.csv", "fig5_barrier.csv"):
        (figures / data).unlink()
    assert main(args) == 1                                    # six of seven missing: six differences
    assert capsys.readouterr().out.startswith("6 difference(s)")
    run2, _ = full_run(tmp_path, "c")
    (ref / "table2.csv").unlink()
    assert main([str(run2), "--reference", str(ref), "--reference-figures", str(ref_figures)]) == 1
    assert "table2.csv: the run has it but the reference" in capsys.readouterr().out


def test_malformed_binary_and_extra_columns_are_differences_not_tracebacks(tmp_path, capsys):
    run, _ = full_run(tmp_path, "a")
    ref, ref_figures = full_run(tmp_path, "b")
    args = [str(run), "--reference", str(ref), "--reference-figures", str(ref_figures)]
    (run / "table1.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    (run / "table2.csv").write_text("method,ours_none\nsimple,1,2\n")
    write(run / "multimodel.csv", [dict(ROW, extra="1")])
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "table1.csv" in out and "malformed" in out and "table2.csv" in out and "line 2 has 3 fields" in out
    assert "column(s) ['extra'] are not in the reference" in out


def test_a_non_finite_or_negative_tolerance_is_refused(tmp_path, capsys):
    for bad in ("nan", "inf", "-1"):
        assert main(run_dirs(tmp_path, [ROW], [ROW]) + ["--tolerance", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --tolerance") and "\n" not in err


def test_within_intervals_a_row_may_move_by_half_its_reference_interval(tmp_path, capsys):
    reference = dict(ROW, effect="2.0", effect_low="0.5", effect_high="3.5")      # half width 1.5
    moved = dict(reference, ours_full="53.2", effect="3.2")
    args = run_dirs(tmp_path, [moved], [reference])
    assert main(args + ["--tolerance", "0.5"]) == 1
    assert main(args + ["--tolerance", "0.5", "--within-intervals"]) == 0
    too_far = dict(reference, ours_full="54.0")
    assert main(run_dirs(tmp_path, [too_far], [reference]) + ["--within-intervals"]) == 1
    assert "(|diff| 2 > 1.5)" in capsys.readouterr().out


def test_within_intervals_a_cell_may_move_by_half_its_own_named_interval_as_in_a_long_table(tmp_path, capsys):
    # Table 2's layout: one row per method, an effect per matching with its own interval (half width 0.7 here)
    reference = dict(ROW, effect_full_symmetry="-3.46", effect_full_symmetry_low="-4.16",
                     effect_full_symmetry_high="-2.76")
    moved = dict(reference, effect_full_symmetry="-2.93", effect_full_symmetry_low="-3.60")
    args = run_dirs(tmp_path, [moved], [reference])
    assert main(args) == 1                                        # 0.53 > the default 0.5
    assert main(args + ["--within-intervals"]) == 0              # 0.53 and 0.56 < 0.7
    too_far = dict(reference, effect_full_symmetry="-2.66")
    assert main(run_dirs(tmp_path, [too_far], [reference]) + ["--within-intervals"]) == 1
    assert "effect_full_symmetry: -2.66 vs reference -3.46 (|diff| 0.8 > 0.7)" in capsys.readouterr().out


def test_only_compares_a_slice_and_refuses_unknown_names(tmp_path, capsys):
    run, figures = full_run(tmp_path, "a")
    ref, ref_figures = full_run(tmp_path, "b")
    for name in ("table1.csv", "multimodel.csv"):
        (run / name).unlink()                                     # the slice never made them
    args = [str(run), "--reference", str(ref), "--reference-figures", str(ref_figures), "--exact"]
    assert main(args) == 1
    assert main(args + ["--only", "table2.csv,fig3_ablation.csv"]) == 0
    assert "2 file(s) agree" in capsys.readouterr().out
    assert main(args + ["--only", "table7.csv"]) == 2


def test_a_row_is_named_by_its_name_cells_never_by_a_number():
    assert row_label({"method": "ot_acts", "ours_none": "47.68", "ours_full": "47.58"}) == "ot_acts"
    assert row_label({"method": "ot_acts", "matching": "rotation", "accuracy": "47.6"}) == "ot_acts / rotation"
    assert row_label({"seed": "0", "accuracy": "81.6"}) == "0"


def test_a_mean_over_pairs_may_move_by_half_its_t_interval_over_pairs_and_no_more():
    reference = [{"method": "simple", "ours_full_symmetry": "68.0", "ours_full_symmetry_pairs": "3",
                  "ours_full_symmetry_sd": "1.0", "ours_full_symmetry_se": "0.58", "ours_full_symmetry_pairs_low": "65.5",
                  "ours_full_symmetry_pairs_high": "70.5", "ours_full_symmetry_seed2-onto-seed0": "69.0"}]
    moved = [dict(reference[0], ours_full_symmetry="70.4", **{"ours_full_symmetry_seed2-onto-seed0": "69.4"})]
    assert compare_rows("t.csv", moved, reference, 0.5) == []                       # 2.4 < half of [65.5, 70.5]
    assert len(compare_rows("t.csv", moved, reference, 0.0)) == 2                   # --exact allows nothing
    far = [dict(reference[0], ours_full_symmetry="70.6")]
    (problem,) = compare_rows("t.csv", far, reference, 0.5)
    assert "ours_full_symmetry: 70.6 vs reference 68" in problem and "> 2.5" in problem
    one_pair = [dict(reference[0], **{"ours_full_symmetry_seed2-onto-seed0": "70.0"})]
    (problem,) = compare_rows("t.csv", one_pair, reference, 0.5)                   # a pair's own value: the default
    assert "seed2-onto-seed0" in problem


def test_a_perplexity_may_move_as_far_as_its_losss_interval_allows():
    reference = [{"model": "simple", "loss": "5.5", "loss_pairs_low": "5.4", "loss_pairs_high": "5.6",
                  "perplexity": str(math.exp(5.5))}]
    allowed = math.exp(5.5) * math.expm1(0.1)
    inside = [dict(reference[0], perplexity=str(math.exp(5.5) + 0.9 * allowed))]
    outside = [dict(reference[0], perplexity=str(math.exp(5.5) + 1.1 * allowed))]
    assert compare_rows("d.csv", inside, reference, 0.5) == []
    assert len(compare_rows("d.csv", outside, reference, 0.5)) == 1


def test_recorded_tolerances_widen_only_the_cells_they_name(tmp_path, capsys):
    args = run_dirs(tmp_path, [dict(ROW, ours_full="52.8", ours_none="50.8")], [ROW])
    assert main(args) == 1
    (tmp_path / "ref" / "tolerances.yaml").write_text("why: test\ntolerances:\n  table2.csv: {'ours_f*': 1.0}\n")
    assert main(args) == 1 and "ours_none" in capsys.readouterr().out and True       # ours_none is not named
    (tmp_path / "ref" / "tolerances.yaml").write_text("tolerances:\n  table2.csv: {'ours_*': 1.0}\n")
    assert main(args) == 0
    assert main(args + ["--exact"]) == 1
    (tmp_path / "ref" / "tolerances.yaml").write_text("tolerances:\n  table2.csv: {'ours_*': -1}\n")
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "finite number >= 0" in err


BORDER = {"method": "simple", "effect": "1.6", "effect_pairs": "3", "effect_pairs_low": "0.2", "effect_pairs_high": "3.0",
          "effect_low": "1.1", "effect_high": "2.1", "ours_effect": "helps"}


def test_a_verdict_may_flip_to_or_from_no_change_only_where_its_interval_over_pairs_is_borderline():
    flipped = [dict(BORDER, ours_effect="no detectable change")]
    assert compare_rows("t.csv", flipped, [BORDER], 0.5) == []          # 0.2 lies within half the width (1.4) of 0
    assert compare_rows("t.csv", [BORDER], flipped, 0.5) == []          # and the other way round
    assert len(compare_rows("t.csv", flipped, [BORDER], 0.0)) == 1     # --exact: never
    (problem,) = compare_rows("t.csv", [dict(BORDER, ours_effect="hurts")], [BORDER], 0.5)
    assert "'hurts' vs reference 'helps'" in problem                   # never from one side to the other
    far = dict(BORDER, effect_pairs_low="2.0", effect_pairs_high="3.0")  # 2.0 > half the width (0.5)
    assert len(compare_rows("t.csv", [dict(far, ours_effect="no detectable change")], [far], 0.5)) == 1


def test_the_blanket_tolerance_alone_never_lets_a_verdict_flip_a_recorded_one_may(tmp_path, capsys):
    one_pair = {"method": "simple", "effect": "0.3", "effect_low": "0.1", "effect_high": "0.5", "ours_effect": "helps"}
    flipped = dict(one_pair, ours_effect="no detectable change")
    assert len(compare_rows("t.csv", [flipped], [one_pair], 0.5)) == 1   # 0.1 is within 0.5 of 0, but unmeasured
    assert len(compare_rows("t.csv", [flipped], [one_pair], 5.0)) == 1
    assert compare_rows("t.csv", [flipped], [one_pair], 0.5, recorded=[("effect_*", 0.2)]) == []
    assert len(compare_rows("t.csv", [flipped], [one_pair], 0.5, recorded=[("effect_*", 0.05)])) == 1
    args = run_dirs(tmp_path, [flipped], [one_pair])
    assert main(args) == 1
    (tmp_path / "ref" / "tolerances.yaml").write_text("tolerances:\n  table2.csv: {effect_low: 0.2}\n")
    assert main(args) == 0 and main(args + ["--exact"]) == 1


def test_a_run_portable_across_vendors_is_compared_with_the_vendors_reference(tmp_path, capsys, monkeypatch):
    """Without --reference: reference/<profile>_vendors where the run's provenance records MKL_CBWR=COMPATIBLE
    (portable=vendors) and that folder exists, else reference/<profile>; a missing or malformed provenance is a run
    of the default kind, never a traceback."""
    run, figures = full_run(tmp_path, "a")
    other = dict(ROW, ours_full="99.0")
    for name, row in (("p", other), ("p_vendors", ROW)):
        folder = tmp_path / "reference" / name
        for table in ("table1.csv", "table2.csv", "multimodel.csv"):
            write(folder / table, [row])
        for data in ("fig3_ablation.csv", "fig4_distance.csv", "fig5_barrier.csv", "fig6_layers.csv"):
            write(folder / "figures" / data, [row])
    monkeypatch.chdir(tmp_path)
    (run / "provenance.json").write_text(json.dumps({"machine": {"mkl_cbwr": "COMPATIBLE"}}))
    assert main([str(run), "--exact"]) == 0
    assert "reference: reference/p_vendors" in capsys.readouterr().out
    for provenance in (json.dumps({"machine": {"mkl_cbwr": None}}), "{not json", json.dumps([1])):
        (run / "provenance.json").write_text(provenance)
        assert main([str(run), "--exact"]) == 1                   # against reference/p: ours_full 52 vs 99
        assert "vs reference 99" in capsys.readouterr().out
    (run / "provenance.json").write_text(json.dumps({"machine": {"mkl_cbwr": "COMPATIBLE"}}))
    assert main([str(run), "--exact", "--reference", str(tmp_path / "reference" / "p")]) == 1   # as given
