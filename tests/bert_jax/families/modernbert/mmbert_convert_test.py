"""An mmBERT-shaped transformers folder converts both ways (issue 42 item 4, last part).

mmBERT (arXiv 2509.06888) is transformers' ModernBertForMaskedLM with Gemma 2's tokenizer.json:
a BPE with byte fallback over SentencePiece pieces, spaces written "▁" by a Replace normalizer
(no prefix "▁"), specials <pad> <eos> <bos> <unk> <mask> at ids 0..4 (plus Gemma's chat and
unused specials further on), <bos>/<eos> framing a text as [CLS]/[SEP] do, and 256,000 rows.
Here the same layout, tiny and random: a 2,000-id file learned with `tokenizers` on English (the
standard library's docstrings), Korean (konlpy's kobill corpus) and German (dpkg's manual pages),
a 3 x 64 ModernBERT with 2,048 rows. Checked on held-out real text of each language (English
docstrings of other modules, the Korean constitution from konlpy's kolaw, German and French
manual-page lines): our ids == transformers' AutoTokenizer's, our MLM logits == transformers'
within 1e-4 on padded batches, and the export back loads in transformers with the same logits and
the same tokenizer.json bytes.
"""

import filecmp
import json
import os

import numpy as np
import pytest

from bert_jax import convert
from bert_jax import families
from bert_jax.inference import loading as inference
from bert_jax.inference import hf_export
from bert_jax.convert.formats import ConversionError
from tests.data_pipelines.tokenizers.multilingual_vocab_test import _gemma_like, _lines

TOL = 1e-4
ROWS = 2048          # embedding rows: the file's 2,000 + 6 ids padded to a multiple of 64
MORE_SPECIALS = ["<start_of_turn>", "<end_of_turn>", "[multimodal]", "<unused0>", "<unused1>",
                 "<unused2>"]   # Gemma's other special added tokens: never [MASK]ed, never cls
ROLES = {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>",
         "mask_token": "<mask>", "cls_token": "<bos>", "sep_token": "<eos>"}


def _korean(name):
  from konlpy.corpus import kobill, kolaw  # pylint: disable=g-import-not-at-top
  corpus = kolaw if name == "constitution.txt" else kobill
  return [l.strip() for l in corpus.open(name).read().splitlines() if l.strip()]


def _english(first, last):
  from data_pipelines import stdlib_corpus  # pylint: disable=g-import-not-at-top
  docs = list(stdlib_corpus.iter_documents(max_modules=last))[first:]
  return [s for doc in docs for s in doc]


def held_out():
  """{language: real lines the tokenizer never saw}, 6-40 words each."""
  keep = lambda lines, n: [l for l in lines if 6 <= len(l.split()) <= 40][:n]
  return {"en": keep(_english(400, 60), 24), "ko": keep(_korean("constitution.txt"), 24),
          "de": keep(_lines("german", "dpkg_man.txt")[900:], 24),
          "fr": keep(_lines("french", "dpkg_man.txt")[900:], 24)}


