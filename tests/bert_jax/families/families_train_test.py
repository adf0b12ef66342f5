"""ALBERT and SpanBERT pre-training end to end on tiny records: SOP records + n-gram masking,
full-sentence records + span masking + SBO, packed; resume = uninterrupted, the input stream
the same for 1 and 2 hosts, and a records/objective mismatch one line before compute."""

import os
import signal

import numpy as np
import pytest

from bert_jax import train
from bert_jax.configs import pretrain as pretrain_config
from data_pipelines import build_vocab
from data_pipelines import create_pretraining_data as cpd
from data_pipelines.records import dataset_info
from data_pipelines.input import pretrain_input
from data_pipelines import stdlib_corpus
from data_pipelines.tokenizers import vocab as vocab_lib
from tests.testlib import sigterm_testlib

SEQ = 48


@pytest.fixture(scope="module")
def records(tmp_path_factory):
  root = tmp_path_factory.mktemp("families")
  stdlib_corpus.write_corpus(str(root / "text"), num_files=2, max_modules=40)
  vocab = str(root / "vocab.txt")
  build_vocab.build(str(root / "text" / "*.txt"), 1000, vocab, lower_case=True)
  out = {"vocab": vocab}
  for name, kw in (("sop", dict(sop=True)), ("full", dict(no_nsp=True)), ("nsp", {})):
    cpd.run(cpd.Config(input_file=str(root / "text" / "*.txt"), output_dir=str(root / name),
                       vocab_file=vocab, max_seq_length=SEQ, dupe_factor=2, num_shards=4, **kw),
            show_progress=False)
    out[name] = str(root / name / "part-*")
  return out


def _config(preset, records, kind, **overrides):
  c = pretrain_config.get_config(f"{preset},runlocal")
  c.train_input_files = records[kind]
  c.vocab_file = records["vocab"]
  c.seq_length = SEQ
  c.max_predictions_per_seq = 8
  c.batch_size = 8
  c.num_train_steps = 6
  c.warmup_steps = 2
  c.log_every = 1
  c.checkpoint_every = 4
  c.async_checkpointing = False
  c.shuffle_buffer = 100
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def _train_interrupted_and_resumed(config, tmp_path, monkeypatch):
  """(losses of an uninterrupted run, of a run SIGTERMed at step 5 and resumed, last metrics)."""
  full = train.train_and_evaluate(config, str(tmp_path / "full"))
  restore = sigterm_testlib.sigterm_at_batch(monkeypatch, 4)
  first = train.train_and_evaluate(config, str(tmp_path / "resumed"))
  restore()
  second = train.train_and_evaluate(config, str(tmp_path / "resumed"))
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  assert first["stopped_early"] and not second["stopped_early"]
  loss = lambda runs: [m["loss"] for r in runs for _, m in r["history"]["train"]]  # noqa: E731
  return loss([full]), loss([first, second]), full["history"]["train"][-1][1]


def test_albert_trains_on_sop_records_with_ngram_masking_and_resumes(records, tmp_path,
                                                                     monkeypatch):
  config = _config("albert-tiny", records, "sop")
  assert config.masking == "ngram" and config.pack
  full, resumed, last = _train_interrupted_and_resumed(config, tmp_path, monkeypatch)
  np.testing.assert_allclose(resumed, full, rtol=1e-5)
  assert {"mlm_loss", "sop_loss", "sop_accuracy"} <= set(last) and "nsp_loss" not in last
  assert np.isfinite(full).all()


def test_spanbert_trains_on_full_sentences_with_span_masking_and_sbo_and_resumes(
    records, tmp_path, monkeypatch):
  config = _config("spanbert-tiny", records, "full")
  assert config.masking == "span"
  full, resumed, last = _train_interrupted_and_resumed(config, tmp_path, monkeypatch)
  np.testing.assert_allclose(resumed, full, rtol=1e-5)
  assert {"mlm_loss", "sbo_loss", "sbo_accuracy"} <= set(last)
  assert not {"nsp_loss", "sop_loss"} & set(last)


def test_objective_and_records_mismatch_is_one_line_before_compute(records, tmp_path):
  with pytest.raises(dataset_info.DataContractError, match="made for sentence objective 'nsp'.*"
                     "trains 'sop'"):
    train.train_and_evaluate(_config("albert-tiny", records, "nsp"), str(tmp_path / "a"))
  with pytest.raises(dataset_info.DataContractError, match="'sop'.*trains 'none'"):
    train.train_and_evaluate(_config("spanbert-tiny", records, "sop"), str(tmp_path / "b"))
  with pytest.raises(train.ConfigError, match="config.masking='token'; SBO predicts"):
    train.train_and_evaluate(_config("spanbert-tiny", records, "full", masking="token"),
                             str(tmp_path / "c"))
  assert not os.path.exists(tmp_path / "a" / "checkpoints")


