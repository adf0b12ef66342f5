"""Model families: one module each, found by name in one table.

A family (bert, albert, spanbert, electra, distilbert, ...) is everything that varies between
the encoders this framework trains on its one encoder and one loop: its presets, the BertConfig
fields it may set, its pre-training recipe defaults, the network its step trains and that step's
outputs, its FLOP count, its fine-tuning body and [CLS] head, fill-mask, the transformers
`model_type`s it converts from and to, and what a finished run prints next. Each lives in
`bert_jax/families/<name>/` (its `__init__.py` builds one `Family` record, its network,
objective and converter sit beside it); the loop (train.py, finetune.py), the CLIs
(predict, extract_features, plan) and the converters look the record up here and never name a
family. This is transformers' Auto mapping (model_type -> classes) and KerasHub's preset registry
in one plain dict.

A new family is a new folder whose `__init__.py` builds a `Family` (usually `dataclasses.replace` of BERT's, which
holds the defaults) and calls `register`; tests/bert_jax/families/families_registry_test.py adds a toy one in the
test itself and runs it through pre-training, conversion, fill-mask and fine-tuning.

Discovery: every module of this package is imported on the first lookup (pkgutil: `bert` first,
as it holds every hook's default, then the others in name order), and a module that builds a
`Family` calls `register`; there is no hand-kept list, so a new family is a new folder here
(its network, objective and converter sit inside it, e.g. mobilebert/layers.py, electra/objective.py,
albert/convert.py), as the task
types' table (bert_jax/tasks/registry.py) finds its modules.

Layers: this module imports nothing of ours. model.py reads the table (BertConfig's rules and the
presets); the family modules import model.py and register themselves, loaded by module name on
the first lookup (`_load_builtin`, importlib), as transformers' Auto mapping loads a
model_type's module by name: model.py never imports a family module, so the families can build
on it without an import cycle (tests/layers_test.py).
"""

import dataclasses
import importlib
import json
import os
import pkgutil
from typing import Callable, Mapping, Optional


