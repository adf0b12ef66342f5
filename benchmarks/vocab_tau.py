r"""Pieces per word for each language: a vocabulary over a tau-sampled mixture vs the plain pool.

  nice -n 10 .venv/bin/python -m benchmarks.vocab_tau [--tau=0.3 --vocab_size=8000
      --max_modules=0 --model_type=bpe]

Real text nobody here wrote: English = the standard library's docstrings (stdlib_corpus,
--max_modules=0: every module), Korean = konlpy's two bills (tests/data/korean; the
constitution held out), German and French = five of dpkg's translated manual pages
(tests/data/german, tests/data/french; the last fifth of each held out, as the last fifth of
the English lines). One `build_vocab --input_sources=...` run per tau (1 = lines drawn in
proportion to size, what --input_file over the same files learns; --tau = shares ~
lines^tau), same vocab size and kind; then, on each language's held-out lines, the pieces per
whitespace word (fewer = the language has more whole-word pieces of its own).
"""

import argparse
import os
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
HELD_OUT = 0.2   # last fifth of a language's lines (English, German, French)


def _lines(path):
  with open(path, encoding="utf-8") as f:
    return [l.strip() for l in f if l.strip()]


def _write(path, lines):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")


def corpora(root, max_modules=None):
  """{lang: (train glob, held-out lines)} written under root."""
  from data_pipelines import stdlib_corpus  # pylint: disable=g-import-not-at-top
  en = [s for doc in stdlib_corpus.iter_documents(max_modules) for s in doc]
  out = {}
  for lang, lines in (("en", en), ("de", _lines(f"{DATA}/german/dpkg_man.txt")),
                      ("fr", _lines(f"{DATA}/french/dpkg_man.txt"))):
    cut = int(len(lines) * (1 - HELD_OUT))
    _write(f"{root}/{lang}/train.txt", lines[:cut])
    out[lang] = (f"{root}/{lang}/train.txt", lines[cut:])
  out["ko"] = (f"{DATA}/korean/1809890.txt,{DATA}/korean/1809891.txt",
               _lines(f"{DATA}/korean/constitution.txt"))
  return out


def pieces_per_word(path, lines):
  """Pieces per whitespace word of `lines` under the tokenizer file at path."""
  from data_pipelines.tokenizers import tokenization  # pylint: disable=g-import-not-at-top
  tok = tokenization.get_tokenizer(tokenizer_json=path)
  pieces = sum(len(ids) for ids in tok.encode(lines))
  return pieces / sum(len(l.split()) for l in lines)


def learn(root, langs, tau, vocab_size, model_type="bpe"):
  """build_vocab over the named corpora at tau; (path, meta)."""
  from data_pipelines import build_vocab  # pylint: disable=g-import-not-at-top
  path = f"{root}/tau{tau:g}.json"
  spec = ";".join(f"{lang}={glob}" for lang, (glob, _) in langs.items())
  _, _, meta = build_vocab.build("", vocab_size, path, model_type=model_type, byte_level=False,
                                 input_sources=spec, source_tau=tau)
  return path, meta


def compare(root, langs, tau, vocab_size, model_type="bpe"):
  """{lang: {"lines", "share@1", "share@tau", "ppw@1", "ppw@tau"}}."""
  out = {lang: {} for lang in langs}
  for t in (1.0, tau):
    path, meta = learn(root, langs, t, vocab_size, model_type)
    for lang, (_, held) in langs.items():
      mix = meta["mixture"]["sources"][lang]
      out[lang].update({"lines": mix["lines"], f"share@{t:g}": mix["share"],
                        f"ppw@{t:g}": pieces_per_word(path, held),
                        "held_out_words": sum(len(l.split()) for l in held)})
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tau", type=float, default=0.3)
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--max_modules", type=int, default=0, help="0 = every module")
  parser.add_argument("--model_type", default="bpe", choices=["bpe", "unigram"])
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as root:
    langs = corpora(root, args.max_modules or None)
    table = compare(root, langs, args.tau, args.vocab_size, args.model_type)
  t = f"{args.tau:g}"
  kind = "characters + byte fallback" if args.model_type == "bpe" else "characters, [UNK]"
  print(f"{args.model_type} tokenizer.json ({kind}), {args.vocab_size} ids; "
        f"pieces per held-out word, tau=1 (size-proportional) vs tau={t}")
  print(f"{'lang':5}{'train lines':>12}{'share@1':>9}{'share@' + t:>11}{'held-out words':>16}"
        f"{'ppw@1':>8}{'ppw@' + t:>10}{'ratio':>8}")
  for lang, r in table.items():
    print(f"{lang:5}{r['lines']:>12,}{r['share@1']:>9.1%}{r['share@' + t]:>11.1%}"
          f"{r['held_out_words']:>16,}{r['ppw@1']:>8.3f}{r['ppw@' + t]:>10.3f}"
          f"{r['ppw@' + t] / r['ppw@1']:>8.3f}")


if __name__ == "__main__":
  main()
