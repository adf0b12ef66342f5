r"""Quick sanity check of a checkpoint: fill-mask and next-sentence probability; sentence vectors.

  python -m bert_jax.predict --init_checkpoint=ckpt/bert_base fill-mask \
      "The man went to the [MASK] ."
  python -m bert_jax.predict --init_checkpoint=gs://B/runs/base fill-mask \
      "The man went to the [MASK] ." --text_b="He bought a gallon of milk ." --top_k=3
  python -m bert_jax.predict --init_checkpoint=runs/embed embed "a query" "a document" \
      [--prompt_name=query] [--pooling=mean] [--output_file=vectors.npy]
  python -m bert_jax.predict --init_checkpoint=runs/rerank/best_epoch2 rerank "a query" \
      "a document" "another document"

rerank: a reranker's (a custom.type=reranker run's export, or a sentence-transformers CrossEncoder
folder) documents, best first, with the score CrossEncoder.predict gives (sigmoid of the logit)
and the logit, each pair tokenized as the reranker task does (tasks/reranker.py).

embed: each text's sentence vector, as the embedding task computes it (tasks/embedding.py's
EmbeddingModel: the body, pooled over the real tokens, L2-normalised), with the checkpoint's
recorded pooling, prompts and max_seq_length (an embedding run's export or a sentence-transformers
import: bert_config.json's "sentence_embedding"; else mean, no prompt, max_position_embeddings):
prints the cosine of every pair, and writes [N, H] float32 with --output_file. extract_features
--pooling=mean|cls|last gives the same vectors (tests/bert_jax/convert/st_interop_test.py).

--init_checkpoint is a converted export (python -m bert_jax.convert), a pre-training workdir or one
of its step directories, local or gs://, or a Hugging Face folder (converted on the fly,
`bert_jax.inference.loading.load_for_inference`); the first line says what was loaded; the vocab.txt,
SentencePiece model or tokenizer.json bundled with it (or --vocab_file / --spm_model_file /
--tokenizer_json) and its recorded casing are used. A ModernBERT (a converted transformers folder:
byte-level BPE) writes its own mask token, "[MASK]", as the text's mask. Prints, for each [MASK],
the top-k tokens with their probabilities (as text: a byte-level BPE's pieces decoded by its
tokenizer.json's decoder, ' 입력' not 'Ġìŀħëł¥'), and with --text_b the NSP probability
P(IsNext). The probabilities are a softmax over the full vocabulary, as transformers' fill-mask
pipeline. An ELECTRA checkpoint fills masks with its generator (the network trained on MLM; it
says so), and has no sentence-pair head; a DistilBERT fills masks with its own MLM head (a
distillation workdir or a DistilBertForMaskedLM folder) and has none either.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from absl import logging

from bert_jax import cli
from bert_jax_core import errors
from bert_jax import families
from bert_jax.inference import loading as inference


PredictError = inference.PredictError
Predictor = inference.InferenceModel


def load(checkpoint, vocab_file=None, do_lower_case=None, spm_model_file=None,
         tokenizer_json=None):
  """A Predictor (InferenceModel with device arrays) for a BertForPreTraining checkpoint."""
  # A WordPiece vocab is tokenized in plain Python (same ids as the in-graph tokenizer,
  # tests/data_pipelines/tokenizers/wordpiece_py_test.py), a tokenizer.json by the `tokenizers` library: one sentence
  # does not need TensorFlow's seconds of import.
  predictor = inference.load_for_inference(checkpoint, vocab_file=vocab_file,
                                           spm_model_file=spm_model_file,
                                           tokenizer_json=tokenizer_json,
                                           do_lower_case=do_lower_case, python_tokenizer=True)
  # What fill-mask needs of this family's checkpoint (BERT: the MLM and sentence heads; ELECTRA:
  # its generator): bert_jax/families/<name>.py.
  families.get(predictor.config.family).check_fill_mask(predictor, checkpoint)
  predictor.params = jax.tree.map(jnp.asarray, predictor.params)
  return predictor


def encode(predictor, text_a, text_b=None):
  """[CLS] a [SEP] (b [SEP]) -> input_ids, input_mask, segment_ids, each [1, T] int32."""
  tok = predictor.tokenizer
  texts = [text_a] + ([text_b] if text_b is not None else [])
  if any(not t.strip() for t in texts):
    raise PredictError("empty text: give a sentence, e.g. \"The man went to the [MASK] .\"")
  pieces = tok.encode(texts)
  ids = [tok.vocab.cls_id] + pieces[0] + [tok.vocab.sep_id]
  segments = [0] * len(ids)
  if text_b is not None:
    ids += pieces[1] + [tok.vocab.sep_id]
    segments += [1] * (len(pieces[1]) + 1)
  if len(ids) > predictor.config.max_position_embeddings:
    raise PredictError(f"the input has {len(ids)} tokens but the model takes at most "
                       f"{predictor.config.max_position_embeddings}; shorten the text.")
  as_batch = lambda x: np.asarray([x], np.int32)
  return as_batch(ids), as_batch([1] * len(ids)), as_batch(segments)


@functools.partial(jax.jit, static_argnums=1)
def _probabilities(params, config, ids, mask, segments, positions):
  # The family's MLM network (ELECTRA: the generator) and sentence head (None without one).
  mlm, nsp = families.get(config.family).mlm_logits(params, config, ids, mask, segments,
                                                     positions)
  # [1, P, V], [1, 2]; a model without a sentence head (SpanBERT) has no second output. ALBERT's
  # is sentence order: label 0 = B follows A, as NSP's IsNext.
  return jax.nn.softmax(mlm, axis=-1), None if nsp is None else jax.nn.softmax(nsp, axis=-1)


def predict(predictor, text_a, text_b=None, top_k=5):
  """{"masks": [[(token, id, prob) x top_k] per [MASK]], "is_next": P(IsNext) or None}."""
  if text_b is not None and predictor.config.sentence_objective is None:
    raise PredictError(f"--text_b: this model ({predictor.config.family}, objectives "
                       f"{predictor.config.objectives}) has no sentence-pair head; give one text "
                       "with [MASK].")
  ids, mask, segments = encode(predictor, text_a, text_b)
  positions = np.nonzero(ids[0] == predictor.tokenizer.vocab.mask_id)[0]
  if text_b is None and not len(positions):
    mask = predictor.tokenizer.id_to_token([predictor.tokenizer.vocab.mask_id])[0]
    raise PredictError(f"no {mask} in {text_a!r}; put {mask} where a word should be "
                       "predicted (this model's mask token), or give --text_b for "
                       "next-sentence prediction.")
  # At least one gathered position even with no [MASK] (NSP only); its logits are dropped.
  gather = positions if len(positions) else np.zeros([1], np.int64)
  probs, nsp = _probabilities(predictor.params, predictor.config, ids, mask, segments,
                              jnp.asarray(gather[None], jnp.int32))
  probs = np.asarray(probs[0])
  masks = []
  for p in range(len(positions)):
    top = np.argsort(-probs[p], kind="stable")[:top_k]
    tokens = predictor.tokenizer.token_texts(top)   # text, not byte-level symbols ('Ġìŀħ')
    masks.append([(t, int(i), float(probs[p, i])) for t, i in zip(tokens, top)])
  # NSP label 0 = IsNext (google-research/bert and the batch contract).
  return {"masks": masks,
          "is_next": float(nsp[0, 0]) if text_b is not None and nsp is not None else None}


# ----------------------------------------------------------------------------------------------
# embed: sentence vectors.
# ----------------------------------------------------------------------------------------------
def load_embedder(checkpoint, vocab_file=None, do_lower_case=None, spm_model_file=None,
                  tokenizer_json=None):
  """An InferenceModel whose body (params["bert"]) embeds: any checkpoint here, heads or none."""
  m = inference.load_for_inference(checkpoint, vocab_file=vocab_file,
                                   spm_model_file=spm_model_file, tokenizer_json=tokenizer_json,
                                   do_lower_case=do_lower_case, python_tokenizer=True)
  if "bert" not in m.params:
    raise PredictError(f"--init_checkpoint={checkpoint}: no 'bert' parameters (top-level keys "
                       f"{sorted(m.params)}); embed needs the encoder.")
  m.params = jax.tree.map(jnp.asarray, {"bert": m.params["bert"]})
  return m


def embedding_settings(m, pooling=None, prompt_name=None, max_seq_length=None):
  """(pooling, prompt text, max_seq_length): the flags, else the checkpoint's record, else mean,
  no prompt and the model's max_position_embeddings. A --pooling the record contradicts is one
  line (sentence_transformers.check_flags_against_record, convert's and extract_features' rule)."""
  from bert_jax.convert import sentence_transformers  # pylint: disable=g-import-not-at-top
  from bert_jax.objectives import contrastive  # pylint: disable=g-import-not-at-top
  recorded = m.meta.get("sentence_embedding") or {}
  sentence_transformers.check_flags_against_record(m.path, recorded, takes="embed",
                                                   pooling=pooling or None)
  pooling = pooling or recorded.get("pooling") or "mean"
  if pooling not in contrastive.POOLINGS:
    raise PredictError(f"--pooling={pooling}: use one of {', '.join(contrastive.POOLINGS)}.")
  prompt = ""
  if prompt_name not in (None, "", "none"):
    if prompt_name not in ("query", "document"):
      raise PredictError(f"--prompt_name={prompt_name}: use query, document or none.")
    prompt = recorded.get(f"{prompt_name}_prompt") or ""
  limit = m.config.max_position_embeddings
  length = int(max_seq_length or recorded.get("max_seq_length") or limit)
  if not 2 < length <= limit:
    raise PredictError(f"--max_seq_length={length}: give 3 to the model's "
                       f"max_position_embeddings={limit}.")
  return pooling, prompt, length


@functools.partial(jax.jit, static_argnums=(1, 2))
def _embed_batch(params, config, pooling, ids, mask, segments):
  from bert_jax.objectives import contrastive  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks import embedding  # pylint: disable=g-import-not-at-top
  model = embedding.EmbeddingModel(config, pooling)
  out = model.apply({"params": params}, ids[:, None], mask[:, None], segments[:, None])
  return contrastive.normalise(out[:, 0])                                 # [B, H]


def embed(m, texts, *, pooling="mean", prompt="", max_seq_length=512, batch_size=32):
  """[N, H] float32 L2-normalised vectors of `texts` (prompt + text, [CLS] pieces [SEP], cut to
  max_seq_length), as the embedding task's training and evaluation tokenize and pool them."""
  from data_pipelines.tasks.common import pack  # pylint: disable=g-import-not-at-top
  if not texts or any(not t.strip() for t in texts):
    raise PredictError("embed: give one or more non-empty texts.")
  vocab = m.tokenizer.vocab
  pieces = m.tokenizer.encode([prompt + t for t in texts])
  out = []
  for start in range(0, len(texts), batch_size):
    chunk = [p[:max_seq_length - 2] for p in pieces[start:start + batch_size]]
    width = max(len(p) for p in chunk) + 2                                # the longest, padded
    packed = [pack(p, None, vocab, width) for p in chunk]
    ids, mask, segments = (jnp.asarray(np.stack([x[i] for x in packed])) for i in range(3))
    out.append(np.asarray(_embed_batch(m.params, m.config, pooling, ids, mask, segments)))
  return np.concatenate(out).astype(np.float32)


