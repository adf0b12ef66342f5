"""A SentencePiece `.model` as a Hugging Face fast tokenizer (tokenizer.json) with BERT's template.

`transformers.AutoTokenizer.from_pretrained(export_dir)` then gives the same ids as
`data_pipelines.tokenizers.tokenization.SentencePieceTokenizer` ([CLS] text [SEP], user-defined [CLS] [SEP]
[MASK] matched whole in raw text, byte-fallback pieces for rare characters), which
tests/data_pipelines/tokenizers/cjk_test.py checks on Korean, Chinese and English text. One corner case differs: a text
that *starts* with a literal special token ("[MASK] is ..."): SentencePiece puts a lone "▁"
piece before it, `tokenizers` splits the token out first and adds the prefix to no piece.

The `tokenizers` objects are assembled as transformers' own SpmConverter does (Unigram or BPE
model over the model's pieces and scores, the model's precompiled normalization map, Metaspace),
but from the model file directly: transformers' converter imports sentencepiece_model_pb2, which
needs a protobuf runtime at least as new as the one it was generated with, so the few proto
fields needed here are read from the wire format (ModelProto: trainer_spec = 2, normalizer_spec =
3; field numbers from sentencepiece_model.proto).
"""

import json
import os

from bert_jax_core import errors

SPECIAL = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
           "cls_token": "[CLS]", "mask_token": "[MASK]"}


class SentencePieceExportError(errors.UserError):
  """The SentencePiece model cannot be written as a Hugging Face tokenizer."""


def _varint(data, i):
  value = shift = 0
  while True:
    b = data[i]
    i += 1
    value |= (b & 0x7F) << shift
    shift += 7
    if b < 0x80:
      return value, i


def _fields(data):
  """Protobuf wire format -> {field number: [value]} (varints as int, length-delimited as bytes)."""
  out, i = {}, 0
  while i < len(data):
    key, i = _varint(data, i)
    number, wire = key >> 3, key & 7
    if wire == 0:
      value, i = _varint(data, i)
    elif wire == 2:
      n, i = _varint(data, i)
      value, i = data[i:i + n], i + n
    elif wire == 1:
      value, i = data[i:i + 8], i + 8
    elif wire == 5:
      value, i = data[i:i + 4], i + 4
    else:
      raise SentencePieceExportError(f"unexpected protobuf wire type {wire} in the model file.")
    out.setdefault(number, []).append(value)
  return out


def model_spec(proto):
  """The fields the tokenizer needs, from a serialized ModelProto."""
  top = _fields(proto)
  trainer = _fields(top.get(2, [b""])[0])
  normalizer = _fields(top.get(3, [b""])[0])
  return dict(
      model_type={1: "unigram", 2: "bpe", 3: "word", 4: "char"}[trainer.get(3, [1])[0]],
      byte_fallback=bool(trainer.get(35, [0])[0]),
      charsmap=normalizer.get(2, [b""])[0],
      add_dummy_prefix=bool(normalizer.get(3, [1])[0]),
      remove_extra_whitespaces=bool(normalizer.get(4, [1])[0]),
  )


def _bpe_merges(pieces):
  """SentencePiece BPE has no merge list: every piece splittable into two pieces is a merge,
  ranked by the merged piece's id (lower id = learned earlier), as transformers'
  SentencePieceExtractor does."""
  index = {p: i for i, p in enumerate(pieces)}
  merges = []
  for piece, rank in index.items():
    for k in range(1, len(piece)):
      a, b = piece[:k], piece[k:]
      if a in index and b in index:
        merges.append((rank, index[a], index[b], a, b))
  return [(a, b) for *_, a, b in sorted(merges)]


def build_tokenizer(spm_model_file):
  """A `tokenizers.Tokenizer` equivalent to the SentencePiece model plus BERT's template."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  from tokenizers import AddedToken, Regex, Tokenizer  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, normalizers, pre_tokenizers, processors
  from data_pipelines.tokenizers import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  proto = vocab_lib._read_bytes(spm_model_file)  # pylint: disable=protected-access
  spec = model_spec(proto)
  sp = spm.SentencePieceProcessor(model_proto=proto)
  pieces = [sp.IdToPiece(i) for i in range(sp.GetPieceSize())]
  info = vocab_lib.sentencepiece_info(spm_model_file)
  if spec["model_type"] == "unigram":
    model = models.Unigram([(p, sp.GetScore(i)) for i, p in enumerate(pieces)],
                           unk_id=info.unk_id, byte_fallback=spec["byte_fallback"])
  elif spec["model_type"] == "bpe":
    model = models.BPE({p: i for i, p in enumerate(pieces)}, _bpe_merges(pieces),
                       unk_token=pieces[info.unk_id], fuse_unk=True,
                       byte_fallback=spec["byte_fallback"])
  else:
    raise SentencePieceExportError(f"{spm_model_file}: a {spec['model_type']} model; export "
                                   "supports the unigram and bpe models build_vocab trains.")
  tok = Tokenizer(model)
  steps = [normalizers.Precompiled(spec["charsmap"])] if spec["charsmap"] else []
  if spec["remove_extra_whitespaces"]:
    # As SentencePiece: strip the end, collapse runs of spaces. The special tokens below are
    # "normalized" so that this runs on the whole text before they are split out, and the space
    # before a [MASK] mid-text stays a lone "▁" piece as in SentencePiece.
    steps += [normalizers.Strip(left=False, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
  tok.normalizer = normalizers.Sequence(steps)
  # "first": the dummy prefix goes before the text's first piece only, not after each [MASK];
  # leading spaces are not stripped (that would move the first piece off offset 0) but
  # collapsed into the prefix.
  scheme = "first" if spec["add_dummy_prefix"] else "never"
  tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme)
  tok.decoder = decoders.Sequence(
      ([decoders.ByteFallback()] if spec["byte_fallback"] else [])
      + [decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme)])
  # [CLS] [SEP] [MASK] (user-defined) and [PAD] [UNK] match whole in raw text, as in SentencePiece
  # (transformers would register them as added tokens on load anyway).
  tok.add_special_tokens([AddedToken(pieces[i], normalized=True, special=True)
                          for i in sorted({info.pad_id, info.unk_id, info.cls_id, info.sep_id,
                                           info.mask_id})])
  cls, sep = pieces[info.cls_id], pieces[info.sep_id]
  tok.post_processor = processors.TemplateProcessing(
      single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
      special_tokens=[(cls, info.cls_id), (sep, info.sep_id)])
  return tok


def write_tokenizer_files(directory, spm_model_file, max_length):
  """tokenizer.json + tokenizer_config.json + special_tokens_map.json + the .model itself."""
  from data_pipelines.tokenizers import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  try:
    tok = build_tokenizer(spm_model_file)
  except ImportError as e:
    raise SentencePieceExportError(f"exporting {spm_model_file} needs the tokenizers package "
                                   f"({e}); pip install tokenizers.") from None
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "spm.model"), "wb") as f:
    f.write(vocab_lib._read_bytes(spm_model_file))  # pylint: disable=protected-access
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(max_length),
            "clean_up_tokenization_spaces": False,
            "model_input_names": ["input_ids", "token_type_ids", "attention_mask"], **SPECIAL}
  for name, content in [("tokenizer_config.json", config), ("special_tokens_map.json", SPECIAL)]:
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      json.dump(content, f, indent=2)
