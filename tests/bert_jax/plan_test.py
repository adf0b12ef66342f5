"""bert_jax.plan: the real train step compiled for TPU slices on this CPU host (libtpu's compiler).

libtpu comes with requirements-test.txt; without it these tests skip locally and FAIL in CI, so a
CI run can never pass them without compiling. The tests that run the CLI in a subprocess come
first, before this process loads libtpu itself: two processes compiling with libtpu at the same
time crashed one of them once (a segfault in the compiler on this host). Tiny/mini only here (seconds to tens of seconds per
compile on 2 CPU cores); BERT-base/large compiles are in docs/planning.md's commands.

What a tiny compile costs (CPU seconds of one in-process compile_step for v5e:2x2, per-chip batch 4,
libtpu 0.0.42.1 on this host): BERT-tiny as configured (vocab 30,522, seq 128, dropout 0.1) 65 s;
vocab 512, seq 128, no attention dropout (splash) 37 s; vocab 512, seq 32, no dropout 19 s. So the
tests whose claim is not about the vocabulary, the sequence length or dropout compile the small
programs (SMALL); mini on v4 keeps its vocab (its FLOPs ratio, 1.107 with vocab 512, is the claim).
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import importlib.util
import json
import os
import subprocess
import sys

import jax
import pytest

from bert_jax import plan as plan_lib
from bert_jax.parallel import tpu_specs
from bert_jax.configs import pretrain

ROOT = tests.ROOT
# The cheapest tiny program (the numbers above): fields for config(), and the same as CLI flags.
SMALL = {"model.vocab_size": 512, "seq_length": 32, "model.attention_dropout_prob": 0.0,
         "model.hidden_dropout_prob": 0.0}
SMALL_FLAGS = tuple(f"--config.{k}={v}" for k, v in SMALL.items())


@pytest.fixture(autouse=True)
def libtpu():
  if importlib.util.find_spec("libtpu") is None:
    if os.environ.get("CI"):
      pytest.fail("libtpu is not installed: pip install -r requirements-test.txt")
    pytest.skip("libtpu not installed (pip install -r requirements-test.txt)")


@pytest.fixture(autouse=True)
def tpu_programs_as_users_compile_them(monkeypatch):
  """The suite lowers XLA's optimisation for its CPU programs (tests/testlib/xla_test_flags.py); a TPU
  program's memory and FLOPs are these tests' claims, so they compile with XLA's defaults, in this
  process and in the compile processes they start."""
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  was = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", False)
  yield
  jax.config.update("jax_disable_most_optimizations", was)


def config(preset="tiny", batch=16, **fields):
  c = pretrain.get_config(preset)
  c.model.dtype = "bfloat16"
  c.batch_size = batch
  for k, v in fields.items():
    if k.startswith("model."):
      c.model[k[len("model."):]] = v
    else:
      c[k] = v
  return c


def _cli(*args):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
  env.pop("XLA_FLAGS", None)
  return subprocess.run([sys.executable, "-m", "bert_jax.plan", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def tiny_v5e(tmp_path_factory):
  """The CLI on BERT-tiny without attention dropout (so `auto` picks splash: seq 128 kept) for a
  v5e 2x2; vocab 512 (37 s of CPU to compile, not 65 s; FLOPs ratio 1.095)."""
  out = tmp_path_factory.mktemp("plan") / "plan.json"
  p = _cli("--config=bert_jax/configs/pretrain.py:tiny,fast", "--topology=v5litepod-4",
           "--config.model.dtype=bfloat16", "--config.batch_size=16", "--price_per_chip_hour=2",
           "--config.model.vocab_size=512", f"--json={out}")
  return p, (json.loads(out.read_text()) if out.exists() else None)


def test_cli_fits_is_exit_0_and_quiet(tiny_v5e):
  p, result = tiny_v5e
  assert p.returncode == 0, p.stderr[-2000:]
  assert "verdict: FITS on v5litepod-4" in p.stdout and "at $2.00/chip-hour" in p.stdout
  assert result["fits"] and result["device_kind"] == "TPU v5 lite" and result["chips"] == 4
  # libtpu's Cloud-TPU-VM start-up errors (worker hostnames, accelerator type) are not printed.
  assert "TPU_WORKER_HOSTNAMES" not in p.stderr and "Traceback" not in p.stderr


def test_auto_attention_is_chosen_for_the_slice_not_this_host(tiny_v5e):
  assert ("attention: splash in training (auto: fastest kernel for packed rows on tpu)"
          in tiny_v5e[0].stdout), tiny_v5e[0].stdout


def test_out_of_memory_is_does_not_fit_with_exit_1(tmp_path):
  # 4,096 sequences of 512 per chip: 32 GiB of attention temporaries, v5e allows 15.75.
  out = tmp_path / "plan.json"
  # Vocab 512: the attention temporaries, not the vocabulary, run it out of memory.
  p = _cli("--config=bert_jax/configs/pretrain.py:tiny,phase2", "--topology=v5e:2x2",
           "--config.model.dtype=bfloat16", "--config.batch_size=16384",
           "--config.model.vocab_size=512", f"--json={out}")
  assert p.returncode == 1, (p.stdout[-2000:], p.stderr[-2000:])
  verdicts = [l for l in p.stdout.splitlines() if l.startswith("verdict:")]
  assert len(verdicts) == 1 and verdicts[0].startswith(
      "verdict: DOES NOT FIT on v5litepod-4: RESOURCE_EXHAUSTED: Ran out of memory"), p.stdout
  assert "exceeds available HBM (15.75G)" in verdicts[0]
  assert "Traceback" not in p.stderr
  assert json.loads(out.read_text())["fits"] is False


def _check_compiled(result, topology, ratio_bound):
  c = result["compiled"]
  # Data parallel: every chip holds all parameters (f32) and Adam's two moments of each.
  assert c["params"] == 4 * c["num_params"]
  assert 2 * c["params"] <= c["optimizer"] < 2 * c["params"] + 1024
  assert c["temporaries"] > 0 and c["code"] > 0
  assert c["total"] >= c["params"] + c["optimizer"] + c["temporaries"]
  # The gradients are summed across the 4 chips (XLA reduces some in bf16: bytes >= 1 per param).
  assert c["collectives"]["all-reduce"][0] >= 1
  assert c["collectives"]["all-reduce"][1] >= c["num_params"], c["collectives"]
  pred = result["prediction"]
  assert 1.0 <= pred["flops_ratio"] <= ratio_bound, pred["flops_ratio"]
  assert 0 < pred["mfu"] < 1 and pred["step_seconds"] > 0
  assert pred["cost_usd"] == pytest.approx(pred["chip_hours"] * pred["price_per_chip_hour"])
  assert pred["price_per_chip_hour"] == (
      2.0 if topology.startswith("v5litepod")
      else tpu_specs.parse_topology(topology).generation.price_per_chip_hour)


def test_tiny_on_v5e(tiny_v5e):
  # Tiny's non-matmul work (layer norms, softmax, GELU, Adam) is a larger share of its FLOPs than
  # BERT-base's (1.045x in issue 19's measurement): 1.2x here.
  _check_compiled(tiny_v5e[1], "v5litepod-4", 1.2)


def test_mini_on_v4():
  lines = []
  result = plan_lib.plan(config("mini"), "v4:2x2x1", log=lines.append, isolate=False)
  assert result["fits"] and result["device_kind"] == "TPU v4" and result["chips"] == 4
  _check_compiled(result, "v4:2x2x1", 1.1)
  # libtpu's settings do not outlive its loading: a leaked TPU_WORKER_HOSTNAMES made every later
  # `bert_jax.train` in this process tree take the host for a TPU pod.
  assert "TPU_WORKER_HOSTNAMES" not in os.environ and "TPU_ACCELERATOR_TYPE" not in os.environ
  assert lines[-2].startswith("verdict: FITS on v4-8 with ")
  assert any(l.startswith("memory per chip: params") for l in lines)


def test_fsdp_shards_parameters_and_optimizer_state():
  fsdp = plan_lib.plan(config(mesh_shape=(1, -1, 1), **SMALL), "v5e:2x2", log=lambda _: None,
                       isolate=False)["compiled"]
  # Data parallel holds 4 bytes (f32) per parameter on every chip and Adam's 2 x 4 more
  # (_check_compiled asserts both on real dp compiles), so these are the bounds "under 0.3 of
  # data parallel" without compiling it again. "embed" axes split over 4 chips; layer-norm scales
  # and biases stay whole (0.255 of data parallel on SMALL tiny).
  dp_params, dp_optimizer = 4 * fsdp["num_params"], 2 * 4 * fsdp["num_params"]
  assert fsdp["params"] < 0.3 * dp_params and fsdp["optimizer"] < 0.3 * dp_optimizer
  assert "all-gather" in fsdp["collectives"]


def test_train_and_plan_share_the_step_builder(monkeypatch):
  from bert_jax import train
  seen = {}

  class Built(Exception):
    pass

  def spy(cfg, model_config, mesh, **kw):
    seen["devices"] = list(mesh.devices.flat)
    raise Built

  monkeypatch.setattr(train, "build_training", spy)
  with pytest.raises(Built):
    plan_lib.plan(config(), "v5e:2x2", log=lambda _: None, isolate=False)
  assert [d.platform for d in seen["devices"]] == ["tpu"] * 4


def test_without_libtpu_is_a_one_line_error(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "libtpu" else real(name, *a))
  with pytest.raises(plan_lib.PlanError, match=r'pip install "jax\[tpu\]==0.10.2"'):
    plan_lib.plan(config(), "v5e:2x2", log=lambda _: None, isolate=False)


@pytest.mark.slow
def test_search_finds_settings_that_fit(tmp_path):
  # Budget: what a per-chip batch of 1 needs (+2%); ask for 2 per chip. Plain data parallelism
  # cannot hold it (per-chip 2 compiled 13% above per-chip 1), so the search must reach for FSDP /
  # remat / accumulation, and its pick must fit. Through the CLI, as users run it (each plan in
  # its own process), with real TPU compiles: per-chip 1 and 2 are 2 compiles a setting, at most
  # 9 in all (per-chip 4 asked for 16 was ~16 compiles, 212 s of the suite). The search's own
  # arithmetic (the line, halving, doubling, the accumulation it settles for) is checked at
  # larger batches with a model of memory: test_search_settles_for_accumulation_*, and
  # test_largest_batch_compiles_each_batch_once.
  common = ("--config=bert_jax/configs/pretrain.py:tiny", "--topology=v5e:2x2",
            "--config.model.dtype=bfloat16", *SMALL_FLAGS)
  p = _cli(*common, "--config.batch_size=4", f"--json={tmp_path}/small.json")
  assert p.returncode == 0, p.stderr[-2000:]
  budget = json.loads((tmp_path / "small.json").read_text())["compiled"]["total"] * 1.02
  p = _cli(*common, "--config.batch_size=8", "--search", f"--hbm_gib={budget / plan_lib.GiB}",
           f"--json={tmp_path}/search.json")
  assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-2000:])
  result = json.loads((tmp_path / "search.json").read_text())
  found = result["search"]["found"]
  assert result["fits"] and result["compiled"]["total"] <= budget, p.stdout
  assert found["per_chip"] * found["accum"] == 2
  assert result["search"]["largest_per_chip_batch"]["data parallel"][0] < 2
  assert "--config.grad_accum_steps=" in result["search"]["train_flags"]
  assert "flags for bert_jax.train: --config.batch_size=8" in p.stdout


class _MemoryModel:
  """plan.IsolatedCompiler's stand-in: HBM = fixed + per_row x per-chip batch, where fsdp shards
  the fixed part (parameters, optimizer state) 4 ways and remat halves the per-row part."""
  asked = []

  def __init__(self, topology):
    del topology

  def __call__(self, c):
    fsdp, per_chip = c.mesh_shape[1] == -1, c.batch_size // 4
    total = (4 if fsdp else 16) + (2 if c.model.remat else 4) * per_chip
    _MemoryModel.asked.append((fsdp, bool(c.model.remat), per_chip))
    return plan_lib.Compiled(fits=True, compile_seconds=0.0, total=total)

  def close(self):
    pass


def test_search_settles_for_accumulation_when_no_setting_holds_the_batch(monkeypatch):
  """Per-chip 16 asked, 36 of HBM: data parallel holds 4 (16 + 4 x 4 = 32), fsdp 8, remat 8 and
  fsdp + remat 16 (4 + 2 x 16 = 36): the last holds it and is taken. At 30 of HBM none does: the
  setting with the largest micro-batch (fsdp + remat, 8) with the fewest accumulation steps (2)."""
  monkeypatch.setattr(plan_lib, "IsolatedCompiler", _MemoryModel)
  c = config(batch=64)
  _MemoryModel.asked = []
  found, largest = plan_lib.search(c, "v5e:2x2", 36, log=lambda _: None)
  assert found == dict(label="fsdp + remat", mesh_shape=(1, -1, 1), remat=True, accum=1,
                       per_chip=16)
  assert {k: v[0] for k, v in largest.items()} == {
      "data parallel": 4, "fsdp": 8, "data parallel + remat": 8, "fsdp + remat": 16}
  found, largest = plan_lib.search(c, "v5e:2x2", 30, log=lambda _: None)
  assert found == dict(label="fsdp + remat", mesh_shape=(1, -1, 1), remat=True, accum=2,
                       per_chip=8)
  assert {k: v[0] for k, v in largest.items()} == {
      "data parallel": 2, "fsdp": 4, "data parallel + remat": 4, "fsdp + remat": 8}
  # A setting that holds the batch ends the search: fsdp at 64 of HBM, remat never compiled.
  _MemoryModel.asked = []
  found, _ = plan_lib.search(c, "v5e:2x2", 68, log=lambda _: None)
  assert (found["label"], found["accum"]) == ("fsdp", 1)
  assert not any(remat for _, remat, _ in _MemoryModel.asked)


def test_the_step_estimate_adds_the_splash_kernels_the_cost_model_cannot_see():
  """JAX 0.10.2's splash attention gives its pallas_call no cost estimate, so the compiled FLOPs
  and libtpu's step time leave attention out: modernbert-base at 8,192 on v5p-16 compiled 0.55x
  the analytic FLOPs and the plan said MFU 67%. The estimate now adds the attention FLOPs at the
  chip's peak (a floor) of the layers whose training kernel is splash (Compiled.kernels, from
  the same choice as the start-up line); an xla-attention program is left as it was."""
  from bert_jax.planning.plan_compile import Compiled
  c = config("modernbert-base,phase2", batch=72)
  make, _ = plan_lib.model_config_factory(c)
  mc = make(c)
  spec = tpu_specs.parse_topology("v5p:2x2x2")
  # 8 global layers of 8,192 keys, 14 local ones of 129 (window 128): 12 x T x S x H x rows.
  t, h = 8192, 768
  want = {"global": 12 * t * h * 8 * t * 72, "local": 12 * t * h * 14 * 129 * 72}
  assert plan_lib.splash_flops(c, mc) == want["global"] + want["local"]
  peak = spec.generation.peak_bf16_tflops * 1e12
  base = dict(fits=True, compile_seconds=1.0, flops=5.556e13, compiler_seconds=0.328)

  def step(kernels):
    return plan_lib.predict(c, mc, spec, Compiled(**base, kernels=kernels), 1.0)

  xla = step({"global": "xla", "local": "xla"})
  assert xla["step_seconds"] == 0.328 and "splash" not in xla["step_time_source"]
  splash = step({"global": "splash", "local": "splash"})
  assert splash["step_seconds"] == pytest.approx(0.328 + sum(want.values()) / spec.chips / peak)
  assert "splash attention kernels at peak" in splash["step_time_source"]
  assert splash["mfu"] < xla["mfu"]
  # Only the layers that run splash are added (a global kernel without a local one, or back).
  for kind in want:
    other = "local" if kind == "global" else "global"
    mixed = step({kind: "splash", other: "xla"})
    assert mixed["step_seconds"] == pytest.approx(0.328 + want[kind] / spec.chips / peak), kind
  # What the compile records: the kernels as the start-up line chose them, for the slice.
  from bert_jax.layers import attention as attention_lib
  assert attention_lib.training_backends(mc, packed=True, seq_len=t, platform_name="tpu") == {
      "global": "splash", "local": "splash"}


def test_largest_batch_compiles_each_batch_once():
  """A fake compiler whose memory jumps past the line two small compiles predict: the search
  halves from the overshoot, then the doubling loop must not compile the refused batch again
  (it did: fsdp on tiny v5e compiled per-chip batch 16 twice)."""
  asked = []

  def compile_fn(c):
    b = c.batch_size // 4
    asked.append(b)
    total = 10 + b if b <= 8 else 10 + 10 * b          # linear to 8, then far over
    return plan_lib.Compiled(fits=True, compile_seconds=0.0, total=total)

  found, predicted = plan_lib.largest_batch(config(batch=64), compile_fn, 4, hbm=30,
                                            mesh_shape=(1, -1, 1), remat=False, need=16,
                                            log=lambda _: None)
  assert (found, predicted) == (8, 20)
  assert sorted(asked) == sorted(set(asked)) == [1, 2, 8, 16], asked


def test_a_plan_compile_neither_reads_nor_writes_the_persistent_cache(tmp_path):
  """issue 32: under a shared JAX_COMPILATION_CACHE_DIR a second DistilBERT plan warned "Error
  reading persistent compilation cache entry for 'jit_train_step'" (a TPU program compiled
  without chips cannot be loaded back). Turning jax_enable_compilation_cache off around the
  compile did nothing once the process had compiled anything with the cache on (JAX decides
  once per process): here a CPU compile first, as train.build_training's eager dummy batch did."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  keys = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
          "jax_persistent_cache_min_compile_time_secs")
  was = {k: getattr(jax.config, k) for k in keys}
  cache = tmp_path / "cache"
  requests = []

  def listener(event, **_):
    if event == "/jax/compilation_cache/compile_requests_use_cache":   # a read, then a write
      requests.append(event)

  def entries():
    return len(list(cache.glob("*-cache"))) if cache.exists() else 0

  jax.monitoring.register_event_listener(listener)
  try:
    jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)   # write every program
    compilation_cache.reset_cache()
    jax.jit(lambda x: x + 1)(1.0)        # the process's first compile: it uses the cache
    assert (len(requests), entries()) == (1, 1)
    with plan_lib.without_persistent_cache():
      jax.jit(lambda x: x * 3)(2.0)
    assert (len(requests), entries()) == (1, 1)   # not looked up, not written
    jax.jit(lambda x: x - 5)(3.0)        # afterwards: the user's cache again
    assert (len(requests), entries()) == (2, 2)
  finally:
    jax.monitoring.unregister_event_listener(listener)
    for k, v in was.items():
      jax.config.update(k, v)
    compilation_cache.reset_cache()