def format_embeddings(texts, vectors):
  lines = [f"{len(texts)} vectors of {vectors.shape[1]} dimensions (L2-normalised)"]
  for i, t in enumerate(texts):
    lines.append(f"  [{i}] {t[:60]!r}: {' '.join(f'{x:+.4f}' for x in vectors[i, :4])} ...")
  if len(texts) > 1:
    lines.append("cosine:")
    sims = vectors @ vectors.T
    for i in range(len(texts)):
      lines.append("  " + " ".join(f"{x:+.4f}" for x in sims[i]))
  return "\n".join(lines)


def format_prediction(result):
  lines = []
  for n, candidates in enumerate(result["masks"]):
    lines.append(f"[MASK] #{n + 1}:")
    # "" is an id without a token: a model's padded rows past its tokenizer.json (ModernBERT).
    lines += [f"  {token or f'(id {i}: no token)':<20s} {prob:.4f}"
              for token, i, prob in candidates]
  if result["is_next"] is not None:
    lines.append(f"next sentence: P(IsNext) = {result['is_next']:.4f}")
  return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# rerank: a cross-encoder's scores of (query, document) pairs.
# ----------------------------------------------------------------------------------------------
def load_reranker(checkpoint, vocab_file=None, do_lower_case=None, spm_model_file=None,
                  tokenizer_json=None):
  """An InferenceModel of a reranker: a custom.type=reranker run's export, a converted
  CrossEncoder, or a CrossEncoder folder (converted once into the cache). Another task's export,
  or one without the one-output classifier, is one line before any compute."""
  from bert_jax.tasks import reranker  # pylint: disable=g-import-not-at-top
  m = inference.load_for_inference(checkpoint, vocab_file=vocab_file,
                                   spm_model_file=spm_model_file, tokenizer_json=tokenizer_json,
                                   do_lower_case=do_lower_case, python_tokenizer=True)
  problem = reranker.not_a_reranker(m.meta, m.params)
  if problem:
    raise PredictError(f"--init_checkpoint={checkpoint}: {problem}")
  m.params = jax.tree.map(jnp.asarray, m.params)
  return m


