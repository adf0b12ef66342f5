r"""Fine-tuning presets with the BERT paper's hyper-parameters (Devlin et al. 2018, sec. 4, A.3).

  python -m bert_jax.finetune --config=bert_jax/configs/finetune.py:glue_mrpc \
      --config.init_checkpoint=gs://BUCKET/bert-base --config.vocab_file=vocab.txt \
      --config.data_dir=glue_data/MRPC --workdir=runs/mrpc

The argument after ':' is TASK[,sweep][,runlocal]:
  TASK      glue_cola glue_sst2 glue_mrpc glue_stsb glue_qqp glue_mnli glue_qnli glue_rte
            glue_wnli squad_v1 squad_v2 conll03 swag custom (the glue_ prefix is optional).
  sweep     the paper's learning-rate grid {5e-5, 4e-5, 3e-5, 2e-5}, one run each, best on dev.
  runlocal  a laptop-sized run: short sequences, 256 training examples, 1 epoch.
  Recipes (task=custom of a task type, with a published recipe's values; data in config.data_dir
  as train.jsonl / dev.jsonl): modernbert_embed_stage1, modernbert_embed_stage2 (sentence
  embeddings, nomic's modernbert-embed: _modernbert_embed below; docs/finetuning.md).

Paper defaults: batch 32, Adam lr in 2e-5..5e-5, 3 epochs (SQuAD 2), warmup over the first 10%
of steps then linear decay, dropout 0.1. Those are for BERT-base/large: learning_rate and
num_train_epochs are left unset (None) and the run picks them from paper_learning_rate /
paper_num_train_epochs and the model's size (bert_jax/finetune.py auto_learning_rate and
auto_num_train_epochs: the paper's values at hidden size >= 768, larger rates and more epochs for
the small BERTs, after Turc et al. 2019); setting either uses it as given.
E.g. MRPC at BERT-base: 3,668 pairs / 32 = 115 steps an epoch (the last one partial) x 3 = 345
steps, 34 of them warmup. SQuAD v1.1: 87,599 questions -> ~88.6k windows of 384 / 32 = 2,769
steps an epoch x 2.
"""

import ml_collections
from ml_collections import config_dict

GLUE = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
# Recipes: presets of task=custom whose values are a published recipe's (_modernbert_embed).
RECIPES = ("modernbert_embed_stage1", "modernbert_embed_stage2")
TASKS = (tuple(f"glue_{t}" for t in GLUE) + ("squad_v1", "squad_v2", "conll03", "swag", "custom")
         + RECIPES)


