"""Where a profiled program spent its device time: kernel time by XLA op, from an xplane.pb.

  python benchmarks/profile_summary.py PATH.xplane.pb[.gz] [--top=25] [--steps=3] [--hlo=H.txt.gz]

`jax.profiler.trace` writes the trace as an XSpace protobuf; jax.profiler.ProfileData reads
it without TensorBoard. On a GPU every kernel is an event on a stream line of a "/device:GPU:N"
plane carrying the HLO op it implements (stat `hlo_op`); on the CPU backend (no device plane) the
thunk events on the host planes carry it instead, which lets tests run this on CPU. Time
is summed per HLO op (a fusion, a custom call such as a cuBLAS GEMM or a cuDNN kernel) and
per kind, the kind guessed from the op and kernel names (matmul, attention, reduction,
copy/transpose, other fusion). Given the program's optimised HLO text, each row also names
its instruction: shape, opcode, fusion kind and the JAX operation it came from (op_name).
"""

from __future__ import annotations

import collections
import re
import sys

KINDS = (  # (kind, pattern on "hlo_op kernel_name", lowercased), first match wins.
    ("attention", r"cudnn.*(fmha|attention)|flash|fmha|sdpa"),
    ("matmul", r"gemm|cublas|cutlass|xmma|nvjet|matmul|dot|convolution|conv"),
    ("copy/transpose", r"copy|transpose|memcpy|memset|dynamic.update.slice|concatenate"),
    ("reduction", r"reduce|reduction|scatter|sort|topk|top.k"),
)


def kind_of(op: str, kernel: str) -> str:
  text = f"{op} {kernel}".lower()
  for kind, pattern in KINDS:
    if re.search(pattern, text):
      return kind
  return "other fusion" if "fusion" in text else "other"


def _stats(event) -> dict:
  return {name: value for name, value in event.stats}


def device_op_times(path: str) -> list[dict]:
  """[{op, kernel, kind, count, total_ms}] over every kernel of the trace, costliest first."""
  import gzip

  from jax.profiler import ProfileData
  if path.endswith(".gz"):
    with gzip.open(path, "rb") as f:
      data = ProfileData.from_serialized_xspace(f.read())
  else:
    data = ProfileData.from_file(path)
  planes = [p for p in data.planes if p.name.startswith("/device:")]
  on_device = bool(planes)
  planes = planes or list(data.planes)
  totals: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
  for plane in planes:
    lines = list(plane.lines)
    # A GPU plane has one line per stream (the kernels) and may have derived lines that
    # repeat them (XLA modules, ops, steps): count the streams only.
    streams = [line for line in lines if line.name.startswith("Stream")]
    for line in streams or lines:
      for event in line.events:
        stats = _stats(event)
        op = stats.get("hlo_op")
        if op is None and not on_device:
          continue  # Host-side Python and runtime events: not the program's work.
        entry = totals[(str(op or event.name), event.name)]
        entry[0] += 1
        entry[1] += event.duration_ns / 1e6
  rows = [dict(op=op, kernel=kernel, kind=kind_of(op, kernel), count=count, total_ms=ms)
          for (op, kernel), (count, ms) in totals.items()]
  return sorted(rows, key=lambda r: -r["total_ms"])


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*"
                          r"(?P<shape>\((?:[^()]|\([^()]*\))*\)|\S+)\s+"  # A tuple or one.
                          r"(?P<opcode>[\w\-]+)\(")
_FUSION_KIND = re.compile(r"\bkind=(k\w+)")
_OP_NAME = re.compile(r'\bop_name="([^"]*)"')


def _kernel_key(name: str) -> str:
  return re.sub(r"[.\-]", "_", name)  # XLA:GPU names a fusion's kernel after it, '.' -> '_'.


def hlo_index(hlo_text: str) -> dict[str, str]:
  """{kernel name: "shape opcode(kind) <- op_name"} for every instruction of an optimised HLO
  module (`compiled.as_text()`): what a profile's numbered fusions are made of."""
  index = {}
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    kind = _FUSION_KIND.search(line)
    op_name = _OP_NAME.search(line)
    index[_kernel_key(match["name"])] = (
        f"{match['shape']} {match['opcode']}{f'({kind[1]})' if kind else ''}"
        f"{f' <- {op_name[1]}' if op_name else ''}")
  return index


def annotate(rows: list[dict], index: dict[str, str]) -> list[dict]:
  """Each row with `hlo`: its kernel's (or else its op's) instruction from `hlo_index`."""
  return [dict(r, hlo=index.get(_kernel_key(r["kernel"])) or index.get(_kernel_key(r["op"])))
          for r in rows]


def summarize(rows: list[dict], steps: int, top: int = 25) -> dict:
  """Per-step totals by kind and the `top` costliest ops."""
  total = sum(r["total_ms"] for r in rows)
  kinds: dict[str, float] = collections.defaultdict(float)
  for r in rows:
    kinds[r["kind"]] += r["total_ms"]
  return dict(
      steps=steps, kernel_ms_per_step=total / steps,
      kinds={k: dict(ms_per_step=v / steps, share=v / total if total else 0.0)
             for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
      top=[dict(r, ms_per_step=r["total_ms"] / steps, share=r["total_ms"] / total
                if total else 0.0) for r in rows[:top]])


def table(summary: dict) -> str:
  lines = [f"kernel time per step {summary['kernel_ms_per_step']:.2f} ms: " + ", ".join(
      f"{k} {v['share']:.0%}" for k, v in summary["kinds"].items()),
      "| op | kernel | kind | count/step | ms/step | share | HLO |",
      "|---|---|---|---|---|---|---|"]
  for r in summary["top"]:
    lines.append(f"| {r['op'][:60]} | {r['kernel'][:60]} | {r['kind']} | "
                 f"{r['count'] / summary['steps']:g} | {r['ms_per_step']:.3f} | "
                 f"{r['share']:.1%} | {(r.get('hlo') or '-')[-120:]} |")
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  import argparse
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("path")
  parser.add_argument("--top", type=int, default=25)
  parser.add_argument("--steps", type=int, default=1, help="Steps the trace holds.")
  parser.add_argument("--hlo", help="The program's optimised HLO text (.txt or .txt.gz).")
  args = parser.parse_args(argv)
  rows = device_op_times(args.path)
  if args.hlo:
    import gzip
    opener = gzip.open if args.hlo.endswith(".gz") else open
    with opener(args.hlo, "rt") as f:
      rows = annotate(rows, hlo_index(f.read()))
  print(table(summarize(rows, args.steps, args.top)))


if __name__ == "__main__":
  main(sys.argv[1:])
