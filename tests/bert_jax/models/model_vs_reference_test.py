"""Numerical parity with transformers' BertForPreTraining after conversion (CPU, float32)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax import convert  # noqa: E402
from bert_jax.models import model as model_lib  # noqa: E402
from bert_jax.models import pretraining_heads
from tests.testlib import hf_testlib  # noqa: E402

CONFIGS = {
    # head_dim 16 (heads != H/64), intermediate 100 (!= 4H), exact erf GELU.
    "heads4_ffn100": dict(hidden_size=64, num_attention_heads=4, intermediate_size=100),
    # tanh GELU, another LayerNorm epsilon, 3 token types, odd sizes.
    "gelu_new_eps1e-5": dict(hidden_size=48, num_attention_heads=3, intermediate_size=80,
                             num_hidden_layers=3, hidden_act="gelu_new", layer_norm_eps=1e-5,
                             type_vocab_size=3, vocab_size=70),
    "relu_one_layer": dict(hidden_size=32, num_attention_heads=2, intermediate_size=128,
                           num_hidden_layers=1, hidden_act="relu"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_converted_model_matches_transformers(name, tmp_path):
  hf = hf_testlib.random_hf_model(hf_testlib.hf_config(**CONFIGS[name]), seed=1)
  hf_testlib.save_hf(hf, str(tmp_path / "hf"))
  params, config, meta = convert.import_checkpoint(str(tmp_path / "hf"))
  assert meta["initialized_randomly"] == [] and meta["ignored_variables"] == {}
  assert config.layer_norm_eps == hf.config.layer_norm_eps
  assert meta["numerics"]["hidden_act_source"] == hf.config.hidden_act

  ids, mask, segments, positions = hf_testlib.batch(config.vocab_size)
  with torch.no_grad():
    t = lambda x: torch.tensor(x, dtype=torch.long)
    ref_body = hf.bert(input_ids=t(ids), attention_mask=t(mask), token_type_ids=t(segments))
    ref = hf(input_ids=t(ids), attention_mask=t(mask), token_type_ids=t(segments))
  body = model_lib.BertModel(config).apply({"params": params["bert"]}, ids, mask, segments)
  mlm, nsp = pretraining_heads.BertForPreTraining(config).apply({"params": params}, ids, mask,
                                                                segments,
                                                        positions)
  valid = mask.astype(bool)  # HF computes pad positions too; only real tokens are defined
  ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), positions[..., None], axis=1)
  for got, want in [(np.asarray(body["sequence_output"])[valid],
                     ref_body.last_hidden_state.numpy()[valid]),
                    (body["pooled_output"], ref_body.pooler_output.numpy()),
                    (mlm, ref_mlm), (nsp, ref.seq_relationship_logits.numpy())]:
    assert np.abs(np.asarray(got) - want).max() <= 1e-4
  # The check has teeth: outputs are O(1), not ~0.
  assert np.abs(ref_mlm).mean() > 0.1 and np.abs(ref.seq_relationship_logits.numpy()).mean() > 0.1


def test_gelu_choice_changes_outputs_beyond_tolerance(tmp_path):
  """Recording the wrong GELU would be caught by the parity tolerance above."""
  hf = hf_testlib.random_hf_model(hf_testlib.hf_config(), seed=2, scale=0.5)
  hf_testlib.save_hf(hf, str(tmp_path / "hf"))
  params, config, _ = convert.import_checkpoint(str(tmp_path / "hf"))
  params2, config2, _ = convert.import_checkpoint(str(tmp_path / "hf"), gelu="gelu_tanh")
  assert (config.hidden_act, config2.hidden_act) == ("gelu", "gelu_tanh")
  ids, mask, segments, positions = hf_testlib.batch(config.vocab_size)
  a = pretraining_heads.BertForPreTraining(config).apply({"params": params}, ids, mask, segments,
                                                 positions)[0]
  b = pretraining_heads.BertForPreTraining(config2).apply({"params": params2}, ids, mask, segments,
                                                  positions)[0]
  assert np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-3