@functools.partial(jax.jit, static_argnums=(1,))
def _score_batch(params, config, ids, mask, segments):
  from bert_jax.tasks import reranker  # pylint: disable=g-import-not-at-top
  return reranker.RerankerModel(config).apply({"params": params}, ids, mask, segments)  # [1, N]


def _rerank_length(m, max_seq_length=None):
  """The pair length: max_seq_length, else the run's recorded one, else the model's
  max_position_embeddings."""
  return int(max_seq_length or (m.meta.get("cross_encoder") or {}).get("max_seq_length")
             or m.config.max_position_embeddings)


def rerank_scores(m, query, documents, *, max_seq_length=None):
  """[N] float32 raw scores (logits) of (query, document) for each document, tokenized as the
  reranker's training and evaluation do (tasks/reranker.py encode_lists: "[CLS] q [SEP] d
  [SEP]", the longer side cut first to max_seq_length: the run's recorded one, else the model's
  max_position_embeddings)."""
  from bert_jax.tasks import reranker  # pylint: disable=g-import-not-at-top
  if not query.strip() or not documents or any(not d.strip() for d in documents):
    raise PredictError("rerank: give a non-empty query and one or more non-empty documents.")
  length = _rerank_length(m, max_seq_length)
  features, _ = reranker.encode_lists([(query, list(documents), [0.0] * len(documents))],
                                      m.tokenizer, length)
  ids, mask, segments = (jnp.asarray(features[k]) for k in ("input_ids", "input_mask",
                                                           "segment_ids"))
  return np.asarray(_score_batch(m.params, m.config, ids, mask, segments))[0].astype(np.float32)


