"""Which tests the quick command runs (scripts/run_tests.sh) and which only the full suite does.

Two commands, as transformers and JAX split their slow tests (issue 39):

  * `bash scripts/run_tests.sh`, the quick tier, is what a newcomer runs to trust an install:
    `-m "not slow or smoke"`, the fast tests plus one short end-to-end run per model family and
    per CLI, <= 20 min on a 2-core CPU box from a fresh clone with an empty compilation cache;
  * `bash scripts/run_full_tests.sh`, every test (2-process pods, kill -9, learning runs, TPU
    compiles, exhaustive checks), <= 60 min; CI's `.ci/run` runs this one.

A test file marks its end-to-end tests `@pytest.mark.slow` itself. The two tables below move
tests between the tiers without editing their files, so that the split is in one place a reader
can weigh: FULL_ONLY are fast (unmarked) tests that only the full suite runs, each with why (the
quick tier keeps a cheaper test of the same path); SMOKE are slow tests the quick tier runs too.
A key is a file ("tests/x_test.py"), a test ("tests/x_test.py::test_y", every case of it) or one
case ("tests/x_test.py::test_y[case]"). tests/tiers_test.py checks that every key still names a
test, so a rename cannot silently move a test out of a tier. Seconds are the idle 2-core box's
(xdist_order.FAST, 2026-11-26, fresh cache) where a whole file moves; the rest are estimates.
"""

import pytest

FULL_ONLY = {
    # -- the optional extras and the benchmarks: not what a newcomer's install is judged by
    "tests/data_pipelines/beam_pipeline_test.py",              # 45 s: Apache Beam (requirements-beam.txt)
    "tests/benchmarks/accelerator_benchmark_test.py",      # 28 s: benchmarks/ on CPU
    "tests/bert_jax/checkpoint/gcs_test.py",                        # 28 s: a GCS emulator over HTTPS
    "tests/launch/local_pod_test.py",                  # 21 s: 2-process pods (the full suite's)
    "tests/benchmarks/profile_table_test.py",              # benchmarks/profile_table.py
    # benchmarks/compact_students.py: a MobileBERT forward compiled and timed (35 s on the box
    # loaded by other jobs, 2026-11-27)
    "tests/benchmarks/compact_students_benchmark_test.py::test_inference_speed_runs_mobilebert_s_own_network",
    # -- TPU compiles: the quick tier keeps the plan CLI on one tiny v5e compile
    #    (test_cli_fits_is_exit_0_and_quiet and the tests sharing its fixture)
    "tests/bert_jax/plan_test.py::test_out_of_memory_is_does_not_fit_with_exit_1",
    "tests/bert_jax/plan_test.py::test_mini_on_v4",
    "tests/bert_jax/plan_test.py::test_fsdp_shards_parameters_and_optimizer_state",
    "tests/bert_jax/plan_test.py::test_train_and_plan_share_the_step_builder",
    "tests/bert_jax/plan_test.py::test_largest_batch_compiles_each_batch_once",
    "tests/bert_jax/plan_test.py::test_a_plan_compile_neither_reads_nor_writes_the_persistent_cache",
    "tests/end_to_end/faults_second_pass_test.py::test_distilbert_step_is_lowered_with_its_frozen_teacher_from_shapes",
    "tests/end_to_end/faults_second_pass_test.py::test_programs_are_quiet_on_a_cpu_host_with_libtpu_without_jax_platforms",
    "tests/end_to_end/faults_second_pass_test.py::test_bert_jax_plan_console_script_runs_the_planner",
    # -- equivalences across meshes, hosts and resumes: the full suite's pods and kill tests
    #    check the same property end to end; the quick tier trains and resumes on one mesh
    "tests/bert_jax/train_test.py::test_same_loss_on_1_device_data8_and_fsdp4_data2",
    "tests/bert_jax/train_test.py::test_fsdp_actually_shards_parameters",
    "tests/bert_jax/train_test.py::test_loss_decreases_and_resume_matches_uninterrupted_with_accumulation",
    "tests/bert_jax/families/families_train_test.py::test_masked_stream_is_the_same_for_1_and_2_hosts_and_on_resume",
    "tests/bert_jax/families/families_train_test.py::test_flop_count_equals_the_matmuls_of_the_traced_training_step",
    "tests/data_pipelines/records/packing_test.py::test_packed_start_batch_resumes_the_stream[5]",
    "tests/data_pipelines/records/packing_test.py::test_packed_start_batch_resumes_the_stream[11]",
    "tests/data_pipelines/records/packing_test.py::test_packed_start_batch_resumes_the_stream[40]",
    "tests/data_pipelines/records/packing_test.py::test_packed_stream_is_the_same_for_two_hosts",
    "tests/data_pipelines/records/packing_test.py::test_finetune_packed_loss_and_gradients_equal_unpacked",
    "tests/data_pipelines/records/packing_test.py::test_finetune_with_pack_trains_fewer_steps_and_evaluates_unpacked",
    "tests/data_pipelines/input/pretrain_input_test.py::test_start_batch_resumes_the_stream[14]",
    "tests/data_pipelines/input/pretrain_input_test.py::test_start_batch_resumes_the_stream[16]",
    "tests/data_pipelines/input/pretrain_input_test.py::test_start_batch_resumes_the_stream[31]",
    "tests/data_pipelines/create_pretraining_data_test.py::test_same_seed_is_byte_identical_across_worker_counts",
    "tests/data_pipelines/create_pretraining_data_test.py::test_whole_corpus_sampling_draws_random_next_from_other_files",
    "tests/data_pipelines/create_pretraining_data_test.py::test_failure_midway_leaves_no_complete_looking_output",
    "tests/data_pipelines/create_pretraining_data_test.py::test_tfds_input_from_a_locally_built_dataset",
    "tests/data_pipelines/create_pretraining_data_test.py::test_filters_are_off_by_default_and_counted",
    "tests/bert_jax/models/model_test.py::test_albert_sharing_with_remat_gives_the_same_outputs_and_gradients",
    "tests/bert_jax/models/model_test.py::test_remat_same_output_and_grads",
    # -- the same count at every size: the quick tier counts the tiny presets against
    #    transformers; base/large/xxlarge build big torch models
    "tests/bert_jax/models/model_test.py::test_param_counts_match_transformers[L-4_H-256]",
    "tests/bert_jax/models/model_test.py::test_param_counts_match_transformers[base]",
    "tests/bert_jax/models/model_test.py::test_param_counts_match_transformers[large]",
    "tests/bert_jax/families/electra/electra_test.py::test_param_counts_match_transformers_and_the_paper[electra-base]",
    "tests/bert_jax/families/electra/electra_test.py::test_param_counts_match_transformers_and_the_paper[electra-large]",
    "tests/bert_jax/families/distilbert/distil_test.py::test_param_counts_equal_transformers_distilbert[distilbert-base]",
    # -- fine-tuning variants: the quick tier fine-tunes every family (families_finetune_test)
    #    and each task type one step (finetune_test's one-step tests)
    "tests/bert_jax/families/families_finetune_test.py::test_tagging_and_multiple_choice_finetune_from_the_checkpoint",
    "tests/bert_jax/families/families_finetune_test.py::test_span_qa_finetunes_from_the_checkpoint",
    "tests/bert_jax/finetune_test.py::test_preempted_learning_rate_sweep_resumes",
    "tests/bert_jax/finetune_test.py::test_a_classifier_that_predicts_one_class_warns",
    "tests/bert_jax/finetune_test.py::test_unset_rate_and_epochs_scale_to_the_model_and_the_last_partial_batch_is_used",
    # -- Pallas kernels in interpret mode (GPU/TPU kernels emulated on CPU, slow): the quick
    #    tier keeps the kernel choice and the XLA path
    "tests/bert_jax/layers/attention_test.py::test_pallas_gpu_equals_xla_float32",
    "tests/bert_jax/layers/attention_test.py::test_pallas_gpu_equals_xla_bfloat16",
    "tests/bert_jax/layers/attention_test.py::test_splash_equals_xla_float32",
    "tests/bert_jax/layers/attention_test.py::test_splash_window_equals_xla_float32",
    "tests/bert_jax/layers/attention_test.py::test_fused_kernel_under_a_mesh_equals_unsharded",
    "tests/bert_jax/layers/attention_test.py::test_model_with_a_fused_kernel_equals_the_xla_model",
    "tests/bert_jax/layers/attention_test.py::test_pallas_gpu_lengths_must_fit_its_tiles",
    # -- vocabulary variants: the quick tier learns WordPiece and a unigram model
    "tests/data_pipelines/build_vocab_test.py::test_sentencepiece_models[bpe]",
    "tests/data_pipelines/build_vocab_test.py::test_hangul_coverage_cuts_unknowns_on_held_out_korean",
}

