"""The pipeline manifest: written by the main job, every part checked when read."""

import json

import pytest

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.pipeline import manifest as manifest_lib
from mocheg_jax.retrieval.index import MANIFEST_FILE
from mocheg_jax.train.loop import CHECKPOINT_DIR


def _pipeline_folder(root):
  """The folders a finished main job leaves (only the markers the manifest checks)."""
  (root / manifest_lib.RELEASE).mkdir(parents=True)
  for stage in manifest_lib.STAGES.values():
    (root / stage / CHECKPOINT_DIR).mkdir(parents=True)
  for index in manifest_lib.INDEXES.values():
    (root / index).mkdir(parents=True)
    (root / index / MANIFEST_FILE).write_text("{}")
  return root


def test_written_manifest_reads_back_with_absolute_paths(tmp_path):
  root = _pipeline_folder(tmp_path / "run")
  manifest_lib.write_manifest(str(root), scale="tiny", seed=3,
                              settings=manifest_lib.Settings(text_top_k=7, rerank_weight=0.0))
  read = manifest_lib.read_manifest(str(root))
  assert read.stages["verifier"] == str(root / "stages" / "verify_text_image")
  # The verifier that wrote the system labels, when not the text+image one.
  with pytest.raises(MochegInputError, match=r"stage 'verifier' \(.*verify_text\) is missing"):
    manifest_lib.write_manifest(str(root), scale="tiny", seed=3,
                                verifier="stages/verify_text")
  (root / "stages" / "verify_text" / CHECKPOINT_DIR).mkdir(parents=True)
  manifest_lib.write_manifest(str(root), scale="tiny", seed=3, verifier="stages/verify_text",
                              settings=manifest_lib.Settings(text_top_k=7, rerank_weight=0.6,
                                                             image_articles=2,
                                                             matmul_precision="bfloat16"))
  read = manifest_lib.read_manifest(str(root))
  assert read.stages["verifier"] == str(root / "stages" / "verify_text")
  assert read.indexes["image"] == str(root / "index" / "image")
  assert read.release == str(root / "release")
  assert (read.scale, read.seed, read.settings.text_top_k) == ("tiny", 3, 7)
  assert read.settings.rerank_weight == 0.6 and read.settings.image_articles == 2
  assert read.settings.matmul_precision == "bfloat16"
  assert not (root / "manifest.json.tmp").exists()


def test_missing_parts_are_named(tmp_path):
  with pytest.raises(MochegInputError, match="no such pipeline folder"):
    manifest_lib.read_manifest(str(tmp_path / "nowhere"))
  root = _pipeline_folder(tmp_path / "run")
  with pytest.raises(MochegInputError, match="manifest.json: missing"):
    manifest_lib.read_manifest(str(root))
  manifest_lib.write_manifest(str(root), scale="tiny", seed=0)
  (root / "stages" / "rerank" / CHECKPOINT_DIR).rmdir()
  with pytest.raises(MochegInputError, match=r"stage 'reranker' \(.*rerank\) is missing or "
                     r"unfinished \(no checkpoints: not a training run\)"):
    manifest_lib.read_manifest(str(root))
  (root / "stages" / "rerank" / CHECKPOINT_DIR).mkdir()
  (root / "index" / "image" / MANIFEST_FILE).unlink()
  with pytest.raises(MochegInputError, match="index 'image' .* not a finished index"):
    manifest_lib.read_manifest(str(root))


def test_recorded_move_of_an_unfinished_or_broken_folder(tmp_path):
  assert manifest_lib.recorded_move(str(tmp_path)) is None  # No manifest yet.
  (tmp_path / "manifest.json").write_text("[1, 2")
  with pytest.raises(MochegInputError, match="manifest.json: unreadable manifest"):
    manifest_lib.recorded_move(str(tmp_path))


