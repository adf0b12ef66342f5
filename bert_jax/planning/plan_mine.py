r"""`bert_jax.plan` for the mining step (issue 48 item 6): `bert_jax.mine`'s two programs, the
encoding step (a batch of texts -> their vectors, split over the slice) and the block merge (one
block's scores against every query, merged into the running top-k: bert_jax/inference/mining.py's
merge_program), compiled for a TPU slice from this host.

  python -m bert_jax.plan --config=bert_jax/configs/mine.py --config.model_name=base \
      --config.num_queries=1000000 --config.block_size=65536 --topology=v5litepod-8

Printed per chip: the search state that stays for the whole run (the queries' vectors, top-k
scores and indices, the positives' scores: num_queries / chips rows), each program's arguments,
temporaries, code and outputs (the compiler's memory_analysis), and the peak: the state plus the
larger program beside it, against the HBM the compiler allows. The corpus size does not enter:
that is the point of the blocks. Exit 0 fits, 1 not (bert_jax/plan.py).
"""

import math

from bert_jax.planning import plan_compile
from bert_jax.planning.plan_compile import GiB, PlanError

BLOCK_PROGRAMS = ("encode", "merge")


def is_mine(config):
  return config.get("program", None) == "mine"


def model_config_of(config):
  """(BertConfig, where it comes from); reads no array."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  overrides = {k: v for k, v in config.model.items() if v is not None}
  if config.init_checkpoint:
    import dataclasses  # pylint: disable=g-import-not-at-top
    found = ckpt_lib.describe(config.init_checkpoint, verify=False)
    return dataclasses.replace(found.config, **overrides), f"{config.init_checkpoint}'s"
  try:
    return model_lib.get_bert_config(config.model_name, **overrides), "the preset's"
  except (ValueError, TypeError) as e:
    raise PlanError(f"config.model_name={config.model_name}: {e}") from e


def check(config, chips):
  """The sizes mine itself would refuse, before any compile."""
  if config.batch_size < 1 or config.batch_size % chips:
    raise PlanError(f"config.batch_size={config.batch_size}: give a multiple of the slice's "
                    f"{chips} chips.")
  if config.block_size < 1 or config.block_size % config.batch_size:
    raise PlanError(f"config.block_size={config.block_size}: give a multiple of "
                    f"config.batch_size={config.batch_size}.")
  for name in ("num_queries", "k", "max_positives", "max_seq_length"):
    if config[name] < 1:
      raise PlanError(f"config.{name}={config[name]}: give at least 1.")


def _memory(compiled):
  m = compiled.memory_analysis()
  return dict(arguments=int(m.argument_size_in_bytes), outputs=int(m.output_size_in_bytes),
              aliased=int(m.alias_size_in_bytes), temporaries=int(m.temp_size_in_bytes),
              code=int(m.generated_code_size_in_bytes))


def compile_programs(config, model_config, devices):
  """{name: memory dict} of the encoding step and the block merge on `devices`, and the search
  state's bytes a chip."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from bert_jax import mine  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import mining  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import sharding  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks import embedding  # pylint: disable=g-import-not-at-top
  mesh = sharding.create_mesh((-1, 1, 1), devices)
  rows, repl = NamedSharding(mesh, P(tuple(mesh.axis_names))), NamedSharding(mesh, P())
  b, t, h = config.batch_size, config.max_seq_length, model_config.hidden_size
  ids = jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=rows)
  model = embedding.EmbeddingModel(model_config, config.pooling)
  shapes = jax.eval_shape(lambda: nn.unbox(model.init(
      jax.random.PRNGKey(0), jnp.zeros((1, 1, 8), jnp.int32), jnp.ones((1, 1, 8), jnp.int32),
      jnp.zeros((1, 1, 8), jnp.int32))["params"]))
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=repl), shapes)
  out = {}
  with plan_compile.without_persistent_cache():
    encode = jax.jit(mine.embed_fn(model_config, config.pooling), out_shardings=rows)
    out["encode"] = _memory(encode.lower(params, ids, ids, ids).compile())
    n = math.ceil(config.num_queries / b) * b
    f32 = lambda *shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)  # noqa: E731
    state = (f32(n, config.k), f32(n, config.k, dtype=jnp.int32), f32(n, config.max_positives))
    merge = mining.merge_program(mesh, config.k, config.search)
    out["merge"] = _memory(merge.lower(
        config.block_size, state, f32(n, h), f32(config.block_size, h),
        jax.ShapeDtypeStruct((), jnp.int32), f32(n, config.max_positives, dtype=jnp.int32)
    ).compile())
  per_chip = math.ceil(n / len(devices))
  resident = dict(
      state=per_chip * (h + 2 * config.k + 2 * config.max_positives) * 4,
      params=sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(shapes)),
      block=math.ceil(config.block_size / len(devices)) * h * 4)   # a block's vectors so far
  return out, resident, n


