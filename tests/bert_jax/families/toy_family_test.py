"""A family is one folder (issue 47): ToyBERT, tests/data/toy_family/toy/ (its record in
__init__.py, its [CLS] head in layers.py), copied as bert_jax/families/toy/ into a copy of the
package and nothing else edited, runs through every program as a user runs them: train, predict
(fill-mask), convert (export to transformers), finetune, export_serving and plan.

The in-process version (families_registry_test) registers the record from inside a test; this
one shows that the folder alone plugs in: the registry finds it, the programs name no family."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
from tests.bert_jax import finetune_test

TOY = os.path.join(tests.DATA, "toy_family", "toy")


def _vocab(directory):
  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + [f"w{i}" for i in range(58)]
  words += ["bad", "good"]
  path = os.path.join(str(directory), "vocab.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(words) + "\n")
  return path


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
  """A copy of bert_jax/ with the toy's folder added: the programs run from it (cwd first on
  sys.path), data_pipelines and bert_jax_core from the repository (PYTHONPATH)."""
  top = tmp_path_factory.mktemp("toy_tree")
  shutil.copytree(os.path.join(tests.ROOT, "bert_jax"), top / "bert_jax",
                  ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copytree(TOY, top / "bert_jax" / "families" / "toy",
                  ignore=shutil.ignore_patterns("__pycache__"))
  return top


def _run(tree, module, *args, drop_xla_flags=False):
  env = dict(os.environ, PYTHONPATH=tests.ROOT, JAX_PLATFORMS="cpu")
  if drop_xla_flags:
    env.pop("XLA_FLAGS", None)   # the planner compiles for TPU chips, not 8 fake CPU devices
  p = subprocess.run([sys.executable, "-m", module, *args], cwd=str(tree), env=env,
                     capture_output=True, text=True, timeout=900, check=False)
  assert p.returncode == 0, (module, p.stdout[-3000:], p.stderr[-3000:])
  return p


@pytest.mark.slow   # six programs in subprocesses, each compiling: ~2-3 min on the 2-core box
def test_a_toy_family_folder_plugs_into_every_program(tree, tmp_path):
  vocab = _vocab(tmp_path)
  # The repository's own tree does not know the toy: only the copy with its folder does.
  assert not os.path.exists(os.path.join(tests.ROOT, "bert_jax", "families", "toy"))
  # --- Pre-training: the preset's family picks the model, its recipe and next commands.
  workdir = str(tmp_path / "pretrain")
  p = _run(tree, "bert_jax.train", "--config=bert_jax/configs/pretrain.py:toy-tiny,runlocal",
           f"--workdir={workdir}", "--config.train_input_files=synthetic",
           f"--config.vocab_file={vocab}", "--config.seq_length=32",
           "--config.max_predictions_per_seq=5", "--config.batch_size=8",
           "--config.num_train_steps=3", "--config.warmup_steps=1", "--config.log_every=1",
           "--config.checkpoint_every=3", "--config.eval_every=1000",
           "--config.async_checkpointing=false")
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  assert summary["final_step"] == 3 and summary["next"][-1].endswith(" (toy)"), summary
  # --- fill-mask through predict, on the workdir.
  p = _run(tree, "bert_jax.predict", f"--init_checkpoint={workdir}", "fill-mask",
           "w1 [MASK] w3 .")
  assert "[MASK]" in p.stdout or "w" in p.stdout, p.stdout
  # --- Export to transformers (the toy's tree is BERT's: BERT's names), read back.
  hf_dir = str(tmp_path / "hf")
  _run(tree, "bert_jax.convert", f"--input={workdir}", f"--output={hf_dir}")
  import transformers  # pylint: disable=g-import-not-at-top
  hf = transformers.BertForMaskedLM.from_pretrained(hf_dir)
  assert hf.config.hidden_size == 64 and hf.config.num_hidden_layers == 2
  # --- Fine-tuning from the workdir: the toy's head, trained.
  data = tmp_path / "sst2"
  data.mkdir()
  finetune_test._sst2(data, np.random.default_rng(0), 8, 8)
  run = str(tmp_path / "finetune")
  _run(tree, "bert_jax.finetune", "--config=bert_jax/configs/finetune.py:glue_sst2,runlocal",
       f"--workdir={run}", f"--config.init_checkpoint={workdir}", f"--config.vocab_file={vocab}",
       f"--config.data_dir={data}", "--config.max_seq_length=32", "--config.batch_size=8",
       "--config.eval_batch_size=8", "--config.num_train_epochs=1", "--config.learning_rate=1e-3",
       "--config.do_predict=false")
  best = json.load(open(os.path.join(run, "summary.json")))["best_checkpoint"]
  recorded = "".join(open(os.path.join(best, n)).read() for n in os.listdir(best)
                     if n.endswith(".json"))
  assert '"family": "toy"' in recorded, recorded
  # --- The fine-tuned classifier served as TFLite, its own check within tolerance.
  out = str(tmp_path / "toy.tflite")
  p = _run(tree, "bert_jax.export_serving", f"--init_checkpoint={best}", f"--output={out}",
           "--max_seq_length=32", "--batch_size=2")
  assert ": within" in p.stdout and os.path.getsize(out) > 10_000, p.stdout
  # --- The planner compiles the toy's step for a TPU slice.
  p = _run(tree, "bert_jax.plan", "--config=bert_jax/configs/pretrain.py:toy-tiny",
           "--topology=v5litepod-4", "--config.model.dtype=bfloat16", "--config.batch_size=16",
           "--config.model.vocab_size=512", drop_xla_flags=True)
  assert "verdict: FITS on v5litepod-4" in p.stdout, p.stdout[-2000:]
