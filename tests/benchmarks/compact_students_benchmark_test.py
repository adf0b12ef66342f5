"""benchmarks/compact_students.py without training (issue 41 item 6): its flags, the encoder
counts of each family's body, the forward timer on MobileBERT's own network and the tables."""

import pytest

from benchmarks import compact_students as cs
from benchmarks import electra_distil as ed
from bert_jax.models import model as model_lib
from bert_jax.families import mobilebert


def test_bad_flags_are_one_line_and_exit_2_before_compute(capsys):
  for argv in (["--seeds=0,x"], ["--steps=0"], ["--jobs=0"], ["--no_finetune=student"]):
    with pytest.raises(SystemExit) as e:
      cs.parse_args(argv)
    assert e.value.code == 2
    assert argv[0].split("=")[0] in capsys.readouterr().err
  args = cs.parse_args(["--seeds=0,1,2", "--no-transfer"])
  assert args.seed_list == [0, 1, 2] and not args.transfer and args.steps == 1500


def test_the_three_students_share_one_shape_and_mobilebert_counts_its_own_body():
  v = 4939
  tinybert, distilbert, scratch = (cs.encoder_params(p, v) for p, _ in cs.STUDENTS.values())
  assert tinybert == scratch   # the same BertModel (token types, pooler)
  # DistilBERT: the same layer without the token-type table [2, 128] and the pooler 128 x 128 + 128
  assert scratch - distilbert == 2 * 128 + 128 * 128 + 128
  c = model_lib.get_bert_config("mobilebert-tiny", vocab_size=v)
  assert cs.encoder_params("mobilebert-tiny", v) == mobilebert.num_params(c, with_heads=False)


def test_inference_speed_runs_mobilebert_s_own_network():
  speed = ed.inference_speed(["tiny", "mobilebert-tiny"], 100, batch=2, reps=2, seq=16)
  assert set(speed) == {"tiny", "mobilebert-tiny"} and all(t > 0 for t in speed.values())


def test_tables_show_each_cost_seed_and_speed_ratio():
  dev = lambda *xs: ed.dev_summary([dict(best=x, last=x) for x in xs])  # noqa: E731
  row = lambda preset, own, teacher=None, **kw: dict(  # noqa: E731
      dict(preset=preset, what=preset, steps=500, pretrain_tflop=1.0, own_gflop_per_step=own,
           teacher_gflop_per_step=teacher, final_eval={"eval/mlm_accuracy": 0.1},
           params=1e6, dev=dev(0.8, 0.7)), **kw)
  rows = {"teacher": row("tiny", 20.0, steps=1500), "tinybert": row("tinybert-1l-128", 10, 6.6),
          "distilbert": row("distilbert-tiny", 10, 6.6), "scratch": row("tiny-1l", 10),
          "mobilebert": row("mobilebert-tiny", 3)}
  speed = {"tiny": 0.02, "tinybert-1l-128": 0.01, "distilbert-tiny": 0.01, "tiny-1l": 0.01,
           "mobilebert-tiny": 0.04, "ib-bert-tiny": 0.05}
  args = cs.parse_args(["--steps=500", "--seeds=0,1", "--no-transfer"])
  text = cs.tables(args, rows, speed)
  assert "| tinybert: tinybert-1l-128 | tinybert-1l-128 | 1.00M | 500 x 32 | 10.0 + 6.6 |" in text
  assert "| scratch: tiny-1l | tiny-1l | 1.00M | 500 x 32 | 10.0 | 1.00 | 0.1000 | 0.750 ± " in text
  assert "| 0.800 0.700 | 10.0 | 2.00x |" in text            # per seed, ms, the teacher's / its
  assert "| teacher: tiny | tiny | 1.00M | 1500 x 32 | 20.0 |" in text
  assert "| mobilebert-tiny | 40.0 | 0.50x |" in text        # slower than BERT-tiny here
