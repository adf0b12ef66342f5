"""SQuAD v1.1 / v2.0: reading the JSON and google-research/bert's sliding-window features.

Follows google-research/bert `run_squad.py` (read_squad_examples, convert_examples_to_features,
_improve_answer_span, _check_is_max_context) decision for decision, with ids instead of
piece strings and numpy arrays instead of TFRecords:
  * the context is split into words on " \\t\\r\\n" and U+202F only (char_to_word_offset maps each
    character to its word); each word is WordPiece-tokenized on its own;
  * the question keeps its first max_query_length (64) pieces (longer ones are counted);
  * the document pieces are cut into windows of max_seq_length - len(question) - 3 pieces
    starting every doc_stride (128) pieces: [CLS] question [SEP] window [SEP];
  * a piece seen by several windows is scored in the window where it has the most context
    (min(left, right) + 0.01 * window length), so each answer is predicted once;
  * training: the answer's word span is narrowed to the pieces that spell the tokenized answer
    ("(1895-1943)." -> "1895"); a window that does not hold the whole answer (and every window of
    a v2 no-answer question) points at [CLS] (position 0). Training answers that are not found
    in their context are skipped and counted ("Could not find answer"), as google-research/bert
    does; `SkipCounter.summary()` reports them.
Predictions (n-best, null-score threshold, mapping back to the context) are in
squad_predictions.py.

A tokenizer.json (a converted ModernBERT's byte-level BPE) takes transformers' run_qa.py way
instead (`_encode_paragraphs_json`): the context is encoded whole, its text as is, so the ids are
PreTrainedTokenizerFast's for the paragraph; the question is lstripped as run_qa does. Word by word,
a BPE without a prefix space gives ids the model never saw mid-sentence ("rejects" alone is 're'
'j' 'ect' 's', after a space 'Ġre' 'j' 'ect' 's'), and an answer encoded alone cannot be found
among the context's pieces. The answer's first and last piece come from the pieces' character
offsets (the pieces holding its first and last character, run_qa's loops), each piece's word is
that of its first non-space character (a piece of spaces only, a lone 'Ġ', goes to the word after
it, as transformers' word_ids()), and eval windows carry each piece's characters
(token_to_char) so a predicted span is cut out of the context by them.
"""

import dataclasses
import json
import os

import numpy as np

from data_pipelines.tasks import common
from data_pipelines.tasks.common import TaskDataError


@dataclasses.dataclass(frozen=True)
class SquadTask:
  name: str
  version_2_with_negative: bool  # SQuAD 2.0: questions may have no answer
  files: dict  # split -> JSON file name under data_dir
  tfds_name: str
  eval_splits: tuple = ("dev",)
  type: str = "span"  # the task type (bert_jax/tasks/span.py)
  # Official evaluation script the metrics follow.
  metrics: tuple = ("exact_match", "f1")


TASKS = {
    "squad_v1": SquadTask("squad_v1", False,
                          {"train": "train-v1.1.json", "dev": "dev-v1.1.json"}, "squad/v1.1"),
    "squad_v2": SquadTask("squad_v2", True,
                          {"train": "train-v2.0.json", "dev": "dev-v2.0.json"}, "squad/v2.0"),
}


@dataclasses.dataclass
class SquadExample:
  """One question; `doc_tokens`/`word_spans` are shared by the questions of a paragraph."""
  qas_id: str
  question_text: str
  context: str
  doc_tokens: list  # whitespace-separated words of the context
  word_spans: list  # [(start, end_exclusive)] character span of each word in `context`
  orig_answer_text: str = ""
  start_position: int = -1  # word index of the answer start (training only; -1: no answer)
  end_position: int = -1
  is_impossible: bool = False
  paragraph_id: int = 0
  answer_start_char: int = -1  # the answer's first character in `context` (training only)


def is_whitespace(c):
  # run_squad.py's definition: note that U+00A0 and other Unicode spaces stay inside words.
  return c in " \t\r\n" or ord(c) == 0x202F


