r"""A mini multilingual pre-training, sampled in proportion to size (tau 1), at tau 0.3 and on
mmBERT's annealed schedule (`annealed`), at equal rows and steps: each language's held-out MLM
accuracy and loss side by side (issue 42 item 5).

  apt-get download manpages-de            # Debian's German manual pages (real prose), once
  nice -n 10 .venv/bin/python -m benchmarks.multilingual_mix --manpages_deb=manpages-de_*.deb \
      [--steps=400 --batch_size=32 --out_dir=runs/multilingual_mix]

Real text nobody here wrote, three languages of very different sizes:
  en  the standard library's docstrings (data_pipelines/stdlib_corpus; --max_modules modules)
  de  Debian's German manual pages, section 1 (the .deb unpacked with dpkg-deb -x, each page
      rendered by `man -l` to text; lines of >= 5 words kept, split into sentences)
  ko  konlpy's corpora: the ten bills of kobill and the constitution of kolaw
Each document (module docstring, manual page, bill) goes to train, every 10th to held-out
(Korean: the last tenth of each file's lines, it has 11 documents). One tokenizer.json for both
runs: a character-level BPE with byte fallback (--vocab_size ids) learned by build_vocab over the
three at tau 0.3, so Korean has pieces of its own in both runs. Records: one
create_pretraining_data run per language (--no_nsp, seq 128), train (--dupe_factor) and
held-out (1). Pre-training: modernbert-tiny,runlocal with config.train_sources = the three and
config.source_tau = 1 or 0.3, the same seed, steps and batch (equal compute). Evaluation here,
the same for both: every held-out row of a language (up to --eval_rows), 15% of its non-special
tokens replaced by the mask token (one fixed draw, seed 0), accuracy of the argmax over the MLM
logits at those positions. Everything goes to --out_dir; a re-run reuses what is there. Prints
a Markdown table and a `RESULT {json}` line.
"""

import argparse
import glob
import json
import os
import subprocess
import sys

import numpy as np

from benchmarks.families_side_by_side import sh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LANGS = ("en", "de", "ko")
SEQ, PREDICTIONS = 128, 20
# name -> config.source_tau; None: the `annealed` variant (mmBERT's shape: 60/30/10% of the
# steps at tau 0.7 -> 0.5 -> 0.3 and 30% -> 15% -> 5% masking; its preset raises the prediction
# slots to 30% of SEQ, so its steps predict more tokens: the same rows and steps, not the same
# FLOPs to the last head matmul).
ARMS = {"tau1": 1.0, "tau0.3": 0.3, "annealed": None}


