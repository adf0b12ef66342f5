"""BertConfig, the model's one configuration record, and the presets (read from the family
registry): the first half of what `bert_jax.models.model` exports (model.py re-exports every name here,
so `model.BertConfig` and `model.get_bert_config` stay the names to use).

What each field means and which family may set it: the comments below and docs/models.md.
"""

import dataclasses

from bert_jax.layers import attention as attention_lib
from bert_jax.layers import modern_layers
from bert_jax.families import registry as families_registry

ACTIVATIONS = ("gelu", "gelu_tanh", "relu")
SHARE_LAYERS = ("none", "all", "attention", "ffn")
OBJECTIVES = ("mlm", "nsp", "sop", "sbo", "rtd")
GENERATOR_FIELDS = ("generator_hidden_size", "generator_num_layers", "generator_num_heads",
                    "generator_intermediate_size")
# The modern encoder's fields (ModernBERT, NeoBERT): each a switch of one module, BERT's at default.
MODERN_FIELDS = ("position_embedding", "rope_theta_global", "rope_theta_local", "local_window",
                 "global_every", "ffn", "norm", "prenorm", "embedding_norm", "use_bias",
                 "mlm_transform", "tie_word_embeddings")
FAMILY_FIELDS = ("family", "embedding_size", "share_layers", "objectives", "sbo_max_targets",
                 *GENERATOR_FIELDS, *MODERN_FIELDS)
POSITION_EMBEDDINGS = ("learned", "rope")
FFNS = ("dense", "geglu", "swiglu")   # dense: act(x W1) W2 (BERT); gated: modern_layers.py


