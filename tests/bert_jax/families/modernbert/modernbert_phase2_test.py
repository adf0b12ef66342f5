"""ModernBERT's two pre-training phases: the first as the defaults of the modernbert-base and
-large presets (families/modernbert/ PHASE1, BATCH_WARMUP), its steps recounted from the yamls'
tokens under the batch-size warmup; the context extension as the `phase2` variant
(families/modernbert/ phase2, train.model_from_init_checkpoint): the recipe's values, the global
layers' RoPE theta raised from
the first phase's checkpoint with one line said, every other architecture field the
checkpoint's, and the export after phase 2 carrying the new theta so transformers computes what
we compute.

End to end (slow): a byte-level BPE tokenizer.json learned on the standard library's docstrings
(tests/bert_jax/families/modernbert/modernbert_cli_test.py's, ModernBERT's kind), modernbert-tiny trained 3 steps at 64 tokens
(theta 10,000 on every layer, the first phase), then `phase2` at 256 tokens from that workdir
(theta 160,000 on layers 0; 1 and 2 keep 10,000) and from its transformers export, then exported:
transformers' ModernBertForMaskedLM gives our MLM logits within 1e-4 on rows of 200 tokens.
"""

import json
import os

import numpy as np
import pytest

from bert_jax.training import batch_warmup
from bert_jax import cli
from bert_jax.models import model as model_lib
from bert_jax.training import optimizer as opt_lib
from bert_jax import train
from bert_jax.configs import pretrain
from bert_jax.families import modernbert

TOL = 1e-4


# ----------------------------------------------------------------------------------------------
# The recipe (Warner et al. 2024, Table 3).
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset,batch,first,lr,warmup,steps", [
    ("modernbert-base", 4_608, 768, 8e-4, 3_815, 374_901),     # modernbert-base-pretrain.yaml
    ("modernbert-large", 4_928, 448, 5e-4, 1_666, 342_631)])   # modernbert-large-pretrain.yaml
