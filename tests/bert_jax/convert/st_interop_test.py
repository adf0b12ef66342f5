"""sentence-transformers both ways (issue 40 item 6; bert_jax/convert/sentence_transformers.py).

Export: a tiny random BERT (any checkpoint: a pre-training export, an embedding run's best export
with its record) and modernbert_cli_test's random ModernBERT (3 x 128, a learned byte-level BPE)
-> a folder that sentence-transformers 6.2 loads with SentenceTransformer(folder), whose
encode_query / encode_document give our vectors (predict.embed, the embedding task's model) with
cosine >= 0.99999 per text, each pooling, prompts and a padded batch included. Import: a folder
sentence-transformers itself saved (BertModel, lasttoken pooling, prompts) -> our export recording
its settings, whose vectors equal its own, and fine-tuning reads them. predict embed and
extract_features --pooling give the same vectors. Bad folders are one line before any array.
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax import convert
from bert_jax import extract_features
from bert_jax import finetune
from bert_jax.inference import loading as inference
from bert_jax.models import model as model_lib
from bert_jax import predict
from bert_jax.models import pretraining_heads
from bert_jax.configs import finetune as finetune_config
from bert_jax.convert import sentence_transformers as st
from bert_jax.tasks import embedding
from tests.testlib import tasks_testlib
from tests.bert_jax.families.modernbert.modernbert_cli_test import _run  # a CLI in a subprocess, its own compile cache
from tests.bert_jax.families.modernbert.modernbert_cli_test import export as mb_export, hf_folder  # noqa: F401 (fixtures)

COSINE = 0.99999   # the bar, per text
WORDS = ("the a cat dog man woman sat ran saw park mat house good bad on in of to and with "
         "search query document passage retrieval model").split()
TEXTS = ["the man sat on the mat", "a dog ran in the park with a good woman and a cat",
         "house", "retrieval of the passage, to the model!"]   # lengths 6-13: a padded batch


# ----------------------------------------------------------------------------------------------
# Reading a folder's settings: no model, no arrays (the quick tier's one test here).
# ----------------------------------------------------------------------------------------------
def _folder(d, pooling, modules=("Transformer", "Pooling", "Normalize"), **files):
  os.makedirs(d / "1_Pooling", exist_ok=True)
  (d / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
  paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize",
           "Dense": "2_Dense"}
  (d / "modules.json").write_text(json.dumps([
      {"idx": i, "name": str(i), "path": paths[k], "type": f"sentence_transformers.models.{k}"}
      for i, k in enumerate(modules)]))
  for name, content in files.items():
    (d / name).write_text(json.dumps(content))
  return str(d)


def test_read_folder_settings_and_refusals(tmp_path):
  got = st.read_folder(_folder(
      tmp_path / "ok", {"embedding_dimension": 8, "pooling_mode": "lasttoken"},
      **{"config_sentence_transformers.json": {"prompts": {"query": "q: ", "passage": "p: "},
                                               "similarity_fn_name": "cosine"},
         "sentence_bert_config.json": {"max_seq_length": 77}}))
  assert (got["pooling"], got["normalize"], got["query_prompt"], got["document_prompt"],
          got["max_seq_length"]) == ("last", True, "q: ", "p: ", 77)
  # sentence-transformers < 6's booleans; no Normalize module
  legacy = {"word_embedding_dimension": 8, "pooling_mode_cls_token": True,
            "pooling_mode_mean_tokens": False}
  got = st.read_folder(_folder(tmp_path / "legacy", legacy, ("Transformer", "Pooling")))
  assert (got["pooling"], got["normalize"], got["query_prompt"]) == ("cls", False, "")
  bad = [({"pooling_mode": "max"}, (), r"1_Pooling/config.json: pooling_mode max; bert_jax "
          r"reads mean \(as mean\), cls \(as cls\), lasttoken \(as last\)\.$"),
         ({"pooling_mode": "weightedmean"}, (), "pooling_mode weightedmean; bert_jax reads"),
         ({"pooling_mode": ["mean", "max"]}, (), "pooling_mode mean\\+max; bert_jax reads"),
         ({"pooling_mode_max_tokens": True}, (), "pooling_mode max; bert_jax reads"),
         ({"pooling_mode": "mean", "include_prompt": False}, (), "include_prompt=false"),
         ({"pooling_mode": "mean"}, ("Transformer", "Pooling", "Dense"),
          r"modules Transformer, Pooling, Dense; bert_jax computes Transformer, Pooling and an "
          r"optional Normalize, not Dense \(2_Dense\)\.")]
  for i, (pooling, modules, message) in enumerate(bad):
    path = _folder(tmp_path / f"bad{i}", pooling, modules or ("Transformer", "Pooling"))
    with pytest.raises(st.SentenceTransformersError, match=message) as e:
      st.read_folder(path)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------
# Model fixtures.
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert(tmp_path_factory):
  """A tiny random BertForPreTraining export (heads and all) with its vocab.txt bundled."""
  d = tmp_path_factory.mktemp("bert")
  vocab_file = tasks_testlib.write_vocab(str(d), " ".join(WORDS) + " . , !")
  size = tasks_testlib.ReferenceTokenizer(vocab_file).vocab.size
  cfg = model_lib.get_bert_config("tiny", vocab_size=size, max_position_embeddings=64,
                                  hidden_size=32, num_heads=2, intermediate_size=64)
  params = nn.unbox(pretraining_heads.init_params(cfg, jax.random.PRNGKey(0)))
  path = ckpt_lib.save_params(str(d / "export"), params, cfg, meta={"do_lower_case": True})
  shutil.copy(vocab_file, os.path.join(path, "vocab.txt"))
  return path


def _embedding_run(source, out, pooling, query_prompt, document_prompt, dims=()):
  """A best_epoch{N}-style export of an embedding run, as finetune._save_best writes it: the
  body alone and the task type's record (embedding.export_record)."""
  params, cfg, _ = ckpt_lib.load_params(source)
  task = embedding.EmbeddingTask("custom", {}, pooling=pooling, query_prompt=query_prompt,
                                 document_prompt=document_prompt, matryoshka_dims=tuple(dims))
  config = finetune_config.get_config("custom")
  config.max_seq_length = 32
  tok = next(f for f in ("vocab.txt", "tokenizer.json") if os.path.exists(
      os.path.join(source, f)))
  path = ckpt_lib.save_params(out, {"bert": params["bert"]}, cfg, meta=dict(
      task="custom", task_type="embedding", epoch=1, do_lower_case=tok == "vocab.txt",
      **finetune.vocab_record(os.path.join(source, tok)),
      **embedding.export_record(task, config)))
  shutil.copy(os.path.join(source, tok), os.path.join(path, tok))
  return path


