"""gs:// workdirs against a local GCS emulator (tests/testlib/gcs_emulator.py; nothing leaves localhost).

The same client code that talks to Cloud Storage runs here: tf.io.gfile's GCS filesystem (through
an HTTPS proxy with a test CA), tensorstore's gcs driver (Orbax's arrays) and google-cloud-storage
(Orbax's bucket check). Every gs:// result is compared with the same run on local disk.
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from etils import epath
from flax import linen as nn

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.inference import loading as inference
from bert_jax.checkpoint import manifest as manifest_lib
from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads
from bert_jax_core.tf_setup import tf
from tests.testlib import gcs_emulator
from tests.bert_jax.inference import inference_test
from tests.testlib import sigterm_testlib

ROOT = tests.ROOT
GS = f"gs://{gcs_emulator.BUCKET}"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """Starts the emulator in its own process; yields the environment that points clients at it."""
  d = tmp_path_factory.mktemp("gcs")
  with open(d / "emulator.log", "w") as log:
    emulator = os.path.join(ROOT, "tests", "testlib", "gcs_emulator.py")
    proc = subprocess.Popen([sys.executable, emulator, str(d / "certs")],
                            stdout=subprocess.PIPE, stderr=log, text=True)
  try:
    port = int(proc.stdout.readline())
    env = gcs_emulator.env(port, str(d / "certs"))
    with pytest.MonkeyPatch.context() as mp:
      for k, v in env.items():
        mp.setenv(k, v)
      yield dict(os.environ)
  finally:
    proc.terminate()
    proc.wait(timeout=30)
    with open(d / "emulator.log") as f:  # a client path the emulator lacks
      unsupported = [line for line in f if "gcs_emulator: unsupported" in line]
    assert not unsupported, unsupported


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  return inference_test.tiny_model(tmp_path_factory.mktemp("tiny"))


def _upload(local, remote):
  """Copies a local directory tree to gs://, as `gsutil cp -r` of a finished run would."""
  for d, _, names in os.walk(local):
    for n in names:
      src = os.path.join(d, n)
      tf.io.gfile.copy(src, f"{remote}/{os.path.relpath(src, local)}", overwrite=True)
  return remote


@pytest.fixture(scope="module")
def copied(gcs, tiny, tmp_path_factory):
  """A pre-training workdir (steps 2 and 5) made locally, its vocab bundled, copied to gs://.

  The vocab path its training config recorded is deleted, so only the bundled vocab.txt can be
  found: the gs:// lookup must find it beside the checkpoints.
  """
  vocab_file, cfg, params = tiny
  d = tmp_path_factory.mktemp("copied")
  recorded = str(d / "gone_vocab.txt")
  shutil.copyfile(vocab_file, recorded)
  local = inference_test.make_workdir(str(d / "run"), params, cfg, recorded, steps=(2, 5))
  os.remove(recorded)
  shutil.copyfile(vocab_file, os.path.join(local, "vocab.txt"))
  return local, _upload(local, f"{GS}/copied")


def _assert_same_model(got, want):
  assert got.config.to_dict() == want.config.to_dict()
  jax.tree.map(np.testing.assert_array_equal, got.params, want.params)
  assert (got.do_lower_case, got.spm_model_file) == (want.do_lower_case, want.spm_model_file)
  text = ["The cat sat on the mat ."]
  assert got.tokenizer.encode(text) == want.tokenizer.encode(text)


def test_workdir_copied_to_gs_loads_like_local(copied, tiny):
  local, remote = copied
  got, want = inference.load_for_inference(remote), inference.load_for_inference(local)
  assert got.path == f"{remote}/checkpoints/5" and want.path.endswith("checkpoints/5")
  assert got.vocab_file == f"{remote}/vocab.txt"   # bundled, found on gs://
  _assert_same_model(got, want)
  step2 = inference.load_for_inference(f"{remote}/checkpoints/2")
  np.testing.assert_array_equal(inference_test._word_embeddings(step2.params),  # params + step
                                inference_test._word_embeddings(tiny[2]) + 2)
  light = inference.load_for_inference(remote, with_params=False)
  assert light.params is None and light.vocab_file == f"{remote}/vocab.txt"