def rerank_pair_scores(m, pairs, *, batch_size=64, max_seq_length=None):
  """[len(pairs)] float32 raw scores of many (query, document) pairs, each as rerank_scores
  tokenizes it, in batches of batch_size pairs (the last one padded with copies of the first
  pair: one compiled shape [batch_size, 1, T] however many queries and candidates). The batched
  form of rerank_scores for mining's rescoring: a query at a time compiled one program per list
  length and fed the cores lists of ~10 pairs."""
  from bert_jax.tasks import reranker  # pylint: disable=g-import-not-at-top
  length = _rerank_length(m, max_seq_length)
  out = np.zeros((len(pairs),), np.float32)
  for start in range(0, len(pairs), batch_size):
    chunk = list(pairs[start:start + batch_size])
    real = len(chunk)
    chunk += chunk[:1] * (batch_size - real)
    features, _ = reranker.encode_lists([(q, [d], [0.0]) for q, d in chunk], m.tokenizer, length)
    ids, mask, segments = (jnp.asarray(features[k]) for k in ("input_ids", "input_mask",
                                                             "segment_ids"))
    scores = np.asarray(_score_batch(m.params, m.config, ids, mask, segments))   # [B, 1]
    out[start:start + real] = scores[:real, 0]
  return out


def apply_rerank_activation(m, scores):
  """CrossEncoder.predict's activation (rerank_activation) on raw scores."""
  scores = np.asarray(scores, np.float32)
  if rerank_activation(m) == "sigmoid":
    return (1 / (1 + np.exp(-scores.astype(np.float64)))).astype(np.float32)
  return scores


