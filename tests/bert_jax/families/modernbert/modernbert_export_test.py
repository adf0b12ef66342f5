"""A fine-tuned ModernBERT exported to transformers (issue 30 item 3: "exporting gives a folder
transformers loads with every output equal"): families/modernbert/convert.py's fine_tuned_task.

The body is modernbert_cli_test's: a transformers ModernBertForMaskedLM of modernbert-tiny's shape
(3 x 128, window 16, 416 rows), every parameter random, with a 405-id byte-level BPE tokenizer.json
learned on the standard library's docstrings, converted once. A [CLS] head (classification,
regression, multiple choice: ModernBertPredictionHead + classifier) exports as transformers'
ModernBertForSequenceClassification / ModernBertForMultipleChoice, a token head (tagging, SQuAD:
the same head on every position, families/modernbert.token_logits) as
ModernBertForTokenClassification / ModernBertForQuestionAnswering, and AutoModelFor* on the folder
gives our logits within 1e-4 on real docstring text, padded rows included.
"""

import json
import os

import jax
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax import convert
from bert_jax import finetune
from bert_jax.models import heads
from bert_jax.inference import hf_export
from bert_jax.families.modernbert import convert as convert_modernbert
from tests.bert_jax.families.modernbert.modernbert_cli_test import export, hf_folder  # noqa: F401 (module fixtures)
from tests.bert_jax.families.modernbert.modernbert_cli_test import _run

TOL = 1e-4
SEQ = 48


def _fine_tuned(export_dir, out, task, family, num_labels, labels=(), seed=1,
                task_type=True, kernel_std=0.5):
  """A best_epoch{N}-style export of `family`'s head on the converted body, as finetune._save_best
  writes it: the head random (kernels 0.5 x normal, biases and norm scales off 0 and 1, so a
  wrong transpose or a dropped bias shows), the body the converted transformers model's."""
  body, config, _ = ckpt_lib.load_params(export_dir)
  model = heads.create_model(family, config, num_labels=num_labels, num_choices=2)
  shapes = heads.dummy_inputs(family, SEQ, num_choices=2)
  params = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *shapes)))
  params = params["params"]
  rng = np.random.default_rng(seed)
  tree = {k: jax.tree_util.tree_map(
      lambda a: (rng.standard_normal(a.shape) * (kernel_std if a.ndim == 2 else 0.5)
                 + (1.0 if a.ndim == 1 else 0.0)).astype(
          np.float32), v) for k, v in params.items() if k != "bert"}
  tree["bert"] = body["bert"]
  tok = os.path.join(export_dir, "tokenizer.json")
  record = {"task_type": family} if task_type else {}   # finetune._save_best records it
  ckpt_lib.save_params(out, tree, config, meta=dict(
      task=task, epoch=1, do_lower_case=False, labels=list(labels), dev_metrics={},
      **record, **finetune.vocab_record(tok)))
  return out, model, tree


def _real_text(hf_folder, n):  # noqa: F811
  """n docstring lines of different lengths (so the batch pads), 6-30 words each."""
  lines = [ln for ln in hf_folder["lines"] if 6 <= len(ln.split()) <= 30]
  return [lines[i] for i in range(0, 7 * n, 7)][:n]


def _ours(model, tree, enc):
  ids = enc["input_ids"].numpy()
  mask = enc["attention_mask"].numpy()
  out = model.apply({"params": tree}, ids, mask, np.zeros_like(ids))
  return np.asarray(out)


@pytest.mark.parametrize("task,family,num_labels,labels,auto", [
    ("mnli", "classification", 3, ("contradiction", "entailment", "neutral"),
     "AutoModelForSequenceClassification"),
    ("stsb", "regression", 1, (), "AutoModelForSequenceClassification"),
    ("swag", "multiple_choice", 1, (), "AutoModelForMultipleChoice")])
