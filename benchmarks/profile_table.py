r"""Where a training step's time goes: a jax.profiler trace as a table of categories.

  python -m benchmarks.profile_table /tmp/prof/large512-packed-pallas_gpu   # a profiled run's dir

`benchmarks.accelerator --profile_dir=DIR` traces a few steps per run into DIR/<run>/ and prints
this table after each run; the module also reads such a directory later. It needs two files the
benchmark writes there: the trace (`plugins/profile/<time>/<host>.xplane.pb`, JAX's profiler
output, read with jax's own reader `jax.profiler.ProfileData`) and the compiled step's HLO
(`<module>.hlo.txt`, `compiled.as_text()`), which says what each traced op is.

How the table is made, so a reader can check it:
  1. Events: every trace event that names an HLO op of the step's module (its `hlo_op` and
     `hlo_module` stats), on the first device: on a GPU the kernels on the `/device:GPU:0` plane
     (CUPTI attaches the launching op's annotation to each kernel); on CPU, where no device
     plane exists, the thunks of device 0 on the `/host:CPU` worker threads. Kernels on the
     device plane without an HLO op (a stray memset, a library's own kernel) count as `other`.
     XLA on a GPU replays most of the step as CUDA graphs (command buffers): every kernel in a
     graph carries the graph's `hlo_op` (`command_buffer_1`), not its own. There a kernel is named
     by its own name where that is an HLO instruction (XLA's fusions: `loop_add_fusion_21` is
     `loop_add_fusion.21`); the rest (cuBLAS's `nvjet_*`/`cutlass*` GEMMs, Pallas/Triton kernels,
     named by their library) are placed by order: kernels run in the schedule's order, so the
     unnamed kernels between two named ones are the custom calls the schedule has between those
     two fusions, dealt out in order (a GEMM's split-K reduction shares its GEMM's call). Seen on
     an H200 with jax 0.11.2, 2026-11-26: 5,769 kernels of 3 steps, every one placed this way.
  2. Categories: each op is looked up in the HLO (a fusion by everything it contains) and put in
     the first category that fits, in this order: a fused attention custom call (cuDNN, Pallas,
     splash) -> `attention kernel`; a dot/convolution/GEMM call in the MLM head -> `MLM head +
     losses`, in attention's QK^T/PV einsums -> `matmul: attention QK/PV`, else `matmul: dense`;
     nothing but moves (copy, transpose, convert, slice, concatenate...) -> `copies/transposes/
     casts`; then by the source path JAX writes in each op's metadata (`op_name`): the
     optimizer's update (outside the gradient: no `jvp(`/`transpose(` in the path), the MLM/NSP
     heads and the loss, dropout's random bits, LayerNorm (with whatever residual add or
     dropout mask XLA fused into it), softmax, GELU, dropout masks, bias and residual adds,
     embedding gathers/scatters, and `other`.
  3. Time: the step is the span from the first traced op to the last, over the steps traced
     (the op that ran fewest times gives the step count). A nested event (a loop and its body, on
     CPU) gives its time to the innermost op; ops running at once on several threads or streams
     share each instant equally. So the categories plus `idle` (no op running) add up to the
     span exactly; the test checks it.
"""

import collections
import glob
import itertools
import os
import re
import sys

from bert_jax_core import errors

STEP_MODULE = "jit_train_step"

HEADS = "MLM/NSP heads, loss"       # the heads' matmuls included; metrics too
CATEGORIES = (
    "matmul: dense", "matmul: attention QK/PV", "attention kernel", "softmax", "LayerNorm",
    "GELU", "dropout: random bits", "dropout: masks", "bias/residual adds", HEADS,
    "embeddings", "optimizer update", "copies/transposes/casts", "other", "idle")

# Opcodes that only move or re-type data.
MOVES = frozenset((
    "copy", "copy-start", "copy-done", "transpose", "convert", "bitcast", "bitcast-convert",
    "reshape", "broadcast", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad",
    "parameter", "constant", "tuple", "get-tuple-element", "iota", "reverse"))
