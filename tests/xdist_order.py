"""The order in which the two pytest-xdist workers take the suite's tests (scripts/run_tests.sh).

xdist's `--dist loadfile` hands out whole files, the files with the MOST TESTS first, and gives a
worker its next file while that worker still has two tests to run. This suite's time is in a few
files of few long tests (2-process pods, kill -9, TPU compiles, fine-tuning runs): they started
last, and the last of them ran alone on one worker while the other worker idled. Here instead:

  * one session, the fast tier first: every fast test is handed out before any slow one (a
    file's fast tests and its slow tests are two units), so the slow units fill the fast tier's
    end instead of an idle worker, and the workers collect the suite once, not once a tier;
  * in each tier the longest units first (longest-processing-time-first: the short ones fill in
    at the end);
  * a unit is a file's tests of one tier, except a test named in SLOW, which is a unit of its
    own, so a file's two long tests can run on both workers at once (each then sets up the
    file's module fixtures, so only tests whose shared fixtures are cheap are named);
  * a worker gets its next unit when it starts its last test (not its second to last), so the
    units still queued go to whichever worker is free first.

FAST and SLOW: how many wall seconds each unit took in its tier (a file key counts that tier's
tests of the file), measured 2026-11-26 at commit cf9976c on the idle 2-core box, fresh
compilation cache: `bash scripts/run_tests.sh --durations=0` (then two sessions: fast 18:27,
slow 30:09). Only the order depends on them: a stale figure costs minutes, never a test. A unit
not listed counts as DEFAULT_SECONDS (after the listed ones, in file order). Re-measure with
`bash scripts/run_tests.sh --durations=0` on a quiet box when a file grows.
"""

import json
import os

DEFAULT_SECONDS = 5.0
# A file the controller names (tests/conftest.py) and the workers write: the slow node ids.
TIERS_ENV = "BERT_JAX_TEST_TIERS"

FAST = {   # -m "not slow": whole files (the rest count DEFAULT_SECONDS)
    "tests/bert_jax/train_test.py": 139,
    "tests/bert_jax/plan_test.py": 136,
    "tests/data_pipelines/create_pretraining_data_test.py": 119,
    "tests/bert_jax/families/families_finetune_test.py": 118,
    "tests/bert_jax/families/families_train_test.py": 105,
    "tests/bert_jax/models/model_test.py": 104,
    "tests/bert_jax/finetune_test.py": 103,
    "tests/data_pipelines/records/packing_test.py": 98,
    "tests/bert_jax/layers/attention_test.py": 67,
    "tests/bert_jax/cli_errors_test.py": 56,
    "tests/data_pipelines/input/pretrain_input_test.py": 55,
    "tests/bert_jax/families/electra/electra_test.py": 52,
    "tests/data_pipelines/build_vocab_test.py": 50,
    "tests/data_pipelines/beam_pipeline_test.py": 45,
    "tests/bert_jax/training/trainer_lib_test.py": 39,
    "tests/bert_jax/families/distilbert/distil_test.py": 39,
    "tests/bert_jax/planning/plan_finetune_test.py": 20,   # an estimate: 18 s on the loaded box, 2026-11-27
    "tests/bert_jax/tasks/tasks_reranker_test.py": 37,   # 2026-11-29, loaded box
    "tests/bert_jax/convert/cross_encoder_test.py": 32,   # torch + two CrossEncoder folders
    "tests/bert_jax/tasks/reranker_losses_test.py": 20,   # torch + sentence-transformers
    "tests/bert_jax/families/electra/electra_finetune_test.py": 37,
    "tests/bert_jax_core/tf_setup_test.py": 36,
    "tests/end_to_end/faults_second_pass_test.py": 35,
    "tests/bert_jax/families/modernbert/modernbert_export_test.py": 33,
    "tests/bert_jax/families/distilbert/distil_finetune_test.py": 31,
    "tests/bert_jax/families/modernbert/modernbert_test.py": 31,
    "tests/benchmarks/accelerator_benchmark_test.py": 28,
    "tests/benchmarks/compact_students_benchmark_test.py": 35,   # unmarked; 2026-11-27, a loaded box
    "tests/data_pipelines/tokenizers/bpe_tokenizer_test.py": 28,
    "tests/bert_jax/checkpoint/gcs_test.py": 28,
    "tests/bert_jax/families/electra/convert_electra_test.py": 26,
    "tests/bert_jax/cli_test.py": 25,
    "tests/data_pipelines/records/word_boundaries_test.py": 25,
    "tests/data_pipelines/tokenizers/korean_test.py": 22,
    "tests/bert_jax/models/heads_test.py": 22,
    "tests/launch/local_pod_test.py": 21,
    "tests/data_pipelines/tokenizers/tokenization_test.py": 20,
    "tests/bert_jax/families/albert/convert_albert_test.py": 20,
    "tests/bert_jax/families/families_registry_test.py": 19,
    "tests/bert_jax/families/modernbert/neobert_recipe_test.py": 16,
    "tests/bert_jax/families/modernbert/neobert_test.py": 15,
    "tests/bert_jax/convert/convert_test.py": 15,
    # False negatives (issue 48 item 2), 2026-11-29 on the loaded box: 16 loss cases against
    # GISTEmbedLoss and the loops, 8-device mesh 50 s; the task's loss packed == unpacked 26 s.
    "tests/bert_jax/objectives/contrastive_false_negatives_test.py": 50,
    "tests/bert_jax/tasks/embedding_false_negatives_test.py": 26,
    "tests/bert_jax/objectives/embedding_distill_test.py": 18,   # torch + ST's losses (2026-11-29)
    "tests/bert_jax/tasks/embedding_distill_test.py": 15,   # the packed loss 9 s (loaded box)
}

