"""bert_jax.plan on a fine-tuning config (bert_jax/planning/plan_finetune.py): the embedding task's
training step compiled for a TPU slice with libtpu, GradCache's beside the unchunked one.

libtpu comes with requirements-test.txt (plan_test.py's rule: these skip locally without it and
FAIL in CI). The CLI test comes first, before this process loads libtpu itself (plan_test.py).
What the compile costs: BERT-tiny at vocab 512, 512 rows of 2 x 32 tokens on one v5e chip, both
steps: ~90 s of CPU (2026-11-27, 2-core VM; 5.5 min of wall on the loaded box). Smaller batches
do not show GradCache's point: at 64 rows a chip of 2 x 64 tokens libtpu kept the unchunked
step's temporaries at 9 MB and GradCache's at 12 MB (the gradient accumulator and the whole
batch's embeddings are a tiny model's activations' size), at 512 rows 334 MB against 12 MB.
"""

import json

import pytest

from tests.bert_jax import plan_test
from tests.bert_jax.plan_test import _cli

TINY_EMBED = ("--config=bert_jax/configs/finetune.py:modernbert_embed_stage1,runlocal",
              "--config.model_name=tiny", "--config.model.dtype=bfloat16",
              "--config.max_seq_length=32")


# plan_test's autouse fixture, the same rule here: skip locally without libtpu, FAIL in CI.
libtpu = plan_test.libtpu


@pytest.fixture
def vocab(tmp_path):
  """A 512-token WordPiece vocabulary: the model's embedding at 512 rows, not BERT's 30,522."""
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                            + [f"w{i}" for i in range(507)]) + "\n")
  return str(path)


@pytest.mark.slow   # two TPU compiles: ~90 s of CPU (tests/xdist_order.py)
def test_cli_plans_grad_cache_against_the_unchunked_step(tmp_path, vocab):
  out = tmp_path / "plan.json"
  p = _cli(*TINY_EMBED, f"--config.vocab_file={vocab}", "--topology=v5e:1x1",
           "--config.batch_size=512", "--config.embedding.grad_cache_chunks=8", f"--json={out}")
  assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
  assert "Traceback" not in p.stderr
  lines = p.stdout.splitlines()
  header = [l for l in lines if l.startswith("memory per chip:")]
  assert len(header) == 1 and "unchunked step" in header[0] and "GradCache 8 x 64 rows" in header[0]
  assert any(l.startswith("GradCache: each device's 512 rows embedded in 8 chunks of 64")
             for l in lines), p.stdout
  verdict = [l for l in lines if l.startswith("verdict:")]
  assert verdict == [next(l for l in lines if l.startswith("verdict: GradCache 8 x 64 rows FITS "
                                                           "on v5litepod-1"))], p.stdout
  assert "the unchunked step FITS on v5litepod-1" in verdict[0]
  result = json.loads(out.read_text())
  assert result["kind"] == "finetune" and result["fits"] is True
  assert result["config"]["batch_shape"] == [512, 2, 32]
  steps = {s["key"]: s for s in result["steps"].values()}
  plain, gc = steps["unchunked"], steps["grad_cache"]
  assert plain["fits"] and gc["fits"]
  # Parameters, Adam's state and the batch are the same inputs; the activations are one chunk's.
  assert gc["arguments"] == plain["arguments"] > 0
  assert 0 < gc["temporaries"] < 0.2 * plain["temporaries"], (plain, gc)
  assert gc["total"] < plain["total"]
  # The chunk loops' bodies are counted once by XLA: GradCache's compiled count x 8 is ~4/3 of
  # the unchunked step's (one more forward), which the report says.
  assert 1.2 < 8 * gc["flops"] / plain["flops"] < 1.5
  assert "x 8 chunks = " in p.stdout


