"""Atomic writes: a failed writer leaves nothing, and the next writer sweeps what a killed one left."""
import json

import pytest

from symfusion.modelio import atomic_directory, write_json_atomic


def test_json_is_replaced_whole_and_a_failed_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "r.json"
    write_json_atomic({"a": 1}, target)
    with pytest.raises(TypeError):
        write_json_atomic({(1, 2): "tuple keys are not JSON"}, target)
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_killed_writers_leftovers_are_swept_by_the_next_writer(tmp_path):
    (tmp_path / ".model.tmp-dead1").mkdir()                 # what SIGKILL leaves behind
    (tmp_path / ".r.json.tmp-dead2").write_text("{")
    with atomic_directory(tmp_path / "model") as tmp:
        (tmp / "config.json").write_text("{}")
    write_json_atomic({"ok": True}, tmp_path / "r.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "r.json"]


def test_an_interrupted_directory_write_keeps_the_old_output(tmp_path):
    with atomic_directory(tmp_path / "model") as tmp:
        (tmp / "v").write_text("1")
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(tmp_path / "model") as tmp:
            (tmp / "v").write_text("2")
            raise KeyboardInterrupt
    assert (tmp_path / "model" / "v").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_output_folders_get_the_usual_permissions(tmp_path):
    import os
    umask = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "model") as tmp:
            (tmp / "config.json").write_text("{}")
    finally:
        os.umask(umask)
    assert (tmp_path / "model").stat().st_mode & 0o777 == 0o755