@pytest.mark.parametrize("scheme", ["ngram", "span"])
def test_masked_stream_is_the_same_for_1_and_2_hosts_and_on_resume(records, scheme):
  vocab = vocab_lib.wordpiece_info(records["vocab"])
  kind = "sop" if scheme == "ngram" else "full"

  def batches(process_index=0, process_count=1, start_batch=0, n=3):
    ds = pretrain_input.make_pretrain_dataset(
        records[kind], batch_size=8 // process_count, seq_length=SEQ, max_predictions_per_seq=8,
        vocab=vocab, whole_word_masking=True, masking_scheme=scheme, seed=3,
        process_index=process_index, process_count=process_count, num_logical_shards=4,
        start_batch=start_batch, pack=True, span_boundaries=scheme == "span")
    it = pretrain_input.as_numpy_batches(ds)
    return [next(it) for _ in range(n)]

  one = batches()
  two = [batches(p, 2) for p in (0, 1)]
  for i, b in enumerate(one):
    for k, v in b.items():
      np.testing.assert_array_equal(v, np.concatenate([two[0][i][k], two[1][i][k]]), err_msg=k)
  resumed = batches(start_batch=2, n=1)[0]
  for k, v in one[2].items():
    np.testing.assert_array_equal(v, resumed[k], err_msg=k)
  if scheme == "span":
    b = one[0]
    w = b["masked_lm_weights"] > 0
    pos = b["masked_lm_positions"]
    assert np.all(b["masked_lm_span_left"][w] < pos[w])
    assert np.all(b["masked_lm_span_right"][w] > pos[w])


def _dot_flops(jaxpr):
  """2 x M x N x K summed over every dot_general of a jaxpr and the jaxprs inside it (pjit,
  custom_vjp, remat, cond branches); a scan's body counts `length` times."""
  import math  # pylint: disable=g-import-not-at-top
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      k = math.prod(eqn.invars[0].aval.shape[d] for d in contract)
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * k
    times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, "jaxpr", sub)       # ClosedJaxpr -> Jaxpr
        if hasattr(sub, "eqns"):
          total += times * _dot_flops(sub)
  return total


@pytest.mark.parametrize("preset", ["tiny", "albert-tiny", "spanbert-tiny"])
def test_flop_count_equals_the_matmuls_of_the_traced_training_step(preset):
  """train.model_flops_per_sequence (the logged TFLOP/s and MFU, bert_jax.plan's analytic
  figure) against an independent count: the dot products of jax.grad of the loss, traced for
  the preset (ALBERT: E -> H projection, H -> E MLM transform, shared layers applied L times;
  SpanBERT: SBO head, no pooler)."""
  import jax  # pylint: disable=g-import-not-at-top
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  from bert_jax.objectives import pretraining as objectives  # pylint: disable=g-import-not-at-top
  cfg = model_lib.get_bert_config(preset, vocab_size=1000)
  b, t, p = 2, 64, 10
  model = pretraining_heads.BertForPreTraining(cfg)
  params = jax.eval_shape(lambda: nn.unbox(pretraining_heads.init_params(cfg, jax.random.key(0))))
  ints = lambda *shape: np.zeros(shape, np.int32)  # noqa: E731
  batch = dict(input_ids=ints(b, t), input_mask=ints(b, t) + 1, segment_ids=ints(b, t),
               masked_lm_positions=ints(b, p) + 3, masked_lm_ids=ints(b, p),
               masked_lm_weights=np.ones((b, p), np.float32), next_sentence_labels=ints(b))
  if "sbo" in cfg.objective_list:
    batch.update(masked_lm_span_left=ints(b, p) + 2, masked_lm_span_right=ints(b, p) + 4)

  def loss(params):
    out = model.apply({"params": params}, batch, True, method=pretraining_heads.pretraining_outputs)
    return objectives.pretraining_loss(out, batch)[0]

  counted = _dot_flops(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
  if not cfg.sentence_objective:
    # The traced (not yet optimised) step still runs the pooler's forward, 2 x H x H per row,
    # that feeds no loss; XLA removes it as dead code, and the formula leaves it out.
    counted -= b * 2 * cfg.hidden_size ** 2
  assert counted == b * train.model_flops_per_sequence(cfg, t, p)