def plan(config, spec, libtpu, hbm_gib=None, *, log=print, isolate=True):
  """The mining plan as a dict (what --json writes); `log` gets the report's lines."""
  del isolate   # two small programs: compiled in this process
  check(config, spec.chips)
  model_config, source = model_config_of(config)
  devices = plan_compile.topology_devices(spec)
  gen = spec.generation
  hbm, hbm_source = plan_compile.hbm_per_chip(devices[0], gen, hbm_gib)
  log(f"mining plan on {spec.cloud_name} ({spec.chips} chips, {gen.device_kind}; libtpu "
      f"{libtpu}): model {model_config.num_layers} layers x H {model_config.hidden_size} "
      f"({source} config, {model_config.dtype}), {config.num_queries:,} queries, top "
      f"{config.k} a query, blocks of {config.block_size:,} texts, batches of "
      f"{config.batch_size:,} x {config.max_seq_length} tokens ({config.search} search)")
  programs, resident, rows = compile_programs(config, model_config, devices)
  state = resident["state"]
  total = lambda m: m["arguments"] + m["outputs"] + m["temporaries"] + m["code"] - m["aliased"]  # noqa: E731
  # While a batch is encoded the search state and the block's earlier vectors stay (the
  # step's arguments are the parameters and the batch); the merge's arguments are the state
  # (donated: aliased to its outputs) and the block, beside the parameters.
  peak = {"encode": state + resident["block"] + total(programs["encode"]),
          "merge": resident["params"] + total(programs["merge"])}
  worst = max(peak, key=peak.get)
  log(f"memory per chip: search state {_gib(state)} (the queries' vectors, top-k and positives' "
      f"scores: {math.ceil(rows / spec.chips):,} rows a chip; the whole run), parameters "
      f"{_gib(resident['params'])} (replicated)")
  for name in BLOCK_PROGRAMS:
    m = programs[name]
    log(f"  {name:6s}: arguments {_gib(m['arguments'])}, temporaries {_gib(m['temporaries'])}, "
        f"outputs {_gib(m['outputs'])}, code {_gib(m['code'])}; peak with the state "
        f"{_gib(peak[name])}")
  fits = peak[worst] <= hbm
  log(f"verdict: the mining step {'FITS' if fits else 'DOES NOT FIT'} on {spec.cloud_name}: "
      f"peak {_gib(peak[worst])} a chip ({worst}) of {_gib(hbm)} {hbm_source}; any corpus size "
      "(one block at a time)")
  return dict(kind="mine", topology=spec.cloud_name, chips=spec.chips, libtpu=libtpu,
              hbm_available_bytes=hbm, resident_bytes=resident, programs=programs, peak_bytes=peak,
              fits=fits, config=config.to_dict())


def _gib(n):
  return f"{n / GiB:.3f} GiB" if n >= GiB / 100 else f"{n / 2 ** 20:.1f} MiB"
