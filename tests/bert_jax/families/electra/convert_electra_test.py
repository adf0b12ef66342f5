"""ELECTRA <-> transformers (bert_jax/families/electra/convert.py): outputs equal within 1e-4 both ways,
on randomly initialised tiny models saved with save_pretrained (torch CPU reference)."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.families.electra import objective as electra
from bert_jax.models import model as model_lib
from bert_jax.families.electra import convert as convert_electra
from bert_jax.convert.formats import ConversionError
from tests.testlib import hf_testlib

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = model_lib.get_bert_config("electra-tiny", vocab_size=99, max_position_embeddings=32)


def _hf_config(c):
  return transformers.ElectraConfig(
      vocab_size=c.vocab_size, embedding_size=c.embed_dim, hidden_size=c.hidden_size,
      num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
      intermediate_size=c.intermediate_size, max_position_embeddings=c.max_position_embeddings)


def _inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 99, (2, 12)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 8:] = 0
  segments = (np.arange(12)[None] >= 5).astype(np.int32) * mask
  return ids * mask, mask, segments


def _ours(params, config):
  """(discriminator logits [B, T], generator logits at every position [B, T, V]) of our model."""
  ids, mask, segments = _inputs()
  model = electra.ElectraForPreTraining(config)
  v = {"params": params}
  every = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  # Jitted: op by op the two encoders take seconds on a shared 2-core CPU.
  disc, gen = jax.jit(lambda v: (
      model.apply(v, ids, mask, segments, method=model.discriminator_logits),
      model.apply(v, ids, mask, segments, every, method=model.generator_logits)))(v)
  return np.asarray(disc), np.asarray(gen)


def _theirs(disc_dir, gen_dir):
  ids, mask, segments = (torch.tensor(x, dtype=torch.long) for x in _inputs())
  with torch.no_grad():
    disc = transformers.ElectraForPreTraining.from_pretrained(disc_dir).eval()
    gen = transformers.ElectraForMaskedLM.from_pretrained(gen_dir).eval()
    kw = dict(input_ids=ids, attention_mask=mask, token_type_ids=segments)
    return disc(**kw).logits.numpy(), gen(**kw).logits.numpy()


def _close(ours, theirs, mask):
  real = mask.astype(bool)   # padding positions' outputs are not compared (masked keys differ)
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a[real], b[real], atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
  """A random transformers discriminator + generator sharing embeddings, as a trained pair."""
  root = tmp_path_factory.mktemp("hf_electra")
  torch.manual_seed(0)
  disc = transformers.ElectraForPreTraining(_hf_config(TINY))
  gen = transformers.ElectraForMaskedLM(_hf_config(electra.generator_config(TINY)))
  gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
  gen.tie_weights()
  disc.save_pretrained(root / "disc")
  gen.save_pretrained(root / "gen")
  _vocab(root / "disc")   # the tokenizer a released discriminator ships (its vocab.txt)
  return str(root / "disc"), str(root / "gen")


def test_import_from_transformers_matches_within_1e4(hf_pair):
  params, config, meta = convert_electra.import_hf(*hf_pair)
  assert config == TINY
  assert meta["initialized_randomly"] == []
  _close(_ours(params, config), _theirs(*hf_pair), _inputs()[1])


def test_export_to_transformers_matches_within_1e4_and_imports_back(tmp_path):
  params = nn.meta.unbox(jax.jit(lambda r: electra.init_params(TINY, r))(jax.random.PRNGKey(7)))
  # A non-zero bias everywhere, so a bias mapped to the wrong place shows.
  params = jax.tree.map(lambda x: np.asarray(x) + np.float32(0.01) * np.sin(
      np.arange(x.size).reshape(x.shape)).astype(np.float32), params)   # numpy: no compiles
  with hf_testlib.umask(0o022):
    out = convert_electra.export_to_hf(params, TINY, str(tmp_path / "hf"))
  # Every file of both folders readable by others, as every export's (was 0600: safetensors').
  modes = hf_testlib.file_modes(out)
  assert set(modes.values()) == {0o644} and len(modes) == 4, modes
  disc_dir, gen_dir = os.path.join(out, "discriminator"), os.path.join(out, "generator")
  assert json.load(open(os.path.join(gen_dir, "config.json")))["hidden_size"] == 32
  ours = _ours(params, TINY)
  _close(ours, _theirs(disc_dir, gen_dir), _inputs()[1])
  back, config, _ = convert_electra.import_hf(disc_dir, gen_dir)
  assert config == TINY
  jax.tree.map(np.testing.assert_array_equal, back, params)


def test_bare_electra_model_and_orbax_round_trip(hf_pair, tmp_path):
  # A bare ElectraModel discriminator: the same body, a fresh replaced-token head.
  transformers.ElectraModel.from_pretrained(hf_pair[0]).save_pretrained(tmp_path / "bare")
  params, config, meta = convert_electra.import_hf(str(tmp_path / "bare"), hf_pair[1])
  assert sorted(meta["initialized_randomly"]) == ["rtd_head/dense/bias", "rtd_head/dense/kernel",
                                                  "rtd_head/prediction/bias",
                                                  "rtd_head/prediction/kernel"]
  full, _, _ = convert_electra.import_hf(*hf_pair)
  jax.tree.map(np.testing.assert_array_equal, params["bert"], full["bert"])
  # transformers -> Orbax export -> transformers: the same tensors.
  convert_electra.convert_to_orbax(*hf_pair, str(tmp_path / "orbax"))
  from bert_jax import convert  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  m = inference.load_for_inference(str(tmp_path / "orbax"), vocab_file=_vocab(tmp_path))
  assert set(m.params) == {"bert", "rtd_head", "generator", "mlm_head"}   # predict, finetune
  # The one converter exports the pair too (was: an error naming convert.electra), with the
  # tokenizer files in each folder.
  one = convert.export_model_to_hf(m, str(tmp_path / "one_folder"), str(tmp_path / "orbax"))
  assert all(os.path.isfile(os.path.join(one, net, f)) for net in ("discriminator", "generator")
             for f in ("model.safetensors", "config.json", "vocab.txt"))
  out = convert_electra.export_checkpoint_to_hf(str(tmp_path / "orbax"), str(tmp_path / "hf"))
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  for net, src in zip(("discriminator", "generator"), hf_pair):
    exported = load_file(os.path.join(out, net, "model.safetensors"))
    original = load_file(os.path.join(src, "model.safetensors"))
    assert set(exported) == set(original)
    for k in original:
      np.testing.assert_array_equal(exported[k], original[k])


def test_a_generator_of_another_discriminator_is_refused(hf_pair, tmp_path):
  torch.manual_seed(1)
  other = transformers.ElectraForMaskedLM(_hf_config(electra.generator_config(TINY)))
  other.save_pretrained(tmp_path / "other")
  with pytest.raises(ConversionError, match="shares its embeddings"):
    convert_electra.import_hf(hf_pair[0], str(tmp_path / "other"))
  with pytest.raises(ConversionError, match="model_type='bert'"):
    transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
        intermediate_size=37)).save_pretrained(tmp_path / "bert")
    convert_electra.import_hf(hf_pair[0], str(tmp_path / "bert"))


def test_the_one_converter_reads_a_pair_both_ways_and_bundles_its_vocab(hf_pair, tmp_path):
  """python -m bert_jax.convert (every family's entry point): DISC,GEN -> one Orbax tree with the
  discriminator's vocab.txt (was: no vocab, extract_features needed --vocab_file) and one summary;
  that export -> the two transformers folders; a discriminator folder alone converts too, and
  says it has no generator."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  run = lambda *a: subprocess.run(  # noqa: E731
      [sys.executable, "-m", "bert_jax.convert", *a], capture_output=True, text=True,
      env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=False)
  imported = run(f"--input={hf_pair[0]},{hf_pair[1]}", f"--output={tmp_path / 'orbax'}")
  assert imported.returncode == 0, imported.stderr
  assert imported.stderr == ""
  assert "mapped " in imported.stdout and "do_lower_case=" in imported.stdout
  assert os.path.isfile(tmp_path / "orbax" / "vocab.txt")
  exported = run(f"--input={tmp_path / 'orbax'}", f"--output={tmp_path / 'hf'}")
  assert exported.returncode == 0, exported.stderr
  assert "ElectraForPreTraining (discriminator/) + ElectraForMaskedLM" in exported.stdout
  for net in ("discriminator", "generator"):
    assert os.path.isfile(tmp_path / "hf" / net / "vocab.txt")
  from bert_jax import convert  # pylint: disable=g-import-not-at-top
  meta = convert.convert_to_orbax(hf_pair[0], str(tmp_path / "alone"))
  assert meta["generator"].startswith("none") and "generator: none" in convert.summary(meta)