def _ours(checkpoint, texts, pooling, prompt="", max_seq_length=32):
  m = predict.load_embedder(checkpoint)
  return predict.embed(m, texts, pooling=pooling, prompt=prompt, max_seq_length=max_seq_length)


def _assert_equal_vectors(theirs, ours):
  theirs = np.asarray(theirs, np.float64)
  assert theirs.shape == ours.shape
  np.testing.assert_allclose(np.linalg.norm(theirs, axis=-1), 1.0, rtol=1e-5)   # Normalize
  cosine = np.sum(theirs * ours, -1) / np.linalg.norm(theirs, axis=-1) / np.linalg.norm(
      ours, axis=-1)
  assert cosine.min() >= COSINE, cosine


def _check_export(checkpoint, folder, texts, pooling, query_prompt, document_prompt):
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  model = SentenceTransformer(folder, device="cpu")
  assert model.max_seq_length == 32
  assert (model.prompts["query"], model.prompts["document"]) == (query_prompt, document_prompt)
  _assert_equal_vectors(model.encode_query(texts),
                        _ours(checkpoint, texts, pooling, query_prompt))
  _assert_equal_vectors(model.encode_document(texts),
                        _ours(checkpoint, texts, pooling, document_prompt))
  # Without a prompt too, and one text alone (no padding)
  _assert_equal_vectors(model.encode(texts[:1], prompt=""), _ours(checkpoint, texts[:1], pooling))
  return model


