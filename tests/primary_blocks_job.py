"""One process of tests/test_primary_only.py's 2-process job.

  python tests/primary_blocks_job.py HOST:PORT PROCESS_ID
Prints one JSON line: what each primary_only / primary_first block gave this process.
"""

import json
import sys

import jax
import numpy as np

from mocheg_jax.parallel import distributed


def main(coordinator: str, process_id: int) -> None:
  distributed.maybe_initialize("on", coordinator, 2, process_id)
  ran = []

  def block():
    distributed.sync("nested")  # Process 1 never gets here: the barrier must be skipped.
    ran.append(jax.process_index())
    return {"value": 42, "array": np.arange(3)}

  shared = distributed.primary_only("shared", block)
  first = distributed.primary_first("first", lambda: f"run by {jax.process_index()}")
  try:
    distributed.primary_only("failing", lambda: 1 // 0)
    failure = None
  except (ZeroDivisionError, RuntimeError) as e:
    failure = f"{type(e).__name__}: {e}"
  print(json.dumps({"shared": {"value": shared["value"], "array": shared["array"].tolist()},
                    "ran": ran, "first": first, "failure": failure}))


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]))
