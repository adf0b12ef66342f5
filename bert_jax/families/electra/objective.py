"""ELECTRA (Clark et al. 2020): a small MLM generator and a replaced-token-detection discriminator
in one Flax module, built from model.py's BertEmbeddings and BertEncoder and
pretraining_heads.py's MaskedLMHead.

One step (google-research/electra run_pretraining.PretrainingModel):
  1. generator: MLM on the masked input (the records' input_ids)          mlm  [B, P, V]
  2. replacements: one token per masked position sampled from the generator's softmax
     (stop-gradient, Gumbel-max via jax.random.categorical), inside the jitted step
  3. discriminator: on the corrupted input, "was this token replaced?" for every position,
     trained on the real (input_mask) ones                                rtd  [B, T]
  loss = 1 x generator MLM + 50 x discriminator sigmoid cross-entropy (objectives.py WEIGHTS),
  one optimizer over both networks (the gradient of the sum; no gradient flows through the
  sampling).

The sampling key is the module's "dropout" stream (trainer_lib.dropout_key(run key, step,
micro-batch) in training), so the replacements are a function of (parameters, batch, step):
resuming or changing the host count replays them (the global batch and its sharding-invariant
threefry draws are the same). Without a "dropout" rng (eval_step), a fixed key 0 is used:
evaluation scores the same replacements of the same generator every time.

Parameter tree of ElectraForPreTraining (params["bert"] is the discriminator's body, what
fine-tuning, extract_features and heads.py load; ELECTRA has no pooler):
  bert/embeddings/{word,position,token_type}_embeddings, layer_norm  [., E], shared by both
  bert/embeddings/projection [E, H]                 the discriminator's E -> H (when E != H)
  bert/encoder/layer_{i}/...                        the discriminator (BERT's layer)
  rtd_head/{dense [H, H], prediction [H, 1]}        HF discriminator_predictions
  generator/projection [E, Hg]                      the generator's E -> Hg (when E != Hg)
  generator/encoder/layer_{i}/...                   the generator (BERT's layer, width Hg)
  mlm_head/{transform [Hg, E], transform_layer_norm, output_bias [V]}  decoder tied to the
                                                    shared word table (HF generator_predictions,
                                                    generator_lm_head)
As in google-research/electra (`electra/embeddings` reused by the generator), the tables and
their LayerNorm are shared and each network has its own projection ("embeddings_project").
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn

from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads

# The house Dense (truncated-normal init, logical axes) and activation of model.py.
_dense = model_lib._dense            # pylint: disable=protected-access
_activation = model_lib._activation  # pylint: disable=protected-access


def generator_config(config: model_lib.BertConfig) -> model_lib.BertConfig:
  """The generator's encoder config: the generator_* sizes, the discriminator's embedding width
  E (its own projection E -> Hg when they differ), everything else shared."""
  e, hg = config.embed_dim, config.generator_hidden_size
  return dataclasses.replace(
      config, hidden_size=hg, num_layers=config.generator_num_layers,
      num_heads=config.generator_num_heads,
      intermediate_size=config.generator_intermediate_size, embedding_size=0 if e == hg else e)


def check_electra(config):
  if config.family != "electra":
    raise ValueError(f"ElectraForPreTraining needs family='electra' (an electra-* preset); got "
                     f"family={config.family!r}.")


class ElectraBody(nn.Module):
  """The discriminator's body: BertModel's embeddings and encoder without the pooler. Its
  embedding tables are also the generator's (`embed`)."""
  config: model_lib.BertConfig

  def setup(self):
    self.embeddings = model_lib.BertEmbeddings(self.config)
    self.encoder = model_lib.BertEncoder(self.config)

  def embed(self, input_ids, segment_ids, deterministic, position_ids=None):
    """The shared embeddings, before any projection: [B, T, E]."""
    return self.embeddings(input_ids, segment_ids, deterministic, position_ids, project=False)

  def word_table(self):
    return self.embeddings.word_embeddings.embedding                     # [V, E]

  def __call__(self, input_ids, attention_ids, segment_ids, deterministic, position_ids=None,
               packed=False):
    x = self.embeddings(input_ids, segment_ids, deterministic, position_ids)   # [B, T, H]
    x, _ = self.encoder(x, attention_ids, deterministic, packed)
    return x                                                              # [B, T, H]

  def model_outputs(self, input_ids, input_mask, segment_ids, *, instance_ids=None,
                    position_ids=None, cls_positions=None, deterministic=True,
                    output_hidden_states=False) -> dict:
    """model.BertModel's call and outputs, without its pooler (ELECTRA has none): what
    fine-tuning (heads.py) and extract_features read from the discriminator.
      sequence_output [B, T, H]; cls_output [B, H] the last layer at [CLS] (packed rows:
      [B, K, H] at cls_positions); with output_hidden_states, hidden_states L+1 x [B, T, H]
      (the projected embeddings, then each layer), as BertModel's."""
    packed = instance_ids is not None
    x = self.embeddings(input_ids, segment_ids, deterministic, position_ids)   # [B, T, H]
    x, hidden_states = self.encoder(x, instance_ids if packed else input_mask, deterministic,
                                    packed)
    cls = x[:, 0] if cls_positions is None else model_lib.gather_positions(x, cls_positions)
    out = {"sequence_output": x, "cls_output": cls}
    if output_hidden_states:
      out["hidden_states"] = hidden_states
    return out