def _layout(step_dir):
  files = json.loads(epath.Path(step_dir, manifest_lib.NAME).read_text())["files"]
  return sorted({re.sub(r"/d/[0-9a-f]+$", "/d/*", f) for f in files})


def _flip_a_byte(step_dir):
  """Flips one bit in the middle of the step's first array data file on gs://; returns it."""
  data = sorted(tf.io.gfile.glob(f"{step_dir}/state/ocdbt.process_0/d/*"))[0]
  with tf.io.gfile.GFile(data, "rb") as f:
    blob = bytearray(f.read())
  blob[len(blob) // 2] ^= 1
  with tf.io.gfile.GFile(data, "wb") as f:
    f.write(bytes(blob))
  return data


def test_checkpoints_written_to_gs_verify_load_and_catch_corruption(gcs, tiny, tmp_path):
  """Orbax writes the steps straight to gs:// (tensorstore + tf.io.gfile), manifest included."""
  vocab_file, cfg, params = tiny
  remote = inference_test.make_workdir(f"{GS}/written", params, cfg, vocab_file, steps=(2, 5))
  local = inference_test.make_workdir(str(tmp_path / "run"), params, cfg, vocab_file,
                                      steps=(2, 5))
  assert tf.io.gfile.listdir(f"{remote}/checkpoints") == ["2/", "5/"]
  got, want = inference.load_for_inference(remote), inference.load_for_inference(local)
  assert got.path == f"{remote}/checkpoints/5" and got.vocab_file == vocab_file  # as recorded
  _assert_same_model(got, want)
  # Each step's manifest lists the files of the local run's (the ocdbt data files d/<hash> have
  # random names, and their number varies with write timing), and every one of them verifies.
  for step in (2, 5):
    layout = {w: _layout(f"{w}/checkpoints/{step}") for w in (remote, local)}
    assert layout[remote] == layout[local] and "state/manifest.ocdbt" in layout[local]
    assert ckpt_lib.verify_dir(f"{remote}/checkpoints/{step}")[0] == "verified"
  # One flipped byte in an array file of step 5 on gs:// is caught on load, naming the file.
  data = _flip_a_byte(f"{remote}/checkpoints/5")
  with pytest.raises(ckpt_lib.CheckpointError, match=f"{data}: SHA-256 .* differs"):
    inference.load_for_inference(remote)


def test_vocab_built_on_gs_and_its_settings_are_found_from_a_gs_workdir(gcs, tmp_path):
  """build_vocab writes a cased vocab and its .meta.json to gs://; a workdir whose training
  config recorded that vocab finds it, reads its casing from the meta on gs://, and a casing
  flag that contradicts it is a one-line error naming the meta file."""
  from data_pipelines import build_vocab  # pylint: disable=g-import-not-at-top
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("The Cat sat on the mat .\nA Dog ran in Paris .\n" * 20)
  vocab = f"{GS}/vocab/vocab.txt"
  size, _, meta = build_vocab.build(str(corpus), 200, vocab, lower_case=False)
  assert meta["do_lower_case"] is False and tf.io.gfile.exists(vocab + ".meta.json")
  assert not tf.io.gfile.exists(vocab + ".tmp") and not tf.io.gfile.exists(vocab + ".meta.json.tmp")
  cfg = model_lib.get_bert_config("tiny", vocab_size=size, hidden_size=32, num_heads=2,
                                  intermediate_size=64, num_layers=1, max_position_embeddings=32)
  params = jax.tree.map(np.asarray, nn.unbox(pretraining_heads.init_params(cfg,
                                                                           jax.random.PRNGKey(1))))
  remote = inference_test.make_workdir(f"{GS}/cased", params, cfg, vocab, do_lower_case=False)
  m = inference.load_for_inference(remote, with_params=False)
  assert m.vocab_file == vocab and m.do_lower_case is False
  assert f"{vocab}.meta.json" in m.casing_source
  assert m.tokenizer.encode(["The Cat"]) != m.tokenizer.encode(["the cat"])   # cased
  with pytest.raises(inference.InferenceLoadError, match=r"vocab\.txt\.meta\.json"):
    inference.load_for_inference(remote, do_lower_case=True, with_params=False)


def test_sentencepiece_model_bundled_in_a_gs_workdir(gcs, tmp_path):
  """A SentencePiece model built to gs://, then bundled in a gs:// workdir (the original gone):
  found there, and it tokenizes as the same model read from local disk."""
  from data_pipelines import build_vocab, stdlib_corpus
  from data_pipelines.tokenizers import tokenization
  stdlib_corpus.write_corpus(str(tmp_path), num_files=1, max_modules=30)
  built = f"{GS}/spm/tok.model"
  build_vocab.build(str(tmp_path / "*.txt"), 300, built, lower_case=False, model_type="unigram")
  cfg = model_lib.get_bert_config("tiny", vocab_size=300, hidden_size=32, num_heads=2,
                                  intermediate_size=64, num_layers=1, max_position_embeddings=32)
  params = jax.tree.map(np.asarray, nn.unbox(pretraining_heads.init_params(cfg,
                                                                           jax.random.PRNGKey(2))))
  remote = inference_test.make_workdir(f"{GS}/spm_run", params, cfg, built, do_lower_case=False)
  for suffix in ("", ".meta.json"):   # bundle model + settings, then drop the originals
    tf.io.gfile.copy(built + suffix, f"{remote}/tok.model{suffix}")
    tf.io.gfile.copy(built + suffix, str(tmp_path / f"tok.model{suffix}"))
    tf.io.gfile.remove(built + suffix)
  m = inference.load_for_inference(remote)
  assert (m.vocab_file, m.spm_model_file) == (None, f"{remote}/tok.model")
  assert m.do_lower_case is False
  text = ["The Quick brown fox, 42 times: os.path.join()"]
  local = tokenization.SentencePieceTokenizer(str(tmp_path / "tok.model"))
  assert m.tokenizer.encode(text) == local.encode(text)


def test_convert_exports_a_gs_workdir_to_hugging_face_like_local(copied, tmp_path):
  from bert_jax.inference import hf_export  # pylint: disable=g-import-not-at-top
  local, remote = copied
  out = {w: hf_export.export_to_hf(w, str(tmp_path / name))
         for name, w in (("local", local), ("gs", remote))}
  names = sorted(os.listdir(out[local]))
  assert names == sorted(os.listdir(out[remote])) and "model.safetensors" in names
  for n in names:   # the same weights, config and tokenizer files, byte for byte
    with open(os.path.join(out[local], n), "rb") as a, open(os.path.join(out[remote], n),
                                                            "rb") as b:
      assert a.read() == b.read(), n


@pytest.mark.slow
def test_finetune_from_a_gs_workdir_equals_local(copied, tmp_path):
  """One fine-tuning epoch from the gs:// workdir (its bundled vocab found there) gives the
  losses and dev metrics of the same run from the local copy."""
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.evaluation import metrics_writer  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test  # pylint: disable=g-import-not-at-top
  local, remote = copied
  finetune_test._sst2(tmp_path, np.random.default_rng(0), 16, 8)
  runs = {}
  for name, w in (("local", local), ("gs", remote)):
    c = finetune_test._config("glue_sst2", (w, ""), tmp_path, num_train_epochs=1.0,
                              do_predict=False, log_every=1, max_seq_length=16)
    summary = finetune.finetune(c, str(tmp_path / name))
    loss = metrics_writer.read_scalars(str(tmp_path / name / "tensorboard"))["train/loss"]
    runs[name] = (summary["steps"], summary["history"], [v for _, v in loss])
  assert runs["local"][0] == 2 and runs["gs"] == runs["local"]


def _cli(env, module, *args):
  r = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                     text=True, timeout=300, env=dict(env, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT))
  assert r.returncode == 0, r.stderr[-3000:]
  return r.stdout


