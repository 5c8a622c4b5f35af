"""The data entry points run as a user runs them: subprocesses, exit codes, one-line errors."""

import os
import subprocess
import sys

from tests.release_fixture import write_release

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
  env = dict(os.environ, PYTHONPATH=REPO)
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300)


def test_prepare_data_builds_and_reports(tmp_path):
  write_release(str(tmp_path / "release"))
  out = _run("scripts/prepare_data.py", f"--release={tmp_path / 'release'}",
             f"--data_dir={tmp_path / 'tfds'}", "--configs=claims,kb_images")
  assert out.returncode == 0, out.stderr
  assert "claims: train=3, val=1, test=1" in out.stdout
  assert "kb_images: kb=2" in out.stdout
  assert "skipped 3 records: " in out.stdout  # the logo, the thumbnail, the broken file


def test_prepare_data_bad_input_is_one_line(tmp_path):
  out = _run("scripts/prepare_data.py", f"--release={tmp_path / 'missing'}",
             f"--data_dir={tmp_path / 'tfds'}")
  assert out.returncode == 1
  assert out.stderr.strip().splitlines()[-1].startswith("error: ")
  assert "Traceback" not in out.stderr
  write_release(str(tmp_path / "release"))
  os.remove(tmp_path / "release" / "train" / "Corpus2.csv")
  out = _run("scripts/prepare_data.py", f"--release={tmp_path / 'release'}",
             f"--data_dir={tmp_path / 'tfds'}", "--configs=claims")
  assert out.returncode == 1 and "Traceback" not in out.stderr
  assert "train/Corpus2.csv: missing file" in out.stderr
