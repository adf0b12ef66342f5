r"""Convert BERT checkpoints: google TF / Hugging Face -> Orbax, Orbax -> Hugging Face.

  # google-research/bert release (bert_model.ckpt.*, bert_config.json, vocab.txt) -> Orbax
  python -m bert_jax.convert --input=uncased_L-12_H-768_A-12 --output=ckpt/bert_base
  # Hugging Face directory (config.json + model.safetensors or pytorch_model.bin) -> Orbax
  python -m bert_jax.convert --input=hf/bert-base-uncased --output=ckpt/bert_base_hf
  # Orbax export, pre-training workdir or step directory (local or gs://) -> Hugging Face
  python -m bert_jax.convert --input=ckpt/bert_base --output=hf/exported
  # ELECTRA's two transformers folders (or their parent folder) -> one Orbax tree, and back
  python -m bert_jax.convert --input=hf/electra-disc,hf/electra-gen --output=ckpt/electra
  python -m bert_jax.convert --input=runs/electra --output=hf/electra   # discriminator/ + generator/
  # an embedding run (or any checkpoint) -> SentenceTransformer(folder); a sentence-transformers
  # folder -> Orbax, its pooling and prompts recorded (bert_jax/convert/sentence_transformers.py)
  python -m bert_jax.convert --input=runs/embed --output=st/embed --to=sentence_transformers
  python -m bert_jax.convert --input=st/all-MiniLM-L6-v2 --output=ckpt/minilm

Every family converts through this one command (bert_jax/families/<name>.py says how); the
former aliases bert_jax.families.electra.convert and bert_jax.families.distilbert.convert are one-line errors
naming it.

The direction follows from --input (auto-detected; --source overrides). Every user error is one
line on stderr and exit code 2 (bert_jax_core.errors).
"""

import json
import os

from absl import app
from absl import flags
from absl import logging

from bert_jax import convert
from bert_jax import families
from bert_jax import cli
from bert_jax_core import errors

FLAGS = flags.FLAGS
flags.DEFINE_string("input", None, "TF checkpoint dir/prefix, transformers folder of any family "
                    "(an ELECTRA pair: its parent folder or DISCRIMINATOR_DIR,GENERATOR_DIR), "
                    "Orbax export or workdir.")
flags.DEFINE_string("output", None, "New directory to write (must not exist).")
flags.DEFINE_enum("source", "auto", ["auto", "tf", "hf", "orbax"], "Format of --input.")
flags.DEFINE_string("vocab_file", None, "vocab.txt (default: the one beside --input).")
flags.DEFINE_string("spm_model_file", None, "Export to HF: SentencePiece .model (default: the "
                    "checkpoint's own); written as a tokenizer.json with the same ids.")
flags.DEFINE_string("bert_config_file", None,
                    "TF only: bert_config.json (default: beside the checkpoint).")
flags.DEFINE_bool("do_lower_case", None,
                  "Casing of the checkpoint's tokenizer; checked against the checkpoint "
                  "(default: inferred from it).")
flags.DEFINE_enum("gelu", "auto", ["auto", "gelu", "gelu_tanh"],
                  "GELU to record: auto = the source implementation's (TF: tanh approximation "
                  "as google's modeling.py; HF: as config.json says).")
flags.DEFINE_string("ignore", None, "Regex of extra source variables to skip (reported), e.g. "
                    "'^classifier\\.' for a fine-tuned HF model.")
flags.DEFINE_integer("seed", 0, "Init seed for parameters the source lacks (pooler/heads).")
flags.DEFINE_enum("to", "auto", ["auto", "sentence_transformers", "cross_encoder"],
                  "auto: Orbax -> transformers, anything else -> Orbax (a CrossEncoder folder: "
                  "a reranker export); sentence_transformers: any checkpoint -> a folder "
                  "SentenceTransformer(folder) loads; cross_encoder: a reranker export -> a "
                  "folder CrossEncoder(folder) loads.")
flags.DEFINE_enum("pooling", None, ["mean", "cls", "last"], "--to=sentence_transformers: the "
                  "pooling (default: the checkpoint's recorded one, else mean).")
flags.DEFINE_string("query_prompt", None, "--to=sentence_transformers: the \"query\" prompt "
                    "(default: the checkpoint's recorded one, else none).")