def mmbert_style_folder(folder, vocab_size=2000):
  """A ModernBertForMaskedLM folder laid out as mmBERT's, every parameter random."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from tokenizers import AddedToken, Tokenizer, processors  # pylint: disable=g-import-not-at-top
  train = (_english(0, 40)[:3000] + [l for n in ("1809890.txt", "1809891.txt", "1809892.txt",
                                                "1809893.txt") for l in _korean(n)]
           + _lines("german", "dpkg_man.txt")[:900])
  path = _gemma_like(folder, train, vocab_size=vocab_size,
                     config={**ROLES, "tokenizer_class": "GemmaTokenizerFast",
                             "model_max_length": 512})
  tok = Tokenizer.from_file(path)
  tok.add_special_tokens([AddedToken(t, special=True) for t in MORE_SPECIALS])
  bos, eos = tok.token_to_id("<bos>"), tok.token_to_id("<eos>")
  tok.post_processor = processors.TemplateProcessing(
      single="<bos> $A <eos>", pair="<bos> $A <eos> $B <eos>",
      special_tokens=[("<bos>", bos), ("<eos>", eos)])
  tok.save(path)
  config = transformers.ModernBertConfig(
      vocab_size=ROWS, hidden_size=64, num_hidden_layers=3, num_attention_heads=2,
      intermediate_size=96, max_position_embeddings=512, local_attention=16,
      global_attn_every_n_layers=3, pad_token_id=0, eos_token_id=eos, bos_token_id=bos,
      cls_token_id=bos, sep_token_id=eos)
  torch.manual_seed(0)
  model = transformers.ModernBertForMaskedLM(config).eval()
  with torch.no_grad():   # every parameter random (norm scales around 1), so a slip shows
    for name, p in model.named_parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "norm" in name else 0.0))
  model.save_pretrained(folder)
  return folder


@pytest.fixture(scope="module")
def mm(tmp_path_factory):
  import transformers  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("mmbert")
  folder = mmbert_style_folder(str(root / "hf"))
  out = str(root / "ours")
  meta = convert.convert_to_orbax(folder, out)
  return dict(folder=folder, ours=out, meta=meta, texts=held_out(),
              hf_tok=transformers.AutoTokenizer.from_pretrained(folder),
              hf_model=transformers.ModernBertForMaskedLM.from_pretrained(
                  folder, attn_implementation="eager").eval())


def _hf_logits(model, enc):
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    return model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits.numpy()


def _our_logits(m, enc):
  """[B, T, V] MLM logits at every position of a padded batch."""
  ids = enc["input_ids"].numpy().astype(np.int32)
  mask = enc["attention_mask"].numpy().astype(np.int32)
  positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
  logits, _ = families.get(m.config.family).mlm_logits(m.params, m.config, ids, mask,
                                                       np.zeros_like(ids), positions)
  return np.asarray(logits)


def test_import_reads_gemma_specials_and_ids_equal_transformers(mm):
  meta = mm["meta"]
  assert meta["special_ids"] == {"pad": 0, "sep": 1, "cls": 2, "unk": 3, "mask": 4}
  assert meta["vocab_size"] == 2006   # 2,000 + Gemma's 6 other specials; 2,048 rows
  assert filecmp.cmp(os.path.join(mm["folder"], "tokenizer.json"),
                     os.path.join(mm["ours"], "tokenizer.json"), shallow=False)
  m = inference.load_for_inference(mm["ours"], with_params=False)
  v = m.tokenizer.vocab
  assert v.is_special[2000:2006].all()   # <start_of_turn> ... never drawn as [MASK] targets
  tok = mm["hf_tok"]
  for lang, texts in mm["texts"].items():
    ours = [[v.cls_id] + p + [v.sep_id] for p in m.tokenizer.encode(texts)]
    assert tok(texts)["input_ids"] == ours, lang   # <bos> pieces <eos>, as the records frame it
    assert sum(map(len, ours)) > 400, lang         # real text, not a handful of tokens
  # Korean held out: syllables the file never learned come as UTF-8 byte pieces (byte fallback).
  ko = m.tokenizer.encode(mm["texts"]["ko"])
  assert any(m.tokenizer.tokens[i].startswith("<0x") for ids in ko for i in ids)


@pytest.mark.slow   # ~15 s on the 2-core box: four languages' batches through both models
def test_mlm_logits_equal_transformers_on_padded_batches(mm):
  m = inference.load_for_inference(mm["ours"])
  for lang, texts in mm["texts"].items():
    # One padded length (128) for every language: one compilation of ours.
    enc = mm["hf_tok"](texts[:8], padding=True, pad_to_multiple_of=128, return_tensors="pt")
    real = enc["attention_mask"].numpy().astype(bool)
    assert not real.all(), lang   # padded rows are part of the check
    ours, theirs = _our_logits(m, enc), _hf_logits(mm["hf_model"], enc)
    assert ours.shape == theirs.shape == real.shape + (ROWS,)
    assert np.abs(theirs[real]).max() > 1.0   # random weights give logits that can differ
    np.testing.assert_allclose(ours[real], theirs[real], atol=TOL, rtol=TOL, err_msg=lang)


@pytest.mark.slow
def test_export_back_loads_in_transformers_with_equal_logits(mm, tmp_path):
  import transformers  # pylint: disable=g-import-not-at-top
  out = hf_export.export_to_hf(mm["ours"], str(tmp_path / "back"))
  assert filecmp.cmp(os.path.join(mm["folder"], "tokenizer.json"),
                     os.path.join(out, "tokenizer.json"), shallow=False)
  with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
    written = json.load(f)
  assert {k: written[k] for k in ("pad_token_id", "cls_token_id", "sep_token_id",
                                  "bos_token_id", "eos_token_id")} == {
      "pad_token_id": 0, "cls_token_id": 2, "sep_token_id": 1, "bos_token_id": 2,
      "eos_token_id": 1}
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert (tok.cls_token, tok.sep_token, tok.mask_token, tok.pad_token, tok.bos_token,
          tok.eos_token) == ("<bos>", "<eos>", "<mask>", "<pad>", "<bos>", "<eos>")
  back = transformers.ModernBertForMaskedLM.from_pretrained(out, attn_implementation="eager")
  for lang, texts in mm["texts"].items():
    enc = mm["hf_tok"](texts[8:16], padding=True, return_tensors="pt")
    assert tok(texts[8:16], padding=True)["input_ids"] == enc["input_ids"].tolist(), lang
    real = enc["attention_mask"].numpy().astype(bool)
    np.testing.assert_allclose(_hf_logits(back.eval(), enc)[real],
                               _hf_logits(mm["hf_model"], enc)[real], atol=TOL, rtol=TOL,
                               err_msg=lang)


def test_what_we_cannot_read_or_frame_otherwise_is_said_in_one_line(mm, tmp_path):
  """A Gemma folder with only tokenizer.model is one line naming the fix; a tokenizer.json
  framing a text as Gemma's own does ("<bos> $A", a decoder's) converts with a note in the
  summary (the weights are the same; the ids our tools give differ from transformers')."""
  import shutil  # pylint: disable=g-import-not-at-top
  from tokenizers import Tokenizer, processors  # pylint: disable=g-import-not-at-top
  folder = str(tmp_path / "spm_only")
  shutil.copytree(mm["folder"], folder)
  os.rename(os.path.join(folder, "tokenizer.json"), os.path.join(folder, "tokenizer.model"))
  with pytest.raises(ConversionError, match="a SentencePiece tokenizer.model but no tokenizer"
                     r".json .*save_pretrained\(folder\)") as e:
    convert.import_checkpoint(folder)
  assert "\n" not in str(e.value)
  assert "tokenizer_framing" not in mm["meta"]   # <bos> $A <eos>: our frame, no note
  decoder_style = str(tmp_path / "bos_only")
  shutil.copytree(mm["folder"], decoder_style)
  path = os.path.join(decoder_style, "tokenizer.json")
  tok = Tokenizer.from_file(path)
  tok.post_processor = processors.TemplateProcessing(
      single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)])
  tok.save(path)
  _, config, meta = convert.import_checkpoint(decoder_style)
  assert meta["tokenizer_framing"].startswith("tokenizer.json frames one text as 'id 2 $A' but "
                                              "bert_jax frames it [cls] $A [sep] (ids 2 ... 1)")
  assert "note: tokenizer.json frames" in convert.summary(meta, config)
