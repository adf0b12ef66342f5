"""ALBERT (Lan et al. 2019): factorised embeddings (tables of width E projected to H), one layer
shared across depth (or its attention / FFN half), sentence-order prediction, n-gram masking.

The same encoder as BERT (model.py's share_layers and embedding_size fields); what differs here:
the presets, the recipe's masking, and the checkpoint names (families/albert/convert.py).
"""

import dataclasses

from bert_jax.families import registry as families
from bert_jax.families import bert

_ALBERT = dict(family="albert", embedding_size=128, share_layers="all", objectives="mlm,sop",
               hidden_act="gelu_tanh", hidden_dropout_prob=0.0, attention_dropout_prob=0.0)

# ALBERT (Lan et al. 2019, Table 1): E=128, all layers shared, SOP; gelu_tanh and no dropout as
# the released v2 configs. Parameters at a 30k vocab (AlbertModel = transformers' count for the
# same AlbertConfig, tests/bert_jax/models/model_test.py): base 11.7M, large 17.7M, xlarge 58.7M, xxlarge 222.6M
# against the paper's 12M / 18M / 60M / 235M (docs/models.md: the first three round to it,
# xxlarge is 5.3% below).
PRESETS = {f"albert-{name}": dict(_ALBERT, num_layers=l, hidden_size=h, num_heads=n,
                                  intermediate_size=4 * h)
           for name, l, h, n in (("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("base", 12, 768, 12),
                                 ("large", 24, 1024, 16), ("xlarge", 24, 2048, 16),
                                 ("xxlarge", 12, 4096, 64))}


FAMILY = families.register(dataclasses.replace(
    bert.FAMILY, name="albert", presets=PRESETS, plain_teacher=False, title="ALBERT",
    summary="ALBERT (Lan et al. 2019): factorised embeddings, shared layers, MLM + SOP",
    factorised_embeddings=True, shared_layers=True, masking="ngram", whole_word_masking=True,
    hf_model_types=("albert",), tf_config_names=("albert_config.json",),
    config_marker_keys=("embedding_size",),
    # ALBERT's configs name their GELU, which families/albert/convert.py maps.
    **families.converter_hooks("albert"),
    hf_class="AlbertForPreTraining"))
