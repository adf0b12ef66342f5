"""Phases: a schedule that changes the mixture and the masking rate between parts of one run.

  --config.phases='steps=60%,sources=en;de,tau=0.7,mask=0.3 | steps=30%,tau=0.5,mask=0.15 |
                   steps=10%,tau=0.3,mask=0.05'

Phases are separated by '|', a phase's fields by ','; a field list (sources, weights) by ';':
  steps=N | steps=P%   the phase's optimizer steps; all phases' N add up to num_train_steps (or
                       every phase a percentage, adding up to 100%: the last takes the rounding)
  sources=A;B          the sources of config.train_sources drawn in this phase (default: all);
                       the others sit out (share 0) and keep their place in their row streams
  tau=T | weights=A:W;B:W   the phase's shares (records^tau, or explicit); default: the run's
                       config.source_tau / config.source_weights over the phase's sources
  mask=M               the fraction of tokens masked (0 < M < 1; default config.masked_lm_prob)

mmBERT (arXiv 2509.06888) anneals three phases: tau 0.7 -> 0.5 -> 0.3 and 30% -> 15% -> 5%
masking, with more languages in each (60 -> 110 -> 1,833), so small languages arrive late and are
not repeated to death; the `annealed` variant of configs/pretrain.py sets its shape.

How the stream keeps pretrain_input's and mixture.py's guarantees across phases: phase k's rows
of logical shard j are drawn from (seed, j, k) and counted from the phase's first row (a function
of the seed, the shard and the row only: the same for every host count); each source's row
stream runs through the whole run (a phase continues it where the phase before left it, counted
from the draws, no data read), masked at the phase's rate as it is read (records are unmasked:
dynamic masking, a row's mask a function of its index). Resuming inside phase k counts the draws
of phases < k and of phase k's rows so far, so a resumed run reads exactly the rows an
uninterrupted one would. This module is pure Python (no TF): parsing, checks, shares, the text.
"""

import dataclasses
import math

from data_pipelines.input import mixture

