"""benchmarks/profile_table.py: a jax.profiler trace of a training step as a table of categories.

The time arithmetic and the classifier are checked on hand-made events and HLO (GPU custom calls
included, which this CPU box cannot trace); the whole path on a real CPU trace of BERT-tiny's
training step (slow: one compile)."""

import numpy as np
import pytest

from benchmarks import accelerator, profile_table as pt


def test_nested_and_parallel_events_add_up_to_the_span():
  line_a, line_b = ("/host:CPU", "a"), ("/host:CPU", "b")
  events = [
      (line_a, 0, 100, "while"),        # a loop ...
      (line_a, 10, 40, "body_op"),      # ... and its body: the body's 30 ns are the body's
      (line_b, 20, 60, "other_op"),     # on another thread: 20-40 and 40-60 overlap line a
      (line_a, 120, 150, "last_op"),    # 100-120: nothing runs (idle)
  ]
  per_op, busy, (start, end) = pt.attribute(events)
  assert (start, end) == (0, 150)
  # 20-40: body_op and other_op share; 40-60: while and other_op share.
  assert per_op["body_op"] == pytest.approx(10 + 20 / 2)
  assert per_op["other_op"] == pytest.approx(20 / 2 + 20 / 2)
  assert per_op["while"] == pytest.approx(10 + 20 / 2 + 40)
  assert per_op["last_op"] == pytest.approx(30)
  assert busy == pytest.approx(130) and sum(per_op.values()) == pytest.approx(busy)


HLO = """HloModule jit_train_step, entry_computation_layout={()->()}

%fused_dot (p0: bf16[8,128,2,64], p1: bf16[8,128,2,64]) -> f32[8,2,128,128] {
  %p0 = bf16[8,128,2,64]{3,2,1,0} parameter(0)
  %p1 = bf16[8,128,2,64]{3,2,1,0} parameter(1)
  ROOT %dot.1 = f32[8,2,128,128]{3,2,1,0} dot(%p0, %p1), lhs_batch_dims={0,2}, metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/attention/vmap(BTNH,BSNH->BNTS)/dot_general"}
}

%fused_ln (p0: f32[8,128,128]) -> bf16[8,128,128] {
  %p0 = f32[8,128,128]{2,1,0} parameter(0)
  %r = f32[8,128,128]{2,1,0} rsqrt(%p0), metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/output_layer_norm/rsqrt"}
  %a = f32[8,128,128]{2,1,0} add(%r, %p0), metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/add"}
  ROOT %c = bf16[8,128,128]{2,1,0} convert(%a), metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/output_layer_norm/convert_element_type"}
}

%fused_t (p0: bf16[8,128,2,64]) -> bf16[8,2,128,64] {
  %p0 = bf16[8,128,2,64]{3,2,1,0} parameter(0)
  ROOT %t = bf16[8,2,128,64]{3,2,1,0} transpose(%p0), dimensions={0,2,1,3}, metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/attention/transpose"}
}

%fused_adam (p0: f32[128], p1: f32[128]) -> f32[128] {
  %p0 = f32[128]{0} parameter(0)
  %p1 = f32[128]{0} parameter(1)
  %s = f32[128]{0} sqrt(%p1), metadata={op_name="jit(train_step)/sqrt"}
  ROOT %d = f32[128]{0} divide(%p0, %s), metadata={op_name="jit(train_step)/div"}
}

ENTRY %main.1 (x: bf16[256,1024], w: bf16[1024,4096]) -> (f32[128]) {
  %x = bf16[256,1024]{1,0} parameter(0)
  %w = bf16[1024,4096]{1,0} parameter(1)
  %custom-call.7 = (bf16[256,4096]{1,0}, s8[33554432]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/intermediate/dot_general"}
  %custom-call.9 = (bf16[8,128,2,64]{3,2,1,0}, u8[0]{0}) custom-call(%x, %x, %x), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/attention/dot_product_attention"}
  %custom-call.11 = bf16[8,128,2,64]{3,2,1,0} custom-call(%x), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/attention/pallas_call"}
  %custom-call.12 = bf16[30522,1024]{1,0} custom-call(%x, %w), custom_call_target="__cublas$gemm", metadata={op_name="jit(train_step)/transpose(jvp(BertForPreTraining))/mlm_head/BPH,VH->BPV/dot_general"}
  %fusion.1 = f32[8,2,128,128]{3,2,1,0} fusion(%x, %x), kind=kCustom, calls=%fused_dot, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %fusion.2 = bf16[8,128,128]{2,1,0} fusion(%x), kind=kLoop, calls=%fused_ln
  %fusion.3 = bf16[8,2,128,64]{3,2,1,0} fusion(%x), kind=kLoop, calls=%fused_t
  %fusion.4 = f32[128]{0} fusion(%x, %x), kind=kLoop, calls=%fused_adam
  ROOT %tuple.5 = (f32[128]{0}) tuple(%fusion.4)
}
"""


