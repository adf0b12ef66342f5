"""Sentence embeddings and their contrastive loss (issue 40 items 2-3), pure jnp.

  pool          [B, T, H] hidden states + [B, T] mask -> [B, H]: mean (default), cls, last
  pool_packed   the same per text of packed rows: [B, T, H] + [B, T] instance ids -> [B, K, H]
  texts_of_rows packed rows' [R, K, H] vectors -> the batch's [B, S, H] (anchor, candidates)
  embed         pool, then Matryoshka truncation and L2 normalisation -> {dim: [B, d]}
  info_nce      InfoNCE with in-batch negatives over the whole global batch -> scalar loss
  false_negatives  the candidates that are no negatives: the positive's text elsewhere
                (text_ids), GISTEmbed's guided mask (a guide's vectors) -> [B, M, B] bool
  grad_cache    (loss, gradients) of a batch embedded a chunk at a time (GradCache)
  chunk_rows    [B, ...] -> [n, B/n, ...], chunk i = rows i, i + n, ... (and unchunk_rows back)

info_nce is sentence-transformers' MultipleNegativesRankingLoss (MNRL, 6.x) on the same
embeddings: anchors a [B, D], candidates c [B, 1 + k, D] (the positive, then k hard negatives).
Every anchor scores every candidate of the batch, scale x cos(a_i, c_jn) ([B, 1 + k, B] logits:
MNRL's [B, B(1 + k)] columns, all positives then every row's first negative, ..., unflattened),
and the loss is the mean cross-entropy of each anchor's own positive. symmetric=True adds each positive's
cross-entropy over the anchors, averaged with the first (MNRL's directions=("query_to_doc",
"doc_to_query"), partition_mode="per_direction"). Matryoshka (Kusupati et al. 2022; ST's
MatryoshkaLoss with weights 1) sums the loss over the first d dimensions for each d. With a
guide (issue 48 item 2), info_nce is sentence-transformers' GISTEmbedLoss (temperature = 1 /
scale) on the same embeddings and guide embeddings
(tests/bert_jax/objectives/contrastive_false_negatives_test.py).

Inside a jitted step the arrays are the global batch, sharded over the mesh's data axis: the
[B, 1 + k, B] similarity is one einsum over the sharded arrays, and XLA moves the candidate
shards between devices and hosts itself (no host gather, no all_gather written by hand), so every
device's rows and hard negatives are every anchor's negatives (tests/bert_jax/objectives/contrastive_test.py checks
a sharded run against the unsharded numbers). bert_jax/tasks/embedding.py drives these from the
fine-tuning loop; its training step runs grad_cache when config.embedding.grad_cache_chunks > 1
(embedding.grad_cache_step; benchmarks/grad_cache_memory.py compiles both steps and prints their
memory). pool_packed pools the texts of packed rows (issue 40 item 2), tested against the
unpacked encoder, and texts_of_rows maps them back to the loss's layout (config.pack=true:
bert_jax/tasks/embedding.py packs each training batch's texts).
"""

import jax
import jax.numpy as jnp

POOLINGS = ("mean", "cls", "last")
MARGIN_STRATEGIES = ("absolute", "relative")   # GISTEmbedLoss's false-negative margins


def problem(pooling="mean", scale=20.0, matryoshka_dims=(), margin_strategy="absolute"):
  """What is wrong with these settings (one sentence), or None; checked before any compute."""
  if margin_strategy not in MARGIN_STRATEGIES:
    return (f"margin_strategy={margin_strategy!r}; use one of {', '.join(MARGIN_STRATEGIES)} "
            "(sentence-transformers' GISTEmbedLoss).")
  if pooling not in POOLINGS:
    return f"pooling={pooling!r}; use one of {', '.join(POOLINGS)}."
  if not scale > 0:
    return (f"scale={scale}: the similarity scale must be > 0 (sentence-transformers' default "
            "is 20).")
  bad = [d for d in matryoshka_dims if int(d) <= 0]
  if bad:
    return f"matryoshka_dims={tuple(matryoshka_dims)}: each width must be >= 1."
  return None


