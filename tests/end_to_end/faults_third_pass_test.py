"""Issue 39's careless-user faults, items 3-6 (docs/faults.md names each test here).

  3. Ctrl-C during training saves a checkpoint (as SIGTERM does) and exits with one line; a
     Ctrl-C outside a loop is one line too ("interrupted (Ctrl-C)", exit 130), no traceback.
  4. A byte-level BPE's tokens show as text (' 법률'), not its byte symbols ('Ġë²ķë¥ł'), in
     fill-mask and extract_features.
  5. `--config.FIELD=V` without `--config` says "--config is required"; a tokenizer.json given as
     a vocab.txt points at the tokenizer_json flag; convert names no --vocab_file the user never
     passed.
  6. The former convert aliases (tests/bert_jax/families/electra/convert_electra_test.py) are one-line errors naming the
     one converter.
The unmarked tests are unit tests of a second or less; the slow ones start programs or compile.
"""
import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.parallel import distributed
from bert_jax_core import errors
from data_pipelines.tokenizers import tokenizer_json as tj
from data_pipelines.tokenizers import vocab as vocab_lib

ROOT = tests.ROOT
KOREAN = os.path.join(ROOT, "tests", "data", "korean", "1809890.txt")
_CPP_LOG = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages before absl::InitializeLog)")


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  for name in ("BERT_JAX_COORDINATOR", "BERT_JAX_NUM_PROCESSES", "BERT_JAX_PROCESS_ID"):
    env.pop(name, None)
  return env


def _python_lines(stderr):
  """stderr without the C++ runtimes' own start-up log lines (not ours)."""
  return [l for l in stderr.splitlines() if l.strip() and not _CPP_LOG.match(l)]


@pytest.fixture(scope="module")
def byte_level_korean(tmp_path_factory):
  """A byte-level BPE tokenizer.json (ModernBERT's kind) of 1,600 ids learned on a Korean bill."""
  with open(KOREAN, encoding="utf-8") as f:
    lines = [l.strip() for l in f if l.strip()]
  text, _ = tj.learn(lines, 1600, model_type="bpe", byte_level=True, lower_case=False)
  path = str(tmp_path_factory.mktemp("bytes") / "tokenizer.json")
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return path


# ----------------------------------------------------------------------------------------------
# 3. Ctrl-C.
# ----------------------------------------------------------------------------------------------
def test_ctrl_c_stops_the_loop_like_sigterm_and_the_handlers_are_put_back():
  seen = []
  previous = signal.signal(signal.SIGINT, lambda *a: seen.append("mine"))
  try:
    mine = signal.getsignal(signal.SIGINT)
    with distributed.preemption_check() as preempted:
      assert signal.getsignal(signal.SIGINT) is not mine
      assert not preempted(1)
      os.kill(os.getpid(), signal.SIGINT)
      assert preempted(2) and preempted.signal_name == "Ctrl-C (SIGINT)" and seen == []
      # A second Ctrl-C (while the step saves) is the previous handler's again: a user can quit.
      os.kill(os.getpid(), signal.SIGINT)
      assert seen == ["mine"]
    assert signal.getsignal(signal.SIGINT) is mine   # left as it was found
    with distributed.preemption_check() as preempted:
      os.kill(os.getpid(), signal.SIGTERM)
      assert preempted(1) and preempted.signal_name == "SIGTERM"
  finally:
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_outside_a_training_loop_is_one_line_and_exit_130(capsys):
  def main(argv):
    del argv
    raise KeyboardInterrupt   # e.g. while the step compiles, before the loop's handler
  with pytest.raises(SystemExit) as e:
    errors.run_main(main, ["prog"])
  assert e.value.code == 130
  assert capsys.readouterr().err == "interrupted (Ctrl-C)\n"


_SIGINT_AT_BATCH_4 = """
import os, signal, sys
from bert_jax import cli
from bert_jax.training import input_source
real = input_source.make_batches
def ctrl_c_at_batch_4(*args, **kwargs):   # as tests/testlib/sigterm_testlib.py, with SIGINT
  for i, b in enumerate(real(*args, **kwargs)):
    if kwargs["start_batch"] == 0 and i == 4:
      os.kill(os.getpid(), signal.SIGINT)
    yield b
input_source.make_batches = ctrl_c_at_batch_4
sys.argv = ["bert-jax-train", *sys.argv[1:]]
cli.train()
"""


