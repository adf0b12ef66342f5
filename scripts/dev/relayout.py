"""The one-off tool that moved modules into role subpackages (issue 47): `git mv` per the table
below, then every import, dotted name and path that named an old place is rewritten.

  python scripts/dev/relayout.py --move      # git mv only (the move-only commit)
  python scripts/dev/relayout.py --rewrite   # imports, dotted names and paths in every text file

Kept in the repository as the record of the old -> new table (docs/development.md prints it).
"""

import ast
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# old path -> new path (relative to the repository), bert_jax first.
B = {
    # parallel/: mesh, sharding rules, multi-host start-up, TPU chip specs
    "sharding": "parallel/sharding", "distributed": "parallel/distributed",
    "tpu_specs": "parallel/tpu_specs",
    # layers/: kernels and blocks the encoder is built of
    "attention": "layers/attention", "rope": "layers/rope", "fused_ops": "layers/fused_ops",
    "fp8": "layers/fp8", "modern_layers": "layers/modern_layers",
    # models/: the config, the encoder, its pre-training and task heads
    "bert_config": "models/bert_config", "model": "models/model",
    "pretraining_heads": "models/pretraining_heads", "heads": "models/heads",
    # checkpoint/: Orbax bytes, fit checks, manifests, the workdir lock (+ __main__: verify)
    "checkpoint": "checkpoint/store", "checkpoint_fit": "checkpoint/checkpoint_fit",
    "manifest": "checkpoint/manifest", "workdir_lock": "checkpoint/workdir_lock",
    # inference/: a model loaded from any checkpoint or folder
    "inference": "inference/loading", "convert/hf_export": "inference/hf_export",
    # training/: the step plumbing both loops share
    "trainer_lib": "training/trainer_lib", "optimizer": "training/optimizer",
    "guard": "training/guard", "batch_warmup": "training/batch_warmup",
    "input_source": "training/input_source", "preflight": "training/preflight",
    "finetune_tasks": "training/finetune_tasks",
    # objectives/: what several families or task types share
    "objectives": "objectives/pretraining", "contrastive": "objectives/contrastive",
    "layerwise": "objectives/layerwise",
    # distil.py moved here, then split: objectives/teacher.py + families/distilbert/distil.py
    "distil": "objectives/distil",
    "progressive": "objectives/progressive",
    # evaluation/: metrics and what a run reports
    "metrics": "evaluation/metrics", "retrieval_metrics": "evaluation/retrieval_metrics",
    "metrics_writer": "evaluation/metrics_writer", "train_report": "evaluation/train_report",
    # planning/: the planner's compiles of the programs' own steps
    "plan_compile": "planning/plan_compile", "plan_finetune": "planning/plan_finetune",
    # families/<name>/: one folder a family
    "families/bert": "families/bert/__init__", "families/albert": "families/albert/__init__",
    "families/spanbert": "families/spanbert/__init__",
    "families/tinybert": "families/tinybert/__init__",
    "families/distilbert": "families/distilbert/__init__",
    "families/electra": "families/electra/__init__",
    "families/mobilebert": "families/mobilebert/__init__",
    "families/modernbert": "families/modernbert/__init__",
    "families/mobilebert_layers": "families/mobilebert/layers",
    "electra": "families/electra/objective",
    "convert/albert": "families/albert/convert", "convert/distilbert": "families/distilbert/convert",
    "convert/electra": "families/electra/convert",
    "convert/mobilebert": "families/mobilebert/convert",
    "convert/modernbert": "families/modernbert/convert",
}
D = {
    "bert_chars": "tokenizers/bert_chars", "pretokenize": "tokenizers/pretokenize",
    "tokenization": "tokenizers/tokenization", "tokenizer_json": "tokenizers/tokenizer_json",
    "vocab": "tokenizers/vocab", "vocab_base": "tokenizers/vocab_base",
    "vocab_mixture": "tokenizers/vocab_mixture", "wordpiece_py": "tokenizers/wordpiece_py",
    "text_sources": "corpus/text_sources", "filters": "corpus/filters",
    "instances": "records/instances", "records": "records/records",
    "block_sampling": "records/block_sampling", "whole_corpus": "records/whole_corpus",
    "word_boundaries": "records/word_boundaries", "dataset_info": "records/dataset_info",
    "packing": "records/packing",
    "pretrain_input": "input/pretrain_input", "masking": "input/masking",
    "mixture": "input/mixture", "phases": "input/phases", "input_watchdog": "input/input_watchdog",
}

