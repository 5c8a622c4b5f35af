"""Test set-up: 8 fake CPU devices, as DESIGN.md asks, before JAX is imported anywhere."""

import atexit
import os
import shutil
import tempfile

# None of these imports JAX: the set-up below comes first.
from mocheg_jax.utils import allocator, host_memory
from mocheg_jax.utils.host_devices import host_device_flags
from tests import tiny_job
from tests.processes import FAST_COMPILE_FLAGS

# The legacy CPU fusion path compiles the suite's many small programs faster (measured:
# test_explanation_generator + test_decoding 188 s -> 127 s on 2 cores); jax is pinned
# below 0.11 in pyproject.toml, where XLA still knows the flag. FAST_COMPILE_FLAGS: see there.
os.environ.setdefault("XLA_FLAGS", f"{host_device_flags(8)} "
                      f"--xla_cpu_use_fusion_emitters=false {FAST_COMPILE_FLAGS}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
host_memory.keep_freed_memory_if_asked()  # As the scripts do (mocheg_jax/utils/host_memory.py).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402  (after the environment set-up above)


def pytest_configure(config):
  """The session runs under the scripts' allocator (mocheg_jax/utils/allocator.py; measured
  2026-12-06: four test files 206-212 s under glibc, 191-194 s under mimalloc), then gets
  its compilation cache."""
  _run_under_preferred_allocator(config)
  _share_one_compilation_cache()


def _run_under_preferred_allocator(config):
  """Re-executes pytest under mimalloc, as the scripts re-execute themselves. Here, not at
  the top of this file: while pytest loads this file it captures the output descriptors
  (the re-executed process would write into pytest's capture files); by pytest_configure it
  has handed them back, and no test module, so no JAX, is imported yet."""
  try:
    if not allocator.reexecution_needed():
      return
  except allocator.AllocatorError as e:
    raise pytest.UsageError(str(e)) from None
  capture = config.pluginmanager.getplugin("capturemanager")
  if capture is not None:
    capture.stop_global_capturing()
  allocator.run_under_preferred_allocator()


def _share_one_compilation_cache():
  """One persistent compilation cache for the session's tests and every script they start
  (processes.script_environment passes it on): many tests compile the same tiny programs
  (measured: the trainer, verifier and explanation tests 787 -> 636 s). A size limit is what
  makes JAX lock the cache's files, so a process never reads an entry another is writing.
  After the re-exec: the process that makes the folder is the one that removes it."""
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return
  folder = tempfile.mkdtemp(prefix="mocheg_jax_compilation_cache_")
  atexit.register(shutil.rmtree, folder, ignore_errors=True)
  os.environ.update(JAX_COMPILATION_CACHE_DIR=folder,
                    JAX_COMPILATION_CACHE_MAX_SIZE=str(8 << 30),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


@pytest.fixture(scope="module")
def one_torch_thread():
  """Tiny torch ops are far slower multi-threaded on a busy 2-core machine."""
  import torch
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


# The session's shared runs (tests/tiny_job.py): the fixture that waits for each, and how to
# start it.
_SHARED_RUNS = {"tiny_main_job": tiny_job.start_one_process,
                "two_process_job": tiny_job.start_two_processes}


def pytest_collection_modifyitems(items):
  """The tests on the shared runs go last, those on both runs at the very end: the longer
  the other tests take, the more of the runs is done in the background by then."""
  items.sort(key=lambda item: sum(name in _SHARED_RUNS for name in item.fixturenames))


@pytest.fixture(scope="session", autouse=True)
def _shared_runs(request, tmp_path_factory):
  """Starts, at the session's first test, the shared runs some collected test needs; they go
  on in the background (tests/tiny_job.py says why) and are killed at the session's end."""
  needed = {name for item in request.session.items for name in item.fixturenames
            if name in _SHARED_RUNS}
  started = {name: _SHARED_RUNS[name](tmp_path_factory.mktemp(name)) for name in sorted(needed)}
  yield started
  for run in started.values():
    run.kill()


@pytest.fixture(scope="session")
def tiny_main_job(_shared_runs):
  """The tiny main job with a few steps per training, one process (tests/tiny_job.py)."""
  return _shared_runs["tiny_main_job"].result()


@pytest.fixture(scope="session")
def two_process_job(_shared_runs):
  """The same job as 2 JAX processes x 1 CPU device (tests/tiny_job.py)."""
  return _shared_runs["two_process_job"].result()
