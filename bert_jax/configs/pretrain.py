r"""BERT pre-training presets (the paper's recipe: Devlin et al. 2018, section A.2).

  python -m bert_jax.train --config=bert_jax/configs/pretrain.py:base \
      --workdir=gs://BUCKET/bert-base-phase1 \
      --config.train_input_files='gs://BUCKET/data/seq128/train-*' \
      --config.eval_input_files='gs://BUCKET/data/seq128/eval-*' \
      --config.vocab_file=gs://BUCKET/vocab.txt

The argument after ':' is PRESET[,phase2][,annealed][,fast][,runlocal]:
  PRESET    a model size: tiny, mini, small, medium, base, large, or a miniature L-4_H-256;
            ALBERT: albert-{tiny,mini,base,large,xlarge,xxlarge} (records from
            create_pretraining_data --sop; n-gram masking); SpanBERT: spanbert, spanbert-large,
            spanbert-{tiny,mini} (records from --no_nsp; span masking); ELECTRA:
            electra-{small,base,large} (the paper's recipe below) and electra-{tiny,mini}
            (records from --no_nsp; a generator and a discriminator, bert_jax/families/electra/objective.py);
            DistilBERT: distilbert-{tiny,mini,base} with --config.teacher_checkpoint=TEACHER
            (records from --no_nsp; bert_jax/families/distilbert/distil.py). docs/models.md.
  phase2    the paper's second phase: seq 512, 80 predictions, 100k steps, started from phase 1's
            parameters (--config.init_checkpoint=PHASE1_WORKDIR) with a fresh optimizer.
            ModernBERT: its context extension, 8,192 tokens with the global layers' RoPE theta
            raised to 160,000 (families/modernbert/ phase2; docs/models.md).
  annealed  mmBERT's schedule shape (arXiv 2509.06888) over config.train_sources: three phases of
            60/30/10% of the steps at tau 0.7 -> 0.5 -> 0.3 and 30% -> 15% -> 5% masking
            (config.phases; add sources=... to a phase to hold sources back, as mmBERT's 60 ->
            110 -> 1,833 languages). data_pipelines/input/phases.py, docs/non_english.md.
  fast      no dropout on the attention probabilities (attention_dropout_prob=0, as MosaicBERT
            and ModernBERT train), so the fused attention kernels (cuDNN, Pallas, splash) can run
            in training; the paper's 0.1 stays the default. Trade-off: docs/attention.md.
  runlocal  shrinks everything so a laptop CPU runs it in minutes (the README's first command).

Recipe arithmetic: 256 sequences x 128 tokens = 32,768 tokens/step; 90% of 1M steps at 128 = 900k
steps (29.5B tokens), then 10% = 100k steps at 512 (13.1B tokens).
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg="base"):
  parts = [p for p in (arg or "base").split(",") if p]
  preset = parts[0]
  variants = set(parts[1:])
  unknown = variants - {"phase2", "annealed", "fast", "runlocal"}
  if unknown:
    raise ValueError(f"--config=...:{arg}: unknown variant(s) {sorted(unknown)}; use "
                     "PRESET[,phase2][,annealed][,fast][,runlocal].")

  from bert_jax import families  # pylint: disable=g-import-not-at-top
  family = families.presets().get(preset, {})   # an unknown preset is train's one-line error
  recipe = families.of_preset(preset) or families.get("bert")   # bert_jax/families/<name>.py
  c = ml_collections.ConfigDict()
  c.model_name = preset            # see model.get_bert_config: tiny..large or L-{L}_H-{H}
  # Overrides of BertConfig fields (vocab_size is taken from the vocab file when left None).
  c.model = ml_collections.ConfigDict(dict(
      vocab_size=ml_collections.FieldReference(None, field_type=int),
      dtype="float32",             # "bfloat16" on TPU/GPU: bf16 compute, f32 params and Adam state
      # The preset's (BERT: 0.1, 0.1, gelu; ALBERT v2: 0, 0, gelu_tanh).
      hidden_dropout_prob=family.get("hidden_dropout_prob", 0.1),
      attention_dropout_prob=family.get("attention_dropout_prob", 0.1),
      # None = the preset's (exact erf GELU, as HF "gelu"; ALBERT: "gelu_tanh", the tanh form
      # google-research/bert uses), or with init_checkpoint the checkpoint's own.
      hidden_act=config_dict.placeholder(str),
      # The family (docs/models.md); None = the preset's: mlm,nsp (BERT) | mlm,sop (ALBERT) |
      # mlm,sbo (SpanBERT); "mlm" alone is RoBERTa's recipe on --no_nsp records.
      objectives=config_dict.placeholder(str),
      share_layers=config_dict.placeholder(str),   # ALBERT: all (preset) | attention | ffn
      remat=False,                 # recompute each layer in the backward pass (seq 512 / large)
      # Attention kernel (bert_jax/layers/attention.py): auto = the fastest that supports the rows on this
      # chip (TPU splash; GPU cuDNN / Pallas; CPU xla). Attention dropout > 0 in training needs
      # the probabilities, so auto trains on xla unless the `fast` variant sets it to 0.
      attention="auto",
      # FP8 matmuls for the encoder's QKV, attention output and FFN (bert_jax/layers/fp8.py; Hopper's
      # FP8 GEMMs; on CPU an emulation of the same numerics). The scales are checkpointed with
      # the state and never exported.
      fp8=False,
      # Epilogues XLA fuses (bert_jax/layers/fused_ops.py): the FFN's bias + GELU (needs
      # hidden_act="gelu_tanh", a change of the recipe: say so), post-LN's residual + LayerNorm.
      fused_bias_gelu=False,
      fused_residual_norm=False,
      # The MLM loss this many predictions a row at a time (0: whole [B, P, V] logits); for large
      # vocabularies (256k: mmBERT, Gemma), where the logits are the step's largest tensor.
      mlm_loss_chunk=0,
  ))

  _input_fields(c)
  c.masking = recipe.masking                        # token (BERT) | ngram (ALBERT) | span
  c.whole_word_masking = recipe.whole_word_masking  # ALBERT's n-grams / SpanBERT's spans of words
  _optimizer_and_loop_fields(c)
  # DistilBERT's teacher (bert_jax/families/distilbert/distil.py): a BERT workdir, export or Hugging Face folder;
  # its path and manifest hash go into every checkpoint's meta and resuming checks them.
  c.teacher_checkpoint = ""
  if recipe.recipe:   # the paper's values of that family (e.g. ELECTRA's Table 6)
    recipe.recipe(c, preset)
  _apply_variants(c, preset, variants, recipe)
  return c


def _input_fields(c):
  # Input: TFRecords from `python -m data_pipelines.create_pretraining_data`.
  c.train_input_files = ""         # glob, comma-separated globs allowed
  c.eval_input_files = ""          # held-out records; empty = no evaluation
  # A mixture of named sources instead (data_pipelines/input/mixture.py; then train_input_files stays
  # empty): 'ko=data/ko/train-*;en=data/en/train-*', each from its own create_pretraining_data
  # run. Shares: source_weights 'ko=0.7,en=0.3', else records^source_tau (1.0 proportional to
  # size; XLM-R 0.3, mBERT 0.7). Start-up prints the shares, the summary each source's tokens.
  c.train_sources = ""
  c.source_weights = ""
  c.source_tau = 1.0
  # A schedule of the mixture and the masking rate (data_pipelines/input/phases.py; needs
  # train_sources): 'steps=60%,sources=en;de,tau=0.7,mask=0.3 | steps=40%,tau=0.3,mask=0.15'.
  # The phases' steps add up to num_train_steps (or 100%); start-up prints them.
  c.phases = ""
  c.vocab_file = ""                # WordPiece vocab.txt ...
  c.spm_model_file = ""            # ... or a SentencePiece model
  c.tokenizer_json = ""            # ... or a Hugging Face tokenizer.json (BPE/Unigram)
  # None: the vocab's casing (its .meta.json from build_vocab, or inferred for google/HF
  # vocabs); true/false is checked against it and against the records (one-line error).
  c.do_lower_case = config_dict.placeholder(bool)
  c.seq_length = 128
  c.max_predictions_per_seq = 20   # ~ 0.15 * 128 rounded up, as google-research/bert
  c.masked_lm_prob = 0.15
  # What a selected token becomes (transformers' DataCollatorForLanguageModeling names): [MASK]
  # with mask_replace_prob, a random token with random_replace_prob, itself otherwise. BERT's
  # 80/10/10; NeoBERT 1.0 / 0.0 (every one [MASK]). data_pipelines/input/masking.py.
  c.mask_replace_prob = 0.8
  c.random_replace_prob = 0.1      # the rest, 1 - both, stays as it was (BERT's 10%)
  # Whole words ("##" pieces; Chinese words too when the records carry jieba boundaries, which
  # then require it: docs/non_english.md).
  c.whole_word_masking = False
  # token (BERT) | ngram (ALBERT: n <= 3, p(n) ~ 1/n) | span (SpanBERT: geometric(0.2) spans of
  # up to 10 words, 80/10/10 per span; needed by the sbo objective). data_pipelines/input/masking.py.
  c.masking = "token"
  c.shuffle_buffer = 10_000        # records per logical shard's shuffle buffer
  c.input_stall_minutes = 10.0     # no batch for this long: an error naming the files
  # Packing (docs/packing.md): several instances per row, attention only within an instance, so
  # the step spends ~no compute on padding (quick start's records: 0.44 -> 0.99 real tokens per
  # slot). --config.pack=false trains on one instance per row.
  c.pack = True
  c.max_instances_per_pack = 0     # K, NSP slots per row; 0 = seq_length // 16 (128 -> 8)
  c.pack_chunk_size = 1024         # instances the best-fit packer looks at together
  # Logical shards (data_pipelines/input/pretrain_input.py): the stream is the same for every host
  # count dividing this; 0 = gcd(#files, batch_size), fixed at the first run and kept in the
  # checkpoint.
  c.num_logical_shards = 0
  # Resuming checks that the record files (names, byte sizes), the data seed (config.seed) and
  # the layout are the checkpoint's; other ones are refused. True: start this run's stream
  # afresh from the resumed step instead (said in the run's output; the same stream continues).
  c.restart_data_stream = False


def _optimizer_and_loop_fields(c):
  # Optimisation: Adam(W) lr 1e-4, b .9/.999, L2 0.01, 10k warmup, linear decay.
  c.batch_size = 256               # global, across all hosts and devices
  c.grad_accum_steps = 1           # micro-batches per optimizer step (batch_size / k each)
  # Batch-size warmup (ModernBERT's; bert_jax/training/batch_warmup.py): the batch grows from this many
  # rows to batch_size, that many more at a time, over the first batch_size_warmup_tokens tokens
  # (rows x seq_length), each size for the same number of steps. 0 = none (BERT; modernbert-base:
  # 768 -> 4,608 over 50e9).
  c.batch_size_warmup_min_size = 0
  c.batch_size_warmup_tokens = 0.0
  c.num_train_steps = 900_000      # phase 1: 90% of the paper's 1M steps
  c.warmup_steps = 10_000
  c.learning_rate = 1e-4
  c.optimizer = "adamw"            # "lamb" for large pod batches (You et al. 2019: 64k batch)
  c.weight_decay = 0.01
  c.b1 = 0.9
  c.b2 = 0.999
  c.eps = 1e-6
  c.clip_norm = 1.0
  # True: weight decay on every tensor (NeoBERT); False: not on norms and biases (BERT's
  # exclude_from_weight_decay, ModernBERT's filter_bias_norm_wd).
  c.weight_decay_all_tensors = False
  # linear (BERT: warmup, then linear decay to 0) | wsd (ModernBERT: warmup, constant, then a
  # 1-sqrt decay over the last decay_steps to final_lr_fraction x learning_rate) | cosine
  # (NeoBERT: warmup from 1e-4 x learning_rate, a cosine of period decay_steps that ends at
  # step decay_steps (0 = num_train_steps) at final_lr_fraction x learning_rate, then flat).
  c.schedule = "linear"
  c.decay_steps = 0
  c.final_lr_fraction = 0.0

  # Parallelism: axes (data, fsdp, tensor); -1 = all remaining devices.
  c.mesh_shape = (-1, 1, 1)

  # Initialisation from another checkpoint (phase 2, or a converted Google/HF BERT).
  c.init_checkpoint = ""

  # Loop, logging, checkpoints.
  c.seed = 0
  c.log_every = 100
  c.eval_every = 10_000
  c.eval_steps = 100
  c.checkpoint_every = 5_000
  c.keep_checkpoints = 3           # the last N ...
  c.keep_every = 100_000           # ... plus every K-th (optimizer) step for good
  c.async_checkpointing = True
  c.max_consecutive_skips = 10     # NaN/Inf steps (skipped, never applied) in a row -> stop; 0 never
  c.profile_start_step = -1        # >= 0: write a jax.profiler trace of `profile_steps` steps
  c.profile_steps = 5


MMBERT_PHASES = ("steps=60%,tau=0.7,mask=0.3 | steps=30%,tau=0.5,mask=0.15 | "
                 "steps=10%,tau=0.3,mask=0.05")


def _apply_variants(c, preset, variants, family):
  """phase2, fast, runlocal and annealed on top of the preset (module docstring)."""
  if "phase2" in variants and family.phase2:   # the family's own (ModernBERT: 8,192 tokens)
    family.phase2(c, preset)
  elif "phase2" in variants:
    c.seq_length = 512
    c.max_predictions_per_seq = 80
    c.num_train_steps = 100_000
    c.model.remat = preset in ("large",)

  if "fast" in variants:
    c.model.attention_dropout_prob = 0.0

  if "runlocal" in variants:
    # A real pre-training on 2 CPU cores in a few minutes (see the README's quick start).
    # 1,500 steps x 32 x 128 = 6.1M tokens, ~5 minutes on 2 CPU cores for BERT-tiny.
    c.batch_size = 32
    c.batch_size_warmup_min_size = 0   # a ramp over billions of tokens has no place in 6M
    c.num_train_steps = 1_500
    c.warmup_steps = 150
    c.learning_rate = 1e-3          # tiny models tolerate (and need) a larger rate for short runs
    c.log_every = 100
    c.eval_every = 500
    c.eval_steps = 10
    c.checkpoint_every = 500
    c.keep_every = 0
    c.shuffle_buffer = 2_000
    if "phase2" not in variants:
      c.seq_length = 128
      # google's int((p + 0.005) x 128), at least BERT's 20 (p = 0.15 gives 19): a fixed 20
      # silently capped ModernBERT's 30% (39 a row) and NeoBERT's 20% (26) on runlocal.
      c.max_predictions_per_seq = max(20, int((c.masked_lm_prob + 0.005) * 128))

  if "annealed" in variants:   # last: after runlocal's and phase2's lengths
    # mmBERT's three phases (pre-training, mid-training, decay: 2.3T, 600B, 100B tokens there;
    # 60/30/10% here, a round shape). Rows hold up to 30% of seq_length predictions.
    c.phases = MMBERT_PHASES
    c.max_predictions_per_seq = max(c.max_predictions_per_seq, int(0.305 * c.seq_length) + 1)