def split_words(context):
  """(words, word_spans, char_to_word_offset) exactly as read_squad_examples builds them."""
  words, spans, char_to_word = [], [], []
  prev_is_whitespace = True
  for i, c in enumerate(context):
    if is_whitespace(c):
      prev_is_whitespace = True
    else:
      if prev_is_whitespace:
        words.append(c)
        spans.append([i, i + 1])
      else:
        words[-1] += c
        spans[-1][1] = i + 1
      prev_is_whitespace = False
    char_to_word.append(len(words) - 1)
  return words, [tuple(s) for s in spans], char_to_word


def load_json(path):
  """The "data" list of a SQuAD JSON file, with one-line errors."""
  text = common.read_text(path)
  try:
    obj = json.loads(text)
  except json.JSONDecodeError as e:
    raise TaskDataError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}).") from e
  if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
    raise TaskDataError(f"{path}: expected a SQuAD JSON object with a \"data\" list of "
                        "articles.")
  if not obj["data"]:
    raise TaskDataError(f"{path}: the \"data\" list is empty.")
  return obj["data"]


def _field(path, obj, key, where, kind):
  if not isinstance(obj, dict) or key not in obj:
    raise TaskDataError(f"{path}: {where} has no \"{key}\" field.")
  value = obj[key]
  if not isinstance(value, kind):
    raise TaskDataError(f"{path}: {where} field \"{key}\" is {type(value).__name__}, expected "
                        f"{kind.__name__ if isinstance(kind, type) else kind[0].__name__}.")
  return value


def read_examples(data, path, is_training, version_2_with_negative, skips=None):
  """SquadExamples from the JSON "data" list (path only names the source in messages).

  Training keeps one answer per question (v1.1 train has exactly one) and skips, counting in
  `skips`, answers whose text is not at answer_start in the context.
  """
  skips = common.SkipCounter() if skips is None else skips
  examples = []
  paragraph_id = 0
  for a, article in enumerate(data):
    paragraphs = _field(path, article, "paragraphs", f"article {a}", list)
    for p, paragraph in enumerate(paragraphs):
      where = f"article {a} paragraph {p}"
      context = _field(path, paragraph, "context", where, str)
      words, spans, char_to_word = split_words(context)
      for qa in _field(path, paragraph, "qas", where, list):
        qid = str(_field(path, qa, "id", f"{where} question", (str, int)))
        question = _field(path, qa, "question", f"question {qid!r}", str)
        ex = SquadExample(qid, question, context, words, spans, paragraph_id=paragraph_id)
        if is_training:
          ex.is_impossible = bool(qa.get("is_impossible", False)) and version_2_with_negative
          answers = _field(path, qa, "answers", f"question {qid!r}", list)
          if not ex.is_impossible:
            if len(answers) != 1:
              raise TaskDataError(f"{path}: training question {qid!r} has {len(answers)} "
                                  "answers; for training each question needs exactly 1 (or "
                                  "is_impossible: true in SQuAD 2.0).")
            answer = answers[0]
            text = _field(path, answer, "text", f"answer of {qid!r}", str)
            offset = _field(path, answer, "answer_start", f"answer of {qid!r}", int)
            end_char = offset + len(text) - 1
            if not text or offset < 0 or end_char >= len(context):
              skips.add("answer outside its context", f"{os.path.basename(path)}:{qid}")
              continue
            ex.orig_answer_text = text
            ex.answer_start_char = offset
            ex.start_position = char_to_word[offset]
            ex.end_position = char_to_word[end_char]
            # Only answers that can be recovered from the document are kept, as in
            # read_squad_examples (it logs "Could not find answer").
            actual_text = " ".join(words[ex.start_position:ex.end_position + 1])
            cleaned = " ".join(_whitespace_tokenize(text))
            if actual_text.find(cleaned) == -1:
              skips.add("Could not find answer", f"{os.path.basename(path)}:{qid}")
              continue
        examples.append(ex)
      paragraph_id += 1
  return examples, skips


def _whitespace_tokenize(text):
  # google-research/bert tokenization.whitespace_tokenize: str.split() after strip().
  return text.strip().split()


def read_file(task, data_dir, split, is_training, skips=None):
  """(examples, data, skips) of a split from the task's local JSON file."""
  if split not in task.files:
    raise TaskDataError(f"{task.name}: no split {split!r}; splits are {sorted(task.files)}.")
  path = os.path.join(data_dir, task.files[split])
  data = load_json(path)
  examples, skips = read_examples(data, path, is_training, task.version_2_with_negative, skips)
  if not examples:
    raise TaskDataError(f"{path}: no usable questions ({skips.summary() or 'none in file'}).")
  return examples, data, skips


