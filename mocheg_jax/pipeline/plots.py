"""The report's figures as PNG bytes: recall@K curves, confusion matrices, training curves.

Figures are built on `matplotlib.figure.Figure` directly, not pyplot: a Figure needs no
backend and keeps no global state, so drawing a report never changes the plotting setup of
the process that called it (a notebook, the main job) and works without a display.
"""

from __future__ import annotations

import io
import math
from typing import Mapping, Sequence

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from mocheg_jax.data.labels import LABEL_NAMES

DPI = 110


def _png(fig: Figure) -> bytes:
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
  return buffer.getvalue()


def recall_curves(curves: Mapping[str, Mapping]) -> bytes:
  """One line per modality: recall@K against K.

  Args:
    curves: modality -> {"system", "k": [K...], "recall": [R@K...], "num_scored"}.
  """
  fig = Figure(figsize=(6.0, 4.0))
  ax = fig.subplots()
  for (modality, curve), marker in zip(curves.items(), "os^dv"):
    ax.plot(curve["k"], curve["recall"], marker=marker,
            label=f"{modality}: {curve['system']} ({curve['num_scored']} claims)")
  ax.set_xticks(list(range(1, 1 + max(max(c["k"]) for c in curves.values()))))
  ax.set_ylim(0.0, 1.0)
  ax.set_xlabel("K (items retrieved per claim)")
  ax.set_ylabel("recall@K")
  ax.set_title("Evidence retrieval on the test split: recall@K")
  ax.grid(alpha=0.3)
  ax.legend(loc="upper left", fontsize=9)
  return _png(fig)


def confusion_matrices(panels: Mapping[str, Sequence[Sequence[int]]], system: str) -> bytes:
  """Side-by-side 3x3 confusion matrices, counts written in the cells.

  Args:
    panels: panel title (e.g. "gold evidence") -> matrix, rows gold and columns predicted,
      both in `LABEL_NAMES` order.
    system: the Table 4 row's system name, for the figure title.
  """
  fig = Figure(figsize=(4.4 * len(panels), 4.0), layout="constrained")
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  for ax, (title, matrix) in zip(axes, panels.items()):
    top = max(1, max(max(row) for row in matrix))
    ax.imshow(matrix, cmap="Blues", vmin=0, vmax=top)
    for i, row in enumerate(matrix):
      for j, count in enumerate(row):
        # Dark cells get white text so every count stays readable.
        ax.text(j, i, str(count), ha="center", va="center", fontsize=12,
                color="white" if count > 0.6 * top else "black")
    ticks = list(range(len(LABEL_NAMES)))
    ax.set_xticks(ticks, LABEL_NAMES)
    ax.set_yticks(ticks, LABEL_NAMES)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    accuracy = sum(matrix[i][i] for i in ticks) / max(1, sum(map(sum, matrix)))
    ax.set_title(f"{title} (accuracy {100 * accuracy:.1f}%)", fontsize=10)
  fig.suptitle(f"Table 4, {system}: confusion on the test split")
  return _png(fig)


def _series(records: Sequence[Mapping], key: str) -> tuple[list[int], list[float]]:
  points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
  return [s for s, _ in points], [float(v) for _, v in points]


def _is_fraction(values: Sequence[float]) -> bool:
  return all(math.isnan(v) or 0.0 <= v <= 1.0 for v in values)


def training_curves(stage: str, records: Sequence[Mapping], dev_keys: Sequence[str]) -> bytes:
  """Train loss against step and, beside it, the dev metrics the trainer logged.

  Dev metrics that are fractions (recall, F1, ROUGE, agreement) share one panel on a [0, 1]
  axis; the others (token counts, rewards) get their own panel, since on a shared axis a
  count of 80 would flatten every fraction to a line at the bottom.

  Args:
    stage: the stage folder's name, for the title.
    records: `train.writer.read_metrics` records, with "step".
    dev_keys: the "dev/..." keys to draw, in legend order.
  """
  dev = {key: _series(records, key) for key in dev_keys}
  fractions = {k: v for k, v in dev.items() if _is_fraction(v[1])}
  others = {k: v for k, v in dev.items() if k not in fractions}
  groups = [g for g in (fractions, others) if g]
  # Constrained layout makes room for the legends outside the panels.
  fig = Figure(figsize=(5.0 + 6.0 * len(groups), 3.8), layout="constrained")
  axes = fig.subplots(1, 1 + len(groups), squeeze=False, sharex=True)[0]  # One step axis.
  steps, loss = _series(records, "loss")
  axes[0].plot(steps, loss, marker=".", color="tab:red")
  axes[0].set_title("train loss")
  axes[0].set_xlabel("step")
  axes[0].grid(alpha=0.3)
  for ax, group in zip(axes[1:], groups):
    # Past 10 lines the default colour cycle repeats: two metrics would share a colour.
    colors = colormaps["tab10" if len(group) <= 10 else "tab20"].colors
    for (key, (x, y)), color in zip(group.items(), colors):
      # Dev evaluations are few (every eval_every steps): markers show where they are.
      ax.plot(x, y, marker="o", markersize=3, color=color, label=key[len("dev/"):])
    if group is fractions:
      ax.set_ylim(-0.02, 1.02)
    ax.set_title("dev metrics" + ("" if group is fractions else " (not fractions)"))
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              ncol=2 if len(group) > 10 else 1, borderaxespad=0.0)
  for ax in axes:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # Steps are whole numbers.
  fig.suptitle(f"training: {stage}")
  return _png(fig)
