"""Data-layer benchmark: build a synthetic world, read it, rebuild the sentence KB, build TFDS.

  python benchmarks/data_bench.py --scale=paper --workdir=/tmp/mocheg_bench

Each step runs in a fresh process so its peak memory (max RSS) is its own. Reading the KB is
compared side by side with the reference system's way, `pandas.read_csv` of the same file
(ratio = ours / reference time). Prints a table and writes JSON (--out). Targets for the
`paper` scale on 2 cores: reading the 2.79M-sentence KB in under 60 s, under 4 GB peak.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import time
import traceback

from absl import app, flags

_SCALE = flags.DEFINE_enum("scale", "paper", ["tiny", "small", "paper"], "World size.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/mocheg_data_bench", "Scratch folder.")
_OUT = flags.DEFINE_string("out", "benchmarks/out/data_bench.json", "JSON results file.")
_KEEP = flags.DEFINE_bool("keep", False, "Keep the world and TFDS data afterwards.")

READ_TARGET_S = 60.0
READ_TARGET_GB = 4.0


def _world(workdir: str, scale: str) -> dict:
  from mocheg_jax.data.synthetic import write_world
  summary = write_world(os.path.join(workdir, "release"), scale=scale, seed=0, progress=True)
  return {"summary": {k: v for k, v in vars(summary).items()
                      if isinstance(v, (int, float, str))}}


def _read_kb(workdir: str, scale: str) -> dict:
  from mocheg_jax.data.mocheg import MochegRelease
  release = MochegRelease(os.path.join(workdir, "release"))
  rows = chars = 0
  for s in release.iter_sentences():
    rows += 1
    chars += len(s.text)
  return {"rows": rows, "chars": chars, "skipped": len(release.report)}


def _read_kb_pandas(workdir: str, scale: str) -> dict:
  try:
    import pandas as pd  # The reference system's reader (the `bench` extra).
  except ImportError as e:
    return {"error": f"skipped: {e}"}
  from mocheg_jax.data.mocheg import SENTENCE_KB
  frame = pd.read_csv(os.path.join(workdir, "release", SENTENCE_KB))
  return {"rows": len(frame), "chars": int(frame["paragraph"].astype(str).str.len().sum())}


def _rebuild_kb(workdir: str, scale: str) -> dict:
  from mocheg_jax.data.mocheg import MochegRelease, write_sentence_kb
  from mocheg_jax.utils.progress import Progress
  release = MochegRelease(os.path.join(workdir, "release"))
  out = os.path.join(workdir, "rebuilt_sentences.csv")
  with Progress("rebuilding the sentence KB", unit="articles") as progress:
    rows = write_sentence_kb(release, out, progress)
  same = _same_file(out, os.path.join(workdir, "release", "supplementary",
                                      "Corpus3_sentence_level.csv"))
  os.remove(out)
  return {"rows": rows, "identical_to_supplementary": same}


def _same_file(a: str, b: str) -> bool:
  with open(a, "rb") as fa, open(b, "rb") as fb:
    while True:
      x, y = fa.read(1 << 20), fb.read(1 << 20)
      if x != y:
        return False
      if not x:
        return True


def _read_claims(workdir: str, scale: str) -> dict:
  from mocheg_jax.data.mocheg import SPLITS, MochegRelease
  release = MochegRelease(os.path.join(workdir, "release"))
  return {"claims": {s: len(release.claims(s)) for s in SPLITS}, "skipped": len(release.report)}


def _tfds(workdir: str, scale: str) -> dict:
  from mocheg_jax.data import tfds_mocheg
  prepared = tfds_mocheg.build(os.path.join(workdir, "release"), os.path.join(workdir, "tfds"))
  return {name: {s: i.num_examples for s, i in p.builder.info.splits.items()}
          for name, p in prepared.items()}


STEPS = [("world", _world), ("read_kb", _read_kb), ("read_kb_pandas", _read_kb_pandas),
         ("rebuild_kb", _rebuild_kb), ("read_claims", _read_claims), ("tfds", _tfds)]


def _child(fn, workdir, scale, queue) -> None:
  start = time.perf_counter()
  try:
    result = fn(workdir, scale)
  except BaseException:  # Reported by the parent, which would otherwise wait forever.
    queue.put({"failed": traceback.format_exc()})
    raise
  seconds = time.perf_counter() - start
  peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB -> GiB
  queue.put({"seconds": seconds, "peak_gb": peak_gb, "error": None, **result})


def _run_step(fn, workdir: str, scale: str) -> dict:
  ctx = mp.get_context("spawn")  # A fresh interpreter: the peak RSS is this step's alone.
  queue = ctx.Queue()
  proc = ctx.Process(target=_child, args=(fn, workdir, scale, queue))
  proc.start()
  result = queue.get()
  proc.join()
  if "failed" in result:
    raise RuntimeError(f"benchmark step {fn.__name__} failed:\n{result['failed']}")
  if proc.exitcode:
    raise RuntimeError(f"benchmark step {fn.__name__} failed with exit code {proc.exitcode}")
  return result


def main(argv):
  del argv
  workdir, scale = _WORKDIR.value, _SCALE.value
  shutil.rmtree(workdir, ignore_errors=True)
  os.makedirs(workdir)
  results = {}
  for name, fn in STEPS:
    print(f"== {name}", flush=True)
    results[name] = _run_step(fn, workdir, scale)
  ours, ref = results["read_kb"], results["read_kb_pandas"]
  ours_over_ref = ours["seconds"] / ref["seconds"] if not ref.get("error") else None
  print("\n| step | seconds | peak GB | notes |\n|---|---|---|---|")
  for name, _ in STEPS:
    r = results[name]
    note = r.get("error") or ""
    if name == "read_kb":
      ok = r["seconds"] < READ_TARGET_S and r["peak_gb"] < READ_TARGET_GB
      note = (f"{r['rows']:,} rows; target < {READ_TARGET_S:.0f} s and < {READ_TARGET_GB} GB: "
              f"{'met' if ok else 'MISSED'}")
      if ours_over_ref is not None:
        note += (f"; time ours/pandas.read_csv {ours_over_ref:.2f} (peak memory "
                 f"{r['peak_gb'] / ref['peak_gb']:.2f})")
    elif name == "rebuild_kb":
      note = f"{r['rows']:,} rows; identical to supplementary: {r['identical_to_supplementary']}"
    print(f"| {name} | {r['seconds']:.1f} | {r['peak_gb']:.2f} | {note} |")
  payload = {"scale": scale, "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
             "steps": results}
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(payload, f, indent=2)
  print(f"\nwrote {_OUT.value}")
  if not _KEEP.value:
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
