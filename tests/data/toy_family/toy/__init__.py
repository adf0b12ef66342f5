"""ToyBERT: a test family added as one folder, nothing edited elsewhere (issue 47).

tests/bert_jax/families/toy_family_test.py copies bert_jax/ with this folder as
bert_jax/families/toy/ and runs the programs on it: train, predict, convert, finetune,
export_serving and plan. The network is BERT's but for its [CLS] head (layers.py: dense + ReLU
"toy_pooler", then the classifier); MLM only.
"""

import dataclasses

from bert_jax.families import bert
from bert_jax.families import registry as families
from bert_jax.families.toy import layers

PRESETS = {"toy-tiny": dict(family="toy", objectives="mlm", num_layers=2, hidden_size=64,
                            num_heads=2, intermediate_size=128)}

FAMILY = families.register(dataclasses.replace(
    bert.FAMILY, name="toy", title="ToyBERT", presets=PRESETS,
    summary="a test family: BERT with its own [CLS] head, MLM only",
    exact_objectives=("mlm",), cls_logits=layers.cls_logits, hf_model_types=(),
    tf_config_names=(), config_marker_keys=(), train_further_note=" (toy)"))