@pytest.mark.parametrize("op,category", [
    ("custom-call.7", "matmul: dense"),                  # cuBLAS(Lt) GEMM of a dense layer
    ("custom-call.9", "attention kernel"),               # cuDNN flash attention
    ("custom-call.11", "attention kernel"),              # the Pallas (Triton) kernel
    ("custom-call.12", pt.HEADS),                        # the MLM head's vocab matmul
    ("fusion.1", "matmul: attention QK/PV"),             # the xla path's scores, a Triton GEMM
    ("fusion.2", "LayerNorm"),                           # with the residual add fused in
    ("fusion.3", "copies/transposes/casts"),
    ("fusion.4", "optimizer update"),                    # outside the gradient
])
def test_gpu_style_ops_are_classified(op, category):
  comps, index = pt.parse_hlo(HLO)
  assert pt.classify(pt._contents(op, comps, index)) == category


def test_a_directory_without_a_trace_is_a_one_line_error(tmp_path):
  with pytest.raises(pt.ProfileError, match="no plugins/profile"):
    pt.profile_table(str(tmp_path))


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
  """Two traced steps of BERT-tiny's packed training step on CPU, as the benchmark takes them."""
  import jax
  from bert_jax.parallel import sharding as sharding_lib
  case = accelerator.CASES["smoke"]
  _, _, mesh, t, _ = accelerator.build(case, packed=True, backend="xla", dtype="bfloat16",
                                       remat=False, batch=8, interpret=False)
  host, _ = accelerator.make_batches(np.random.default_rng(0), count=2, rows=8, seq=128,
                                     preds=20, vocab=30522, packed=True)
  batches = [sharding_lib.make_global_batch(b, mesh) for b in host]
  out = str(tmp_path_factory.mktemp("prof") / "smoke-packed-xla")
  with jax.set_mesh(mesh):
    state = t.init_state(jax.random.PRNGKey(0))
    step = t.train_step.lower(state, batches[0]).compile()
    state, _ = step(state, batches[0])                          # not traced: first run
    _, table = accelerator.profile_steps(step, state, batches, out, steps=2)
  return out, step.as_text(), table


@pytest.mark.slow
def test_a_real_cpu_trace_is_accounted_for_and_classified(cpu_profile, capsys):
  out, hlo, table = cpu_profile
  assert table["steps"] == 2
  cats = table["categories"]
  # Every traced instant is in one category or idle: the table adds up to the step.
  assert sum(cats.values()) == pytest.approx(table["step_ms"], rel=1e-9)
  assert cats["idle"] >= 0 and table["busy_ms"] > 0.5 * table["step_ms"]
  assert not table["unknown_ops"]                       # every traced op is in the HLO
  for cat in ("matmul: dense", "LayerNorm", "optimizer update", pt.HEADS):
    assert cats[cat] > 0, cat
  # A dot of the FFN's first dense layer ([B, T, H] x [H, I]) is a matmul.
  comps, index = pt.parse_hlo(hlo)
  ffn = [name for name in index
         if any(o == "dot" and "intermediate/dot_general" in n
                for o, n, _ in pt._contents(name, comps, index))
         and index[name][1] in ("fusion", "dot")]
  assert ffn and all(pt.classify(pt._contents(n, comps, index)) == "matmul: dense" for n in ffn)
  # The command line reads the same directory back.
  pt.main([out])
  printed = capsys.readouterr().out
  assert "matmul: dense" in printed and "idle" in printed and "total" in printed


