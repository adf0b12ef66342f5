"""Packed embedding batches (issue 40 item 2): --config.pack=true with custom.type=embedding.

Each training batch's B x S texts (anchor, positive, hard negatives) go into R rows of T tokens,
at most K texts a row (data_pipelines.records.packing.pack_texts), each text pooled on its own
(contrastive.pool_packed) and put back in the [B, S, H] layout (contrastive.texts_of_rows):
  * the rows hold every text of the batch once, at the slot text_slots names, positions
    restarting per text; R is the most any batch of the run needs, so no text is dropped;
  * the packed step's InfoNCE loss and gradients equal the unpacked step's on the same batch
    (float32, dropout off, 1e-5): BERT (learned positions: a row's positions instead of each
    text's own change the loss by 3%) and ModernBERT (a local window narrower than the row; its
    RoPE is relative, so there the positions could not show, only the block-diagonal mask),
    mean / cls / last pooling; every other family's tiny preset, mean (MobileBERT: its trigram
    input reads the padding id's embedding after a text's last token, in packed rows too);
    GradCache on 8 devices too (slow);
  * a bad max_instances_per_pack is one line before compute.
"""

import jax
import numpy as np
import pytest

from bert_jax import finetune
from bert_jax.training import finetune_tasks as ft
from bert_jax.models import heads
from bert_jax.models import model as model_lib
from bert_jax.parallel import sharding as sharding_lib
from bert_jax import tasks
from bert_jax.training import trainer_lib
from bert_jax.configs import finetune as finetune_config
from bert_jax.tasks import common
from bert_jax.tasks import embedding
from data_pipelines.tasks.common import TaskDataError

B, S, T, VOCAB, K = 8, 3, 24, 40, 4   # rows (anchor, positive, negative), tokens, texts a row
KEYS = ("input_ids", "input_mask", "segment_ids")


def _config(batch_size=B, k=K):
  c = finetune_config.get_config("custom,runlocal")
  c.custom.type, c.max_seq_length, c.batch_size = "embedding", T, batch_size
  c.pack, c.max_instances_per_pack = True, k
  return c


def _features(n=B, seed=0):
  """[n, S, T] texts: short anchors (3-8 tokens, as queries are), longer candidates (6-T)."""
  rng = np.random.default_rng(seed)
  lengths = np.concatenate([rng.integers(3, 9, (n, 1)), rng.integers(6, T + 1, (n, S - 1))], 1)
  mask = (np.arange(T)[None, None, :] < lengths[..., None]).astype(np.int32)
  ids = rng.integers(5, VOCAB, (n, S, T)).astype(np.int32) * mask
  return dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids))


def _split(features):
  return common.Split("train", [None] * len(features["input_ids"]), features)


def _mesh(devices=1):
  return trainer_lib.create_mesh((-1, 1, 1), B, devices=jax.devices()[:devices])


def test_packed_rows_hold_every_text_of_the_batch_once_at_its_slot():
  f = _features(20, seed=1)
  batches = [np.arange(0, 8), np.arange(8, 16), np.arange(16, 20)]   # the last one partial
  task = embedding.EmbeddingTask("t", {})
  host_batch, line = embedding.pack_batches(task, _split(f), _config(), batches, _mesh())
  packed = [host_batch(idx) for idx in batches]
  rows = {len(p["input_ids"]) for p in packed}
  assert len(rows) == 1   # static: every batch R rows of T
  r = rows.pop()
  assert "into %d rows of %d tokens (<= %d texts a row" % (r, T, K) in line
  assert r * 1.5 < B * S   # fewer rows than texts: 14 rows for 24 texts of 3-24 tokens
  for idx, p in zip(batches, packed):
    assert p["input_ids"].shape == (r, T) and p["cls_positions"].shape == (r, K)
    _check_rows(f, idx, p)


def _check_rows(f, idx, p):
  """Every text of the batch's rows idx at its slot, positions its own, nothing else."""
  assert p["text_slots"].shape == (B, S)
  np.testing.assert_array_equal(p["example_weights"], np.arange(B) < len(idx))
  slots = p["text_slots"][:len(idx)].reshape(-1)
  assert len(set(slots.tolist())) == len(slots)   # one slot per text
  for j, slot in enumerate(slots):
    i, s = divmod(j, S)
    row, k = divmod(int(slot), K)
    at = p["instance_ids"][row] == k + 1
    n = f["input_mask"][idx[i], s].sum()
    np.testing.assert_array_equal(p["input_ids"][row][at], f["input_ids"][idx[i], s, :n])
    np.testing.assert_array_equal(p["position_ids"][row][at], np.arange(n))
    assert p["cls_positions"][row, k] == np.flatnonzero(at)[0]
  assert p["input_mask"].sum() == f["input_mask"][idx].sum()   # nothing else in the rows


