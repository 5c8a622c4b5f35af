"""Console progress with rate and ETA for long host-side steps (no dependency, no tqdm)."""

from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator, TextIO, TypeVar

T = TypeVar("T")


def format_seconds(seconds: float) -> str:
  seconds = max(0, int(round(seconds)))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
  """Prints `desc: done/total (pct) rate/s elapsed ETA` at most every `interval` seconds.

  Use as a context manager and call `update(n)`; `total=None` prints counts without ETA.
  """

  def __init__(self, desc: str, total: int | None = None, unit: str = "it",
               interval: float = 2.0, stream: TextIO | None = None, enabled: bool = True):
    self.desc, self.total, self.unit = desc, total, unit
    self.interval, self.enabled = interval, enabled
    self._stream = stream  # None: whatever sys.stderr is when a line is printed.
    self.done = 0
    self._start = self._last = time.monotonic()

  def __enter__(self) -> "Progress":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def update(self, n: int = 1) -> None:
    self.done += n
    now = time.monotonic()
    if now - self._last >= self.interval:
      self._last = now
      self._print(now)

  def line(self, now: float | None = None) -> str:
    now = time.monotonic() if now is None else now
    elapsed = now - self._start
    rate = self.done / elapsed if elapsed > 0 else 0.0
    text = f"{self.desc}: {self.done:,}"
    if self.total:
      text += f"/{self.total:,} ({100.0 * self.done / self.total:.0f}%)"
    text += f" {rate:,.{0 if rate >= 10 else 2}f} {self.unit}/s elapsed {format_seconds(elapsed)}"
    if self.total and rate > 0:
      text += f" ETA {format_seconds((self.total - self.done) / rate)}"
    return text

  def _print(self, now: float) -> None:
    if self.enabled:
      print(self.line(now), file=self._stream or sys.stderr, flush=True)

  def close(self) -> None:
    self._print(time.monotonic())


def track(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it",
          **kwargs) -> Iterator[T]:
  """Yields `items`, reporting progress as they pass."""
  if total is None and hasattr(items, "__len__"):
    total = len(items)  # type: ignore[arg-type]
  with Progress(desc, total=total, unit=unit, **kwargs) as progress:
    for item in items:
      yield item
      progress.update()