def test_cls_heads_export_with_equal_logits(hf_folder, export, tmp_path, task, family,  # noqa: F811
                                            num_labels, labels, auto):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  best, model, tree = _fine_tuned(export, str(tmp_path / "best_epoch1"), task, family,
                                  num_labels, labels)
  out = hf_export.export_to_hf(best, str(tmp_path / "hf"))
  with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
    written = json.load(f)
  cls = ("ModernBertForMultipleChoice" if family == "multiple_choice"
         else "ModernBertForSequenceClassification")
  assert written["architectures"] == [cls] and written["classifier_pooling"] == "cls"
  if labels:
    assert written["id2label"] == {str(i): t for i, t in enumerate(labels)}
  hf = getattr(transformers, auto).from_pretrained(out, attn_implementation="eager").eval()
  assert type(hf).__name__ == cls
  tok = transformers.AutoTokenizer.from_pretrained(out)
  text = _real_text(hf_folder, 4)
  if family == "multiple_choice":   # [CLS] context [SEP] ending [SEP], 2 endings per context
    pairs = [(text[0], text[1]), (text[0], text[2]), (text[3], text[1]), (text[3], text[0])]
    enc = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    enc = {k: v.reshape(2, 2, -1) for k, v in enc.items()}   # [B=2, C=2, T]
  elif family == "regression":      # a sentence pair, as STS-B
    enc = tok(text[:2], text[2:], padding=True, return_tensors="pt")
  else:
    enc = tok(text, padding=True, return_tensors="pt")
  assert int(enc["attention_mask"].min()) == 0   # padded rows are part of the check
  with torch.no_grad():
    theirs = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits.numpy()
  ours = _ours(model, tree, enc)
  assert ours.shape == theirs.shape == ((2, 2) if family == "multiple_choice" else
                                        (len(enc["input_ids"]), num_labels))
  assert np.abs(ours).max() > 0.1   # not a degenerate head
  np.testing.assert_allclose(ours, theirs, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("task,family,num_labels,auto", [
    ("conll03", "tagging", 9, "AutoModelForTokenClassification"),
    ("squad_v1", "span", 2, "AutoModelForQuestionAnswering")])
def test_token_heads_export_with_equal_logits(hf_folder, export, tmp_path,  # noqa: F811
                                              task, family, num_labels, auto):
  """Tagging and SQuAD heads: transformers' token classes give our logits at every position of
  a padded batch of real text (SQuAD: question + context pairs, as its features are)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from data_pipelines import tasks  # pylint: disable=g-import-not-at-top
  labels = tuple(getattr(tasks.TASKS[task], "labels", ()) or ())
  assert len(labels) == (num_labels if family == "tagging" else 0)
  # The body's float32 difference at real positions is ~2e-5 (hidden states up to 4.5, 3
  # layers); a head of 0.5-std kernels multiplies it by ~sqrt(128) x 0.5 = 5.7 twice (dense, then
  # classifier after the norm): 1.2e-4 measured. Kernels of std 1/sqrt(H) keep the head's gain
  # near 1 (fine-tuning's heads start at 0.02) and still show a transpose or a dropped bias.
  best, model, tree = _fine_tuned(export, str(tmp_path / "best_epoch1"), task, family,
                                  num_labels, labels, kernel_std=128 ** -0.5)
  assert set(tree) == {"bert", "head", "classifier"} and set(tree["head"]) == {"dense", "norm"}
  out = hf_export.export_to_hf(best, str(tmp_path / "hf"))
  with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
    written = json.load(f)
  cls = {"tagging": "ModernBertForTokenClassification",
         "span": "ModernBertForQuestionAnswering"}[family]
  assert written["architectures"] == [cls] and len(written["id2label"]) == num_labels
  if labels:   # CoNLL-03's tags in class order
    assert written["id2label"] == {str(i): t for i, t in enumerate(labels)}
  hf = getattr(transformers, auto).from_pretrained(out, attn_implementation="eager").eval()
  assert type(hf).__name__ == cls
  tok = transformers.AutoTokenizer.from_pretrained(out)
  text = _real_text(hf_folder, 4)
  enc = (tok(text[:2], text[2:], padding=True, return_tensors="pt") if family == "span"
         else tok(text, padding=True, return_tensors="pt"))
  mask = enc["attention_mask"].numpy().astype(bool)
  assert not mask.all()   # padded rows are part of the check
  with torch.no_grad():
    got = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
  ids = enc["input_ids"].numpy()
  ours = model.apply({"params": tree}, ids, mask.astype(np.int32), np.zeros_like(ids))
  if family == "span":   # ([B, T] start, [B, T] end) each
    ours = np.stack([np.asarray(o) for o in ours], -1)
    theirs = np.stack([got.start_logits.numpy(), got.end_logits.numpy()], -1)
  else:
    ours, theirs = np.asarray(ours), got.logits.numpy()
  assert ours.shape == theirs.shape == ids.shape + (num_labels,)
  assert np.abs(ours[mask]).max() > 0.1   # not a degenerate head
  print(f"{family}: max |ours - transformers| at {int(mask.sum())} real positions "
        f"{np.abs(ours[mask] - theirs[mask]).max():.2e}")
  # Only real positions: at padded ones the two bodies' hidden states differ (0.74 measured),
  # and tagging and SQuAD never read them (labels and answer spans lie on real tokens).
  np.testing.assert_allclose(ours[mask], theirs[mask], atol=TOL, rtol=TOL)


def test_task_of_a_tree():
  """The tree and the recorded task decide the class: a 1-output head is regression unless the
  task is registered as multiple choice; another tree is one line."""
  tree = {"bert": {}, "head": {}, "classifier": {"kernel": np.zeros((4, 1))}}
  task = convert_modernbert.fine_tuned_task
  assert task(tree, {"task": "my_scores"}, "w").type == "regression"
  assert task(tree, {"task": "swag"}, "w").type == "multiple_choice"
  three = dict(tree, classifier={"kernel": np.zeros((4, 3))})
  t = task(three, {"task": "custom", "labels": ["a", "b", "c"]}, "w")
  assert (t.type, t.num_labels, t.config_fields()["label2id"]) == (
      "classification", 3, {"a": 0, "b": 1, "c": 2})
  assert task({"bert": {}, "mlm_head": {}}, {}, "w") is None
  with pytest.raises(convert.ConversionError, match=r"w: parameters \['bert', 'pooler'\]; "):
    task({"bert": {}, "pooler": {}}, {}, "w")
  # Token heads have the same tree: the recorded task_type decides (a custom NER task is not
  # registered), else the registered task's type. Exports written before bert_jax/tasks record
  # it as task_family: read the same.
  for key in ("task_type", "task_family"):
    t = task(three, {"task": "my_ner", key: "tagging", "labels": ["O", "B", "I"]}, "w")
    assert t.type == "tagging"
  assert (t.type, t.config_fields()["architectures"], t.config_fields()["id2label"]) == (
      "tagging", ["ModernBertForTokenClassification"], {"0": "O", "1": "B", "2": "I"})
  assert "problem_type" not in t.config_fields()
  two = dict(tree, classifier={"kernel": np.zeros((4, 2))})
  assert task(two, {"task": "squad_v2"}, "w").type == "span"
  assert task(two, {"task": "sst2", "task_type": "classification"}, "w").type == (
      "classification")
  with pytest.raises(convert.ConversionError, match=r"w: task 'x' \(span\) with a head of 3 "):
    task(three, {"task": "x", "task_type": "span"}, "w")
  # A ModernBERT token head fine-tuned before it had transformers' `head`: one line.
  for old in ("classifier", "qa_outputs"):
    with pytest.raises(convert.ConversionError, match=r"w: a fine-tuned ModernBERT token head "
                                                      r"without `head` \(task conll03\)") as e:
      task({"bert": {}, old: {}}, {"task": "conll03"}, "w")
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_fine_tuned_workdir_exports_through_the_cli(hf_folder, export, tmp_path):  # noqa: F811
  """docs/models.md's way back: a 2-step glue_sst2 fine-tune of the converted model (its best
  export names the bundled tokenizer.json: modernbert_cli_test's fine-tune check, made on this
  run), then `python -m bert_jax.convert --input=WORKDIR`: transformers'
  AutoModelForSequenceClassification on the folder, with its AutoTokenizer's ids (= ours), gives
  our logits on real text; a 1-step conll03 fine-tune goes the same way
