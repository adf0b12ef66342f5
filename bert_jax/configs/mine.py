r"""The mining step's shapes for `bert_jax.plan` (issue 48 item 6): what `bert_jax.mine` would hold
on each chip of a TPU slice.

  python -m bert_jax.plan --config=bert_jax/configs/mine.py --config.model_name=base \
      --config.num_queries=1000000 --config.block_size=65536 --config.batch_size=4096 \
      --topology=v5litepod-8

The fields are `bert_jax.mine`'s flags of the same names (block_size, batch_size, max_seq_length,
num_negatives / range_max as k) plus the sizes the data would have.
"""

import ml_collections


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  c.program = "mine"            # bert_jax.plan plans the mining step for this config
  c.init_checkpoint = ""        # the embedder (its config; no array is read), else model_name
  c.model_name = "base"         # a preset (bert_jax/models/model.py) without init_checkpoint
  c.model = ml_collections.ConfigDict({"dtype": "bfloat16"})   # preset overrides
  c.pooling = "mean"
  c.num_queries = 1_000_000     # distinct queries: their vectors and top-k stay on the chips
  c.max_positives = 1           # positives a query (their scores are kept beside the top-k)
  c.k = 40                      # candidates kept a query: range_max + max_positives
  c.block_size = 65_536         # corpus texts a block (--block_size)
  c.batch_size = 4_096          # texts an encoding step over the slice (--batch_size)
  c.max_seq_length = 256        # tokens a text (the encoding step's width)
  c.search = "exact"            # exact (lax.top_k) or approx (lax.approx_max_k)
  return c
