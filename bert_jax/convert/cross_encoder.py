r"""sentence-transformers CrossEncoder folders, both ways (issue 48 item 3).

  # a reranker run's export -> CrossEncoder(folder)
  python -m bert_jax.convert --input=runs/rerank/best_epoch2 --output=ce/ours --to=cross_encoder
  # a CrossEncoder folder (or a transformers BertForSequenceClassification with one label) ->
  # an Orbax export of task_type "reranker" (predict rerank, fine-tuning's evaluation read it)
  python -m bert_jax.convert --input=ce/theirs --output=ckpt/reranker

The layout is what sentence-transformers 6.2's CrossEncoder.save writes (read from a folder it
saved: tests/bert_jax/convert/cross_encoder_test.py):
  config.json, model.safetensors    transformers' BertForSequenceClassification, num_labels 1
                                    (id2label {0: LABEL_0}), with its tokenizer files
  modules.json                      [Transformer (path "")]
  sentence_bert_config.json         transformer_task "sequence-classification", the text
                                    modality's forward -> logits, module output "scores";
                                    max_seq_length (ours: the run's, so CrossEncoder truncates
                                    as training did)
  config_sentence_transformers.json model_type "CrossEncoder", activation_fn Sigmoid (theirs
                                    for one label), no prompts
  README.md                         what was exported
Both ways map the same tree: ours is {"bert": the body, "classifier": {kernel [H, 1], bias [1]}}
(tasks/reranker.py's RerankerModel: the family's pooled [CLS] -> dropout -> dense), transformers'
is bert.* plus classifier.weight [1, H], classifier.bias [1]. Families whose head on [CLS] is
BERT's (bert, tinybert, spanbert, ...); the others are refused in one line.
"""

import json
import os

import numpy as np

from bert_jax import families
from bert_jax.convert import formats
from bert_jax.convert import writing
from bert_jax.convert.formats import ConversionError

MODULES = "modules.json"
ST_CONFIG = "config_sentence_transformers.json"
ACTIVATIONS = {"torch.nn.modules.activation.Sigmoid": "sigmoid",
               "torch.nn.modules.linear.Identity": "identity"}


class CrossEncoderError(ConversionError):
  pass


def _json(path):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def is_cross_encoder_folder(path):
  """A local folder sentence-transformers loads as a CrossEncoder: its own save (modules.json +
  config_sentence_transformers.json model_type CrossEncoder), or a plain transformers
  *ForSequenceClassification with one label (CrossEncoder(path) loads those too) of a family
  with BERT's head on [CLS] (the others' folders stay their own converters')."""
  path = str(path)
  if "://" in path or not os.path.isdir(path):
    return False
  st = os.path.join(path, ST_CONFIG)
  if os.path.isfile(os.path.join(path, MODULES)):
    return os.path.isfile(st) and _json(st).get("model_type") == "CrossEncoder"
  config = os.path.join(path, "config.json")
  if not os.path.isfile(config):
    return False
  c = _json(config)
  if not (any(a.endswith("ForSequenceClassification") for a in c.get("architectures") or ())
          and len(c.get("id2label") or {"0": 0}) == 1):
    return False
  try:   # a family with its own converter (DistilBERT's classifiers) keeps it
    family = families.for_hf_folder(path)
  except ValueError:
    return False
  return _has_bert_head(family)


def _has_bert_head(family):
  return family.cls_logits is families.get("bert").cls_logits and family.hf_body is not None


def _bert_head(family, where):
  """One line unless the family's head on [CLS] is BERT's (pooled output -> dense)."""
  if not _has_bert_head(family):
    raise CrossEncoderError(f"{where}: a {family.display} model; the CrossEncoder conversion "
                            "covers families with BERT's head on [CLS] (pooler -> classifier): "
                            "bert, tinybert, spanbert.")


def read_settings(path):
  """{"activation_fn", "max_seq_length"} of a CrossEncoder folder (ours: "sigmoid"/"identity")."""
  st = os.path.join(path, ST_CONFIG)
  fn = _json(st).get("activation_fn") if os.path.isfile(st) else None
  fn = fn or _json(os.path.join(path, "config.json")).get(
      "sbert_ce_default_activation_function") or "torch.nn.modules.activation.Sigmoid"
  if fn not in ACTIVATIONS:
    raise CrossEncoderError(f"{st}: activation_fn {fn!r}; the scores are read with "
                            f"{' or '.join(ACTIVATIONS)} (its one-label default is Sigmoid).")
  sb = os.path.join(path, "sentence_bert_config.json")
  length = _json(sb).get("max_seq_length") if os.path.isfile(sb) else None
  return {"activation_fn": ACTIVATIONS[fn], "max_seq_length": length}


def check_folder(path):
  """The folder's settings (read_settings), after one line for anything but a
  *ForSequenceClassification with one label. Reads no array."""
  config_json = _json(os.path.join(path, "config.json"))
  arch = (config_json.get("architectures") or ["?"])[0]
  labels = len(config_json.get("id2label") or {"0": 0})
  if not arch.endswith("ForSequenceClassification") or labels != 1:
    raise CrossEncoderError(f"{path}/config.json: {arch} with {labels} labels; a reranker is a "
                            "*ForSequenceClassification with one label (num_labels=1).")
  return read_settings(path)