(ModernBertForTokenClassification), an old ModernBERT token head without `head` is one error line,
exit 2, nothing written."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test  # pylint: disable=g-import-not-at-top
  finetune_test._sst2(tmp_path, np.random.default_rng(0), 16, 8)
  config = finetune_test._config("glue_sst2", (export, ""), tmp_path, num_train_epochs=1.0,
                                 do_predict=False, log_every=1)
  workdir = str(tmp_path / "run")
  summary = finetune.finetune(config, workdir)
  assert summary["steps"] == 2 and 0.0 <= summary["history"][0]["eval/dev/accuracy"] <= 1.0
  best = summary["best_checkpoint"]
  with open(os.path.join(best, "bert_config.json"), encoding="utf-8") as f:
    meta = json.load(f)
  assert meta["tokenizer_json"] == os.path.join(export, "tokenizer.json")
  assert meta["bert_config"]["family"] == "modernbert" and "vocab_file" not in meta
  assert meta["task_type"] == "classification"   # what the export reads the head's class by
  m = inference.load_for_inference(best, with_params=False)   # its export names its tokenizer
  assert m.tokenizer_json == meta["tokenizer_json"] and m.tokenizer.vocab.size == 405
  out = str(tmp_path / "hf")
  run = _run("bert_jax.convert", f"--input={workdir}", f"--output={out}", cache=tmp_path)
  assert run.returncode == 0 and run.stderr == "", run.stderr
  assert run.stdout.splitlines()[-1] == (f"wrote Hugging Face ModernBertForSequenceClassification"
                                         f" to {out}")
  hf = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, attn_implementation="eager").eval()
  assert hf.config.id2label == {0: "0", 1: "1"}   # SST-2's labels, in class order
  tok = transformers.AutoTokenizer.from_pretrained(out)
  m = inference.load_for_inference(workdir)   # its best_epoch1 export
  text = _real_text(hf_folder, 4)
  enc = tok(text, padding=True, return_tensors="pt")
  for i, line in enumerate(text):   # our tokenizer's ids are transformers'
    n = int(enc["attention_mask"][i].sum())
    assert predict.encode(m, line)[0][0].tolist() == enc["input_ids"][i, :n].tolist()
  with torch.no_grad():
    theirs = hf(**enc).logits.numpy()
  model = heads.create_model("classification", m.config, num_labels=2)
  np.testing.assert_allclose(_ours(model, m.params, enc), theirs, atol=TOL, rtol=TOL)

  # A 1-step conll03 fine-tune of the same export (finetune_test's tagging data) through the same
  # CLI: ModernBertForTokenClassification with CoNLL's tags and our logits at real positions. A
  # ModernBERT token head from before it had `head` (its tree without it) is one line, exit 2.
  (tmp_path / "ner").mkdir()
  finetune_test.test_one_step_tagging(tmp_path / "ner", (export, ""))
  ner = str(tmp_path / "ner" / "run")
  run = _run("bert_jax.convert", f"--input={ner}", f"--output={tmp_path / 'hf_ner'}",
             cache=tmp_path)
  assert run.returncode == 0 and run.stderr == "", run.stderr
  assert run.stdout.splitlines()[-1] == ("wrote Hugging Face ModernBertForTokenClassification to "
                                         f"{tmp_path / 'hf_ner'}")
  hf = transformers.AutoModelForTokenClassification.from_pretrained(
      str(tmp_path / "hf_ner"), attn_implementation="eager").eval()
  from data_pipelines import tasks  # pylint: disable=g-import-not-at-top
  assert tuple(hf.config.id2label[i] for i in range(9)) == tasks.TASKS["conll03"].labels
  enc = tok(text, padding=True, return_tensors="pt")
  with torch.no_grad():
    theirs = hf(**enc).logits.numpy()
  m = inference.load_for_inference(ner)
  model = heads.create_model("tagging", m.config, num_labels=9)
  real = enc["attention_mask"].numpy().astype(bool)
  np.testing.assert_allclose(_ours(model, m.params, enc)[real], theirs[real], atol=TOL, rtol=TOL)
  old = str(tmp_path / "old_ner" / "best_epoch1")
  ckpt_lib.save_params(old, {"bert": m.params["bert"], "classifier": m.params["classifier"]},
                       m.config, meta=dict(task="conll03", epoch=1, do_lower_case=False,
                                           labels=[], dev_metrics={},
                                           **finetune.vocab_record(meta["tokenizer_json"])))
  bad = _run("bert_jax.convert", f"--input={old}", f"--output={tmp_path / 'hf_old'}",
             cache=tmp_path)
  assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
  assert bad.stderr.startswith(f"error: {old}: a fine-tuned ModernBERT token head without `head`")
  assert not os.path.exists(tmp_path / "hf_old")
