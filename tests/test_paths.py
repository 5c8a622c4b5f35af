"""Relocating the paths saved inside a folder that was moved (utils/paths.py)."""

import os

from mocheg_jax.utils import paths

MOVED = ("/cluster/runs/tiny", "/home/me/tiny")


def test_paths_under_the_old_root_move_with_it():
  assert paths.relocate("/cluster/runs/tiny", MOVED) == "/home/me/tiny"
  assert paths.relocate("/cluster/runs/tiny/", MOVED) == "/home/me/tiny"
  assert paths.relocate("/cluster/runs/tiny/stages/rerank", MOVED) == \
      "/home/me/tiny/stages/rerank"
  assert paths.relocate("/cluster/runs/tiny/./data/../release/a.png", MOVED) == \
      "/home/me/tiny/release/a.png"


def test_everything_else_is_left_alone():
  for value in ("/cluster/runs/tiny2/stages", "/cluster/runs", "/data/mocheg",
                "runs/tiny/stages/rerank", "stages/rerank", "random", "", "minilm"):
    assert paths.relocate(value, MOVED) is value
  for value in (3, 2.5, None, True):
    assert paths.relocate(value, MOVED) is value
  record = {"workdir": "/cluster/runs/tiny/stages/x", "step": 4}
  assert paths.relocate(record, None) is record


def test_nested_records_are_rewritten_and_keep_their_types():
  config = {"data": {"dir": "/cluster/runs/tiny", "release": "/data/mocheg", "scale": "tiny"},
            "verify": {"clip": "/cluster/runs/tiny/stages/retrieval_image",
                       "shape": [1, 2], "layers": ("/cluster/runs/tiny/a", "b")},
            "seed": 0}
  moved = paths.relocate(config, MOVED)
  assert moved == {"data": {"dir": "/home/me/tiny", "release": "/data/mocheg", "scale": "tiny"},
                   "verify": {"clip": "/home/me/tiny/stages/retrieval_image",
                              "shape": [1, 2], "layers": ("/home/me/tiny/a", "b")},
                   "seed": 0}
  assert config["data"]["dir"] == "/cluster/runs/tiny"  # The input is not changed.


def test_same_record_accepts_either_side_naming_the_old_folder():
  old = {"workdir": "/cluster/runs/tiny/stages/retrieval_text", "step": 10, "task": "t"}
  new = {"workdir": "/home/me/tiny/stages/retrieval_text", "step": 10, "task": "t"}
  assert paths.same_record(old, old, None) and paths.same_record(new, new, MOVED)
  assert paths.same_record(old, new, MOVED)  # The index names the old folder.
  assert paths.same_record(new, old, MOVED)  # And the other way round.
  assert not paths.same_record(old, new, None)  # Not moved: a different encoder.
  assert not paths.same_record(old, {**new, "step": 11}, MOVED)
  elsewhere = {**new, "workdir": "/other/stages/retrieval_text"}
  assert not paths.same_record(old, elsewhere, MOVED)


def test_moved_root(tmp_path):
  assert paths.moved_root(None, str(tmp_path)) is None
  assert paths.moved_root("", str(tmp_path)) is None
  assert paths.moved_root(str(tmp_path), str(tmp_path)) is None
  assert paths.moved_root(str(tmp_path) + "/", str(tmp_path)) is None
  link = tmp_path / "link"
  os.symlink(tmp_path, link)  # The same folder reached by another name has not moved.
  assert paths.moved_root(str(tmp_path), str(link)) is None
  assert paths.moved_root("/cluster/runs/tiny", str(tmp_path)) == ("/cluster/runs/tiny",
                                                                   str(tmp_path))


def test_a_moved_folder_context_reaches_calls_given_no_move():
  old = {"workdir": "/cluster/runs/tiny/stages/rerank"}
  new = {"workdir": "/home/me/tiny/stages/rerank"}
  assert not paths.same_record(old, new, None)
  with paths.moved_folder(MOVED):
    assert paths.same_record(old, new, None)
    assert paths.relocate(old, None) == new
    other = ("/a", "/b")  # A move passed explicitly wins.
    assert paths.relocate("/cluster/runs/tiny", other) == "/cluster/runs/tiny"
  assert paths.relocate(old, None) is old  # Gone after the block.