def tfds_to_json(records):
  """TFDS squad records -> the JSON "data" list (questions regrouped by title and context)."""
  articles = {}
  for r in records:
    title = r["title"].decode("utf-8")
    context = r["context"].decode("utf-8")
    paragraphs = articles.setdefault(title, {})
    qas = paragraphs.setdefault(context, [])
    answers = [{"text": t.decode("utf-8"), "answer_start": int(s)}
               for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]
    qa = {"id": r["id"].decode("utf-8"), "question": r["question"].decode("utf-8"),
          "answers": answers}
    if "is_impossible" in r:
      qa["is_impossible"] = bool(r["is_impossible"])
    qas.append(qa)
  return [{"title": title, "paragraphs": [{"context": c, "qas": q} for c, q in ps.items()]}
          for title, ps in articles.items()]


def read_tfds(task, data_dir, split, is_training, skips=None):
  """(examples, data, skips) from a prepared TFDS squad/v1.1 or squad/v2.0 (no download)."""
  import tensorflow_datasets as tfds
  from bert_jax_core.tf_setup import tf  # noqa: F401 - keeps TF off the accelerators
  tfds_split = {"train": "train", "dev": "validation"}.get(split)
  if tfds_split is None:
    raise TaskDataError(f"{task.name}: TFDS has splits train and dev, not {split!r}.")
  try:
    ds = tfds.load(task.tfds_name, split=tfds_split, data_dir=data_dir, download=False)
  except (AssertionError, ValueError) as e:  # tfds errors, see glue.read_tfds_examples
    raise TaskDataError(f"tfds {task.tfds_name}[{tfds_split}] in data_dir={data_dir}: cannot be "
                        f"loaded ({type(e).__name__}); prepare it with `tfds build` or point "
                        "data_dir at it.") from e
  data = tfds_to_json(tfds.as_numpy(ds))
  source = f"tfds:{task.tfds_name}[{tfds_split}]"
  examples, skips = read_examples(data, source, is_training, task.version_2_with_negative, skips)
  if not examples:
    raise TaskDataError(f"{source}: no usable questions ({skips.summary()}).")
  return examples, data, skips


# ---------------------------------------------------------------------------------------------
# Features.
# ---------------------------------------------------------------------------------------------


def _encode_words(tokenizer, examples):
  """Pieces of every context word, per paragraph: {paragraph_id: list[list[int]]}.

  A word is tokenized on its own (no whitespace inside), so each distinct word string is
  encoded once: SQuAD's 2.3M training-context words have ~10x fewer distinct strings.
  """
  distinct = {}
  for ex in examples:
    for w in ex.doc_tokens:
      distinct.setdefault(w, len(distinct))
  words = list(distinct)
  pieces = tokenizer.encode(words) if words else []
  by_paragraph = {}
  for ex in examples:
    if ex.paragraph_id not in by_paragraph:
      by_paragraph[ex.paragraph_id] = [pieces[distinct[w]] for w in ex.doc_tokens]
  return by_paragraph


@dataclasses.dataclass
class _JsonDoc:
  """A paragraph encoded whole by a tokenizer.json."""
  ids: list  # [pieces] the context's ids, = PreTrainedTokenizerFast(context) without specials
  words: list  # [pieces] the context word (doc_tokens index) of each piece
  chars: np.ndarray  # [pieces, 2] int32 [start, end) context characters of each piece


