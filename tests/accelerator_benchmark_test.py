"""benchmarks/accelerator.py runs end to end on CPU (--smoke); its synthetic records look real."""

import numpy as np
import pytest

from benchmarks import accelerator


def test_synthetic_lengths_follow_the_quick_start_records():
  lengths = accelerator.sample_lengths(np.random.default_rng(0), 20_000, 128)
  # Measured on the quick start's records: mean fill 0.443, p10/p50/p90 = 23/45/128 tokens.
  assert abs(lengths.mean() / 128 - 0.443) < 0.03
  np.testing.assert_allclose(np.quantile(lengths, [0.1, 0.5]), [23, 45], atol=2)
  assert np.quantile(lengths, 0.91) == 128
  # Scaled to phase 2's rows: same shape, 4x the tokens.
  assert abs(accelerator.sample_lengths(np.random.default_rng(0), 20_000, 512).mean() / 512
             - 0.443) < 0.03


def test_synthetic_instances_hold_a_bert_layout():
  b, lengths = accelerator.make_instances(np.random.default_rng(0), 16, 128, 20, 30522)
  for i, n in enumerate(lengths):
    assert b["input_ids"][i, 0] == 2 and b["input_ids"][i, n - 1] == 3        # [CLS] ... [SEP]
    assert b["input_mask"][i].sum() == n and not b["input_ids"][i, n:].any()
    k = int(b["masked_lm_weights"][i].sum())
    assert 1 <= k <= 20 and (b["input_ids"][i, b["masked_lm_positions"][i, :k]] == 4).all()


def test_packed_batches_are_nearly_full_and_count_every_instance():
  rng = np.random.default_rng(0)
  batches, contents = accelerator.make_batches(rng, count=1, rows=32, seq=128, preds=20,
                                               vocab=30522, packed=True)
  b, (lengths, preds) = batches[0], contents[0]
  assert b["input_mask"].mean() > 0.9                        # unpacked: ~0.44
  assert lengths.sum() == b["input_mask"].sum()
  assert preds.sum() == b["masked_lm_weights"].sum()
  assert len(lengths) == b["nsp_weights"].sum()


def test_smoke_run_prints_throughput_and_flops():
  (r,) = accelerator.main(["--smoke", "--packing=packed"])
  assert r["backend"] == "xla" and r["packed"] and r["tokens_per_s"] > 0 and r["seqs_per_s"] > 0
  assert r["fill"] > 0.85                                    # packed rows are nearly all real
  assert r["mfu"] is None                                    # CPU: no bf16 peak to divide by
  # The compiled step's FLOPs are within 25% of the analytic count of its slots.
  assert 0.8 < r["xla_flops"] / r["slot_flops"] < 1.25
  assert "MFU    n/a" in accelerator.format_row(r)


@pytest.mark.slow
def test_smoke_run_packed_beats_unpacked_in_real_tokens():
  unpacked, packed = accelerator.main(["--smoke", "--steps=6"])
  assert not unpacked["packed"] and packed["packed"]
  assert 0.3 < unpacked["fill"] < 0.6
  # Same rows per step, about twice the real tokens in each: a real-token rate well above.
  assert packed["tokens_per_s"] > 1.3 * unpacked["tokens_per_s"]
