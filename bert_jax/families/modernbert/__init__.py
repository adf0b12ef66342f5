"""ModernBERT (Warner et al. 2024, arXiv 2412.13663) and NeoBERT (Breton et al. 2025,
arXiv 2502.19587): the modern encoder as presets of our one encoder (model.py's modern fields).

What differs from BERT, each a BertConfig field (model.py) rather than a second model:
  position_embedding="rope"  no position table; q, k turned (theta 10,000 on every layer in the
                              first phase, the global layers' raised to 160,000 by `phase2`)
  local_window=128, global_every=3   layers 0, 3, 6, ... global, the others see |i - j| <= 64
  ffn="geglu" (NeoBERT "swiglu")     Wi [H, 2I], Wo [I, H] (modern_layers.GatedFeedForward)
  norm="layer_norm_no_bias" (NeoBERT "rms_norm"), eps 1e-5, prenorm with a final norm
  use_bias=False              no bias in q/k/v/o, Wi/Wo or the MLM transform (the decoder keeps
                              its bias, as HF's decoder_bias=True)
  (NeoBERT) mlm_transform=False, tie_word_embeddings=False: its NeoBERTLMHead, an untied
                              nn.Linear(H, V) with a bias on the final norm's output
  type_vocab_size=0, no pooler, MLM only (30%, no sentence objective; NeoBERT 20%, all [MASK]:
                              `recipe`)

Parameter tree against transformers' ModernBertForMaskedLM (families/modernbert/convert.py maps them):
  bert/embeddings/word_embeddings/embedding [V, H]    model.embeddings.tok_embeddings.weight
  bert/embeddings/layer_norm/scale [H]                model.embeddings.norm.weight
  bert/encoder/layer_{i}/attention/{query,key,value}/kernel [H, N, D]
                                                      model.layers.{i}.attn.Wqkv.weight [3H, H]
  bert/encoder/layer_{i}/attention/output/kernel [N, D, H]   model.layers.{i}.attn.Wo.weight
  bert/encoder/layer_{i}/attention_layer_norm/scale   model.layers.{i}.attn_norm.weight (i > 0)
  bert/encoder/layer_{i}/output_layer_norm/scale      model.layers.{i}.mlp_norm.weight
  bert/encoder/layer_{i}/mlp/{Wi,Wo}/kernel           model.layers.{i}.mlp.{Wi,Wo}.weight
  bert/encoder/final_norm/scale                       model.final_norm.weight
  mlm_head/transform/kernel, transform_layer_norm     head.dense.weight, head.norm.weight
  mlm_head/output_bias [V]                            decoder.bias (decoder.weight tied)
A fine-tuned head is HF's ModernBertFor{SequenceClassification,MultipleChoice,TokenClassification,
QuestionAnswering}'s: head/{dense,norm} on the [CLS] state (classifier_pooling="cls") or on every
position (tagging, span), dropout, classifier.
"""

import dataclasses

from flax import linen as nn
from ml_collections import config_dict

from bert_jax.models import model as model_lib
from bert_jax.families import bert
from bert_jax.families import registry as families

# transformers' ModernBertConfig defaults (base): norm_eps 1e-5, no biases, dropout 0 everywhere
# (embedding_dropout, attention_dropout, mlp_dropout, classifier_dropout), gelu (exact). RoPE
# theta as a model trained from scratch starts: 10,000 on every layer, ModernBERT's first phase
# (Warner et al. 2024, section 2.2: "after training on 1.7 trillion tokens at a 1024 sequence
# length and RoPE theta of 10,000"); `phase2` raises the global layers' to 160,000, the released
# models' value (transformers' default_theta["global"]). A converted or pre-trained checkpoint
# keeps its own (train.model_from_init_checkpoint).
_MODERNBERT = dict(
    family="modernbert", objectives="mlm", type_vocab_size=0, position_embedding="rope",
    rope_theta_global=10_000.0, rope_theta_local=10_000.0, local_window=128, global_every=3,
    ffn="geglu", norm="layer_norm_no_bias", prenorm=True, use_bias=False, layer_norm_eps=1e-5,
    hidden_dropout_prob=0.0, attention_dropout_prob=0.0, vocab_size=50_368,
    max_position_embeddings=8_192, hidden_act="gelu")

