r"""Contextual features from a pre-trained BERT: the paper's feature-based approach (sec. 5.3).

  python -m bert_jax.extract_features --input_file=sentences.txt --output_file=features.npz \
      --init_checkpoint=DIR --layers=-1,-2,-3,-4 --pooling=concat

--init_checkpoint is an export, a pre-training or fine-tuning workdir or a step directory, local or
gs:// (`bert_jax.inference.loading.load_for_inference`); its bundled vocab.txt / SentencePiece model /
tokenizer.json and recorded casing are used unless --vocab_file / --spm_model_file /
--tokenizer_json / --do_lower_case say otherwise (a contradiction is an error). The default
--layers keeps the last four layers, or all of them for a smaller model; an explicit layer the
model does not have is an error. An ELECTRA checkpoint gives its discriminator's features (the
network ELECTRA fine-tunes; it says so); a DistilBERT its BertModel's (no token types: "a ||| b" is
[CLS] a [SEP] b [SEP], as transformers).

Input: one text per line, or "text_a ||| text_b" for a pair (google-research/bert's format).
Each whitespace-separated word is tokenized on its own, so every word piece knows its word (a
tokenizer.json encodes the text whole and maps its pieces to words by their character offsets:
byte-level BPE pieces carry the space before a word, and a lone 'Ġ' piece belongs to the word after
it, as transformers' word_ids() says).
Layer indices count encoder layers as google-research/bert does: -1 is the last layer, 0 the first
layer's output (the embeddings are not a layer); a pre-norm model's (ModernBERT) last layer is
taken after its final norm, what its heads read (transformers 5's last hidden state). The paper's
best feature-based NER result concatenates the last four layers (96.1 dev F1 vs 96.4 fine-tuned).

Output (.npz, np.load without pickle):
  features       [tokens, D] float32   per word piece, D = H * len(layers) (concat) or H (sum)
  tokens         [tokens] str          the pieces as text, with [CLS] and [SEP] (a byte-level
                                       BPE's decoded by its tokenizer.json: ' 입력', not
                                       'Ġìŀħëł¥')
  token_offsets  [lines + 1] int64     line i owns tokens[token_offsets[i]:token_offsets[i+1]]
  word_index     [tokens] int32        index of the piece's word within its line, -1 for
                                       [CLS]/[SEP]; the words of text_b follow those of text_a
  segment_ids    [tokens] int32
  words          [words] str           the whitespace words of every line, in order
  word_offsets   [lines + 1] int64
  word_features  [words, D] float32    mean over each word's pieces (zeros if all were cut)
  layers         [len(layers)] int32
E.g. the vectors of line 3: f = np.load(path); a, b = f["token_offsets"][3:5];
f["features"][a:b].

--pooling=mean|cls|last: one sentence vector per line as well, the embedding task's (the last
layer pooled over the line's tokens, [CLS] and [SEP] included: their mean, the first, the last;
L2-normalised), what `predict embed` and a sentence-transformers export give (one text a line):
  embeddings     [lines, H] float32
A checkpoint that records its pooling (an embedding run's export, a sentence-transformers import:
bert_config.json's "sentence_embedding") is embedded with it: another --pooling is one line, the
rule convert --to=sentence_transformers and predict embed follow.
"""


from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import cli
from bert_jax import families
from bert_jax_core import errors
from bert_jax_core import files as files_lib
from bert_jax.convert import sentence_transformers
from bert_jax.inference import loading as inference
from bert_jax.models import model as model_lib

DEFAULT_LAYERS = "-1,-2,-3,-4"  # the paper's best feature-based NER result (sec. 5.3)
SENTENCE_POOLINGS = ("mean", "cls", "last")   # contrastive.POOLINGS: one vector per line
MIN_SEQ_LENGTH = 3  # [CLS] + at least one piece + [SEP]


class ExtractError(errors.UserError):
  pass


def read_inputs(path):
  """[(words_a, words_b or None)] from the input file; empty lines are an error."""
  from data_pipelines.tasks import common
  lines = common.read_text(path).splitlines()
  out = []
  for n, line in enumerate(lines, start=1):
    if not line.strip():
      if n == len(lines):
        continue
      raise ExtractError(f"{path}:{n}: empty line; give one text (or 'a ||| b') per line.")
    a, sep, b = line.partition(" ||| ")
    if sep and not b.split():
      raise ExtractError(f"{path}:{n}: empty text after ' ||| '.")
    out.append((a.split(), b.split() if sep else None))
  return out


