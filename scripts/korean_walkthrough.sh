#!/usr/bin/env bash
# Korean, end to end with every CLI's defaults (docs/non_english.md prints what this printed):
#   corpus (konlpy's bundled constitution + 10 National Assembly bills, ~140 KB)
#   -> vocab (build_vocab sees Hangul and picks a cased WordPiece vocab)
#   -> records (JSONL documents split into sentences by kss)
#   -> pre-train BERT-tiny (short, on CPU) -> fill-mask -> features -> Hugging Face export
#   -> fine-tune (constitution vs bill sentences).
# Extra arguments go to `python -m bert_jax.train`.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" requirements.txt
set -euo pipefail
OUT=${OUT:-runs/korean}
mkdir -p "$OUT"
if [ ! -f "$OUT/corpus/train.jsonl" ]; then
  # konlpy 0.6.0's wheel bundles Korean text (kolaw/constitution.txt, kobill/*.txt); only the
  # wheel is downloaded, none of its (Java) dependencies are installed.
  pip download --no-deps --quiet konlpy==0.6.0 -d "$OUT/download"
  python - "$OUT" <<'PY'
import glob, json, os, random, re, sys, zipfile
out = sys.argv[1]
z = zipfile.ZipFile(glob.glob(f"{out}/download/konlpy-0.6.0-*.whl")[0])
texts = {n: z.read(n).decode("utf-8") for n in z.namelist()
         if re.match(r"konlpy/data/corpus/(kolaw|kobill)/.*\.txt$", n)}
os.makedirs(f"{out}/corpus", exist_ok=True)
docs = []  # (source, text): the constitution per chapter, each bill whole
for name, text in sorted(texts.items()):
  if name.endswith("constitution.txt"):
    docs += [("constitution", c) for c in re.split(r"\n(?=\s*제\d+장 )", text) if c.strip()]
  else:
    docs.append(("bill", text))
random.Random(0).shuffle(docs)
held_out = docs[:3]
for split, part in (("train", docs[3:]), ("eval", held_out)):
  with open(f"{out}/corpus/{split}.jsonl", "w", encoding="utf-8") as f:
    for _, text in part:
      f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
  with open(f"{out}/corpus/{split}.txt", "w", encoding="utf-8") as f:
    f.write("\n".join(text for _, text in part) + "\n")
# Fine-tuning data (GLUE SST-2 format): is a line from the constitution (1) or a bill (0)?
rows = [(" ".join(l.split()), int(src == "constitution")) for src, text in docs
        for l in text.split("\n") if len(l.split()) >= 4]
random.Random(1).shuffle(rows)
os.makedirs(f"{out}/source_task", exist_ok=True)
for split, part in (("dev", rows[:200]), ("train", rows[200:])):
  with open(f"{out}/source_task/{split}.tsv", "w", encoding="utf-8") as f:
    f.write("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in part))
print(f"{len(docs)} documents ({len(docs) - 3} train, 3 held out), {len(rows)} labelled lines")
PY
fi
if [ ! -f "$OUT/vocab.txt" ]; then
  # 8000, not 4000: the default --hangul_coverage reserves the 2,350 KS X 1001 syllables as 가 and
  # ##가 (4,700 pieces), so no held-out word becomes [UNK] for a syllable the 120 KB never shows;
  # the corpus fills ~2,200 more (6,887 in all, under 8000: it has no more pieces to learn).
  python -m data_pipelines.build_vocab --input_file="$OUT/corpus/train.txt" --vocab_size=8000 \
    --output="$OUT/vocab.txt"
fi
for split in train eval; do
  if [ ! -f "$OUT/records/$split/dataset_info.json" ]; then
    python -m data_pipelines.create_pretraining_data --input_format=jsonl \
      --input_file="$OUT/corpus/$split.jsonl" --output_dir="$OUT/records/$split" \
      --vocab_file="$OUT/vocab.txt" --max_seq_length=128 \
      --dupe_factor=$([ $split = train ] && echo 10 || echo 2) --num_shards=2
  fi
done
python - "$OUT" <<'PY'  # [UNK] share of every non-padding id of the records
import glob, sys
import tensorflow as tf
from data_pipelines.tokenizers import vocab
out = sys.argv[1]
unk = vocab.wordpiece_info(f"{out}/vocab.txt").unk_id
for split in ("train", "eval"):
  n = u = 0
  for raw in tf.data.TFRecordDataset(sorted(glob.glob(f"{out}/records/{split}/*.tfrecord"))):
    f = tf.train.Example.FromString(raw.numpy()).features.feature
    ids = [i for i, m in zip(f["input_ids"].int64_list.value, f["input_mask"].int64_list.value)
           if m]
    n, u = n + len(ids), u + ids.count(unk)
  print(f"[UNK] in the {split} records: {u:,} of {n:,} tokens ({u / n:.2%})")
PY
python -m data_pipelines.tokenize --vocab_file="$OUT/vocab.txt" --tokens <<< "대한민국은 민주공화국이다."
nice -n 10 python -m bert_jax.train --config=bert_jax/configs/pretrain.py:tiny,runlocal \
  --workdir="$OUT/workdir" \
  --config.train_input_files="$OUT/records/train/*.tfrecord" \
  --config.eval_input_files="$OUT/records/eval/*.tfrecord" \
  --config.vocab_file="$OUT/vocab.txt" "$@"
python -m bert_jax.predict --init_checkpoint="$OUT/workdir" fill-mask "대한민국은 민주[MASK]이다."
printf '%s\n' "대한민국은 민주공화국이다." "모든 국민은 법 앞에 평등하다." > "$OUT/sentences.txt"
python -m bert_jax.extract_features --init_checkpoint="$OUT/workdir" \
  --input_file="$OUT/sentences.txt" --output_file="$OUT/features.npz"
rm -rf "$OUT/hf"  # convert writes a new directory only
python -m bert_jax.convert --input="$OUT/workdir" --output="$OUT/hf"
python - "$OUT/hf" <<'PY'  # the export in transformers (requirements-test.txt), if installed
import sys
try:
  import transformers
except ImportError:
  sys.exit(print("transformers is not installed (requirements-test.txt): export not loaded"))
transformers.logging.set_verbosity_error()  # its load report lists the unused NSP head
fill = transformers.pipeline("fill-mask", model=sys.argv[1], top_k=3)
print("transformers:", fill.tokenizer.tokenize("대한민국은 민주공화국이다."),
      [(r["token_str"], round(r["score"], 4)) for r in fill("대한민국은 민주[MASK]이다.")])
PY
nice -n 10 python -m bert_jax.finetune --config=bert_jax/configs/finetune.py:glue_sst2,runlocal \
  --config.init_checkpoint="$OUT/workdir" --config.data_dir="$OUT/source_task" \
  --workdir="$OUT/finetune" --config.max_train_examples=0 \
  --config.learning_rate=5e-4 --config.num_train_epochs=3  # BERT-tiny needs a larger rate