def _write_documents(path, documents):
  """google-research/bert's raw format: a sentence a line, a blank line between documents."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(doc) for doc in documents if doc) + "\n")


def english(max_modules):
  from data_pipelines import stdlib_corpus  # pylint: disable=g-import-not-at-top
  return [doc for doc in stdlib_corpus.iter_documents(max_modules) if doc]


def korean():
  """One document per konlpy file (its lines), the last tenth of each held out."""
  from konlpy.corpus import kobill, kolaw  # pylint: disable=g-import-not-at-top
  docs = []
  for corpus in (kobill, kolaw):
    for name in sorted(corpus.fileids()):
      lines = [l.strip() for l in corpus.open(name).read().splitlines() if l.strip()]
      docs.append(lines)
  return docs


def german(deb, root, pages):
  """Section-1 pages of a manpages-de .deb rendered to sentences, one document a page."""
  from data_pipelines import stdlib_corpus  # pylint: disable=g-import-not-at-top
  unpacked = os.path.join(root, "manpages")
  if not os.path.isdir(unpacked):
    os.makedirs(root, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", deb, unpacked], check=True)
  files = sorted(glob.glob(os.path.join(unpacked, "usr/share/man/de/man1/*.1.gz")))[:pages]
  docs = []
  for page in files:
    text = subprocess.run(["man", "-E", "UTF-8", "-l", page], capture_output=True, text=True,
                          env=dict(os.environ, MANWIDTH="4000", LANG="C.UTF-8")).stdout
    lines = [" ".join(l.split()) for l in text.replace("\b", "").splitlines()[1:-1]]
    prose = [l for l in lines if len(l.split()) >= 5]   # options and headers are shorter
    docs.append([s for l in prose for s in stdlib_corpus.split_sentences(l)])
  return [d for d in docs if d]


def corpora(out, args):
  """{lang: (train.txt, held.txt)} under out/text, written once."""
  paths = {lang: (f"{out}/text/{lang}/train.txt", f"{out}/text/{lang}/held.txt")
           for lang in LANGS}
  if all(os.path.exists(h) for _, h in paths.values()):
    return paths
  docs = {"en": english(args.max_modules or None), "ko": korean(),
          "de": german(args.manpages_deb, out, args.pages)}
  for lang, documents in docs.items():
    if lang == "ko":   # 11 documents: hold out the last tenth of each
      cut = [int(len(d) * 0.9) for d in documents]
      train = [d[:c] for d, c in zip(documents, cut)]
      held = [d[c:] for d, c in zip(documents, cut)]
    else:
      train = [d for i, d in enumerate(documents) if i % 10]
      held = [d for i, d in enumerate(documents) if not i % 10]
    _write_documents(paths[lang][0], train)
    _write_documents(paths[lang][1], held)
  return paths


def data(out, args):
  paths = corpora(out, args)
  tok = f"{out}/tokenizer.json"
  if not os.path.exists(tok):
    spec = ";".join(f"{lang}={train}" for lang, (train, _) in paths.items())
    sh(["data_pipelines.build_vocab", f"--input_sources={spec}", "--source_tau=0.3",
        "--model_type=bpe", "--nobyte_level", f"--vocab_size={args.vocab_size}",
        f"--output={tok}"], log=f"{out}/build_vocab.log")
  for lang, (train, held) in paths.items():
    for split, text, dupe in (("train", train, args.dupe_factor), ("held", held, 1)):
      d = f"{out}/records/{lang}/{split}"
      if not os.path.exists(f"{d}/dataset_info.json"):
        sh(["data_pipelines.create_pretraining_data", f"--input_file={text}",
            f"--output_dir={d}", f"--tokenizer_json={tok}", "--no_nsp",
            f"--max_seq_length={SEQ}", f"--dupe_factor={dupe}", "--num_shards=1",
            "--num_workers=1"], log=f"{d}.log")
  return tok


def pretrain(out, name, tau, tok, args):
  workdir = f"{out}/work_{name}"
  summary = f"{workdir}/summary.json"
  if not (os.path.exists(summary) and json.load(open(summary)).get("final_step") == args.steps):
    spec = ";".join(f"{lang}={out}/records/{lang}/train/*.tfrecord" for lang in LANGS)
    mix = ([f"--config.source_tau={tau}", f"--config.max_predictions_per_seq={PREDICTIONS}"]
           if tau is not None else [])     # annealed: the phases' taus and prediction slots
    sh(["bert_jax.train", "--config=bert_jax/configs/pretrain.py:modernbert-tiny,runlocal"
        + (",annealed" if tau is None else ""),
        f"--workdir={workdir}", f"--config.train_sources={spec}", *mix,
        f"--config.tokenizer_json={tok}", f"--config.num_train_steps={args.steps}",
        f"--config.batch_size={args.batch_size}", f"--config.seq_length={SEQ}",
        f"--config.warmup_steps={max(args.steps // 10, 1)}",
        f"--config.log_every={max(args.steps // 4, 1)}",
        f"--config.checkpoint_every={args.steps}", f"--config.eval_every={args.steps}",
        f"--config.seed={args.seed}"], log=f"{out}/pretrain_{name}.log")
  return workdir, json.load(open(summary))


def held_rows(pattern, limit):
  """input_ids, input_mask [N, SEQ] of the first `limit` records under pattern."""
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  spec = {k: tf.io.FixedLenFeature([SEQ], tf.int64) for k in ("input_ids", "input_mask")}
  rows = [tf.io.parse_single_example(r, spec) for r in
          tf.data.TFRecordDataset(sorted(glob.glob(pattern))).take(limit)]
  return (np.stack([r["input_ids"].numpy() for r in rows]).astype(np.int32),
          np.stack([r["input_mask"].numpy() for r in rows]).astype(np.int32))


def masked(ids, mask, vocab, rate=0.15, seed=0):
  """(masked ids, positions [N, P], targets [N, P], weights [N, P]): `rate` of each row's
  non-special tokens (at least 1, at most PREDICTIONS) replaced by the mask id, one draw."""
  rng = np.random.default_rng(seed)
  out = ids.copy()
  positions = np.zeros((len(ids), PREDICTIONS), np.int32)
  targets, weights = np.zeros_like(positions), np.zeros(positions.shape, np.float32)
  for r in range(len(ids)):
    cand = np.nonzero(mask[r].astype(bool) & ~vocab.is_special[ids[r]])[0]
    k = min(PREDICTIONS, max(1, int(round(rate * len(cand)))))
    chosen = np.sort(rng.choice(cand, k, replace=False))
    positions[r, :k], targets[r, :k], weights[r, :k] = chosen, ids[r, chosen], 1.0
    out[r, chosen] = vocab.mask_id
  return out, positions, targets, weights


def accuracy(workdir, held, eval_rows):
  """{lang: (accuracy, mean cross-entropy in nats, predictions)} of the workdir's model on each
  language's held rows. The loss too: a model 400 tiny steps in predicts the commonest pieces
  ("▁the", "▁") almost everywhere, where accuracy is their frequency and the loss still moves."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import families
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  m = inference.load_for_inference(workdir)
  logits_of = jax.jit(lambda p, i, k, s, q: families.get(m.config.family).mlm_logits(
      p, m.config, i, k, s, q)[0])   # [B, P, V]
  out = {}
  for lang in LANGS:
    ids, mask = held_rows(held[lang], eval_rows)
    ids, positions, targets, weights = masked(ids, mask, m.tokenizer.vocab)
    hits = nats = 0.0
    for b in range(0, len(ids), 32):
      sl = slice(b, b + 32)
      logits = np.asarray(logits_of(m.params, ids[sl], mask[sl], np.zeros_like(ids[sl]),
                                    positions[sl]), np.float64)              # [B, P, V]
      hits += float(((np.argmax(logits, -1) == targets[sl]) * weights[sl]).sum())
      top = logits.max(-1, keepdims=True)
      log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]             # [B, P]
      picked = np.take_along_axis(logits, targets[sl][..., None], -1)[..., 0]
      nats += float(((log_z - picked) * weights[sl]).sum())
    out[lang] = (hits / weights.sum(), nats / weights.sum(), int(weights.sum()))
  return out