def _paragraph_text(tokenizer, ex):
  """(text, to_context): what a tokenizer.json encodes for the paragraph of `ex`, and [len(text)]
  the context character of each of its characters (-1: a space a pre-tokenizer inserted).

  No pre-tokenizer: the context itself. With one (mecab, jieba) each word is rewritten as the
  other kinds do ("대한민국은" -> "대한민국 은"), the words joined by single spaces, and the
  rewritten characters are matched back to the word's: these pre-tokenizers only insert spaces.
  """
  if tokenizer.pretokenizer is None:
    return ex.context, np.arange(len(ex.context))
  parts, to_context = [], []
  for word, (a, b), new in zip(ex.doc_tokens, ex.word_spans,
                               tokenizer.pretokenizer(list(ex.doc_tokens))):
    if not new:
      continue
    if parts:
      parts.append(" ")
      to_context.append(-1)
    k = a
    for c in new:
      while k < b and c != ex.context[k] and ex.context[k].isspace():
        k += 1  # a space (U+00A0, ...) the pre-tokenizer dropped
      if k < b and c == ex.context[k]:
        to_context.append(k)
        k += 1
      elif c.isspace():
        to_context.append(-1)
      else:
        raise TaskDataError(
            f"SQuAD paragraph of question {ex.qas_id!r}: the pre-tokenizer rewrote the word "
            f"{word!r} as {new!r}, changing its characters; answers on a tokenizer.json are "
            "mapped by character, so use a pre-tokenizer that only inserts spaces (mecab, "
            "jieba) or none.")
    parts.append(new)
  return "".join(parts), np.asarray(to_context, np.int64)


def _encode_paragraphs_json(tokenizer, examples):
  """{paragraph_id: _JsonDoc}: each paragraph encoded whole (tokenizer.encode_offsets)."""
  firsts = {}
  for ex in examples:
    firsts.setdefault(ex.paragraph_id, ex)
  texts = [_paragraph_text(tokenizer, ex) for ex in firsts.values()]
  encoded = tokenizer.encode_offsets([t for t, _ in texts])
  out = {}
  for ex, (_, to_context), (ids, offsets) in zip(firsts.values(), texts, encoded):
    word_of = np.full(len(ex.context), -1, np.int64)  # context character -> word, -1 spaces
    for w, (a, b) in enumerate(ex.word_spans):
      word_of[a:b] = w
    words, chars, end = [], [], 0
    for s, t in offsets:  # [s, t) characters of the encoded text
      mapped = to_context[s:t][to_context[s:t] >= 0]
      hits = word_of[mapped][word_of[mapped] >= 0]
      words.append(int(hits[0]) if len(hits) else -1)
      # A piece of inserted spaces only: an empty span where the previous one ended.
      span = (int(mapped.min()), int(mapped.max()) + 1) if len(mapped) else (end, end)
      end = max(end, span[1])
      chars.append(span)
    following = len(ex.doc_tokens) - 1  # spaces at the end of the context: the last word
    for k in reversed(range(len(words))):  # spaces only (a lone 'Ġ'): the word after them
      words[k] = following = words[k] if words[k] >= 0 else following
    out[ex.paragraph_id] = _JsonDoc(list(ids), words,
                                    np.asarray(chars, np.int32).reshape(-1, 2))
  return out


def _answer_pieces_json(doc, ex):
  """(first, last) piece of the answer: transformers run_qa.py's loops over the offsets.

  first: the last piece starting at or before the answer's first character; last: the first
  piece ending at or after its end. A piece of two bytes of one character ("é" is 'Ã' '©')
  repeats that character's span, and run_qa then starts at the second byte: so do we.
  """
  if ex.answer_start_char >= 0:   # read_examples': the answer's own characters
    start_char = ex.answer_start_char
    end_char = start_char + len(ex.orig_answer_text)
  else:   # an example built by hand with word positions only: its words' characters
    start_char = ex.word_spans[ex.start_position][0]
    end_char = ex.word_spans[ex.end_position][1]
  starts, ends = doc.chars[:, 0], np.maximum.accumulate(doc.chars[:, 1])
  first = int(np.searchsorted(starts, start_char, side="right")) - 1
  last = int(np.searchsorted(ends, end_char, side="left"))
  first = min(max(first, 0), len(doc.ids) - 1)
  return first, min(max(last, first), len(doc.ids) - 1)


def _improve_answer_span(doc_ids, input_start, input_end, answer_ids):
  """The tightest piece span that spells the tokenized answer, else the word-level span."""
  n = len(answer_ids)
  for new_start in range(input_start, input_end + 1):
    for new_end in range(input_end, new_start - 1, -1):
      if new_end - new_start + 1 == n and doc_ids[new_start:new_end + 1] == answer_ids:
        return new_start, new_end
  return input_start, input_end