def rerank_activation(m):
  """The activation CrossEncoder.predict applies to m's logits: its recorded one, else sigmoid
  (ST's default for one label)."""
  return (m.meta.get("cross_encoder") or {}).get("activation_fn") or "sigmoid"


def rerank_predict(m, query, documents, *, max_seq_length=None):
  """[N] float32: CrossEncoder.predict's scores (rerank_scores with rerank_activation)."""
  return apply_rerank_activation(m, rerank_scores(m, query, documents,
                                                  max_seq_length=max_seq_length))


def format_ranking(m, documents, scores):
  """Documents best first, with the score CrossEncoder.predict gives (its activation: sigmoid by
  default) and the raw logit."""
  activation = rerank_activation(m)
  shown = 1 / (1 + np.exp(-scores)) if activation == "sigmoid" else scores
  lines = [f"{len(documents)} documents ranked (score: {activation} of the logit)"]
  for rank, i in enumerate(np.argsort(-scores, kind="stable"), start=1):
    lines.append(f"  {rank:>3}. {shown[i]:.4f} (logit {scores[i]:+.4f})  [{i}] "
                 f"{documents[i][:70]!r}")
  return "\n".join(lines)


def main_rerank(args):
  """python -m bert_jax.predict --init_checkpoint=DIR rerank QUERY DOC [DOC...]"""
  if len(args) < 2:
    raise PredictError("rerank: give a query and one or more documents, e.g. rerank \"a query\" "
                       "\"a document\" \"another document\".")
  logging.set_verbosity(logging.WARNING)
  inference.enable_compilation_cache()
  m = load_reranker(FLAGS.init_checkpoint, FLAGS.vocab_file, FLAGS.do_lower_case,
                    FLAGS.spm_model_file, FLAGS.tokenizer_json)
  print(f"loaded {m.description}")
  scores = rerank_scores(m, args[0], args[1:], max_seq_length=FLAGS.max_seq_length)
  print(format_ranking(m, args[1:], scores))


FLAGS = flags.FLAGS


def define_flags():
  """Flags are defined only when run as a program, so modules import side-effect free."""
  flags.DEFINE_string("init_checkpoint", None,
                      "Converted export, pre-training workdir, step directory (local or gs://) "
                      "or Hugging Face folder (converted once into a cache).")
  flags.DEFINE_string("vocab_file", None, "vocab.txt (default: the checkpoint's own).")
  flags.DEFINE_string("spm_model_file", None, "SentencePiece model (default: the checkpoint's).")
  flags.DEFINE_string("tokenizer_json", None, "Hugging Face tokenizer.json (default: the "
                      "checkpoint's own, as a converted ModernBERT bundles it).")
  flags.DEFINE_bool("do_lower_case", None, "Default: the casing recorded in the checkpoint.")
  flags.DEFINE_string("text_b", None, "Second sentence: also print P(IsNext).")
  flags.DEFINE_integer("top_k", 5, "Candidates per [MASK].")
  flags.DEFINE_enum("pooling", None, ["mean", "cls", "last"], "embed: the pooling (default: "
                    "the checkpoint's recorded one, else mean).")
  flags.DEFINE_enum("prompt_name", "none", ["none", "query", "document"], "embed: prepend the "
                    "checkpoint's recorded query or document prompt.")
  flags.DEFINE_integer("max_seq_length", None, "embed, rerank: truncation length (default: the "
                       "checkpoint's recorded one, else max_position_embeddings).")
  flags.DEFINE_string("output_file", None, "embed: write the [N, H] float32 vectors (.npy).")
  flags.DEFINE_bool("overwrite", False, "embed: replace an existing --output_file (without it: "
                    "refused, before any work).")


