"""bert_jax/objectives/contrastive.py: pooling, and InfoNCE equal to sentence-transformers' (6.x)
MultipleNegativesRankingLoss on the same embeddings, loss and gradients within 1e-5; the same on
the global batch sharded over 8 devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.objectives import contrastive
from bert_jax.parallel import sharding as sharding_lib

B, D = 8, 16


def _embeddings(k, seed=0, b=B):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(b, D)).astype(np.float32),
          rng.normal(size=(b, 1 + k, D)).astype(np.float32))


def _sentence_transformers(anchors, candidates, scale=20.0, symmetric=False, dims=()):
  """MNRL's loss and its gradients with respect to the embeddings (torch CPU)."""
  torch = pytest.importorskip("torch")
  losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
  kw = (dict(directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction")
        if symmetric else {})
  mnrl = losses.MultipleNegativesRankingLoss(model=None, scale=scale, **kw)
  a = torch.tensor(anchors, requires_grad=True)
  c = torch.tensor(candidates, requires_grad=True)
  total = 0
  for d in dims or (D,):   # MatryoshkaLoss: the inner loss on truncated embeddings, weights 1
    total = total + mnrl.compute_loss_from_embeddings(
        [a[:, :d]] + [c[:, j, :d] for j in range(c.shape[1])], None)
  total.backward()
  return total.detach().item(), a.grad.numpy(), c.grad.numpy()


def _ours(anchors, candidates, **kw):
  loss, grads = jax.value_and_grad(
      lambda a, c: contrastive.matryoshka_info_nce(a, c, **kw), argnums=(0, 1))(
          jnp.asarray(anchors), jnp.asarray(candidates))
  return float(loss), np.asarray(grads[0]), np.asarray(grads[1])


@pytest.mark.parametrize("k,symmetric,dims", [
    (0, False, ()), (1, False, ()), (3, False, ()), (0, True, ()), (2, True, ()),
    (2, False, (16, 8, 4))])
def test_equals_multiple_negatives_ranking_loss(k, symmetric, dims):
  anchors, candidates = _embeddings(k)
  want = _sentence_transformers(anchors, candidates, symmetric=symmetric, dims=dims)
  got = _ours(anchors, candidates, scale=20.0, symmetric=symmetric, dims=dims)
  assert got[0] == pytest.approx(want[0], rel=1e-5, abs=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-5)


def test_padding_rows_are_neither_anchors_nor_candidates():
  anchors, candidates = _embeddings(2)
  w = np.array([1.0] * 6 + [0.0] * 2, np.float32)
  padded = contrastive.info_nce(anchors, candidates, weights=jnp.asarray(w))
  real = contrastive.info_nce(anchors[:6], candidates[:6])
  assert float(padded) == pytest.approx(float(real), rel=1e-6)
  grads = jax.grad(lambda a: contrastive.info_nce(a, candidates, weights=jnp.asarray(w)))(
      jnp.asarray(anchors))
  assert np.isfinite(np.asarray(grads)).all() and not np.asarray(grads)[6:].any()


def test_the_global_batch_sharded_over_devices_gives_the_same_loss_and_gradients():
  """Each device holds B/8 anchors and their candidates; every anchor still scores every
  device's candidates (the loss is that of the whole batch, not a per-device one)."""
  n = jax.device_count()
  anchors, candidates = _embeddings(2, seed=3, b=4 * n)
  mesh = sharding_lib.create_mesh((-1, 1, 1))   # the training loops' (data, fsdp, tensor) mesh
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  fn = jax.jit(jax.value_and_grad(lambda a, c: contrastive.info_nce(a, c, symmetric=True),
                                  argnums=(0, 1)))
  want_loss, want_grads = fn(jnp.asarray(anchors), jnp.asarray(candidates))
  a, c = jax.device_put(anchors, rows), jax.device_put(candidates, rows)
  got_loss, got_grads = fn(a, c)
  assert len(a.sharding.device_set) == n
  assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-6)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)
  # Not the mean of per-device losses: those see 4 rows' candidates each.
  local = np.mean([float(contrastive.info_nce(anchors[i::n], candidates[i::n], symmetric=True))
                   for i in range(n)])
  assert abs(local - float(want_loss)) > 0.1


def test_pooling():
  rng = np.random.default_rng(0)
  h = rng.normal(size=(2, 5, 3)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
  np.testing.assert_allclose(contrastive.pool(h, mask, "mean"),
                             [h[0, :3].mean(0), h[1].mean(0)], rtol=1e-6)
  np.testing.assert_allclose(contrastive.pool(h, mask, "cls"), h[:, 0])
  np.testing.assert_allclose(contrastive.pool(h, mask, "last"), [h[0, 2], h[1, 4]])
  e = contrastive.embed(jnp.asarray(h[:, 0]), matryoshka_dims=(2,))
  assert sorted(e) == [2, 3] and np.allclose(np.linalg.norm(e[2], axis=-1), 1.0)
  np.testing.assert_allclose(e[2] * np.linalg.norm(h[:, 0, :2], axis=-1, keepdims=True),
                             h[:, 0, :2], rtol=1e-6)


def test_settings_no_embedding_can_have():
  assert contrastive.problem("mean", 20.0, (256, 768)) is None
  assert contrastive.problem("max") == "pooling='max'; use one of mean, cls, last."
  assert contrastive.problem(scale=0.0).startswith("scale=0.0: the similarity scale must be > 0")
  assert contrastive.problem(matryoshka_dims=(0,)) == (
      "matryoshka_dims=(0,): each width must be >= 1.")
  assert contrastive.check_width((256, 768), 768) is None
  assert contrastive.check_width((1024, 256), 768) == (
      "matryoshka_dims=(1024, 256): [1024] above the encoder's hidden size 768.")


def _tiny_embedder(dropout):
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks import embedding  # pylint: disable=g-import-not-at-top
  cfg = model_lib.get_bert_config("tiny", vocab_size=40, hidden_size=32, num_heads=2,
                                  intermediate_size=64, max_position_embeddings=16,
                                  hidden_dropout_prob=dropout, attention_dropout_prob=dropout)
  model = embedding.EmbeddingModel(cfg, "mean")
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(5, 40, (8, 3, 12)), jnp.int32)          # [B, S, T]
  mask = jnp.asarray(np.arange(12)[None, None, :] < rng.integers(4, 13, (8, 3, 1)), jnp.int32)
  inputs = dict(input_ids=ids, input_mask=mask, segment_ids=jnp.zeros_like(ids))
  params = nn.unbox(model.init(jax.random.PRNGKey(0), ids[:1], mask[:1],
                               inputs["segment_ids"][:1])["params"])

  def embed(p, x, r):
    kw = dict(deterministic=False, rngs={"dropout": r}) if r is not None else {}
    return model.apply({"params": p}, x["input_ids"], x["input_mask"], x["segment_ids"], **kw)
  return embed, params, inputs