flags.DEFINE_string("document_prompt", None, "--to=sentence_transformers: the \"document\" "
                    "prompt (default: the checkpoint's recorded one, else none).")
flags.DEFINE_integer("max_seq_length", None, "--to=sentence_transformers: truncation length "
                     "(default: the run's, else max_position_embeddings).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if not FLAGS.input or not FLAGS.output:
    raise app.UsageError("--input and --output are required.")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save step at INFO
  st_flags = {k: FLAGS[k].value for k in ("pooling", "query_prompt", "document_prompt",
                                           "max_seq_length") if FLAGS[k].present}
  if FLAGS.to == "sentence_transformers":
    export_sentence_transformers(st_flags)
    return
  if FLAGS.to == "cross_encoder" and not st_flags:
    export_cross_encoder()
    return
  if st_flags:
    raise app.UsageError(f"--{next(iter(st_flags))} is an option of --to=sentence_transformers.")
  source = convert.detect_source(FLAGS.input) if FLAGS.source == "auto" else FLAGS.source
  if source == "orbax":
    from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
    convert.check_new_output(FLAGS.output)
    m = inference.load_for_inference(FLAGS.input, vocab_file=FLAGS.vocab_file,
                                     spm_model_file=FLAGS.spm_model_file,
                                     do_lower_case=FLAGS.do_lower_case)
    print(f"loaded {m.description}", flush=True)   # the step and path, as every loader says
    out = convert.export_model_to_hf(m, FLAGS.output, FLAGS.input)
    written = os.path.join(out, "config.json")   # the architecture the folder says it holds
    what = (json.load(open(written, encoding="utf-8"))["architectures"][0]
            if os.path.isfile(written) else families.get(m.config.family).hf_class)
    print(f"wrote Hugging Face {what} to {out}")
    return
  print(f"loading the {source} checkpoint {FLAGS.input}", flush=True)
  meta = convert.convert_to_orbax(
      FLAGS.input, FLAGS.output, source, vocab_file=FLAGS.vocab_file,
      bert_config_file=FLAGS.bert_config_file, do_lower_case=FLAGS.do_lower_case,
      gelu=FLAGS.gelu, ignore=FLAGS.ignore, seed=FLAGS.seed)
  print(f"wrote Orbax params to {FLAGS.output} (from {source})\n{convert.summary(meta)}")


def export_cross_encoder():
  """A reranker export (custom.type=reranker's best_epoch{N}) -> CrossEncoder folder."""
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  from bert_jax.convert import cross_encoder  # pylint: disable=g-import-not-at-top
  convert.check_new_output(FLAGS.output)
  m = inference.load_for_inference(FLAGS.input, vocab_file=FLAGS.vocab_file,
                                   spm_model_file=FLAGS.spm_model_file,
                                   do_lower_case=FLAGS.do_lower_case)
  print(f"loaded {m.description}", flush=True)
  out = cross_encoder.export(m, FLAGS.output)
  print(f"wrote a sentence-transformers CrossEncoder folder to {out}\n"
        f"  next: CrossEncoder({out!r}).rank(\"a query\", [\"a document\", ...])")


def export_sentence_transformers(st_flags):
  """Any checkpoint (an export, a workdir, a transformers folder) -> sentence-transformers."""
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  from bert_jax.convert import sentence_transformers  # pylint: disable=g-import-not-at-top
  convert.check_new_output(FLAGS.output)
  load = lambda with_params: inference.load_for_inference(  # noqa: E731
      FLAGS.input, vocab_file=FLAGS.vocab_file, spm_model_file=FLAGS.spm_model_file,
      do_lower_case=FLAGS.do_lower_case, with_params=with_params)
  # The flags against the checkpoint's record before its arrays are read (a contradiction, a
  # length beyond its positions: one line).
  sentence_transformers.export_settings(load(False), **st_flags)
  m = load(True)
  print(f"loaded {m.description}", flush=True)
  out, settings = sentence_transformers.export(m, FLAGS.output, **st_flags)
  print(f"wrote a sentence-transformers folder to {out}: "
        f"{sentence_transformers.describe_record(settings)}\n"
        f"  next: SentenceTransformer({out!r}).encode_query([...]) / .encode_document([...])")


if __name__ == "__main__":
  cli.run(main)
