"""DistilBERT's step through train.build_training (the family's step_parts and init_from_teacher
hooks) on a fixed tiny batch and seed: the loss, its parts and the student's parameters after 2
steps equal the figures the step gave before it moved onto bert_jax/objectives/layerwise.py's objective
(issue 41 item 1: one distillation step; DistilBERT is a weight setting of its parts).

GOLDEN holds what DistilBERT's own step (distil.py's teacher outputs and forward, objectives.py's
distill_ce / distill_cos) printed at 2b35da8 (2026-11-27, shared 2-core CPU VM, jax on CPU, the
suite's 8 fake devices and mesh (4, 2, 1));
  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
      python -m tests.bert_jax.objectives.distil_parity_test --out=params.npz
prints them again and writes every parameter for a leaf-by-leaf comparison (after the move: all
41 leaves and every logged metric bit-equal to the step's before it, 2026-11-27)."""

import sys

import jax
import numpy as np
import pytest

from tests.bert_jax.families.distilbert import distil_test

# Step 1 and 2's logged metrics, and sum / sum of squares of every student parameter after step 2.
GOLDEN = {'history': [{'distill_ce_accuracy': 0.20833325386047363,
              'distill_ce_loss': 0.01092064194381237,
              'distill_cos_loss': 0.22570852935314178,
              'distill_cos_similarity': 0.7742915749549866,
              'grad_norm': 7.8528900146484375,
              'learning_rate': 0.003000000026077032,
              'loss': 9.497965812683105,
              'mlm_accuracy': 0.0,
              'mlm_loss': 4.608826637268066,
              'real_token_fraction': 0.8671875,
              'skipped': 0.0},
             {'distill_ce_accuracy': 0.0,
              'distill_ce_loss': 0.03543388843536377,
              'distill_cos_loss': 0.17510104179382324,
              'distill_cos_similarity': 0.8248990178108215,
              'grad_norm': 5.798050880432129,
              'learning_rate': 0.001500000013038516,
              'loss': 7.591421127319336,
              'mlm_accuracy': 0.8749996423721313,
              'mlm_loss': 3.619575262069702,
              'real_token_fraction': 0.8671875,
              'skipped': 0.0}],
 'params': {'bert/embeddings/layer_norm/bias': (0.04427487403154373, 0.0017298142498626597),
            'bert/embeddings/layer_norm/scale': (128.01346164941788, 128.02874018986597),
            'bert/embeddings/position_embeddings/embedding': (0.7945049337959063,
                                                              1.30703502889443),
            'bert/embeddings/word_embeddings/embedding': (3.606304680631638, 4.121483724324099),
            'bert/encoder/layer_0/attention/key/bias': (7.389649867711734e-09,
                                                        1.8559069567495974e-16),
            'bert/encoder/layer_0/attention/key/kernel': (0.45074434443028366, 5.172531795714699),
            'bert/encoder/layer_0/attention/output/bias': (-0.0022745871683582664,
                                                           0.00184281374153246),
            'bert/encoder/layer_0/attention/output/kernel': (-0.5158585675557106,
                                                             5.264271401005535),
            'bert/encoder/layer_0/attention/query/bias': (-0.06771640841498083,
                                                          0.0007474845130081959),
            'bert/encoder/layer_0/attention/query/kernel': (2.285921682847004, 5.090080777182932),
            'bert/encoder/layer_0/attention/value/bias': (0.02826825575903058,
                                                          0.0017610559382299448),
            'bert/encoder/layer_0/attention/value/kernel': (-1.33566296010531, 5.3303162181633095),
            'bert/encoder/layer_0/attention_layer_norm/bias': (0.0028867798391729593,
                                                               0.0018158456343462118),
            'bert/encoder/layer_0/attention_layer_norm/scale': (128.00778698921204,
                                                                128.0174074897573),
            'bert/encoder/layer_0/intermediate/bias': (0.0029564783617388457,
                                                       0.007044108076868728),
            'bert/encoder/layer_0/intermediate/kernel': (4.367406514152066, 21.213206241491896),
            'bert/encoder/layer_0/output/bias': (0.015739670721814036, 0.0018241313632572408),
            'bert/encoder/layer_0/output/kernel': (7.3776397651818115, 21.20406488369703),
            'bert/encoder/layer_0/output_layer_norm/bias': (0.004086375469341874,
                                                            0.0018273513388445382),
            'bert/encoder/layer_0/output_layer_norm/scale': (128.00249767303467,
                                                             128.00679972782842),
            'bert/encoder/layer_1/attention/key/bias': (4.8293846428414805e-09,
                                                        1.3891783929784289e-16),
            'bert/encoder/layer_1/attention/key/kernel': (0.3644443903604042, 5.102951347891221),
            'bert/encoder/layer_1/attention/output/bias': (0.0008545792661607265,
                                                           0.0018611507199777495),
            'bert/encoder/layer_1/attention/output/kernel': (-1.1220441104858736,
                                                             5.272236751839322),
            'bert/encoder/layer_1/attention/query/bias': (-0.03809969468966301,
                                                          0.0006535695965842927),
            'bert/encoder/layer_1/attention/query/kernel': (1.8414111562703965, 5.211280963418139),
            'bert/encoder/layer_1/attention/value/bias': (-0.02578147081658244,
                                                          0.0018090247085463074),
            'bert/encoder/layer_1/attention/value/kernel': (-0.7128397977458008,
                                                            5.3409383622328725),
            'bert/encoder/layer_1/attention_layer_norm/bias': (0.0007177364313974977,
                                                               0.001835407604884814),
            'bert/encoder/layer_1/attention_layer_norm/scale': (128.000652551651,
                                                                128.00312281467774),
            'bert/encoder/layer_1/intermediate/bias': (0.0029382586508290842,
                                                       0.0072568567744711555),
            'bert/encoder/layer_1/intermediate/kernel': (-13.570602261221701, 21.322862181831383),
            'bert/encoder/layer_1/output/bias': (-0.010928416741080582, 0.0017610400279600216),
            'bert/encoder/layer_1/output/kernel': (-6.808454541240785, 21.20284946985243),
            'bert/encoder/layer_1/output_layer_norm/bias': (0.014254606794565916,
                                                            0.001816862764331934),
            'bert/encoder/layer_1/output_layer_norm/scale': (127.99982345104218,
                                                             128.0014523023266),
            'mlm_head/output_bias': (-0.24426011834293604, 0.0019425702038065938),
            'mlm_head/transform/bias': (0.000923641724511981, 0.0017612030270157714),
            'mlm_head/transform/kernel': (-3.010718262309183, 5.329159638766255),
            'mlm_head/transform_layer_norm/bias': (-0.05043082416523248, 0.0021468307174061013),
            'mlm_head/transform_layer_norm/scale': (128.08135730028152, 128.164269793692)}}