# tests: helpers into tests/testlib/, each test file beside the mirror of what it tests.
T_HELPERS = ["hf_testlib", "pod_testlib", "sigterm_testlib", "tasks_testlib", "tfds_testlib",
             "gcs_emulator", "late_host", "contrastive_pod", "xla_test_flags"]
T = {
    # bert_jax/ programs
    "train_test": "bert_jax/train_test", "finetune_test": "bert_jax/finetune_test",
    "predict_test": "bert_jax/predict_test", "extract_features_test": "bert_jax/extract_features_test",
    "export_serving_test": "bert_jax/export_serving_test", "report_test": "bert_jax/report_test",
    "plan_test": "bert_jax/plan_test", "cli_test": "bert_jax/cli_test",
    "cli_errors_test": "bert_jax/cli_errors_test", "convert_test": "bert_jax/convert/convert_test",
    "st_interop_test": "bert_jax/convert/st_interop_test",
    # parallel
    "sharding_test": "bert_jax/parallel/sharding_test",
    "distributed_test": "bert_jax/parallel/distributed_test",
    "tpu_specs_test": "bert_jax/parallel/tpu_specs_test",
    # layers
    "attention_test": "bert_jax/layers/attention_test", "fp8_test": "bert_jax/layers/fp8_test",
    "fused_ops_test": "bert_jax/layers/fused_ops_test",
    "modern_layers_test": "bert_jax/layers/modern_layers_test",
    # models
    "model_test": "bert_jax/models/model_test", "heads_test": "bert_jax/models/heads_test",
    "model_vs_reference_test": "bert_jax/models/model_vs_reference_test",
    # checkpoint
    "checkpoint_test": "bert_jax/checkpoint/checkpoint_test",
    "checkpoint_fit_test": "bert_jax/checkpoint/checkpoint_fit_test",
    "manifest_test": "bert_jax/checkpoint/manifest_test",
    "workdir_lock_test": "bert_jax/checkpoint/workdir_lock_test",
    "gcs_test": "bert_jax/checkpoint/gcs_test",
    # inference
    "inference_test": "bert_jax/inference/inference_test",
    # training
    "trainer_lib_test": "bert_jax/training/trainer_lib_test",
    "optimizer_test": "bert_jax/training/optimizer_test",
    "modern_optimizer_test": "bert_jax/training/modern_optimizer_test",
    "batch_warmup_test": "bert_jax/training/batch_warmup_test",
    "input_source_test": "bert_jax/training/input_source_test",
    "finetune_tasks_test": "bert_jax/training/finetune_tasks_test",
    # objectives
    "objectives_test": "bert_jax/objectives/objectives_test",
    "contrastive_test": "bert_jax/objectives/contrastive_test",
    "contrastive_pod_test": "bert_jax/objectives/contrastive_pod_test",
    "layerwise_test": "bert_jax/objectives/layerwise_test",
    "progressive_test": "bert_jax/objectives/progressive_test",
    "distil_parity_test": "bert_jax/objectives/distil_parity_test",
    # evaluation
    "metrics_test": "bert_jax/evaluation/metrics_test",
    "retrieval_metrics_test": "bert_jax/evaluation/retrieval_metrics_test",
    "metrics_writer_test": "bert_jax/evaluation/metrics_writer_test",
    "plan_finetune_test": "bert_jax/planning/plan_finetune_test",
    # families
    "families_registry_test": "bert_jax/families/families_registry_test",
    "families_train_test": "bert_jax/families/families_train_test",
    "families_finetune_test": "bert_jax/families/families_finetune_test",
    "convert_albert_test": "bert_jax/families/albert/convert_albert_test",
    "distil_test": "bert_jax/families/distilbert/distil_test",
    "distil_finetune_test": "bert_jax/families/distilbert/distil_finetune_test",
    "convert_distilbert_test": "bert_jax/families/distilbert/convert_distilbert_test",
    "electra_test": "bert_jax/families/electra/electra_test",
    "electra_finetune_test": "bert_jax/families/electra/electra_finetune_test",
    "convert_electra_test": "bert_jax/families/electra/convert_electra_test",
    "mobilebert_test": "bert_jax/families/mobilebert/mobilebert_test",
    "tinybert_test": "bert_jax/families/tinybert/tinybert_test",
    "modernbert_test": "bert_jax/families/modernbert/modernbert_test",
    "modernbert_cli_test": "bert_jax/families/modernbert/modernbert_cli_test",
    "modernbert_export_test": "bert_jax/families/modernbert/modernbert_export_test",
    "modernbert_phase2_test": "bert_jax/families/modernbert/modernbert_phase2_test",
    "modern_side_by_side_test": "bert_jax/families/modernbert/modern_side_by_side_test",
    "korean_modern_test": "bert_jax/families/modernbert/korean_modern_test",
    "mmbert_convert_test": "bert_jax/families/modernbert/mmbert_convert_test",
    "neobert_test": "bert_jax/families/modernbert/neobert_test",
    "neobert_recipe_test": "bert_jax/families/modernbert/neobert_recipe_test",
    # tasks
    "tasks_registry_test": "bert_jax/tasks/tasks_registry_test",
    "tasks_glue_test": "bert_jax/tasks/tasks_glue_test",
    "tasks_squad_test": "bert_jax/tasks/tasks_squad_test",
    "tasks_ner_test": "bert_jax/tasks/tasks_ner_test",
    "tasks_swag_test": "bert_jax/tasks/tasks_swag_test",
    "tasks_pairs_test": "bert_jax/tasks/tasks_pairs_test",
    "tasks_embedding_test": "bert_jax/tasks/tasks_embedding_test",
    "embedding_grad_cache_test": "bert_jax/tasks/embedding_grad_cache_test",
    "embedding_packed_test": "bert_jax/tasks/embedding_packed_test",
    "embedding_peer_test": "bert_jax/tasks/embedding_peer_test",
    "embedding_recipes_test": "bert_jax/tasks/embedding_recipes_test",
    "docstring_retrieval_test": "bert_jax/tasks/docstring_retrieval_test",
    "squad_bpe_test": "bert_jax/tasks/squad_bpe_test", "ner_bpe_test": "bert_jax/tasks/ner_bpe_test",
    # data_pipelines
    "build_vocab_test": "data_pipelines/build_vocab_test",
    "create_pretraining_data_test": "data_pipelines/create_pretraining_data_test",
    "beam_pipeline_test": "data_pipelines/beam_pipeline_test",
    "tokenization_test": "data_pipelines/tokenizers/tokenization_test",
    "vocab_test": "data_pipelines/tokenizers/vocab_test",
    "wordpiece_py_test": "data_pipelines/tokenizers/wordpiece_py_test",
    "bpe_tokenizer_test": "data_pipelines/tokenizers/bpe_tokenizer_test",
    "multilingual_vocab_test": "data_pipelines/tokenizers/multilingual_vocab_test",
    "cjk_test": "data_pipelines/tokenizers/cjk_test", "korean_test": "data_pipelines/tokenizers/korean_test",
    "text_sources_test": "data_pipelines/corpus/text_sources_test",
    "filters_test": "data_pipelines/corpus/filters_test",
    "instances_test": "data_pipelines/records/instances_test",
    "dataset_info_test": "data_pipelines/records/dataset_info_test",
    "packing_test": "data_pipelines/records/packing_test",
    "word_boundaries_test": "data_pipelines/records/word_boundaries_test",
    "masking_test": "data_pipelines/input/masking_test",
    "pretrain_input_test": "data_pipelines/input/pretrain_input_test",
    "mixture_test": "data_pipelines/input/mixture_test",
    "mixture_train_test": "data_pipelines/input/mixture_train_test",
    "multilingual_mix_test": "data_pipelines/input/multilingual_mix_test",
    "phases_test": "data_pipelines/input/phases_test",
    "phases_train_test": "data_pipelines/input/phases_train_test",
    "input_watchdog_test": "data_pipelines/input/input_watchdog_test",
    # bert_jax_core
    "files_test": "bert_jax_core/files_test", "tf_setup_test": "bert_jax_core/tf_setup_test",
    # launch, benchmarks
    "launch_test": "launch/launch_test", "local_pod_test": "launch/local_pod_test",
    "accelerator_benchmark_test": "benchmarks/accelerator_benchmark_test",
    "compact_students_benchmark_test": "benchmarks/compact_students_benchmark_test",
    "electra_distil_benchmark_test": "benchmarks/electra_distil_benchmark_test",
    "families_benchmark_test": "benchmarks/families_benchmark_test",
    "profile_table_test": "benchmarks/profile_table_test",
    "serving_latency_benchmark_test": "benchmarks/serving_latency_benchmark_test",
    "startup_benchmark_test": "benchmarks/startup_benchmark_test",
    # end_to_end/: whole programs, pods, kills and the careless user's faults, across packages
    "e2e_pretrain_test": "end_to_end/e2e_pretrain_test", "kill_test": "end_to_end/kill_test",
    "stream_test": "end_to_end/stream_test", "late_host_test": "end_to_end/late_host_test",
    "multihost_train_test": "end_to_end/multihost_train_test",
    "faults_test": "end_to_end/faults_test",
    "faults_second_pass_test": "end_to_end/faults_second_pass_test",
    "faults_third_pass_test": "end_to_end/faults_third_pass_test",
}