PRESETS = {
    # 22 x 768, 12 heads, GeGLU 1,152: 149,014,272 parameters in ModernBertModel (transformers).
    "modernbert-base": dict(_MODERNBERT, num_layers=22, hidden_size=768, num_heads=12,
                            intermediate_size=1_152),
    # 28 x 1,024, 16 heads, GeGLU 2,624: 394,781,696 (tests/bert_jax/families/modernbert/modernbert_test.py counts both).
    "modernbert-large": dict(_MODERNBERT, num_layers=28, hidden_size=1_024, num_heads=16,
                             intermediate_size=2_624),
    # NeoBERT (Le Breton et al. 2025, Table 1; chandar-lab/NeoBERT src/neobert/model/model.py
    # with conf/model/{neobert,250M-opt}.yaml and its released config.json): 28 x 768, 12 heads,
    # SwiGLU of width swiglu_width(3,072) = 2,048, no biases, RMSNorm (eps 1e-5), RoPE theta
    # 10,000 on every (global) layer, 4,096 context, no norm on the embeddings (layer 0
    # normalises its input), a final norm, BERT's 30,522 WordPiece vocab, and NeoBERTLMHead's
    # decoder: an untied nn.Linear(768, 30,522) with a bias, no transform. 245,136,954
    # parameters, 221,665,536 of them the encoder (tests/bert_jax/families/modernbert/neobert_test.py counts both from the
    # reference's shapes). Its HF port is remote code, not transformers: no converter here.
    "neobert": dict(_MODERNBERT, num_layers=28, hidden_size=768, num_heads=12,
                    intermediate_size=2_048, ffn="swiglu", norm="rms_norm", local_window=0,
                    global_every=1, embedding_norm=False, mlm_transform=False,
                    tie_word_embeddings=False, max_position_embeddings=4_096, vocab_size=30_522),
    # CPU sizes (tests, the quick start): ModernBERT's shape at BERT-tiny/mini widths, window 16.
    "modernbert-tiny": dict(_MODERNBERT, num_layers=3, hidden_size=128, num_heads=2,
                            intermediate_size=192, local_window=16, max_position_embeddings=1_024),
    "modernbert-mini": dict(_MODERNBERT, num_layers=6, hidden_size=256, num_heads=4,
                            intermediate_size=384, local_window=32, max_position_embeddings=1_024),
}


def check_config(config):
  if config.position_embedding != "rope" or not config.prenorm or config.ffn == "dense":
    raise ValueError(f"BertConfig: family={config.family!r} with position_embedding="
                     f"{config.position_embedding!r}, prenorm={config.prenorm}, ffn="
                     f"{config.ffn!r}; the modern encoder is rope, prenorm=True and a gated "
                     "ffn (geglu | swiglu).")


# ModernBERT's own training configs, the source of the first phase's numbers below (read
# 2026-11-26): BASE_YAML = answerdotai/ModernBERT yamls/modernbert/modernbert-base-pretrain.yaml
# (commit 94c82d1); LARGE_YAML = yamls/modernbert/modernbert-large-pretrain.yaml, which the stored
# upstream snapshot lacks: read from a fork's copy (qkchambers/ModernBERT-Diffusion aa5c5ce; the
# same keys on the same lines as upstream's base; the fork edited its own base yaml, so this is a
# copy, not upstream's file). The paper (Warner et al. 2024, section 2.2, Table 3) agrees where it
# gives a number.
#
# Batch-size warmup (section 2.2.2; bert_jax/training/batch_warmup.py): the first phase's batch grows from
# 768 to 4,608 rows (base: 6 sizes, +768 = 8 GPUs x 96 rows each) over the first 50B tokens,
# 448 -> 4,928 (large: 11 sizes of 8 x 56) over 10B, each size for the same number of steps.
# (batch_size, batch_size_warmup_min_size, batch_size_warmup_tokens). Checked against the yamls:
# line 117 global_train_batch_size 4608 | 4928; line 77 batch_size_warmup_min_size =
# device_train_microbatch_size, line 123 96 | line 130 56 (one micro-batch a GPU: its packer,
# src/sequence_packer.py GreedyBestFitSequencePacker.from_composer, counts the ramp in
# micro-batches); line 78 batch_size_warmup_tokens 50_000_000_000tok | 10_000_000_000tok. The 8
# GPUs are the paper's (and 4,608 / 96 = 48, 4,928 / 56 = 88: 8 GPUs x 6 | 11 units). Off for
# neobert (its paper has none) and the CPU presets (tiny, mini: a laptop's run is ~6M tokens);
# the context extension (phase2) has none either.
BATCH_WARMUP = {"modernbert-base": (4_608, 768, 50e9), "modernbert-large": (4_928, 448, 10e9)}

