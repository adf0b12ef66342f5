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

Every family converts through this one command (bert_jax/families/<name>.py says how); the
former aliases bert_jax.convert.electra and bert_jax.convert.distilbert are one-line errors
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if not FLAGS.input or not FLAGS.output:
    raise app.UsageError("--input and --output are required.")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save step at INFO
  source = convert.detect_source(FLAGS.input) if FLAGS.source == "auto" else FLAGS.source
  if source == "orbax":
    from bert_jax import inference  # pylint: disable=g-import-not-at-top
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


if __name__ == "__main__":
  cli.run(main)