def build_inputs(inputs, tokenizer, max_seq_length):
  """Packed ids and the piece -> word map of every line; returns (arrays, per_line, truncated)."""
  vocab = tokenizer.vocab
  if hasattr(tokenizer, "encode_words"):
    # A tokenizer.json encodes each text whole, pieces mapped to words by their offsets: a
    # byte-level BPE gives a word another id alone than after a space (ModernBERT's "cat" vs
    # "Ġcat"), and the model saw words in their sentences.
    texts = [t for a, b in inputs for t in ([a] + ([b] if b is not None else []))]
    encoded = iter(tokenizer.encode_words(texts))

    def word_pieces(words, first_index):
      del words
      ids, index = next(encoded)
      return list(ids), [first_index + i for i in index]
  else:
    distinct = {}
    for a, b in inputs:
      for w in a + (b or []):
        distinct.setdefault(w, len(distinct))
    pieces = tokenizer.encode(list(distinct)) if distinct else []

    def word_pieces(words, first_index):
      ids, index = [], []
      for i, w in enumerate(words):
        p = pieces[distinct[w]]
        ids += p
        index += [first_index + i] * len(p)
      return ids, index

  n = len(inputs)
  input_ids = np.full((n, max_seq_length), vocab.pad_id, np.int32)
  input_mask = np.zeros((n, max_seq_length), np.int32)
  segment_ids = np.zeros((n, max_seq_length), np.int32)
  per_line, truncated = [], 0
  for i, (a, b) in enumerate(inputs):
    ids_a, idx_a = word_pieces(a, 0)
    ids_b, idx_b = word_pieces(b, len(a)) if b is not None else ([], [])
    room = max_seq_length - (3 if b is not None else 2)
    if len(ids_a) + len(ids_b) > room:
      truncated += 1
      while len(ids_a) + len(ids_b) > room:  # longest first, as google's _truncate_seq_pair
        if len(ids_a) > len(ids_b):
          ids_a.pop(), idx_a.pop()
        else:
          ids_b.pop(), idx_b.pop()
    ids = [vocab.cls_id] + ids_a + [vocab.sep_id]
    word_index = [-1] + idx_a + [-1]
    segments = [0] * len(ids)
    if b is not None:
      ids += ids_b + [vocab.sep_id]
      word_index += idx_b + [-1]
      segments += [1] * (len(ids_b) + 1)
    input_ids[i, :len(ids)] = ids
    input_mask[i, :len(ids)] = 1
    segment_ids[i, :len(ids)] = segments
    per_line.append((np.asarray(word_index, np.int32), np.asarray(segments, np.int32)))
  return dict(input_ids=input_ids, input_mask=input_mask, segment_ids=segment_ids), per_line, \
      truncated


def parse_layers(spec, num_layers, clip=False):
  """Layer indices from "-1,-2,..."; clip=True (the default flag) drops layers the model lacks,
  so a 2-layer model gets -1,-2 instead of an error for the flag's default."""
  try:
    layers = [int(x) for x in str(spec).split(",") if x.strip()]
  except ValueError:  # int() of one comma-separated token
    raise ExtractError(f"--layers={spec}: expected comma-separated integers like -1,-2,-3,-4.")
  if clip:
    layers = [l for l in layers if -num_layers <= l < num_layers]
  bad = [l for l in layers if not -num_layers <= l < num_layers]
  if not layers or bad:
    raise ExtractError(f"--layers={spec}: the model has {num_layers} layers, so use indices in "
                       f"[{-num_layers}, {num_layers - 1}] (-1 = last).")
  return layers