def test_a_chunk_count_that_does_not_divide_the_rows_is_one_line_exit_2(vocab):
  p = _cli(*TINY_EMBED, f"--config.vocab_file={vocab}", "--topology=v5e:2x2",
           "--config.batch_size=32", "--config.embedding.grad_cache_chunks=3")
  assert p.returncode == 2, (p.stdout[-2000:], p.stderr[-2000:])
  assert p.stderr.strip().splitlines() == [
      "error: config.embedding.grad_cache_chunks=3 does not divide the 8 rows each device holds "
      "(config.batch_size=32 over 4 data-parallel devices); use one of [2, 4, 8] (0 or 1: off)."]
  assert "compiled" not in p.stdout


class _NoCompile:
  """An IsolatedCompiler that fails the test if anything is compiled."""

  def __init__(self, topology):
    del topology

  def __call__(self, config, model_config=None):
    raise AssertionError("compiled a config the plan should refuse")

  def close(self):
    pass


def _finetune_config(preset="modernbert_embed_stage1,runlocal", **fields):
  from bert_jax.configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  c = finetune_config.get_config(preset)
  c.model_name, c.max_seq_length, c.batch_size = "tiny", 32, 32
  for k, v in fields.items():
    target = c
    *path, last = k.split(".")
    for p in path:
      target = target[p]
    target[last] = v
  return c


@pytest.mark.parametrize("preset,fields,match", [
    ("glue_mrpc", {}, r"config.task=mrpc: bert_jax.plan builds the fine-tuning step of task "
                      r"types that declare their training batch \(embedding, reranker: .*this task is "
                      r"classification"),
    ("modernbert_embed_stage1,runlocal", dict(model_name=""),
     r"a fine-tuning plan needs the model: --config.model_name=PRESET"),
    ("modernbert_embed_stage1,runlocal", dict(batch_size=30),
     r"config.batch_size=30 .*not divisible by the data-parallel size 4"),
    ("modernbert_embed_stage1,runlocal", {"embedding.matryoshka_dims": (256,)},
     r"matryoshka_dims"),
    ("modernbert_embed_stage1,runlocal", dict(pack=True),
     r"config.pack=true: a packed fine-tuning batch's row count comes from its data"),
    ("modernbert_embed_stage1,runlocal", {"embedding.teacher_checkpoint": "runs/teacher",
                                          "embedding.margin_mse_weight": 1.0},
     r"config.embedding.teacher_checkpoint=runs/teacher: bert_jax.plan does not compile a "
     r"step with a teacher inside it"),
], ids=["classification_task", "no_model", "batch_30_on_4_chips", "matryoshka_above_hidden",
        "packed", "teacher_in_the_step"])
def test_the_plan_refuses_what_it_cannot_build_before_compiling(monkeypatch, preset, fields,
                                                                match):
  from bert_jax import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.planning import plan_compile  # pylint: disable=g-import-not-at-top
  from bert_jax_core import errors  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(plan_compile, "IsolatedCompiler", _NoCompile)
  monkeypatch.setattr(plan_compile, "hbm_per_chip", lambda *a: (_ for _ in ()).throw(
      AssertionError("probed the HBM (a compile) before the checks")))
  with pytest.raises(errors.UserError, match=match):
    plan_lib.plan(_finetune_config(preset, **fields), "v5e:2x2", log=lambda _: None)


@pytest.mark.parametrize("options,match", [
    (dict(search_settings=True), r"--search looks for pre-training settings"),
    (dict(price=1.0), r"--price_per_chip_hour: a fine-tuning plan prints memory and FLOPs, no "
                      r"cost"),
], ids=["search", "price"])
def test_pre_training_options_are_refused_for_a_fine_tuning_config(options, match):
  from bert_jax import plan as plan_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(plan_lib.PlanError, match=match):
    plan_lib.plan(_finetune_config(), "v5e:2x2", log=lambda _: None, **options)