STRUCTURAL = frozenset(("parameter", "constant", "tuple", "get-tuple-element"))
# The model's only custom kernels are attention's: cuDNN flash attention (`__cudnn$fmha...`),
# Pallas on GPU (`__gpu$xla.gpu.triton`, or `triton_kernel_call_ffi`; Mosaic GPU), splash on TPU
# (`tpu_custom_call`). XLA's own Triton GEMMs are fusions, not custom calls.
ATTENTION_CALL = re.compile(r"fmha|flash|mha|triton|mosaic|tpu_custom_call", re.I)
GEMM_CALL = re.compile(r"gemm|matmul|cublas", re.I)

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMP = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?\s*->.*\{\s*$")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations)="
                    r"(\{[^}]*\}|%?[\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FUSION_KIND = re.compile(r'"kind"\s*:\s*"([^"]+)"')


class ProfileError(errors.UserError):
  pass


# ----------------------------------------------------------------------------------------------
# The HLO: what each op is.
# ----------------------------------------------------------------------------------------------
def _opcode(rest):
  """`f32[8,128]{1,0} fusion(%a), kind=...` -> ('fusion', attributes). The type may be a tuple
  `(s32[], u32[8]{0})` with spaces inside, so skip it by matching brackets."""
  i, depth = 0, 0
  if rest.startswith("("):
    for i, ch in enumerate(rest):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        break
    i += 1
  m = re.compile(r"\s*\S*?\s*([a-z][\w\-]*)\(").match(rest, i)
  return (m.group(1) if m else "?"), rest


def parse_hlo(text):
  """{computation: [(name, opcode, op_name, callees, custom-call target or fusion kind)]}, and
  {instruction name: that tuple}. Reads the text `compiled.as_text()` prints."""
  comps, index, current = {}, {}, None
  for line in text.splitlines():
    m = _COMP.match(line)
    if m and not line.startswith(" "):
      current = m.group(1)
      comps[current] = []
      continue
    if current is None or line.strip() == "}":
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    name, rest = m.groups()
    opcode, attrs = _opcode(rest)
    callees = []
    for group in _CALLS.findall(attrs):
      callees += [c.strip(" {}%") for c in group.split(",") if c.strip(" {}")]
    target = _TARGET.search(attrs) or _FUSION_KIND.search(attrs)
    op_name = _OP_NAME.search(attrs)
    inst = (name, opcode, op_name.group(1) if op_name else "", callees,
            target.group(1) if target else "")
    comps[current].append(inst)
    index[name] = inst
  return comps, index


def entry_order(text):
  """[(instruction, kernel name or "")] of the ENTRY computation in the schedule's order
  (`compiled.as_text()` of a scheduled module lists them in the order they run); the kernel name
  is a Triton custom call's own (`name = "mha_forward"` in its backend config: Pallas on GPU)."""
  m = re.search(r"^ENTRY\s", text, re.M)
  if not m:
    return []
  out = []
  for line in text[m.start():].splitlines()[1:]:
    inst = _INSTR.match(line)
    if inst:
      kernel = re.search(r'\bname = "([^"]+)"', inst.group(2))
      out.append((inst.group(1), kernel.group(1) if kernel else ""))
  return out


def _contents(name, comps, index):
  """Every (opcode, op_name, target) an instruction runs: itself and, for a fusion or call, the
  computations it calls, recursively (a while loop's body is traced as its own events, so a
  `while` contributes itself only)."""
  if name not in index:
    return []
  out, stack, seen = [], [index[name]], set()
  while stack:
    inst = stack.pop()
    _, opcode, op_name, callees, target = inst
    out.append((opcode, op_name, target))
    if opcode in ("while", "conditional"):
      continue
    for c in callees:
      if c not in seen and c in comps:
        seen.add(c)
        stack.extend(comps[c])
  return out


def _path(op_name):
  return op_name.split("/", 1)[1] if op_name.startswith("jit(") else op_name


def classify(contents):
  """The category of one op from its contents [(opcode, op_name, target)] (see the docstring)."""
  work = [(o, _path(n), t) for o, n, t in contents if o not in STRUCTURAL]
  if not work:
    return "other"
  names = [n for _, n, _ in work]
  text = "\n".join(names)
  in_mlm = any(k in text for k in ("mlm_head", "lm_head", "predictions"))
  for o, n, t in work:
    if o == "custom-call" and ATTENTION_CALL.search(t) and not GEMM_CALL.search(t):
      return "attention kernel"
  if any(o in ("dot", "convolution") or (o == "custom-call" and GEMM_CALL.search(t))
         for o, _, t in work):
    if in_mlm:
      return HEADS
    dots = [n for o, n, _ in work if o in ("dot", "convolution", "custom-call")]
    # The xla path's scores `BTNH,BSNH->BNTS` and weighted sum `BNTS,BSNH->BTNH` (a vmap inside
    # the attention module); the Q/K/V/output projections are `BTH,HND->BTND` and kin.
    if any("BNTS" in n or "attention/vmap(" in n for n in dots):
      return "matmul: attention QK/PV"
    return "matmul: dense"
  if all(o in MOVES or o in ("fusion", "call") for o, _, _ in work):
    return "copies/transposes/casts"
  if not any(n.startswith(("jvp(", "transpose(")) for n in names):
    # Outside the gradient: the optimizer (Adam moments, clipping's norm, the update), or the
    # step's metrics (MLM accuracy: argmax and compares on the logits).
    if re.search(r"argmax|(^|/)eq$", text, re.M) and not re.search(
        r"(^|/)(sqrt|rsqrt|pow|integer_pow)$", text, re.M):
      return HEADS
    return "optimizer update"
  if in_mlm or "nsp_head" in text or any(n.startswith(("jvp()", "transpose(jvp())"))
                                         for n in names):
    return HEADS                       # jvp() with no module: the loss function around the model
  if re.search(r"bernoulli|threefry|random_bits|_uniform|rng", text):
    return "dropout: random bits"
  if re.search(r"layer_?norm|LayerNorm", text):
    return "LayerNorm"
  if "attention/vmap()" in text or "softmax" in text:
    return "softmax"
  # GELU: erf/tanh by name, or the element-wise maths a layer does outside its submodules (the
  # residual add aside: jax lowers the erf GELU to exp/mul/neg at `layer_N/`).
  if "pooler" not in text and (
      re.search(r"/(erf|erfc|gelu|tanh)$|gelu", text, re.M) or any(
          re.search(r"layer_\d+/(exp|mul|neg|square|erf|erfc|tanh|integer_pow|sub|div)$", n)
          for n in names)):
    return "GELU"
  if re.search(r"[Dd]ropout", text):
    return "dropout: masks"
  if any(o in ("gather", "scatter") for o, _, _ in work) or "embeddings" in text:
    return "embeddings"
  # Bias adds, residual adds, and the bias gradients (column sums of the output gradient).
  if all(re.search(r"(^|/)(add|add_any|reduce_sum|convert_element_type)$", n) for n in names if n):
    return "bias/residual adds"
  return "other"


def where(contents):
  """The source path most of an op's instructions come from, primitive dropped:
  `transpose(jvp(BertForPreTraining))/bert/encoder/layer_3/intermediate` (for the table)."""
  paths = collections.Counter(_path(n).rsplit("/", 1)[0] for o, n, _ in contents
                              if n and o not in STRUCTURAL)
  return paths.most_common(1)[0][0] if paths else ""


# ----------------------------------------------------------------------------------------------
# The trace: events, and their time.
# ----------------------------------------------------------------------------------------------
def find_files(profile_dir):
  """(xplane.pb, hlo.txt) of a profiled run's directory; one line naming the missing one."""
  planes = sorted(glob.glob(os.path.join(profile_dir, "plugins", "profile", "*", "*.xplane.pb")))
  if not planes:
    raise ProfileError(f"{profile_dir}: no plugins/profile/*/*.xplane.pb; give the directory a "
                       "profiled run wrote (benchmarks.accelerator --profile_dir=DIR writes "
                       "DIR/<case>-<packing>-<backend>/)")
  hlos = sorted(glob.glob(os.path.join(profile_dir, "*.hlo.txt")))
  if not hlos:
    raise ProfileError(f"{profile_dir}: no <module>.hlo.txt beside the trace; the benchmark "
                       "writes the compiled step's HLO there (compiled.as_text())")
  return planes[-1], hlos[0]


# A GPU kernel that no HLO op names (inside a CUDA graph): `KERNEL + its name` until placed.
KERNEL = "kernel:"
_LIBRARY_GEMM = re.compile(r"nvjet|gemm|cutlass|cublas|xmma|sm\d+_", re.I)
_CUDNN = re.compile(r"cudnn", re.I)     # cuDNN's kernels: here only its flash attention's


def _kernel_op(op, name, index):
  """The HLO op of a GPU kernel: its `hlo_op` if the HLO has it, else KERNEL + its own name (a
  kernel replayed from a CUDA graph, placed later by place_kernels)."""
  return op if index is None or op in index else KERNEL + name


def _stem(name):
  """`loop_add_fusion.21` -> `loop_add_fusion`: XLA names a fusion after what it fuses, and
  compiles identical fusions once, under the first one's name (`loop_add_fusion_21` may run for
  `loop_add_fusion.57`)."""
  return re.sub(r"\.\d+$", "", name)


def place_kernels(events, order, index):
  """Names the KERNEL events by the schedule (see the module's docstring, step 1). Kernels run
  in the schedule's order, so per line, in time order, each kernel takes the next instruction of
  `order` (entry_order's) from where the last one was placed that it can be: a fusion kernel
  (`loop_add_fusion_21`) the next fusion of the same stem, a Triton kernel the next custom call
  of that kernel name, a cuBLAS kernel (`nvjet_*`, `cutlass*`) the next GEMM call; a second
  kernel of one instruction (a split-K reduction) stays with it. Memsets and copies stay
  unplaced (`other`)."""
  pos = {name: j for j, (name, _) in enumerate(order)}
  out = list(events)
  by_line = collections.defaultdict(list)
  for i, (key, start, *_rest) in enumerate(events):
    by_line[key].append((start, i))

  def fits(j, kernel):
    name, triton = order[j]
    inst = index.get(name)
    if inst is None:
      return False
    if inst[1] == "custom-call":
      if triton:
        return triton == kernel
      if _CUDNN.search(kernel):
        return bool(ATTENTION_CALL.search(inst[4]))
      return bool(_LIBRARY_GEMM.search(kernel)) and bool(GEMM_CALL.search(inst[4]))
    guess = re.sub(r"_(\d+)$", r".\1", kernel)
    return inst[1] == "fusion" and _stem(name) in (_stem(guess), kernel)

  for idxs in by_line.values():
    idxs.sort()
    p, last = 0, None          # where the search goes on; the schedule position last placed
    for _, i in idxs:
      op = events[i][3]
      if op in pos:
        p = last = pos[op]
        p += 1
        continue
      if op is None or not op.startswith(KERNEL):
        continue
      kernel = op[len(KERNEL):]
      # A call's later kernels: cuBLAS's split-K reduction; cuDNN's flash kernel and the
      # bookkeeping after it (a backward call runs dot(dO, O), the flash kernel, dQ's cast).
      if last is not None and fits(last, kernel) and (
          _CUDNN.search(kernel) or "reduce" in kernel.lower()):
        out[i] = (*events[i][:3], order[last][0])
        continue
      j = next((j for j in itertools.chain(range(p, len(order)), range(0, p))
                if fits(j, kernel)), None)
      if j is not None:
        out[i] = (*events[i][:3], order[j][0])
        p, last = j + 1, j
  return out


def trace_events(xplane_path, module=STEP_MODULE, index=None):
  """[(line key, start ns, end ns, hlo op or None)] of the step's ops on its first device: the
  first device plane that has any (`/device:GPU:0`), else the host's thunks of device ordinal 0
  (CPU; with several CPU devices each runs its own copy of every op on the same threads). With
  the HLO's `index`, a GPU kernel whose `hlo_op` the HLO lacks (a CUDA graph's) is named by
  `_kernel_op`."""
  from jax.profiler import ProfileData  # pylint: disable=g-import-not-at-top
  data = ProfileData.from_file(xplane_path)
  device_planes, host = {}, collections.defaultdict(list)
  for plane in data.planes:
    is_device = plane.name.startswith("/device:")
    if not (is_device or plane.name == "/host:CPU"):
      continue
    for line in plane.lines:
      xla_ops_line = line.name == "XLA Ops"    # TPU: the op is the event's name
      for e in line.events:
        stats = dict(e.stats)
        op = stats.get("hlo_op") or (e.name if xla_ops_line else None)
        if op is not None and stats.get("hlo_module", module) != module:
          continue
        if (op is None and not is_device) or e.duration_ns <= 0:
          continue                            # host bookkeeping (python, dispatch): not the step
        if is_device and op is not None:
          op = _kernel_op(op, e.name, index)
        event = ((plane.name, line.name), e.start_ns, e.start_ns + e.duration_ns, op)
        if is_device:
          device_planes.setdefault(plane.name, []).append(event)
        else:
          host[stats.get("device_ordinal", 0)].append(event)
  with_ops = [name for name in sorted(device_planes) if any(ev[3] for ev in device_planes[name])]
  if device_planes and not with_ops:
    # The host's thunks would time kernel launches, not kernels: refuse rather than mislead.
    raise ProfileError(f"{xplane_path}: the device planes {sorted(device_planes)} hold kernels but "
                       "none names its HLO op (hlo_op); kernels replayed from CUDA graphs carry "
                       "none: rerun with XLA_FLAGS=--xla_gpu_enable_command_buffer= to trace them")
  events = device_planes[with_ops[0]] if with_ops else host[min(host)] if host else []
  if not any(op for *_, op in events):
    raise ProfileError(f"{xplane_path}: no event of HLO module {module!r} in the trace (was the "
                       "step run while the profiler was on?)")
  return events


def _innermost(events):
  """Per line, nested events -> non-overlapping segments, each owned by the innermost event
  open at that time (a CPU `while` gives way to its body's ops)."""
  by_line = collections.defaultdict(list)
  segments = []
  for key, s, e, op in events:
    if key[0].startswith("/device:"):
      # A GPU stream's kernels do not nest; consecutive ones overlap by a few ns in CUPTI's
      # timestamps (4,281 of 5,769 kernels on an H200), which nesting would read as a child
      # clipped to its parent: each kernel is its own segment, and `attribute` shares overlaps.
      segments.append((key, s, e, op))
    else:
      by_line[key].append((s, -e, op))
  for key, evs in by_line.items():
    evs.sort()
    stack = []                                   # [(end, op)] of open events, innermost last
    cursor = None
    for s, neg_e, op in evs:
      e = -neg_e
      while stack and stack[-1][0] <= s:         # close what ended before s
        end, top = stack.pop()
        if cursor < end:
          segments.append((key, cursor, end, top))
          cursor = end
      if stack and cursor < s:
        segments.append((key, cursor, s, stack[-1][1]))
      cursor = s
      stack.append((min(e, stack[-1][0]) if stack else e, op))
    while stack:
      end, top = stack.pop()
      if cursor < end:
        segments.append((key, cursor, end, top))
        cursor = end
  return segments


def attribute(events):
  """{op (or None): ns}, busy ns, span (start, end): each instant of the span is split equally
  among the segments running then; instants with none are idle."""
  segments = _innermost(events)
  points = []
  for i, (_, s, e, _) in enumerate(segments):
    points += [(s, 1, i), (e, -1, i)]
  points.sort()
  active, per_op, busy, last = set(), collections.Counter(), 0.0, None
  for t, kind, i in points:
    if active and last is not None and t > last:
      share = (t - last) / len(active)
      for j in active:
        per_op[segments[j][3]] += share
      busy += t - last
    last = t
    (active.add if kind == 1 else active.discard)(i)
  start = min(s for _, s, _, _ in segments)
  end = max(e for _, _, e, _ in segments)
  return per_op, busy, (start, end)


def profile_table(profile_dir, *, module=STEP_MODULE, top=12):
  """The table's data: {category: ms per step}, steps traced, ms per step (first op to last),
  busy ms per step, and the `top` ops [(op, category, ms per step, source path)]."""
  xplane, hlo_path = find_files(profile_dir)
  with open(hlo_path) as f:
    text = f.read()
  comps, index = parse_hlo(text)
  events = place_kernels(trace_events(xplane, module, index), entry_order(text), index)
  # Steps: from the ops the HLO names (a library kernel left unplaced may run twice per call).
  counts = collections.Counter(op for *_, op in events if op and not op.startswith(KERNEL))
  counts = counts or collections.Counter(op for *_, op in events if op)
  # Each top-level op runs once per step; ops inside loops run more often.
  steps = min(counts.values())
  # Kernels with no HLO op count only inside the step's span (the batch's copy-in before it, say,
  # is not the step).
  lo = min(s for _, s, _, op in events if op)
  hi = max(e for _, _, e, op in events if op)
  events = [(k, max(s, lo), min(e, hi), op) for k, s, e, op in events
            if op or (s < hi and e > lo)]
  per_op, busy, (start, end) = attribute(events)
  span = end - start
  cats = collections.Counter()
  ops = []
  cache = {}                                     # op -> (category, where)
  for op, ns in per_op.items():
    if op not in cache:
      contents = _contents(op, comps, index)
      cache[op] = ((classify(contents), where(contents)) if contents else
                   (_unplaced_category(op[len(KERNEL):]), "(unplaced kernel)")
                   if op and op.startswith(KERNEL) else ("other", ""))
    cat, src = cache[op]
    cats[cat] += ns
    ops.append((op or "(kernel with no HLO op)", cat, ns / steps / 1e6, src))
  cats["idle"] += span - busy
  ops.sort(key=lambda r: -r[2])
  unknown = sorted(op for op in cache if op and op not in index)
  return dict(categories={c: cats[c] / steps / 1e6 for c in CATEGORIES},
              steps=steps, step_ms=span / steps / 1e6, busy_ms=busy / steps / 1e6,
              unknown_ops=unknown, top=ops[:top])


def _unplaced_category(kernel):
  """A GPU kernel the schedule could not place, by its library's name."""
  if _CUDNN.search(kernel) or (ATTENTION_CALL.search(kernel) and
                               not _LIBRARY_GEMM.search(kernel)):
    return "attention kernel"
  return "matmul: dense" if _LIBRARY_GEMM.search(kernel) else "other"


def format_table(t, title=""):
  step = t["step_ms"]
  lines = [f"profile{': ' + title if title else ''} ({t['steps']} step(s) traced, "
           f"{step:.2f} ms/step from first to last op)",
           f"  {'category':26s} {'ms/step':>9s} {'share':>7s}"]
  for cat, ms in t["categories"].items():
    if ms > 0 or cat == "idle":
      lines.append(f"  {cat:26s} {ms:9.3f} {ms / step:7.1%}")
  lines.append(f"  {'total':26s} {sum(t['categories'].values()):9.3f} "
               f"{sum(t['categories'].values()) / step:7.1%}")
  lines.append("  largest ops:")
  for op, cat, ms, src in t["top"]:
    lines.append(f"    {ms:9.3f} ms  {cat:26s} {op:32s} {src}")
  if t["unknown_ops"]:
    lines.append(f"  ops missing from the HLO (counted as other): {len(t['unknown_ops'])}, e.g. "
                 f"{t['unknown_ops'][:3]}")
  return "\n".join(lines)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) != 1 or argv[0].startswith("-"):
    raise ProfileError("usage: python -m benchmarks.profile_table PROFILED_RUN_DIR")
  print(format_table(profile_table(argv[0]), title=argv[0]))


if __name__ == "__main__":
  errors.run_main(main, None)
