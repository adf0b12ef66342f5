"""python -m bert_jax.checkpoint verify DIR: checks every file of a workdir's checkpoints, one
step directory or a params export against its manifest (store.verify_main; bert-jax-verify)."""
import sys

from bert_jax.checkpoint import store
from bert_jax_core import errors

if __name__ == "__main__":
  errors.run_main(store.verify_main, sys.argv)
