"""Programs that run once, such as a model's parameter initialisation: compiled cheaply.

A jitted init draws every parameter with threefry, which XLA's CPU backend spends seconds
optimising for a program that then runs for milliseconds. Measured on 2 CPU cores
(2026-12-05): the tiny text retriever's init compiled in 5.4 s and ran in 0.01 s; without
the costly optimisations, 1.8 s and 0.06 s; the tiny generator's 6.5-6.9 s against 3.3 s.
The tiny main job compiles eleven of them. The values can differ from the optimised
program's in the last bit (7e-9 at most, measured), never more.

Only on CPU: the accelerators' compilers were not measured with these options.
"""

from __future__ import annotations

from typing import Any

import jax

# XLA options (DebugOptions fields) that skip the CPU backend's costly optimisation passes.
CHEAP_CPU_COMPILE = {"xla_backend_optimization_level": 0,
                     "xla_llvm_disable_expensive_passes": True}


def run_once(jitted: Any, *args: Any) -> Any:
  """`jitted(*args)`, compiled without the costly optimisations where they run on CPU."""
  lowered = jitted.lower(*args)
  if jax.default_backend() != "cpu":
    return lowered.compile()(*args)
  return lowered.compile(compiler_options=CHEAP_CPU_COMPILE)(*args)