def moves():
  """[(old path, new path)] of every file that moves."""
  out = []
  for table, pkg in ((B, "bert_jax"), (D, "data_pipelines")):
    for old, new in table.items():
      out.append((f"{pkg}/{old}.py", f"{pkg}/{new}.py"))
  for h in T_HELPERS:
    out.append((f"tests/{h}.py", f"tests/testlib/{h}.py"))
  for old, new in T.items():
    out.append((f"tests/{old}.py", f"tests/{new}.py"))
  return out


def dotted(path):
  p = path[:-3].replace("/", ".")
  return p[:-len(".__init__")] if p.endswith(".__init__") else p


def module_map():
  return {dotted(o): dotted(n) for o, n in moves()}


# ----------------------------------------------------------------------------------------------
def move():
  new_pkgs = set()
  for old, new in moves():
    d = os.path.dirname(new)
    os.makedirs(os.path.join(ROOT, d), exist_ok=True)
    subprocess.run(["git", "mv", old, new], cwd=ROOT, check=True)
    while d and d not in new_pkgs:
      new_pkgs.add(d)
      d = os.path.dirname(d)
  for d in sorted(new_pkgs):
    init = os.path.join(ROOT, d, "__init__.py")
    if not os.path.exists(init):
      with open(init, "w") as f:
        f.write("")
      subprocess.run(["git", "add", init], cwd=ROOT, check=True)


