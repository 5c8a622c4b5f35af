"""A jitted step whose temporaries are far over glibc's mmap threshold, as a program for a
subprocess: the allocator tests (test_host_memory.py, test_allocator.py) count the page
faults of each step after a warm-up. Eight 64 MB temporaries: [4096, 4096] float32 arrays,
each the operand of a matrix-vector product (XLA:CPU runs dots as library calls, so it
materialises them)."""

TEMPORARY_PAGES = 8 * 4096 * 4096 * 4 // 4096


def program(setup: str, report: str) -> str:
  """The program: `setup` runs first (before JAX is imported), then 6 warm-up steps and 9
  counted ones; it prints one JSON line with `faults` (per counted step) and `report`'s
  entries (a dict expression)."""
  return f"""
{setup}
import json, resource
import jax, jax.numpy as jnp
@jax.jit
def step(x, v):
  return sum(jnp.sin(x * i) @ v for i in range(8))
x, v = jnp.ones((4096, 4096), jnp.float32), jnp.ones((4096,), jnp.float32)
for _ in range(6):
  step(x, v).block_until_ready()
faults = []
for _ in range(9):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  step(x, v).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(dict(faults=faults, **{report})))
"""
