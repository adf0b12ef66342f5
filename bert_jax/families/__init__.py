"""Model families, one module each (bert_jax/families/<name>.py), found by name in one table
(registry.py: the Family record and the lookups, re-exported here).

  from bert_jax import families
  families.get("electra").pretraining_model(config)      # what the loop trains
  families.for_hf_folder("hf/distilbert-base")           # which family reads a transformers folder

This package's __init__ imports the registry only: the family modules are loaded by name on the
first lookup (they import bert_jax.models.model, which reads the registry), so importing
`bert_jax.families` never imports a model.
"""

from bert_jax.families.registry import (BUILTIN, REGISTRY, Family, converter_hooks,  # noqa: F401
                                        for_hf_folder, get,
                                        hf_model_type, is_hf_folder, names, of_preset, presets,
                                        register, registered, unregister)
