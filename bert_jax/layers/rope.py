"""Rotary position embeddings (RoPE, Su et al. 2021) as ModernBERT and NeoBERT apply them.

  q, k = apply_rope(q, k, position_ids, theta=160_000.0)     # q/k [B, T, N, D], ids [B, T]

Each pair of channels (c, c + D/2) of a query or key at position p turns by the angle
p x theta^(-2c / D), c = 0 .. D/2 - 1 (the "rotate_half" convention of GPT-NeoX, transformers'
Llama and ModernBERT), so the score q_i . k_j depends on the positions only through i - j.
Nothing here is learned. NeoBERT's apply_rotary_emb (Meta's Llama: view_as_complex) turns
adjacent pairs (2c, 2c + 1) instead: the same scores once q's and k's channels are reordered
0, 2, 4, .., 1, 3, .. within each head, which its weight map does (tests/bert_jax/families/modernbert/neobert_test.py).

ModernBERT: theta 160,000 on global layers and 10,000 on local (sliding-window) ones
(transformers' ModernBertConfig.default_theta); its context extension to 8,192 tokens raises the
global theta (the config field, not this module). NeoBERT: theta 10,000 on every layer.

Positions: a packed row passes its per-instance `position_ids` (0, 1, 2, 0, 1, ...: each
instance starts at 0, as if it were alone in its row, which is what ModernBERT's unpadded
batches compute); an unpacked row can pass None for 0 .. T-1. Padding positions get some angle
and are never read.

Precision: angles and the rotation in float32 whatever the compute dtype, then cast back to
q/k's dtype (transformers rotates q.float() too, but rounds cos/sin to the compute dtype first:
in bfloat16 ours is the more exact of the two). At position 8,191 the fastest channel's angle
is 8,191 rad; float32 keeps it to ~5e-4 rad (both sides compute the same float32 product).
"""

import jax.numpy as jnp

from bert_jax_core import errors


class RopeError(errors.UserError):
  """A theta or head size RoPE cannot use."""


def check_theta(theta, what="rope_theta"):
  if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
    raise RopeError(f"{what}={theta!r}: must be a number > 1 (ModernBERT: 160000 on global "
                    "layers, 10000 on local ones; NeoBERT: 10000).")


def inverse_frequencies(head_dim, theta):
  """theta^(-2c / D) for c = 0 .. D/2 - 1: [D/2] float32 (transformers'
  compute_default_rope_parameters: 1 / base^(arange(0, D, 2) / D))."""
  check_theta(theta)
  if head_dim % 2:
    raise RopeError(f"head_dim={head_dim}: RoPE turns pairs of channels, so it must be even.")
  return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def cos_sin(position_ids, head_dim, theta):
  """cos and sin of the angles, [B, T, D] float32 each (the D/2 angles repeated twice, as
  transformers' ModernBertRotaryEmbedding: emb = cat(freqs, freqs))."""
  freqs = position_ids.astype(jnp.float32)[..., None] * inverse_frequencies(head_dim, theta)
  angles = jnp.concatenate([freqs, freqs], axis=-1)                       # [B, T, D]
  return jnp.cos(angles), jnp.sin(angles)


def rotate_half(x):
  """[x1, x2] -> [-x2, x1] on the last axis (halves of D/2 channels)."""
  x1, x2 = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([-x2, x1], axis=-1)


def apply_rotary(x, cos, sin):
  """x [B, T, N, D] turned by cos/sin [B, T, D]: x cos + rotate_half(x) sin, in float32."""
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]                       # [B, T, 1, D]
  x32 = x.astype(jnp.float32)
  return (x32 * cos + rotate_half(x32) * sin).astype(x.dtype)


def apply_rope(q, k, position_ids=None, *, theta):
  """q [B, T, N, D], k [B, S, N, D] (S = T: self-attention) at `position_ids` [B, T] (None:
  0 .. T-1 in every row) -> the rotated q and k, same shapes and dtypes."""
  b, t, _, d = q.shape
  if position_ids is None:
    position_ids = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  cos, sin = cos_sin(position_ids, d, theta)
  return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