def korean_task(out):
  """Which konlpy file a Korean line comes from (11 classes: the ten bills of kobill and the
  constitution): train = the first nine tenths of each file's lines, dev = the last tenth (the
  Korean held-out text, which pre-training never saw). out/ko_task/{train,dev}.csv, labels."""
  import csv  # pylint: disable=g-import-not-at-top
  from konlpy.corpus import kobill, kolaw  # pylint: disable=g-import-not-at-top
  d = f"{out}/ko_task"
  labels = [n[:-4] for c in (kobill, kolaw) for n in sorted(c.fileids())]
  if not os.path.exists(f"{d}/dev.csv"):
    os.makedirs(d, exist_ok=True)
    rows = {"train": [], "dev": []}
    for corpus in (kobill, kolaw):
      for name in sorted(corpus.fileids()):
        lines = [l.strip() for l in corpus.open(name).read().splitlines() if l.strip()]
        cut = int(len(lines) * 0.9)   # as corpora(): the last tenth is held out
        rows["train"] += [(l, name[:-4]) for l in lines[:cut]]
        rows["dev"] += [(l, name[:-4]) for l in lines[cut:]]
    for split, data_rows in rows.items():
      with open(f"{d}/{split}.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(data_rows)
  return d, labels


def finetune_ko(out, name, workdir, tok, task, labels, seed):
  """Best and last dev accuracy of one fine-tuning run on the Korean task."""
  ft = f"{out}/ft_ko_{name}"
  results = f"{ft}/eval_results.json"
  if not (os.path.exists(results) and json.load(open(results)).get("finished")):
    sh(["bert_jax.finetune", "--config=bert_jax/configs/finetune.py:custom",
        f"--config.init_checkpoint={workdir}", f"--config.vocab_file={tok}",
        f"--config.data_dir={task}", "--config.custom.format=csv",
        "--config.custom.text_a=text", "--config.custom.label=label",
        f"--config.custom.labels={','.join(labels)}",
        "--config.custom.train_file=train.csv", "--config.custom.dev_file=dev.csv",
        "--config.max_seq_length=64", f"--config.seed={seed}", "--config.do_predict=false",
        f"--workdir={ft}"], log=f"{out}/ft_ko_{name}.log")
  r = json.load(open(results))
  last = r["history"][-1]
  return dict(best=r["best_score"], last=last[next(k for k in last if k.endswith("accuracy"))],
              epochs=len(r["history"]))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--manpages_deb", required=True, help="manpages-de_*.deb (apt-get download)")
  p.add_argument("--out_dir", default=os.path.join(ROOT, "runs", "multilingual_mix"))
  p.add_argument("--max_modules", type=int, default=0, help="stdlib modules (0: all)")
  p.add_argument("--pages", type=int, default=200, help="German section-1 pages")
  p.add_argument("--vocab_size", type=int, default=8000)
  p.add_argument("--dupe_factor", type=int, default=2)
  p.add_argument("--steps", type=int, default=400)
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--eval_rows", type=int, default=256)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--arms", default=",".join(ARMS), help="which of " + ", ".join(ARMS))
  p.add_argument("--finetune", action="store_true",
                 help="then fine-tune each on the Korean task (korean_task)")
  args = p.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")   # the evaluation here, as sh()'s runs
  from bert_jax_core import errors  # pylint: disable=g-import-not-at-top
  errors.quiet_third_party_logs()   # Orbax's notes on loading a workdir, as our CLIs do
  if not os.path.isfile(args.manpages_deb):
    print(f"error: --manpages_deb={args.manpages_deb}: no such file; run `apt-get download "
          "manpages-de` and pass the .deb it writes.", file=sys.stderr)
    sys.exit(2)
  out = os.path.abspath(args.out_dir)
  tok = data(out, args)
  held = {lang: f"{out}/records/{lang}/held/*.tfrecord" for lang in LANGS}
  info = {lang: json.load(open(f"{out}/records/{lang}/train/dataset_info.json"))
          for lang in LANGS}
  rows = {lang: sum(int(s["num_instances"]) for s in i["shards"]) for lang, i in info.items()}
  arms = {n: ARMS[n] for n in args.arms.split(",") if n}
  if not arms or set(arms) - set(ARMS):
    print(f"error: --arms={args.arms}: pick from {', '.join(ARMS)}.", file=sys.stderr)
    sys.exit(2)
  results = {}
  for name, tau in arms.items():
    workdir, summary = pretrain(out, name, tau, tok, args)
    results[name] = dict(accuracy(workdir, held, args.eval_rows),
                         wall_time_sec=summary.get("wall_time_sec"),
                         sources=summary.get("sources"))
  print("| language | train records | " + " | ".join(
      f"held-out MLM acc ({n})" for n in arms) + " | " + " | ".join(
          f"held-out MLM loss ({n})" for n in arms) + " | predictions |")
  print("|---|---:|" + "---:|" * (2 * len(arms)) + "---:|")
  for lang in LANGS:
    print(f"| {lang} | {rows[lang]:,} | " + " | ".join(
        f"{results[n][lang][0]:.4f}" for n in arms) + " | " + " | ".join(
            f"{results[n][lang][1]:.3f}" for n in arms)
          + f" | {results[next(iter(arms))][lang][2]:,} |")
  if args.finetune:
    task, labels = korean_task(out)
    with open(f"{task}/dev.csv", encoding="utf-8") as f:
      dev = [l.rsplit(",", 1)[-1].strip() for l in f.read().splitlines()[1:]]
    majority = max(dev.count(label) for label in labels) / len(dev)
    print(f"\nKorean task (which of {len(labels)} konlpy files; {len(dev)} dev lines, majority "
          f"{majority:.4f}): dev accuracy best epoch / last epoch")
    for name in arms:
      results[name]["ko_task"] = finetune_ko(out, name, f"{out}/work_{name}", tok, task, labels,
                                             args.seed)
      r = results[name]["ko_task"]
      print(f"  {name}: {r['best']:.4f} / {r['last']:.4f} ({r['epochs']} epochs)")
  print("RESULT " + json.dumps({"args": vars(args), "train_records": rows, "results": results},
                               default=str))


if __name__ == "__main__":
  main()