# The ENTRY of a scheduled GPU module, as `compiled.as_text()` prints it (trimmed): two layers'
# identical LayerNorm fusions (XLA compiles them once, as `loop_ln_fusion`), cuBLAS GEMMs, a
# Pallas (Triton) kernel named in its backend config, cuDNN's attention calls.
GRAPH_HLO = """HloModule jit_train_step

%ln (p0: f32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  ROOT %r = f32[8]{0} rsqrt(%p0), metadata={op_name="jit(train_step)/jvp(M)/bert/encoder/layer_0/attention_layer_norm/rsqrt"}
}

ENTRY %main.1 (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %loop_ln_fusion = f32[8]{0} fusion(%x), kind=kLoop, calls=%ln
  %custom-call.1 = (f32[8]{0}, s8[4]{0}) custom-call(%x), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/jvp(M)/bert/encoder/layer_0/intermediate/dot_general"}
  %pallas_call.2 = f32[8]{0} custom-call(%x), custom_call_target="__gpu$xla.gpu.triton", backend_config={name = "mha_forward", ir = "..."}, metadata={op_name="jit(train_step)/jvp(M)/bert/encoder/layer_0/attention/mha_forward"}
  %loop_ln_fusion.1 = f32[8]{0} fusion(%x), kind=kLoop, calls=%ln
  %custom-call.3 = (f32[8]{0}, s8[4]{0}) custom-call(%x), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/jvp(M)/bert/encoder/layer_1/intermediate/dot_general"}
  %custom-call.4 = (f32[8]{0}, s8[4]{0}) custom-call(%x), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/transpose(jvp(M))/mlm_head/BPH,VH->BPV/dot_general"}
  %dot_product_attention_bwd.5 = (f32[8]{0}, u8[0]{0}) custom-call(%x), custom_call_target="__cudnn$fmhaSoftmaxBackward", metadata={op_name="jit(train_step)/transpose(jvp(M))/bert/encoder/layer_1/attention/dot_product_attention"}
  ROOT %loop_ln_fusion.2 = f32[8]{0} fusion(%x), kind=kLoop, calls=%ln
}
"""


def test_kernels_replayed_from_a_cuda_graph_are_placed_on_the_schedule():
  """Inside a CUDA graph every kernel carries the graph's op (command_buffer_1): the kernels are
  named back in schedule order (tests what the H200 trace of 2026-11-26 needed)."""
  comps, index = pt.parse_hlo(GRAPH_HLO)
  order = pt.entry_order(GRAPH_HLO)
  assert order[3] == ("pallas_call.2", "mha_forward") and order[2] == ("custom-call.1", "")
  line = ("/device:GPU:0", "stream")
  kernels = ["loop_ln_fusion", "nvjet_sm90_tst_128x128", "mha_forward",
             "loop_ln_fusion",                       # the same kernel runs layer 1's LayerNorm
             "nvjet_sm90_tst_256x128", "cublasLt::splitKreduce_kernel",   # call 3 and its reduction
             "nvjet_sm90_tst_128x160",               # call 4, the head's
             "Memset 0",                             # a stray memset: stays unplaced
             "cudnn::fusion::compute_dot_do_o", "cudnn_generated_fort_native_sdpa_sm90_flash_bprop",
             "cudnn::fusion::convert_dq_to_16bits_ragged", "loop_ln_fusion"]
  events = [(line, 10 * i, 10 * i + 5, pt._kernel_op("command_buffer_1", k, index))
            for i, k in enumerate(kernels)]
  placed = [op for *_, op in pt.place_kernels(events, order, index)]
  assert placed == ["loop_ln_fusion", "custom-call.1", "pallas_call.2", "loop_ln_fusion.1",
                    "custom-call.3", "custom-call.3", "custom-call.4", pt.KERNEL + "Memset 0",
                    "dot_product_attention_bwd.5", "dot_product_attention_bwd.5",
                    "dot_product_attention_bwd.5", "loop_ln_fusion.2"]
  cats = {op: pt.classify(pt._contents(op, comps, index)) for op in set(placed) if op in index}
  assert cats["pallas_call.2"] == cats["dot_product_attention_bwd.5"] == "attention kernel"
  assert cats["custom-call.4"] == pt.HEADS and cats["custom-call.3"] == "matmul: dense"
  assert pt._unplaced_category("cudnn::fusion::simple_memset<float>") == "attention kernel"
  assert pt._unplaced_category("nvjet_sm90_tst_128x128") == "matmul: dense"


def test_gpu_kernels_that_overlap_by_nanoseconds_are_not_nested():
  """CUPTI's kernel timestamps overlap by a few ns (4,281 of 5,769 kernels on the H200): read
  as nesting, the second kernel was clipped to the first's end and its time went to idle."""
  line = ("/device:GPU:0", "stream")
  per_op, busy, (start, end) = pt.attribute([(line, 0, 100, "a"), (line, 99, 200, "b")])
  assert busy == end - start == 200
  assert per_op["a"] == pytest.approx(99.5) and per_op["b"] == pytest.approx(100.5)