# The first phase, every field the yamls set (BASE_YAML / LARGE_YAML line numbers):
#   line 4 max_seq_len 1024; line 6 mlm_probability 0.3 -> seq_length 1,024, 312 predictions
#   lines 98-102 scheduler warmup_stable_decay, t_warmup 3_000_000_000tok (large 2_000_000_000),
#     alpha_f 0.00, t_decay 0tok -> schedule wsd, decay_steps 0: linear warmup, then constant to
#     the end (the 1-sqrt decay is the context extension's; optimizer.create_wsd_schedule takes
#     decay_steps 0 as no decay piece)
#   lines 104-111 optimizer decoupled_stableadamw, lr 8e-4 (large 5e-4), betas [0.9, 0.98], eps
#     1.0e-06, weight_decay 1.0e-5; line 112 filter_bias_norm_wd true (no decay on norms and
#     biases: weight_decay_all_tensors False, the default)
#   line 115 max_duration 1_719_000_000_000tok
# Large's 5e-4: line 106 says "This learning rate was too high and required a restart. You'll want
# to reduce it."; the paper (section 2.2.3): 5e-4 for 900B tokens, then rolled back and restarted
# at 5e-5 for the remaining 800B (weight decay 1e-6 after it: modernbert-large-context-extension
# .yaml's optimizer comments). The preset keeps the yaml's start; the restart is not modelled
# (docs/models.md). Large's start from base's weights (LARGE_YAML lines 120-125
# init_from_checkpoint, tile_weights_from_middle) is not modelled either.
PHASE1 = dict(seq_length=1_024, optimizer="stable_adamw", b1=0.9, b2=0.98, eps=1e-6,
              schedule="wsd", decay_steps=0, final_lr_fraction=0.0)
# Per preset: (learning rate, weight decay, warmup tokens). Durations are tokens in the yamls and
# optimizer steps here: the step at which the tokens trained on (rows x 1,024, batch_warmup's
# Ramp.rows_through, the ramp's smaller steps counted) first reach them. Base: the 3B warmup tokens
# lie in the ramp's first size (768 x 1,024 = 786,432 a step): ceil(3e9 / 786,432) = 3,815 steps
# (636 at the full batch, as docs/models.md said before, would be 0.5B tokens); the ramp's
# 21,194 steps train 50.0B tokens, the rest 1,669.0B / 4,718,592 = 353,707.x: 374,901 steps.
# Large: 2B tokens at step 1,666 (in the ramp's 5th size, 2,240 rows); the ramp's 3,965 steps
# train 10.0B, then / 5,046,272: 342,631. Without the ramp (batch_size_warmup_min_size=0) 1.719T
# is 364,304 steps (base) | 340,648 (large). tests/bert_jax/families/modernbert/modernbert_phase2_test.py recounts them.
PHASE1_TOKENS = 1.719e12
PHASE1_RATES = {"modernbert-base": (8e-4, 1e-5, 3e9), "modernbert-large": (5e-4, 1e-5, 2e9)}
PHASE1_STEPS = {"modernbert-base": (3_815, 374_901), "modernbert-large": (1_666, 342_631)}