# ----------------------------------------------------------------------------------------------
# Export: ours -> SentenceTransformer(folder).
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_bert_export_gives_our_vectors(bert, tmp_path, pooling):
  """A pre-training export (heads dropped: the folder holds BertModel) with the flags' settings."""
  m = inference.load_for_inference(bert, python_tokenizer=True)
  out, settings = st.export(m, str(tmp_path / "st"), pooling=pooling, query_prompt="search query: ",
                            document_prompt="search document: ", max_seq_length=32)
  assert settings["pooling"] == pooling
  with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["architectures"] == ["BertModel"]
  with open(os.path.join(out, "1_Pooling", "config.json"), encoding="utf-8") as f:
    assert json.load(f)["pooling_mode"] == st.OURS_TO_ST[pooling]
  _check_export(bert, out, TEXTS, pooling, "search query: ", "search document: ")


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_modernbert_embedding_run_export_gives_our_vectors(  # noqa: F811 (fixtures)
    hf_folder, mb_export, tmp_path, pooling):
  """An embedding run of a ModernBERT (the record's pooling, prompts and max_seq_length; no
  flags): ModernBertModel + its byte-level BPE tokenizer.json, real docstring text."""
  run = _embedding_run(mb_export, str(tmp_path / "run"), pooling, "search_query: ",
                       "search_document: ", dims=(64,))
  m = inference.load_for_inference(run, python_tokenizer=True)
  out, settings = st.export(m, str(tmp_path / "st"))
  assert (settings["pooling"], settings["max_seq_length"], settings["matryoshka_dims"]) == (
      pooling, 32, [64])
  with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["architectures"] == ["ModernBertModel"]
  with open(os.path.join(out, "config_sentence_transformers.json"), encoding="utf-8") as f:
    assert json.load(f)["matryoshka_dims"] == [64]
  with open(os.path.join(out, "README.md"), encoding="utf-8") as f:   # the model card says so
    card = f.read()
  assert "# st\n" in card and f"pooling {pooling}, normalised" in card
  assert "truncate_dim=64" in card
  texts = [ln for ln in hf_folder["lines"] if 4 <= len(ln.split()) <= 12][:4]
  texts.append("a docstring line far longer than the thirty-two tokens the run was trained with "
               "is cut by both to the same length before pooling, which the last pooling shows")
  _check_export(run, out, texts, pooling, "search_query: ", "search_document: ")


@pytest.mark.slow
def test_export_refuses_a_contradiction_and_a_body_it_has_not(bert, tmp_path):
  run = _embedding_run(bert, str(tmp_path / "run"), "cls", "q: ", "")
  m = inference.load_for_inference(run, python_tokenizer=True)
  with pytest.raises(st.SentenceTransformersError, match=r"--pooling='mean': .*/run was trained "
                     r"with pooling='cls' \(its bert_config.json \"sentence_embedding\"\); "
                     r"drop the flag, the export takes the checkpoint's\.$"):
    st.export(m, str(tmp_path / "st"), pooling="mean")
  with pytest.raises(st.SentenceTransformersError, match=r"--max_seq_length=65: give 3 to the "
                     r"model's max_position_embeddings=64\."):
    st.export(m, str(tmp_path / "st"), max_seq_length=65)
  assert not os.path.exists(tmp_path / "st")