SMOKE = {
    # one short end-to-end run per model family and per CLI, as programs (python -m ...)
    "tests/bert_jax/families/electra/electra_test.py::test_python_m_bert_jax_train_pretrains_electra_and_resumes_exactly",
    "tests/bert_jax/families/modernbert/modernbert_test.py::test_pretrains_through_the_loop_and_exports_to_transformers",
    "tests/bert_jax/families/distilbert/distil_finetune_test.py::test_a_bert_teacher_distils_a_distilbert_student_in_finetune",
    "tests/bert_jax/families/families_registry_test.py::"
    "test_a_toy_family_pretrains_predicts_exports_and_finetunes_through_the_entry_points",
    "tests/bert_jax/finetune_test.py::test_glue_pair_classification_end_to_end",
    "tests/bert_jax/extract_features_test.py::test_cli_writes_a_numpy_loadable_file",
    # bert_jax.export_serving: fine-tuning export -> TFLite, checked (15 s idle, 42 s on the
    # loaded box 2026-11-27: TF's import and one conversion)
    "tests/bert_jax/export_serving_test.py::"
    "test_python_m_export_serving_writes_a_flatbuffer_whose_logits_equal_ours",
}


def _keys(nodeid):
  """The table keys that can name a test: its case, its test, its file."""
  base = nodeid.split("[", 1)[0]
  return (nodeid, base, nodeid.split("::", 1)[0])


def apply(items):
  """Marks FULL_ONLY tests slow and SMOKE tests smoke (before -m selects), and returns the keys
  that named no collected test (for tests/tiers_test.py; a partial collection leaves many)."""
  used = set()
  for item in items:
    keys = _keys(item.nodeid)
    for table, mark in ((FULL_ONLY, pytest.mark.slow), (SMOKE, pytest.mark.smoke)):
      hit = [k for k in keys if k in table]
      if hit:
        used.update(hit)
        item.add_marker(mark)
  return (FULL_ONLY | SMOKE) - used
