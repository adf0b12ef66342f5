"""How hard XLA optimises the suite's CPU programs (tests/conftest.py sets both).

The suite's programs are tiny models run for a few steps, so XLA:CPU's LLVM optimisation is most
of their cost. Measured on the 2-core box, 2026-11-26, one BERT-tiny pre-training step (vocab 512,
8 x 64 tokens, dropout, AdamW), compile CPU s / step ms, three fresh processes each:
  --xla_backend_optimization_level=3 (XLA's default): 10.4-14.3 s / 28-34 ms
                                   =1                :  8.0-8.8 s / 30-42 ms
                                   =0                :  4.5-6.3 s / 84-93 ms
So:
  * IN_PROCESS: the pytest process disables most optimisations (jax_disable_most_optimizations,
    i.e. level 0): its tests compile many programs and run each a few steps. train_test +
    model_test + electra_test, fast tier, fresh compilation cache: 595 -> 443 CPU s.
  * SUBPROCESS: a program a test starts (a CLI, a pod's hosts) gets level 1 through XLA_FLAGS:
    those run up to hundreds of steps, where level 0's slower steps cost more than its compiles
    save (e2e_pretrain_test's 250-step run: 281 CPU s at level 3, 435 at level 0, 256 at level 1).
Neither changes what a program computes: XLA:CPU does not reassociate floating point without
--xla_cpu_enable_fast_math (off), at any level; the suite's bit-for-bit resume tests run on it.
The TPU programs of plan_test compile as users' do (that file restores the defaults).
"""

IN_PROCESS_DISABLE_MOST_OPTIMIZATIONS = True
SUBPROCESS = "--xla_backend_optimization_level=1"


def with_devices(count=8):
  """XLA_FLAGS for a one-process CLI run on `count` fake CPU devices."""
  return f"--xla_force_host_platform_device_count={count} {SUBPROCESS}"