# ----------------------------------------------------------------------------------------------
# Import: a folder sentence-transformers saved -> ours, its settings recorded and read.
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def st_native(tmp_path_factory):
  """A folder SentenceTransformer.save wrote itself: a random transformers BertModel, lasttoken
  pooling, Normalize, prompts, max_seq_length 24 (+ the vocab.txt our import reads)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.base.modules import Normalize, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling
  # pylint: enable=g-import-not-at-top
  d = tmp_path_factory.mktemp("st_native")
  vocab_file = tasks_testlib.write_vocab(str(d), " ".join(WORDS) + " . , !")
  hf = str(d / "hf")
  torch.manual_seed(0)
  config = transformers.BertConfig(vocab_size=len(open(vocab_file).read().split()),
                                   hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=64)
  transformers.BertModel(config).eval().save_pretrained(hf)
  transformers.BertTokenizerFast(vocab_file).save_pretrained(hf)
  body = Transformer(hf, max_seq_length=24)
  model = SentenceTransformer(modules=[body, Pooling(body.get_embedding_dimension(), "lasttoken"),
                                       Normalize()],
                              prompts={"query": "search query: ", "document": ""}, device="cpu")
  folder = str(d / "st")
  model.save(folder)
  shutil.copy(vocab_file, os.path.join(folder, "vocab.txt"))
  return folder


@pytest.mark.slow
def test_import_records_the_settings_and_gives_its_vectors(st_native, tmp_path):
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / "ours")
  meta = convert.convert_to_orbax(st_native, out)
  record = meta["sentence_embedding"]
  assert (record["pooling"], record["normalize"], record["query_prompt"],
          record["document_prompt"], record["max_seq_length"]) == (
              "last", True, "search query: ", "", 24)
  model = SentenceTransformer(st_native, device="cpu")
  m = predict.load_embedder(out)
  pooling, prompt, length = predict.embedding_settings(m, prompt_name="query")
  assert (pooling, prompt, length) == ("last", "search query: ", 24)
  _assert_equal_vectors(model.encode_query(TEXTS), predict.embed(
      m, TEXTS, pooling=pooling, prompt=prompt, max_seq_length=length))
  # Fine-tuning from it (the export, or the folder itself) takes its pooling and prompts
  for init in (out, st_native):
    c = finetune_config.get_config("custom")
    c.init_checkpoint = init
    e = embedding.with_recorded_settings(c)
    assert (e.pooling, e.query_prompt, e.document_prompt) == ("last", "search query: ", "")
  c.embedding.pooling, c.embedding.query_prompt = "mean", ""   # set: the config's own
  e = embedding.with_recorded_settings(c)
  assert (e.pooling, e.query_prompt, e.document_prompt) == ("mean", "", "")
  # A folder whose pooling we do not compute: one line before any array is read, nothing written
  bad = tmp_path / "bad"
  shutil.copytree(st_native, bad)
  (bad / "1_Pooling" / "config.json").write_text(json.dumps(
      {"embedding_dimension": 32, "pooling_mode": "weightedmean"}))
  os.remove(bad / "model.safetensors")   # never reached
  with pytest.raises(st.SentenceTransformersError, match="pooling_mode weightedmean; bert_jax "
                     r"reads mean \(as mean\)"):
    convert.convert_to_orbax(str(bad), str(tmp_path / "x"))
  assert not os.path.exists(tmp_path / "x")
  # ... and exporting it back gives the same folder's vectors
  back = st.export(inference.load_for_inference(out, python_tokenizer=True),
                   str(tmp_path / "back"))[0]
  _assert_equal_vectors(SentenceTransformer(back, device="cpu").encode_query(TEXTS),
                        model.encode_query(TEXTS))


# ----------------------------------------------------------------------------------------------
# predict embed == extract_features --pooling; the CLIs.
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_predict_embed_equals_extract_features(bert, mb_export, pooling):  # noqa: F811
  for checkpoint in (bert, mb_export):
    m = inference.load_for_inference(checkpoint, python_tokenizer=True)
    ours = predict.embed(predict.load_embedder(checkpoint), TEXTS, pooling=pooling,
                         max_seq_length=32)
    lines = [(t.split(), None) for t in TEXTS]   # read_inputs' form of one text a line
    arrays, _ = extract_features.extract(lines, m.tokenizer, m.params["bert"], m.config,
                                         layers=[-1], max_seq_length=32, batch_size=3)
    np.testing.assert_allclose(extract_features.sentence_vectors(arrays, pooling), ours,
                               atol=2e-6)


def test_one_rule_for_every_reader_of_a_recorded_pooling():
  """convert --to=sentence_transformers, predict embed and extract_features --pooling share
  st.check_flags_against_record (was: extract_features --pooling=cls on a mean-trained export
  wrote cls vectors silently, and predict embed --pooling=cls alike, while convert refused)."""
  import types  # pylint: disable=g-import-not-at-top
  m = types.SimpleNamespace(path="runs/emb/best_epoch3", meta={"sentence_embedding": {
      "pooling": "mean", "query_prompt": "q: "}},
                            config=types.SimpleNamespace(max_position_embeddings=64))
  record = m.meta["sentence_embedding"]
  with pytest.raises(st.SentenceTransformersError, match=r"^--pooling='cls': runs/emb/best_epoch3 "
                     r"was trained with pooling='mean' \(its bert_config.json \"sentence_embedding"
                     r"\"\); give the checkpoint's --pooling=mean\.$"):
    st.check_flags_against_record(m.path, record, pooling="cls")      # extract_features
  for reader, takes in ((lambda: st.export_settings(m, pooling="cls"), "the export"),
                        (lambda: predict.embedding_settings(m, pooling="cls"), "embed")):
    with pytest.raises(st.SentenceTransformersError, match=rf"pooling='mean'.*; drop the flag, "
                       rf"{takes} takes the checkpoint's\.$"):
      reader()
  # The record's own value, no flag, or a checkpoint that records nothing: no objection.
  st.check_flags_against_record(m.path, record, pooling="mean", query_prompt=None)
  st.check_flags_against_record(m.path, {}, pooling="cls")
  assert predict.embedding_settings(m, pooling="mean")[0] == "mean"
  assert st.export_settings(m)["pooling"] == "mean"


def test_embed_requests_refused_in_one_line(tmp_path):
  with pytest.raises(extract_features.ExtractError, match=r"in.txt:2: a pair \('a \|\|\| b'\); "
                     r"--pooling=mean embeds one text a line\."):
    extract_features.check_sentence_request([(["a"], None), (["a"], ["b"])], "in.txt", "mean")
  with pytest.raises(extract_features.ExtractError, match=r"--layers=-1,-2 with --pooling=cls: a "
                     r"sentence vector pools the last layer"):
    extract_features.check_sentence_request([(["a"], None)], "in.txt", "cls", "-1,-2")
  extract_features.check_sentence_request([(["a"], None)], "in.txt", "last", "-1")


@pytest.mark.slow
def test_predict_embed_refusals(bert):
  m = predict.load_embedder(bert)
  with pytest.raises(predict.PredictError, match=r"embed: give one or more non-empty texts"):
    predict.embed(m, ["a", " "])
  with pytest.raises(predict.PredictError, match=r"--max_seq_length=65: give 3 to the model's "
                     r"max_position_embeddings=64\."):
    predict.embedding_settings(m, max_seq_length=65)
  assert predict.embedding_settings(m) == ("mean", "", 64)   # no record: the defaults


@pytest.mark.slow
def test_clis(bert, tmp_path):
  """convert --to=sentence_transformers, predict embed --output_file and extract_features
  --pooling=cls on the same texts."""
  run = _embedding_run(bert, str(tmp_path / "run"), "cls", "search query: ", "")
  out = _run("bert_jax.convert", f"--input={run}", f"--output={tmp_path / 'st'}",
             "--to=sentence_transformers", cache=tmp_path)
  assert out.returncode == 0 and out.stderr == "", out.stderr
  assert f"wrote a sentence-transformers folder to {tmp_path / 'st'}: pooling cls" in out.stdout
  vectors = tmp_path / "v.npy"
  out = _run("bert_jax.predict", f"--init_checkpoint={run}", "embed", *TEXTS,
             f"--output_file={vectors}", cache=tmp_path)
  assert out.returncode == 0 and out.stderr == "", out.stderr
  assert "pooling cls, prompt '', max_seq_length 32" in out.stdout
  lines = tmp_path / "texts.txt"
  lines.write_text("\n".join(TEXTS) + "\n")
  # Another pooling than the run's: one line, nothing written (was: mean vectors, silently);
  # the line's advice is the run that follows.
  bad = _run("bert_jax.extract_features", f"--input_file={lines}", "--pooling=mean",
             f"--output_file={tmp_path / 'f.npz'}", f"--init_checkpoint={run}",
             "--max_seq_length=32", cache=tmp_path)
  assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
  assert bad.stderr.startswith(f"error: --pooling='mean': {run} was trained with "
                               "pooling='cls'"), bad.stderr
  assert not os.path.exists(tmp_path / "f.npz")
  advice = bad.stderr.strip().rsplit("give the checkpoint's ", 1)[1].rstrip(".")
  assert advice == "--pooling=cls"
  out = _run("bert_jax.extract_features", f"--input_file={lines}", advice,
             f"--output_file={tmp_path / 'f.npz'}", f"--init_checkpoint={run}",
             "--max_seq_length=32", cache=tmp_path)
  assert out.returncode == 0 and out.stderr == "", out.stderr
  np.testing.assert_allclose(np.load(tmp_path / "f.npz")["embeddings"], np.load(vectors),
                             atol=2e-6)
