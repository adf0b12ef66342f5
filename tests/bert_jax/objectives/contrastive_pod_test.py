"""InfoNCE over a 2-process pod's global batch equals one process on the same batch (issue 40,
item 3).

tests/testlib/contrastive_pod.py runs under `launch.local_pod` (2 processes x 4 CPU devices, gloo): each
host feeds its own 8 of the 16 rows, and contrastive.matryoshka_info_nce (the embedding task's
loss) and its gradients are taken on the sharded global arrays, unpacked and as packed rows'
pooled texts (contrastive.texts_of_rows), and with the false-negative masks (a duplicate
positive on the other host, a guide's vectors: contrastive_pod.false_negative_batch). Here one process computes the same on the whole batch,
unsharded.
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import subprocess

import numpy as np
import pytest

from tests.testlib import contrastive_pod
from tests.testlib import pod_testlib

ROOT = tests.ROOT


@pytest.mark.slow
def test_two_process_global_batch_loss_and_gradients_equal_one_process():
  r = subprocess.run(pod_testlib.pod_command(2, 4) + ["--timeout_seconds=150", "--",
                                                      "tests.testlib.contrastive_pod"],
                     cwd=ROOT, capture_output=True, text=True, timeout=180)
  assert r.returncode == 0, pod_testlib.failure(r)
  results = [json.loads(l.split("RESULT ", 1)[1]) for l in r.stdout.splitlines() if "RESULT " in l]
  assert len(results) == 1, pod_testlib.failure(r)
  pod = results[0]
  # The rows really were split over two hosts: no process held the whole batch.
  assert (pod["process_count"], pod["device_count"], pod["fully_addressable"]) == (2, 8, False)
  one = contrastive_pod.losses_and_grads(*contrastive_pod.global_batch(),
                                         masks=contrastive_pod.false_negative_batch())
  assert set(one) <= set(pod) and "false_negatives" in one
  for name, (loss, (d_a, d_c)) in one.items():
    assert pod[name]["loss"] == pytest.approx(float(loss), rel=1e-6), name
    # float32 sums in another order: gradients of size ~1 differ by up to 1.5e-7 (measured).
    np.testing.assert_allclose(pod[name]["d_anchors"], d_a, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(pod[name]["d_candidates"], d_c, rtol=1e-5, atol=1e-6,
                               err_msg=name)
  # The masks took candidates out: not the symmetric setting's loss (the same scale).
  assert abs(pod["false_negatives"]["loss"] - pod["symmetric"]["loss"]) > 1e-2
  # Packed rows (the embedding task's --config.pack=true): the same loss, and each text's
  # gradient at its slot of the global rows (empty slots 0), though a host's examples read the
  # other host's rows.
  loss, (d_a, d_c) = float(one["plain"][0]), one["plain"][1]
  assert pod["packed"]["loss"] == pytest.approx(loss, rel=1e-6)
  _, slots, _ = contrastive_pod.packed_batch()
  d_pooled = np.asarray(pod["packed"]["d_pooled"]).reshape(-1, contrastive_pod.D)
  want = np.zeros_like(d_pooled)
  want[slots.reshape(-1)] = np.concatenate([np.asarray(d_a)[:, None], d_c],
                                           axis=1).reshape(-1, contrastive_pod.D)
  np.testing.assert_allclose(d_pooled, want, rtol=1e-5, atol=1e-6)
  rows_of = slots // contrastive_pod.SLOTS   # the packed row of each text
  assert (rows_of[:8] >= 8).any() and (rows_of[8:] < 8).any()   # read across hosts
  # ...and that is not what each host would get from its own rows alone: every host's rows and
  # hard negatives are every anchor's negatives.
  a, c, w = contrastive_pod.global_batch()
  per_host = [contrastive_pod.losses_and_grads(a[h], c[h], w[h])["plain"][0]
              for h in (slice(0, 8), slice(8, 16))]
  assert abs(float(np.mean(per_host)) - float(one["plain"][0])) > 0.1, (per_host, one["plain"])
