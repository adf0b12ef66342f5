"""A TFDS dataset of texts built locally (no download), for the tfds input paths of the tests."""

from bert_jax_core.tf_setup import tf


def build_text_dataset(name, texts, data_dir):
  """Prepares TFDS dataset `name` (version 1.0.0, one "train" split, feature "text") in data_dir."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.dataset_builders.TfDataBuilder(
      name=name, version="1.0.0",
      split_datasets={"train": tf.data.Dataset.from_tensor_slices({"text": texts})},
      features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
      data_dir=str(data_dir))
  builder.download_and_prepare()