def doc_spans(num_doc_tokens, max_tokens_for_doc, doc_stride):
  """[(start, length)] windows over the document pieces, as convert_examples_to_features."""
  spans = []
  start = 0
  while start < num_doc_tokens:
    length = min(num_doc_tokens - start, max_tokens_for_doc)
    spans.append((start, length))
    if start + length == num_doc_tokens:
      break
    start += min(length, doc_stride)
  return spans


def max_context_span(spans, num_doc_tokens):
  """[num_doc_tokens] index of the window where each piece has the most context.

  score = min(left, right) + 0.01 * window length; the first window wins ties (the original's
  strict `score > best_score`).
  """
  pos = np.arange(num_doc_tokens)[None, :]  # [1, doc]
  starts = np.array([s for s, _ in spans])[:, None]  # [spans, 1]
  lengths = np.array([l for _, l in spans])[:, None]
  ends = starts + lengths - 1
  score = np.minimum(pos - starts, ends - pos) + 0.01 * lengths  # [spans, doc]
  score = np.where((pos >= starts) & (pos <= ends), score, -np.inf)
  return np.argmax(score, axis=0)


def _no_features(keys, max_seq_length):
  """convert_examples' arrays with no window (no example), at their shapes and dtypes."""
  def empty(k):
    if k == "token_to_char":
      return np.zeros((0, max_seq_length, 2), np.int32)
    per_position = k in ("input_ids", "segment_ids", "input_mask", "token_to_orig",
                         "token_is_max_context")
    return np.zeros((0, max_seq_length) if per_position else (0,),
                    bool if k == "token_is_max_context" else np.int32)
  return {k: empty(k) for k in keys}


def _paragraph_pieces(ex, word_pieces, answer_ids):
  """google-research/bert's way (WordPiece / SentencePiece): the paragraph's pieces word by word,
  the context word of each piece, and, given the answer's pieces (training), the answer's first
  and last piece, tightened to the answer text (_improve_answer_span); else (None, None)."""
  tok_to_orig, orig_to_tok, all_doc = [], [], []
  for i, pieces in enumerate(word_pieces):
    orig_to_tok.append(len(all_doc))
    tok_to_orig.extend([i] * len(pieces))
    all_doc.extend(pieces)
  if answer_ids is None:
    return all_doc, tok_to_orig, None, None
  tok_start = orig_to_tok[ex.start_position]
  if ex.end_position < len(ex.doc_tokens) - 1:
    tok_end = orig_to_tok[ex.end_position + 1] - 1
  else:
    tok_end = len(all_doc) - 1
  return (all_doc, tok_to_orig,
          *_improve_answer_span(all_doc, tok_start, tok_end, answer_ids))