# ----------------------------------------------------------------------------------------------
def _resolve_from(node, name, is_pkg):
  base = node.module or ""
  if node.level:
    parts = name.split(".")
    parts = parts[:len(parts) - node.level + (1 if is_pkg else 0)]
    base = ".".join(parts + ([base] if base else []))
  return base


def rewrite_imports(path, modname, mm, known_after):
  """Rewrites the import statements of one .py file (old module names -> new)."""
  with open(path, encoding="utf-8") as f:
    src = f.read()
  try:
    tree = ast.parse(src)
  except SyntaxError:
    return False
  lines = src.splitlines(keepends=True)
  edits = []  # (start line idx, end line idx, new text)
  is_pkg = path.endswith("__init__.py")
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom):
      base = _resolve_from(node, modname, is_pkg)
      out = []
      keep = []
      if base in mm:  # from old_module import names
        out.append((f"from {mm[base]} import", [(a.name, a.asname) for a in node.names]))
      else:
        for a in node.names:
          full = f"{base}.{a.name}"
          if full in mm:
            new = mm[full]
            pkg, _, leaf = new.rpartition(".")
            out.append((f"from {pkg} import", [(leaf, a.asname or (a.name if leaf != a.name else None))]))
          else:
            keep.append((a.name, a.asname))
        if not out:
          continue
        if keep:
          out.insert(0, (f"from {'.' * node.level}{node.module or ''} import", keep))
    elif isinstance(node, ast.Import):
      changed = False
      out = []
      for a in node.names:
        n = a.name
        if n in mm:
          changed = True
          out.append((f"import {mm[n]}" + (f" as {a.asname}" if a.asname else ""), None))
        else:
          out.append((f"import {n}" + (f" as {a.asname}" if a.asname else ""), None))
      if not changed:
        continue
    else:
      continue
    first = lines[node.lineno - 1]
    indent = first[:node.col_offset]
    comment = ""
    for ln in lines[node.lineno - 1:node.end_lineno]:
      if "#" in ln and not comment:
        comment = "#" + ln.split("#", 1)[1].rstrip("\n")
    stmts = []
    for head, names in out:
      if names is None:
        stmts.append(head)
      else:
        stmts.append(head + " " + ", ".join(n + (f" as {a}" if a else "") for n, a in names))
    text = "".join(f"{indent if i else ''}{s}{('  ' + comment.strip()) if comment and i == len(stmts) - 1 else ''}\n"
                   for i, s in enumerate(stmts))
    # the first line keeps what precedes the statement on its line (its indent)
    edits.append((node.lineno - 1, node.end_lineno - 1, first[:node.col_offset] + text))
  if not edits:
    return False
  for s, e, text in sorted(edits, reverse=True):
    lines[s:e + 1] = [text]
  with open(path, "w", encoding="utf-8") as f:
    f.write("".join(lines))
  return True