SLOW = {   # -m slow: a name with "::" is a unit of its own, a file the rest of its slow tests
    "tests/end_to_end/stream_test.py::"
    "test_electra_one_and_two_hosts_give_the_same_losses_and_resume_on_each_other": 277,
    "tests/bert_jax/finetune_test.py": 248,
    # six programs on a copy of bert_jax/ with a toy family's folder (estimate: 700 s on the box
    # loaded by five other jobs, 2026-11-29; ~200 s idle)
    "tests/bert_jax/families/toy_family_test.py": 200,
    "tests/bert_jax/plan_test.py::"
    "test_search_finds_settings_that_fit": 100,   # 0c6996e: per-chip 2, not 16
    "tests/bert_jax/planning/plan_finetune_test.py::"   # an estimate: 91 s of CPU, 2026-11-27 on the loaded box
    "test_cli_plans_grad_cache_against_the_unchunked_step": 100,
    "tests/end_to_end/stream_test.py::"
    "test_one_and_two_hosts_train_on_the_same_stream_and_resume_on_each_other": 222,
    "tests/end_to_end/e2e_pretrain_test.py": 210,
    "tests/end_to_end/kill_test.py::"
    "test_sigkill_at_random_moments_resumes_bit_exactly[electra-tiny]": 160,
    "tests/packaging_test.py": 139,
    "tests/bert_jax/checkpoint/gcs_test.py": 139,
    "tests/bert_jax/families/electra/electra_test.py::"
    "test_the_discriminator_learns_to_detect_easy_replacements": 133,
    "tests/bert_jax/families/distilbert/distil_test.py::"
    "test_two_host_pod_distils_like_one_host_with_the_teacher_sharded_across_hosts": 132,
    "tests/end_to_end/multihost_train_test.py::"
    "test_two_process_pod_matches_one_process_and_resumes": 122,
    "tests/benchmarks/accelerator_benchmark_test.py": 117,
    "tests/end_to_end/late_host_test.py": 107,
    "tests/end_to_end/multihost_train_test.py::"
    "test_two_process_fsdp_finetune_exports_the_one_process_parameters": 106,
    "tests/bert_jax/families/electra/electra_finetune_test.py::"
    "test_pretrained_electra_workdir_feeds_finetune_predict_and_extract_features": 99,
    "tests/end_to_end/kill_test.py::"
    "test_sigkill_at_random_moments_resumes_bit_exactly[tiny]": 95,
    "tests/bert_jax/families/electra/electra_test.py": 95,
    "tests/bert_jax/families/distilbert/distil_test.py": 77,
    "tests/bert_jax/checkpoint/checkpoint_test.py": 74,
    "tests/bert_jax/families/distilbert/distil_finetune_test.py::"
    "test_distilled_workdir_feeds_finetune_predict_and_extract_features": 71,
    "tests/data_pipelines/tokenizers/wordpiece_py_test.py": 67,
    "tests/bert_jax/families/modernbert/modernbert_cli_test.py": 59,
    "tests/bert_jax/objectives/distil_parity_test.py": 58,
    "tests/bert_jax/families/electra/electra_finetune_test.py": 51,
    "tests/bert_jax/families/modernbert/modernbert_phase2_test.py": 48,
    "tests/bert_jax/families/families_registry_test.py": 47,
    "tests/end_to_end/faults_second_pass_test.py": 46,
    "tests/bert_jax/families/modernbert/modernbert_test.py": 45,
    "tests/bert_jax/training/batch_warmup_test.py": 43,
    "tests/bert_jax/families/modernbert/modernbert_export_test.py": 39,
    "tests/bert_jax/families/distilbert/distil_finetune_test.py::"
    "test_a_bert_teacher_distils_a_distilbert_student_in_finetune": 28,
    "tests/bert_jax/extract_features_test.py": 26,
    "tests/data_pipelines/beam_pipeline_test.py": 24,
    "tests/end_to_end/faults_test.py": 24,
    "tests/bert_jax/families/modernbert/korean_modern_test.py": 21,
    "tests/data_pipelines/tokenizers/bpe_tokenizer_test.py": 18,
    "tests/data_pipelines/tokenizers/tokenization_test.py": 17,
    "tests/benchmarks/profile_table_test.py": 17,
    "tests/data_pipelines/tokenizers/cjk_test.py": 7,
    # Slow units added 2026-11-27 (issues 38-42), not yet measured in a whole run: the helpers'
    # single runs on the shared box (upper bounds), so that they start before the short units.
    "tests/bert_jax/checkpoint/checkpoint_fit_test.py": 200,
    "tests/end_to_end/faults_third_pass_test.py": 150,
    "tests/bert_jax/families/tinybert/tinybert_test.py": 120,
    "tests/bert_jax/families/mobilebert/mobilebert_test.py": 260,   # train 71 s, fine-tune 84, transfer 56, export 28 (loaded)
    "tests/bert_jax/layers/fp8_test.py": 90,
    "tests/data_pipelines/input/mixture_train_test.py": 60,
    "tests/data_pipelines/input/mixture_test.py": 60,
    "tests/data_pipelines/input/phases_test.py": 100,         # the phased stream: 95 s on the loaded box (9 builds then)
    "tests/data_pipelines/input/phases_train_test.py": 110,   # three 10-step runs, one preempted: 92 s (loaded box)
    "tests/data_pipelines/tokenizers/multilingual_vocab_test.py": 40,
    "tests/bert_jax/families/modernbert/mmbert_convert_test.py": 50,   # its 2 slow tests + the folder, 46 s here (loaded box)
    "tests/bert_jax/objectives/contrastive_test.py": 60,   # + pool_packed vs the unpacked encoder: 5 s CPU, 41 s loaded
    "tests/bert_jax/tasks/tasks_embedding_test.py": 50,   # + report of the run: 41 s (2026-11-27, loaded box)
    # sentence-transformers both ways: 88 s with torch's first import (37 s), 3 CLIs apart
    "tests/bert_jax/convert/st_interop_test.py": 95,
    "tests/bert_jax/convert/st_interop_test.py::test_clis": 60,   # 3 CLIs: 55 s (2026-11-27, load 14)
    # all-MiniLM-L6-v2 (PyPI) converted and against SentenceTransformer.encode, both ways: 45 s
    # (2026-11-29, load ~1; the converting subprocess and torch's first import included)
    "tests/bert_jax/convert/minilm_real_test.py": 60,
    "tests/bert_jax/objectives/contrastive_pod_test.py": 25,   # a 2-process pod: 14-16 s on the loaded box
    # Mining hard negatives (issue 48 item 1), 2026-11-29 on the loaded box: parity with ST's
    # mine_hard_negatives x3, blocks, approx 59 s with the fixture; the CLI, its ST rows and a
    # 2-process pod 88 s. + the cross-encoder rescoring against ST's: 43 s (load ~6).
    "tests/bert_jax/inference/mining_test.py": 105,
    "tests/end_to_end/mine_test.py": 90,
    "tests/bert_jax/planning/plan_mine_test.py": 90,   # two TPU compiles: 86 s (loaded box)
    "tests/bert_jax/tasks/embedding_peer_test.py": 80,   # 4 variants, torch + sentence-transformers: 70 s (loaded)
    "tests/bert_jax/tasks/tasks_registry_test.py": 40,
    "tests/bert_jax/objectives/objectives_test.py": 30,
    "tests/bert_jax/objectives/layerwise_test.py": 30,
    "tests/bert_jax/export_serving_test.py": 70,   # its smoke: 42 s, + mobilebert-tiny 23 s (loaded box)
    # MobileBERT's progressive transfer: the resumed run 48 s, a stage's freeze 25 s (loaded)
    "tests/bert_jax/objectives/progressive_test.py": 90,
    "tests/benchmarks/serving_latency_benchmark_test.py": 40,
    # At 56fe1b4 on the loaded box (load 10-15), wall: GradCache step == plain step on 1 and 8
    # devices 97 + 111 s, its memory benchmark 33 s; the recipes' runlocal run 113 s, hf_cosine
    # against transformers 32 s (importing torch).
    "tests/bert_jax/tasks/embedding_grad_cache_test.py": 250,
    "tests/bert_jax/tasks/embedding_recipes_test.py": 150,
    # Packed embedding batches, 2026-11-27 on the loaded box: 4 more poolings/families and
    # GradCache on 8 devices 52 s, the loop packed vs unpacked 42-51 s.
    "tests/bert_jax/tasks/embedding_packed_test.py": 110,
    # The masks' GradCache step on 8 devices == the plain step (3 steps compiled): 160 s; a
    # guide run's vectors training a masked run, 3 fine-tunes: 160 s (loaded box, 2026-11-29)
    "tests/bert_jax/tasks/embedding_false_negatives_test.py": 320,
    # A reranker fine-tuned on docstrings (an untrained run + 12 epochs) and exported to a
    # CrossEncoder: 141 s; its step planned for v5e:1x1 (one libtpu compile): 190 s (loaded box,
    # 2026-11-29)
    "tests/bert_jax/tasks/reranker_end_to_end_test.py": 145,
    "tests/bert_jax/planning/plan_reranker_test.py": 190,
    "tests/bert_jax/convert/cross_encoder_test.py": 55,   # convert both ways + predict rerank
    # Distillation (2026-11-29, loaded box): a teacher in the step == its precomputed vectors ==
    # GradCache (3 steps compiled) 54 s; a MarginMSE student trained, exported, loaded in
    # sentence-transformers 57 s
    "tests/bert_jax/tasks/embedding_distill_test.py": 110,
}