FIELDS = ("steps", "sources", "tau", "weights", "mask")


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase as the user wrote it (None: the run's value)."""
  steps: str                    # "600" or "60%"
  sources: tuple = None         # names, or None: every source
  tau: float = None
  weights: dict = None
  mask: float = None


@dataclasses.dataclass(frozen=True)
class Planned:
  """A phase resolved against the run: steps, each run source's share (0: sits out), mask."""
  index: int
  first_step: int               # the phase trains steps first_step + 1 .. end_step
  end_step: int
  shares: tuple                 # [run sources], summing to 1
  mask: float
  sampling: str                 # "records^0.7" | "weights"


def _fail(text):
  raise mixture.MixtureError(f"config.phases: {text}")


def parse(spec):
  """'F=V,F=V | F=V,...' -> [Phase] (one-line errors naming the phase and the field)."""
  phases = []
  for n, part in enumerate((p.strip() for p in spec.split("|")), 1):
    if not part:
      _fail(f"phase {n} is empty; expected 'steps=N,...' between the '|'s.")
    fields = {}
    for item in (x.strip() for x in part.split(",") if x.strip()):
      key, eq, value = item.partition("=")
      key, value = key.strip(), value.strip()
      if not eq or key not in FIELDS or not value:
        _fail(f"phase {n}: {item!r} is not one of {', '.join(f + '=...' for f in FIELDS)}.")
      if key in fields:
        _fail(f"phase {n} gives {key}= twice.")
      fields[key] = value
    if "steps" not in fields:
      _fail(f"phase {n} ({part!r}) has no steps=N (or steps=P%).")
    phases.append(Phase(steps=fields["steps"],
                        sources=(tuple(s.strip() for s in fields["sources"].split(";")
                                       if s.strip()) if "sources" in fields else None),
                        tau=_number(n, "tau", fields.get("tau")),
                        weights=_weights(n, fields.get("weights")),
                        mask=_number(n, "mask", fields.get("mask"))))
  return phases


def _number(n, key, value):
  if value is None:
    return None
  try:
    x = float(value)
  except ValueError:
    x = math.nan
  if not math.isfinite(x):
    _fail(f"phase {n}: {key}={value!r} is not a number.")
  return x


def _weights(n, value):
  if value is None:
    return None
  out = {}
  for item in (x.strip() for x in value.split(";") if x.strip()):
    name, sep, w = item.replace("=", ":").partition(":")
    if name.strip() in out:   # the last weight won silently (issue 49 item 7)
      _fail(f"phase {n}: weights= names {name.strip()} twice; give each source one weight.")
    out[name.strip()] = _number(n, f"weights {name.strip()}", w if sep else "")
  return out


def step_counts(phases, num_train_steps):
  """[steps of each phase]: integers adding up to num_train_steps, or percentages to 100."""
  pct = [p.steps.endswith("%") for p in phases]
  if any(pct) and not all(pct):
    _fail("give every phase's steps as a count or every one as a percentage, not both.")
  values = [_number(i, "steps", p.steps.rstrip("%")) for i, p in enumerate(phases, 1)]
  for i, v in enumerate(values, 1):
    if v <= 0 or (not pct[0] and v != int(v)):
      _fail(f"phase {i}: steps={phases[i - 1].steps}: expected a positive "
            f"{'percentage' if pct[0] else 'integer'}.")
  if pct[0]:
    if abs(sum(values) - 100) > 1e-6:
      _fail(f"the phases' steps add up to {sum(values):g}%, not 100%.")
    # Rounded down, the last phase takes the rest: 60/30/10% of 1,000 = 600, 300, 100.
    counts = [int(num_train_steps * v / 100 + 1e-9) for v in values[:-1]]
    counts.append(num_train_steps - sum(counts))
    if min(counts) < 1:
      _fail(f"a phase of {min(values):g}% of {num_train_steps} steps has no step; give fewer "
            "phases or more steps.")
    return counts
  counts = [int(v) for v in values]
  if sum(counts) != num_train_steps:
    _fail(f"the phases' steps add up to {sum(counts):,} ({' + '.join(map(str, counts))}) but "
          f"config.num_train_steps={num_train_steps:,}; make them equal (or give the steps as "
          "percentages: steps=60%).")
  return counts


def plan(config, sources):
  """[Planned] of config.phases over the run's sources (mixture.Source with records), every
  check before compute; None without config.phases."""
  spec = config.get("phases", "")
  if not spec:
    return None
  phases = parse(spec)
  names = [s.name for s in sources]
  records = {s.name: s.records for s in sources}
  counts = step_counts(phases, int(config.num_train_steps))
  run_weights = (mixture.parse_weights(config.source_weights, names)
                 if config.get("source_weights") else None)
  out, first = [], 0
  for i, (p, steps) in enumerate(zip(phases, counts), 1):
    chosen = list(p.sources) if p.sources is not None else names
    unknown = [n for n in chosen + list(p.weights or ()) if n not in names]
    if unknown:
      _fail(f"phase {i} names {unknown[0]!r}, which is not a source of config.train_sources "
            f"({', '.join(names)}).")
    if not chosen:
      _fail(f"phase {i}: sources= names no source.")
    if p.tau is not None and p.weights is not None:
      _fail(f"phase {i} gives both tau= and weights=; give one.")
    if p.tau is not None and not 0 < p.tau <= 1:
      _fail(f"phase {i}: tau={p.tau:g}: expected 0 < tau <= 1 (shares ~ records^tau).")
    mask = float(config.masked_lm_prob) if p.mask is None else p.mask
    if not 0 < mask < 1:
      _fail(f"phase {i}: mask={mask:g}: expected a fraction of the tokens between 0 and 1 "
            "(mmBERT: 0.3, 0.15, 0.05).")
    if p.weights is not None:
      weights = {n: p.weights.get(n, 0.0) for n in chosen}
      if any(n not in p.weights for n in chosen) and p.sources is not None:
        _fail(f"phase {i}: weights= gives no weight for "
              f"{', '.join(n for n in chosen if n not in p.weights)}; name every source of the "
              "phase.")
      sampling = "weights"
    elif p.tau is None and run_weights:
      weights, sampling = {n: run_weights[n] for n in chosen}, "weights"
    else:
      weights, sampling = None, f"records^{p.tau if p.tau is not None else config.source_tau:g}"
    if weights is not None and (min(weights.values()) < 0 or not any(weights.values())):
      _fail(f"phase {i}: weights {weights} must be >= 0 and not all 0.")
    tau = p.tau if p.tau is not None else float(config.get("source_tau", 1.0))
    empty = [n for n in chosen if records[n] == 0 and (weights is None or weights[n] > 0)]
    if empty:
      _fail(f"phase {i} draws source {empty[0]}, which holds no records.")
    share = mixture.shares({n: records[n] for n in chosen}, weights, tau)
    out.append(Planned(i - 1, first, first + steps, tuple(share.get(n, 0.0) for n in names),
                       mask, sampling))
    first += steps
  return out


def check_predictions(planned, seq_length, max_predictions_per_seq):
  """A phase whose rate asks for more predictions than a row holds would be capped silently."""
  for p in planned:
    want = round(p.mask * seq_length)
    if want > max_predictions_per_seq:
      _fail(f"phase {p.index + 1} masks {100 * p.mask:g}% of {seq_length} tokens = {want} "
            f"predictions a row, but config.max_predictions_per_seq={max_predictions_per_seq} "
            f"would cap it; pass --config.max_predictions_per_seq={want + 1}.")


def max_mask(config):
  """The largest masking rate of the run (its packed rows' prediction slots are sized for it);
  config.masked_lm_prob without phases. Parses only (plan() checks)."""
  default = float(config.masked_lm_prob)
  if not config.get("phases"):
    return default
  return max(default if p.mask is None else p.mask for p in parse(config.phases))


def layout_entry(planned):
  """What the checkpoint stores of the phases (resuming with other ones is refused)."""
  return [dict(steps=[p.first_step, p.end_step], shares=[round(s, 9) for s in p.shares],
               mask=round(p.mask, 9), sampling=p.sampling) for p in planned]


def describe(entry, names):
  """One phase of a layout entry as text: 'steps 1-600: ko 0.600, en 0.400 (records^0.7), mask
  30%' (sources sitting out left out)."""
  first, end = entry["steps"]
  shares = ", ".join(f"{n} {s:.3f}" for n, s in zip(names, entry["shares"]) if s > 0)
  return (f"steps {first + 1}-{end}: {shares} ({entry['sampling']}), mask "
          f"{100 * entry['mask']:g}%")


def startup_lines(planned, sources):
  """Start-up: each phase's steps, planned shares (percent of rows) and masking rate."""
  sizes = ", ".join(f"{s.name} ({s.records:,} records, {len(s.files)} file(s))" for s in sources)
  lines = [f"mixture in {len(planned)} phases: {sizes}; the shares and the masking rate change at "
           "the phases' steps (a source sitting out keeps its place; one that runs out repeats)"]
  for p in planned:
    parts = ", ".join(f"{s.name} {100 * x:.1f}%" for s, x in zip(sources, p.shares) if x > 0)
    lines.append(f"  phase {p.index + 1}: steps {p.first_step + 1}-{p.end_step} "
                 f"({p.end_step - p.first_step:,}): {parts} ({p.sampling}); mask "
                 f"{100 * p.mask:g}%")
  return lines