# NeoBERT's pre-training, from its reference code (github.com/chandar-lab/NeoBERT, the mirror's
# HEAD ed75b68): conf/pretraining.yaml (defaults: datacollator mlm_20, optimizer adamw, scheduler
# cosine_decay, trainer mlm) run by jobs/neobert.sh. What our config cannot say (the 4,096
# phase) is in docs/models.md.
NEOBERT_RECIPE = dict(
    # conf/datacollator/mlm_20.yaml lines 1, 3: mlm_probability 0.20, mask_all true, which picks
    # src/neobert/collator/collator.py's CustomCollatorForMLM: "100% MASK" (lines 11, 27-28),
    # every selected token becomes [MASK], none random, none kept.
    masked_lm_prob=0.2, mask_replace_prob=1.0, random_replace_prob=0.0,
    # jobs/neobert.sh line 49 tokenizer.max_length=1024 (conf/tokenizer/google.yaml line 4);
    # rows: 8 GPUs x dataloader.train.batch_size 64 (line 48) x gradient_accumulation_steps 4
    # (line 47) = 2,048 x 1,024 = 2,097,152 tokens a step (2M; x 1M steps = 2.1T tokens).
    seq_length=1_024, batch_size=2_048,
    # conf/trainer/mlm.yaml line 5 max_steps 1,000,000; conf/scheduler/cosine_decay.yaml lines
    # 1-3 warmup_steps 2,000, decay_steps 900,000, decay cosine, with scheduler.py's default
    # final_ratio 0.1 (optimizer.create_cosine_schedule: warmup from 1e-4 x lr, a cosine to 10%
    # by step 900,000, flat to 1M). decay_steps is set in `recipe`: 90% of num_train_steps.
    num_train_steps=1_000_000, warmup_steps=2_000, schedule="cosine", final_lr_fraction=0.1,
    # conf/optimizer/adamw.yaml lines 1-6: torch AdamW, lr 1e-4, betas (0.9, 0.95), eps 1e-8,
    # weight_decay 0.01; conf/trainer/mlm.yaml line 7 gradient_clipping 1 (norm 1.0).
    optimizer="adamw", learning_rate=1e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01,
    clip_norm=1.0,
    # src/neobert/optimizer/optimizer.py: AdamW(model.parameters(), ...), one group, so the
    # RMSNorm scales and the decoder's bias decay too (its GLUE fine-tuning alone excludes
    # "bias" and "LayerNorm.weight", src/neobert/glue/train.py).
    weight_decay_all_tensors=True)


def recipe(c, preset):
  """ModernBERT's pre-training (Warner et al. 2024, section 2.2): MLM at 30% with no sentence
  objective (records from create_pretraining_data --no_nsp). base, large: the first phase's
  recipe (BATCH_WARMUP, PHASE1): 1,024-token rows, StableAdamW, warmup then constant, 1.719T
  tokens; tiny, mini keep BERT's loop (128 tokens, adamw, linear). Predictions per row as
  google's int((p + 0.005) x T): 39 at T=128, 312 at 1,024.
  neobert: NeoBERT's (NEOBERT_RECIPE): 20%, all [MASK], 209 predictions at 1,024."""
  c.masked_lm_prob = 0.3
  if preset == "neobert":
    c.update(NEOBERT_RECIPE)
    # The reference's cosine ends at 900,000 of 1M steps: 9N // 10, a reference as phase2's, so
    # --config.num_train_steps=N moves it (runlocal's 1,500 steps: 1,350).
    c.decay_steps = c.get_ref("num_train_steps") * 9 // 10
  if preset in BATCH_WARMUP:   # the first phase's batch and its warmup (base, large)
    c.batch_size, c.batch_size_warmup_min_size, c.batch_size_warmup_tokens = BATCH_WARMUP[preset]
  if preset in PHASE1_STEPS:   # the first phase's optimizer and schedule (PHASE1)
    c.update(PHASE1)
    c.learning_rate, c.weight_decay, _ = PHASE1_RATES[preset]
    c.warmup_steps, c.num_train_steps = PHASE1_STEPS[preset]
  c.max_predictions_per_seq = int((c.masked_lm_prob + 0.005) * c.seq_length)
  # RoPE theta of the global layers. None: the preset's from scratch (10,000, the first phase),
  # the checkpoint's own with init_checkpoint (a converted ModernBERT: 160,000). A value that
  # differs from the checkpoint's is taken and said in one line (`phase2`: 160,000, the context
  # extension); theta is no parameter, so the weights load unchanged.
  c.model.rope_theta_global = config_dict.placeholder(float)
  # The longest row the model takes. None: the preset's (tiny, mini: 1,024; base, large: 8,192).
  # RoPE has no position table, so it is a limit, not a parameter: benchmarks/long_context.py
  # trains modernbert-tiny on 8,192-token rows with --config.model.max_position_embeddings=8192.
  c.model.max_position_embeddings = config_dict.placeholder(int)