# ----------------------------------------------------------------------------------------------
# Config.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BertConfig:
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2          # 0: no token-type table (DistilBERT; segment_ids are ignored)
  hidden_dropout_prob: float = 0.1
  attention_dropout_prob: float = 0.1
  hidden_act: str = "gelu"          # exact erf GELU (HF "gelu"); "gelu_tanh" = google's tanh form
  initializer_range: float = 0.02   # truncated normal stddev (cut at 2 stddev), as google's BERT
  layer_norm_eps: float = 1e-12
  dtype: str = "float32"            # compute dtype; "bfloat16" for mixed precision
  param_dtype: str = "float32"      # parameters (and so optimizer state) stay float32
  remat: bool = False               # rematerialise each layer (jax.checkpoint) to save memory
  # Attention kernel: auto|xla|cudnn|pallas_gpu|splash (bert_jax/layers/attention.py). How the model
  # runs, not what it is: left out of to_dict(), so checkpoints never pin a kernel.
  attention: str = "xla"
  # FP8 matmuls (e4m3/e5m2, delayed scaling) for the encoder's QKV, attention output and FFN
  # (bert_jax/layers/fp8.py; issue 38); the scales live beside the params. How the step runs, not what
  # the model is (the parameters are the same): left out of to_dict(), as attention.
  fp8: bool = False
  # Epilogues in formulations XLA fuses (bert_jax/layers/fused_ops.py; issue 38), how the step runs as
  # well: the FFN's bias + tanh GELU (needs hidden_act="gelu_tanh": cuBLASLt has no erf GELU) and
  # post-LN's residual + LayerNorm with a written-out backward.
  fused_bias_gelu: bool = False
  fused_residual_norm: bool = False
  # The MLM loss C predictions a row at a time (pretraining_heads.chunked_cross_entropy; issue
  # 42): a 256k vocabulary's [B, P, V] float32 logits are never all made. 0: whole logits. How
  # the step runs, not what the model is: left out of to_dict(), as attention.
  mlm_loss_chunk: int = 0
  # The family fields (docs/models.md). Their defaults are BERT, and to_dict() leaves a field at
  # its default out, so a BERT checkpoint's stored config is what it was before they existed.
  family: str = "bert"              # bert | albert | spanbert | electra | distilbert
  embedding_size: int = 0           # E; 0 = H, no projection. ALBERT, ELECTRA-small: E=128 -> H
  share_layers: str = "none"        # none | all | attention | ffn (ALBERT's cross-layer sharing)
  # Pre-training objectives (bert_jax/objectives/pretraining.py), comma-separated: mlm plus at most one
  # sentence-level task (nsp | sop), plus sbo (SpanBERT's span-boundary objective).
  objectives: str = "mlm,nsp"
  sbo_max_targets: int = 20         # SBO relative-position embeddings (spans of up to 20 tokens)
  # ELECTRA's generator (bert_jax/families/electra/objective.py): its own encoder on the shared embeddings; the
  # fields above describe the discriminator. 0 for every other family.
  generator_hidden_size: int = 0
  generator_num_layers: int = 0
  generator_num_heads: int = 0
  generator_intermediate_size: int = 0
  # The modern encoder (ModernBERT, Warner et al. 2024; NeoBERT, Breton et al. 2025). Defaults
  # are BERT's (left out of to_dict() there, so older checkpoints compare equal).
  position_embedding: str = "learned"   # learned: a [max_pos, E] table (BERT) | rope (rope.py)
  rope_theta_global: float = 10_000.0   # RoPE theta of global layers (ModernBERT 160,000)
  rope_theta_local: float = 10_000.0    # ... of local (windowed) layers (ModernBERT 10,000)
  local_window: int = 0                 # local layers see |i - j| <= W/2 (ModernBERT 128); 0 none
  global_every: int = 1                 # layer i is global when i % global_every == 0 (ModernBERT 3)
  ffn: str = "dense"                    # dense (BERT) | geglu (ModernBERT) | swiglu (NeoBERT)
  norm: str = "layer_norm"              # layer_norm | layer_norm_no_bias | rms_norm
  prenorm: bool = False                 # x + f(norm(x)) and a final norm (post-LN when False)
  embedding_norm: bool = True           # the embeddings' norm; prenorm with it: layer 0 has no
                                        #   attention norm (ModernBERT), without: it has (NeoBERT)
  use_bias: bool = True                 # biases in every dense of the body and MLM transform
  # The MLM head (pretraining_heads.MaskedLMHead). BERT and ModernBERT: dense + act + norm, then
  # the word table [V, E] as decoder (tied) + output_bias [V]. NeoBERT (chandar-lab/NeoBERT's
  # NeoBERTLMHead): nn.Linear(H, V) with a bias straight on the final norm's output: False/False.
  mlm_transform: bool = True            # the dense + act + norm before the decoder
  tie_word_embeddings: bool = True      # False: its own mlm_head/decoder [V, E] (HF's name)

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(f"BertConfig: hidden_size={self.hidden_size} is not divisible by "
                       f"num_heads={self.num_heads}; pick heads so that H/heads is whole.")
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"BertConfig: hidden_act={self.hidden_act!r} is not one of "
                       f"{ACTIVATIONS}.")
    for f in ("dtype", "param_dtype"):
      if getattr(self, f) not in ("float32", "bfloat16"):
        raise ValueError(f"BertConfig: {f}={getattr(self, f)!r}; use 'float32' or 'bfloat16'.")
    if self.attention not in attention_lib.BACKENDS:
      raise ValueError(f"BertConfig: attention={self.attention!r} is not one of "
                       f"{attention_lib.BACKENDS}.")
    if self.mlm_loss_chunk < 0:
      raise ValueError(f"BertConfig: mlm_loss_chunk={self.mlm_loss_chunk}; predictions a row per "
                       "chunk of the MLM loss (e.g. 128), 0 for whole logits.")
    if self.fused_bias_gelu and (self.hidden_act != "gelu_tanh" or self.ffn != "dense"):
      raise ValueError(
          f"BertConfig: fused_bias_gelu=True with hidden_act={self.hidden_act!r}, "
          f"ffn={self.ffn!r}: cuBLASLt's bias+GELU epilogue computes the tanh GELU of a dense "
          "FFN only; set hidden_act='gelu_tanh' too (google's gelu(); a change of the recipe: it "
          "differs from the exact erf GELU by up to 4.7e-4 per activation), or leave it off.")
    if self.fused_residual_norm and (self.prenorm or self.norm != "layer_norm"):
      raise ValueError(
          f"BertConfig: fused_residual_norm=True with prenorm={self.prenorm}, norm="
          f"{self.norm!r}: it fuses post-LN's LN(x + dropout(y)) with a LayerNorm (BERT, ALBERT, "
          "ELECTRA); the pre-norm layers (ModernBERT, NeoBERT) have no such sum to fuse.")
    family = _family(self.family)   # bert_jax/families/: what this family may set
    if self.share_layers not in SHARE_LAYERS:
      raise ValueError(f"BertConfig: share_layers={self.share_layers!r} is not one of "
                       f"{SHARE_LAYERS}.")
    if self.embedding_size < 0:
      raise ValueError(f"BertConfig: embedding_size={self.embedding_size}; expected >= 0 "
                       "(0 = hidden_size, no projection).")
    if self.embedding_size and not family.factorised_embeddings:
      raise ValueError(f"BertConfig: family={self.family!r} with embedding_size="
                       f"{self.embedding_size}; factorised embeddings are "
                       f"{_families_with('factorised_embeddings')}.")
    if self.share_layers != "none" and not family.shared_layers:
      raise ValueError(f"BertConfig: family={self.family!r} with share_layers="
                       f"{self.share_layers!r}; shared layers are "
                       f"{_families_with('shared_layers')}.")
    generator = [getattr(self, f) for f in GENERATOR_FIELDS]
    if family.generator != all(g > 0 for g in generator) or (
        not family.generator and any(generator)):
      raise ValueError(f"BertConfig: family={self.family!r} with generator sizes {generator} "
                       f"({', '.join(GENERATOR_FIELDS)}); the generator is "
                       f"{_families_with('generator')}, with all four > 0; every other family "
                       "has none.")
    if family.token_types != (self.type_vocab_size != 0) or self.type_vocab_size < 0:
      without = [f for f in _families().registered() if not f.token_types]
      why = (f"{family.display} has no token types (exactly 0)" if not family.token_types else
             f"{family.display} has token types (>= 1); "
             f"{'/'.join(f.display for f in without)} has no token types (exactly 0: "
             f"family={without[0].name!r})")
      raise ValueError(f"BertConfig: family={self.family!r} with type_vocab_size="
                       f"{self.type_vocab_size}; {why}.")
    parts = self.objective_list
    unknown = [o for o in parts if o not in OBJECTIVES]
    sentence = [o for o in parts if o in ("nsp", "sop")]
    if unknown or "mlm" not in parts or len(sentence) > 1 or len(set(parts)) != len(parts):
      raise ValueError(f"BertConfig: objectives={self.objectives!r}; expected 'mlm' plus at "
                       "most one of nsp/sop, optionally sbo, comma-separated (e.g. 'mlm,sop').")
    if family.exact_objectives and set(parts) != set(family.exact_objectives):
      raise ValueError(f"BertConfig: family={self.family!r} with objectives="
                       f"{self.objectives!r}; {family.display} is exactly "
                       f"{','.join(family.exact_objectives)!r}.")
    foreign = [(o, f) for f in _families().registered() if f.name != self.family
               for o in f.own_objectives if o in parts]
    if foreign:
      raise ValueError(f"BertConfig: family={self.family!r} with objectives="
                       f"{self.objectives!r}; {foreign[0][0]} is {foreign[0][1].display}'s "
                       f"alone (family={foreign[0][1].name!r}).")
    self._check_modern_fields()
    if family.check_config:
      family.check_config(self)

  def _check_modern_fields(self):
    for f, allowed in (("position_embedding", POSITION_EMBEDDINGS), ("ffn", FFNS),
                       ("norm", modern_layers.NORMS)):
      if getattr(self, f) not in allowed:
        raise ValueError(f"BertConfig: {f}={getattr(self, f)!r} is not one of {allowed}.")
    for f in ("rope_theta_global", "rope_theta_local"):
      if not getattr(self, f) > 1:
        raise ValueError(f"BertConfig: {f}={getattr(self, f)!r}; RoPE's theta must be > 1 "
                         "(ModernBERT: 160000 global, 10000 local).")
    if self.local_window < 0 or self.local_window % 2:
      raise ValueError(f"BertConfig: local_window={self.local_window}; an even number of tokens "
                       "(each query sees window/2 either side; ModernBERT: 128), 0 for none.")
    # A window of 2 (P - 1) already sees every key of a row of P positions (|i - j| <= P - 1);
    # a local layer with it still differs from a global one by its rope_theta_local (a
    # transformers ModernBERT whose local_attention >= 2 (P - 1) runs so: convert reads it so).
    reach = 2 * (self.max_position_embeddings - 1)
    if self.local_window > reach:
      raise ValueError(f"BertConfig: local_window={self.local_window} reaches past any row of "
                       f"max_position_embeddings={self.max_position_embeddings}; set "
                       f"local_window={reach} (local layers that see every key, with "
                       "rope_theta_local) or 0 (no window).")
    if self.global_every < 1:
      raise ValueError(f"BertConfig: global_every={self.global_every}; >= 1 (1: every layer "
                       "global; ModernBERT: 3).")
    modern = [f for f in MODERN_FIELDS if getattr(self, f) != _DEFAULTS[f]]
    if modern and (self.share_layers != "none" or self.factorised):
      raise ValueError(f"BertConfig: {modern[0]}={getattr(self, modern[0])!r} with share_layers="
                       f"{self.share_layers!r}, embedding_size={self.embedding_size}; the modern "
                       "encoder's fields need share_layers='none' and embedding_size=0.")
    head = [f for f in ("mlm_transform", "tie_word_embeddings") if not getattr(self, f)]
    if head and not self.prenorm:
      raise ValueError(f"BertConfig: {head[0]}=False needs prenorm=True (NeoBERT's MLM head; "
                       "the post-LN families' converters write BERT's tied head).")
    if not self.embedding_norm and not self.prenorm:
      raise ValueError("BertConfig: embedding_norm=False needs prenorm=True (a post-LN layer "
                       "reads its input unnormalised only after a norm).")
    if self.position_embedding == "rope" and self.head_dim % 2:
      raise ValueError(f"BertConfig: position_embedding='rope' with head size {self.head_dim}; "
                       "RoPE turns pairs of channels: pick heads so that H/heads is even.")

  def layer_attention(self, i):
    """(window or None, RoPE theta) of layer i: modern_layers.layer_attention of these fields."""
    return modern_layers.layer_attention(
        i, global_every=self.global_every, window=self.local_window or None,
        global_theta=self.rope_theta_global, local_theta=self.rope_theta_local)

  @property
  def objective_list(self) -> tuple:
    return tuple(o.strip() for o in self.objectives.split(",") if o.strip())

  @property
  def sentence_objective(self):
    """"nsp", "sop" or None: the two-class task on the pooled [CLS]."""
    return next((o for o in self.objective_list if o in ("nsp", "sop")), None)

  @property
  def has_pooler(self) -> bool:
    """The family's (DistilBERT and ELECTRA have none: their heads read the [CLS] state)."""
    return _family(self.family).pooler

  @property
  def factorised(self) -> bool:
    return self.embedding_size > 0

  @property
  def embed_dim(self) -> int:
    """Width of the embedding tables (E when factorised, else H)."""
    return self.embedding_size or self.hidden_size

  @property
  def head_dim(self):
    return self.hidden_size // self.num_heads

  def to_dict(self) -> dict:
    """The model's identity (what checkpoints store and resuming compares); no kernel choice."""
    d = dataclasses.asdict(self)
    del d["attention"], d["mlm_loss_chunk"]
    del d["fp8"], d["fused_bias_gelu"], d["fused_residual_norm"]   # switches of the step
    for f in FAMILY_FIELDS:   # BERT's values left out: old checkpoints compare equal
      if d[f] == _DEFAULTS[f]:
        del d[f]
    return d

  @classmethod
  def from_dict(cls, d) -> "BertConfig":
    """The config of a stored dict: its family's record (Family.config_class, e.g. MobileBERT's
    subclass with its own fields) when called on BertConfig."""
    if cls is BertConfig:
      cls = config_class(d.get("family", "bert"))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"BertConfig.from_dict: unknown keys {unknown}; known keys are "
                       f"{sorted(known)}.")
    return cls(**dict(d))


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(BertConfig)}