def get_config(arg="glue_mrpc"):
  parts = [p for p in (arg or "glue_mrpc").split(",") if p]
  name, variants = parts[0], set(parts[1:])
  if name in GLUE:
    name = f"glue_{name}"
  if name not in TASKS:
    raise ValueError(f"--config=...:{arg}: unknown task {name!r}; one of {', '.join(TASKS)}.")
  unknown = variants - {"sweep", "runlocal"}
  if unknown:
    raise ValueError(f"--config=...:{arg}: unknown variant(s) {sorted(unknown)}; use "
                     "TASK[,sweep][,runlocal].")

  c = ml_collections.ConfigDict()
  # name in data_pipelines.tasks.TASKS, or "custom" (a recipe is custom data too)
  c.task = "custom" if name in RECIPES else name.removeprefix("glue_")
  # Your own classification/regression (TSV/CSV/JSONL) or tagging (CoNLL) data: task=custom.
  c.custom = ml_collections.ConfigDict(dict(
      type="classification",    # the task type: classification | regression | tagging |
                                #   embedding (pairs/triplets; config.embedding below) |
                                #   reranker (a cross-encoder; config.reranker below)
      format="tsv",             # tsv | csv | jsonl (classification/regression/embedding)
      text_a="sentence",        # column (header name or JSON key) of the first text
      text_b="",                # second text for pairs; empty for single sentences
      label="label",
      labels=(),                # class names as written in the files; () for regression
      index="",                 # id column written into test predictions (row number if empty)
      train_file="train.tsv", dev_file="dev.tsv", test_file=""))
  _embedding_fields(c)
  _reranker_fields(c)
  _embedding_distillation_fields(c)

  # Data and vocabulary.
  c.data_dir = ""               # the task's folder (e.g. glue_data/MRPC), or a TFDS data_dir
  c.data_source = "files"       # "files", or "tfds" for glue/* and squad/* prepared in data_dir
  c.vocab_file = ""             # the WordPiece vocab.txt (default: init_checkpoint/vocab.txt) ...
  c.spm_model_file = ""         # ... or its SentencePiece model
  # None: the checkpoint's and its vocab's casing; true/false must agree with them.
  c.do_lower_case = config_dict.placeholder(bool)
  c.max_seq_length = 128
  # Classification / regression / embedding: pack several training sequences per row (attention
  # within a sequence only; docs/packing.md), e.g. CoLA at 128 is ~89% padding. Embedding packs
  # each batch's texts (anchors, positives, negatives) into a fixed number of rows and pools
  # each text on its own: the same loss (docs/finetuning.md). Evaluation is unpacked.
  c.pack = False
  c.max_instances_per_pack = 0  # 0 = max_seq_length // 16 (sequences, texts a row holds)
  c.max_train_examples = 0      # >0 keeps only the first N (quick experiments); 0 = all
  c.max_eval_examples = 0

  # SQuAD only (google-research/bert run_squad.py defaults).
  c.doc_stride = 128            # window step over long contexts, in word pieces
  c.max_query_length = 64       # longer questions are cut (and counted)
  c.n_best_size = 20
  c.max_answer_length = 30
  c.null_score_diff_threshold = 0.0  # v2: predict "" when null - best span > this; tune it
  #                                    with eval_results.json's best_f1_thresh

  # Model: the pre-trained encoder and what fine-tuning may change.
  c.init_checkpoint = ""        # convert export, pre-training workdir or a best_epoch* export
  c.model_name = ""             # only without init_checkpoint: random init (tests, benchmarks)
  # Task-specific distillation (classification): a fine-tuned teacher's soft labels, e.g. a
  # BERT-base best_epoch{N}/ export teaching a DistilBERT student (DistilBERT paper sec. 4.2).
  # Empty: plain fine-tuning. The teacher runs frozen inside each step (finetune.py).
  c.distill_teacher = ""        # a fine-tuning export (best_epoch{N}/) of this task and vocab
  c.distill_temperature = 2.0   # T: softmax(logits / T) on both sides; the soft loss x T^2
  c.distill_alpha = 0.5         # loss = alpha x soft (KL) + (1 - alpha) x hard (labels)
  c.model = ml_collections.ConfigDict(dict(
      hidden_dropout_prob=0.1,
      attention_dropout_prob=0.1,
      dtype="float32",          # "bfloat16" on TPU/GPU: bf16 compute, f32 params and Adam
      remat=False))

  _optimizer_and_run_fields(c)
  _apply_task_and_variants(c, name, variants)
  return c


