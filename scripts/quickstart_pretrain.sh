#!/usr/bin/env bash
# Quick start, command 1: a real small pre-training on CPU, from an empty machine.
# Rows are packed (several instances per row, docs/packing.md): pass --config.pack=false to compare.
#   1. builds a real English corpus (the docstrings of Python's standard library),
#   2. learns a WordPiece vocabulary from it,
#   3. creates NSP pre-training records (train: 3 shards of text, held-out eval: 1),
#   4. pre-trains BERT-tiny for 1,500 steps (a few minutes), printing progress and held-out MLM
#      accuracy, and ends with a summary (time, final evaluation, where the model is, the next
#      commands), also written to runs/quickstart/workdir/summary.json.
# Interrupted, run it again and it resumes from the last Orbax checkpoint in
# runs/quickstart/workdir. Finished, a second run trains nothing and says so; to train further
# raise the total, e.g. `bash scripts/quickstart_pretrain.sh --config.num_train_steps=3000`
# (resumes at step 1,500; the learning-rate decay is stretched to the new total).
# Extra arguments go to `python -m bert_jax.train`.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" requirements.txt
OUT=runs/quickstart
mkdir -p "$OUT"
if [ ! -f "$OUT/corpus/stdlib-03-of-04.txt" ]; then
  python -m data_pipelines.stdlib_corpus --output_dir="$OUT/corpus" --num_files=4
fi
if [ ! -f "$OUT/vocab.txt" ]; then
  python -m data_pipelines.build_vocab --input_file="$OUT/corpus/stdlib-0[0-2]-of-04.txt" \
    --vocab_size=5000 --lower_case --output="$OUT/vocab.txt"
fi
if [ ! -f "$OUT/records/train/dataset_info.json" ]; then
  python -m data_pipelines.create_pretraining_data \
    --input_file="$OUT/corpus/stdlib-0[0-2]-of-04.txt" --output_dir="$OUT/records/train" \
    --vocab_file="$OUT/vocab.txt" --do_lower_case=true --max_seq_length=128 \
    --dupe_factor=5 --num_shards=4 --num_workers=2
fi
if [ ! -f "$OUT/records/eval/dataset_info.json" ]; then
  python -m data_pipelines.create_pretraining_data \
    --input_file="$OUT/corpus/stdlib-03-of-04.txt" --output_dir="$OUT/records/eval" \
    --vocab_file="$OUT/vocab.txt" --do_lower_case=true --max_seq_length=128 \
    --dupe_factor=1 --num_shards=1 --num_workers=1
fi
python -m bert_jax.train --config=bert_jax/configs/pretrain.py:tiny,runlocal \
  --workdir="$OUT/workdir" \
  --config.train_input_files="$OUT/records/train/*.tfrecord" \
  --config.eval_input_files="$OUT/records/eval/*.tfrecord" \
  --config.vocab_file="$OUT/vocab.txt" "$@"