def test_the_first_phase_is_the_presets_default(preset, batch, first, lr, warmup, steps):
  c = pretrain.get_config(preset)
  assert (c.seq_length, c.max_predictions_per_seq, c.masked_lm_prob) == (1_024, 312, 0.3)
  assert (c.optimizer, c.b1, c.b2, c.eps, c.weight_decay, c.weight_decay_all_tensors) == (
      "stable_adamw", 0.9, 0.98, 1e-6, 1e-5, False)
  assert (c.schedule, c.decay_steps, c.final_lr_fraction) == ("wsd", 0, 0.0)
  assert (c.batch_size, c.batch_size_warmup_min_size, c.learning_rate) == (batch, first, lr)
  assert (c.warmup_steps, c.num_train_steps) == (warmup, steps)
  # The yamls' durations are tokens: the step at which the tokens trained on (the ramp's smaller
  # steps counted) first reach 3B | 2B (warmup) and 1.719T (the phase).
  ramp = batch_warmup.from_config(c)
  tokens = lambda s: ramp.rows_through(s) * c.seq_length  # noqa: E731
  warmup_tokens = modernbert.PHASE1_RATES[preset][2]
  assert tokens(warmup - 1) < warmup_tokens <= tokens(warmup)
  assert tokens(steps - 1) < modernbert.PHASE1_TOKENS <= tokens(steps)
  # wsd with decay_steps 0: linear warmup, then the peak to the last step (no decay piece).
  tx, schedule = opt_lib.from_config(c, num_train_steps=c.num_train_steps,
                                     warmup_steps=c.warmup_steps)
  del tx
  np.testing.assert_allclose([schedule(s) for s in (0, warmup // 2, warmup, steps // 2, steps)],
                             [0.0, lr * (warmup // 2) / warmup, lr, lr, lr], rtol=1e-5)


def test_runlocal_and_the_cpu_presets_keep_what_they_had():
  # runlocal still shrinks base to a laptop's run (the rest of the first phase's recipe stays).
  c = pretrain.get_config("modernbert-base,runlocal")
  assert (c.seq_length, c.max_predictions_per_seq, c.batch_size, c.batch_size_warmup_min_size,
          c.num_train_steps, c.warmup_steps, c.learning_rate) == (128, 39, 32, 0, 1_500, 150,
                                                                   1e-3)
  assert (c.optimizer, c.schedule, c.decay_steps) == ("stable_adamw", "wsd", 0)
  # tiny and mini keep BERT's loop (the quick start's and the CPU tests' values).
  for preset in ("modernbert-tiny", "modernbert-mini"):
    t = pretrain.get_config(preset)
    assert (t.seq_length, t.max_predictions_per_seq, t.batch_size, t.optimizer, t.schedule,
            t.learning_rate, t.warmup_steps, t.num_train_steps) == (128, 39, 256, "adamw",
                                                                    "linear", 1e-4, 10_000,
                                                                    900_000)


def test_help_shows_the_first_phase_as_the_presets_defaults():
  out = cli.config_help(pretrain.__file__, "modernbert-base")
  for flag in ("--config.seq_length=1024", "--config.max_predictions_per_seq=312",
               "--config.optimizer='stable_adamw'", "--config.learning_rate=0.0008",
               "--config.b2=0.98", "--config.weight_decay=1e-05", "--config.schedule='wsd'",
               "--config.warmup_steps=3815", "--config.num_train_steps=374901",
               "--config.decay_steps=0", "--config.batch_size=4608"):
    assert f"  {flag} " in out or f"  {flag}\n" in out, flag


@pytest.mark.parametrize("preset,rows,steps,decay,lr,wd", [
    # The yamls' global_train_batch_size (8 GPUs x Table 3's 72 | 77): 300B / (576 x 8,192),
    # the last 50B of it decaying.
    ("modernbert-base", 576, 63_578, 10_596, 3e-4, 1e-5),
    ("modernbert-large", 616, 59_449, 9_908, 5e-5, 1e-6)])
def test_phase2_is_the_context_extension(preset, rows, steps, decay, lr, wd):
  c = pretrain.get_config(f"{preset},phase2")
  assert (c.seq_length, c.max_predictions_per_seq) == (8_192, 2_498)   # int(0.305 x 8,192)
  assert c.model.rope_theta_global == 160_000.0 and c.masked_lm_prob == 0.3
  assert (c.batch_size, c.num_train_steps, c.decay_steps) == (rows, steps, decay)
  assert (c.learning_rate, c.weight_decay, c.warmup_steps) == (lr, wd, 0)
  assert (c.schedule, c.optimizer, c.b2, c.eps, c.final_lr_fraction) == (
      "wsd", "stable_adamw", 0.98, 1e-6, 0.001)   # alpha_f 0.001
  # The first phase trains from scratch at the preset's theta, 10,000 on every layer.
  first = pretrain.get_config(preset)
  assert first.model.rope_theta_global is None
  cfg = model_lib.get_bert_config(preset)
  assert (cfg.rope_theta_global, cfg.rope_theta_local) == (10_000.0, 10_000.0)


def test_the_decay_follows_num_train_steps_and_bert_keeps_its_phase2():
  c = pretrain.get_config("modernbert-tiny,phase2,runlocal")
  assert (c.seq_length, c.num_train_steps, c.decay_steps) == (1_024, 1_500, 250)   # its limit
  c.num_train_steps = 60
  assert c.decay_steps == 10
  bert = pretrain.get_config("base,phase2")
  assert (bert.seq_length, bert.max_predictions_per_seq, bert.num_train_steps) == (512, 80,
                                                                                  100_000)
  assert bert.schedule == "linear" and "rope_theta_global" not in bert.model
  with pytest.raises(ValueError, match="no context-extension recipe for neobert"):
    pretrain.get_config("neobert,phase2")


# ----------------------------------------------------------------------------------------------
# The init-checkpoint check, on a stored config (no arrays).
# ----------------------------------------------------------------------------------------------
class _Described:
  def __init__(self, config):
    self.config = config


def _from(monkeypatch, stored, preset="modernbert-tiny", variant="", **model):
  monkeypatch.setattr(train.ckpt_lib, "describe", lambda path, verify=False: _Described(stored))
  c = pretrain.get_config(preset + variant)
  c.init_checkpoint = "/nonexistent/phase1"
  for k, v in model.items():
    setattr(c.model, k, v)
  preset_config = model_lib.get_bert_config(preset, vocab_size=stored.vocab_size)
  return train.model_from_init_checkpoint(c, preset_config)


def test_raised_theta_is_taken_and_said_in_one_line(monkeypatch, capsys):
  phase1 = model_lib.get_bert_config("modernbert-tiny", vocab_size=405)
  got = _from(monkeypatch, phase1, variant=",phase2")
  assert got.rope_theta_global == 160_000.0 and got.rope_theta_local == 10_000.0
  assert capsys.readouterr().out.splitlines() == [
      "RoPE theta of the global layers: 10000 in the checkpoint -> 160000 now (context "
      "extension)"]
  assert got.to_dict() == {**phase1.to_dict(), "rope_theta_global": 160_000.0}


def test_the_checkpoints_modern_fields_stay_unless_theta_is_set(monkeypatch, capsys):
  """Continued pre-training from a released ModernBERT (theta 160,000, here also a window of
  32 and a local theta of 20,000) on the plain preset keeps all of them: the preset's 10,000
  and window 16 do not replace what the weights were trained with (they did before)."""
  released = model_lib.get_bert_config("modernbert-tiny", vocab_size=405, local_window=32,
                                       rope_theta_global=160_000.0, rope_theta_local=20_000.0)
  got = _from(monkeypatch, released)
  assert (got.rope_theta_global, got.rope_theta_local, got.local_window) == (160_000.0,
                                                                             20_000.0, 32)
  assert capsys.readouterr().out == ""
  same = _from(monkeypatch, released, variant=",phase2")   # 160,000 already: nothing to say
  assert same.to_dict() == got.to_dict() and capsys.readouterr().out == ""


def test_other_differences_are_still_refused(monkeypatch):
  phase1 = model_lib.get_bert_config("modernbert-tiny", vocab_size=405)
  with pytest.raises(train.ConfigError, match="another model size"):
    _from(monkeypatch, phase1, preset="modernbert-mini", variant=",phase2")
  with pytest.raises(train.ckpt_lib.CheckpointError, match="hidden_act='gelu'"):
    _from(monkeypatch, phase1, variant=",phase2", hidden_act="relu")
  bert = model_lib.get_bert_config("tiny", vocab_size=405)
  monkeypatch.setattr(train.ckpt_lib, "describe", lambda path, verify=False: _Described(bert))
  c = pretrain.get_config("tiny")
  c.init_checkpoint = "/nonexistent/bert"   # BERT's config has no theta: nothing to check
  assert train.model_from_init_checkpoint(c, bert).to_dict() == bert.to_dict()


# ----------------------------------------------------------------------------------------------
# End to end: phase 1 at 64 tokens, phase 2 at 256, export, transformers.
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def phase1(tmp_path_factory):
  from data_pipelines import create_pretraining_data as cpd  # pylint: disable=g-import-not-at-top
  from tests.bert_jax.families.modernbert.modernbert_cli_test import _docstring_lines, modernbert_style_tokenizer  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("phase2")
  lines = _docstring_lines()
  tokenizer = str(root / "tokenizer.json")
  modernbert_style_tokenizer(lines).save(tokenizer)
  (root / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  for seq in (64, 256):
    cpd.run(cpd.Config(input_file=str(root / "corpus.txt"), output_dir=str(root / f"r{seq}"),
                       tokenizer_json=tokenizer, no_nsp=True, max_seq_length=seq,
                       dupe_factor=1, num_shards=1), show_progress=False)
  c = _run_config("modernbert-tiny,runlocal", root, tokenizer, 64, steps=3)
  assert c.model.rope_theta_global is None
  workdir = str(root / "phase1")
  assert train.train_and_evaluate(c, workdir)["final_step"] == 3
  return dict(root=root, tokenizer=tokenizer, workdir=workdir)


def _run_config(arg, root, tokenizer, seq, steps):
  c = pretrain.get_config(arg)
  c.tokenizer_json = tokenizer
  c.train_input_files = str(root / f"r{seq}" / "*")
  c.seq_length, c.max_predictions_per_seq, c.batch_size = seq, int(0.305 * seq), 8
  c.num_train_steps, c.warmup_steps, c.log_every, c.checkpoint_every = steps, 0, 1, steps
  c.eval_every, c.async_checkpointing, c.shuffle_buffer = 1000, False, 100
  return c


def _logits(params, config, ids, mask):
  from tests.bert_jax.families.modernbert.modernbert_test import _ours  # pylint: disable=g-import-not-at-top
  return _ours(params, config, ids, mask)[1]


@pytest.mark.slow
def test_phase2_from_the_workdir_exports_what_transformers_computes(phase1, capsys):
  import copy  # pylint: disable=g-import-not-at-top
  import dataclasses  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_jax import convert  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  root = phase1["root"]
  c = _run_config("modernbert-tiny,phase2,runlocal", root, phase1["tokenizer"], 256, steps=2)
  assert (c.model.rope_theta_global, c.schedule, c.decay_steps) == (160_000.0, "wsd", 0)
  c.init_checkpoint = phase1["workdir"]
  workdir = str(root / "phase2")
  capsys.readouterr()
  out = train.train_and_evaluate(c, workdir)
  said = capsys.readouterr().out.splitlines()
  assert out["final_step"] == 2 and np.isfinite(out["history"]["train"][-1][1]["loss"])
  assert ("RoPE theta of the global layers: 10000 in the checkpoint -> 160000 now (context "
          "extension)") in said
  # The same command again: the workdir's checkpoint is of this model (theta 160,000).
  assert train.train_and_evaluate(c, workdir).get("nothing_to_do")

  m = inference.load_for_inference(workdir)
  assert (m.config.rope_theta_global, m.config.rope_theta_local) == (160_000.0, 10_000.0)
  hf_dir = convert.export_model_to_hf(m, str(root / "hf2"), workdir)
  with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
    written = json.load(f)
  assert written["rope_parameters"]["full_attention"]["rope_theta"] == 160_000.0
  assert written["rope_parameters"]["sliding_attention"]["rope_theta"] == 10_000.0
  assert (written["global_rope_theta"], written["local_rope_theta"]) == (160_000.0, 10_000.0)
  hf = transformers.ModernBertForMaskedLM.from_pretrained(hf_dir, attn_implementation="eager")
  assert hf.config.rope_parameters["full_attention"]["rope_theta"] == 160_000.0
  ids = np.random.default_rng(0).integers(5, 400, (2, 200))
  mask = np.ones_like(ids)
  mask[1, 150:] = 0
  with torch.no_grad():
    theirs = hf.eval()(input_ids=torch.tensor(ids),
                       attention_mask=torch.tensor(mask)).logits.numpy()
  real = mask.astype(bool)
  np.testing.assert_allclose(_logits(m.params, m.config, ids, mask)[real], theirs[real],
                             atol=TOL, rtol=TOL)
  # The check can fail: 5 steps from a 0.02-stddev init leave attention near uniform, so theta
  # moves these logits by ~2e-4 only. With query and key kernels x 8 (sharp attention) the
  # export still equals ours, and at the first phase's theta the logits are others.
  sharp = copy.deepcopy(m.params)
  for i in range(m.config.num_layers):
    attention = sharp["bert"]["encoder"][f"layer_{i}"]["attention"]
    for name in ("query", "key"):
      attention[name]["kernel"] = np.asarray(attention[name]["kernel"]) * 8.0
  sharp_dir = convert.export_model_to_hf(dataclasses.replace(m, params=sharp),
                                         str(root / "hf2-sharp"), workdir)
  hf = transformers.ModernBertForMaskedLM.from_pretrained(sharp_dir, attn_implementation="eager")
  with torch.no_grad():
    theirs = hf.eval()(input_ids=torch.tensor(ids),
                       attention_mask=torch.tensor(mask)).logits.numpy()
  np.testing.assert_allclose(_logits(sharp, m.config, ids, mask)[real], theirs[real],
                             atol=TOL, rtol=TOL)
  old = _logits(sharp, dataclasses.replace(m.config, rope_theta_global=10_000.0), ids, mask)
  assert np.abs(old[real] - theirs[real]).max() > 100 * TOL


@pytest.mark.slow
def test_phase2_from_the_first_phases_transformers_export(phase1, monkeypatch, capsys):
  """The first phase exported to transformers (config.json: theta 10,000, both spellings) is a
  start for phase 2 too: converted once, theta raised with the same line, nothing else moved."""
  from bert_jax import convert  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("BERT_JAX_CACHE", str(phase1["root"] / "cache"))
  m = inference.load_for_inference(phase1["workdir"])
  assert m.config.rope_theta_global == 10_000.0
  hf_dir = convert.export_model_to_hf(m, str(phase1["root"] / "hf1"), phase1["workdir"])
  with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["global_rope_theta"] == 10_000.0
  c = _run_config("modernbert-tiny,phase2,runlocal", phase1["root"],
                  os.path.join(hf_dir, "tokenizer.json"), 256, steps=2)
  c.init_checkpoint = hf_dir
  vocab = train.load_vocab(c)
  capsys.readouterr()
  got = train.model_from_init_checkpoint(c, train.create_model_config(c, vocab))
  assert got.to_dict() == {**m.config.to_dict(), "rope_theta_global": 160_000.0}
  assert ("RoPE theta of the global layers: 10000 in the checkpoint -> 160000 now (context "
          "extension)") in capsys.readouterr().out.splitlines()