@pytest.mark.slow
def test_predict_and_extract_features_clis_on_a_gs_workdir_equal_local(gcs, copied, tmp_path):
  local, remote = copied
  fill = ["fill-mask", "the cat sat on the [MASK] .", "--text_b=a dog ran .", "--top_k=3"]
  out = {w: _cli(gcs, "bert_jax.predict", f"--init_checkpoint={w}", *fill).split("\n", 1)
         for w in (local, remote)}  # (first line: what was loaded, from where)
  assert out[remote][1] == out[local][1] and out[local][1].startswith("[MASK] #1:")
  assert out[local][0].startswith("loaded step ") and out[remote][0].startswith("loaded step ")
  assert "gs://" in out[remote][0] and "gs://" not in out[local][0]
  lines = tmp_path / "lines.txt"
  lines.write_text("the cat sat on the mat .\na dog ran ||| in the park .\n")
  feats = {}
  for name, w in (("local", local), ("gs", remote)):
    _cli(gcs, "bert_jax.extract_features", f"--init_checkpoint={w}", f"--input_file={lines}",
         f"--output_file={tmp_path / name}.npz", "--max_seq_length=32")
    feats[name] = np.load(tmp_path / f"{name}.npz")
  for k in feats["local"].files:
    np.testing.assert_array_equal(feats["gs"][k], feats["local"][k], err_msg=k)