def _families():
  # The table of families (bert_jax/families/registry.py imports nothing of ours; the family
  # modules import this one and register themselves, loaded by name on the first lookup).
  return families_registry


def _family(name):
  try:
    return _families().get(name)
  except ValueError as e:
    raise ValueError(f"BertConfig: family={name!r}: {e}") from None


def _families_with(field, value=True):
  """ "albert's: set family='albert'" (or "... (or 'electra')"): the families with `field`."""
  found = [f.name for f in _families().registered() if getattr(f, field) == value]
  if not found:
    return "no family's"
  more = f" (or {', '.join(repr(n) for n in found[1:])})" if found[1:] else ""
  return f"{'/'.join(found)}'s: set family={found[0]!r}{more}"


def __getattr__(name):
  """PRESETS and FAMILIES, read from the registry each time (a registered family's presets are
  in it): bert_jax/families/<name>.py declares them."""
  if name == "PRESETS":
    return _families().presets()
  if name == "FAMILIES":
    return _families().names()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def config_class(family) -> type:
  """The config record of `family`: BertConfig, or the family's subclass with its own fields."""
  return _family(family).config_class or BertConfig


def get_bert_config(name: str, **overrides) -> BertConfig:
  """A preset by name ("base", "large", "tiny", ..., "L-4_H-256"), with field overrides."""
  presets = _families().presets()
  if name not in presets:
    raise ValueError(f"Unknown BERT model {name!r}; known: {', '.join(presets)}.")
  fields = {**presets[name], **overrides}
  return config_class(fields.get("family", "bert"))(**fields)