def check_width(matryoshka_dims, hidden_size):
  """The Matryoshka widths above the encoder's hidden size (one sentence), or None."""
  over = [d for d in matryoshka_dims if d > hidden_size]
  return (f"matryoshka_dims={tuple(matryoshka_dims)}: {over} above the encoder's hidden size "
          f"{hidden_size}." if over else None)


def pool(hidden, mask, pooling="mean"):
  """[B, T, H] hidden states, [B, T] 1/0 mask (right-padded) -> [B, H] float32.

  mean: the average over real tokens (sentence-transformers' default); cls: position 0; last:
  the last real token (decoder-style embedders)."""
  hidden = hidden.astype(jnp.float32)
  m = mask.astype(jnp.float32)
  if pooling == "mean":
    return jnp.einsum("btf,bt->bf", hidden, m) / jnp.maximum(m.sum(-1, keepdims=True), 1e-9)
  if pooling == "cls":
    return hidden[:, 0]
  if pooling == "last":
    last = jnp.maximum(mask.astype(jnp.int32).sum(-1) - 1, 0)                     # [B]
    return jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
  raise ValueError(f"pooling={pooling!r}; use one of {', '.join(POOLINGS)}.")


def pool_packed(hidden, instance_ids, num_instances, pooling="mean"):
  """Packed rows (docs/packing.md: several texts end to end in one row, none attending to
  another) -> one vector per text. hidden [B, T, H], instance_ids [B, T] (0 = padding, k = the
  row's k-th text, 1..K) -> [B, K, H] float32, each text pooled over its own tokens as `pool`
  pools an unpacked one: mean of its tokens, cls its first, last its last; an absent text
  (k above the row's count) gets zeros."""
  hidden = hidden.astype(jnp.float32)
  t = hidden.shape[1]
  ks = jnp.arange(1, num_instances + 1, dtype=instance_ids.dtype)
  member = (instance_ids[:, :, None] == ks).astype(jnp.float32)        # [B, T, K]
  if pooling == "mean":
    total = jnp.einsum("btk,bth->bkh", member, hidden)
    return total / jnp.maximum(member.sum(1), 1.0)[..., None]
  if pooling in ("cls", "last"):
    pos = jnp.arange(t)[None, :, None]                                  # [1, T, 1]
    first = jnp.min(jnp.where(member > 0, pos, t), axis=1)              # [B, K]: t if absent
    last = jnp.max(jnp.where(member > 0, pos, -1), axis=1)              # [B, K]: -1 if absent
    at = jnp.clip(first if pooling == "cls" else last, 0, t - 1)
    out = jnp.take_along_axis(hidden, at[..., None], axis=1)            # [B, K, H]
    return jnp.where((last >= 0)[..., None], out, 0.0)
  raise ValueError(f"pooling={pooling!r}; use one of {', '.join(POOLINGS)}.")


def texts_of_rows(pooled, text_slots):
  """[R, K, H] vectors of packed rows' text slots, [B, S] int slot of each text of the batch's
  rows (row * K + k: data_pipelines.records.packing.pack_texts) -> [B, S, H], the layout of the unpacked
  model's output (anchor, positive, negatives). A gather over the global batch: on a sharded
  batch XLA moves the (small) vectors between devices, as info_nce's einsum does."""
  r, k, h = pooled.shape
  return jnp.take(pooled.reshape(r * k, h), text_slots, axis=0)


def normalise(x, eps=1e-12):
  """L2 normalisation along the last axis (torch's F.normalize: x / max(|x|, eps))."""
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def embed(pooled, matryoshka_dims=(), normalize=True):
  """{dim: [..., d] embedding}: the full vector and its first d dimensions for each Matryoshka
  d, each normalised after truncation (as sentence-transformers truncates, then compares)."""
  full = pooled.shape[-1]
  dims = sorted({full, *matryoshka_dims}, reverse=True)
  return {d: normalise(pooled[..., :d]) if normalize else pooled[..., :d] for d in dims}


# A masked logit: exp(it - max) is 0 in float32, and unlike -inf it keeps every gradient finite.
_MASKED = -1e30