@pytest.mark.slow
def test_ctrl_c_during_pretraining_saves_and_exits_in_one_line(tmp_path):
  """bert-jax-train on tiny synthetic data, Ctrl-C while batch 5 is read: the loop saves step 5,
  prints one line saying so and exits 0, no KeyboardInterrupt traceback (was: a traceback, exit
  130, nothing saved). The re-run resumes from step 5 and finishes."""
  script = tmp_path / "ctrl_c.py"
  script.write_text(_SIGINT_AT_BATCH_4)
  workdir = tmp_path / "run"
  flags = ["--config=bert_jax/configs/pretrain.py:tiny,runlocal",
           "--config.train_input_files=synthetic", "--config.num_train_steps=7",
           "--config.warmup_steps=1", "--config.checkpoint_every=100", "--config.log_every=1",
           "--config.batch_size=8", "--config.seq_length=32",
           "--config.max_predictions_per_seq=5", f"--workdir={workdir}"]
  first = subprocess.run([sys.executable, str(script), *flags], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=600, check=False)
  assert first.returncode == 0, first.stderr[-3000:]
  assert "Traceback" not in first.stderr and "KeyboardInterrupt" not in first.stderr
  said = [l for l in first.stdout.splitlines() if "Ctrl-C" in l]
  assert said == ["Ctrl-C (SIGINT): saving step 5 and exiting; re-run the same command to "
                  "resume"], first.stdout
  assert sorted(os.listdir(workdir / "checkpoints")) == ["5"]
  again = subprocess.run([sys.executable, "-m", "bert_jax.train", *flags], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=600, check=False)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "step 6/7" in again.stdout and "step 5/7" not in again.stdout


@pytest.mark.slow
def test_ctrl_c_during_fine_tuning_saves_and_the_rerun_resumes(tmp_path, monkeypatch, capsys):
  """finetune shares the loop's check: Ctrl-C while batch 5 is read saves step 5 with one line,
  the SIGINT handler is Python's again after, and the same call resumes from step 5."""
  import jax  # pylint: disable=g-import-not-at-top
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test as ft  # pylint: disable=g-import-not-at-top
  from tests.testlib import tasks_testlib  # pylint: disable=g-import-not-at-top
  vocab_file = tasks_testlib.write_vocab(str(tmp_path), " ".join(ft.WORDS) + " .")
  size = tasks_testlib.ReferenceTokenizer(vocab_file).vocab.size
  cfg = model_lib.get_bert_config("tiny", vocab_size=size, max_position_embeddings=128,
                                  hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2)
  export = ckpt_lib.save_params(str(tmp_path / "export"), nn.unbox(pretraining_heads.init_params(
      cfg, jax.random.PRNGKey(0))), cfg, meta={"do_lower_case": True})
  data = tmp_path / "SST-2"
  data.mkdir()
  ft._sst2(data, np.random.default_rng(1), 64, 8)  # pylint: disable=protected-access
  config = ft._config("glue_sst2", (export, vocab_file), data,  # pylint: disable=protected-access
                      num_train_epochs=1.0, do_predict=False, log_every=1)
  calls, real_batch = {"n": 0}, finetune._host_batch  # pylint: disable=protected-access

  def host_batch(*args, **kwargs):
    calls["n"] += 1
    if calls["n"] == 5:
      os.kill(os.getpid(), signal.SIGINT)
    return real_batch(*args, **kwargs)

  monkeypatch.setattr(finetune, "_host_batch", host_batch)
  before = signal.getsignal(signal.SIGINT)
  first = finetune.finetune(config, str(tmp_path / "run"))
  assert signal.getsignal(signal.SIGINT) is before
  assert first["stopped_early"] and first["steps"] == 5, first
  said = [l for l in capsys.readouterr().out.splitlines() if "Ctrl-C" in l]
  assert said == ["Ctrl-C (SIGINT): saved step 5 (epoch 1); re-run the same command to resume"]
  monkeypatch.setattr(finetune, "_host_batch", real_batch)
  second = finetune.finetune(config, str(tmp_path / "run"))
  assert not second["stopped_early"] and second["steps"] == 8
  assert "resuming from step 5" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# 4. A byte-level BPE's tokens as text.
