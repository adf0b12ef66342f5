"""extract_features: layer choice, concat/sum, word alignment, truncation, errors, the CLI."""
import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax import extract_features as ef
from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads
from tests.testlib import tasks_testlib

TEXT = "the cat sat on the mat . a dog ran in the park ."


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  d = tmp_path_factory.mktemp("ef")
  vocab_file = tasks_testlib.write_vocab(str(d), TEXT)
  tokenizer = tasks_testlib.ReferenceTokenizer(vocab_file)
  cfg = model_lib.get_bert_config("tiny", vocab_size=tokenizer.vocab.size, hidden_size=32,
                                  num_heads=2, intermediate_size=64, num_layers=4,
                                  max_position_embeddings=32)
  params = nn.unbox(pretraining_heads.init_params(cfg, jax.random.PRNGKey(0)))
  return d, vocab_file, tokenizer, cfg, params


def test_features_layers_and_word_alignment(setup):
  _, _, tokenizer, cfg, params = setup
  inputs = [("The cat sat on the mat.".split(), None),
            ("A dog ran.".split(), "Zebras ran in the park".split())]
  out, truncated = ef.extract(inputs, tokenizer, params["bert"], cfg, layers=(-1, -2),
                              pooling="concat", max_seq_length=32, batch_size=4)
  assert truncated == 0
  a, b = out["token_offsets"][:2]
  toks = list(out["tokens"][a:b])
  assert toks[0] == "[CLS]" and toks[-1] == "[SEP]"
  assert out["features"].shape == (len(out["tokens"]), 2 * 32)
  # Pieces map to their words: "mat." -> "mat", "." both word 5.
  wi = out["word_index"][a:b]
  assert list(wi) == [-1, 0, 1, 2, 3, 4, 5, 5, -1]
  # Pair: "zebras" splits into letter pieces, all pointing at word 3 (after a's 3 words).
  a2, b2 = out["token_offsets"][1:3]
  wi2, seg2 = out["word_index"][a2:b2], out["segment_ids"][a2:b2]
  zebra = len(tokenizer.encode(["Zebras"])[0])
  assert list(wi2).count(3) == zebra > 1 and seg2[-1] == 1 and seg2[0] == 0
  assert list(out["words"][out["word_offsets"][1]:out["word_offsets"][2]]) == [
      "A", "dog", "ran.", "Zebras", "ran", "in", "the", "park"]
  # Same numbers as the model's own hidden states (layer -1 = last encoder layer).
  ids = np.asarray(tokenizer.encode(["the cat sat on the mat ."])[0])
  full = [tokenizer.vocab.cls_id] + list(ids) + [tokenizer.vocab.sep_id]
  x = np.asarray(full)[None]
  hs = model_lib.BertModel(cfg).apply({"params": params["bert"]}, x, np.ones_like(x),
                                      np.zeros_like(x), output_hidden_states=True)
  want = np.concatenate([hs["hidden_states"][-1], hs["hidden_states"][-2]], -1)[0]
  np.testing.assert_allclose(out["features"][a:b], want, atol=1e-5)
  # Word features: mean of the word's pieces.
  w5 = out["word_offsets"][0] + 5
  np.testing.assert_allclose(out["word_features"][w5], want[6:8].mean(0), atol=1e-5)
  # sum pooling over one layer equals the layer itself; layer 0 is the first encoder layer.
  out_sum, _ = ef.extract(inputs[:1], tokenizer, params["bert"], cfg, layers=(0,),
                          pooling="sum", max_seq_length=32)
  np.testing.assert_allclose(out_sum["features"], hs["hidden_states"][1][0], atol=1e-5)


def test_truncation_and_errors(setup, tmp_path):
  _, _, tokenizer, cfg, params = setup
  inputs = [(("the cat sat on the mat " * 5).split(), None)]
  out, truncated = ef.extract(inputs, tokenizer, params["bert"], cfg, max_seq_length=8)
  assert truncated == 1 and len(out["tokens"]) == 8
  assert out["word_index"].max() == 5  # words 6.. lost their pieces: zero word features
  assert not out["word_features"][6:].any()
  with pytest.raises(ef.ExtractError, match=r"--layers=-5: the model has 4 layers"):
    ef.parse_layers("-5", 4)
  # The flag's default (last four) keeps what a 2-layer model has; an explicit -3 is an error.
  assert ef.parse_layers(ef.DEFAULT_LAYERS, 2, clip=True) == [-1, -2]
  assert ef.parse_layers(ef.DEFAULT_LAYERS, 4, clip=True) == [-1, -2, -3, -4]
  with pytest.raises(ef.ExtractError, match=r"--layers=-1,-3: the model has 2 layers"):
    ef.parse_layers("-1,-3", 2)
  with pytest.raises(ef.ExtractError, match=r"--layers=x: expected comma-separated integers"):
    ef.parse_layers("x", 2)
  with pytest.raises(ef.ExtractError, match=r"--max_seq_length=0: must be at least 3"):
    ef.extract(inputs, tokenizer, params["bert"], cfg, max_seq_length=0)
  path = tmp_path / "in.txt"
  path.write_text("a line\n\nanother\n")
  with pytest.raises(ef.ExtractError, match=r"in.txt:2: empty line"):
    ef.read_inputs(str(path))
  path.write_text("a line ||| \n")
  with pytest.raises(ef.ExtractError, match=r"in.txt:1: empty text after"):
    ef.read_inputs(str(path))


@pytest.mark.slow
def test_cli_writes_a_numpy_loadable_file(setup, tmp_path):
  d, vocab_file, _, cfg, params = setup
  export = str(d / "export")
  if not os.path.exists(export):
    ckpt_lib.save_params(export, params, cfg, meta={"do_lower_case": True})
  (tmp_path / "in.txt").write_text("The cat sat.\nA dog ran. ||| The park.\n")
  out = tmp_path / "f.npz"
  root = tests.ROOT
  r = subprocess.run([sys.executable, "-m", "bert_jax.extract_features",
                      f"--input_file={tmp_path / 'in.txt'}", f"--output_file={out}",
                      f"--init_checkpoint={export}", f"--vocab_file={vocab_file}",
                      "--layers=-1,-2,-3,-4", "--max_seq_length=16"],
                     cwd=root, capture_output=True, text=True, timeout=300,
                     env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"loaded {export} (params export)" in r.stdout.splitlines()[:2]  # what, from where
  f = np.load(out)  # no pickle needed
  assert f["features"].shape[1] == 4 * 32 and len(f["token_offsets"]) == 3
  # The same --output_file again (issue 49: replaced without a word): refused in one line
  # before the model is loaded, the file untouched; --overwrite replaces it.
  before = out.read_bytes()
  again = [sys.executable, "-m", "bert_jax.extract_features",
           f"--input_file={tmp_path / 'in.txt'}", f"--output_file={out}",
           f"--init_checkpoint={export}", f"--vocab_file={vocab_file}"]
  r = subprocess.run(again, cwd=root, capture_output=True, text=True, timeout=300,
                     env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert r.returncode == 2 and r.stdout == "", r.stdout[-2000:]
  assert r.stderr.strip().splitlines()[-1] == (
      f"error: --output_file={out}: already exists; pass --overwrite to replace it, or choose "
      "another path.")
  assert out.read_bytes() == before
  r = subprocess.run(again + ["--overwrite", "--nodo_lower_case"], cwd=root,
                     capture_output=True, text=True, timeout=300,
                     env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert r.returncode == 2 and "do_lower_case=True" in r.stderr.strip().splitlines()[-1]