# ModernBERT's context extension (Warner et al. 2024, section 2.2 and appendix A, Table 3
# "Context Extension: Phase One / Phase Two"): from the first phase's checkpoint, the global
# layers' RoPE theta 10,000 -> 160,000 (local layers keep 10,000) and 8,192-token rows for 300B
# tokens, no warmup: 250B at a constant rate, then the decay phase, 50B tokens with a 1-sqrt
# schedule (our wsd with warmup 0: the last 50/300 = 1/6 of the steps). StableAdamW, betas
# (0.9, 0.98), eps 1e-6 in every phase. Per preset: (rows per batch, learning rate, weight
# decay). Base's rate is lowered from its first phase's 8e-4; large already trained at 5e-5 (the
# paper's footnote 6: its first-phase restart). Checked against ModernBERT's yamls
# (yamls/modernbert/modernbert-{base,large}-{context-extension,learning-rate-decay}.yaml, read in
# qkchambers/ModernBERT-Diffusion aa5c5ce; upstream's are not in the stored snapshot), which win
# where our comments differed before 2026-11-26:
#   global_train_batch_size 576 | 616 rows (decay phase 576 | 624): global, as in the first
#     phase (main.py divides it by the world size), i.e. 8 GPUs x Table 3's 72 | 77 (78), and the
#     same tokens a step as phase 1 (576 x 8,192 = 4,608 x 1,024). This table said 72 | 77 rows,
#     8x fewer tokens a step and 8x the steps (508,626 | 475,598) for the same 300B.
#   lr 3e-4 | 5e-5, weight_decay 1e-5 | 1e-6; max_duration 250_000_000_000tok (scheduler
#     constant_with_warmup, t_warmup 0tok) then 50_000_000_000tok (one_minus_sqrt, t_decay the
#     whole run, alpha_f 0.001: the decay ends at 0.001 x lr, our final_lr_fraction; it said 0).
# Large's decay phase took 624 rows (616 before): one batch here.
CONTEXT_EXTENSION = {"modernbert-base": (576, 3e-4, 1e-5), "modernbert-large": (616, 5e-5, 1e-6)}
CONTEXT_EXTENSION_TOKENS, DECAY_TOKENS, DECAY_FINAL_FRACTION = 300e9, 50e9, 0.001
EXTENDED_THETA = 160_000.0


def phase2(c, preset):
  """`--config=...:modernbert-base,phase2 --config.init_checkpoint=PHASE1`: the context
  extension. base: 576 x 8,192 = 4,718,592 tokens a step, 300B / 4,718,592 = 63,578 steps, the
  last 10,596 (50B) decaying; large: 616 x 8,192 = 5,046,272, 59,449 steps, 9,908 decaying. The CPU
  presets (tiny, mini) take base's rows, steps and rates at their own limit, 1,024 tokens."""
  if preset not in CONTEXT_EXTENSION and preset not in ("modernbert-tiny", "modernbert-mini"):
    raise ValueError(f"--config=...:{preset},phase2: no context-extension recipe for {preset} "
                     "(ModernBERT's is modernbert-{base,large,tiny,mini}); set --config."
                     "seq_length, --config.num_train_steps and --config.init_checkpoint on the "
                     f"plain {preset} preset instead.")
  rows, lr, wd = CONTEXT_EXTENSION.get(preset, CONTEXT_EXTENSION["modernbert-base"])
  c.seq_length = min(8_192, PRESETS[preset]["max_position_embeddings"])
  c.max_predictions_per_seq = int((c.masked_lm_prob + 0.005) * c.seq_length)   # 2,498 at 8,192
  c.model.rope_theta_global = EXTENDED_THETA
  c.batch_size, c.batch_size_warmup_min_size = rows, 0   # no batch-size warmup in this phase
  c.num_train_steps = int(CONTEXT_EXTENSION_TOKENS / (rows * 8_192))   # (CPU sizes: base's)
  c.warmup_steps = 0
  c.learning_rate, c.weight_decay = lr, wd
  c.optimizer, c.b1, c.b2, c.eps = "stable_adamw", 0.9, 0.98, 1e-6
  c.schedule, c.final_lr_fraction = "wsd", DECAY_FINAL_FRACTION
  # The decay is the last sixth of whatever num_train_steps ends up (runlocal's 1,500, or
  # --config.num_train_steps=N): a reference, so it follows.
  c.decay_steps = c.get_ref("num_train_steps") // int(CONTEXT_EXTENSION_TOKENS // DECAY_TOKENS)