@pytest.mark.slow
def test_the_former_convert_aliases_are_gone_and_the_docs_name_the_one_converter(hf_pair, tmp_path):
  """`python -m bert_jax.convert.electra` (and .distilbert) were second command lines that
  drifted from the converter: the ELECTRA one imported a pair, then its export of that pair ended
  in a TensorFlow NotFoundError traceback for vocab.txt, looked up in the working directory
  (issue 39). Their one-line errors stood in for them until the family converters moved into
  their families' folders (issue 47: bert_jax/families/<name>/convert.py, modules, not programs);
  now there is no such module, and nothing is written. The one converter converts that pair both
  ways (test_the_one_converter_reads_a_pair_both_ways_...)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  run = lambda module, *a: subprocess.run(  # noqa: E731
      [sys.executable, "-m", module, *a], capture_output=True, text=True,
      env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=False)
  electra_alias = run("bert_jax.convert.electra", f"--discriminator={hf_pair[0]}",
                      f"--generator={hf_pair[1]}", f"--output={tmp_path / 'orbax'}")
  distilbert_alias = run("bert_jax.convert.distilbert", f"--input={hf_pair[0]}",
                         f"--output={tmp_path / 'd'}")
  for name, p in (("electra", electra_alias), ("distilbert", distilbert_alias)):
    assert p.returncode != 0 and p.stdout == "", (name, p.stderr)
    assert f"No module named bert_jax.convert.{name}" in p.stderr, p.stderr
  assert not os.path.exists(tmp_path / "orbax") and not os.path.exists(tmp_path / "d")
  # Every documented command line of the converters is the one converter's.
  for doc in ("docs/models.md", "README.md", "bert_jax/families/electra/convert.py",
              "bert_jax/families/distilbert/convert.py"):
    with open(os.path.join(tests.ROOT, doc),
              encoding="utf-8") as f:
      text = f.read()
    for command in re.findall(r"python -m (bert_jax\.convert[\w.]*) --", text):
      assert command == "bert_jax.convert", (doc, command)


def _vocab(directory, name="vocab.txt"):
  """A 99-token WordPiece vocab (TINY's vocab_size): the specials, then lower-case words."""
  path = os.path.join(str(directory), name)
  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(94)]
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(words) + "\n")
  return path


