"""False negatives out of InfoNCE (issue 48 item 2; bert_jax/objectives/contrastive.py):

  text_ids  a candidate with the anchor's positive's input ids is no negative (mask_duplicates):
            against a per-anchor reference written with loops over the texts, and against
            sentence-transformers' GISTEmbedLoss with a guide that knows only which texts are equal
  guide     GISTEmbed's mask: equal to sentence-transformers' (6.2) GISTEmbedLoss on the same
            embeddings and guide embeddings, loss and gradients within 1e-5, every margin
            strategy and contrast option
and both on the global batch sharded over 8 devices (a duplicate on another device is found).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.objectives import contrastive
from bert_jax.parallel import sharding as sharding_lib

B, D, G = 8, 16, 12


def _batch(k, seed=0, b=B):
  """anchors [b, D], candidates [b, 1 + k, D], guide vectors [b, 1 + k... ] close to them (so the
  guide's mask bites), and text ids with duplicates: rows 1 and 5 share their positive, row 3's
  last hard negative is its own positive's text, row 6's positive is row 2's negative, rows
  0 and 4 share their anchor."""
  rng = np.random.default_rng(seed)
  a = rng.normal(size=(b, D)).astype(np.float32)
  c = (0.3 * a[:, None] + rng.normal(size=(b, 1 + k, D))).astype(np.float32)
  c[:, 0] += a   # positives nearer their anchors than the hard negatives
  ids = np.arange(b * (2 + k), dtype=np.int32).reshape(b, 2 + k)
  texts = np.concatenate([a[:, None], c], axis=1)                       # [b, 2 + k, D]
  same = [((5, 1), (1, 1)), ((4, 0), (0, 0))]   # 4, 0: the same query twice (symmetric term)
  if k:
    same += [((3, 1 + k), (3, 1)), ((6, 1), (2, 2))]
  for (r, s), (r0, s0) in same:   # a copy embeds as its original up to dropout's noise
    ids[r, s] = ids[r0, s0]
    texts[r, s] = texts[r0, s0] + 0.05 * rng.normal(size=D)
  a, c = texts[:, 0], texts[:, 1:]
  mix = rng.normal(size=(D, G)).astype(np.float32)
  ga = (a @ mix + 0.5 * rng.normal(size=(b, G))).astype(np.float32)
  gc = (c @ mix + 0.5 * rng.normal(size=(b, 1 + k, G))).astype(np.float32)
  return a, c, ga, gc, ids


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _reference(a, c, ids=None, scale=20.0, symmetric=False, weights=None, guide=None,
               margin=0.0):
  """Each anchor's cross-entropy over the candidates that are negatives (its own positive kept),
  written as loops over texts (float64), the spec of both masks: not one with its positive's
  text (ids), not one the guide scores above cos_guide(a_i, p_i) - margin (guide: (anchors,
  candidates) with GISTEmbed's contrast terms: every row's anchor, every row's positive against
  p_i). symmetric: each positive over the anchors, the same two tests against its own anchor."""
  a, c = _unit(a.astype(np.float64)), _unit(c.astype(np.float64))
  b, m = c.shape[:2]
  w = np.ones(b) if weights is None else weights
  if guide is not None:
    ga, gc = _unit(guide[0].astype(np.float64)), _unit(guide[1].astype(np.float64))
  total = 0.0
  for i in range(b):
    if not w[i]:
      continue
    # (ours, the guide's, the same text as the positive?) for each candidate of anchor i
    cands = [(a[i] @ c[j, n], None if guide is None else ga[i] @ gc[j, n],
              ids is not None and ids[j, 1 + n] == ids[i, 1])
             for j in range(b) for n in range(m) if w[j] and (j, n) != (i, 0)]
    if guide is not None:
      cands += [(a[i] @ a[j], ga[i] @ ga[j], ids is not None and ids[j, 0] == ids[i, 1])
                for j in range(b) if w[j]]
      cands += [(c[i, 0] @ c[j, 0], gc[i, 0] @ gc[j, 0], ids is not None and ids[j, 1] == ids[
          i, 1]) for j in range(b) if w[j]]
      bar = ga[i] @ gc[i, 0] - margin
    logits = [scale * a[i] @ c[i, 0]] + [scale * x for x, g, same in cands
                                         if not same and (guide is None or g <= bar)]
    loss = np.log(np.exp(logits).sum()) - logits[0]
    if symmetric:   # positive i over the anchors that are not its own anchor's text
      back = [scale * c[i, 0] @ a[i]]
      for j in range(b):
        same = ids is not None and ids[j, 0] == ids[i, 0]
        guided = guide is not None and gc[i, 0] @ ga[j] > gc[i, 0] @ ga[i] - margin
        if w[j] and j != i and not same and not guided:
          back.append(scale * c[i, 0] @ a[j])
      loss = (loss + np.log(np.exp(back).sum()) - back[0]) / 2
    total += w[i] * loss
  return total / w.sum()


@pytest.mark.parametrize("k,symmetric", [(0, False), (1, False), (2, False), (2, True)])
def test_duplicates_of_the_positive_are_no_negatives(k, symmetric):
  a, c, _, _, ids = _batch(k)
  got = contrastive.info_nce(a, c, symmetric=symmetric, text_ids=jnp.asarray(ids))
  assert float(got) == pytest.approx(_reference(a, c, ids, symmetric=symmetric), rel=1e-5)
  plain = contrastive.info_nce(a, c, symmetric=symmetric)
  assert abs(float(got) - float(plain)) > 1e-3    # the duplicates were in the plain loss
  # No duplicates: the plain loss (MNRL's, tests/bert_jax/objectives/contrastive_test.py).
  distinct = np.arange(ids.size, dtype=np.int32).reshape(ids.shape)
  assert float(contrastive.info_nce(a, c, symmetric=symmetric, text_ids=distinct)) == (
      pytest.approx(float(plain), rel=1e-6))


def test_duplicates_with_padding_rows_and_matryoshka():
  a, c, _, _, ids = _batch(1)
  w = np.array([1.0] * 6 + [0.0] * 2, np.float32)
  got = contrastive.info_nce(a, c, weights=jnp.asarray(w), text_ids=jnp.asarray(ids))
  assert float(got) == pytest.approx(_reference(a, c, ids, weights=w), rel=1e-5)
  both = contrastive.matryoshka_info_nce(a, c, (16, 4), text_ids=jnp.asarray(ids))
  assert float(both) == pytest.approx(
      _reference(a, c, ids) + _reference(a[:, :4], c[..., :4], ids), rel=1e-5)


def _gist(anchors, candidates, guide_a, guide_c, scale=20.0, **kw):
  """sentence-transformers' GISTEmbedLoss (torch CPU) on these embeddings and guide embeddings
  (its forward, with embed_columns answering the model's and the guide's columns): loss and the
  gradients with respect to the embeddings."""
  torch = pytest.importorskip("torch")
  gist_embed = pytest.importorskip("sentence_transformers.sentence_transformer.losses.gist_embed")
  loss = gist_embed.GISTEmbedLoss.__new__(gist_embed.GISTEmbedLoss)
  torch.nn.Module.__init__(loss)
  loss.model, loss.guide, loss.must_retokenize = "model", "guide", False
  loss.temperature, loss.similarity_fct = 1.0 / scale, torch.nn.CosineSimilarity(dim=-1)
  loss.margin_strategy, loss.margin = kw.get("margin_strategy", "absolute"), kw.get("margin", 0.0)
  loss.contrast_anchors = kw.get("contrast_anchors", True)
  loss.contrast_positives = kw.get("contrast_positives", True)
  loss.gather_across_devices, loss.cross_entropy_loss = False, torch.nn.CrossEntropyLoss()
  a = torch.tensor(anchors, requires_grad=True)
  c = torch.tensor(candidates, requires_grad=True)
  columns = {"model": [a] + [c[:, j] for j in range(c.shape[1])],
             "guide": [torch.tensor(guide_a)] + [torch.tensor(guide_c[:, j])
                                                 for j in range(guide_c.shape[1])]}
  real = gist_embed.embed_columns
  gist_embed.embed_columns = lambda model, features: columns[model]
  try:
    value = loss([{}] * (1 + c.shape[1]), None)
  finally:
    gist_embed.embed_columns = real
  value.backward()
  return value.item(), a.grad.numpy(), c.grad.numpy()


def _ours(a, c, **kw):
  loss, grads = jax.value_and_grad(lambda x, y: contrastive.info_nce(x, y, **kw),
                                   argnums=(0, 1))(jnp.asarray(a), jnp.asarray(c))
  return float(loss), np.asarray(grads[0]), np.asarray(grads[1])


def _same(got, want):
  assert got[0] == pytest.approx(want[0], rel=1e-5, abs=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k,strategy,margin,anchors,positives,scale", [
    (0, "absolute", 0.0, True, True, 100.0), (1, "absolute", 0.0, True, True, 20.0),
    (1, "absolute", 0.1, False, True, 20.0), (1, "relative", 0.2, True, False, 20.0),
    (0, "relative", 0.05, False, False, 50.0), (1, "absolute", -0.1, True, True, 20.0)])
def test_guided_mask_equals_gist_embed_loss(k, strategy, margin, anchors, positives, scale):
  a, c, ga, gc, _ = _batch(k, seed=1)
  kw = dict(margin_strategy=strategy, margin=margin, contrast_anchors=anchors,
            contrast_positives=positives)
  got = _ours(a, c, scale=scale, guide=(jnp.asarray(ga), jnp.asarray(gc)), **kw)
  _same(got, _gist(a, c, ga, gc, scale=scale, **kw))
  # The guide masked some candidates, not all: the loss is neither MNRL's nor trivial.
  drop = contrastive.false_negatives(guide=(ga, gc), margin=margin, margin_strategy=strategy,
                                     contrast_anchors=anchors, contrast_positives=positives)
  assert 0 < int(drop[:, :1 + k].sum()) < drop[:, :1 + k].size - B


def test_duplicate_mask_equals_gist_embed_loss_with_a_guide_that_knows_only_equal_texts():
  """A guide vector one-hot in the text's id (the anchor's: its positive's id) scores 1 exactly
  the candidates with the positive's text and 0 the rest: GISTEmbedLoss(margin=0.5, no contrast
  terms) masks what mask_duplicates does."""
  a, c, _, _, ids = _batch(1, seed=2)
  eye = np.eye(ids.max() + 1, dtype=np.float32)
  want = _gist(a, c, eye[ids[:, 1]], eye[ids[:, 1:]], margin=0.5, contrast_anchors=False,
               contrast_positives=False)
  _same(_ours(a, c, text_ids=jnp.asarray(ids)), want)


@pytest.mark.parametrize("symmetric", [False, True])
def test_both_masks_together_against_the_loop_reference(symmetric):
  """Duplicates and the guide at once, k = 2 (GISTEmbedLoss takes one negative), symmetric (it
  has no second direction): the loops' spec."""
  a, c, ga, gc, ids = _batch(2, seed=4)
  got = contrastive.info_nce(a, c, symmetric=symmetric, text_ids=ids, guide=(ga, gc),
                             margin=0.1, contrast_anchors=True, contrast_positives=True)
  want = _reference(a, c, ids, symmetric=symmetric, guide=(ga, gc), margin=0.1)
  assert float(got) == pytest.approx(want, rel=1e-5)