@dataclasses.dataclass(frozen=True)
class Family:
  """What one model family declares. The callables' signatures are BERT's (families/bert/)."""
  name: str
  presets: Mapping[str, dict]      # preset name -> BertConfig fields (family=name among them)
  summary: str                     # one line for --help and docs: the paper and what differs
  title: str = ""                  # how messages name it ("ELECTRA"); "" = the name

  # --- BertConfig rules (model.BertConfig checks them without naming a family).
  factorised_embeddings: bool = False   # embedding_size E > 0 allowed (tables of width E)
  shared_layers: bool = False           # share_layers other than "none" allowed
  generator: bool = False               # the generator_* sizes (all four > 0, else all 0)
  token_types: bool = True              # type_vocab_size >= 1; False: exactly 0 (no table)
  pooler: bool = True                   # BertModel's tanh pooler on [CLS]
  exact_objectives: Optional[tuple] = None   # the only objective set allowed (e.g. mlm, rtd)
  own_objectives: tuple = ()            # objectives no other family may train (ELECTRA's rtd)
  check_config: Optional[Callable] = None    # (BertConfig) -> None, raises ValueError
  # The family's config record: a BertConfig subclass with the family's own fields (MobileBERT's
  # bottleneck sizes), so they do not grow the record every family carries; None: BertConfig.
  # get_bert_config and BertConfig.from_dict build it by the `family` field.
  config_class: Optional[type] = None

  # --- Pre-training recipe defaults (configs/pretrain.py) and the step (train.py).
  masking: str = "token"                # token | ngram | span
  whole_word_masking: bool = False
  recipe: Optional[Callable] = None     # (ConfigDict, preset) -> None: the paper's values
  phase2: Optional[Callable] = None     # (ConfigDict, preset) -> None: the `phase2` variant
                                        #   (None: BERT's seq-512 phase, configs/pretrain.py)
  pretraining_model: Callable = None    # (BertConfig) -> nn.Module the step trains
  forward: Callable = None              # (module, batch, deterministic) -> {objective: ...}
  flops_per_sequence: Callable = None   # (model_config, seq_length, preds, nsp, teacher_config)
  # A frozen network in the step (DistilBERT's teacher): loaded and checked before compute,
  # recorded in the checkpoint meta and compared on resume.
  load_teacher: Callable = None         # (config, model_config) -> teacher or None
  check_teacher: Callable = None        # (checkpoint meta, teacher, workdir) -> None
  init_from_teacher: Callable = None    # (state, steps, config, teacher, num_layers) -> state
  planning_teacher: Callable = None     # (config, model_config) -> teacher as shapes, or None
  step_parts: Callable = None           # (config, model_config, teacher, dummy, mesh, rules)
                                        #   -> (forward, loss weights or None, frozen or None)
  # May a student learn from this family's checkpoints as from BERT's (a post-LN encoder with
  # an MLM head: objectives/teacher.py)? BERT's record says yes, and so does every family built
  # on it unless it says no (ALBERT's shared layers, ELECTRA's pair, the own networks).
  plain_teacher: bool = False

  # --- Fine-tuning, features, fill-mask.
  encode: Callable = None               # (config, ids, mask, segments, **rows) -> BertModel dict;
                                        #   called in a head's compact __call__ (submodule "bert")
  cls_logits: Callable = None           # (config, encoder outputs, num_labels, deterministic)
  token_logits: Callable = None         # (config, encoder outputs, num_labels, deterministic,
                                        #   *, name, dropout) -> [B, T, L]: BERT's dense `name`
                                        #   after dropout if asked (heads.py says which)
  features_model: Callable = None       # (config) -> (module, method or None): hidden states
  check_fill_mask: Callable = None      # (predictor, checkpoint) -> None, raises a user error
  mlm_logits: Callable = None           # (params, config, ids, mask, segments, positions)
                                        #   -> (mlm logits [1, P, V], sentence logits or None)
  describe: Callable = None             # (config, purpose, params_keys, do_train) -> str or None

  # --- transformers and google TF checkpoints.
  hf_model_types: tuple = ()            # config.json model_type values this family reads
  hf_config_file: Callable = None       # (folder) -> its config.json path, or None
  tf_config_names: tuple = ()           # google TF release config names (bert_config.json)
  config_marker_keys: tuple = ()        # keys that name the family in a config without model_type
  config_from_json: Callable = None     # (json dict, file, kind "tf"|"hf", gelu) -> (cfg, numerics)
  name_table: Callable = None           # (BertConfig) -> names.Spec list (one-folder families)
  normalise_hf_names: Callable = None   # (Source) -> (Source, {ignored: why})
  hf_config_json: Callable = None       # (BertConfig, pad_id) -> transformers config.json dict
  hf_class: str = "BertForPreTraining"  # what an export writes
  import_hf: Callable = None            # (path, vocab_file, do_lower_case) -> (params, cfg, meta);
                                        #   None: the one-folder name-table import of convert
  export_hf: Callable = None            # (InferenceModel, output) -> written path; None: as above
  hf_body: Callable = None              # (params, config) -> (transformers base class, {its
                                        #   names: array}): the encoder alone (BertModel), what
                                        #   a sentence-transformers folder holds
  # --- What a finished pre-training run prints next (train.next_commands).
  train_further_note: str = ""

  @property
  def display(self) -> str:
    return self.title or self.name

  def with_defaults(self, base: "Family") -> "Family":
    """This family with every hook it leaves None taken from `base` (BERT's)."""
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(self)
              if getattr(self, f.name) is None and getattr(base, f.name) is not None}
    return dataclasses.replace(self, **fields)


REGISTRY: dict = {}   # name -> Family, in registration order
_PACKAGE = __name__.rpartition(".")[0]   # bert_jax.families


def _modules() -> tuple:
  """The family packages that ship with bert_jax (bert_jax/families/<name>/, this module
  left out): BERT first (it holds every hook's default), the others in name order. Listing
  only (pkgutil reads the folder): nothing is imported here."""
  path = os.path.dirname(os.path.abspath(__file__))
  found = sorted(m.name for m in pkgutil.iter_modules([path])
                 if m.name != __name__.rpartition(".")[2])
  return tuple(["bert"] + [m for m in found if m != "bert"])


# The families that ship with bert_jax, one folder each, found in the folder, not kept by hand.
BUILTIN = _modules()
_loaded = []


def _load_builtin():
  """Imports every module of this package once; each family module registers itself."""
  if not _loaded:
    _loaded.append(True)   # before the imports: each one registers through this module
    for name in BUILTIN:
      importlib.import_module(f"{_PACKAGE}.{name}")


