"""A pre-training run on a mixture of named sources (issue 42 item 1): the planned shares at
start-up, each source's real tokens and epochs in the summary, and one-line errors before compute
(a source without files, another vocabulary or sequence length, bad weights or tau, a resume with
another mixture)."""
import json

import pytest

from bert_jax.training import input_source
from bert_jax import train
from bert_jax_core import errors
from tests.end_to_end.faults_test import WORDS, _records, _vocab
from tests.bert_jax.train_test import tiny_config

SEQ = 32


@pytest.fixture
def sources(tmp_path):
  """ko: 4 files of 16 records; en: 2 files of 16; both with a dataset_info.json of the vocab."""
  vocab = _vocab(tmp_path)
  ko = _records(tmp_path / "ko", seq=SEQ, shards=4, info_vocab=vocab)
  en = _records(tmp_path / "en", seq=SEQ, shards=2, info_vocab=vocab)
  return vocab, ko, en


def _config(vocab, spec, **kw):
  c = tiny_config(train_input_files="", vocab_file=vocab, train_sources=spec, seq_length=SEQ,
                  max_predictions_per_seq=6, **kw)
  c.model.vocab_size = None
  input_source._SOURCES.clear()   # pylint: disable=protected-access  (resolved once a process)
  return c


@pytest.fixture
def no_model(monkeypatch):
  def model_built(*args, **kwargs):
    raise AssertionError("the model was built before the bad input was found")
  monkeypatch.setattr(train, "build_training", model_built)


@pytest.mark.parametrize("kw,match", [
    (dict(source_weights="ko=0,en=0"), "every weight is 0"),
    (dict(source_weights="ko=-1,en=1"), "ko=-1; a weight is >= 0"),
    (dict(source_tau=0.0), "source_tau=0.0: expected 0 < tau <= 1"),
])
def test_bad_weights_and_tau_before_compute(tmp_path, sources, no_model, kw, match):
  vocab, ko, en = sources
  with pytest.raises(errors.UserError, match=match):
    train.train_and_evaluate(_config(vocab, f"ko={ko};en={en}", **kw), str(tmp_path / "w"))


def test_bad_sources_before_compute(tmp_path, sources, no_model):
  vocab, ko, en = sources
  with pytest.raises(errors.UserError, match="config.train_sources fr=.*no file matches"):
    train.train_and_evaluate(_config(vocab, f"ko={ko};fr={tmp_path}/fr/*"), str(tmp_path / "a"))
  other = _vocab(tmp_path, WORDS[:-1] + ["other"], name="other.txt")
  en_other = _records(tmp_path / "en_other", seq=SEQ, shards=2, info_vocab=other)
  with pytest.raises(errors.UserError, match="config.train_sources en"):
    train.train_and_evaluate(_config(vocab, f"ko={ko};en={en_other}"), str(tmp_path / "b"))
  en_long = _records(tmp_path / "en_long", seq=2 * SEQ, shards=2, info_vocab=vocab)
  with pytest.raises(errors.UserError, match="config.train_sources en.*64"):
    train.train_and_evaluate(_config(vocab, f"ko={ko};en={en_long}"), str(tmp_path / "c"))
  c = _config(vocab, f"ko={ko};en={en}")
  c.train_input_files = ko
  with pytest.raises(errors.UserError, match="train_sources and config.train_input_files"):
    train.train_and_evaluate(c, str(tmp_path / "d"))


@pytest.mark.slow   # trains tiny BERT 4 steps, then refuses a resume (~1 min on 2 cores)
def test_mixture_run_prints_shares_and_each_sources_tokens(tmp_path, sources, capsys):
  vocab, ko, en = sources
  spec, workdir = f"ko={ko};en={en}", str(tmp_path / "run")
  train.train_and_evaluate(_config(vocab, spec, source_weights="ko=3,en=1", num_train_steps=4),
                           workdir)
  out = capsys.readouterr().out
  assert ("mixture (weights): ko 75.0% (64 records, 4 file(s)), en 25.0% (32 records, 2 file(s))"
          "; a source that runs out repeats") in out
  summary = json.load(open(f"{workdir}/summary.json"))
  got = summary["sources"]
  assert set(got) == {"ko", "en"} and summary["sources_since_step"] == 0
  assert sum(v["rows"] for v in got.values()) == 4 * 8          # 4 steps x 8 rows
  assert got["ko"]["real_tokens"] > got["en"]["real_tokens"] > 0
  assert got["en"]["epochs"] == pytest.approx(got["en"]["instances"] / 32, abs=1e-4)
  assert "sources since step 0:" in out and "    ko: " in out
  # Resuming with other shares is refused, naming both mixtures.
  with pytest.raises(errors.UserError, match="trained on the mixture ko 0.750, en 0.250 "
                     r"\(weights\) but this run asks for ko 0.500, en 0.500"):
    train.train_and_evaluate(_config(vocab, spec, source_weights="ko=1,en=1", num_train_steps=6),
                             workdir)
