"""Prints token ids for text on stdin, one line of space-separated ids per input line.

  echo "Hello, world!" | python -m data_pipelines.tokenize --vocab_file=data/vocab.txt
  python -m data_pipelines.tokenize --spm_model_file=data/spm.model < text.txt
  python -m data_pipelines.tokenize --tokenizer_json=data/tokenizer.json --tokens < text.txt

For inspecting a vocabulary and as the command-line surface of the parity tests against
`transformers.BertTokenizer`. Bytes that are not valid UTF-8 are decoded with replacement
(U+FFFD, which BERT's cleaning then drops) and their count is reported on stderr.
"""

import sys

from absl import flags

from bert_jax_core import errors
from data_pipelines.tokenizers import tokenization

FLAGS = flags.FLAGS


def define_flags(flag_values=flags.FLAGS):
  """CLI flags; defined only when run as a program, so importing this module defines none."""
  fv = dict(flag_values=flag_values)
  flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt.", **fv)
  flags.DEFINE_string("spm_model_file", None, "SentencePiece .model (instead of --vocab_file).",
                      **fv)
  flags.DEFINE_string("tokenizer_json", None, "Hugging Face tokenizer.json (instead of "
                      "--vocab_file).", **fv)
  flags.DEFINE_bool("do_lower_case", None, "Default: the vocab's casing (its .meta.json, or "
                    "inferred for google/HF vocabs); a contradicting value is an error.", **fv)
  flags.DEFINE_integer("max_chars_per_word", tokenization.MAX_CHARS_PER_WORD,
                       "WordPiece: longer words become [UNK] (HF's default is 100).", **fv)
  flags.DEFINE_bool("tokens", False, "Print the tokens instead of the ids.", **fv)


def main(argv):
  del argv
  tokenizer = tokenization.get_tokenizer(FLAGS.vocab_file, FLAGS.spm_model_file,
                                         FLAGS.do_lower_case, FLAGS.max_chars_per_word,
                                         tokenizer_json=FLAGS.tokenizer_json)
  text, num_replaced = tokenization.decode_utf8(sys.stdin.buffer.read())
  if num_replaced:
    print(f"tokenize: {num_replaced} invalid UTF-8 byte sequence(s) on stdin were replaced "
          "with U+FFFD", file=sys.stderr)
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()  # the newline that ends the last line does not start another
  out = sys.stdout
  for ids in tokenizer.encode([l.removesuffix("\r") for l in lines]):
    if FLAGS.tokens:
      out.write(" ".join(tokenizer.id_to_token(ids)) + "\n")
    else:
      out.write(" ".join(map(str, ids)) + "\n")


if __name__ == "__main__":
  define_flags()
  errors.run(main)  # a VocabError is one line on stderr and exit code 2
