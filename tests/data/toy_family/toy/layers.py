"""ToyBERT's own network piece: its [CLS] head."""

from flax import linen as nn

from bert_jax.families import bert
from bert_jax.models import model as model_lib


def cls_logits(config, out, num_labels, deterministic):
  """Not BERT's pooled [CLS]: dense + ReLU on the last layer's [CLS] ("toy_pooler"), dropout,
  then the classifier. out["cls_output"]: [B, H] -> [B, num_labels]."""
  x = model_lib._dense(config, config.hidden_size, ("embed", "embed2"), "toy_pooler")(
      out["cls_output"])
  x = nn.Dropout(config.hidden_dropout_prob)(nn.relu(x), deterministic=deterministic)
  return bert.head_dense(config, num_labels, "classifier")(x)