def _key(nodeid):
  """The SLOW/FAST key of a test: its own node id if SLOW names it, else its file."""
  base = nodeid.split("[", 1)[0]          # a parametrized test named without its case: one unit
  for name in (nodeid, base):
    if name in SLOW:
      return name
  return nodeid.split("::", 1)[0]


def unit(nodeid, slow):
  """The scheduling unit of a test: its own node id if SLOW names it, else its file's tests of
  its tier (a file's fast tests and its slow ones are two units: the fast ones must not wait)."""
  key = _key(nodeid)
  return f"{key} (slow)" if slow and "::" not in key else key


def is_slow(item):
  return item.get_closest_marker("slow") is not None


def seconds(item):
  return (SLOW if is_slow(item) else FAST).get(_key(item.nodeid), DEFAULT_SECONDS)


def longest_first(items):
  """Sorts collected items in place: every fast test before every slow one (the suite's fast
  feedback first), and in each tier units by decreasing seconds, each unit's tests together and
  in their file's order (a stable sort on (tier, -seconds, the unit's first position)). Writes
  the slow tests' node ids where TIERS_ENV says, for the scheduler in the controller process,
  which sees node ids only."""
  first = {}
  for i, item in enumerate(items):
    first.setdefault(unit(item.nodeid, is_slow(item)), i)
  items.sort(key=lambda item: (is_slow(item), -seconds(item),
                               first[unit(item.nodeid, is_slow(item))]))
  path = os.environ.get(TIERS_ENV)
  if path:
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
      json.dump([item.nodeid for item in items if is_slow(item)], f)
    os.replace(tmp, path)       # both workers write the same list; neither reads a half of one


def under_xdist_worker():
  return "PYTEST_XDIST_WORKER" in os.environ


def make_scheduler(config, log):
  """A LoadFileScheduling over units() in the collected order, one test of look-ahead."""
  from xdist.scheduler import LoadFileScheduling  # pylint: disable=g-import-not-at-top

  class LongestFirst(LoadFileScheduling):

    slow_ids = None

    def _split_scope(self, nodeid):
      if self.slow_ids is None:    # the workers wrote it before their collections reached here
        path = os.environ.get(TIERS_ENV)
        self.slow_ids = set(json.load(open(path))) if path and os.path.exists(path) else set()
      return unit(nodeid, nodeid in self.slow_ids)

    def _reschedule(self, node):
      # xdist's LoadScopeScheduling._reschedule with "> 2" pending tests made "> 1": a worker
      # holds the test it runs plus one (it needs the next test to start the current one).
      if node.shutting_down:
        return
      if not self.workqueue:
        node.shutdown()
        return
      if self._pending_of(self.assigned_work[node]) > 1:
        return
      self._assign_work_unit(node)

  config.option.loadscopereorder = False    # keep longest_first's order, not most-tests-first
  return LongestFirst(config, log)
