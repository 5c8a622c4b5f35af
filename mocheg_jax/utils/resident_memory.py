"""The process's resident memory now and at its peak, per step of the main job.

The main job runs every stage in one process, and what a stage leaves held (a heap the
allocator has not handed back, caches) adds to the next one's peak: on 2026-12-07 the small
job was OOM-killed at 24 GB by its rewarded generator, a stage that peaks at ~6 GB in a
process of its own. So the job records each step's peak resident memory (results.json,
report.md) instead of leaving it to an outside sampler.

Linux keeps the peak as VmHWM in /proc/self/status and resets it to the current resident
size when "5" is written to /proc/self/clear_refs (Linux >= 4.0). Where it cannot be reset
(another OS, a sandbox without clear_refs) a step has no figure of its own (None: shown as
"-"), rather than the process's peak so far passed off as the step's.
"""

from __future__ import annotations

_GIB = 1024**3


def status_kib(field: str) -> int | None:
  """A "VmRSS:   1234 kB" line of /proc/self/status, in KiB; None off Linux."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1])
  except OSError:
    pass
  return None


def _gib(field: str) -> float | None:
  kib = status_kib(field)
  return None if kib is None else kib * 1024 / _GIB


def current_gb() -> float | None:
  """Resident memory now, GiB; None where /proc is not there."""
  return _gib("VmRSS")


def peak_gb() -> float | None:
  """The peak resident memory since the process started or the last `reset_peak`, GiB;
  None where /proc is not there."""
  return _gib("VmHWM")


def reset_peak() -> bool:
  """Sets the peak to the current resident memory; False where the system cannot."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


_open_windows: list["PeakWindow"] = []


class PeakWindow:
  """`with PeakWindow() as w: ...`, then `w.peak_gb`: the peak resident memory (GiB) of the
  block; None where the system's peak could not be reset at its start.

  Windows nest: opening one resets the process's peak, so it first hands the peak so far to
  the windows open around it.
  """

  def __init__(self):
    self.reset = False
    self.peak_gb: float | None = None
    self._seen = 0.0

  def __enter__(self) -> "PeakWindow":
    so_far = peak_gb() or 0.0
    for outer in _open_windows:
      outer._seen = max(outer._seen, so_far)
    self.reset = reset_peak() and peak_gb() is not None
    _open_windows.append(self)
    return self

  def __exit__(self, *exc) -> None:
    _open_windows.remove(self)
    if self.reset:
      self.peak_gb = round(max(self._seen, peak_gb()), 2)
