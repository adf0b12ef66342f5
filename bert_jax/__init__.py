"""bert_jax: pre-train and fine-tune BERT-family encoders in JAX.

Importing the package (every `python -m bert_jax.X` and console script does, before any module
imports jax) decides which JAX backends may start: on a host without the chips of an installed
accelerator library (libtpu from requirements-test.txt on a CPU box) JAX would try that backend
and print its errors before the program's own output. bert_jax_core/platforms.py has the rule;
a JAX_PLATFORMS the user set is kept.
"""
from bert_jax_core import platforms as _platforms

_platforms.choose_jax_platforms()
