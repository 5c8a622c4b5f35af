"""Entry points under mimalloc (mocheg_jax/utils/allocator.py): the re-exec happens once,
keeps the arguments, honours MOCHEG_JAX_MALLOC, and the jitted step whose temporaries
glibc maps afresh every time stops faulting them in."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from mocheg_jax.utils import allocator
from tests import faulting_step
from tests.processes import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="preloads a shared library (Linux)")

# An entry point as the scripts write it; it reports what it runs under and what it got.
_ENTRY = """
import os, sys
if __name__ == "__main__":
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()
import json
from mocheg_jax.utils import allocator
print(json.dumps({"loaded": allocator.loaded(), "argv": sys.argv[1:], "pid": os.getpid(),
                  "purge_delay": os.environ.get("MIMALLOC_PURGE_DELAY"),
                  "preload": os.environ.get("LD_PRELOAD", "")}))
"""

# Eight 64 MB temporaries a step (tests/faulting_step.py), in an entry point.
_STEP = faulting_step.program(
    "if __name__ == '__main__':\n"
    "  from mocheg_jax.utils import allocator\n"
    "  allocator.run_under_preferred_allocator()\n"
    "from mocheg_jax.utils import allocator",
    "{'loaded': allocator.loaded()}")
_TEMPORARY_PAGES = faulting_step.TEMPORARY_PAGES


def _fresh_environment(**env_changes: str | None) -> dict[str, str]:
  """This process's environment without what the allocator's choice reads or the re-exec
  sets (the test session itself runs re-executed under mimalloc: tests/conftest.py)."""
  env = {k: v for k, v in os.environ.items()  # Ours and the re-exec's marker (_TRIED_VAR).
         if k not in ("LD_PRELOAD", "MIMALLOC_PURGE_DELAY")
         and not k.startswith(allocator.ENV_VAR)}
  env.update({k: v for k, v in env_changes.items() if v is not None})
  env["XLA_FLAGS"] = ""
  return env


def _run(tmp_path, source: str, *args: str, **env_changes: str | None):
  script = tmp_path / "entry.py"
  script.write_text(source)
  env = _fresh_environment(**env_changes)
  return subprocess.run([sys.executable, str(script), *args], cwd=REPO, env=env, text=True,
                        capture_output=True)


def _report(result) -> dict:
  assert result.returncode == 0, result.stderr
  return json.loads(result.stdout.splitlines()[-1])


def test_the_dependency_ships_the_library(monkeypatch):
  library = allocator.mimalloc_library()
  assert library and os.path.isfile(library), "cmeel-mimalloc is not installed"
  monkeypatch.delenv(allocator.ENV_VAR, raising=False)
  assert allocator.planned() == "mimalloc"
  monkeypatch.setenv(allocator.ENV_VAR, "glibc")
  assert allocator.planned() == "glibc"


def test_an_entry_point_reexecutes_itself_under_mimalloc_once(tmp_path):
  report = _report(_run(tmp_path, _ENTRY, "--flag=a b", "c"))
  assert report["loaded"] == "mimalloc"
  assert report["argv"] == ["--flag=a b", "c"]  # The arguments survive the re-exec.
  assert report["purge_delay"] == "-1"
  assert report["preload"] == allocator.mimalloc_library()


def test_a_purge_delay_already_set_is_kept(tmp_path):
  report = _report(_run(tmp_path, _ENTRY, MIMALLOC_PURGE_DELAY="250"))
  assert report["loaded"] == "mimalloc" and report["purge_delay"] == "250"


def test_an_entry_point_may_ask_for_another_purge_delay(tmp_path):
  source = _ENTRY.replace("run_under_preferred_allocator()",
                          "run_under_preferred_allocator(purge_delay_ms=10_000)")
  assert _report(_run(tmp_path, source))["purge_delay"] == "10000"
  assert _report(_run(tmp_path, source, MIMALLOC_PURGE_DELAY="250"))["purge_delay"] == "250"


def test_a_process_already_under_mimalloc_is_not_reexecuted(tmp_path):
  library = allocator.mimalloc_library()
  # Started with the preload: the process keeps its pid (no exec) and its environment.
  script = tmp_path / "entry.py"
  script.write_text(_ENTRY)
  env = _fresh_environment(LD_PRELOAD=library)
  child = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  out, err = child.communicate()
  report = json.loads(out.splitlines()[-1])
  assert report["loaded"] == "mimalloc" and report["pid"] == child.pid, err
  assert report["purge_delay"] is None  # Not touched: nothing re-executed.


def test_glibc_when_asked_even_with_an_inherited_preload(tmp_path):
  assert _report(_run(tmp_path, _ENTRY, MOCHEG_JAX_MALLOC="glibc"))["loaded"] == "glibc"
  report = _report(_run(tmp_path, _ENTRY, MOCHEG_JAX_MALLOC="glibc",
                        LD_PRELOAD=allocator.mimalloc_library()))
  assert report["loaded"] == "glibc" and report["preload"] == ""


def test_an_unknown_allocator_is_a_clear_error(tmp_path):
  result = _run(tmp_path, _ENTRY, MOCHEG_JAX_MALLOC="tcmalloc")
  assert result.returncode == 1 and result.stdout == ""
  assert result.stderr.strip() == ("error: MOCHEG_JAX_MALLOC='tcmalloc': expected one of "
                                   "mimalloc, glibc")


def test_under_mimalloc_a_step_reuses_its_freed_temporaries(tmp_path):
  mimalloc = _report(_run(tmp_path, _STEP))
  glibc = _report(_run(tmp_path, _STEP, MOCHEG_JAX_MALLOC="glibc"))
  assert (mimalloc["loaded"], glibc["loaded"]) == ("mimalloc", "glibc")
  # glibc maps every step's temporaries afresh; mimalloc keeps them (0-1 faults a step
  # after six warm-ups, one step of nine 258, 2026-12-06; glibc 131,077 every step).
  assert statistics.median(glibc["faults"]) > _TEMPORARY_PAGES / 2, glibc
  assert statistics.median(mimalloc["faults"]) < _TEMPORARY_PAGES / 20, (mimalloc, glibc)


def test_the_test_session_runs_under_the_allocator_it_plans():
  assert allocator.loaded() == allocator.planned()  # tests/conftest.py re-executed pytest.


def test_a_reexecuted_test_session_keeps_its_output(tmp_path):
  # A session started under glibc re-executes itself in pytest_configure; what it prints
  # after that must still reach its stdout, not the capture files of the first process.
  env = _fresh_environment()
  del env["XLA_FLAGS"]  # The session's own set-up, as a fresh one gets it.
  test = "tests/test_allocator.py::test_the_test_session_runs_under_the_allocator_it_plans"
  result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           test], cwd=REPO, env=env, text=True, capture_output=True)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "1 passed" in result.stdout
