"""benchmarks/embedding_peer.py: ours and sentence-transformers' MNRL / CachedMNRL each take
training steps on the same rows, and at random init both losses are InfoNCE's ~log(batch)."""

import math

import pytest

from benchmarks import embedding_peer


@pytest.mark.slow
@pytest.mark.parametrize("variant", embedding_peer.VARIANTS)
def test_each_variant_trains_and_starts_at_log_batch(variant):
  r = embedding_peer.one(variant, batch=8, seq=16, steps=1)
  assert r["seconds_per_step"] > 0 and r["peak_mb"] > 0
  # A random encoder scores every candidate alike: cross-entropy over 8 candidates ~ log 8.
  assert abs(r["loss"] - math.log(8)) < 0.5, r
