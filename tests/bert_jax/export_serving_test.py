"""bert_jax/export_serving.py: a fine-tuning export -> TFLite flatbuffer whose logits equal ours
within the stated tolerance through the TFLite interpreter; bad inputs are one line, exit 2,
before any conversion."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax import export_serving
from bert_jax.models import heads
from bert_jax.models import model as model_lib
from bert_jax_core import errors
from bert_jax_core import files as files_lib
from tests.testlib import tasks_testlib

ROOT = tests.ROOT
TEXT = "the film was good . the film was bad . a fine plot and a dull end ."
SEQ = 16


TINY = dict(hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2)


def _export(d, *, task_type="classification", labels=("neg", "pos", "mixed"), head=True,
            preset="tiny", sizes=TINY, moved=False, head_scale=50.0):
  """A fine-tuning export as finetune._save_best writes it: a 2-layer H32 classifier (or, with
  head=False, a bare pre-trained body under the same metadata), vocab.txt bundled. moved: every
  parameter off its init (x (1 + 0.2 N(0, 1))), as training leaves them (NoNorm's scales too)."""
  vocab_file = tasks_testlib.write_vocab(str(d), TEXT)
  with open(vocab_file) as f:
    vocab_size = len(f.read().split("\n")) - 1
  cfg = model_lib.get_bert_config(preset, vocab_size=vocab_size, max_position_embeddings=32,
                                  **sizes)
  model = heads.create_model(task_type, cfg, num_labels=max(len(labels), 1))
  ids = np.zeros((1, SEQ), np.int32)
  params = jax.tree.map(np.asarray, nn.unbox(model.init(jax.random.PRNGKey(1), ids, ids,
                                                         ids)["params"]))
  if moved:
    rng = np.random.default_rng(3)
    params = jax.tree.map(lambda x: (x * (1 + 0.2 * rng.standard_normal(x.shape)) + 0.01
                                     * rng.standard_normal(x.shape)).astype(x.dtype), params)
  # Logits of size ~1, as a trained head gives, not the ~0.01 of a 0.02-stddev init.
  if not head:
    params = {"bert": params["bert"]}
  elif "classifier" in params:   # the span head is "qa_outputs"
    params["classifier"]["kernel"] = params["classifier"]["kernel"] * head_scale
  path = str(d / "best_epoch2")
  ckpt_lib.save_params(path, params, cfg, meta=dict(
      task="custom", task_type=task_type, epoch=2, do_lower_case=True, labels=list(labels),
      vocab_file=vocab_file, vocab_hash=files_lib.sha256_file(vocab_file)))
  shutil.copyfile(vocab_file, os.path.join(path, "vocab.txt"))
  return path, model, params


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
  return _export(tmp_path_factory.mktemp("export_serving"))


@pytest.mark.slow   # tests/tiers.py SMOKE: the program's one end-to-end run (~15 s)
def test_python_m_export_serving_writes_a_flatbuffer_whose_logits_equal_ours(fine_tuned,
                                                                              tmp_path):
  path, model, params = fine_tuned
  out = str(tmp_path / "m.tflite")
  r = _run(f"--init_checkpoint={path}", f"--output={out}", f"--max_seq_length={SEQ}",
           "--batch_size=2")
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert lines[0].startswith(f"loaded {path}") and "classification head over 3 labels" in lines[0]
  assert "check: 8 rows" in r.stdout and ": within" in r.stdout
  assert f"wrote {out}" in r.stdout and lines[-1].startswith("next: ")
  assert r.stderr == "", r.stderr                                    # no library noise
  record = json.load(open(out + ".json"))
  assert record["labels"] == ["neg", "pos", "mixed"] and record["check"]["max_abs_diff"] <= 1e-4
  assert record["inputs"]["input_ids"] == {"shape": [2, SEQ], "dtype": "int32"}
  assert record["tokenizer_file"] == os.path.join(path, "vocab.txt")   # the bundled one
  assert record["tokenizer_sha256"] == files_lib.sha256_file(record["tokenizer_file"])
  assert record["do_lower_case"] is True
  # Read back from disk, on rows the export's own check did not use (another seed).
  with open(out, "rb") as f:
    runner = export_serving.TFLiteRunner(f.read())
  rows = export_serving.check_rows(model.config, 4, SEQ, seed=7)
  theirs, ours, diff = export_serving.compare(runner, export_serving.forward_fn(model, params),
                                              rows, 2)
  assert theirs.shape == (4, 3) and np.max(np.abs(ours)) > 0.5   # not trivially equal zeros
  assert export_serving.within_tolerance(theirs, ours), diff
  assert not export_serving.within_tolerance(theirs + 1e-2, ours)    # the check can fail
  # The padding is honoured: an id under input_mask 0 changes nothing.
  changed = {k: v[:2].copy() for k, v in rows.items()}
  changed["input_ids"][0, -1] = 3       # row 0 is 2 tokens long: position -1 is padding
  np.testing.assert_allclose(runner(**changed)[0], theirs[0], atol=1e-6)


@pytest.mark.slow   # one conversion of a MobileBERT (trigram embeddings, bottlenecks): ~25 s
def test_a_fine_tuned_mobilebert_tiny_classifier_serves_within_the_tolerance(tmp_path):
  """python -m bert_jax.export_serving on a mobilebert-tiny classifier (its own family body:
  trigram input, bottlenecks, stacked FFNs, NoNorm, every parameter off its init): the export's
  own check passes and the flatbuffer's logits equal ours on other rows, padding honoured."""
  # Its pooled [CLS] is ~10x smaller than BERT-tiny's at init: a 10x larger head for logits ~1.
  path, model, params = _export(tmp_path, preset="mobilebert-tiny", sizes={}, moved=True,
                                head_scale=500.0)
  assert ckpt_lib.describe(path).config.family == "mobilebert"
  out = str(tmp_path / "m.tflite")
  r = _run(f"--init_checkpoint={path}", f"--output={out}", f"--max_seq_length={SEQ}",
           "--batch_size=2")
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  assert "check: 8 rows" in r.stdout and ": within" in r.stdout and r.stderr == "", r.stderr
  record = json.load(open(out + ".json"))
  assert record["check"]["max_abs_diff"] <= 1e-4
  with open(out, "rb") as f:
    runner = export_serving.TFLiteRunner(f.read())
  rows = export_serving.check_rows(model.config, 4, SEQ, seed=7)
  theirs, ours, diff = export_serving.compare(runner, export_serving.forward_fn(model, params),
                                              rows, 2)
  assert theirs.shape == (4, 3) and np.max(np.abs(ours)) > 0.5, ours
  assert export_serving.within_tolerance(theirs, ours), diff
  print(f"mobilebert-tiny tflite vs ours: max |diff| {diff}")
  changed = {k: v[:2].copy() for k, v in rows.items()}
  changed["input_ids"][0, -1] = 3       # row 0 is 2 tokens long: position -1 is padding
  np.testing.assert_allclose(runner(**changed)[0], theirs[0], atol=1e-6)


def test_regression_head_exports_one_score_and_a_failed_check_writes_nothing(tmp_path,
                                                                             monkeypatch):
  path, _, _ = _export(tmp_path, task_type="regression", labels=())
  out = str(tmp_path / "r.tflite")
  record = export_serving.export(path, out, max_seq_length=SEQ, quiet=True)
  assert record["output"]["shape"] == [1, 1] and record["labels"] == []
  assert os.path.getsize(out) > 10_000
  # An interpreter whose logits are 1e-2 off: the check refuses, exit 1, nothing written (the
  # same flatbuffer, not converted a second time).
  with open(out, "rb") as f:
    flatbuffer = f.read()
  monkeypatch.setattr(export_serving, "to_tflite", lambda *a: flatbuffer)
  call = export_serving.TFLiteRunner.__call__
  monkeypatch.setattr(export_serving.TFLiteRunner, "__call__",
                      lambda self, **kw: call(self, **kw) + 1e-2)
  with pytest.raises(SystemExit, match=r"export check failed: .*o.tflite not written"):
    export_serving.export(path, str(tmp_path / "o.tflite"), max_seq_length=SEQ, quiet=True)
  assert not os.path.exists(tmp_path / "o.tflite")


def _run(*flags):
  return subprocess.run([sys.executable, "-m", "bert_jax.export_serving", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=False)


def test_a_bad_flag_is_one_line_exit_2_before_anything_is_read(tmp_path):
  r = _run("--init_checkpoint=/nonexistent/best_epoch1", f"--output={tmp_path}/o.onnx",
           "--format=onnx")
  assert r.returncode == 2 and r.stdout == "", r
  assert r.stderr.strip().splitlines() == [
      "error: --format=onnx: this program writes tflite (TFLite through jax2tf; "
      "docs/serving.md says why not ONNX); pass --format=tflite."]


def test_an_existing_output_or_record_is_refused_unless_overwrite(tmp_path):
  """Issue 49: export_serving replaced an existing --output without a word (convert refused
  its). The model and its record <output>.json are checked before anything is read."""
  out = tmp_path / "m.tflite"
  out.write_bytes(b"an older model")
  with pytest.raises(files_lib.OutputPathError, match=r"^--output=.*m.tflite: already exists; "
                     r"pass --overwrite to replace it, or choose another path.$"):
    export_serving.check_flags(str(out), "tflite", SEQ, 1)
  out.unlink()
  (tmp_path / "m.tflite.json").write_text("{}")   # its record, left from an earlier export
  with pytest.raises(files_lib.OutputPathError, match=r"m.tflite.json: already exists; pass "
                     "--overwrite"):
    export_serving.check_flags(str(out), "tflite", SEQ, 1)
  export_serving.check_flags(str(out), "tflite", SEQ, 1, overwrite=True)


def test_an_output_that_is_not_a_tflite_file_is_refused(tmp_path):
  """Issue 49 item 7: --output=model.onnx (or a name without an extension) got the TFLite
  flatbuffer under that name without a word."""
  for name, stem in (("model.onnx", "model"), ("model", "model"), ("m.tflite.bak", "m.tflite")):
    with pytest.raises(export_serving.ExportError) as e:
      export_serving.check_flags(str(tmp_path / name), "tflite", SEQ, 1)
    assert str(e.value) == (f"--output={tmp_path / name}: the export is a TFLite flatbuffer; "
                            f"name a .tflite file (e.g. --output={tmp_path / stem}.tflite).")
  export_serving.check_flags(str(tmp_path / "m.TFLite"), "tflite", SEQ, 1)


@pytest.mark.slow   # a subprocess
def test_the_program_refuses_an_existing_output_in_one_line(tmp_path):
  out = tmp_path / "m.tflite"
  out.write_bytes(b"an older model")
  r = _run("--init_checkpoint=/nonexistent/best_epoch1", f"--output={out}")
  assert r.returncode == 2 and r.stdout == "", r
  assert r.stderr.strip().splitlines() == [
      f"error: --output={out}: already exists; pass --overwrite to replace it, or choose "
      "another path."]
  assert out.read_bytes() == b"an older model"
  r = _run("--init_checkpoint=/nonexistent/best_epoch1", f"--output={out}", "--overwrite")
  assert r.returncode == 2 and "--init_checkpoint=/nonexistent/best_epoch1" in r.stderr


@pytest.mark.parametrize("which, seq, expected", [
    ("missing", SEQ, "--init_checkpoint=/nonexistent/best_epoch1: no such file or directory"),
    ("body", SEQ, "its parameters are not a bert classification head with 3 outputs (e.g. "
                  "classifier/bias: found nothing, the head needs (3,)"),
    ("fine_tuned", 64, "--max_seq_length=64: the model takes at most 32 positions"),
    ("span", SEQ, "fine-tuned for span (custom); this export takes the logits heads "
                  "(classification, regression)"),
])
def test_bad_checkpoints_are_user_errors_before_conversion(fine_tuned, tmp_path, which, seq,
                                                           expected):
  path = {"missing": "/nonexistent/best_epoch1", "fine_tuned": fine_tuned[0]}.get(which)
  path = path or (_export(tmp_path, task_type="span", labels=())[0] if which == "span"
                  else _export(tmp_path, head=False)[0])
  with pytest.raises(errors.UserError) as e:
    export_serving.export(path, str(tmp_path / "o.tflite"), max_seq_length=seq, quiet=True)
  assert expected in str(e.value)
  assert not os.path.exists(tmp_path / "o.tflite")


def test_a_pre_training_export_is_not_a_fine_tuned_classifier(tmp_path):
  path, _, params = _export(tmp_path, head=False)
  bare = str(tmp_path / "pretrained")    # the same body, saved as `bert_jax.convert` does
  ckpt_lib.save_params(bare, params, ckpt_lib.describe(path).config, meta={"do_lower_case": True})
  shutil.copyfile(os.path.join(path, "vocab.txt"), os.path.join(bare, "vocab.txt"))
  with pytest.raises(export_serving.ExportError, match="is not a fine-tuning export"):
    export_serving.load_classifier(bare, SEQ)