class Generator(nn.Module):
  """The generator's own part: projection E -> Hg (when they differ) and its encoder."""
  config: model_lib.BertConfig   # generator_config(...)

  @nn.compact
  def __call__(self, x, attention_ids, deterministic, packed=False):
    c = self.config
    if c.factorised:
      x = _dense(c, c.hidden_size, ("embed2", "embed"), "projection")(x)  # [B, T, Hg]
    x = nn.with_logical_constraint(x, model_lib.BTH)
    x, _ = model_lib.BertEncoder(c, name="encoder")(x, attention_ids, deterministic, packed)
    return x                                                              # [B, T, Hg]


class ReplacedTokenDetectionHead(nn.Module):
  """dense H -> H, activation, dense H -> 1 on every position (HF ElectraDiscriminatorPredictions,
  google's discriminator_predictions): float32 logits [B, T], > 0 = "replaced"."""
  config: model_lib.BertConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    x = _activation(c.hidden_act)(_dense(c, c.hidden_size, ("embed", "embed2"), "dense")(x))
    return _dense(c, 1, ("embed", "classes"), "prediction", dtype=jnp.float32)(x)[..., 0]


def corrupt(input_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights, sampled,
            input_mask):
  """(original [B, T], replaced [B, T], labels [B, T] int32) from the masked input.

  original: input_ids with the masked positions restored to masked_lm_ids; replaced: the same
  positions set to the generator's samples [B, P]; labels: replaced != original on real tokens
  (a sample equal to the original token is not a replacement, as google's code). Prediction slots
  with weight 0 (padding, position 0) write nothing; the records' masked positions are distinct,
  so each position gets one slot's value.
  """
  t = input_ids.shape[1]
  hit = (jax.nn.one_hot(masked_lm_positions, t, dtype=jnp.int32)
         * (masked_lm_weights > 0).astype(jnp.int32)[..., None])          # [B, P, T]
  masked = jnp.max(hit, axis=1) > 0                                       # [B, T]
  # A sum over P of one-hot x value (element-wise: no int matmul, nothing for the FLOP count).
  put = lambda values: jnp.sum(hit * values.astype(jnp.int32)[..., None], axis=1)  # [B, T]
  original = jnp.where(masked, put(masked_lm_ids), input_ids)
  replaced = jnp.where(masked, put(sampled), input_ids)
  labels = ((replaced != original) & (input_mask > 0)).astype(jnp.int32)
  return original, replaced, labels


class ElectraForPreTraining(nn.Module):
  """Generator + discriminator (module docstring). Returns {"mlm": generator logits [B, P, V]
  float32, "rtd": {"logits": [B, T] float32, "labels": [B, T] int32, "input_ids": the
  discriminator's (corrupted) input [B, T]}}: the parts objectives.pretraining_loss reads.

  `generator_logits` and `discriminator_logits` run one network on given ids (conversion parity,
  inference); __call__ is the pre-training step's forward.
  """
  config: model_lib.BertConfig

  def setup(self):
    c = self.config
    check_electra(c)
    gc = generator_config(c)
    self.bert = ElectraBody(c)                       # the discriminator + shared embeddings
    self.rtd_head = ReplacedTokenDetectionHead(c)
    self.generator = Generator(gc)
    self.mlm_head = pretraining_heads.MaskedLMHead(gc)

  def generator_logits(self, input_ids, input_mask, segment_ids, masked_lm_positions, *,
                       instance_ids=None, position_ids=None, deterministic=True):
    """MLM logits [B, P, V] float32 of the generator at masked_lm_positions."""
    packed = instance_ids is not None
    x = self.bert.embed(input_ids, segment_ids, deterministic, position_ids)  # [B, T, E]
    x = self.generator(x, instance_ids if packed else input_mask, deterministic,
                       packed)                                              # [B, T, Hg]
    x = model_lib.gather_positions(x, masked_lm_positions)                  # [B, P, Hg]
    return self.mlm_head(x, self.bert.word_table())                         # [B, P, V]

  def discriminator_logits(self, input_ids, input_mask, segment_ids, *, instance_ids=None,
                           position_ids=None, deterministic=True):
    """Replaced-token logits [B, T] float32 of the discriminator (> 0: "replaced")."""
    packed = instance_ids is not None
    h = self.bert(input_ids, instance_ids if packed else input_mask, segment_ids, deterministic,
                  position_ids, packed)                                     # [B, T, H]
    return self.rtd_head(h)                                                 # [B, T]

  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids,
               masked_lm_weights, *, instance_ids=None, position_ids=None, deterministic=True):
    rows = dict(instance_ids=instance_ids, position_ids=position_ids,
                deterministic=deterministic)
    # 1. Generator: MLM at the masked positions of the masked input.
    mlm = self.generator_logits(input_ids, input_mask, segment_ids, masked_lm_positions,
                                **rows)                                     # [B, P, V]
    # 2. Replacements sampled from the generator (temperature 1, no gradient).
    key = self.make_rng("dropout") if self.has_rng("dropout") else jax.random.PRNGKey(0)
    sampled = jax.random.categorical(key, jax.lax.stop_gradient(mlm))       # [B, P]
    _, replaced, labels = corrupt(input_ids, masked_lm_positions, masked_lm_ids,
                                  masked_lm_weights, sampled, input_mask)
    # 3. Discriminator on the corrupted input: a logit per position.
    logits = self.discriminator_logits(replaced, input_mask, segment_ids, **rows)  # [B, T]
    return {"mlm": mlm, "rtd": {"logits": logits, "labels": labels, "input_ids": replaced}}


