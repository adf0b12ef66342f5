"""Tests for bert_jax/convert: name table, TF and HF import, HF export, bad input."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.checkpoint import store as ckpt_lib  # noqa: E402
from bert_jax import convert  # noqa: E402
from bert_jax.inference import hf_export  # noqa: E402
from bert_jax.models import model as model_lib  # noqa: E402
from bert_jax.models import pretraining_heads
from bert_jax.convert import names  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402
from tests.testlib import hf_testlib  # noqa: E402

ROOT = tests.ROOT


@pytest.fixture(scope="module")
def hf_model():
  return hf_testlib.random_hf_model(hf_testlib.hf_config(), seed=3)


@pytest.fixture(scope="module")
def hf_dir(hf_model, tmp_path_factory):
  return hf_testlib.save_hf(hf_model, str(tmp_path_factory.mktemp("hf") / "model"))


_assert_trees_equal = hf_testlib.assert_trees_equal


def test_name_table_covers_the_model_exactly():
  config = model_lib.BertConfig(vocab_size=50, hidden_size=48, num_layers=3, num_heads=3,
                                intermediate_size=80, max_position_embeddings=20)
  shapes = jax.eval_shape(lambda: pretraining_heads.init_params(config, jax.random.key(0)))
  flat = {k: tuple(v.value.shape) for k, v in names.flatten(dict(shapes)).items()}
  table = names.specs(config)
  assert {s.path: s.shape for s in table} == flat
  assert len({s.hf for s in table}) == len({s.tf for s in table}) == len(table)


def test_hf_to_orbax_to_hf_is_bit_exact_and_loads_in_transformers(hf_dir, tmp_path):
  meta = convert.convert_to_orbax(hf_dir, str(tmp_path / "orbax"))
  assert meta["do_lower_case"] is True  # the test vocab has no upper-case token
  params, config, stored = ckpt_lib.load_params(str(tmp_path / "orbax"))
  assert stored["numerics"]["hidden_act"] == config.hidden_act == "gelu"
  assert os.path.isfile(tmp_path / "orbax" / "vocab.txt")
  assert not [p for p in os.listdir(tmp_path) if "partial" in p or ".tmp-" in p]

  hf_export.export_to_hf(str(tmp_path / "orbax"), str(tmp_path / "back"))
  original = load_file(os.path.join(hf_dir, "model.safetensors"))
  exported = load_file(str(tmp_path / "back" / "model.safetensors"))
  assert sorted(original) == sorted(exported)
  for k in original:
    assert original[k].dtype == exported[k].dtype and original[k].tobytes() == \
        exported[k].tobytes(), k

  model, info = transformers.BertForPreTraining.from_pretrained(
      str(tmp_path / "back"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert not info["mismatched_keys"], info
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "back"))
  assert tokenizer("the man went")["input_ids"] == [3, 6, 7, 8, 4]
  assert tokenizer.do_lower_case


def test_tf_checkpoint_gives_the_same_params_as_hf(hf_model, hf_dir, tmp_path):
  hf_params, hf_config, _ = convert.import_checkpoint(hf_dir)
  variables = hf_testlib.hf_to_tf_variables(hf_model.state_dict())
  tf_dir = str(tmp_path / "uncased_L-2_H-64_A-4")
  hf_testlib.write_tf_checkpoint(tf_dir, variables,
                                 hf_testlib.google_config_json(hf_model.config))
  hf_testlib.write_vocab(os.path.join(tf_dir, "vocab.txt"), 64)
  tf_params, tf_config, meta = convert.import_checkpoint(tf_dir)
  _assert_trees_equal(tf_params, hf_params)
  # Every variable is mapped or reported as ignored (adam slots, global_step).
  num_weights = len(variables) // 3
  ignored = meta["ignored_variables"]
  assert meta["num_mapped"] == num_weights == len(names.specs(tf_config))
  assert len(ignored) == 2 * num_weights + 1 and ignored["global_step"] == "training state"
  assert all(v == "optimizer slot" for k, v in ignored.items() if k != "global_step")
  assert meta["initialized_randomly"] == []
  # Numerics of google's modeling.py: tanh GELU, LayerNorm eps 1e-12, casing from the name.
  assert tf_config.hidden_act == "gelu_tanh" and tf_config.layer_norm_eps == 1e-12
  assert hf_config.hidden_act == "gelu"
  assert meta["do_lower_case"] is True and "uncased_L-2_H-64_A-4" in meta["casing_inferred_from"]
  with pytest.raises(convert.ConversionError, match="do_lower_case=False but the checkpoint is "
                     "uncased"):
    convert.import_checkpoint(tf_dir, do_lower_case=False)
  # Unmapped variable: one line naming it.
  variables["cls/squad/output_weights"] = np.zeros((2, 64), np.float32)
  bad = str(tmp_path / "bad")
  hf_testlib.write_tf_checkpoint(bad, variables, hf_testlib.google_config_json(hf_model.config))
  hf_testlib.write_vocab(os.path.join(bad, "vocab.txt"), 64)
  with pytest.raises(convert.ConversionError,
                     match=r"variable cls/squad/output_weights \(shape \(2, 64\)\) has no place"):
    convert.import_checkpoint(bad)
  params, _, meta = convert.import_checkpoint(bad, ignore="^cls/squad/")
  assert meta["ignored_variables"]["cls/squad/output_weights"] == "--ignore=^cls/squad/"


@pytest.mark.parametrize("layout", ["BertModel", "BertForMaskedLM", "old_names_and_bin"])
def test_hf_layouts(layout, hf_model, hf_dir, tmp_path):
  full, _, _ = convert.import_checkpoint(hf_dir)
  d = str(tmp_path / layout)
  if layout == "BertModel":  # no "bert." prefix, no heads
    hf_testlib.save_hf(hf_model.bert, d)
  elif layout == "BertForMaskedLM":  # no pooler, no NSP head
    mlm = transformers.BertForMaskedLM(hf_model.config)
    mlm.load_state_dict(hf_model.state_dict(), strict=False)
    hf_testlib.save_hf(mlm, d)
  else:  # an old-style pytorch_model.bin: LayerNorm gamma/beta, decoder weight/bias, position_ids
    os.makedirs(d)
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                      "LayerNorm.beta"): v
             for k, v in hf_model.state_dict().items()}
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    state["bert.embeddings.position_ids"] = torch.arange(40)[None]
    torch.save(state, os.path.join(d, "pytorch_model.bin"))
    hf_model.config.to_json_file(os.path.join(d, "config.json"))
    hf_testlib.write_vocab(os.path.join(d, "vocab.txt"), 64)
  params, _, meta = convert.import_checkpoint(d)
  flat, ref = names.flatten(params), names.flatten(full)
  fresh = set(meta["initialized_randomly"])
  expected_fresh = {"BertModel": {k for k in ref if not k.startswith("bert/")},
                    "BertForMaskedLM": {k for k in ref if k.startswith(("bert/pooler",
                                                                        "nsp_head"))},
                    "old_names_and_bin": set()}[layout]
  assert fresh == expected_fresh
  for k in ref:
    if k not in fresh:
      np.testing.assert_array_equal(flat[k], ref[k], err_msg=k)
  if layout == "BertModel":  # fresh heads: google's init (truncated normal 0.02, LN 1/0)
    kernel = flat["mlm_head/transform/kernel"]
    assert np.abs(kernel).max() <= 0.04 and 0.015 < kernel.std() < 0.02
    np.testing.assert_array_equal(flat["mlm_head/transform_layer_norm/scale"], 1.0)
    np.testing.assert_array_equal(flat["nsp_head/bias"], 0.0)
  if layout == "old_names_and_bin":
    assert set(meta["ignored_variables"]) == {"cls.predictions.decoder.weight",
                                              "cls.predictions.decoder.bias",
                                              "bert.embeddings.position_ids"}


def _copy_hf(hf_dir, dst, edit_config=None, edit_state=None):
  os.makedirs(dst)
  with open(os.path.join(hf_dir, "config.json")) as f:
    config = json.load(f)
  config.update(edit_config or {})
  with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(config, f)
  state = load_file(os.path.join(hf_dir, "model.safetensors"))
  if edit_state:
    edit_state(state)
  save_file(state, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
  hf_testlib.write_vocab(os.path.join(dst, "vocab.txt"), config["vocab_size"])
  return dst


def test_bad_input_one_line_errors_and_no_output(hf_dir, tmp_path):
  out = str(tmp_path / "out")
  cases = [
      (str(tmp_path / "nope"), "no such directory"),
      (_copy_hf(hf_dir, str(tmp_path / "shape"), {"intermediate_size": 99}),
       r"variable bert.encoder.layer.0.intermediate.dense.bias has shape \(100,\) but "
       r".*config.json gives \(99,\)"),
      (_copy_hf(hf_dir, str(tmp_path / "layers"), {"num_hidden_layers": 3}),
       r"variable bert.encoder.layer.2.attention.self.query.weight \(expected shape \(64, 64\).*"
       "is missing"),
      (_copy_hf(hf_dir, str(tmp_path / "extra"), edit_state=lambda s: s.update(
          {"classifier.weight": np.zeros((3, 64), np.float32)})),
       r"variable classifier.weight \(shape \(3, 64\)\) has no place"),
      (_copy_hf(hf_dir, str(tmp_path / "untied"), edit_state=lambda s: s.update(
          {"cls.predictions.decoder.weight": np.ones((64, 64), np.float32)})),
       "cls.predictions.decoder.weight differs from bert.embeddings.word_embeddings.weight"),
      (_copy_hf(hf_dir, str(tmp_path / "roberta"), {"model_type": "roberta"}),
       "model_type='roberta'"),
  ]
  for path, message in cases:
    with pytest.raises(convert.ConversionError, match=message) as e:
      convert.convert_to_orbax(path, out)
    assert "\n" not in str(e.value)
    assert not os.path.exists(out)
  (tmp_path / "junk").mkdir()
  (tmp_path / "junk" / "notes.txt").write_text("x")
  with pytest.raises(convert.ConversionError, match="unknown layout"):
    convert.convert_to_orbax(str(tmp_path / "junk"), out)
  os.remove(os.path.join(tmp_path / "shape", "vocab.txt"))
  # No --vocab_file was passed: the error names the folder and the flag to pass, not a
  # --vocab_file=PATH the user never gave (issue 39 item 5).
  with pytest.raises(convert.ConversionError,
                     match=r"shape: no vocab.txt \(or SentencePiece .model\) beside"):
    convert.convert_to_orbax(str(tmp_path / "shape"), out)
  bad_vocab = str(tmp_path / "v.txt")
  hf_testlib.write_vocab(bad_vocab, 70)
  with pytest.raises(convert.ConversionError, match="has 70 tokens but .*vocab_size=64"):
    convert.convert_to_orbax(hf_dir, out, vocab_file=bad_vocab)
  assert not [p for p in os.listdir(tmp_path) if p.startswith((".out", "out"))]


def test_failed_write_leaves_no_finished_looking_directory(hf_dir, tmp_path, monkeypatch):
  def broken_save(path, *args, **kwargs):
    os.makedirs(path)
    open(os.path.join(path, ckpt_lib.CONFIG_NAME), "w").close()
    raise OSError("disk full")
  monkeypatch.setattr(ckpt_lib, "save_params", broken_save)
  with pytest.raises(OSError, match="disk full"):
    convert.convert_to_orbax(hf_dir, str(tmp_path / "out"))
  assert os.listdir(tmp_path) == []


def test_casing_checks(hf_dir, tmp_path):
  cased = _copy_hf(hf_dir, str(tmp_path / "cased"))
  with open(os.path.join(cased, "tokenizer_config.json"), "w") as f:
    json.dump({"do_lower_case": False}, f)
  with pytest.raises(convert.ConversionError, match="do_lower_case=True but the checkpoint is "
                     "cased \\(tokenizer_config.json do_lower_case\\)"):
    convert.import_checkpoint(cased, do_lower_case=True)
  assert convert.import_checkpoint(cased)[2]["do_lower_case"] is False
  convert.check_casing({"do_lower_case": True}, True)
  with pytest.raises(convert.ConversionError, match="set --do_lower_case=False"):
    convert.check_casing({"do_lower_case": False}, True)


def test_cli_round_trip_and_error(hf_dir, tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  run = lambda *a: subprocess.run([sys.executable, "-m", "bert_jax.convert", *a], env=env,
                                  capture_output=True, text=True, cwd=ROOT, timeout=300)
  r = run(f"--input={hf_dir}", f"--output={tmp_path}/o")
  assert r.returncode == 0, r.stderr
  assert "mapped 46 parameters" in r.stdout
  assert r.stdout.startswith(f"loading the hf checkpoint {hf_dir}\n")
  r = run(f"--input={tmp_path}/o", f"--output={tmp_path}/o")
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: --output=")
  # Exporting a pre-training workdir names the step it took (the latest) and its path.
  from tests.bert_jax.inference import inference_test  # pylint: disable=g-import-not-at-top
  params, config, _ = ckpt_lib.load_params(f"{tmp_path}/o")
  workdir = inference_test.make_workdir(str(tmp_path / "run"), params, config,
                                        f"{tmp_path}/o/vocab.txt", steps=(2, 7))
  r = run(f"--input={workdir}", f"--output={tmp_path}/hf")
  assert r.returncode == 0, r.stderr
  assert f"loaded step 7 of {workdir} (" in r.stdout.splitlines()[0]


def test_pretraining_workdir_exports_without_source_flag(hf_dir, tmp_path):
  """`convert --input=<workdir>` finds the latest step and the run's vocab (no --source=orbax)."""
  from tests.bert_jax.inference import inference_test  # pylint: disable=g-import-not-at-top
  convert.convert_to_orbax(hf_dir, str(tmp_path / "orbax"))
  params, config, _ = ckpt_lib.load_params(str(tmp_path / "orbax"))
  workdir = inference_test.make_workdir(str(tmp_path / "run"), params, config,
                                        str(tmp_path / "orbax" / "vocab.txt"), steps=(0,))
  assert convert.detect_source(workdir) == "orbax"
  hf_export.export_to_hf(workdir, str(tmp_path / "from_workdir"))
  hf_export.export_to_hf(str(tmp_path / "orbax"), str(tmp_path / "from_export"))
  for name in ("model.safetensors", "vocab.txt", "tokenizer_config.json"):
    with open(tmp_path / "from_workdir" / name, "rb") as a, \
        open(tmp_path / "from_export" / name, "rb") as b:
      assert a.read() == b.read(), name
  with pytest.raises(convert.ConversionError, match="unknown layout.*bert_jax workdir"):
    os.makedirs(tmp_path / "empty")
    convert.detect_source(str(tmp_path / "empty"))