def test_each_host_takes_its_share_of_rows_and_of_examples(monkeypatch):
  """On 2 hosts each builds the same packed global batch and keeps its half of the rows (R even)
  and of the examples' slots, which index the global rows (make_global_batch joins them)."""
  f, idx = _features(), np.arange(B - 1)
  task = embedding.EmbeddingTask("t", {})
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  host_batch, _ = embedding.pack_batches(task, _split(f), _config(), [idx], _mesh())
  parts = []
  for h in (0, 1):
    monkeypatch.setattr(jax, "process_index", lambda h=h: h)
    parts.append(host_batch(idx))
  assert len(parts[0]["input_ids"]) == len(parts[1]["input_ids"])   # R / 2 rows each
  assert len(parts[0]["text_slots"]) == len(parts[1]["text_slots"]) == B // 2
  whole = {k: np.concatenate([parts[0][k], parts[1][k]]) for k in parts[0]}
  _check_rows(f, idx, whole)


def test_a_bad_texts_a_row_is_one_line_before_compute():
  with pytest.raises(TaskDataError, match=r"^config.max_instances_per_pack=-1: the texts a "
                                          r"packed row holds must be >= 1"):
    embedding.pack_batches(embedding.EmbeddingTask("t", {}), _split(_features()),
                           _config(k=-1), [np.arange(B)], _mesh())
  # Another task type packs its split once or not at all: embedding's hook, not classification's.
  assert tasks.get("embedding").packable and tasks.get("classification").pack_batches is None


# The other families' tiny presets (NeoBERT: its preset at 2 x 64).
OTHERS = {"albert": "albert-tiny", "distilbert": "distilbert-tiny", "electra": "electra-tiny",
          "mobilebert": "mobilebert-tiny", "spanbert": "spanbert-tiny",
          "tinybert": "tinybert-tiny", "neobert": "neobert"}


def _model_config(family):
  if family == "modernbert":
    # local_window 16 of modernbert-tiny: narrower than the row of 24, so the window and the
    # per-text RoPE positions both matter; its dropout is 0.
    return model_lib.get_bert_config("modernbert-tiny", vocab_size=VOCAB)
  if family in OTHERS:
    small = (dict(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=96)
             if family == "neobert" else {})
    return model_lib.get_bert_config(OTHERS[family], vocab_size=VOCAB, hidden_dropout_prob=0.0,
                                     attention_dropout_prob=0.0, **small)
  return model_lib.get_bert_config("tiny", vocab_size=VOCAB, hidden_size=32, num_heads=2,
                                   intermediate_size=64, max_position_embeddings=32,
                                   hidden_dropout_prob=0.0, attention_dropout_prob=0.0)


@pytest.mark.parametrize("family,pooling", [
    ("bert", "mean"),
    pytest.param("bert", "cls", marks=pytest.mark.slow),
    pytest.param("bert", "last", marks=pytest.mark.slow),
    pytest.param("modernbert", "mean", marks=pytest.mark.slow),
    pytest.param("modernbert", "cls", marks=pytest.mark.slow),
    *(pytest.param(f, "mean", marks=pytest.mark.slow) for f in OTHERS)])
def test_packed_loss_and_gradients_equal_unpacked(family, pooling):
  """One batch of 6 rows + 2 weight-0 padding rows (an epoch's last batch), symmetric loss with
  Matryoshka widths: value_and_grad of the loss, packed vs unpacked, float32."""
  f = _features()
  idx = np.arange(B - 2)
  task = embedding.EmbeddingTask("t", {}, pooling=pooling, symmetric=True, matryoshka_dims=(16,))
  host_batch, _ = embedding.pack_batches(task, _split(f), _config(), [idx], _mesh())
  packed = host_batch(idx)
  assert len(packed["input_ids"]) < len(idx) * S    # rows shared by several texts
  unpacked = finetune._host_batch(f, KEYS, idx, B)   # pylint: disable=protected-access
  bound = tasks.of(task)
  model = heads.create_model(bound, _model_config(family))
  params = model.init(jax.random.PRNGKey(0), *heads.dummy_inputs(bound, T))["params"]

  def loss(p, batch):
    return ft.loss_fn(bound, model.apply({"params": p}, batch, True, method=finetune.forward),
                      batch)[0]

  grad = jax.jit(jax.value_and_grad(loss))
  lu, gu = grad(params, unpacked)
  lp, gp = grad(params, packed)
  np.testing.assert_allclose(lp, lu, rtol=1e-5)
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(gu))
  assert scale > 1e-3
  for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(gu)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.slow
