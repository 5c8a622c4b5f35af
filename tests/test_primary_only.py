"""distributed.primary_only / primary_first across two JAX processes (CPU, gloo)."""

from __future__ import annotations

import json

from tests.processes import Runs, environment, free_port

TIMEOUT_S = 180


def test_process_zero_runs_the_block_and_every_process_gets_its_result(tmp_path):
  runs = Runs(tmp_path, TIMEOUT_S)
  coordinator = f"localhost:{free_port()}"
  try:
    for process in range(2):
      runs.start(f"process{process}", "tests/primary_blocks_job.py",
                 [coordinator, str(process)], environment(1, tmp_path / "jax_cache"))
    outputs = runs.wait()
  finally:
    runs.kill()
  got = [json.loads(outputs[f"process{i}"].strip().splitlines()[-1]) for i in range(2)]
  for result in got:  # Process 0's result, on both.
    assert result["shared"] == {"value": 42, "array": [0, 1, 2]}
  assert got[0]["ran"] == [0] and got[1]["ran"] == []  # Only process 0 ran the block.
  # primary_first: process 0 first, then the others, each with its own result.
  assert [r["first"] for r in got] == ["run by 0", "run by 1"]
  assert got[0]["failure"] == "ZeroDivisionError: integer division or modulo by zero"
  assert got[1]["failure"] == ("RuntimeError: process 0 failed in 'failing': "
                               "ZeroDivisionError: integer division or modulo by zero")
