r"""The embedding step's memory with GradCache against the unchunked step's (issue 40 item 4):
the fine-tuning loop's own train step (finetune.build_training), compiled, never run.

  python -m benchmarks.grad_cache_memory --model=base --batch=512 --seq=128 --chunks=1,8,32
  python -m benchmarks.grad_cache_memory --model=modernbert-base --batch=16384 --seq=128 \
      --chunks=1,32 --topology=v5litepod-8       # the TPU compiler, as bert_jax.plan (libtpu)

For each chunk count (1 = the plain step) it prints XLA's memory of the compiled step for one
device: temporaries (activations and the like: what GradCache shrinks), arguments (parameters,
Adam's state, the batch) and the total, with the temporaries' ratio to the plain step's. FLOPs
are not printed: XLA's cost analysis counts a loop's body once, not per chunk (GradCache runs the
forward twice: ~4/3 of the plain step's FLOPs, by count). Without --topology the program
is compiled for this host's first CPU device (XLA:CPU's buffer assignment, not a TPU's; the
ratios are what to read). Rows are (anchor, positive, --negatives hard negatives): S = 2 + k
sequences of --seq tokens each. docs/finetuning.md has measured figures.
"""

import sys

from absl import app
from absl import flags
import jax

from bert_jax.models import model as model_lib
from bert_jax.planning import plan_finetune
from bert_jax.configs import finetune as finetune_config

flags.DEFINE_string("model", "base", "a preset of bert_jax.models.model.get_bert_config")
flags.DEFINE_integer("vocab", 30_522, "vocabulary size")
flags.DEFINE_integer("batch", 512, "global batch (rows)")
flags.DEFINE_integer("seq", 128, "tokens a sequence")
flags.DEFINE_integer("negatives", 0, "hard negatives a row")
flags.DEFINE_list("chunks", ["1", "8", "32"], "chunk counts; 1 = the plain step")
flags.DEFINE_string("topology", "", "a TPU slice (v5litepod-8, v5p-16, ...): compile for its "
                    "chips with libtpu instead of this host's CPU")
flags.DEFINE_string("dtype", "float32", "config.model.dtype (bfloat16 on TPU)")
FLAGS = flags.FLAGS


def devices_of(topology):
  """This host's first CPU device, or a TPU slice's compile-only devices (bert_jax.plan's)."""
  if not topology:
    return jax.devices()[:1]
  from bert_jax.planning import plan_compile  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import tpu_specs  # pylint: disable=g-import-not-at-top
  plan_compile.require_libtpu()
  return plan_compile.topology_devices(tpu_specs.parse_topology(topology))


def step_memory(model_config, *, batch, seq, negatives, chunks, devices):
  """{temporaries, arguments, total, compile_seconds} (bytes a device) of the loop's
  embedding train step with config.embedding.grad_cache_chunks=chunks, compiled for devices
  (bert_jax.planning.plan_finetune.compile_step: what `bert_jax.plan` compiles for a fine-tuning config).
  total: arguments + outputs - donated + temporaries, without the code (as measured before)."""
  config = finetune_config.get_config("custom")
  config.custom.type, config.max_seq_length, config.batch_size = "embedding", seq, batch
  config.learning_rate, config.num_train_epochs = 1e-4, 1.0
  config.embedding.num_negatives, config.embedding.grad_cache_chunks = negatives, chunks
  c = plan_finetune.compile_step(config, model_config, devices)
  return dict(temporaries=c.temporaries, arguments=c.arguments, total=c.total - c.code,
              compile_seconds=c.compile_seconds)


def main(_):
  f = FLAGS
  devices = devices_of(f.topology)
  try:
    mc = model_lib.get_bert_config(f.model, vocab_size=f.vocab, dtype=f.dtype,
                                   hidden_dropout_prob=0.1, attention_dropout_prob=0.1)
  except ValueError as e:   # an unknown preset: one line, before any compile
    print(f"error: --model={f.model}: {e}", file=sys.stderr)
    sys.exit(2)
  where = f.topology or f"this host's {devices[0].platform.upper()}"
  per = f.batch // len(devices)
  print(f"{f.model} ({mc.num_layers} layers, hidden {mc.hidden_size}), {f.dtype}; global batch "
        f"{f.batch} rows of {2 + f.negatives} x {f.seq} tokens, {per} rows a device on {where} "
        f"({len(devices)} device(s))")
  plain = None
  for n in (int(x) for x in f.chunks):
    m = step_memory(mc, batch=f.batch, seq=f.seq, negatives=f.negatives, chunks=n,
                    devices=devices)
    plain = plain or m
    label = "plain step" if n <= 1 else f"GradCache {n} chunks of {per // n} rows"
    print(f"{label:>28}: temporaries {m['temporaries'] / 2**30:8.3f} GiB "
          f"({m['temporaries'] / plain['temporaries']:.3f}x) | arguments "
          f"{m['arguments'] / 2**30:.3f} GiB | total {m['total'] / 2**30:8.3f} GiB | compiled "
          f"in {m['compile_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
  app.run(main)
