r"""Quick sanity check of a checkpoint: fill-mask and next-sentence probability.

  python -m bert_jax.predict --checkpoint=ckpt/bert_base fill-mask "The man went to the [MASK] ."
  python -m bert_jax.predict --checkpoint=ckpt/bert_base fill-mask \
      "The man went to the [MASK] ." --text_b="He bought a gallon of milk ." --top_k=3

--checkpoint is a converted export (python -m bert_jax.convert) or a pre-training workdir; the
vocab.txt beside it (or --vocab_file) and its recorded casing are used. Prints, for each [MASK],
the top-k tokens with their probabilities, and with --text_b the NSP probability P(IsNext).
The probabilities are a softmax over the full vocabulary, as transformers' fill-mask pipeline.
"""

import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from absl import logging

from bert_jax import checkpoint as ckpt_lib
from bert_jax import model as model_lib


class PredictError(ValueError):
  pass


@dataclasses.dataclass
class Predictor:
  params: dict
  config: model_lib.BertConfig
  tokenizer: object  # data_pipelines.tokenization.Tokenizer
  meta: dict


def load(checkpoint, vocab_file=None, do_lower_case=None):
  """A Predictor for a checkpoint; casing defaults to (and is checked against) the recorded one."""
  from bert_jax import convert  # pylint: disable=g-import-not-at-top
  from data_pipelines import tokenization  # pylint: disable=g-import-not-at-top
  try:
    params, config, meta = ckpt_lib.load_params(checkpoint)
  except ckpt_lib.CheckpointError as e:
    raise PredictError(str(e)) from e
  if "mlm_head" not in params or "nsp_head" not in params:
    raise PredictError(f"--checkpoint={checkpoint}: has no pre-training heads (mlm_head, "
                       "nsp_head); fill-mask needs a BertForPreTraining checkpoint.")
  recorded = meta.get("do_lower_case", (meta.get("config") or {}).get("do_lower_case"))
  if do_lower_case is None:
    do_lower_case = True if recorded is None else recorded
  convert.check_casing({"do_lower_case": recorded}, do_lower_case)
  vocab_file = vocab_file or convert.find_vocab(checkpoint, meta)
  tokenizer = tokenization.get_tokenizer(vocab_file=vocab_file, do_lower_case=do_lower_case)
  if tokenizer.vocab.size != config.vocab_size:
    raise PredictError(f"--vocab_file={vocab_file} has {tokenizer.vocab.size} tokens but the "
                       f"checkpoint's vocab_size is {config.vocab_size}; use its own vocab.")
  params = jax.tree.map(jnp.asarray, params)
  return Predictor(params, config, tokenizer, meta)


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
  mlm, nsp = model_lib.BertForPreTraining(config).apply(
      {"params": params}, ids, mask, segments, positions)
  return jax.nn.softmax(mlm, axis=-1), jax.nn.softmax(nsp, axis=-1)  # [1, P, V], [1, 2]


def predict(predictor, text_a, text_b=None, top_k=5):
  """{"masks": [[(token, id, prob) x top_k] per [MASK]], "is_next": P(IsNext) or None}."""
  ids, mask, segments = encode(predictor, text_a, text_b)
  positions = np.nonzero(ids[0] == predictor.tokenizer.vocab.mask_id)[0]
  if text_b is None and not len(positions):
    raise PredictError(f"no [MASK] in {text_a!r}; put [MASK] where a word should be "
                       "predicted, or give --text_b for next-sentence prediction.")
  # At least one gathered position even with no [MASK] (NSP only); its logits are dropped.
  gather = positions if len(positions) else np.zeros([1], np.int64)
  probs, nsp = _probabilities(predictor.params, predictor.config, ids, mask, segments,
                              jnp.asarray(gather[None], jnp.int32))
  probs = np.asarray(probs[0])
  masks = []
  for p in range(len(positions)):
    top = np.argsort(-probs[p], kind="stable")[:top_k]
    tokens = predictor.tokenizer.id_to_token(top)
    masks.append([(t, int(i), float(probs[p, i])) for t, i in zip(tokens, top)])
  # NSP label 0 = IsNext (google-research/bert and the batch contract).
  return {"masks": masks, "is_next": float(nsp[0, 0]) if text_b is not None else None}


def format_prediction(result):
  lines = []
  for n, candidates in enumerate(result["masks"]):
    lines.append(f"[MASK] #{n + 1}:")
    lines += [f"  {token:<20s} {prob:.4f}" for token, _, prob in candidates]
  if result["is_next"] is not None:
    lines.append(f"next sentence: P(IsNext) = {result['is_next']:.4f}")
  return "\n".join(lines)


FLAGS = flags.FLAGS


def define_flags():
  """Flags are defined only when run as a program, so modules import side-effect free."""
  flags.DEFINE_string("checkpoint", None, "Converted export or pre-training workdir.")
  flags.DEFINE_string("vocab_file", None, "vocab.txt (default: the one beside --checkpoint).")
  flags.DEFINE_bool("do_lower_case", None, "Default: the casing recorded in the checkpoint.")
  flags.DEFINE_string("text_b", None, "Second sentence: also print P(IsNext).")
  flags.DEFINE_integer("top_k", 5, "Candidates per [MASK].")


def main(argv):
  if len(argv) != 3 or argv[1] != "fill-mask":
    raise app.UsageError("usage: python -m bert_jax.predict --checkpoint=DIR fill-mask "
                         "\"The man went to the [MASK] .\" [--text_b=...] [--top_k=5]")
  if not FLAGS.checkpoint:
    raise app.UsageError("--checkpoint is required.")
  logging.set_verbosity(logging.WARNING)
  from bert_jax.convert import ConversionError  # pylint: disable=g-import-not-at-top
  from data_pipelines.vocab import VocabError  # pylint: disable=g-import-not-at-top
  try:
    predictor = load(FLAGS.checkpoint, FLAGS.vocab_file, FLAGS.do_lower_case)
    print(format_prediction(predict(predictor, argv[2], FLAGS.text_b, FLAGS.top_k)))
  except (PredictError, ConversionError, VocabError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