def test_contrast_terms_need_a_guide():
  a, c, _, _, ids = _batch(1)
  with pytest.raises(ValueError, match="contrast_anchors / contrast_positives are GISTEmbed's"):
    contrastive.info_nce(a, c, text_ids=ids, contrast_anchors=True)
  assert contrastive.problem(margin_strategy="percent") == (
      "margin_strategy='percent'; use one of absolute, relative (sentence-transformers' "
      "GISTEmbedLoss).")


def test_on_the_sharded_global_batch_a_duplicate_on_another_device_is_masked():
  """32 rows over 8 devices (4 a device): rows 1 and 5 (devices 0 and 1) share a positive, row
  6's positive is row 2's negative. The sharded loss and gradients equal the unsharded ones with
  both masks on, and the duplicates across devices did change the loss."""
  n = jax.device_count()
  a, c, ga, gc, ids = _batch(1, seed=3, b=4 * n)
  mesh = sharding_lib.create_mesh((-1, 1, 1))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))

  def loss(x, y, t, g0, g1):
    return contrastive.info_nce(x, y, symmetric=True, text_ids=t, guide=(g0, g1), margin=0.1)
  fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  args = [jnp.asarray(x) for x in (a, c, ids, ga, gc)]
  want_loss, want_grads = fn(*args)
  sharded = [jax.device_put(x, rows) for x in args]
  got_loss, got_grads = fn(*sharded)
  assert len(sharded[0].sharding.device_set) == n
  assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-6)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)
  # Duplicates alone, sharded: the loop reference, and not the unmasked loss.
  dup = jax.jit(lambda x, y, t: contrastive.info_nce(x, y, text_ids=t))(*sharded[:3])
  assert float(dup) == pytest.approx(_reference(a, c, ids), rel=1e-5)
  assert abs(float(dup) - float(contrastive.info_nce(a, c))) > 1e-2