def check_embed_output(path):
  """The vectors are written as .npy (np.save's format): another name got .npy bytes silently
  (vectors.txt, vectors.csv; issue 49 item 7)."""
  if not path.lower().endswith(".npy"):
    stem = os.path.splitext(path)[0]
    raise PredictError(f"--output_file={path}: embed writes a NumPy .npy array ([N, H] "
                       f"float32); name a .npy file (e.g. --output_file={stem}.npy).")


def main_embed(texts):
  """python -m bert_jax.predict --init_checkpoint=DIR embed TEXT..."""
  from bert_jax_core import files as files_lib  # pylint: disable=g-import-not-at-top
  if FLAGS.output_file:
    files_lib.check_output_file(FLAGS.output_file, "--output_file", overwrite=FLAGS.overwrite)
    check_embed_output(FLAGS.output_file)
  if not texts or any(not t.strip() for t in texts):
    raise PredictError("embed: give one or more non-empty texts, e.g. embed \"a query\" "
                       "\"a document\".")
  logging.set_verbosity(logging.WARNING)
  inference.enable_compilation_cache()
  m = load_embedder(FLAGS.init_checkpoint, FLAGS.vocab_file, FLAGS.do_lower_case,
                    FLAGS.spm_model_file, FLAGS.tokenizer_json)
  pooling, prompt, length = embedding_settings(m, FLAGS.pooling, FLAGS.prompt_name,
                                               FLAGS.max_seq_length)
  print(f"loaded {m.description}; pooling {pooling}, prompt {prompt!r}, max_seq_length {length}")
  vectors = embed(m, texts, pooling=pooling, prompt=prompt, max_seq_length=length)
  print(format_embeddings(texts, vectors))
  if FLAGS.output_file:
    with files_lib.atomic_path(FLAGS.output_file) as tmp:
      with open(tmp, "wb") as f:
        np.save(f, vectors)
    print(f"wrote {FLAGS.output_file}: [{len(texts)}, {vectors.shape[1]}] float32")


def main(argv):
  if len(argv) >= 2 and argv[1] in ("embed", "rerank"):
    if not FLAGS.init_checkpoint:
      raise app.UsageError("--init_checkpoint is required.")
    return (main_embed if argv[1] == "embed" else main_rerank)(argv[2:])
  if len(argv) != 3 or argv[1] != "fill-mask":
    raise app.UsageError("usage: python -m bert_jax.predict --init_checkpoint=DIR fill-mask "
                         "\"The man went to the [MASK] .\" [--text_b=...] [--top_k=5], or "
                         "embed TEXT... [--prompt_name=query] [--output_file=vectors.npy], or "
                         "rerank QUERY DOC [DOC...]")
  if not FLAGS.init_checkpoint:
    raise app.UsageError("--init_checkpoint is required.")
  if FLAGS.top_k < 1:
    raise app.UsageError(f"--top_k={FLAGS.top_k}: give at least 1.")
  logging.set_verbosity(logging.WARNING)
  inference.enable_compilation_cache()
  predictor = load(FLAGS.init_checkpoint, FLAGS.vocab_file, FLAGS.do_lower_case,
                   FLAGS.spm_model_file, FLAGS.tokenizer_json)
  print(f"loaded {predictor.description}")
  note = families.get(predictor.config.family).describe(predictor.config, "predict")
  if note:   # what of the model fill-mask uses (ELECTRA: the generator)
    print(note)
  print(format_prediction(predict(predictor, argv[2], FLAGS.text_b, FLAGS.top_k)))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