def text_files():
  out = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                       text=True).stdout.split()
  return [p for p in out if p.endswith((".py", ".md", ".sh", ".toml", ".txt", ".cfg", ".yaml"))
          and not p.startswith("scripts/dev/relayout")]


def rewrite_names():
  """Dotted module names and file paths in every text file."""
  mm = module_map()
  pm = {}
  for o, n in moves():
    pm[o] = n
  # dotted: longest first, one pass; `python -m bert_jax.checkpoint verify` is a program.
  keys = sorted(mm, key=len, reverse=True)
  dot_re = re.compile(r"(?<![\w./])(" + "|".join(re.escape(k) for k in keys) + r")(?![\w])")
  path_keys = sorted(pm, key=len, reverse=True)
  path_re = re.compile(r"(?<![\w./])(" + "|".join(re.escape(k) for k in path_keys) + r")")

  def dot_sub(m):
    s = m.string
    after = s[m.end():m.end() + 8]
    if m.group(1) == "bert_jax.checkpoint" and after.startswith(" verify"):
      return m.group(1)
    return mm[m.group(1)]

  for p in text_files():
    full = os.path.join(ROOT, p)
    if not os.path.exists(full):
      continue
    with open(full, encoding="utf-8") as f:
      s = f.read()
    t = path_re.sub(lambda m: pm[m.group(1)], s)
    t = dot_re.sub(dot_sub, t)
    if t != s:
      with open(full, "w", encoding="utf-8") as f:
        f.write(t)


def rewrite():
  # Dotted names first (`from bert_jax.checkpoint import X` -> `...checkpoint.store import X`),
  # then the statements that import a moved module by its package (`from bert_jax import model`),
  # so that no name is rewritten twice (bert_jax.checkpoint is both an old module and a package).
  rewrite_names()
  mm = module_map()
  for p in text_files():
    if p.endswith(".py") and os.path.exists(os.path.join(ROOT, p)):
      rewrite_imports(os.path.join(ROOT, p), dotted(p), mm, None)


if __name__ == "__main__":
  if "--move" in sys.argv:
    move()
  if "--rewrite" in sys.argv:
    rewrite()
  if "--print" in sys.argv:
    for o, n in moves():
      print(f"{o} -> {n}")