def test_a_discriminator_folder_and_an_exported_pair_load_wherever_a_checkpoint_does(
    hf_pair, tmp_path, monkeypatch, capsys):
  """inference.load_for_inference (predict, extract_features, fine-tuning) converts a transformers
  discriminator folder on the fly (alone: no generator), and the discriminator/ + generator/
  folder python -m bert_jax.families.electra.convert exports (the pair)."""
  import shutil  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("BERT_JAX_CACHE", str(tmp_path / "cache"))
  disc = tmp_path / "disc"
  shutil.copytree(hf_pair[0], disc)
  _vocab(disc)
  m = inference.load_for_inference(str(disc))
  assert "(electra; no generator: fill-mask needs" in capsys.readouterr().out
  assert m.config.family == "electra" and set(m.params) == {"bert", "rtd_head"}
  assert m.description.endswith(f"(converted from hf {disc})") and m.meta["generator"]
  full, _, _ = convert_electra.import_hf(*hf_pair)
  jax.tree.map(np.testing.assert_array_equal, m.params["bert"], full["bert"])
  assert inference.load_for_inference(str(disc)).path == m.path   # converted once, reused
  assert "using its converted copy" in capsys.readouterr().out
  with pytest.raises(predict.PredictError, match="an ELECTRA without its generator"):
    predict.load(str(disc))
  with pytest.raises(ConversionError, match="an ElectraForMaskedLM"):
    convert_electra.import_hf(hf_pair[1])

  params, config, _ = convert_electra.import_hf(*hf_pair)
  out = convert_electra.export_to_hf(params, config, str(tmp_path / "pair"),
                                     vocab_file=_vocab(tmp_path), do_lower_case=True)
  m = inference.load_for_inference(out)
  assert f"{out}: a Hugging Face folder (electra); converted to Orbax" in capsys.readouterr().out
  assert set(m.params) == {"bert", "rtd_head", "generator", "mlm_head"}
  jax.tree.map(np.testing.assert_array_equal, m.params, params)
  result = predict.predict(predict.load(out), "w1 [MASK] w2", top_k=2)   # the generator
  assert len(result["masks"][0]) == 2