def test_an_unchunked_step_out_of_memory_is_shown_from_the_compilers_message():
  """modernbert_embed_stage1 on a v5litepod-8: the unchunked step's compile ran out of memory
  (libtpu's message, as it came); GradCache's fits. The table shows the unchunked step's
  temporaries from that message and its total as at least them plus its inputs."""
  from bert_jax.planning import plan_finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import tpu_specs  # pylint: disable=g-import-not-at-top
  from bert_jax.planning.plan_compile import GiB, Compiled  # pylint: disable=g-import-not-at-top
  inputs = dict(params=GiB // 2, optimizer=GiB, batch=GiB // 64)
  steps = dict(
      unchunked=Compiled(False, 1.0, error="RESOURCE_EXHAUSTED: Ran out of memory on HBM, the "
                         "total memory required for HLO temporaries (143.98G) exceeds available "
                         "HBM (15.75G)", **inputs),
      grad_cache=Compiled(True, 1.0, arguments=int(1.6 * GiB), temporaries=4 * GiB, code=GiB // 8,
                          total=6 * GiB, flops=1e13, **inputs))
  names = {"unchunked": "unchunked step", "grad_cache": "GradCache 32 x 64 rows"}
  spec = tpu_specs.parse_topology("v5litepod-8")
  config = _finetune_config(**{"embedding.grad_cache_chunks": 32})
  lines = plan_finetune.report_lines(config, steps, names, 15.75 * GiB, "the compiler allows",
                                     spec)
  row = {l.split("  ")[1].strip(): l for l in lines if l.startswith("  ")}
  assert row["temporaries"].split()[-4:] == ["143.98", "GiB", "4.00", "GiB"], lines
  assert ">= 145.50 GiB" in row["total"] and row["total"].endswith("6.00 GiB"), lines
  assert ("GradCache's temporaries are 0.028x the unchunked step's, its total 0.041x (at most: "
          "the unchunked total is a lower bound)") in lines
  fits, verdict = plan_finetune.verdict(steps, names, 15.75 * GiB, spec)
  assert fits is True and verdict.startswith(
      "GradCache 32 x 64 rows FITS on v5litepod-8 with 9.75 GiB (62%) of HBM to spare per chip; "
      "the unchunked step DOES NOT FIT on v5litepod-8: RESOURCE_EXHAUSTED"), verdict
  # Without GradCache the unchunked step is the configured one: exit 1, and the way out named.
  alone = {"unchunked": steps["unchunked"]}
  fits, verdict = plan_finetune.verdict(alone, {"unchunked": "unchunked step"}, 15.75 * GiB, spec)
  assert fits is False and verdict.endswith("--config.embedding.grad_cache_chunks=N "
                                            "(custom.type=embedding)"), verdict
  table = plan_finetune.report_lines(_finetune_config(), alone, {"unchunked": "unchunked step"},
                                     15.75 * GiB, "the compiler allows", spec)
  assert not any(l.startswith(("GradCache", "FLOPs:")) for l in table), table


def test_the_model_is_the_init_checkpoints_read_without_its_arrays(tmp_path, vocab):
  """--config.init_checkpoint: the export's own config (width 64 here, not the preset's 128)
  and its vocabulary's size, with config.model's settings, as bert_jax.finetune reads them."""
  import jax  # pylint: disable=g-import-not-at-top
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.planning import plan_finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  mc = model_lib.get_bert_config("tiny", vocab_size=512, hidden_size=64, num_heads=2,
                                 intermediate_size=128)
  params = nn.unbox(pretraining_heads.init_params(mc, jax.random.PRNGKey(0)))
  path = ckpt_lib.save_params(str(tmp_path / "export"), params, mc)
  config = _finetune_config(model_name="", init_checkpoint=path, vocab_file=vocab,
                            **{"model.dtype": "bfloat16"})   # config.model's, as finetune's
  got, source = plan_finetune.model_config_of(config)
  assert (got.hidden_size, got.vocab_size, got.dtype) == (64, 512, "bfloat16")
  assert source == "the init checkpoint's"