def test_malformed_manifests_are_refused(tmp_path):
  root = _pipeline_folder(tmp_path / "run")
  path = root / "manifest.json"
  manifest_lib.write_manifest(str(root), scale="tiny", seed=0)
  good = json.loads(path.read_text())
  path.write_text("{not json")
  with pytest.raises(MochegInputError, match="unreadable manifest"):
    manifest_lib.read_manifest(str(root))
  for change, message in ((dict(format=99), "not a format-1 pipeline manifest"),
                          (dict(stages={"verifier": "x"}), r"stages lacks \['generator'"),
                          (dict(settings={"text_top_k": 0}), "text_top_k must be >= 1"),
                          (dict(settings={"rerank": 0}), "rerank must be true or false"),
                          (dict(settings={"rerank_weight": 1.5}),
                           r"rerank_weight must be a number in \[0, 1\]"),
                          (dict(settings={"rerank_weight": True}), "rerank_weight must be"),
                          (dict(settings={"image_articles": -1}), "image_articles must be >= 0"),
                          (dict(settings={"matmul_precision": 16}),
                           "matmul_precision must be a string"),
                          (dict(settings={"top": 1}), "bad settings"),
                          (dict(release="gone"), "the release folder 'gone' is missing")):
    path.write_text(json.dumps({**good, **change}))
    with pytest.raises(MochegInputError, match=message):
      manifest_lib.read_manifest(str(root))


def test_a_manifest_from_before_the_fused_ranking_reads_its_rerank_switch(tmp_path):
  root = _pipeline_folder(tmp_path / "run")
  path = root / "manifest.json"
  manifest_lib.write_manifest(str(root), scale="tiny", seed=0)
  written = json.loads(path.read_text())
  for rerank, weight in ((True, 1.0), (False, 0.0)):
    settings = {k: v for k, v in written["settings"].items() if k != "rerank_weight"}
    path.write_text(json.dumps({**written, "settings": {**settings, "rerank": rerank}}))
    assert manifest_lib.read_manifest(str(root)).settings.rerank_weight == weight


def test_a_copied_folder_knows_where_it_was_written(tmp_path):
  import shutil

  root = _pipeline_folder(tmp_path / "run")
  manifest_lib.write_manifest(str(root), scale="tiny", seed=0)
  assert json.loads((root / "manifest.json").read_text())["written_at"] == str(root)
  assert manifest_lib.read_manifest(str(root)).moved is None  # Read in place.
  assert manifest_lib.recorded_move(str(root)) is None
  shutil.copytree(root, tmp_path / "copy")
  shutil.rmtree(root)
  read = manifest_lib.read_manifest(str(tmp_path / "copy"))
  assert read.moved == (str(root), str(tmp_path / "copy"))
  assert manifest_lib.recorded_move(str(tmp_path / "copy")) == read.moved
  # The main job rerun in the copy writes its manifest again: the records it kept still
  # name the old root, so the manifest does too.
  manifest_lib.write_manifest(str(tmp_path / "copy"), scale="tiny", seed=0, moved=read.moved)
  assert manifest_lib.read_manifest(str(tmp_path / "copy")).moved == read.moved
  assert read.release == str(tmp_path / "copy" / "release")
  assert read.stages["reranker"] == str(tmp_path / "copy" / "stages" / "rerank")
  # A manifest written before `written_at` existed still loads, as not moved.
  path = tmp_path / "copy" / "manifest.json"
  path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items()
                              if k != "written_at"}))
  assert manifest_lib.read_manifest(str(tmp_path / "copy")).moved is None


def test_a_release_inside_the_folder_moves_with_it_one_outside_stays(tmp_path):
  import shutil

  root = _pipeline_folder(tmp_path / "run")
  (root / "data" / "mocheg").mkdir(parents=True)
  manifest_lib.write_manifest(str(root), scale="tiny", seed=0,
                              release=str(root / "data" / "mocheg"))
  assert json.loads((root / "manifest.json").read_text())["release"] == "data/mocheg"
  outside = tmp_path / "datasets" / "mocheg"
  outside.mkdir(parents=True)
  manifest_lib.write_manifest(str(root), scale="tiny", seed=0, release=str(outside))
  shutil.move(root, tmp_path / "moved")
  read = manifest_lib.read_manifest(str(tmp_path / "moved"))
  assert read.moved == (str(root), str(tmp_path / "moved"))
  assert read.release == str(outside)
  # An absolute release inside the old folder (a manifest written by hand or older code)
  # is read inside the new one.
  path = tmp_path / "moved" / "manifest.json"
  path.write_text(json.dumps({**json.loads(path.read_text()),
                              "release": str(root / "data" / "mocheg")}))
  assert manifest_lib.read_manifest(str(tmp_path / "moved")).release == \
      str(tmp_path / "moved" / "data" / "mocheg")