def forward(module, batch, deterministic):
  """ElectraForPreTraining on a batch dict: the `forward` of trainer_lib.build_steps (and of
  train.py for family electra), as pretraining_heads.pretraining_outputs is BERT's. Packed rows
  (instance_ids, position_ids) attend within their instance; nsp_positions are not read."""
  positions = batch["masked_lm_positions"]
  if "masked_lm_ids" not in batch and module.is_initializing():   # shapes for init only
    ids, weights = jnp.zeros_like(positions), jnp.zeros(positions.shape, jnp.float32)
  else:
    ids, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]
  extra = {k: batch[k] for k in ("instance_ids", "position_ids") if k in batch}
  return module(batch["input_ids"], batch["input_mask"], batch["segment_ids"], positions, ids,
                weights, deterministic=deterministic, **extra)


def apply(model, params, batch, rng, deterministic=False):
  """The pure step function: (params, batch, rng) -> {part: logits/targets}. `rng` drives the
  dropout and the sampling (trainer_lib passes dropout_key(run key, step, micro-batch))."""
  return model.apply({"params": params}, batch, deterministic, method=forward,
                     rngs={"dropout": rng})


def init_params(config, rng, seq_len=8, num_predictions=2):
  """Boxed (LogicallyPartitioned) params of ElectraForPreTraining(config)."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  pos = jnp.zeros((1, num_predictions), jnp.int32)
  return ElectraForPreTraining(config).init(
      rng, ids, jnp.ones_like(ids), ids, pos, pos, jnp.zeros((1, num_predictions)))["params"]


def count_params(params):
  """(discriminator, generator) parameter counts as transformers counts them: the discriminator
  is ElectraForPreTraining (body + rtd_head), the generator ElectraForMaskedLM (the shared
  embeddings + its projection, encoder and MLM head; the decoder is tied)."""
  params = nn.meta.unbox(params)
  n = model_lib.count_params
  shared = {k: v for k, v in params["bert"]["embeddings"].items() if k != "projection"}
  return (n(params["bert"]) + n(params["rtd_head"]),
          n(shared) + n(params["generator"]) + n(params["mlm_head"]))


def flops_per_sequence(config, seq_length, num_predictions):
  """Analytic training FLOPs of one sequence through both networks (forward + backward = 3 x
  forward = 6 x multiply-adds), train.model_flops_per_sequence's accounting applied to each:
    encoder   6 T L (4H^2 + 2HI) + attention 12 L T^2 H, per network
    projections E -> H and E -> Hg on every token (when E differs)
    generator MLM head on the P masked positions: Hg x E transform + E x V tied decoder
    discriminator head on every token: H x H + H x 1
  The sampling and the embedding gathers are not counted (no matmuls)."""
  t, e, v = seq_length, config.embed_dim, config.vocab_size

  def encoder(c):
    h, l, i = c.hidden_size, c.num_layers, c.intermediate_size
    projection = 6 * t * e * h if c.embed_dim != h else 0
    return 6 * l * (4 * h * h + 2 * h * i) * t + 12 * l * t * t * h + projection

  gc = generator_config(config)
  h, hg = config.hidden_size, gc.hidden_size
  return (encoder(config) + 6 * t * (h * h + h)                      # discriminator + RTD head
          + encoder(gc) + 6 * num_predictions * (hg * e + e * v))    # generator + MLM head