def converter_hooks(module_name) -> dict:
  """A family's four conversion hooks (config_from_json, name_table, normalise_hf_names,
  hf_config_json) as calls into bert_jax.families.<module_name>.convert, imported on the first
  call, so that a family's record loads without its converter's imports (convert.formats reads
  TensorFlow checkpoints). The module's
  `specs` is the name table; its config_from_json names its own activation, so `gelu` is unused.
  Use: dataclasses.replace(bert.FAMILY, ..., **families.converter_hooks("albert"))."""
  def converter():
    return importlib.import_module(f"{_PACKAGE}.{module_name}.convert")

  def config_from_json(d, path, kind, gelu="auto"):
    del gelu
    return converter().config_from_json(d, path, kind)

  def name_table(config):
    return converter().specs(config)

  def normalise_hf_names(source):
    return converter().normalise_hf_names(source)

  def hf_config_json(config, pad_token_id=0):
    return converter().hf_config_json(config, pad_token_id)

  return dict(config_from_json=config_from_json, name_table=name_table,
              normalise_hf_names=normalise_hf_names, hf_config_json=hf_config_json)


def register(family: Family, *, replace=False) -> Family:
  """Adds `family` (its None hooks taken from BERT's) and returns it. A second family of the same
  name, or a preset name two families claim, is an error unless replace=True."""
  if family.name not in BUILTIN:
    _load_builtin()
  if family.name in REGISTRY and not replace:
    raise ValueError(f"model family {family.name!r} is already registered.")
  if "bert" in REGISTRY and family.name != "bert":
    family = family.with_defaults(REGISTRY["bert"])
  for preset, fields in family.presets.items():
    owner = next((f.name for f in REGISTRY.values() if preset in f.presets
                  and f.name != family.name), None)
    if owner:
      raise ValueError(f"preset {preset!r} of family {family.name!r} is already family "
                       f"{owner!r}'s.")
    if fields.get("family", "bert") != family.name:
      raise ValueError(f"preset {preset!r} says family={fields.get('family', 'bert')!r} but is "
                       f"registered by {family.name!r}.")
  REGISTRY[family.name] = family
  return family


def unregister(name):
  """Removes a family (tests that register a toy one clean up with this)."""
  REGISTRY.pop(name, None)


def registered() -> list:
  """Every registered family (the built-in ones loaded first)."""
  _load_builtin()
  return list(REGISTRY.values())


def names() -> tuple:
  _load_builtin()
  return tuple(REGISTRY)


def get(name) -> Family:
  _load_builtin()
  try:
    return REGISTRY[name]
  except KeyError:
    raise ValueError(f"model family {name!r} is not one of {names()} (bert_jax/families/).") \
        from None


def presets() -> dict:
  """Every family's presets in one dict: preset name -> BertConfig fields."""
  _load_builtin()
  return {p: fields for f in REGISTRY.values() for p, fields in f.presets.items()}


def of_preset(preset) -> Optional[Family]:
  """The family that declares `preset`, or None for an unknown name."""
  _load_builtin()
  return next((f for f in REGISTRY.values() if preset in f.presets), None)


def hf_model_type(path) -> Optional[str]:
  """The model_type of a transformers folder (None when no family finds its config.json)."""
  _load_builtin()
  for family in REGISTRY.values():
    config_file = family.hf_config_file(path)
    if config_file:
      with open(config_file, encoding="utf-8") as f:
        try:
          return json.load(f).get("model_type", "bert")
        except ValueError:
          return None   # not JSON: the reader's one-line error names it
  return None


def for_hf_folder(path) -> Family:
  """The family that reads transformers folder `path`, by its config.json's model_type."""
  _load_builtin()
  kind = hf_model_type(path)
  for family in REGISTRY.values():
    if kind in family.hf_model_types and family.hf_config_file(path):
      return family
  known = sorted(t for f in REGISTRY.values() for t in f.hf_model_types)
  raise ValueError(f"{path}: a transformers folder of model_type={kind!r}; bert_jax converts "
                   f"{', '.join(known)} (bert_jax/families/).")


def is_hf_folder(path) -> bool:
  """A local folder some family reads as a transformers model."""
  _load_builtin()
  path = str(path)
  return ("://" not in path and os.path.isdir(path)
          and any(f.hf_config_file(path) for f in REGISTRY.values()))

