"""bert_jax.plan on bert_jax/configs/mine.py (bert_jax/planning/plan_mine.py): the mining step's two
programs compiled for a TPU slice with libtpu, memory per chip at a stated block and batch.

libtpu comes with requirements-test.txt (plan_test.py's rule: skip locally without it, FAIL in
CI). BERT-tiny at vocab 512, 64 tokens, on one v5e chip: the two compiles took ~55 s of CPU
(2026-11-29, the loaded 2-core box).
"""

import importlib.metadata

import pytest

from bert_jax.configs import mine as mine_config
from bert_jax.parallel import tpu_specs
from bert_jax.planning import plan_mine
from bert_jax.planning.plan_compile import PlanError
from tests.bert_jax import plan_test

libtpu = plan_test.libtpu
tpu_programs_as_users_compile_them = plan_test.tpu_programs_as_users_compile_them


def _config(**kw):
  c = mine_config.get_config()
  c.model_name, c.model.vocab_size = "tiny", 512
  c.num_queries, c.block_size, c.batch_size, c.max_seq_length, c.k = 4096, 1024, 256, 64, 40
  c.update(kw)
  return c


def test_sizes_mine_would_refuse_are_refused_before_a_compile():
  spec = tpu_specs.parse_topology("v5e:2x2")
  with pytest.raises(PlanError, match=r"config.batch_size=6: give a multiple of the slice's 4 "):
    plan_mine.check(_config(batch_size=6), spec.chips)
  with pytest.raises(PlanError, match=r"config.block_size=1000: give a multiple of "
                     r"config.batch_size=256\."):
    plan_mine.check(_config(block_size=1000), spec.chips)


@pytest.mark.slow   # two TPU compiles: ~55 s of CPU
def test_the_mining_step_is_planned_per_chip():
  lines = []
  result = plan_mine.plan(_config(), tpu_specs.parse_topology("v5e:1x1"),
                          importlib.metadata.version("libtpu"), log=lines.append)
  assert result["kind"] == "mine" and result["fits"] is True
  # The state: 4,096 rows x (H 128 + 2 x k 40 + 2 positives) float32 on the one chip
  assert result["resident_bytes"]["state"] == 4096 * (128 + 80 + 2) * 4
  merge = result["programs"]["merge"]
  # The merge's temporaries hold at least the block's scores and their candidates' indices
  assert merge["temporaries"] >= 4096 * 1024 * 4
  assert merge["aliased"] > 0                                    # the state is donated
  assert result["programs"]["encode"]["arguments"] >= result["resident_bytes"]["params"]
  assert lines[0].startswith("mining plan on v5litepod-1 (1 chips")
  assert lines[-1].startswith("verdict: the mining step FITS on v5litepod-1: peak ")