def _close(got, want):
  """Gradients equal to float32 summation order: each leaf within 1e-5 of its largest entry."""
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())))


def _loss_of(e):
  return contrastive.matryoshka_info_nce(e[:, 0], e[:, 1:], (32, 8), 20.0, True)


@pytest.mark.slow
def test_grad_cache_equals_the_unchunked_gradient():
  embed, params, inputs = _tiny_embedder(0.0)
  want_loss, want = jax.value_and_grad(lambda p: _loss_of(embed(p, inputs, None)))(params)
  for chunks in (1, 2, 4, 8):
    loss, got = jax.jit(lambda p, x, n=chunks: contrastive.grad_cache(embed, p, x, _loss_of, n))(
        params, inputs)
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-6)
    _close(got, want)
  with pytest.raises(ValueError, match="3 chunks do not divide the batch of 8 rows"):
    contrastive.grad_cache(embed, params, inputs, _loss_of, 3)


@pytest.mark.slow
def test_grad_cache_with_dropout_uses_each_chunks_masks_in_both_passes():
  """With dropout on, the chunked gradient is that of the loss of the first pass's embeddings:
  the unchunked gradient when each chunk of rows draws from its own rng, as in the first pass."""
  embed, params, inputs = _tiny_embedder(0.1)
  rng, n = jax.random.PRNGKey(7), 4
  rngs = jax.random.split(rng, n)

  def reference(p):   # the whole batch in one graph, chunk i (rows i, i + n, ...) under rngs[i]
    parts = [embed(p, jax.tree.map(lambda x, i=i: x[i::n], inputs), rngs[i]) for i in range(n)]
    return _loss_of(contrastive.unchunk_rows(jnp.stack(parts)))

  want_loss, want = jax.value_and_grad(reference)(params)
  loss, got = jax.jit(lambda p, x: contrastive.grad_cache(embed, p, x, _loss_of, n, rng))(
      params, inputs)
  assert float(loss) == pytest.approx(float(want_loss), rel=1e-6)
  _close(got, want)
  # Another draw in the second pass would be another gradient: the masks matter at this size.
  other = jax.grad(lambda p: _loss_of(embed(p, inputs, jax.random.PRNGKey(8))))(params)
  assert max(float(jnp.max(jnp.abs(a - b))) for a, b in
             zip(jax.tree.leaves(other), jax.tree.leaves(want))) > 1e-3


@pytest.mark.slow
def test_pool_packed_pools_each_text_as_the_unpacked_encoder_does():
  """Six texts of 3-9 tokens packed up to 4 a row (data_pipelines.records.packing, as fine-tuning packs)
  through a tiny BERT: each text's mean / cls / last vector from its packed row equals the one
  from its own unpacked row (1e-5); empty slots are zeros."""
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  from data_pipelines.records import packing  # pylint: disable=g-import-not-at-top
  cfg = model_lib.get_bert_config("tiny", vocab_size=40, hidden_size=32, num_heads=2,
                                  intermediate_size=64, max_position_embeddings=32)
  rng = np.random.default_rng(1)
  n, t, k = 6, 24, 4
  lengths = np.array([3, 9, 5, 4, 7, 6])
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)          # [N, T]
  ids = rng.integers(5, 40, (n, t)).astype(np.int32) * mask
  features = dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids),
                  label_ids=np.arange(n))                 # label = the text's own index
  packed = packing.pack_examples(features, max_instances=k)
  assert len(packed["input_ids"]) < n                     # some rows hold several texts
  model = model_lib.BertModel(cfg)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), ids[:1], mask[:1], ids[:1] * 0))
  apply = jax.jit(lambda x, m, s, **kw: model.apply(params, x, m, s, **kw)["sequence_output"])
  alone = apply(ids, mask, np.zeros_like(ids))                            # [N, T, H]
  rows = apply(packed["input_ids"], packed["input_mask"], packed["segment_ids"],
               instance_ids=packed["instance_ids"], position_ids=packed["position_ids"])
  present = packed["example_weights"] > 0                                 # [R, K]
  for pooling in contrastive.POOLINGS:
    want = np.asarray(contrastive.pool(alone, mask, pooling))             # [N, H]
    got = np.asarray(contrastive.pool_packed(rows, jnp.asarray(packed["instance_ids"]), k,
                                             pooling))                    # [R, K, H]
    np.testing.assert_allclose(got[present], want[packed["label_ids"][present]], atol=1e-5)
    assert not got[~present].any()
