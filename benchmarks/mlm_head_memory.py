r"""The MLM head's memory with and without the chunked loss (issue 42 item 4), compiled for this
host's CPU (nothing runs): XLA's temporaries of the loss and its gradient for one chip's batch.

  python -m benchmarks.mlm_head_memory --rows=9 --preds=2969 --chunk=64    # 8,192 tokens
  python -m benchmarks.mlm_head_memory --rows=72 --preds=371 --chunk=0     # 1,024 tokens, plain

The head alone: bf16 hidden states [rows, preds, E] at the masked positions, the [V, E] float32
table rounded to bf16 as the step does, the bias, and the MLM cross-entropy; the encoder is left
out. modernbert-base's E = 768 and mmBERT's V = 256,000 by default. docs/planning.md has figures.
"""

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from bert_jax.objectives import pretraining as objectives
from bert_jax.models import pretraining_heads

flags.DEFINE_integer("rows", 9, "rows a chip")
flags.DEFINE_integer("preds", 2969, "prediction slots a row (packed 8,192 tokens at 30%: 2,969)")
flags.DEFINE_integer("chunk", 64, "config.model.mlm_loss_chunk; 0 = whole logits")
flags.DEFINE_integer("vocab", 256_000, "V")
flags.DEFINE_integer("embed", 768, "E")
FLAGS = flags.FLAGS


def temp_bytes(rows, preds, chunk, vocab, embed):
  """XLA's temporaries (bytes) of grad(MLM loss) w.r.t. hidden states, table and bias."""
  x = jax.ShapeDtypeStruct((rows, preds, embed), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((vocab, embed), jnp.float32)
  b = jax.ShapeDtypeStruct((vocab,), jnp.float32)
  batch = dict(masked_lm_ids=jax.ShapeDtypeStruct((rows, preds), jnp.int32),
               masked_lm_weights=jax.ShapeDtypeStruct((rows, preds), jnp.float32))

  def loss(x, w, b, batch):
    if chunk:   # as pretraining_heads._tied_logits(chunked=True)
      out = pretraining_heads.mlm_chunks(x, w.astype(jnp.bfloat16).astype(jnp.float32), b, chunk)
    else:
      # pylint: disable-next=protected-access
      out = pretraining_heads._vocab_matmul(x, w.astype(jnp.bfloat16)) + b
    return objectives.masked_lm("mlm", out, batch)[0]

  compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(x, w, b, batch).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def main(_):
  f = FLAGS
  t = temp_bytes(f.rows, f.preds, f.chunk, f.vocab, f.embed)
  print(f"rows {f.rows} x preds {f.preds}, V {f.vocab:,}, mlm_loss_chunk {f.chunk}: temporaries "
        f"{t / 2**30:.2f} GiB; the logits [B, P, V] float32 are "
        f"{f.rows * f.preds * f.vocab * 4 / 2**30:.2f} GiB")


if __name__ == "__main__":
  app.run(main)
