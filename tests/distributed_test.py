"""bert_jax.distributed in one process: env validation and the single-host paths.

The multi-process paths (initialize from BERT_JAX_*, the cross-host hash check, dead peers)
run in real processes in tests/local_pod_test.py.
"""

import hashlib

import pytest

from bert_jax import distributed


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
  for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES,
               distributed.ENV_PROCESS_ID, distributed.ENV_HEARTBEAT, "TPU_WORKER_HOSTNAMES",
               "MEGASCALE_COORDINATOR_ADDRESS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    monkeypatch.delenv(name, raising=False)


def test_single_host_does_nothing():
  assert distributed.maybe_initialize_distributed() == "single"
  assert distributed.maybe_initialize_distributed(distributed=False) == "single"


@pytest.mark.parametrize("name,value,needle", [
    ("SLURM_NTASKS", "4", True), ("SLURM_NTASKS", "1", False),
    ("OMPI_COMM_WORLD_SIZE", "2", True), ("TPU_WORKER_HOSTNAMES", "h0,h1", True),
    ("SLURM_NTASKS", "junk", False)])
def test_multihost_detection_from_env(monkeypatch, name, value, needle):
  monkeypatch.setenv(name, value)
  assert distributed._multihost_env_detected() is needle


@pytest.mark.parametrize("env,needle", [
    (dict(BERT_JAX_COORDINATOR="localhost"), "expected host:port"),
    (dict(BERT_JAX_COORDINATOR="localhost:1", BERT_JAX_NUM_PROCESSES="two",
          BERT_JAX_PROCESS_ID="0"), "env BERT_JAX_NUM_PROCESSES='two': expected an integer"),
    (dict(BERT_JAX_COORDINATOR="localhost:1", BERT_JAX_NUM_PROCESSES="2",
          BERT_JAX_PROCESS_ID="2"), "env BERT_JAX_PROCESS_ID='2': expected an integer in [0, 1]"),
    (dict(BERT_JAX_COORDINATOR="localhost:1", BERT_JAX_NUM_PROCESSES="2"),
     "env BERT_JAX_PROCESS_ID=''"),
    (dict(BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS="0"), "BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS='0'"),
])
def test_bad_env_is_a_clear_error_before_initialize(monkeypatch, env, needle):
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  with pytest.raises(distributed.DistributedSetupError) as e:
    distributed.maybe_initialize_distributed()
  assert needle in str(e.value)
  assert "\n" not in str(e.value)


def test_hash_check_on_one_host_returns_sha256():
  assert distributed.assert_same_on_all_hosts("vocab", "a\nb\n") == hashlib.sha256(
      b"a\nb\n").hexdigest()
  assert distributed.assert_same_on_all_hosts("cfg", b"\x00\xff") == hashlib.sha256(
      b"\x00\xff").hexdigest()


def test_tpu_detection_reads_pci_vendor_and_class(tmp_path):
  def device(name, vendor, cls):
    (tmp_path / name).mkdir()
    (tmp_path / name / "vendor").write_text(vendor + "\n")
    (tmp_path / name / "class").write_text(cls + "\n")
  device("0000:00:04.0", "0x1ae0", "0x020000")  # gVNIC: Google, but a network card
  device("0000:00:05.0", "0x8086", "0x120000")  # another vendor's accelerator
  assert distributed.tpu_chips_present(str(tmp_path)) is False
  device("0000:00:06.0", "0x1ae0", "0x120000")  # a TPU chip
  assert distributed.tpu_chips_present(str(tmp_path)) is True
  assert distributed.tpu_chips_present(str(tmp_path / "missing")) is False


def test_preemption_check_restores_the_previous_sigterm_handler():
  import os
  import signal
  seen = []
  previous = signal.signal(signal.SIGTERM, lambda *a: seen.append("mine"))
  try:
    mine = signal.getsignal(signal.SIGTERM)
    with distributed.preemption_check() as preempted:
      assert signal.getsignal(signal.SIGTERM) is not mine
      assert not preempted(1)
      os.kill(os.getpid(), signal.SIGTERM)
      assert preempted(2) and seen == []  # the check took the signal, not the old handler
    assert signal.getsignal(signal.SIGTERM) is mine  # left as it was found
    check = distributed.preemption_check()
    check.close()
    check.close()  # idempotent
    assert signal.getsignal(signal.SIGTERM) is mine
  finally:
    signal.signal(signal.SIGTERM, previous)