def _embedding_fields(c):
  # Sentence embeddings (custom.type=embedding; bert_jax/tasks/embedding.py): rows (anchor,
  # positive, negatives...) in sentence-transformers' columns, InfoNCE over the global batch.
  c.embedding = ml_collections.ConfigDict(dict(
      # mean | cls | last (over each sequence's real tokens); "" = the init checkpoint's
      # recorded one (an embedding run, a sentence-transformers import), else mean
      pooling="",
      scale=20.0,               # logits = scale x cosine; sentence-transformers' default 20
      symmetric=False,          # also each positive's cross-entropy over the anchors
      matryoshka_dims=(),       # e.g. (768, 256): the loss summed over these leading widths
      # prepended to every anchor, e.g. "search_query: "; None = the init checkpoint's, else ""
      query_prompt=config_dict.placeholder(str),
      document_prompt=config_dict.placeholder(str),   # to positives and negatives; as above
      # GradCache (Gao et al. 2021): > 1 embeds each device's rows in this many chunks without
      # gradients, takes the loss's gradient w.r.t. all embeddings, then each chunk's backward
      # (same dropout): activations of B/(devices x N) rows at a time, ~4/3 the FLOPs. 0/1: off.
      grad_cache_chunks=0,
      num_negatives=-1,         # >= 0: every row must hold exactly this many hard negatives
      # False negatives out of the loss (docs/finetuning.md, "False negatives"):
      # true: a candidate (another row's positive or negative, anywhere in the global batch, or
      # a hard negative) with the same input ids as the anchor's positive is no negative of it.
      # Off by default, as sentence-transformers 6.2 (no such option in MultipleNegatives-
      # RankingLoss: its answer is the no-duplicates sampler, which our epoch order already is).
      mask_duplicates=False,
      # GISTEmbed (sentence-transformers' GISTEmbedLoss): a .npy [N, S, G] of a guide model's
      # vectors of the train file's texts (under data_dir); candidates the guide scores above the
      # anchor's pair less the margin are no negatives. "" = no guide. GISTEmbedLoss's default
      # temperature 0.01 is scale=100.
      guide_embeddings="",
      margin_strategy="absolute",   # absolute: g - margin; relative: g - |g| x margin
      margin=0.0,
      contrast_anchors=True,    # with a guide: other anchors are candidates too (GIST's default)
      contrast_positives=True))  # ... and other positives, of each anchor's positive


def _reranker_fields(c):
  # Rerankers (custom.type=reranker; bert_jax/tasks/reranker.py, docs/retrieval.md): a
  # cross-encoder scores each "[CLS] query [SEP] document [SEP]"; sentence-transformers'
  # CrossEncoder losses, its data columns.
  c.reranker = ml_collections.ConfigDict(dict(
      # bce: BinaryCrossEntropyLoss on (query, document, label) pairs, label in [0, 1], or rows
      # (query, positive, negative...) | mnrl: MultipleNegativesRankingLoss on such rows |
      # listnet: ListNetLoss on each query's list (rows, or scored pairs grouped by query)
      loss="bce",
      scale=10.0,               # mnrl: logits = scale x sigmoid(score) (theirs: 10)
      # mnrl: documents of other rows added to each row as negatives (theirs: num_negatives=4)
      in_batch_negatives=4,
      hard_negatives=-1))       # >= 0: every training row must hold exactly this many negatives
def _embedding_distillation_fields(c):
  """config.embedding's distillation into the bi-encoder (docs/retrieval.md, "Distillation into a
  bi-encoder"): loss = info_nce_weight x InfoNCE + margin_mse_weight x MarginMSE +
  embed_distill_weight x the distance to a teacher's vectors."""
  c.embedding.info_nce_weight = 1.0       # 0 with a distillation weight: the teacher's signal alone
  # > 0: MarginMSE (sentence-transformers' MarginMSELoss) on the teacher's margins s(q, p) -
  # s(q, n_i): the train file's 'scores' column (1 + k numbers: mine --output_scores) or 'label'
  # (k margins), else the cosines of teacher_checkpoint's vectors in the step
  c.embedding.margin_mse_weight = 0.0
  c.embedding.margin_mse_similarity = "dot"   # the student's: dot (MarginMSELoss's default) | cos
  # > 0: the student's vectors through a learned projection (trained, not exported) against the
  # teacher's (EmbedDistillLoss; its MSELoss is distance mse): teacher_embeddings' or
  # teacher_checkpoint's
  c.embedding.embed_distill_weight = 0.0
  c.embedding.embed_distill_distance = "cosine"   # mse | l2 | cosine
  c.embedding.embed_distill_projection = True     # false: no projection (the widths must be equal)
  # a .npy [N, S, G] of the teacher's vectors of the train file's texts (under data_dir)
  c.embedding.teacher_embeddings = ""
  # a bi-encoder teacher frozen in every step: an embedding export or a sentence-transformers
  # folder of the student's vocabulary (gives the scores and the vectors above)
  c.embedding.teacher_checkpoint = ""
  # true: GISTEmbed's guide (as guide_embeddings, its margin and contrast fields) is
  # teacher_checkpoint's vectors of each batch, computed in the step instead of a .npy
  c.embedding.guide_from_teacher = False