def _config():
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  c = pretrain.get_config("distilbert-tiny,runlocal")
  c.train_input_files, c.model.vocab_size = "synthetic", distil_test.VOCAB
  c.model.max_position_embeddings = 32
  c.seq_length, c.max_predictions_per_seq, c.batch_size = 16, 3, 8
  c.num_train_steps, c.warmup_steps, c.learning_rate = 2, 0, 3e-3
  c.model.num_layers = 2          # every other layer of the 4-layer teacher: 0, 2
  c.model.attention = "xla"
  return c


def two_steps(workdir):
  """(metrics of steps 1 and 2, the student's parameters after step 2) of distilbert-tiny (2
  layers, dropout 0.1) distilled from a random 4-layer BERT-tiny teacher, at the recipe's
  weights (5 x distill_ce + 2 x mlm + 1 x distill_cos, T = 2)."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import families  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from bert_jax.training import trainer_lib  # pylint: disable=g-import-not-at-top
  teacher_config = distil_test.TEACHER                   # 4 x 128, vocab 99, positions 32
  teacher_params = distil_test._params(teacher_config, 1)   # pylint: disable=protected-access
  path = ckpt_lib.save_params(f"{workdir}/teacher", teacher_params, teacher_config)
  c = _config()
  c.teacher_checkpoint = path
  mc = model_lib.get_bert_config("distilbert-tiny", **{
      k: v for k, v in c.model.to_dict().items() if v is not None and k != "objectives"})
  family = families.get(mc.family)
  teacher = family.load_teacher(c, mc)
  mesh = trainer_lib.create_mesh((4, 2, 1), c.batch_size)
  steps = train.build_training(c, mc, mesh, teacher=teacher)
  batch = distil_test._batch()   # pylint: disable=protected-access
  history = []
  with trainer_lib.mesh_rules(mesh):
    state = steps.init_state(jax.random.PRNGKey(0))
    state = family.init_from_teacher(state, steps, c, teacher, mc.num_layers)
    for _ in range(2):
      state, metrics = steps.train_step(state, batch)
      history.append({k: float(v) for k, v in jax.device_get(metrics).items()})
  return history, jax.device_get(state["params"])


def summary(history, params):
  """What GOLDEN stores: the metrics, and (sum, sum of squares) of each parameter leaf."""
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  return {"history": history,
          "params": {_name(p): (float(np.sum(x, dtype=np.float64)),
                                float(np.sum(np.square(x, dtype=np.float64)))) for p, x in leaves}}


def _name(path):
  """bert/encoder/layer_0/... of a tree path."""
  return "/".join(str(k.key) for k in path)


@pytest.mark.slow   # 58 s on the 2-core box: two networks compiled on 8 fake devices
def test_distilbert_step_gives_the_figures_of_its_own_step_before_the_move(tmp_path):
  got = summary(*two_steps(str(tmp_path)))
  assert len(got["history"]) == 2
  for want, have in zip(GOLDEN["history"], got["history"]):
    assert set(want) <= set(have)
    for k in want:
      np.testing.assert_allclose(have[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)
  assert set(got["params"]) == set(GOLDEN["params"])
  for k, (s, sq) in GOLDEN["params"].items():
    np.testing.assert_allclose(got["params"][k], (s, sq), rtol=1e-5, atol=1e-6, err_msg=k)


if __name__ == "__main__":
  import argparse  # pylint: disable=g-import-not-at-top
  import pprint  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser()
  p.add_argument("--out", default="", help="an .npz of every student parameter after step 2")
  args = p.parse_args()
  with tempfile.TemporaryDirectory() as d:
    h, params = two_steps(d)
  pprint.pprint(summary(h, params), width=100, sort_dicts=True)
  if args.out:
    np.savez(args.out, **{_name(k): v for k, v in jax.tree_util.tree_flatten_with_path(params)[0]})
  sys.exit(0)