# ----------------------------------------------------------------------------------------------
def test_byte_level_tokens_show_as_text_not_byte_symbols(byte_level_korean):
  tok = tj.JsonTokenizer(byte_level_korean)
  assert tok.alphabet == "bytes"
  text = "대한민국 국회는 법률안을 의결한다"
  ids = tok.encode([text])[0]
  pieces, shown = tok.id_to_token(ids), tok.token_texts(ids)
  assert any("Ġ" in p for p in pieces)   # the raw pieces are byte symbols ...
  assert not any("Ġ" in s or "\ufffd" in s for s in shown), shown   # ... what is shown is not
  # Each piece reads as the decoder says, or (a piece cutting a syllable's bytes) as its bytes.
  for i, s in zip(ids, shown):
    decoded = tok._tok.decode([i])  # pylint: disable=protected-access
    assert s == decoded if "\ufffd" not in decoded else re.search(r"<0x[0-9A-F]{2}>", s)
  # The file's whole-syllable word pieces show as those words, their space the word start.
  starts = [i for i, t in enumerate(tok.tokens) if t.startswith("Ġ") and len(t) > 1]
  words = [s for s in tok.token_texts(starts) if re.fullmatch(r" [\uac00-\ud7a3]+", s)]
  assert len(words) > 20, tok.token_texts(starts)[:20]
  assert " 법률" in words   # 'Ġë²ķë¥ł'
  # Specials and ids past the file (a model's padded rows) as id_to_token.
  assert tok.token_texts([tok.vocab.mask_id, 10 ** 6]) == ["[MASK]", ""]


def _tiny_model(vocab_size):
  import jax  # pylint: disable=g-import-not-at-top
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  cfg = model_lib.get_bert_config("tiny", vocab_size=vocab_size, hidden_size=32, num_heads=2,
                                  intermediate_size=64, num_layers=2, max_position_embeddings=64)
  params = jax.tree.map(np.asarray, nn.unbox(pretraining_heads.init_params(
      cfg, jax.random.PRNGKey(0))))
  return cfg, params