def _cos(a, b):
  return jnp.einsum("id,jd->ij", normalise(a), normalise(b))


def _blocks(a, c, contrast_anchors=False, contrast_positives=False):
  """Cosines [B anchors, M, B rows] of every anchor against every row's candidates: block n < 1 + k
  row b's candidate n (its positive, then its k negatives); then, GISTEmbed's extra terms, every
  row's anchor (contrast_anchors: cos(a_i, a_b)) and every row's positive against anchor i's
  positive (contrast_positives: cos(c_i0, c_b0)). M = 1 + k (+ 1) (+ 1); stacked on axis 1, the
  candidate axis, so no reshape crosses the sharded rows."""
  an, cn = normalise(a), normalise(c)
  blocks = [jnp.einsum("id,bnd->inb", an, cn)]                          # [B, 1 + k, B]
  if contrast_anchors:
    blocks.append(jnp.einsum("id,bd->ib", an, an)[:, None])             # [B, 1, B]
  if contrast_positives:
    blocks.append(jnp.einsum("id,bd->ib", cn[:, 0], cn[:, 0])[:, None])  # [B, 1, B]
  return jnp.concatenate(blocks, axis=1)


def _texts_of_blocks(text_ids, contrast_anchors=False, contrast_positives=False):
  """[B, S] text ids (anchor, positive, negatives) -> [M, B]: the id of block n's row-b text,
  in _blocks' layout."""
  t = [text_ids[:, 1:].T]                                               # [1 + k, B]
  if contrast_anchors:
    t.append(text_ids[None, :, 0])
  if contrast_positives:
    t.append(text_ids[None, :, 1])
  return jnp.concatenate(t, axis=0)


def _guided(guide_sims, margin, margin_strategy):
  """GISTEmbed's false negatives: [B, M, B] guide cosines (_blocks' layout) -> [B, M, B] bool,
  True where the guide scores a candidate above anchor i's own pair (its diagonal of block 0,
  g_i) less the margin: g_i - margin ("absolute") or g_i - |g_i| margin ("relative")."""
  g = jnp.diagonal(guide_sims[:, 0, :])[:, None, None]                  # [B, 1, 1]
  slack = margin if margin_strategy == "absolute" else jnp.abs(g) * margin
  return guide_sims > g - slack


def false_negatives(text_ids=None, guide=None, margin=0.0, margin_strategy="absolute",
                    contrast_anchors=False, contrast_positives=False):
  """[B, M, B] bool, True for a candidate that is no negative of anchor i (_blocks' layout), or
  None when neither test is asked for:

    text_ids [B, S] int    the same id = the same input ids (embedding.load_split numbers each
                           distinct token sequence): a candidate whose text is anchor i's
                           positive's (a duplicate positive in another row, a hard negative
                           equal to the positive). By ids, not by embedding: with dropout two
                           copies of a text embed differently (sentence-transformers #3260).
    guide                  (guide anchors [B, G], guide candidates [B, 1 + k, G]): GISTEmbed's
                           mask (_guided) on the guide's cosines.

  Anchor i's own positive (block 0, row i) is never masked. On a sharded batch the comparisons
  are [B, M, B] elementwise ops over the global arrays (XLA moves the shards, as for the
  logits), so a duplicate on another device is found as one on this one."""
  if text_ids is None and guide is None:
    return None
  b = (text_ids if text_ids is not None else guide[0]).shape[0]
  m = (text_ids.shape[1] - 1 if text_ids is not None else guide[1].shape[1]) + int(
      contrast_anchors) + int(contrast_positives)
  out = jnp.zeros((b, m, b), bool)
  if text_ids is not None:
    texts = _texts_of_blocks(text_ids, contrast_anchors, contrast_positives)   # [M, B]
    out = out | (texts[None] == text_ids[:, 1, None, None])
  if guide is not None:
    g = _blocks(guide[0].astype(jnp.float32), guide[1].astype(jnp.float32), contrast_anchors,
                contrast_positives)
    out = out | _guided(g, margin, margin_strategy)
  own = (jnp.arange(m)[None, :, None] == 0) & jnp.eye(b, dtype=bool)[:, None, :]
  return out & ~own