def _optimizer_and_run_fields(c):
  # Optimisation.
  c.batch_size = 32
  c.eval_batch_size = 64
  # None: the paper's value below scaled to the model size (printed at start-up; finetune.py
  # auto_learning_rate / auto_num_train_epochs); a number is used as given.
  c.learning_rate = config_dict.placeholder(float)
  c.num_train_epochs = config_dict.placeholder(float)  # None: as learning_rate, scaled
  c.paper_learning_rate = 2e-5      # the paper's rate for BERT-base/large (hidden size >= 768)
  c.paper_num_train_epochs = 3.0    # the paper's epochs for BERT-base/large
  c.learning_rates = ()         # non-empty: sweep these rates (one sub-run each)
  c.warmup_proportion = 0.1
  c.warmup_steps = 0            # > 0: this many warmup steps instead of the proportion
  # linear (BERT: warmup, linear decay to 0) | hf_cosine (transformers' cosine to 0) | cosine
  # (NeoBERT's) | wsd (ModernBERT's): bert_jax/training/optimizer.py create_schedule
  c.schedule = "linear"
  c.decay_steps = 0             # cosine/wsd: where the decay ends (0 = the last step)
  c.final_lr_fraction = 0.0     # cosine/wsd: the rate after the decay, x learning_rate
  c.optimizer = "adamw"
  c.weight_decay = 0.01         # google-research/bert's AdamWeightDecay rate
  c.b1 = 0.9
  c.b2 = 0.999
  c.eps = 1e-6
  c.clip_norm = 1.0
  # ELECTRA's layer-wise learning-rate decay (google-research/electra optimization.py
  # _get_layer_lrs): depth d learns at lr x decay^(L + 2 - d); d = 0 embeddings, i + 1 encoder
  # layer i, L + 1 BERT's pooler, L + 2 the head. ELECTRA: 0.8 small/base (base: embeddings
  # x0.044, last layer x0.64), 0.9 large; 1.0 = off. Not for ALBERT's shared layers.
  c.layerwise_lr_decay = 1.0

  # Run.
  c.do_train = True
  c.do_eval = True              # dev metrics after every epoch; the best epoch is kept
  c.do_predict = True           # test-set submission files from the best epoch
  c.mesh_shape = (-1, 1, 1)     # (data, fsdp, tensor); fine-tuning fits data parallelism
  c.seed = 0                    # the head's init, each epoch's batch order, packing
  # Resuming checks that the training rows (their content, as read: a label flipped in place is
  # another row) and the seed are the checkpoint's; other ones are refused. True: go on from the
  # resumed step over this run's rows instead (said in the run's output). The name and meaning
  # are pre-training's (configs/pretrain.py: restart_data_stream).
  c.restart_data_stream = False
  c.log_every = 50
  c.max_consecutive_skips = 10  # NaN/Inf steps (skipped, never applied) in a row -> stop; 0 never


def _apply_task_and_variants(c, name, variants):
  """The task's own hyper-parameters (paper / google-research/bert), then sweep and runlocal."""
  if name.startswith("squad"):
    # SQuAD: 384-token windows, 2 epochs (the paper trains v1.1 3 epochs at 5e-5 and v2.0 2
    # epochs at 5e-5; google-research/bert's README uses 2 epochs at 3e-5 for v1.1).
    c.max_seq_length = 384
    c.paper_num_train_epochs = 2.0
    c.paper_learning_rate = 5e-5 if name == "squad_v2" else 3e-5
    c.eval_batch_size = 32
  elif name == "swag":
    c.paper_learning_rate = 2e-5  # paper: 3 epochs, lr 2e-5, batch 16
    c.batch_size = 16
    c.eval_batch_size = 32      # x 4 choices = 128 sequences
  elif name == "conll03":
    c.paper_learning_rate = 5e-5
  elif name in RECIPES:
    _modernbert_embed(c, stage=int(name[-1]))
  if "sweep" in variants:
    c.learning_rates = (5e-5, 4e-5, 3e-5, 2e-5)

  if "runlocal" in variants:
    c.max_seq_length = 128 if name.startswith("squad") else 64
    c.doc_stride = 32
    c.max_query_length = 24
    c.batch_size = 8
    c.eval_batch_size = 16
    c.num_train_epochs = 1.0
    c.max_train_examples = 256
    c.max_eval_examples = 256
    c.log_every = 8
    if "sweep" in variants:
      c.learning_rates = (5e-5, 2e-5)
    if name in RECIPES:   # a tiny model: no 256/768 widths; 0 = the 10% proportion
      c.warmup_steps, c.embedding.matryoshka_dims = 0, ()
      c.embedding.grad_cache_chunks = 2 if name.endswith("1") else 0