def test_packed_grad_cache_step_on_8_devices_equals_the_unpacked_plain_step():
  """The loop's own step (finetune.build_training, AdamW) on an 8-device mesh: packed rows
  with GradCache's 2 chunks (R a multiple of 8 x 2) against unpacked rows without."""
  from tests.bert_jax.tasks import embedding_grad_cache_test as gct  # pylint: disable=g-import-not-at-top
  b = 16
  f, idx = _features(b, seed=2), np.arange(b)
  mesh = trainer_lib.create_mesh((-1, 1, 1), b)
  mc = _model_config("bert")
  config = _config(batch_size=b)
  config.eps, config.learning_rate = 1.0, 1e-2   # gct._config's reasons

  def step(task, batch):
    t = finetune.build_training(tasks.of(task), mc, config, mesh, num_train_steps=10,
                                warmup_steps=0)
    with trainer_lib.mesh_rules(mesh):
      state = t.init_state(jax.random.PRNGKey(0))
      before = jax.device_get(state["params"])
      state, m = t.train_step(state, sharding_lib.make_global_batch(batch, mesh))
      return before, jax.device_get(state["params"]), jax.device_get(m)

  chunked = embedding.EmbeddingTask("t", {}, grad_cache_chunks=2)
  host_batch, line = embedding.pack_batches(chunked, _split(f), config, [idx], mesh)
  packed = host_batch(idx)
  r = len(packed["input_ids"])
  assert r % 16 == 0 and line.endswith(f"GradCache embeds each device's {r // 8} rows in 2 "
                                       f"chunks of {r // 16}")
  plain = step(embedding.EmbeddingTask("t", {}), finetune._host_batch(f, KEYS, idx, b))  # pylint: disable=protected-access
  gct._same_step(step(chunked, packed), plain)   # pylint: disable=protected-access


@pytest.mark.slow
def test_the_loop_trains_packed_with_the_unpacked_runs_losses(tmp_path, capsys):
  """finetune.finetune, --config.pack=true against false on the same rows: the same steps and
  each step's loss (dropout off; every batch the same examples), evaluation unpacked."""
  from bert_jax.evaluation import metrics_writer  # pylint: disable=g-import-not-at-top
  from tests.bert_jax.tasks import tasks_embedding_test as tet  # pylint: disable=g-import-not-at-top
  from tests.testlib import tasks_testlib  # pylint: disable=g-import-not-at-top
  tet._data(tmp_path, n_train=20, n_dev=8)   # pylint: disable=protected-access
  vocab = tasks_testlib.write_vocab(str(tmp_path), " ".join(tet.WORDS))

  def run(pack):
    c = tet._config(tmp_path)   # pylint: disable=protected-access
    c.init_checkpoint, c.model_name, c.vocab_file = "", "tiny", vocab
    c.model.hidden_dropout_prob = c.model.attention_dropout_prob = 0.0
    c.batch_size, c.eval_batch_size, c.num_train_epochs, c.learning_rate = 8, 8, 2.0, 1e-3
    c.log_every, c.do_predict, c.pack, c.max_instances_per_pack = 1, False, pack, 4
    summary = finetune.finetune(c, str(tmp_path / f"run_{pack}"))
    scalars = metrics_writer.read_scalars(str(tmp_path / f"run_{pack}" / "tensorboard"))
    return summary, [v for _, v in scalars["train/loss"]]

  unpacked, unpacked_losses = run(False)
  packed, packed_losses = run(True)
  # 20 rows of 3 texts of 5 tokens ([CLS] 3 words [SEP]) at T=16: 3 texts a row, 8 rows for a
  # batch's 24 texts.
  assert ("custom/train: packing each batch's 8 x 3 texts into 8 rows of 16 tokens (<= 4 texts "
          "a row" in capsys.readouterr().out)
  assert packed["steps"] == unpacked["steps"] == 6   # 3 batches (the last of 4 rows) x 2 epochs
  np.testing.assert_allclose(packed_losses, unpacked_losses, rtol=1e-5)
  assert packed["history"][0]["eval/dev/ndcg@10"] == pytest.approx(
      unpacked["history"][0]["eval/dev/ndcg@10"], abs=1e-4)
