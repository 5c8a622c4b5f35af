"""The main job's per-step peak resident memory (mocheg_jax/utils/resident_memory.py)."""

import contextlib
import mmap
import sys

import pytest

from mocheg_jax.utils import resident_memory

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self/status")


@contextlib.contextmanager
def _resident(gib: float):
  """`gib` GiB of fresh pages, all written (resident), unmapped at the end. Mapped directly,
  not through malloc, whose allocator may hand back pages that an earlier test left it."""
  size = int(gib * 1024**3)
  block = mmap.mmap(-1, size)
  try:
    for offset in range(0, size, mmap.PAGESIZE):
      block[offset] = 1
    yield
  finally:
    block.close()


@linux_only
def test_current_and_peak_follow_a_block_of_memory():
  before = resident_memory.current_gb()
  with _resident(0.25):
    assert resident_memory.current_gb() - before > 0.2
    assert resident_memory.peak_gb() >= resident_memory.current_gb() - 1e-3
  assert resident_memory.current_gb() - before < 0.05


@linux_only
def test_window_sees_a_block_freed_inside_it_and_resets_after():
  with resident_memory.PeakWindow() as window:
    baseline = resident_memory.current_gb()
    with _resident(0.3):  # Unmapped before the window ends: only the peak remembers it.
      pass
  if not window.reset:
    pytest.skip("this system cannot reset the peak (/proc/self/clear_refs)")
  assert window.peak_gb >= baseline + 0.25
  with resident_memory.PeakWindow() as quiet:
    with _resident(0.01):
      pass
  assert quiet.peak_gb < window.peak_gb - 0.2  # The first block is not in this window.


@linux_only
def test_an_outer_window_keeps_what_came_before_an_inner_one():
  with resident_memory.PeakWindow() as outer:
    baseline = resident_memory.current_gb()
    with _resident(0.3):
      pass
    with resident_memory.PeakWindow() as inner:  # Resets the system's peak.
      with _resident(0.01):
        pass
  if not (outer.reset and inner.reset):
    pytest.skip("this system cannot reset the peak (/proc/self/clear_refs)")
  assert inner.peak_gb < baseline + 0.2
  assert outer.peak_gb >= baseline + 0.25  # Handed over when the inner window opened.
  assert outer.peak_gb >= inner.peak_gb