def _modernbert_embed(c, stage):
  """nomic-ai's modernbert-embed-base (MTEB 62.62): ModernBERT-base after nomic-embed's two
  contrastive stages. The values are those of nomic-ai/contrastors' configs for it,
  src/contrastors/configs/train/contrastive_pretrain_modernbert.yaml (stage 1) and
  contrastive_finetune_modernnomic.yaml (stage 2), read 2026-11-27; the recipe is the one the
  ModernBERT paper's (Warner et al. 2024) and Nomic Embed's (Nussbaum et al. 2024) reports
  describe. Stage 2 starts from stage 1's export (--config.init_checkpoint=RUN1/best_epoch1).

    stage 1: weakly-supervised pairs, batch 16,384, seq 128, lr 2e-4, 700 warmup steps, cosine
             to 0 (transformers' get_scheduler("cosine"): our hf_cosine), 1 epoch, logit
             scale 50, mean pooling, GradCache (contrastors: chunks of 64 rows a GPU)
    stage 2: triplets with 7 mined hard negatives, batch 256, seq 512, lr 2e-5, 400 warmup
             steps, linear decay, 1 epoch, scale 50, Matryoshka (256, 768) weights 1 and 1, no
             GradCache
  Both: AdamW, weight decay 0.01, betas (0.9, 0.999), gradient clipping at norm 1.0, the
  prefixes "search_query: " / "search_document: " (add_prefix), one direction of InfoNCE
  (contrastors' clip_loss, bidirectional=False by default). Not in those files, kept ours: Adam's
  eps (1e-6), the evaluation batch. ModernBERT-base has no dropout (its config.json: 0.0 for
  embeddings, attention and MLP), and contrastors trains it so."""
  c.custom.type, c.custom.format = "embedding", "jsonl"
  c.custom.train_file, c.custom.dev_file = "train.jsonl", "dev.jsonl"
  e = c.embedding
  e.pooling, e.scale, e.symmetric = "mean", 50.0, False
  e.query_prompt, e.document_prompt = "search_query: ", "search_document: "
  c.model.hidden_dropout_prob = c.model.attention_dropout_prob = 0.0
  c.num_train_epochs, c.weight_decay, c.b1, c.b2, c.clip_norm = 1.0, 0.01, 0.9, 0.999, 1.0
  c.final_lr_fraction = 0.0
  if stage == 1:
    c.max_seq_length, c.batch_size, c.eval_batch_size = 128, 16_384, 1_024
    c.learning_rate, c.warmup_steps, c.schedule = 2e-4, 700, "hf_cosine"
    # 16,384 rows / 8 chips (a v5e-8) = 2,048 a chip / 32 chunks = 64 rows a chunk (contrastors'
    # chunk_size 64). On more chips the chunks are smaller: 16 chips -> 32 rows a chunk.
    e.grad_cache_chunks = 32
  else:
    c.max_seq_length, c.batch_size, c.eval_batch_size = 512, 256, 256
    c.learning_rate, c.warmup_steps, c.schedule = 2e-5, 400, "linear"
    e.matryoshka_dims = (256, 768)
    e.num_negatives = 7        # each row: anchor, positive, 7 hard negatives (S = 9 sequences)
    e.grad_cache_chunks = 0
