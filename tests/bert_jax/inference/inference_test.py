"""bert_jax/inference/loading.py: every checkpoint layout, its tokenizer files, casing and mismatches."""

import hashlib
import json
import os
import shutil

import jax
import numpy as np
import pytest
from etils import epath
from flax import linen as nn

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.inference import loading as inference
from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads
from tests.testlib import tasks_testlib

TEXT = "the cat sat on the mat . a dog ran in the park ."


def make_workdir(workdir, params, config, vocab_file, steps=(5,), do_lower_case=True,
                 record_hash=True):
  """A pre-training workdir as bert_jax.train lays it out: checkpoints/<step>/{state,meta}.

  Step s holds params + s, so a test can tell which step was loaded.
  """
  manager = ckpt_lib.create_manager(workdir, async_save=False)
  vocab_hash = hashlib.sha256(epath.Path(vocab_file).read_bytes()).hexdigest()[:16]  # or gs://
  meta = dict(config=dict(vocab_file=vocab_file, spm_model_file="",
                          do_lower_case=do_lower_case),
              model_config=config.to_dict(), vocab_hash=vocab_hash if record_hash else "")
  for s in steps:
    state = {"params": jax.tree.map(lambda x, s=s: np.asarray(x) + s, params),
             "step": np.asarray(s, np.int32)}
    ckpt_lib.save(manager, s, state, dict(meta, step=s))
  manager.wait_until_finished()
  manager.close()
  return workdir


def tiny_model(d):
  """(vocab.txt written in directory d, a 2-layer H32 BertConfig, its random numpy params)."""
  vocab_file = tasks_testlib.write_vocab(str(d), TEXT)
  with open(vocab_file) as f:
    vocab_size = len(f.read().split("\n")) - 1
  cfg = model_lib.get_bert_config("tiny", vocab_size=vocab_size, hidden_size=32, num_heads=2,
                                  intermediate_size=64, num_layers=2,
                                  max_position_embeddings=32)
  params = jax.tree.map(np.asarray, nn.unbox(pretraining_heads.init_params(cfg,
                                                                           jax.random.PRNGKey(0))))
  return vocab_file, cfg, params


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  d = tmp_path_factory.mktemp("inference")
  vocab_file, cfg, params = tiny_model(d)
  export = str(d / "export")
  ckpt_lib.save_params(export, params, cfg, meta={"do_lower_case": True})
  shutil.copyfile(vocab_file, os.path.join(export, "vocab.txt"))
  return d, vocab_file, cfg, params, export


def _word_embeddings(params):
  return params["bert"]["embeddings"]["word_embeddings"]["embedding"]


def test_export_with_bundled_vocab(setup):
  _, _, cfg, params, export = setup
  m = inference.load_for_inference(export)
  assert m.config.to_dict() == cfg.to_dict()
  np.testing.assert_array_equal(_word_embeddings(m.params), _word_embeddings(params))
  assert m.vocab_file == os.path.join(export, "vocab.txt") and m.spm_model_file is None
  assert m.do_lower_case is True and "checkpoint" in m.casing_source
  assert m.tokenizer.encode(["The cat"]) == m.tokenizer.encode(["the cat"])  # uncased


def test_workdir_latest_step_and_step_directory(setup, tmp_path):
  _, vocab_file, cfg, params, _ = setup
  workdir = make_workdir(str(tmp_path / "run"), params, cfg, vocab_file, steps=(2, 5))
  m = inference.load_for_inference(workdir)
  assert m.path.endswith("checkpoints/5") and m.vocab_file == vocab_file
  np.testing.assert_array_equal(_word_embeddings(m.params), _word_embeddings(params) + 5)
  assert m.description == f"step 5 of {workdir} ({workdir}/checkpoints/5)"
  m2 = inference.load_for_inference(os.path.join(workdir, "checkpoints", "2"))
  assert m2.description.startswith("step 2 of ")
  np.testing.assert_array_equal(_word_embeddings(m2.params), _word_embeddings(params) + 2)
  light = inference.load_for_inference(workdir, with_params=False)
  assert light.params is None and light.config.to_dict() == cfg.to_dict()


def test_vocab_bundled_in_the_workdir_wins_over_a_vanished_recorded_path(setup, tmp_path):
  d, vocab_file, cfg, params, _ = setup
  moved = str(tmp_path / "moved_vocab.txt")
  shutil.copyfile(vocab_file, moved)
  workdir = make_workdir(str(tmp_path / "run"), params, cfg, moved)
  os.remove(moved)  # the recorded path is gone ...
  with pytest.raises(inference.InferenceLoadError, match="no vocab.txt or SentencePiece"):
    inference.load_for_inference(workdir, with_params=False)
  shutil.copyfile(vocab_file, os.path.join(workdir, "vocab.txt"))  # ... a bundled copy works
  m = inference.load_for_inference(workdir, with_params=False)
  assert m.vocab_file == os.path.join(workdir, "vocab.txt")


def test_mismatches_are_one_line_errors_naming_both_sides(setup, tmp_path):
  _, vocab_file, cfg, params, export = setup
  workdir = make_workdir(str(tmp_path / "run"), params, cfg, vocab_file)
  other = str(tmp_path / "other_vocab.txt")
  with open(vocab_file) as f:
    tokens = f.read().split("\n")
  with open(other, "w") as f:  # same size, two tokens swapped: silently wrong ids otherwise
    tokens[-2], tokens[-3] = tokens[-3], tokens[-2]
    f.write("\n".join(tokens))
  with pytest.raises(inference.InferenceLoadError,
                     match=r"was trained with another vocabulary \(sha256 \w+, recorded in "
                     r"the checkpoint\) than the vocabulary .*other_vocab.txt \(sha256 \w+\)"):
    inference.load_for_inference(workdir, vocab_file=other, with_params=False)
  with pytest.raises(inference.InferenceLoadError,
                     match=r"--do_lower_case=False .*--do_lower_case=True"):
    inference.load_for_inference(export, do_lower_case=False, with_params=False)
  small = str(tmp_path / "small_vocab.txt")
  with open(small, "w") as f:
    f.write("\n".join(tokens[:-5]))
  with pytest.raises(inference.InferenceLoadError, match=r"has \d+ tokens but .* vocab_size="):
    inference.load_for_inference(export, vocab_file=small, with_params=False)
  with pytest.raises(inference.InferenceLoadError, match="no such file or directory"):
    inference.load_for_inference(str(tmp_path / "nope"))
  with pytest.raises(ckpt_lib.CheckpointError, match="holds no committed checkpoint"):
    inference.load_for_inference(str(tmp_path))


def test_finished_finetuning_workdir_uses_its_best_export(setup, tmp_path):
  _, vocab_file, cfg, params, _ = setup
  run = tmp_path / "ft"
  ckpt_lib.save_params(str(run / "best_epoch3"), params, cfg,
                       meta={"do_lower_case": True, "task": "glue_mrpc"})
  with open(run / "eval_results.json", "w") as f:
    json.dump({"best_epoch": 3}, f)
  m = inference.load_for_inference(str(run), vocab_file=vocab_file)
  assert m.path.endswith("best_epoch3") and m.meta["task"] == "glue_mrpc"
