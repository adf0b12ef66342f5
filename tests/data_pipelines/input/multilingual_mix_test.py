"""benchmarks/multilingual_mix.py's own pieces (the runs are the benchmark's): the held-out
masking both arms share, the Korean task's split, and the missing-.deb line."""

import csv
import subprocess
import sys

import numpy as np

from benchmarks import multilingual_mix as mix
from data_pipelines.tokenizers import vocab_base


def _vocab(size=50):
  special = np.zeros(size, bool)
  special[:5] = True
  return vocab_base.VocabInfo(size=size, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                              is_continuation=np.zeros(size, bool), is_special=special,
                              path="", kind="tokenizer_json")


def test_masking_is_one_fixed_draw_of_15_percent_of_the_real_words():
  rng = np.random.default_rng(1)
  ids = np.zeros((3, mix.SEQ), np.int32)
  mask = np.zeros_like(ids)
  for r, n in enumerate((40, 7, 128)):   # [cls] n-2 pieces [sep], then padding
    ids[r, :n] = [2] + list(rng.integers(5, 50, n - 2)) + [3]
    mask[r, :n] = 1
  out, positions, targets, weights = mix.masked(ids, mask, _vocab())
  assert weights.sum(1).tolist() == [6, 1, 19]   # round(0.15 x 38), at least 1, 19 of 126
  for r in range(3):
    k = int(weights[r].sum())
    chosen = positions[r, :k]
    assert (out[r, chosen] == 4).all() and (targets[r, :k] == ids[r, chosen]).all()
    assert ((out[r] != ids[r]).sum() == k) and mask[r, chosen].all()
    assert not np.isin(ids[r, chosen], [0, 1, 2, 3, 4]).any()   # never [cls]/[sep]/padding
  again = mix.masked(ids, mask, _vocab())
  assert all((a == b).all() for a, b in zip(again, (out, positions, targets, weights)))


def test_korean_task_holds_out_the_last_tenth_of_each_file(tmp_path):
  task, labels = mix.korean_task(str(tmp_path))
  assert labels[-1] == "constitution" and len(labels) == 11
  rows = {s: list(csv.DictReader(open(f"{task}/{s}.csv", encoding="utf-8")))
          for s in ("train", "dev")}
  assert {r["label"] for r in rows["dev"]} == set(labels)
  assert len(rows["dev"]) * 8 < len(rows["train"]) < len(rows["dev"]) * 10


def test_missing_deb_is_one_line(tmp_path):
  r = subprocess.run([sys.executable, "-m", "benchmarks.multilingual_mix",
                      f"--manpages_deb={tmp_path}/none.deb", f"--out_dir={tmp_path}/o"],
                     capture_output=True, text=True)
  assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
  assert r.stderr.startswith("error: --manpages_deb=") and "apt-get download" in r.stderr