def extract(inputs, tokenizer, params, model_config, *, layers=(-1, -2, -3, -4),
            pooling="concat", max_seq_length=128, batch_size=32):
  """Returns the dict of arrays described in the module docstring."""
  if pooling not in ("concat", "sum"):
    raise ExtractError(f"--pooling={pooling}: use concat or sum.")
  if max_seq_length < MIN_SEQ_LENGTH:
    raise ExtractError(f"--max_seq_length={max_seq_length}: must be at least {MIN_SEQ_LENGTH} "
                       "([CLS], one word piece, [SEP]); BERT's usual value is 128.")
  layers = parse_layers(",".join(map(str, layers)), model_config.num_layers)
  if max_seq_length > model_config.max_position_embeddings:
    raise ExtractError(f"--max_seq_length={max_seq_length} exceeds the model's "
                       f"max_position_embeddings={model_config.max_position_embeddings}.")
  arrays, per_line, truncated = build_inputs(inputs, tokenizer, max_seq_length)
  # The family's body (BertModel; ELECTRA's discriminator body, no pooler) and its method.
  model, method = families.get(model_config.family).features_model(model_config)

  @jax.jit
  def forward(params, input_ids, input_mask, segment_ids):
    out = model.apply({"params": params}, input_ids, input_mask, segment_ids,
                      output_hidden_states=True, method=method)
    encoder_layers = list(out["hidden_states"][1:])  # L x [B, T, H]; [0] is the embeddings
    if model_config.prenorm:   # the last layer through the final norm, as transformers 5's
      # hidden_states[-1] and last_hidden_state (ModernBERT: the raw residual is ~10x larger)
      encoder_layers[-1] = out["sequence_output"]
    chosen = [encoder_layers[l].astype(jnp.float32) for l in layers]
    return jnp.concatenate(chosen, -1) if pooling == "concat" else sum(chosen)  # [B, T, D]

  n = len(inputs)
  feats = []
  for start in range(0, n, batch_size):
    rows = np.arange(start, min(start + batch_size, n))
    pad = np.concatenate([rows, np.full(batch_size - len(rows), rows[0])])  # one compiled shape
    out = forward(params, *(arrays[k][pad] for k in ("input_ids", "input_mask",
                                                     "segment_ids")))
    out = np.asarray(out)[:len(rows)]
    for i, r in enumerate(rows):
      feats.append(out[i, :arrays["input_mask"][r].sum()])
  token_counts = [len(f) for f in feats]
  features = np.concatenate(feats) if feats else np.zeros((0, 0), np.float32)
  all_ids = np.concatenate([arrays["input_ids"][i, :c] for i, c in enumerate(token_counts)])
  words = [w for a, b in inputs for w in a + (b or [])]
  word_counts = [len(a) + len(b or []) for a, b in inputs]
  word_index = np.concatenate([wi for wi, _ in per_line])
  # Mean over each word's pieces.
  word_features = np.zeros((len(words), features.shape[-1]), np.float32)
  counts = np.zeros(len(words), np.int64)
  word_base = np.repeat(np.cumsum([0] + word_counts[:-1]), token_counts)
  valid = word_index >= 0
  global_word = (word_base + word_index)[valid]
  np.add.at(word_features, global_word, features[valid])
  np.add.at(counts, global_word, 1)
  word_features /= np.maximum(counts, 1)[:, None]
  return dict(
      features=features.astype(np.float32),
      tokens=np.asarray(tokenizer.token_texts(all_ids), dtype=str),   # text, not byte symbols
      token_offsets=np.cumsum([0] + token_counts).astype(np.int64),
      word_index=word_index,
      segment_ids=np.concatenate([s for _, s in per_line]),
      words=np.asarray(words, dtype=str),
      word_offsets=np.cumsum([0] + word_counts).astype(np.int64),
      word_features=word_features,
      layers=np.asarray(layers, np.int32)), truncated


def check_sentence_request(inputs, path, pooling, layers=None):
  """--pooling=mean|cls|last embeds one text a line from the last layer: a pair line or
  another --layers is one line (before the model loads)."""
  pair = next((n for n, (_, b) in enumerate(inputs, start=1) if b is not None), None)
  if pair:
    raise ExtractError(f"{path}:{pair}: a pair ('a ||| b'); --pooling={pooling} embeds one "
                       "text a line.")
  if layers is not None and str(layers).strip() != "-1":
    raise ExtractError(f"--layers={layers} with --pooling={pooling}: a sentence vector pools "
                       "the last layer; drop --layers (or give -1).")


def sentence_vectors(arrays, pooling):
  """[lines, H] float32 L2-normalised: each line's last-layer token features (extract with
  layers=[-1]) pooled as contrastive.pool does over the real tokens (mean, first, last)."""
  out = []
  for a, b in zip(arrays["token_offsets"][:-1], arrays["token_offsets"][1:]):
    f = arrays["features"][a:b].astype(np.float64)                      # [tokens, H]
    v = f.mean(0) if pooling == "mean" else f[0] if pooling == "cls" else f[-1]
    out.append(v / max(np.linalg.norm(v), 1e-12))   # torch's F.normalize, as contrastive's
  return np.asarray(out, np.float32)


def save_npz(path, arrays):
  """np.savez to a temporary name beside `path`, then renamed (files.atomic_path): no
  half-written file under the final name, and none left behind when the write fails."""
  with files_lib.atomic_path(path) as tmp:
    with open(tmp, "wb") as f:
      np.savez(f, **arrays)


FLAGS = flags.FLAGS


