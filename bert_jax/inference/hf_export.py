"""Any bert_jax checkpoint (a params export, a workdir, a step directory; local or gs://) -> a
Hugging Face BertForPreTraining folder.

  from bert_jax.inference import hf_export
  hf_export.export_to_hf("runs/base", "hf_export")

It loads through inference/loading.py (the checkpoint's own vocabulary and casing), which in turn
converts Hugging Face folders through bert_jax.convert: so it lives here, in the layer above the
converter, not in convert/ (tests/layers_test.py: imports point down).
"""

from bert_jax import convert
from bert_jax.inference import loading as inference


def export_to_hf(checkpoint, output, *, vocab_file=None, do_lower_case=None,
                 spm_model_file=None):
  """Orbax params export, workdir or step directory (local or gs://) -> HF BertForPreTraining."""
  convert.check_new_output(output)
  m = inference.load_for_inference(checkpoint, vocab_file=vocab_file,
                                   spm_model_file=spm_model_file, do_lower_case=do_lower_case)
  return convert.export_model_to_hf(m, output, checkpoint)