def _false_negatives_back(a_ids, guide, margin, margin_strategy):
  """symmetric=True's second direction (each positive p_j over the anchors): [B positives, B
  anchors] bool, True for an anchor that is no negative of p_j: the same text as p_j's own
  anchor (a_ids: [B] text ids), or (guide) guide cos(p_j, a_i) above p_j's pair's less the
  margin. The own anchor (the diagonal) is never masked."""
  b = (a_ids if a_ids is not None else guide[0]).shape[0]
  out = jnp.zeros((b, b), bool)
  if a_ids is not None:
    out = out | (a_ids[None, :] == a_ids[:, None])
  if guide is not None:
    back = _cos(guide[1][:, 0].astype(jnp.float32), guide[0].astype(jnp.float32))   # [B, B]
    out = out | _guided(back[:, None, :], margin, margin_strategy)[:, 0]
  return out & ~jnp.eye(b, dtype=bool)


def info_nce(anchors, candidates, scale=20.0, symmetric=False, weights=None, *, text_ids=None,
             guide=None, margin=0.0, margin_strategy="absolute", contrast_anchors=False,
             contrast_positives=False):
  """MNRL's loss. anchors [B, D]; candidates [B, 1 + k, D] (positive first, then k hard
  negatives); weights [B] (1.0 real row, 0.0 padding: a padding row is no anchor and no
  candidate) -> scalar float32.

  False negatives out (false_negatives; every option off = MNRL):
    text_ids [B, S]     candidates with anchor i's positive's input ids (mask_duplicates)
    guide               (guide anchors [B, G], guide candidates [B, 1 + k, G]): GISTEmbed's
                        guided mask, sentence-transformers' GISTEmbedLoss(margin_strategy,
                        margin, contrast_anchors, contrast_positives, temperature=1 / scale)
                        on these embeddings and the guide's, for any k (GISTEmbedLoss: k <= 1)
    contrast_anchors    GISTEmbedLoss's: every row's anchor is a candidate of anchor i too, and
    contrast_positives  every row's positive one of anchor i's positive (guide only)"""
  if (contrast_anchors or contrast_positives) and guide is None:
    raise ValueError("info_nce: contrast_anchors / contrast_positives are GISTEmbed's terms; "
                     "they need a guide (its mask drops each text's own copy).")
  a = anchors.astype(jnp.float32)
  c = candidates.astype(jnp.float32)
  b = c.shape[0]
  w = jnp.ones((b,), jnp.float32) if weights is None else weights.astype(jnp.float32)
  # [B anchors, M, B rows]: every anchor against every row's positive and negatives (and GIST's
  # anchors and positives). Kept 3-d (MNRL's [B, (1 + k) B] columns, unflattened) so no reshape
  # crosses the sharded axis.
  logits = scale * _blocks(a, c, contrast_anchors, contrast_positives)
  logits = jnp.where(w[None, None, :] > 0, logits, _MASKED)   # padding rows' candidates drop out
  drop = false_negatives(text_ids, guide, margin, margin_strategy, contrast_anchors,
                         contrast_positives)
  if drop is not None:
    logits = jnp.where(drop, _MASKED, logits)
  positive = jnp.diagonal(logits[:, 0, :])                 # [B]: a_i . c_i0
  log_z = jax.nn.logsumexp(logits, axis=(1, 2))
  if symmetric:   # each positive over every anchor ("doc_to_query")
    back = jnp.where(w[None, :] > 0, scale * _cos(c[:, 0], a), _MASKED)   # [B, B]
    if text_ids is not None or guide is not None:
      back = jnp.where(_false_negatives_back(None if text_ids is None else text_ids[:, 0],
                                             guide, margin, margin_strategy), _MASKED, back)
    log_z = (log_z + jax.nn.logsumexp(back, axis=-1)) / 2
  per_row = log_z - positive
  return jnp.sum(jnp.where(w > 0, per_row, 0.0) * w) / jnp.maximum(jnp.sum(w), 1e-5)