def define_flags():
  """Flags are defined only when run as a program, so modules import side-effect free."""
  flags.DEFINE_string("input_file", None, "Text file: one text, or 'a ||| b', per line.")
  flags.DEFINE_string("output_file", None, "Where to write the .npz.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing --output_file (without it: "
                    "refused, before any work).")
  flags.DEFINE_string("init_checkpoint", None, "Export, pre-training/fine-tuning workdir, step "
                      "directory (local or gs://) or Hugging Face folder.")
  flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt (default: the checkpoint's own).")
  flags.DEFINE_string("spm_model_file", None, "SentencePiece model (default: the checkpoint's).")
  flags.DEFINE_string("tokenizer_json", None, "Hugging Face tokenizer.json (default: the "
                      "checkpoint's own, as a converted ModernBERT bundles it).")
  flags.DEFINE_bool("do_lower_case", None, "Default: the casing recorded in the checkpoint.")
  flags.DEFINE_string("layers", DEFAULT_LAYERS, "Encoder layers to use (-1 = last); the default "
                      "keeps those a smaller model has.")
  flags.DEFINE_enum("pooling", "concat", ["concat", "sum", *SENTENCE_POOLINGS],
                    "concat/sum: how to combine the layers; mean/cls/last: also one sentence "
                    "vector per line (the last layer, pooled and normalised: `embeddings`).")
  flags.DEFINE_integer("max_seq_length", 128, "Longer lines are truncated (and counted).")
  flags.DEFINE_integer("batch_size", 32, "Lines per forward pass.")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")


def main(argv):
  del argv
  if not FLAGS.input_file:
    raise ExtractError("--input_file is empty: pass a text file with one text per line.")
  # Before the model runs (it takes minutes on a big input): the one output check.
  files_lib.check_output_file(FLAGS.output_file, "--output_file", overwrite=FLAGS.overwrite)
  if FLAGS.max_seq_length < MIN_SEQ_LENGTH:
    raise ExtractError(f"--max_seq_length={FLAGS.max_seq_length}: must be at least "
                       f"{MIN_SEQ_LENGTH} ([CLS], one word piece, [SEP]); BERT's usual is 128.")
  if FLAGS.batch_size < 1:
    raise ExtractError(f"--batch_size={FLAGS.batch_size}: must be at least 1.")
  inputs = read_inputs(FLAGS.input_file)
  sentence = FLAGS.pooling in SENTENCE_POOLINGS
  if sentence:
    check_sentence_request(inputs, FLAGS.input_file, FLAGS.pooling,
                           FLAGS.layers if FLAGS["layers"].present else None)
  logging.set_verbosity(logging.WARNING)  # Orbax logs every restore step at INFO
  inference.enable_compilation_cache()
  m = inference.load_for_inference(FLAGS.init_checkpoint, vocab_file=FLAGS.vocab_file,
                                   spm_model_file=FLAGS.spm_model_file,
                                   tokenizer_json=FLAGS.tokenizer_json,
                                   do_lower_case=FLAGS.do_lower_case)
  print(f"loaded {m.description}", flush=True)
  if sentence:   # an embedding run's export or an import records its pooling: the one rule
    sentence_transformers.check_flags_against_record(
        m.path, m.meta.get("sentence_embedding") or {}, pooling=FLAGS.pooling)
  note = families.get(m.config.family).describe(m.config, "features")
  if note:   # which network the features come from (ELECTRA: the discriminator)
    print(note, flush=True)
  cfg = model_lib.BertConfig.from_dict({**m.config.to_dict(), "dtype": FLAGS.dtype})
  layers = ([-1] if sentence else
            parse_layers(FLAGS.layers, cfg.num_layers, clip=not FLAGS["layers"].present))
  arrays, truncated = extract(inputs, m.tokenizer, m.params.get("bert", m.params), cfg,
                              layers=layers, pooling="concat" if sentence else FLAGS.pooling,
                              max_seq_length=FLAGS.max_seq_length, batch_size=FLAGS.batch_size)
  if sentence:
    arrays["embeddings"] = sentence_vectors(arrays, FLAGS.pooling)
  save_npz(FLAGS.output_file, arrays)
  print(f"wrote {FLAGS.output_file}: {len(inputs)} lines, {len(arrays['tokens'])} tokens, "
        f"layers {','.join(map(str, layers))}, features {arrays['features'].shape[1]}-d"
        + (f", embeddings ({FLAGS.pooling} pooling, normalised)" if sentence else "")
        + (f"; {truncated} lines truncated to {FLAGS.max_seq_length}" if truncated else ""))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