def flops_per_sequence(cfg, seq_length, num_predictions, num_nsp=1, teacher_config=None):
  """Analytic training FLOPs per sequence (3 x forward, 2 a multiply-add), as BERT's
  (families/bert/): per token 6 x (4H^2 for q,k,v,o + 3HI for the gated FFN's Wi [H, 2I] and
  Wo [I, H]); attention scores + context 12 x T x S x H per layer with S = T on global layers and
  S = min(T, W + 1) keys on local ones (|i - j| <= W/2: what the blocked kernel's output depends
  on, not the 3W/2 keys it computes); the MLM head (H -> H transform, tied H -> V decoder) on the
  masked positions (NeoBERT's: the H -> V decoder alone). No pooler, no sentence head, no
  position table."""
  del num_nsp, teacher_config
  h, l, t, i, v = cfg.hidden_size, cfg.num_layers, seq_length, cfg.intermediate_size, \
      cfg.vocab_size
  dense = 6 * l * (4 * h * h + 3 * h * i) * t
  attention = bert.attention_flops_per_sequence(cfg, t)
  mlm_head = 6 * num_predictions * ((h * h if cfg.mlm_transform else 0) + h * v)
  return dense + attention + mlm_head


class PredictionHead(nn.Module):
  """transformers' ModernBertPredictionHead: dense H -> H (classifier_bias=False), act, norm
  (bias-free LayerNorm): the transform a ModernBERT classifier reads [CLS] through."""
  config: model_lib.BertConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    x = model_lib._dense(c, c.hidden_size, ("embed", "embed2"), "dense")(x)   # [B, (K,) H]
    x = model_lib._activation(c.hidden_act)(x)
    return model_lib._layer_norm(c, "norm")(x).astype(c.dtype)


def _head_logits(config, x, num_labels, deterministic):
  """transformers' ModernBertFor* head: head (dense + GELU + norm), dropout (classifier_dropout
  0.0), classifier dense with a bias. The names are HF's: a fine-tuned tree reads {bert, head,
  classifier}. [..., H] -> [..., L]."""
  x = PredictionHead(config, name="head")(x)
  x = nn.Dropout(0.0)(x, deterministic=deterministic)   # HF's classifier_dropout default
  return bert.head_dense(config, num_labels, "classifier")(x)


def cls_logits(config, out, num_labels, deterministic):
  """ModernBertForSequenceClassification's head (classifier_pooling="cls") on the last layer's
  [CLS] state: [B, (K,) H] -> [B, (K,) L]."""
  return _head_logits(config, out["cls_output"], num_labels, deterministic)


def token_logits(config, out, num_labels, deterministic, *, name="classifier", dropout=True):
  """ModernBertForTokenClassification's (tagging) and ModernBertForQuestionAnswering's (span,
  L = 2: start, end) head: the same head on every position, [B, T, H] -> [B, T, L]."""
  del name, dropout   # both tasks' classes are the same network (its own dropout, "classifier")
  return _head_logits(config, out["sequence_output"], num_labels, deterministic)