def matryoshka_info_nce(anchors, candidates, dims=(), scale=20.0, symmetric=False,
                        weights=None, **false_negative_options):
  """info_nce summed over each Matryoshka width d in `dims` (the first d dimensions, compared
  after truncation: sentence-transformers' MatryoshkaLoss(matryoshka_dims=dims) with every
  weight 1); dims=() is the full width alone. false_negative_options (text_ids, guide, margin,
  ...: info_nce's) are the same at every width (the guide is not truncated)."""
  return sum(info_nce(anchors[..., :d], candidates[..., :d], scale, symmetric, weights,
                      **false_negative_options)
             for d in (dims or (anchors.shape[-1],)))


def chunk_rows(x, n):
  """[B, ...] -> [n, B/n, ...]; chunk i holds rows i, i + n, i + 2n, ... Strided, as
  trainer_lib.split_micro_batches: each device's slice of a data-sharded batch splits into n
  equal local parts (n divides the per-device rows), so no row moves between devices."""
  return x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)


def unchunk_rows(x):
  """chunk_rows' inverse: [n, B/n, ...] -> [B, ...] in the original row order."""
  return x.swapaxes(0, 1).reshape(-1, *x.shape[2:])


def grad_cache(embed, params, inputs, loss_of_embeddings, num_chunks, rng=None, *,
               has_aux=False, constrain=None):
  """(loss, d loss / d params) of loss_of_embeddings(embed(params, inputs)), holding one chunk's
  activations at a time: GradCache (Gao et al. 2021; sentence-transformers' CachedMNRL).

    embed(params, chunk, rng) -> [b, ...] float32 embeddings of a chunk of rows (rng: dropout)
    inputs                    a pytree of arrays with a leading [B] rows axis
    loss_of_embeddings        [B, ...] embeddings -> scalar (has_aux: (scalar, aux), and the
                              result is ((loss, aux), grads), as jax.value_and_grad's)
    constrain                 applied to every [num_chunks, B/num_chunks, ...] array (the loop:
                              a sharding constraint keeping each chunk's rows on their devices)

  1. every chunk's embeddings without gradients (lax.map: one chunk's activations live at a
     time); 2. the loss and its gradient with respect to all B embeddings (the contrastive loss
  sees the whole batch); 3. each chunk again under jax.vjp with that gradient as cotangent,
  summed over chunks (lax.scan). Chunk i (rows i, i + n, ...: chunk_rows) uses the same rng in
  passes 1 and 3, so its dropout masks are the same in both (sentence-transformers #3862:
  earlier CachedMNRL versions redrew them and gave silently wrong gradients). The result is the
  gradient of the loss of the embeddings pass 1 computed: the unchunked gradient when that uses
  the chunks' rngs, and exactly it without dropout."""
  b = jax.tree.leaves(inputs)[0].shape[0]
  if b % num_chunks:
    raise ValueError(f"grad_cache: {num_chunks} chunks do not divide the batch of {b} rows.")
  constrain = constrain or (lambda x: x)
  chunks = jax.tree.map(lambda x: constrain(chunk_rows(x, num_chunks)), inputs)
  rngs = (jax.random.split(rng, num_chunks) if rng is not None
          else jnp.zeros((num_chunks, 2), jnp.uint32))
  use_rng = rng is not None

  def one(p, chunk, r):
    return embed(p, chunk, r if use_rng else None)

  emb = jax.lax.map(lambda xs: jax.lax.stop_gradient(one(params, *xs)), (chunks, rngs))
  emb = unchunk_rows(constrain(emb))                                     # [B, ...]
  value, d_emb = jax.value_and_grad(loss_of_embeddings, has_aux=has_aux)(emb)
  d_chunks = constrain(chunk_rows(d_emb, num_chunks))                    # [n, B/n, ...]

  def accumulate(total, xs):
    chunk, r, d = xs
    _, vjp = jax.vjp(lambda p: one(p, chunk, r), params)
    return jax.tree.map(jnp.add, total, vjp(d)[0]), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  grads, _ = jax.lax.scan(accumulate, zeros, (chunks, rngs, d_chunks))
  return value, grads