def with_classifier(path, params, config, meta, settings):
  """convert.import_checkpoint's tree and meta of the folder's body (its classifier.* skipped)
  -> (ours {"bert", "classifier"}, meta with task_type "reranker" and its "cross_encoder"
  record). The classifier is transformers' Linear(H, 1): kernel = weight.T."""
  _bert_head(families.get(config.family), path)
  _, source, _, _ = formats.read_hf(path)
  weight, bias = (np.asarray(source.get(f"classifier.{n}"), np.float32)
                  for n in ("weight", "bias"))
  if weight.shape != (1, config.hidden_size):
    raise CrossEncoderError(f"{path}: classifier.weight of shape {weight.shape}; expected "
                            f"(1, {config.hidden_size}).")
  for name in ("classifier.weight", "classifier.bias"):   # mapped now, not ignored
    meta["ignored_variables"].pop(name, None)
  meta["initialized_randomly"] = [p for p in meta["initialized_randomly"]
                                  if p.startswith("bert/")]
  meta.update(task_type="reranker", task="cross_encoder",
              cross_encoder={"loss": "", "activation_fn": settings["activation_fn"],
                             "max_seq_length": settings["max_seq_length"]})
  return {"bert": params["bert"], "classifier": {"kernel": weight.T, "bias": bias}}, meta


# ----------------------------------------------------------------------------------------------
# Ours -> CrossEncoder.
# ----------------------------------------------------------------------------------------------
def export(m, output):
  """A loaded inference.InferenceModel of a reranker export -> CrossEncoder folder `output`."""
  from bert_jax.convert import sentence_transformers as st  # pylint: disable=g-import-not-at-top
  writing.check_new_output(output)
  kind = m.meta.get("task_type", m.meta.get("task_family"))
  if kind != "reranker" or set(m.params) != {"bert", "classifier"}:
    raise CrossEncoderError(f"{m.path}: task_type {kind!r} with parameters {sorted(m.params)}; "
                            "--to=cross_encoder exports a reranker (a custom.type=reranker "
                            "run's best_epoch{N}, or a converted CrossEncoder).")
  family = families.get(m.config.family)
  _bert_head(family, m.path)
  base_class, body = family.hf_body({"bert": m.params["bert"]}, m.config)
  if not any(k.startswith("pooler.") for k in body):
    raise CrossEncoderError(f"{m.path}: no pooler; BERT's head on [CLS] reads the pooled output.")
  prefix = base_class[:-len("Model")].lower()                  # BertModel -> bert.*
  kernel = np.asarray(m.params["classifier"]["kernel"], np.float32)         # [H, 1]
  state = {f"{prefix}.{k}": v for k, v in body.items()}
  state["classifier.weight"] = kernel.T                                      # [1, H]
  state["classifier.bias"] = np.asarray(m.params["classifier"]["bias"], np.float32)
  vocab = m.tokenizer.vocab
  ids = {r: getattr(vocab, f"{r}_id", None) for r in ("pad", "unk", "cls", "sep", "mask")}
  ids = {k: int(v) for k, v in ids.items() if v is not None}
  hf_config = family.hf_config_json(m.config, vocab.pad_id)
  cls = base_class[:-len("Model")] + "ForSequenceClassification"
  hf_config.update(architectures=[cls], id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
  record = m.meta.get("cross_encoder") or {}
  length = record.get("max_seq_length") or m.config.max_position_embeddings
  activation = {v: k for k, v in ACTIVATIONS.items()}[record.get("activation_fn") or "sigmoid"]

  def write(tmp):
    os.makedirs(tmp)
    writing.save_safetensors(tmp, {k: np.ascontiguousarray(v) for k, v in state.items()})
    st._dump(tmp, "config.json", hf_config)   # pylint: disable=protected-access
    st._write_tokenizer(tmp, m, ids)          # pylint: disable=protected-access
    st._dump(tmp, MODULES, [{"idx": 0, "name": "0", "path": "",   # pylint: disable=protected-access
                             "type": "sentence_transformers.base.modules.transformer.Transformer"}])
    st._dump(tmp, "sentence_bert_config.json", {   # pylint: disable=protected-access
        "max_seq_length": int(length), "transformer_task": "sequence-classification",
        "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
        "module_output_name": "scores"})
    st._dump(tmp, ST_CONFIG, {"model_type": "CrossEncoder", "activation_fn": activation,  # pylint: disable=protected-access
                              "prompts": {}, "default_prompt_name": None})
    with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as f:
      f.write(f"---\nlibrary_name: sentence-transformers\npipeline_tag: text-ranking\n---\n\n"
              f"# {os.path.basename(os.path.abspath(str(output).rstrip('/')))}\n\n"
              f"Exported by bert_jax (`python -m bert_jax.convert --to=cross_encoder`) from "
              f"`{m.path}`: a {m.config.family} cross-encoder ({cls}, {m.config.num_layers} "
              f"layers, width {m.config.hidden_size}), max_seq_length {length}.\n\n"
              "```python\nfrom sentence_transformers import CrossEncoder\n"
              "model = CrossEncoder(\"path/to/this/folder\")\n"
              "model.rank(\"a query\", [\"a document\", \"another\"])\n```\n")

  return writing.finish_atomically(output, write)
