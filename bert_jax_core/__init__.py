"""The bottom layer: what bert_jax and data_pipelines both use, importing neither.

  errors.py    UserError (every mistake a user can fix) and `run`, the one-line-error CLI runner
  tf_setup.py  TensorFlow imported for input pipelines only, hidden from every accelerator
  files.py     file SHA-256 and atomic (temp-then-rename) writes, local or gs://
  text_files.py  the one rule for "is this file UTF-8 text?" every corpus and task reader applies
  platforms.py which JAX backends a program starts (none whose chips this host lacks)

Layers (tests/layers_test.py checks them): bert_jax_core imports no project module;
data_pipelines imports bert_jax_core only; bert_jax imports both. No import cycles anywhere.
"""
