r"""A local pod's InfoNCE over the global batch (tests/bert_jax/objectives/contrastive_pod_test.py):

  python -m launch.local_pod --num_processes=2 --devices_per_process=4 -- tests.testlib.contrastive_pod

Every process builds the same global batch (global_batch(): anchors [B, D], candidates [B, 1 + K,
D], weights [B] with padding rows), keeps its own contiguous rows (a disjoint shard, as a host's
input pipeline reads) and assembles the global arrays over a 1-D "data" mesh of every device of
every process (sharding.make_global_batch, as the fine-tuning loop does). The loss the embedding
task trains with, contrastive.matryoshka_info_nce, and its gradients are then taken under jit on
the sharded arrays, so every host's and device's rows and hard negatives are every anchor's
negatives through XLA's collectives (no host gather). Process 0 prints one `RESULT {json}` line:
the losses and gradients, which tests/bert_jax/objectives/contrastive_pod_test.py compares with one process on the
whole batch; and the same for packed rows (packed_batch: each host holds its rows of pooled text
vectors and its examples' slots into the global rows); and with both false-negative masks
(false_negative_batch: text numbers with duplicates across the hosts, a guide's vectors). (The mesh is the fine-tuning loop's, sharding.create_mesh: on a mesh of explicit axis
types, jax.make_mesh's default, the [B, 1 + K, B] einsum of two row-sharded arrays is a
ShardingTypeError, jax 0.10.) Tests only.
"""

import json

import numpy as np

B, K, D = 16, 2, 8            # global rows, hard negatives a row, embedding width
DIMS = (8, 4)                 # Matryoshka widths (the first 4 dimensions too)
SETTINGS = {"plain": dict(scale=20.0, symmetric=False), "symmetric": dict(scale=50.0,
                                                                        symmetric=True)}


def global_batch():
  """(anchors [B, D], candidates [B, 1 + K, D], weights [B]) float32; rows 5 and 14 padding."""
  rng = np.random.default_rng(40)
  anchors = rng.normal(size=(B, D)).astype(np.float32)
  # Each positive near its anchor, so the loss is not the same for every row.
  positives = anchors + 0.5 * rng.normal(size=(B, D)).astype(np.float32)
  negatives = rng.normal(size=(B, K, D)).astype(np.float32)
  weights = np.ones(B, np.float32)
  weights[[5, 14]] = 0.0
  return anchors, np.concatenate([positives[:, None], negatives], axis=1), weights


G = 6                         # the guide's width (false_negative_batch)


def false_negative_batch():
  """(text_ids [B, 2 + K] int32, guide anchors [B, G], guide candidates [B, 1 + K, G]): row 11's
  positive (host 1) is row 2's (host 0), row 3's negative is row 12's positive, row 8's first
  negative its own positive's text; a guide vector per text number (copies: the same vector)."""
  ids = np.arange(B * (2 + K), dtype=np.int32).reshape(B, 2 + K)
  ids[11, 1], ids[3, 2], ids[8, 2] = ids[2, 1], ids[12, 1], ids[8, 1]
  guide = np.random.default_rng(42).normal(size=(ids.size, G)).astype(np.float32)[ids]
  return ids, guide[:, 0], guide[:, 1:]


# The false-negative masks' setting (losses_and_grads with masks): symmetric as "symmetric".
MASKED = dict(scale=50.0, symmetric=True, margin=0.1, contrast_anchors=True,
              contrast_positives=True)


R, SLOTS = 16, 8              # packed rows and text slots a row (the packed variant below)


