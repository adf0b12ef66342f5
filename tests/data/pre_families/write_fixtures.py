"""Writes this folder's checkpoints and expected outputs WITH THE CODE OF ANOTHER COMMIT (the
layout before bert_jax/families/, commit 36a50ca), so tests/bert_jax/families/families_registry_test.py can check
that checkpoints written then still load and give the same outputs now. Run once, from a checkout
of that commit:

  git archive 36a50ca | tar -x -C /tmp/old
  cd /tmp/old && JAX_PLATFORMS=cpu python /path/to/tests/data/pre_families/write_fixtures.py OUT

Tiny models (vocab 40, width 32, one layer) keep the files small: one params export per family
(bert, electra with its generator, distilbert) with its vocab.txt, and expected.npz: fill-mask
probabilities, the last layer's features and a fresh classification head's logits (seed 0).
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.getcwd())
from bert_jax import convert, extract_features, predict
from bert_jax.families.electra import objective as electra
from bert_jax.models import heads
from bert_jax.inference import loading as inference
from bert_jax.models import model  # noqa
from bert_jax.models import pretraining_heads  # noqa

OUT = sys.argv[1]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]
SMALL = dict(vocab_size=40, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1,
             max_position_embeddings=32)
CONFIGS = {
    "bert": model.get_bert_config("tiny", **SMALL),
    "electra": model.get_bert_config("electra-tiny", **SMALL, generator_hidden_size=16,
                                     generator_num_heads=1, generator_intermediate_size=32,
                                     generator_num_layers=1),
    "distilbert": model.get_bert_config("distilbert-tiny", **SMALL),
}
os.makedirs(OUT, exist_ok=True)
vocab = os.path.join(OUT, "vocab.txt")
with open(vocab, "w", encoding="utf-8") as f:
  f.write("\n".join(WORDS) + "\n")
expected = {}
for name, config in CONFIGS.items():
  init = electra.init_params if name == "electra" else pretraining_heads.init_params
  params = jax.tree.map(np.asarray, jax.device_get(
      __import__("flax").linen.meta.unbox(init(config, jax.random.PRNGKey(1)))))
  out = os.path.join(OUT, name)
  convert.write_export(out, params, config, {"_vocab_path": vocab, "do_lower_case": True,
                                             "casing_inferred_from": "fixture",
                                             "vocab_file": "vocab.txt", "vocab_size": 40})
  p = predict.load(out)
  result = predict.predict(p, "w1 [MASK] w3 .", top_k=40)
  expected[f"{name}/fill_mask"] = np.asarray(
      [[prob for _, _, prob in sorted(m, key=lambda t: t[1])] for m in result["masks"]])
  m = inference.load_for_inference(out)
  arrays, _ = extract_features.extract([("w1 w2 w3".split(), None), ("w4 w5".split(), ["w6"])], m.tokenizer,
                                       m.params.get("bert", m.params), m.config, layers=(-1,),
                                       max_seq_length=8, batch_size=2)
  expected[f"{name}/features"] = arrays["features"]
  head = heads.create_model("classification", m.config, num_labels=3)
  ids, mask, seg = heads.dummy_inputs("classification", 8)
  variables = head.init(jax.random.PRNGKey(0), ids + 5, mask + 1, seg)
  expected[f"{name}/cls_logits"] = np.asarray(head.apply(variables, ids + 5, mask + 1, seg))
  expected[f"{name}/head_params"] = np.asarray(sorted(
      jax.tree_util.keystr(path) for path, _ in
      jax.tree_util.tree_flatten_with_path(variables["params"])[0]))
np.savez(os.path.join(OUT, "expected.npz"), **expected)
print("wrote", OUT, sorted(expected))
