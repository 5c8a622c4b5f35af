"""utils/files.py: files appear whole or not at all."""

from __future__ import annotations

import json
import os
import stat

import pytest

from mocheg_jax.utils import files


def test_a_finished_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
  path = tmp_path / "table.md"
  path.write_text("old")
  files.write_text(path, "new ✓")
  assert path.read_text(encoding="utf-8") == "new ✓"
  files.write_json(path, {"a": [1, 2]}, indent=1)
  assert json.loads(path.read_text()) == {"a": [1, 2]}
  with files.atomic_open(tmp_path / "blob.bin", "wb") as f:
    f.write(b"\x00\x01")
  assert (tmp_path / "blob.bin").read_bytes() == b"\x00\x01"
  assert sorted(os.listdir(tmp_path)) == ["blob.bin", "table.md"]
  assert stat.S_IMODE(os.stat(path).st_mode) == files.READABLE  # Not mkstemp's 0600.


def test_an_interrupted_write_keeps_the_old_file(tmp_path):
  path = tmp_path / "manifest.json"
  path.write_text("old")
  with pytest.raises(RuntimeError, match="crash"):
    with files.atomic_open(path) as f:
      f.write("half of the new")
      raise RuntimeError("crash")
  assert path.read_text() == "old"
  assert os.listdir(tmp_path) == ["manifest.json"]  # The temporary file is gone.
  with pytest.raises(TypeError):  # Not JSON: nothing is written, nothing is left.
    files.write_json(tmp_path / "new.json", {"x": object()})
  assert os.listdir(tmp_path) == ["manifest.json"]
