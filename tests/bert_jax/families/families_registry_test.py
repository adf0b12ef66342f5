"""One family, one module (bert_jax/families/): the registry holds the design.

- A toy family defined HERE (a BERT whose [CLS] head is its own: dense + ReLU "toy_pooler", then
  the classifier; MLM only) registers itself and runs through the normal entry points --
  pre-training (train.train_and_evaluate), fill-mask (predict), export to transformers
  (convert.export_model_to_hf, read back by transformers' BertForMaskedLM with equal logits),
  features and fine-tuning (finetune.finetune) -- without a line changed anywhere else.
- Checkpoints written by the code before the families moved (tests/data/pre_families, written by
  write_fixtures.py at commit 36a50ca) load and give the same fill-mask probabilities, features,
  and fresh classification heads (names and logits) as they did then.
- The loop's modules do not branch on a family name (a static read, as layers_test).
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import ast
import dataclasses
import os

import jax
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import convert
from bert_jax import extract_features
from bert_jax import families
from bert_jax.models import heads
from bert_jax.inference import loading as inference
from bert_jax.models import model as model_lib
from bert_jax import predict
from bert_jax.families import bert as bert_family

ROOT = tests.ROOT
FIXTURES = os.path.join(ROOT, "tests", "data", "pre_families")


# ----------------------------------------------------------------------------------------------
# The toy family: everything it declares is in this file.
# ----------------------------------------------------------------------------------------------
def _toy_cls_logits(config, out, num_labels, deterministic):
  """Not BERT's pooled [CLS]: dense + ReLU on the last layer's [CLS] ("toy_pooler"), dropout,
  then the classifier."""
  x = model_lib._dense(config, config.hidden_size, ("embed", "embed2"), "toy_pooler")(
      out["cls_output"])
  x = nn.Dropout(config.hidden_dropout_prob)(nn.relu(x), deterministic=deterministic)
  return bert_family.head_dense(config, num_labels, "classifier")(x)


TOY = dataclasses.replace(
    families.get("bert"), name="toy", title="ToyBERT",
    presets={"toy-tiny": dict(family="toy", objectives="mlm", num_layers=2, hidden_size=64,
                              num_heads=2, intermediate_size=128)},
    summary="a test family: BERT with its own [CLS] head, MLM only",
    exact_objectives=("mlm",), cls_logits=_toy_cls_logits, hf_model_types=(),
    tf_config_names=(), train_further_note=" (toy)")


@pytest.fixture
def toy():
  families.register(TOY)
  yield TOY
  families.unregister("toy")


def _vocab(directory):
  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + [f"w{i}" for i in range(58)]
  path = os.path.join(str(directory), "vocab.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(words) + "\n")
  return path


def test_a_family_registered_in_a_test_uses_only_its_own_record(toy):
  config = model_lib.get_bert_config("toy-tiny", vocab_size=64)
  assert config.family == "toy" and "toy-tiny" in model_lib.PRESETS
  assert families.of_preset("toy-tiny") is families.get("toy")
  with pytest.raises(ValueError, match="ToyBERT is exactly 'mlm'"):
    model_lib.get_bert_config("toy-tiny", objectives="mlm,nsp")
  with pytest.raises(ValueError, match="already registered"):
    families.register(TOY)
  with pytest.raises(ValueError, match="is already family 'bert'"):
    families.register(dataclasses.replace(TOY, name="toy2", presets={"tiny": dict(family="toy2")}))
  # The head on [CLS] is the toy's: its pooler, no BERT pooler output read.
  head = heads.create_model("classification", config, num_labels=3)
  ids, mask, seg = heads.dummy_inputs("classification", 8)
  params = head.init(jax.random.PRNGKey(0), ids, mask, seg)["params"]
  assert {"bert", "toy_pooler", "classifier"} == set(params)


@pytest.mark.slow
def test_a_toy_family_pretrains_predicts_exports_and_finetunes_through_the_entry_points(
    toy, tmp_path):
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import pretrain as pretrain_config  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test  # pylint: disable=g-import-not-at-top
  vocab = _vocab(tmp_path)
  # --- Pre-training: the preset's family picks the model, its recipe and next commands.
  c = pretrain_config.get_config("toy-tiny,runlocal")
  c.train_input_files, c.vocab_file = "synthetic", vocab
  c.seq_length, c.max_predictions_per_seq, c.batch_size = 32, 5, 8
  c.num_train_steps, c.warmup_steps, c.log_every, c.checkpoint_every = 3, 1, 1, 3
  c.eval_every, c.async_checkpointing = 1000, False
  workdir = str(tmp_path / "pretrain")
  out = train.train_and_evaluate(c, workdir)
  assert out["final_step"] == 3
  assert out["summary"]["next"][-1].endswith(" (toy)")   # the family's own note
  # --- fill-mask through predict, on the workdir.
  p = predict.load(workdir)
  assert p.config.family == "toy"
  result = predict.predict(p, "w1 [MASK] w3 .", top_k=64)
  probs = {i: prob for _, i, prob in result["masks"][0]}
  # --- Export to transformers (the toy's tree is BERT's: BERT's names), read back.
  m = inference.load_for_inference(workdir)
  hf_dir = convert.export_model_to_hf(m, str(tmp_path / "hf"), workdir)
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  hf = transformers.BertForMaskedLM.from_pretrained(hf_dir).eval()
  ids = predict.encode(p, "w1 [MASK] w3 .")[0]
  with torch.no_grad():
    logits = hf(torch.tensor(ids, dtype=torch.long)).logits[0, 2].numpy()
  theirs = np.exp(logits - logits.max())
  theirs /= theirs.sum()
  np.testing.assert_allclose([probs[i] for i in range(64)], theirs, rtol=1e-4, atol=1e-6)
  # --- Features of the body.
  arrays, _ = extract_features.extract([("w1 w2".split(), None)], m.tokenizer, m.params["bert"],
                                       m.config, layers=(-1,), max_seq_length=8, batch_size=1)
  assert arrays["features"].shape == (4, 64)
  # --- Fine-tuning from the workdir: the toy's head, trained.
  finetune_test._sst2(tmp_path, np.random.default_rng(0), 8, 8)
  summary, _ = finetune_test._one_step(tmp_path, (workdir, vocab), "glue_sst2")
  best = inference.load_for_inference(summary["best_checkpoint"])
  assert best.config.family == "toy" and {"toy_pooler", "classifier"} <= set(best.params)
  assert finetune is not None


# ----------------------------------------------------------------------------------------------
# Checkpoints from before the move.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["bert", "electra", "distilbert"])
def test_checkpoints_written_before_the_families_moved_give_the_same_outputs(family):
  expected = np.load(os.path.join(FIXTURES, "expected.npz"))
  path = os.path.join(FIXTURES, family)
  p = predict.load(path)
  result = predict.predict(p, "w1 [MASK] w3 .", top_k=40)
  got = np.asarray([[prob for _, _, prob in sorted(m, key=lambda t: t[1])]
                    for m in result["masks"]])
  np.testing.assert_allclose(got, expected[f"{family}/fill_mask"], rtol=1e-5, atol=1e-7)
  m = inference.load_for_inference(path)
  arrays, _ = extract_features.extract([("w1 w2 w3".split(), None), ("w4 w5".split(), ["w6"])],
                                       m.tokenizer, m.params.get("bert", m.params), m.config,
                                       layers=(-1,), max_seq_length=8, batch_size=2)
  np.testing.assert_allclose(arrays["features"], expected[f"{family}/features"], rtol=1e-5,
                             atol=1e-6)
  head = heads.create_model("classification", m.config, num_labels=3)
  ids, mask, seg = heads.dummy_inputs("classification", 8)
  variables = head.init(jax.random.PRNGKey(0), ids + 5, mask + 1, seg)
  names = sorted(jax.tree_util.keystr(path) for path, _ in
                 jax.tree_util.tree_flatten_with_path(variables["params"])[0])
  assert names == list(expected[f"{family}/head_params"])
  np.testing.assert_allclose(np.asarray(head.apply(variables, ids + 5, mask + 1, seg)),
                             expected[f"{family}/cls_logits"], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# The loop's modules name no family.
# ----------------------------------------------------------------------------------------------
LOOP_MODULES = (
    "bert_jax/train.py", "bert_jax/finetune.py", "bert_jax/training/trainer_lib.py",
    "bert_jax/predict.py", "bert_jax/extract_features.py", "bert_jax/models/heads.py",
    "bert_jax/inference/loading.py", "bert_jax/training/optimizer.py", "bert_jax/plan.py",
    "bert_jax/planning/plan_compile.py", "bert_jax/evaluation/train_report.py",
    "bert_jax/training/batch_warmup.py", "bert_jax/models/model.py",
    "bert_jax/models/pretraining_heads.py", "bert_jax/configs/pretrain.py",
    "bert_jax/convert/__init__.py", "bert_jax/convert/__main__.py")
FAMILY_MODULES = ("bert_jax.families.electra.objective", "bert_jax.families.distilbert.distil",
                  "bert_jax.families.electra.convert", "bert_jax.families.distilbert.convert",
                  "bert_jax.families.albert.convert")


def family_references(path):
  """[(line, what)] of a module: comparisons with a family name string, and imports of a
  family's own modules (what a registry lookup replaces)."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare):
      for c in [node.left, *node.comparators]:
        values = ([c] if isinstance(c, ast.Constant) else
                  list(c.elts) if isinstance(c, (ast.Tuple, ast.List, ast.Set)) else [])
        for v in values:
          # "bert" is also the body's parameter key (params["bert"]): the other names only.
          if isinstance(v, ast.Constant) and v.value in families.BUILTIN[1:]:
            found.append((node.lineno, f"compares with {v.value!r}"))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""])
      found += [(node.lineno, f"imports {n}") for n in names if n in FAMILY_MODULES]
  return found


def test_the_loop_modules_name_no_family():
  found = {m: family_references(os.path.join(ROOT, m)) for m in LOOP_MODULES}
  assert {m: f for m, f in found.items() if f} == {}


def test_a_planted_family_branch_is_found(tmp_path):
  planted = tmp_path / "x.py"
  planted.write_text('from bert_jax.families.electra import objective\n'
                     'if config.family == "distilbert":\n  pass\n')
  assert [w for _, w in family_references(str(planted))] == [
      "imports bert_jax.families.electra.objective", "compares with 'distilbert'"]


@pytest.mark.parametrize("name", ["electra", "distilbert", "modernbert"])
def test_a_family_s_own_transformers_converter_is_found_in_its_folder(name, tmp_path):
  """bert.own_hf_converter imports bert_jax/families/<name>/convert.py at the first call (was
  bert_jax.convert.<name>, gone since issue 47: every ELECTRA, DistilBERT and ModernBERT folder
  failed with ModuleNotFoundError). A missing folder is the converter's own one-line error."""
  from bert_jax_core import errors  # pylint: disable=g-import-not-at-top
  with pytest.raises(errors.UserError, match="missing"):
    families.get(name).import_hf(str(tmp_path / "missing"))
