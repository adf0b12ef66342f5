"""Tests for bert_jax/predict.py: fill-mask equals transformers' pipeline on the same weights."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax import convert  # noqa: E402
from bert_jax.inference import hf_export  # noqa: E402
from bert_jax.inference import loading as inference  # noqa: E402
from bert_jax import predict  # noqa: E402
from tests.testlib import hf_testlib  # noqa: E402

ROOT = tests.ROOT


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  root = tmp_path_factory.mktemp("predict")
  hf = hf_testlib.random_hf_model(hf_testlib.hf_config(), seed=5, scale=0.5)
  hf_dir = hf_testlib.save_hf(hf, str(root / "hf"))
  convert.convert_to_orbax(hf_dir, str(root / "orbax"))
  return hf_dir, str(root / "orbax")


def test_fill_mask_equals_transformers_pipeline(converted):
  hf_dir, orbax_dir = converted
  predictor = predict.load(orbax_dir)
  tokenizer = transformers.BertTokenizer(os.path.join(hf_dir, "vocab.txt"), do_lower_case=True)
  fill = transformers.pipeline("fill-mask", model=transformers.BertForMaskedLM.from_pretrained(
      hf_dir), tokenizer=tokenizer, device="cpu")
  for text in ["The man went to the [MASK] .", "Penguins are [MASK] birds , [MASK] ."]:
    ours = predict.predict(predictor, text, top_k=5)["masks"]
    ref = fill(text, top_k=5)
    ref = [ref] if isinstance(ref[0], dict) else ref  # one [MASK]: a flat list
    assert len(ours) == len(ref) == text.count("[MASK]")
    for got, want in zip(ours, ref):
      assert [i for _, i, _ in got] == [w["token"] for w in want]
      assert [t for t, _, _ in got] == [tokenizer.convert_ids_to_tokens(w["token"]) for w in want]
      np.testing.assert_allclose([p for _, _, p in got], [w["score"] for w in want], atol=1e-5)
    assert got[0][2] > 2 / 64  # a peaked distribution, so the ranking comparison means something


def test_next_sentence_probability_equals_transformers(converted):
  hf_dir, orbax_dir = converted
  predictor = predict.load(orbax_dir)
  a, b = "The man went to the [MASK] .", "He bought a gallon of milk ."
  result = predict.predict(predictor, a, b)
  tokenizer = transformers.BertTokenizer(os.path.join(hf_dir, "vocab.txt"))
  enc = tokenizer(a, b, return_tensors="pt")
  assert predict.encode(predictor, a, b)[0].tolist() == enc["input_ids"].tolist()
  assert predict.encode(predictor, a, b)[2].tolist() == enc["token_type_ids"].tolist()
  with torch.no_grad():
    logits = transformers.BertForPreTraining.from_pretrained(hf_dir)(**enc).seq_relationship_logits
  np.testing.assert_allclose(result["is_next"], torch.softmax(logits, -1)[0, 0].item(), atol=1e-5)
  assert len(result["masks"]) == 1
  assert predict.predict(predictor, a.replace("[MASK]", "store"), b)["masks"] == []


def test_errors(converted):
  _, orbax_dir = converted
  predictor = predict.load(orbax_dir)
  with pytest.raises(predict.PredictError, match="no \\[MASK\\] in 'the store'"):
    predict.predict(predictor, "the store")
  with pytest.raises(predict.PredictError, match="empty text"):
    predict.predict(predictor, "  ")
  with pytest.raises(predict.PredictError, match="at most 40"):
    predict.predict(predictor, "the man " * 30 + "[MASK]")
  with pytest.raises(inference.InferenceLoadError,
                     match="do_lower_case=False but the checkpoint .* is uncased"):
    predict.load(orbax_dir, do_lower_case=False)


def test_cli(converted, tmp_path):
  _, orbax_dir = converted
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  r = subprocess.run(
      [sys.executable, "-m", "bert_jax.predict", f"--init_checkpoint={orbax_dir}", "fill-mask",
       "The man went to the [MASK] .", "--text_b=He bought milk .", "--top_k=3"],
      env=dict(env, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, BERT_JAX_CACHE=str(tmp_path)), cwd=ROOT,
      capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  # The compiled programs went to the persistent cache (a second run reads them).
  assert any(f.startswith("jit__probabilities") for f in os.listdir(tmp_path / "jax"))
  lines = r.stdout.strip().splitlines()
  assert lines[0] == f"loaded {orbax_dir} (converted from hf {converted[0]})", lines[0]
  assert lines[1] == "[MASK] #1:" and len(lines) == 6 and lines[-1].startswith(
      "next sentence: P(IsNext) = 0.")


def test_a_hugging_face_folder_is_converted_once_and_predicts_the_same(converted, tmp_path,
                                                                       monkeypatch, capsys):
  hf_dir, orbax_dir = converted
  monkeypatch.setenv("BERT_JAX_CACHE", str(tmp_path / "cache"))
  text = "The man went to the [MASK] ."
  want = predict.predict(predict.load(orbax_dir), text)
  capsys.readouterr()
  got = predict.load(hf_dir)
  assert "a Hugging Face folder; converted to Orbax in " in capsys.readouterr().out
  assert got.path.startswith(str(tmp_path / "cache" / "hf"))
  assert predict.predict(got, text) == want
  again = predict.load(hf_dir)  # the cached copy, no second conversion
  assert "using its converted copy" in capsys.readouterr().out and again.path == got.path


def test_hf_export_files_are_readable_by_others(converted, tmp_path):
  _, orbax_dir = converted
  old = os.umask(0o022)
  try:
    out = hf_export.export_to_hf(orbax_dir, str(tmp_path / "hf"))
  finally:
    os.umask(old)
  modes = {f: os.stat(os.path.join(out, f)).st_mode & 0o777 for f in os.listdir(out)}
  assert modes["model.safetensors"] == 0o644, modes
  assert set(modes.values()) == {0o644}, modes


def test_predict_does_not_import_tensorflow(converted):
  _, orbax_dir = converted
  code = ("import sys; from bert_jax import predict; p = predict.load(sys.argv[1]); "
          "r = predict.predict(p, 'The man went to the [MASK] .'); "
          "print(type(p.tokenizer).__name__, 'tensorflow' in sys.modules, len(r['masks']))")
  r = subprocess.run([sys.executable, "-c", code, orbax_dir], cwd=ROOT, capture_output=True,
                     text=True, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT),
                     timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.split() == ["PythonWordPieceTokenizer", "False", "1"]


def test_embed_output_must_be_a_npy_file(tmp_path):
  """Issue 49 item 7: `predict embed --output_file=vectors.txt` wrote .npy bytes under that name
  without a word."""
  for name, stem in (("vectors.txt", "vectors"), ("vectors", "vectors"), ("v.csv", "v")):
    with pytest.raises(predict.PredictError) as e:
      predict.check_embed_output(str(tmp_path / name))
    assert str(e.value) == (f"--output_file={tmp_path / name}: embed writes a NumPy .npy array "
                            f"([N, H] float32); name a .npy file (e.g. --output_file="
                            f"{tmp_path / stem}.npy).")
  predict.check_embed_output(str(tmp_path / "v.NPY"))
