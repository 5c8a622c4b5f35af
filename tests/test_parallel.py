"""Mesh construction, logical-axis rules and the multi-process helpers (8 fake CPU devices)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from mocheg_jax.models import bert
from mocheg_jax.parallel import distributed
from mocheg_jax.parallel import mesh as mesh_lib
from mocheg_jax.parallel import rules as rules_lib


def _mesh_config(**sizes):
  c = mesh_lib.default_config()
  for name, value in sizes.items():
    c[name] = value
  return c


# ----------------------------------------------------------------------------- resolve_shape

@pytest.mark.parametrize("sizes, devices, expected", [
    ({}, 8, (8, 1, 1)),
    (dict(data=1, fsdp=-1), 8, (1, 8, 1)),
    (dict(data=2, fsdp=2, tensor=2), 8, (2, 2, 2)),
    (dict(data=-1, fsdp=2, tensor=1), 8, (4, 2, 1)),
    (dict(data=2, fsdp=1, tensor=-1), 8, (2, 1, 4)),
    (dict(dcn_data=2), 8, (4, 1, 1)),  # -1 takes the devices of one slice.
    (dict(data=2, fsdp=2, tensor=2, dcn_fsdp=2), 16, (2, 2, 2)),
])
def test_resolve_shape(sizes, devices, expected):
  shape = mesh_lib.resolve_shape(_mesh_config(**sizes), devices)
  assert tuple(shape) == mesh_lib.AXES
  assert tuple(shape.values()) == expected


def test_resolve_shape_accepts_a_whole_config():
  import ml_collections
  config = ml_collections.ConfigDict({"mesh": _mesh_config(data=4, fsdp=-1)})
  assert mesh_lib.resolve_shape(config, 8) == {"data": 4, "fsdp": 2, "tensor": 1}


@pytest.mark.parametrize("sizes, devices, message", [
    (dict(data=2, fsdp=2, tensor=1), 8,
     r"mesh.data=2 x mesh.fsdp=2 x mesh.tensor=1 = 4 devices, but there are 8 devices"),
    (dict(data=-1, fsdp=3), 8, r"mesh.fsdp=3.*do not divide the 8 devices per slice"),
    (dict(data=-1, fsdp=-1), 8, r"mesh.data, mesh.fsdp"),
    (dict(data=0), 8, r"mesh.data must be a positive size or -1, got 0"),
    (dict(tensor=-2), 8, r"mesh.tensor must be a positive size or -1, got -2"),
    (dict(dcn_data=3), 8, r"8 devices cannot be split into 3 .*mesh.dcn_data=3"),
    (dict(dcn_fsdp=0), 8, r"mesh.dcn_fsdp must be >= 1"),
    (dict(data=4, dcn_data=2), 16, r"mesh.data=4 .* = 4 devices, but there are 8 devices per "
     r"slice \(16 devices / 2 slices\)"),
])
def test_resolve_shape_errors_name_fields_and_devices(sizes, devices, message):
  with pytest.raises(ValueError, match=message):
    mesh_lib.resolve_shape(_mesh_config(**sizes), devices)


def test_resolve_shape_plain_dict_and_bad_types():
  block = dict(data=2.0, fsdp=1, tensor=1, dcn_data=1, dcn_fsdp=1, dcn_tensor=1)
  with pytest.raises(ValueError, match=r"mesh.data must be an integer, got 2.0"):
    mesh_lib.resolve_shape(block, 2)
  del block["dcn_tensor"]
  with pytest.raises(ValueError, match=r"mesh.dcn_tensor is missing"):
    mesh_lib.resolve_shape(block, 2)


# ----------------------------------------------------------------------------- make_mesh

@pytest.mark.parametrize("sizes, expected", [
    (dict(data=8), (8, 1, 1)),
    (dict(data=1, fsdp=8), (1, 8, 1)),
    (dict(data=2, fsdp=2, tensor=2), (2, 2, 2)),
    (dict(data=-1, fsdp=2, tensor=1), (4, 2, 1)),
])
def test_make_mesh(sizes, expected):
  mesh = mesh_lib.make_mesh(_mesh_config(**sizes))
  assert mesh.axis_names == ("data", "fsdp", "tensor")
  assert mesh.devices.shape == expected
  assert mesh.axis_types == (AxisType.Auto,) * 3
  assert sorted(d.id for d in mesh.devices.flat) == list(range(8))
  assert mesh_lib.describe(mesh) == "data={} fsdp={} tensor={}".format(*expected)


def test_make_mesh_on_a_device_subset():
  devices = jax.devices()[2:6]
  mesh = mesh_lib.make_mesh(_mesh_config(data=2, fsdp=-1), devices)
  assert mesh.devices.shape == (2, 2, 1)
  assert {d.id for d in mesh.devices.flat} == {2, 3, 4, 5}


@dataclasses.dataclass(frozen=True)
class _StandIn:
  """A device as mesh_utils sees one: id, process, platform (real CPU devices are all in
  process 0, so a two-process layout needs stand-ins)."""
  id: int
  process_index: int
  platform: str = "cpu"
  device_kind: str = "cpu"


def test_hybrid_grid_puts_each_process_in_its_own_dcn_block():
  # 2 processes x 4 devices, dcn_data=2: data spans both processes, inner axes one process.
  devices = [_StandIn(i, i // 4) for i in range(8)]
  grid = mesh_lib.device_grid(_mesh_config(data=-1, fsdp=2, dcn_data=2), devices)
  assert grid.shape == (4, 2, 1)  # ici (2, 2, 1) x dcn (2, 1, 1)
  processes = np.vectorize(lambda d: d.process_index)(grid)
  np.testing.assert_array_equal(processes[:2], 0)
  np.testing.assert_array_equal(processes[2:], 1)
  assert sorted(d.id for d in grid.flat) == list(range(8))


def test_hybrid_grid_tiles_dcn_over_fsdp():
  devices = [_StandIn(i, i % 2) for i in range(8)]  # Interleaved process ids.
  grid = mesh_lib.device_grid(_mesh_config(data=2, fsdp=2, dcn_fsdp=2), devices)
  assert grid.shape == (2, 4, 1)
  processes = np.vectorize(lambda d: d.process_index)(grid)
  np.testing.assert_array_equal(processes[:, :2], 0)
  np.testing.assert_array_equal(processes[:, 2:], 1)


def test_hybrid_mesh_on_one_process_names_the_mismatch():
  # Fake CPU devices all belong to process 0, so a real two-process mesh cannot be built
  # here; the error must say why.
  with pytest.raises(ValueError, match=r"mesh.dcn_data=2 .* needs 2 processes, but the 8 "
                     r"devices belong to 1 processes"):
    mesh_lib.make_mesh(_mesh_config(dcn_data=2))


# ----------------------------------------------------------------------------- logical_to_spec

_MESH = jax.sharding.AbstractMesh((2, 4, 1), ("data", "fsdp", "tensor"))


def test_logical_to_spec_first_unused_rule_wins():
  rules = [("embed", "fsdp"), ("embed", "data"), ("mlp", "fsdp"), ("mlp", "tensor")]
  assert rules_lib.logical_to_spec(("embed", "mlp"), rules, _MESH) == P("fsdp", "tensor")
  # The second "embed" finds fsdp used and takes its next rule.
  assert rules_lib.logical_to_spec(("embed", "embed"), rules, _MESH) == P("fsdp", "data")
  # A rule naming an axis the mesh lacks is skipped.
  mesh2 = jax.sharding.AbstractMesh((8,), ("data",))
  assert rules_lib.logical_to_spec(("embed", "mlp"), rules, mesh2) == P("data", None)


def test_logical_to_spec_tuple_targets_and_explicit_none():
  rules = [("batch", ("data", "fsdp")), ("length", None), ("length", "tensor")]
  assert rules_lib.logical_to_spec(("batch", "length"), rules, _MESH) == P(("data", "fsdp"),
                                                                          None)
  # A tuple target needs all its axes unused.
  rules2 = [("embed", "fsdp"), ("batch", ("data", "fsdp")), ("batch", "data")]
  assert rules_lib.logical_to_spec(("embed", "batch"), rules2, _MESH) == P("fsdp", "data")


def test_logical_to_spec_divisibility_fallback():
  rules = rules_lib.DEFAULT_RULES
  mesh = jax.sharding.AbstractMesh((2, 1, 4), ("data", "fsdp", "tensor"))
  # vocab 30522 and 3 classes do not split 4 ways: replicated; 30520 does.
  assert rules_lib.logical_to_spec(("vocab", "embed"), rules, mesh, (30522, 8)) == P(None,
                                                                                    "fsdp")
  assert rules_lib.logical_to_spec(("vocab", "embed"), rules, mesh, (30520, 8)) == P("tensor",
                                                                                    "fsdp")
  assert rules_lib.logical_to_spec(("embed", "classes"), rules, mesh, (8, 3)) == P("fsdp", None)
  # Without a shape nothing is checked.
  assert rules_lib.logical_to_spec(("vocab",), rules, mesh) == P("tensor")
  # A non-dividing rule falls through to the next rule for the name.
  rules2 = [("mlp", "tensor"), ("mlp", "data")]
  assert rules_lib.logical_to_spec(("mlp",), rules2, mesh, (6,)) == P("data")


def test_logical_to_spec_tuple_prefix_fallback():
  rules = rules_lib.DEFAULT_RULES
  # batch 4 on data=2, fsdp=4: ("data", "fsdp") needs 8, its prefix ("data",) divides.
  assert rules_lib.logical_to_spec(("batch", "length"), rules, _MESH, (4, 5)) == P("data", None)
  assert rules_lib.logical_to_spec(("batch", "length"), rules, _MESH, (16, 5)) == P(
      ("data", "fsdp"), None)
  assert rules_lib.logical_to_spec(("batch",), rules, _MESH, (3,)) == P(None)
  # The prefix leaves fsdp unused for a later dimension.
  assert rules_lib.logical_to_spec(("batch", "embed"), rules, _MESH, (2, 8)) == P("data", "fsdp")


def test_logical_to_spec_unknown_names_and_errors():
  assert rules_lib.logical_to_spec(("nonsense", None), rules_lib.DEFAULT_RULES, _MESH) == P(
      None, None)
  assert rules_lib.logical_to_spec(P("heads", "kv"), [("heads", "tensor")], _MESH) == P(
      "tensor", None)
  with pytest.raises(ValueError, match=r"do not match shape"):
    rules_lib.logical_to_spec(("embed",), rules_lib.DEFAULT_RULES, _MESH, (2, 3))


def test_batch_shardings():
  mesh = mesh_lib.make_mesh(_mesh_config(data=2, fsdp=4))
  axes = {"ids": ("batch", "length"), "label": ("batch",)}
  specs = rules_lib.batch_spec(axes, mesh, rules_lib.DEFAULT_RULES)
  assert specs == {"ids": P(("data", "fsdp"), None), "label": P(("data", "fsdp"))}
  small = rules_lib.batch_shardings(axes, mesh, rules_lib.DEFAULT_RULES,
                                    shapes={"ids": (2, 7), "label": (2,)})
  assert small["ids"].spec == P("data", None) and small["ids"].mesh is mesh


# ----------------------------------------------------------------------------- shardings()

_TINY_BERT = bert.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1,
                             num_attention_heads=4, intermediate_size=32,
                             max_position_embeddings=16)


def _encoder():
  return bert.SentenceEncoder(_TINY_BERT, rngs=nnx.Rngs(0))


def test_shardings_place_a_jitted_bert_init():
  mesh = mesh_lib.make_mesh(_mesh_config(data=1, fsdp=2, tensor=4))
  abstract = nnx.state(nnx.eval_shape(_encoder), nnx.Param)
  placed = rules_lib.shardings(nnx.get_partition_spec(abstract), abstract, mesh,
                               rules_lib.DEFAULT_RULES)

  @jax.jit
  def init_unsharded():
    return nnx.state(_encoder(), nnx.Param)

  init = jax.jit(lambda: nnx.state(_encoder(), nnx.Param), out_shardings=placed)
  state = init()
  layer = state["bert"]["encoder"]["layers"][0]
  expected = {
      ("bert", "embeddings", "word", "embedding"): P(None, "fsdp"),  # vocab 30 % 4 != 0
      ("bert", "embeddings", "position", "embedding"): P(None, "fsdp"),
      ("bert", "pooler", "kernel"): P("fsdp", None),
  }
  for path, spec in expected.items():
    leaf = state
    for key in path:
      leaf = leaf[key]
    assert leaf.get_value().sharding.spec == spec, path
  assert layer["attention"]["query"]["kernel"].get_value().sharding.spec == P("fsdp", "tensor",
                                                                              None)
  assert layer["attention"]["out"]["kernel"].get_value().sharding.spec == P("tensor", None,
                                                                            "fsdp")
  fc1 = layer["mlp"]["fc1"]["kernel"].get_value()
  assert fc1.sharding.spec == P("fsdp", "tensor")
  assert fc1.addressable_shards[0].data.shape == (8, 8)  # [16, 32] over fsdp=2, tensor=4.
  # Same values as an unsharded init with the same seed.
  reference = init_unsharded()
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(reference)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_shardings_on_pure_dicts_and_errors_name_the_path():
  mesh = mesh_lib.make_mesh(_mesh_config(data=2, fsdp=4))
  axes = {"a": {"kernel": ("embed", "mlp")}, "b": [("vocab",), None]}
  shapes = {"a": {"kernel": (8, 6)}, "b": [jax.ShapeDtypeStruct((5,), jnp.float32), (3, 2)]}
  out = rules_lib.shardings(axes, shapes, mesh, rules_lib.DEFAULT_RULES)
  # mlp -> tensor, a size-1 axis here: harmless in a spec.
  assert out["a"]["kernel"].spec == P("fsdp", "tensor")
  assert out["b"][0].spec == P("tensor") and out["b"][1].spec == P(None, None)
  with pytest.raises(ValueError, match=r"^a\.kernel: logical axes"):
    rules_lib.shardings({"a": {"kernel": ("embed",)}}, {"a": {"kernel": (8, 6)}}, mesh,
                        rules_lib.DEFAULT_RULES)


# ----------------------------------------------------------------------------- layers.constrain

def test_constrain_uses_the_rules_with_divisibility():
  from mocheg_jax.models import layers
  mesh = mesh_lib.make_mesh(_mesh_config(data=2, fsdp=1, tensor=4))
  f = jax.jit(lambda a: layers.constrain(a + 1, ("batch", "length", "vocab")))
  x = jnp.zeros((4, 3, 30))  # vocab 30 does not split 4 ways: replicated, not an error.
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules_lib.DEFAULT_RULES):
    y = f(x)
  assert y.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None, None)), 3)
  np.testing.assert_array_equal(y, 1.0)


# ----------------------------------------------------------------------------- distributed

def test_global_batch_single_process():
  mesh = mesh_lib.make_mesh(_mesh_config(data=2, fsdp=4))
  shardings = rules_lib.batch_shardings({"ids": ("batch", "length"), "label": ("batch",)},
                                        mesh, rules_lib.DEFAULT_RULES)
  ids = np.arange(16 * 3, dtype=np.int32).reshape(16, 3)
  label = np.arange(16, dtype=np.int32) % 3
  out = distributed.global_batch({"ids": ids, "label": label}, shardings)
  assert out["ids"].sharding == shardings["ids"] and out["label"].sharding == shardings["label"]
  assert out["ids"].addressable_shards[0].data.shape == (2, 3)
  np.testing.assert_array_equal(out["ids"], ids)
  np.testing.assert_array_equal(out["label"], label)


def test_global_batch_errors_name_the_field():
  mesh = mesh_lib.make_mesh(_mesh_config(data=8))
  shardings = rules_lib.batch_shardings({"ids": ("batch", "length"), "label": ("batch",)},
                                        mesh, rules_lib.DEFAULT_RULES)
  with pytest.raises(ValueError, match=r"'label' has 4 rows but 'ids' has 8"):
    distributed.global_batch({"ids": np.zeros((8, 2)), "label": np.zeros(4)}, shardings)
  with pytest.raises(ValueError, match=r"'ids': 6 local rows do not split into the 8"):
    distributed.global_batch({"ids": np.zeros((6, 2)), "label": np.zeros(6)}, shardings)
  with pytest.raises(ValueError, match=r"'extra' has no sharding"):
    distributed.global_batch({"extra": np.zeros(8)}, shardings)
  with pytest.raises(ValueError, match=r"'label' is a scalar"):
    distributed.global_batch({"label": np.float32(1)}, shardings)


_ENV_VARS = ("JAX_COORDINATOR_ADDRESS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE",
             "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES")


@pytest.fixture
def clean_env(monkeypatch):
  for name in _ENV_VARS:
    monkeypatch.delenv(name, raising=False)
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
  monkeypatch.setattr(distributed, "_initialized", False)
  return calls


def test_maybe_initialize_auto_and_off(clean_env, monkeypatch):
  assert distributed.maybe_initialize("auto") is False
  assert distributed.maybe_initialize("auto", coordinator="", num_processes=0,
                                      process_id=-1) is False  # Config "unset" values.
  monkeypatch.setenv("SLURM_NTASKS", "4")
  assert distributed.maybe_initialize("off") is False
  assert clean_env == []
  assert distributed.maybe_initialize("auto") is True
  assert clean_env == [((None, None, None), {})]
  assert distributed.maybe_initialize("auto") is True  # Idempotent: not called again.
  assert distributed.maybe_initialize("on") is True
  assert len(clean_env) == 1


def test_maybe_initialize_on_and_explicit_args(clean_env):
  assert distributed.maybe_initialize("auto", coordinator="10.0.0.1:1234", num_processes=2,
                                      process_id=1) is True
  assert clean_env == [(("10.0.0.1:1234", 2, 1), {})]
  with pytest.raises(ValueError, match=r"'maybe'"):
    distributed.maybe_initialize("maybe")


def test_maybe_initialize_passes_a_heartbeat_timeout_only_when_set(clean_env, monkeypatch):
  assert distributed.maybe_initialize("on", heartbeat_timeout_s=0) is True
  monkeypatch.setattr(distributed, "_initialized", False)
  assert distributed.maybe_initialize("on", heartbeat_timeout_s=900) is True
  assert clean_env == [((None, None, None), {}),
                       ((None, None, None), {"heartbeat_timeout_seconds": 900})]


def test_maybe_initialize_on_always_calls(clean_env):
  assert distributed.maybe_initialize("on") is True
  assert clean_env == [((None, None, None), {})]


@pytest.mark.parametrize("env, multi", [
    ({}, False),
    ({"SLURM_NTASKS": "1"}, False),
    ({"SLURM_NTASKS": "2"}, True),
    ({"OMPI_COMM_WORLD_SIZE": "1"}, False),
    ({"OMPI_COMM_WORLD_SIZE": "8"}, True),
    ({"JAX_COORDINATOR_ADDRESS": "host:1"}, True),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, False),
    ({"TPU_WORKER_HOSTNAMES": "w-0,w-1"}, True),
    ({"MEGASCALE_NUM_SLICES": "1"}, False),
    ({"MEGASCALE_NUM_SLICES": "2"}, True),
    ({"MEGASCALE_COORDINATOR_ADDRESS": "c:8080"}, True),
])
def test_detect_multiprocess(env, multi):
  assert (distributed.detect_multiprocess(env) is not None) == multi


def test_detect_multiprocess_bad_value_is_named():
  with pytest.raises(ValueError, match=r"SLURM_NTASKS='two'"):
    distributed.detect_multiprocess({"SLURM_NTASKS": "two"})


def test_single_process_helpers():
  assert distributed.is_primary()
  distributed.sync("test")  # One process: returns at once.
  assert distributed.primary_only("block", lambda: 7) == 7
  assert distributed.primary_first("block", lambda: 8) == 8


def test_place_lays_out_arrays_and_prng_keys():
  mesh = jax.make_mesh((4, 2), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)
  rows = NamedSharding(mesh, P("data"))
  tree = {"w": np.arange(16, dtype=np.float32).reshape(8, 2), "nothing": None}
  out = distributed.place(tree, rows)
  assert out["w"].sharding == rows and out["nothing"] is None
  np.testing.assert_array_equal(np.asarray(out["w"]), tree["w"])
  tree = {"key": jax.random.key(3)}  # A module's RNG stream, as in a task's constants.
  out = distributed.place(tree, NamedSharding(mesh, P()))
  assert jax.dtypes.issubdtype(out["key"].dtype, jax.dtypes.prng_key)
  np.testing.assert_array_equal(jax.random.key_data(out["key"]),
                                jax.random.key_data(tree["key"]))


def test_grids_fall_back_to_plain_layouts_when_mesh_utils_refuses(monkeypatch):
  def refuse(*args, **kwargs):
    raise ValueError("unsupported topology")

  monkeypatch.setattr(mesh_lib.mesh_utils, "create_device_mesh", refuse)
  monkeypatch.setattr(mesh_lib.mesh_utils, "create_hybrid_device_mesh", refuse)
  mesh = mesh_lib.make_mesh(_mesh_config(data=2, fsdp=2, tensor=2))
  assert [d.id for d in mesh.devices.flat] == list(range(8))  # The given order, reshaped.
  devices = [_StandIn(i, i % 2) for i in range(8)]
  grid = mesh_lib.device_grid(_mesh_config(data=2, fsdp=2, dcn_fsdp=2), devices)
  assert grid.shape == (2, 4, 1)
  processes = np.vectorize(lambda d: d.process_index)(grid)
  np.testing.assert_array_equal(processes[:, :2], 0)
  np.testing.assert_array_equal(processes[:, 2:], 1)