def convert_examples(examples, tokenizer, max_seq_length=384, doc_stride=128,
                     max_query_length=64, is_training=False):
  """Windows of all examples as numpy arrays; returns (features, stats).

  features: input_ids, input_mask, segment_ids [n, seq] int32; start_positions,
  end_positions [n] int32 (0 = [CLS] when training; 0 at eval); unique_ids [n] int64;
  example_index, doc_span_index [n] int32; token_to_orig [n, seq] int32 (context word of each
  position, -1 outside the window's document part); token_is_max_context [n, seq] bool; with a
  tokenizer.json at eval, token_to_char [n, seq, 2] int32 (context characters [start, end) of
  each position, -1 outside the document part).
  stats: counts of questions truncated to max_query_length and of training windows that do not
  contain their answer.
  """
  if max_seq_length <= min(max_query_length, 1) + 3:
    raise ValueError(f"max_seq_length={max_seq_length} leaves no room for the context; it must "
                     f"exceed max_query_length={max_query_length} + 3 ([CLS] and two [SEP]).")
  vocab = tokenizer.vocab
  json_docs = None
  if hasattr(tokenizer, "encode_offsets"):  # a tokenizer.json: run_qa.py's way (docstring)
    json_docs = _encode_paragraphs_json(tokenizer, examples)
    question_ids = tokenizer.encode([ex.question_text.lstrip() for ex in examples])
  else:  # WordPiece / SentencePiece: google-research/bert's way, word by word
    doc_pieces = _encode_words(tokenizer, examples)
    question_ids = tokenizer.encode([ex.question_text for ex in examples])
    answer_ids = (tokenizer.encode([ex.orig_answer_text for ex in examples]) if is_training
                  else None)
  keys = ("input_ids", "segment_ids", "input_mask", "start_positions", "end_positions",
          "example_index", "doc_span_index", "token_to_orig", "token_is_max_context")
  # Eval windows of a tokenizer.json: [seq, 2] context characters of each piece ([-1, -1]
  # outside the document part), what predictions cut the answer out with. Not kept for
  # training (SQuAD train: 88k windows x 384 x 2 int32 = 270 MB, never read).
  with_chars = json_docs is not None and not is_training
  rows = {k: [] for k in keys + (("token_to_char",) if with_chars else ())}
  stats = {"examples": len(examples), "questions_truncated": 0, "answer_outside_window": 0}
  for example_index, ex in enumerate(examples):
    query = question_ids[example_index]
    if len(query) > max_query_length:
      query = query[:max_query_length]
      stats["questions_truncated"] += 1
    with_answer = is_training and not ex.is_impossible
    if json_docs is not None:
      doc = json_docs[ex.paragraph_id]
      all_doc, tok_to_orig, chars = doc.ids, doc.words, doc.chars
      tok_start, tok_end = _answer_pieces_json(doc, ex) if with_answer else (None, None)
    else:
      all_doc, tok_to_orig, tok_start, tok_end = _paragraph_pieces(
          ex, doc_pieces[ex.paragraph_id], answer_ids[example_index] if with_answer else None)

    max_tokens_for_doc = max_seq_length - len(query) - 3  # [CLS] query [SEP] doc [SEP]
    if max_tokens_for_doc < 1:
      raise ValueError(f"question {ex.qas_id!r}: {len(query)} pieces leave no room for the "
                       f"context in max_seq_length={max_seq_length}; lower max_query_length="
                       f"{max_query_length} below {max_seq_length - 3}.")
    spans = doc_spans(len(all_doc), max_tokens_for_doc, doc_stride)
    best_span = max_context_span(spans, len(all_doc)) if all_doc else np.zeros(0, np.int64)
    doc_offset = len(query) + 2
    for span_index, (start, length) in enumerate(spans):
      ids = [vocab.cls_id] + query + [vocab.sep_id] + all_doc[start:start + length] + [vocab.sep_id]
      n = len(ids)
      input_ids = np.full(max_seq_length, vocab.pad_id, np.int32)
      input_ids[:n] = ids
      segment_ids = np.zeros(max_seq_length, np.int32)
      segment_ids[doc_offset:n] = 1  # the window and its [SEP]
      input_mask = np.zeros(max_seq_length, np.int32)
      input_mask[:n] = 1
      to_orig = np.full(max_seq_length, -1, np.int32)
      to_orig[doc_offset:doc_offset + length] = tok_to_orig[start:start + length]
      is_max = np.zeros(max_seq_length, bool)
      is_max[doc_offset:doc_offset + length] = best_span[start:start + length] == span_index
      if with_chars:
        to_char = np.full((max_seq_length, 2), -1, np.int32)
        to_char[doc_offset:doc_offset + length] = chars[start:start + length]
        rows["token_to_char"].append(to_char)

      start_position = end_position = 0
      if with_answer:
        if tok_start >= start and tok_end <= start + length - 1:
          start_position = tok_start - start + doc_offset
          end_position = tok_end - start + doc_offset
        else:
          stats["answer_outside_window"] += 1
      for k, v in (("input_ids", input_ids), ("segment_ids", segment_ids),
                   ("input_mask", input_mask), ("start_positions", start_position),
                   ("end_positions", end_position), ("example_index", example_index),
                   ("doc_span_index", span_index), ("token_to_orig", to_orig),
                   ("token_is_max_context", is_max)):
        rows[k].append(v)
  n = len(rows["input_ids"])
  features = ({k: np.asarray(v) for k, v in rows.items()} if n else
              _no_features(rows, max_seq_length))
  for k in ("start_positions", "end_positions", "example_index", "doc_span_index"):
    features[k] = features[k].astype(np.int32)
  features["unique_ids"] = 1000000000 + np.arange(n, dtype=np.int64)  # run_squad's numbering
  stats["features"] = n
  return features, stats
