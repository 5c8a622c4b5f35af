"""Sharding and multi-process support: the device mesh, logical axis rules, distributed JAX.

* mesh.py: the ("data", "fsdp", "tensor") mesh from the config's `mesh` block, with ICI
  (within a slice / host) and DCN (across slices / processes) sizes; all axes are Auto.
* rules.py: logical axis names (what models use) -> PartitionSpecs / NamedShardings, from
  config rules with first-usable-rule-wins semantics and a divisibility fallback.
* distributed.py: jax.distributed start-up (auto-detected on Cloud TPU, SLURM, Open MPI),
  the primary process, global batches from per-process rows, barriers.

Typical use (DESIGN.md, convention 4: parameters are created already sharded):

  mesh = mesh_lib.make_mesh(config.mesh)
  abstract = nnx.eval_shape(lambda: Model(cfg, rngs=nnx.Rngs(0)))
  state = nnx.state(abstract, nnx.Param)
  placed = rules.shardings(nnx.get_partition_spec(state), state, mesh, config.sharding.rules)
  params = jax.jit(init, out_shardings=placed)()
"""