def packed_batch():
  """global_batch()'s B x (2 + K) vectors as packed rows' pooled texts: (pooled [R, SLOTS, D],
  text_slots [B, 2 + K] int32, weights [B]); the texts sit at random slots of the R x SLOTS, so
  a host's examples read vectors of the other host's rows (contrastive.texts_of_rows gathers
  across hosts), and half the slots are empty."""
  anchors, candidates, weights = global_batch()
  texts = np.concatenate([anchors[:, None], candidates], axis=1)           # [B, 2 + K, D]
  at = np.random.default_rng(41).permutation(R * SLOTS)[:texts.size // D]
  pooled = np.zeros((R * SLOTS, D), np.float32)
  pooled[at] = texts.reshape(-1, D)
  return pooled.reshape(R, SLOTS, D), at.reshape(B, -1).astype(np.int32), weights


def packed_loss_and_grad(pooled, text_slots, weights):
  """(loss, d/d pooled [R, SLOTS, D]) of the embedding task's packed loss: texts_of_rows, then
  matryoshka_info_nce with the "plain" settings (jitted; the inputs may be sharded)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.objectives import contrastive  # pylint: disable=g-import-not-at-top

  def loss(p, s, w):
    t = contrastive.texts_of_rows(p, s)                                    # [B, 2 + K, D]
    return contrastive.matryoshka_info_nce(t[:, 0], t[:, 1:], DIMS, weights=w,
                                           **SETTINGS["plain"])
  return jax.jit(jax.value_and_grad(loss))(pooled, text_slots, weights)


def losses_and_grads(anchors, candidates, weights, masks=None):
  """{setting: (loss, d/d anchors [B, D], d/d candidates [B, 1 + K, D])} of
  matryoshka_info_nce (jitted; the inputs may be sharded global arrays); masks
  (false_negative_batch's arrays): also "false_negatives", MASKED with both masks."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.objectives import contrastive  # pylint: disable=g-import-not-at-top
  out = {}
  for name, kw in SETTINGS.items():
    def loss(a, c, w, kw=kw):   # w an argument: a global array cannot be closed over
      return contrastive.matryoshka_info_nce(a, c, DIMS, weights=w, **kw)
    out[name] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(anchors, candidates, weights)
  if masks is not None:
    def masked(a, c, w, t, ga, gc):
      return contrastive.matryoshka_info_nce(a, c, DIMS, weights=w, text_ids=t, guide=(ga, gc),
                                             **MASKED)
    out["false_negatives"] = jax.jit(jax.value_and_grad(masked, argnums=(0, 1)))(
        anchors, candidates, weights, *masks)
  return out


def main(argv):
  del argv
  from bert_jax.parallel import distributed  # pylint: disable=g-import-not-at-top
  distributed.maybe_initialize_distributed()
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import sharding  # pylint: disable=g-import-not-at-top

  pid, nproc = jax.process_index(), jax.process_count()
  # The fine-tuning loop's mesh and batch path: (data, fsdp, tensor) = (8, 1, 1), rows over data.
  mesh = sharding.create_mesh((-1, 1, 1))
  rows = B // nproc
  local = [x[pid * rows:(pid + 1) * rows] for x in global_batch()]   # this host's rows
  local += [x[pid * rows:(pid + 1) * rows] for x in false_negative_batch()]
  anchors, candidates, weights, *masks = sharding.make_global_batch(local, mesh)
  result = dict(process_count=nproc, device_count=jax.device_count(),
                fully_addressable=bool(anchors.is_fully_addressable))
  for name, (loss, (d_a, d_c)) in losses_and_grads(anchors, candidates, weights,
                                                   masks).items():
    # The gradients are sharded like the rows (each host holds its own): gathered for process 0.
    def gather(x):
      return np.asarray(multihost_utils.process_allgather(x, tiled=True)).tolist()
    result[name] = dict(loss=float(loss), d_anchors=gather(d_a), d_candidates=gather(d_c))
  # Packed rows: this host's R / nproc rows of pooled texts and its B / nproc examples' slots.
  pooled, slots, w = packed_batch()
  mine = [pooled[pid * (R // nproc):(pid + 1) * (R // nproc)], slots[pid * rows:(pid + 1) * rows],
          w[pid * rows:(pid + 1) * rows]]
  loss, d_pooled = packed_loss_and_grad(*sharding.make_global_batch(mine, mesh))
  result["packed"] = dict(loss=float(loss), d_pooled=np.asarray(
      multihost_utils.process_allgather(d_pooled, tiled=True)).tolist())
  if pid == 0:
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
  from bert_jax_core import errors  # pylint: disable=g-import-not-at-top
  errors.run(main)