@pytest.mark.slow
def test_fill_mask_and_features_of_a_byte_level_bpe_print_text(byte_level_korean):
  """bert_jax.predict's candidates and extract_features' tokens of a byte-level tokenizer.json
  are text (was: 'Ġìŀħëł¥' for ' 입력')."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import extract_features as ef  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  tok = tj.JsonTokenizer(byte_level_korean)
  cfg, params = _tiny_model(tok.vocab.size)
  predictor = inference.InferenceModel(
      params=jax.tree.map(np.asarray, params), config=cfg, tokenizer=tok, vocab_file=None,
      spm_model_file=None, do_lower_case=False, casing_source="test", meta={}, path="",
      tokenizer_json=byte_level_korean)
  result = predict.predict(predictor, "국회는 [MASK] 의결한다", top_k=200)
  shown = [t for t, _, _ in result["masks"][0]]
  assert shown == tok.token_texts([i for _, i, _ in result["masks"][0]])
  assert any(re.search(r"[\uac00-\ud7a3]", t) for t in shown), shown   # Hangul text
  printed = predict.format_prediction(result)
  assert not re.search("[Ġìëíê]", printed), printed
  out, _ = ef.extract([("국회는 법률안을 의결한다".split(), None)], tok, params["bert"], cfg,
                      layers=(-1,), pooling="concat", max_seq_length=64, batch_size=1)
  tokens = list(out["tokens"])
  assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
  assert not any("Ġ" in t for t in tokens), tokens
  assert re.search(r"[\uac00-\ud7a3]", "".join(tokens)), tokens


# ----------------------------------------------------------------------------------------------
# 5. Flags.
# ----------------------------------------------------------------------------------------------
def test_a_config_override_without_config_says_config_is_required(capsys):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  # pylint: disable=protected-access
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "Config file, e.g. x.py:tiny.", flag_values=fv)
  with pytest.raises(SystemExit) as e:
    errors._check_overrides_have_config(["prog", "--config.batch_size=8", "--workdir=w"],
                                        ["config"], fv)
  assert e.value.code == 2
  assert capsys.readouterr().err == (
      "error: --config is required: --config.batch_size sets a field of it. Config file, "
      "e.g. x.py:tiny.\n")
  for given in (["--config=x.py", "--config.batch_size=8"], ["--config", "x.py"], []):
    errors._check_overrides_have_config(["prog", *given], ["config"], fv)


@pytest.mark.slow
def test_a_forgotten_config_is_one_line_for_train_finetune_plan_and_their_scripts():
  """python -m bert_jax.{train,finetune,plan} and bert-jax-{train,finetune,plan} given
  --config.batch_size=8 but no --config (was: "Unknown command line flag 'config.batch_size'")."""
  script = "import sys; from bert_jax import cli; sys.argv[0] = {0!r}; cli.{1}()"
  runs = {}
  for program in ("train", "finetune", "plan"):
    extra = ["--topology=v5litepod-8"] if program == "plan" else []
    runs[f"-m {program}"] = ["-m", f"bert_jax.{program}", "--config.batch_size=8", *extra]
    runs[f"bert-jax-{program}"] = ["-c", script.format(f"bert-jax-{program}", program),
                                   "--config.batch_size=8", *extra]
  procs = {}
  for name, argv in runs.items():   # two at a time: each start-up imports JAX
    procs[name] = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=_env(), text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if len(procs) % 2 == 0:
      for p in procs.values():
        p.wait(timeout=300)
  for name, p in procs.items():
    _, stderr = p.communicate(timeout=300)
    lines = _python_lines(stderr)
    assert p.returncode == 2 and len(lines) == 1, (name, stderr)
    assert lines[0].startswith("error: --config is required: --config.batch_size sets a field "
                               "of it."), (name, lines)


def test_a_tokenizer_json_given_as_a_vocab_file_names_the_tokenizer_json_flag(byte_level_korean):
  """Was: "missing special token(s) [PAD], [UNK], [CLS], [SEP], [MASK]", which the file has."""
  path = byte_level_korean
  with pytest.raises(vocab_lib.VocabError) as e:
    vocab_lib.load_vocab_info(vocab_file=path)
  assert str(e.value) == (f"--vocab_file={path}: a Hugging Face tokenizer.json, not a WordPiece "
                          f"vocab.txt; pass it as --tokenizer_json={path}.")
  with pytest.raises(vocab_lib.VocabError, match=r"^--config\.vocab_file=.* pass it as "
                                                 r"--config\.tokenizer_json="):
    vocab_lib.load_vocab_info(vocab_file=path, prefix="--config.")
  # convert has no --tokenizer_json flag: it does not name one.
  from bert_jax.convert import formats  # pylint: disable=g-import-not-at-top
  with pytest.raises(formats.ConversionError) as e:
    formats.read_vocab(path)
  assert "tokenizer.json, not a WordPiece vocab.txt" in str(e.value)
  assert "--tokenizer_json" not in str(e.value)
  # A vocab.txt whose first token is "{" is still a vocab.txt.
  odd = os.path.join(os.path.dirname(path), "vocab.txt")
  with open(odd, "w", encoding="utf-8") as f:
    f.write("{\n[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
  assert vocab_lib.load_vocab_info(vocab_file=odd).size == 6


def test_convert_names_no_vocab_file_flag_the_user_did_not_pass(tmp_path):
  """A checkpoint folder's own vocab.txt that is bad, or missing: the error names the file or
  the folder (was: "--vocab_file=DIR/vocab.txt: ...", a flag the user never passed)."""
  # pylint: disable=protected-access
  from bert_jax.convert import formats  # pylint: disable=g-import-not-at-top
  from bert_jax.convert import writing  # pylint: disable=g-import-not-at-top
  base = tmp_path / "hf"
  base.mkdir()
  (base / "vocab.txt").write_text("[PAD]\n[UNK]\nw\nw\n")
  with pytest.raises(formats.ConversionError) as e:
    writing._read_tokenizer(str(base), None, None, "config.json")
  assert str(e.value).startswith(f"{base / 'vocab.txt'}: token 'w' is listed twice")
  with pytest.raises(formats.ConversionError, match=r"^--vocab_file=.*listed twice"):
    writing._read_tokenizer(str(base), str(base / "vocab.txt"), None, "config.json")
  os.remove(base / "vocab.txt")
  with pytest.raises(formats.ConversionError) as e:
    writing._read_tokenizer(str(base), None, None, "config.json")
  assert str(e.value).startswith(f"{base}: no vocab.txt (or SentencePiece .model) beside")
  assert "--vocab_file=" not in str(e.value)