def describe(config, purpose, params_keys=(), do_train=True):
  del params_keys
  shape = (f"{config.num_layers} pre-norm layers of width {config.hidden_size}, RoPE, "
           f"{config.ffn}" + (f", window {config.local_window} (layers 0, {config.global_every}"
                              f", {2 * config.global_every}, ... global)"
                              if config.local_window else ""))
  if purpose == "predict":
    return f"ModernBERT: fill-mask with its MLM head ({shape})"
  if purpose == "features":
    return f"ModernBERT: features of params['bert'] ({shape}; no token types)"
  if not do_train:
    return "ModernBERT: evaluating params['bert'] with its fine-tuned head"
  return (f"ModernBERT: fine-tuning params['bert'] ({shape}) under transformers' ModernBertFor* "
          "head, new (head: dense + GELU + norm on [CLS], or on every position for tagging and "
          "SQuAD; classifier)")


def _hf_config_file(path):
  return bert.hf_config_file(path)


import_hf, _export_hf = bert.own_hf_converter("modernbert", importer="import_hf",
                                               exporter="export_model")


def export_hf(m, output):
  """transformers' ModernBertForMaskedLM ties its decoder and has the head's transform: a model
  with mlm_transform/tie_word_embeddings False (NeoBERT's head) has no such folder."""
  untied = [f for f in ("mlm_transform", "tie_word_embeddings") if not getattr(m.config, f)]
  if untied:
    from bert_jax.families.modernbert import convert as convert_modernbert  # pylint: disable=g-import-not-at-top
    raise convert_modernbert.ConversionError(
        f"{m.path}: {untied[0]}=False (NeoBERT's MLM head); transformers' ModernBertForMaskedLM "
        "has a tied decoder after a dense + norm transform, and NeoBERT is not in transformers.")
  return _export_hf(m, output)


def hf_body(params, config):
  """("ModernBertModel", its tensors): the body's names with "model." cut, as
  ModernBertModel.save_pretrained names them (a sentence-transformers folder's weights)."""
  from bert_jax.families.modernbert import convert as convert_modernbert  # pylint: disable=g-import-not-at-top
  state = convert_modernbert.hf_state_dict(params, config, head=None)
  return "ModernBertModel", {k.removeprefix("model."): v for k, v in state.items()}


def hf_config_json(config, pad_token_id=0):
  from bert_jax.families.modernbert import convert as convert_modernbert  # pylint: disable=g-import-not-at-top
  return convert_modernbert.hf_config_json(config, pad_token_id)


def num_params(cfg, with_mlm_head=False):
  """Parameters of ModernBertModel (the encoder; + ModernBertForMaskedLM's head and decoder bias
  with with_mlm_head, or NeoBERTLMHead's untied decoder [V, H] and bias), counted from the
  config: what transformers counts."""
  h, l, i, v = cfg.hidden_size, cfg.num_layers, cfg.intermediate_size, cfg.vocab_size
  bias = cfg.use_bias
  norm = h * (2 if cfg.norm == "layer_norm" else 1)
  attention = 4 * h * h + (4 * h if bias else 0)
  ffn = 3 * h * i + ((2 * i + h) if bias else 0)
  norms = 2 * l - (1 if cfg.embedding_norm else 0)   # layer 0's attention norm is Identity
  total = (v * h + (norm if cfg.embedding_norm else 0) + l * (attention + ffn) + norms * norm
           + norm)                                  # + final norm
  if with_mlm_head:
    total += v + (h * h + (h if bias else 0) + norm if cfg.mlm_transform else 0) + (
        0 if cfg.tie_word_embeddings else v * h)
  return int(total)


FAMILY = families.register(dataclasses.replace(
    bert.FAMILY, name="modernbert", presets=PRESETS, plain_teacher=False, title="ModernBERT",
    summary="ModernBERT (Warner et al. 2024) / NeoBERT (Breton et al. 2025): pre-norm, RoPE, "
            "GeGLU/SwiGLU, local+global attention, MLM only at 30%",
    token_types=False, pooler=False, exact_objectives=("mlm",), check_config=check_config,
    recipe=recipe, phase2=phase2, flops_per_sequence=flops_per_sequence, cls_logits=cls_logits,
    token_logits=token_logits,
    describe=describe, hf_model_types=("modernbert",), hf_config_file=_hf_config_file,
    tf_config_names=(), config_marker_keys=(), import_hf=import_hf, export_hf=export_hf,
    hf_config_json=hf_config_json, hf_class="ModernBertForMaskedLM", hf_body=hf_body))
