"""SpanBERT (Joshi et al. 2019): BERT's encoder with span masking, one segment (no NSP) and the
span-boundary objective (pretraining_heads.SpanBoundaryHead); converts and exports with BERT's
names."""

import dataclasses

from bert_jax.families import registry as families
from bert_jax.families import bert

_SPANBERT = dict(family="spanbert", objectives="mlm,sbo")

PRESETS = {
    "spanbert": dict(_SPANBERT, num_layers=12, hidden_size=768, num_heads=12,
                     intermediate_size=3072),
    "spanbert-large": dict(_SPANBERT, num_layers=24, hidden_size=1024, num_heads=16,
                           intermediate_size=4096),
    "spanbert-tiny": dict(_SPANBERT, num_layers=2, hidden_size=128, num_heads=2,
                          intermediate_size=512),
    "spanbert-mini": dict(_SPANBERT, num_layers=4, hidden_size=256, num_heads=4,
                          intermediate_size=1024),
}

FAMILY = families.register(dataclasses.replace(
    bert.FAMILY, name="spanbert", presets=PRESETS, title="SpanBERT",
    summary="SpanBERT (Joshi et al. 2019): span masking, no NSP, span-boundary objective",
    masking="span", whole_word_masking=True,
    # SpanBERT's released weights are BERT checkpoints (model_type bert); exports are BERT's too.
    hf_model_types=(), tf_config_names=()))