@pytest.mark.slow
def test_pretraining_saves_to_gs_and_resumes_like_local(gcs, tmp_path, monkeypatch):
  """Stopped (SIGTERM) after step 5 of 8 in a gs:// workdir, then resumed there: the losses are
  those of 8 uninterrupted local steps (as tests/bert_jax/train_test.py checks on local disk)."""
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import train_test  # pylint: disable=g-import-not-at-top
  config = train_test.tiny_config(num_train_steps=8, checkpoint_every=3)
  full = train.train_and_evaluate(config, str(tmp_path / "local"))
  sigterm_testlib.sigterm_at_batch(monkeypatch, 4)
  remote = f"{GS}/pretrain"
  try:
    first = train.train_and_evaluate(config, remote)
    assert first["stopped_early"] and first["final_step"] == 5
    assert tf.io.gfile.listdir(f"{remote}/checkpoints") == ["3/", "5/"]
    second = train.train_and_evaluate(config, remote)
  finally:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  assert [s for s, _ in second["history"]["train"]] == [6, 7, 8]   # resumed from gs:// step 5
  losses = lambda h: [m["loss"] for _, m in h["history"]["train"]]  # noqa: E731
  np.testing.assert_allclose(losses(first) + losses(second), losses(full), rtol=1e-5)
  # keep_checkpoints=3: Orbax deleted step 3 from gs:// (every object of it), kept 5, 6 and 8.
  assert config.keep_checkpoints == 3
  assert tf.io.gfile.listdir(f"{remote}/checkpoints") == ["5/", "6/", "8/"]
  for step in (5, 6, 8):
    assert ckpt_lib.verify_dir(f"{remote}/checkpoints/{step}")[0] == "verified"
  # A flipped byte in step 8 on gs://: the next run moves it aside (a directory rename on GCS is
  # a copy of every object), falls back to step 6 and trains 7-8 again to the same losses.
  _flip_a_byte(f"{remote}/checkpoints/8")
  third = train.train_and_evaluate(config, remote)
  assert losses(third) == pytest.approx(losses(full)[6:], rel=1e-5)
  assert tf.io.gfile.listdir(f"{remote}/checkpoints") == ["5/", "6/", "8/"]
  (moved,) = tf.io.gfile.listdir(f"{remote}/checkpoints.corrupt")
  assert moved.startswith("8-")
