"""Pure per-document logic of pre-training example creation (no TensorFlow, no I/O).

Every function here maps token ids to token ids with an explicit `random.Random`, so the same
code runs in the local runner (`create_pretraining_data.py`, `whole_corpus.py`) and unchanged
inside the Apache Beam pipeline (`beam_pipeline.py`).

Two instance layouts:
  * NSP (BERT, Devlin et al. 2018): `[CLS] A [SEP] B [SEP]`, segment ids 0 for `[CLS] A [SEP]` and
    1 for `B [SEP]`; B is the actual continuation of A (label 0 = IsNext) or, half the time, text
    from another document (label 1 = NotNext). `create_instances_from_document` draws its random
    numbers in the same order as google-research/bert's function of the same name, so for the
    same document pool and the same `random.Random` state it builds the same pairs.
  * SOP (ALBERT, Lan et al. 2019): the same `[CLS] A [SEP] B [SEP]` layout with A and B two
    consecutive segments of one document; label 0 when in order, 1 when swapped (half the time).
    `create_sop_instances` draws in the order of google-research/albert's
    create_instances_from_document with random_next_sentence=False, except for a chunk of a
    single sentence, where ALBERT falls back to a B from another document (an NSP negative inside
    SOP data): here that sentence is split at a random token into A and B instead (skipped if it
    has one token), so every SOP instance is a pair of consecutive segments, in or out of order.
  * FULL-SENTENCES (RoBERTa, Liu et al. 2019, section 4.2): `[CLS] s1 s2 ... [SEP]`, whole
    sentences packed contiguously and across document boundaries with an extra `[SEP]` between
    documents; one segment, label 0.

A document is a sequence of sentences; a sentence is a sequence of token ids (a list or an
`array.array`, anything with len() that list.extend() accepts).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class InstanceParams:
  max_seq_length: int = 128
  # Probability that a document's instances target a random length in [2, max_seq_length - 3]
  # instead of the full length, to narrow the gap to short fine-tuning inputs.
  short_seq_prob: float = 0.1
  cls_id: int = 2
  sep_id: int = 3


@dataclasses.dataclass
class Instance:
  tokens: list  # [seq <= max_seq_length] token ids, [CLS]/[SEP] included, unpadded
  segment_ids: list  # [seq] 0 or 1
  is_random_next: bool  # next_sentence_labels: 1 if True (NotNext; SOP: swapped), else 0


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
  """Truncates two lists in place until len(a) + len(b) <= max_num_tokens.

  As google-research/bert: each step removes one token from the longer list (from B on a tie),
  from the front or the back with probability 1/2 each. Tracked with bounds and sliced once so a
  10,000-token sentence costs O(excess), not O(excess * length) list deletions; the random draws
  are the same as deleting one token at a time.
  """
  a_lo, a_hi, b_lo, b_hi = 0, len(tokens_a), 0, len(tokens_b)
  while (a_hi - a_lo) + (b_hi - b_lo) > max_num_tokens:
    front = rng.random() < 0.5
    if a_hi - a_lo > b_hi - b_lo:
      if front:
        a_lo += 1
      else:
        a_hi -= 1
    else:
      if front:
        b_lo += 1
      else:
        b_hi -= 1
  tokens_a[:] = tokens_a[a_lo:a_hi]
  tokens_b[:] = tokens_b[b_lo:b_hi]


def _nsp_chunks(document, rng, params):
  """google-research/bert's chunk loop, shared by both NSP samplers (same random draws).

  Yields (tokens_a, tokens_b, target_b_length) per pair: tokens_b is the rest of the chunk for
  IsNext, None for NotNext (the consumer fetches B; target_b_length is what it aims at). The
  generator is lazy, so the consumer's own draws (random document, start, truncation) happen
  between two of its draws, exactly where the original makes them.
  """
  max_num_tokens = params.max_seq_length - 3  # room for [CLS], [SEP], [SEP]
  # Mostly fill the whole sequence (padding is wasted compute), but for short_seq_prob of the
  # documents (10% by default) aim at a random shorter length. One draw per document, as the
  # original. The target is soft; max_seq_length is the hard limit.
  target_seq_length = max_num_tokens
  if rng.random() < params.short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  # A and B are made of whole sentences (not an arbitrary split of the token stream), otherwise
  # NSP is too easy.
  current_chunk = []
  current_length = 0
  i = 0
  while i < len(document):
    current_chunk.append(document[i])
    current_length += len(document[i])
    if i == len(document) - 1 or current_length >= target_seq_length:
      # How many sentences of the chunk go into A.
      a_end = 1
      if len(current_chunk) >= 2:
        a_end = rng.randint(1, len(current_chunk) - 1)
      tokens_a = [t for sentence in current_chunk[:a_end] for t in sentence]
      if len(current_chunk) == 1 or rng.random() < 0.5:
        yield tokens_a, None, target_seq_length - len(tokens_a)
        # The chunk's sentences after A were not used: put them back for the next chunk.
        i -= len(current_chunk) - a_end
      else:
        yield tokens_a, [t for sentence in current_chunk[a_end:] for t in sentence], 0
      current_chunk = []
      current_length = 0
    i += 1


def _other_document(rng, num_documents, document_index):
  """Ten tries to draw another document (a one-document pool falls back to itself)."""
  for _ in range(10):
    index = rng.randint(0, num_documents - 1)
    if index != document_index:
      break
  return index


def _nsp_instance(tokens_a, tokens_b, is_random_next, params):
  assert tokens_a and tokens_b, "empty segment: documents must hold non-empty sentences"
  tokens = [params.cls_id, *tokens_a, params.sep_id, *tokens_b, params.sep_id]
  segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
  return Instance(tokens, segment_ids, is_random_next)


def create_instances_from_document(documents, document_index, rng, params):
  """NSP instances for `documents[document_index]`; the other documents are the random-next pool.

  `documents` holds only non-empty documents of non-empty sentences. The original passes the
  whole corpus; the runner passes a bounded pool (the document's block), see the module docstring
  of create_pretraining_data.
  """
  instances = []
  for tokens_a, tokens_b, target_b_length in _nsp_chunks(documents[document_index], rng, params):
    is_random_next = tokens_b is None
    if is_random_next:
      random_document = documents[_other_document(rng, len(documents), document_index)]
      random_start = rng.randint(0, len(random_document) - 1)
      tokens_b = []
      for j in range(random_start, len(random_document)):
        tokens_b.extend(random_document[j])
        if len(tokens_b) >= target_b_length:
          break
    truncate_seq_pair(tokens_a, tokens_b, params.max_seq_length - 3, rng)
    instances.append(_nsp_instance(tokens_a, tokens_b, is_random_next, params))
  return instances


def _sop_pairs(document, rng, params):
  """ALBERT's chunk loop for SOP: yields (tokens_a, tokens_b, swapped), A and B consecutive
  segments in document order (module docstring); the caller swaps and truncates."""
  max_num_tokens = params.max_seq_length - 3
  target_seq_length = max_num_tokens
  if rng.random() < params.short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  current_chunk = []
  current_length = 0
  for i, sentence in enumerate(document):
    current_chunk.append(sentence)
    current_length += len(sentence)
    if i == len(document) - 1 or current_length >= target_seq_length:
      if len(current_chunk) >= 2:
        a_end = rng.randint(1, len(current_chunk) - 1)
        tokens_a = [t for s in current_chunk[:a_end] for t in s]
        tokens_b = [t for s in current_chunk[a_end:] for t in s]
      elif len(current_chunk[0]) >= 2:   # one sentence: split it (ALBERT: a random document)
        cut = rng.randint(1, len(current_chunk[0]) - 1)
        tokens_a, tokens_b = list(current_chunk[0][:cut]), list(current_chunk[0][cut:])
      else:
        tokens_a = None
      if tokens_a is not None:
        yield tokens_a, tokens_b, rng.random() < 0.5
      current_chunk = []
      current_length = 0


def create_sop_instances(document, rng, params):
  """SOP instances of one document (no other document is needed): label 1 = swapped."""
  instances = []
  for tokens_a, tokens_b, swapped in _sop_pairs(document, rng, params):
    if swapped:
      tokens_a, tokens_b = tokens_b, tokens_a
    truncate_seq_pair(tokens_a, tokens_b, params.max_seq_length - 3, rng)
    instances.append(_nsp_instance(tokens_a, tokens_b, swapped, params))
  return instances


@dataclasses.dataclass
class Pair:
  """One NSP pair planned from its own document, before a NotNext B is fetched.

  Whole-corpus sampling (`plan_nsp_pairs`) splits the original's per-document loop in two so
  that the random-next document need not be in memory: the plan needs only the document itself
  and the corpus size; the B of a NotNext pair is cut from the random document wherever that
  document lives (a dict in memory, or the other side of a Beam CoGroupByKey).
  """
  key: tuple  # (document index, dupe, pair index): seeds the truncation and orders instances
  tokens_a: list
  tokens_b: list  # IsNext: the rest of the chunk; NotNext: [] until `random_next_tokens`
  random_document: int  # NotNext: index of the document B comes from; -1 for IsNext
  random_start: float  # NotNext: uniform [0, 1); B starts at sentence floor(u * len(doc))
  target_b_length: int
  swapped: bool = False  # SOP: A and B are laid out in reverse order (label 1)


def plan_nsp_pairs(document, document_index, num_documents, rng, params, key=()):
  """The pairs of `document` with random-next documents drawn from `num_documents` (all of them).

  The same chunking as `create_instances_from_document` (`_nsp_chunks`) and the same draws up to
  the random document: target length, A's sentence count, IsNext/NotNext, the document index
  (ten tries to avoid itself). Then, where the original draws the start sentence with
  randint(0, len(random document) - 1), this draws u = rng.random() and the start is
  floor(u * len): the same uniform choice without knowing the other document's length. The
  truncation's coin flips come from a per-pair stream (`finish_pair`), so this stream never
  depends on another document's content: a pair is fixed by (seed, document, dupe) alone.
  """
  pairs = []
  for tokens_a, tokens_b, target_b_length in _nsp_chunks(document, rng, params):
    pair_key = (*key, len(pairs))
    if tokens_b is None:
      random_document = _other_document(rng, num_documents, document_index)
      pairs.append(Pair(pair_key, tokens_a, [], random_document, rng.random(), target_b_length))
    else:
      pairs.append(Pair(pair_key, tokens_a, tokens_b, -1, 0.0, 0))
  return pairs


def plan_sop_pairs(document, rng, params, key=()):
  """SOP pairs of `document` as complete Pairs (no random-next document), for the whole-corpus
  and Beam runners; `finish_pair` swaps and truncates them with the pair's own stream."""
  return [Pair((*key, j), tokens_a, tokens_b, -1, 0.0, 0, swapped)
          for j, (tokens_a, tokens_b, swapped) in enumerate(_sop_pairs(document, rng, params))]


def random_next_tokens(random_document, pair):
  """B of a NotNext pair: whole sentences of `random_document` from the pair's start sentence
  until target_b_length tokens (the last sentence whole, as the original)."""
  start = min(int(pair.random_start * len(random_document)), len(random_document) - 1)
  tokens_b = []
  for sentence in random_document[start:]:
    tokens_b.extend(sentence)
    if len(tokens_b) >= pair.target_b_length:
      break
  return tokens_b


def finish_pair(pair, tokens_b, rng, params):
  """Truncates (coin flips from `rng`, the pair's own stream) and lays out the instance."""
  tokens_a = list(pair.tokens_a)
  tokens_b = list(tokens_b)
  if pair.swapped:
    tokens_a, tokens_b = tokens_b, tokens_a
  truncate_seq_pair(tokens_a, tokens_b, params.max_seq_length - 3, rng)
  return _nsp_instance(tokens_a, tokens_b, pair.random_document >= 0 or pair.swapped, params)


def pack_full_sentences(documents, params):
  """RoBERTa FULL-SENTENCES instances from `documents` in the given order (no randomness).

  Sentences are packed whole until the next one would not fit in max_seq_length - 2; packing goes
  on across documents with one [SEP] between them. A sentence longer than the budget is cut into
  budget-sized pieces (kept, not dropped). short_seq_prob does not apply (RoBERTa uses none).
  """
  max_num_tokens = params.max_seq_length - 2  # room for [CLS] ... [SEP]
  instances = []
  current = []

  def flush():
    if current:
      tokens = [params.cls_id, *current, params.sep_id]
      instances.append(Instance(tokens, [0] * len(tokens), False))
      current.clear()

  for document in documents:
    new_document = True
    for sentence in document:
      for start in range(0, len(sentence), max_num_tokens):
        piece = sentence[start:start + max_num_tokens]
        separator = 1 if (new_document and current) else 0
        if len(current) + separator + len(piece) > max_num_tokens:
          flush()
          separator = 0
        if separator:
          current.append(params.sep_id)
        current.extend(piece)
        new_document = False
  flush()
  return instances
