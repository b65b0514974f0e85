"""The Python API for notebooks and tests: load a model, encode text.

  import bertjax
  model = bertjax.load("/tmp/bertjax-demo")          # a bertjax workdir
  model = bertjax.load("path/to/hf-model")            # or an HF model directory
  out = model.encode(["The cat sat.", "Another sentence."])
  out["hidden"]        # float32 [batch, length, hidden]  last encoder layer
  out["mlm_logits"]    # float32 [batch, length, vocab]  (when the model has an MLM head)
  out["nsp_logits"]    # float32 [batch, 2]  NSP, or ALBERT's SOP (where present)
  out["mask"]          # bool    [batch, length]  True on real tokens
  model.embed(texts)   # float32 [batch, hidden]  mean over real tokens
  bertjax.load("/tmp/ft-mrpc").predict([("A.", "B.")])  # a fine-tuning workdir
                                           # (bertjax/finetune/inference.py)

Token ids are bertjax's ([PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4); for an
imported model ``model.tokenizer.to_hf_ids`` gives the original ids, and the
vocabulary axis of mlm_logits follows bertjax's ids (``tokenizer.id_to_piece``).
Everything runs in float32 with dropout off.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from bertjax import batch as batch_lib
from bertjax import paths


# What a bertjax run writes into its workdir before its first checkpoint.
_RUN_STARTED = (".bertjax.lock", "metrics.jsonl", "tensorboard")


_NO_CHECKPOINT_YET = (
    "{path} is a bertjax workdir whose run has saved no checkpoint yet; load "
    "it once the first one is written (every config.checkpoint_every_steps "
    "steps, and at the end).")


def _run_started(path: str) -> bool:
  return any(paths.exists(paths.join(path, name)) for name in _RUN_STARTED)


def _is_hf_dir(path: str) -> bool:
  from bertjax.convert import hf_files
  return paths.exists(paths.join(path, "config.json")) and any(
      paths.exists(paths.join(path, name)) for name in (
          hf_files.SAFETENSORS, hf_files.SAFETENSORS_INDEX, hf_files.TORCH_BIN))


def _workdir_tokenizer(config: dict[str, Any], workdir: str,
                       fix: str = "load the workdir the model was trained in, or set "
                       "its data_dir."):
  if config.get("tokenizer") == "hf":
    from bertjax.convert import hf_tokenizers
    return hf_tokenizers.HfTokenizer(config["tokenizer_path"])
  from bertjax.data import tokenizer as tokenizer_lib
  data_dir = config.get("data_dir") or paths.join(workdir, "data")
  models = sorted(os.fspath(p) for p in paths.path(data_dir).glob("tokenizers/*.model"))
  if not models:
    raise ValueError(
        f"No tokenizer under {data_dir}/tokenizers; {fix}")
  return tokenizer_lib.Tokenizer(models[0])


def _check_texts(texts) -> None:
  """Refuses what would not be a batch of texts: one bare string (whose
  characters would each become a row) or nothing at all."""
  if isinstance(texts, (str, bytes)):
    raise ValueError(
        f"Got one string ({texts[:40]!r}), not a list of texts; pass a list, "
        "e.g. [text], to get a batch of one.")
  if len(texts) == 0:
    raise ValueError("Got no texts (an empty list); pass at least one string "
                     "or (A, B) pair.")
  for i, text in enumerate(texts):
    if isinstance(text, str):
      continue
    if (not isinstance(text, (tuple, list)) or len(text) != 2
        or not all(isinstance(part, str) for part in text)):
      shown = repr(text)
      shown = shown if len(shown) <= 60 else shown[:57] + "..."
      raise ValueError(
          f"Text {i} is {shown}, neither a string nor an (A, B) pair of strings; "
          "pass each text as a string, or a pair as a tuple of two strings.")


def _max_length(max_length: int | None, config: dict[str, Any]) -> int:
  """The truncation length: ``max_length``, or ``max_position_embeddings``
  (the length the model was trained at). Only a model that reads a learned
  absolute position table (``models.position_table_rows``) is bounded by
  it; XLNet and DeBERTa without absolute positions take longer rows."""
  from bertjax import models
  trained = int(config["max_position_embeddings"])
  if max_length is None:
    return trained
  rows = models.position_table_rows(config)
  if rows is None:
    if int(max_length) < 1:
      raise ValueError(f"max_length={max_length} is below 1; pass a positive "
                       "max_length, or none for the trained length.")
  elif not 1 <= int(max_length) <= rows:
    raise ValueError(
        f"max_length={max_length} is outside 1 ... {rows}, the model's position "
        f"table (max_position_embeddings); pass a max_length in that range, or none "
        "for the whole table.")
  return int(max_length)


def _padded_length(length: int, limit: int) -> int:
  """The length to run ``length`` tokens at: the next power of two (at least
  16, at most ``limit`` unless ``length`` is longer), so that texts of
  different lengths reuse a few compiled programs instead of one each."""
  return max(length, min(max(16, 1 << (length - 1).bit_length()), limit))


def _truncated(pieces: list[list[int]], budget: int) -> list[list[int]]:
  """The segments' tokens cut to ``budget`` in all from their ends, the
  longest first (Hugging Face's ``longest_first``, as its fast tokenizers
  split a pair), so that [CLS] and the separators of a row longer than its
  limit are kept."""
  if budget < 0:
    raise ValueError(
        f"max_length leaves no room for the text beside [CLS] and the "
        f"separators ({-budget} too few); pass a larger max_length.")
  lengths = [len(p) for p in pieces]
  if len(lengths) == 2 and sum(lengths) > budget:
    # As the tokenizers library (transformers' fast tokenizers, what an
    # exported model's AutoTokenizer is) cuts a pair: the shorter segment is
    # kept whole where the longer one can still be as long; else both get
    # half, the odd token to the longer one (to the second of two as long).
    short = min(lengths)
    longer = max(short, budget - short)
    if short + longer > budget:
      short, longer = budget // 2, budget - budget // 2
    lengths = [longer, short] if lengths[0] > lengths[1] else [short, longer]
  while sum(lengths) > budget:
    lengths[lengths.index(max(lengths))] -= 1
  return [p[:n] for p, n in zip(pieces, lengths)]


class Model:
  """A loaded encoder with its tokenizer.

  Attributes:
    config: dict of the model's config fields.
    params: the parameters (numpy, float32).
    tokenizer: ``bertjax.data.tokenizer.Tokenizer`` or
      ``bertjax.convert.hf_tokenizers.HfTokenizer``; ids are bertjax's.
    fresh_heads: heads an HF checkpoint lacked, initialised at random
      ('mlm', 'nsp', 'sop', 'pooler'); their outputs are left out.
  """

  def __init__(self, config: dict[str, Any], params: Any, tokenizer,
               fresh_heads: Sequence[str] = ()):
    import jax
    from bertjax import convert
    from bertjax.convert import core
    from bertjax.convert import pair_format
    self.config = dict(config)
    self.params = params
    self.tokenizer = tokenizer
    self.fresh_heads = tuple(fresh_heads)
    self._module = core.build_model(self.config)
    # Separators between two segments as the tokenizer joins pairs: 2 for
    # RoBERTa's own (<s> A </s></s> B </s>), else 1 (convert/pair_format.py).
    mapping = convert.mapping_for_config(self.config)
    self._pair_separators = pair_format.separators(self.config, tokenizer)
    # Segment id 0 for both texts of a pair where the architecture has one
    # segment (RoBERTa), whatever type_vocab_size the checkpoint has. A
    # workdir imported before the import recorded it falls back to the mapping.
    self._single_segment = bool(self.config.get(
        "single_segment", getattr(mapping, "SINGLE_SEGMENT", False)))
    self._apply = jax.jit(lambda p, x: self._module.apply({"params": p}, x))

  @property
  def has_mlm_head(self) -> bool:
    """False when the checkpoint had no MLM head (a bare encoder), or its
    model is ELECTRA's discriminator (replaced-token detection; its
    generator is not loaded)."""
    return "mlm" not in self.fresh_heads and not self._replaced_token_detection

  @property
  def _replaced_token_detection(self) -> bool:
    return self.config.get("model") == "electra"

  def tokenize(self, texts: Sequence[str | tuple[str, str]],
               max_length: int | None = None) -> dict[str, np.ndarray]:
    """[CLS] A [SEP] (B [SEP]) rows, padded at the end to the longest.

    Positions count from 0 at [CLS]. For an imported RoBERTa that is HF's
    position padding_idx + 1 (the import dropped the rows below it), so the
    real tokens of these right-padded rows get HF's positions.

    Args:
      texts: strings, or (A, B) pairs for two segments: segment ids 0 and 1,
        or 0 for both where the model has one segment (``type_vocab_size``
        1, or ``config.single_segment`` as an imported RoBERTa records),
        joined by one separator, or two where the tokenizer's pair template
        has them (a RoBERTa's own byte-level BPE: ``convert.pair_format``).
      max_length: truncation length (default max_position_embeddings): a
        longer row keeps [CLS] and its separators, and loses tokens from
        the end of its longest segment, one at a time. At most
        max_position_embeddings where the model reads a position table;
        XLNet and DeBERTa without absolute positions take any length.

    Returns:
      int32 [batch, length] tokens, segment_ids, positions, doc_ids (1 on
      real tokens, 0 on padding).
    """
    if not isinstance(texts, (str, bytes)):
      texts = list(texts)  # a generator or other iterable of texts
    _check_texts(texts)
    limit = _max_length(max_length, self.config)
    # No segment table (type_vocab_size 0, DeBERTa-v3) reads segment 0 too.
    last_segment = 0 if self._single_segment else max(
        0, int(self.config.get("type_vocab_size", 2)) - 1)
    rows, segs = [], []
    for text in texts:
      parts = (text,) if isinstance(text, str) else tuple(text)
      seps = [self._pair_separators] * (len(parts) - 1) + [1]
      pieces = _truncated([[int(i) for i in self.tokenizer.encode_batch([part])[0]]
                           for part in parts], limit - 1 - sum(seps))
      ids, seg = [batch_lib.CLS_ID], [0]
      for s, (piece, n) in enumerate(zip(pieces, seps)):
        ids += piece + [batch_lib.SEP_ID] * n
        seg += [min(s, last_segment)] * (len(piece) + n)
      rows.append(ids)
      segs.append(seg)
    length = max(len(r) for r in rows)
    out = {k: np.zeros((len(rows), length), np.int32)
           for k in ("tokens", "segment_ids", "doc_ids")}
    for b, (ids, seg) in enumerate(zip(rows, segs)):
      out["tokens"][b, :len(ids)] = ids
      out["segment_ids"][b, :len(ids)] = seg
      out["doc_ids"][b, :len(ids)] = 1
    out["positions"] = np.broadcast_to(
        np.arange(length, dtype=np.int32), (len(rows), length)).copy()
    return out

  def run(self, inputs: dict[str, np.ndarray], mlm: bool = True) -> dict[str, np.ndarray]:
    """Runs the encoder on model inputs (see ``tokenize``) of bertjax ids.

    Returns:
      hidden float32 [batch, length, hidden] and mask bool [batch, length];
      pooled float32 [batch, hidden] and nsp_logits float32 [batch, 2] where
      the checkpoint has those heads; rtd_logits float32 [batch, length]
      for an ELECTRA discriminator; mlm_logits float32 [batch, length,
      vocab] when ``mlm`` and the model has an MLM head (ELECTRA's
      generator is not run).
    """
    tokens = np.asarray(inputs["tokens"], np.int32)
    batch, length = tokens.shape
    # Padding (doc_ids 0) is attended by no real token, so running at a
    # padded length and cutting back changes nothing but the compiles.
    padded = _padded_length(length, int(self.config["max_position_embeddings"]))
    x = {k: np.pad(np.asarray(inputs[k], np.int32), ((0, 0), (0, padded - length)))
         for k in ("tokens", "segment_ids", "positions", "doc_ids")}
    x["positions"][:, length:] = np.arange(length, padded, dtype=np.int32)
    want_mlm = mlm and self.has_mlm_head
    x["masked_positions"] = np.broadcast_to(
        np.arange(padded if want_mlm else 1, dtype=np.int32),
        (batch, padded if want_mlm else 1))
    out = dict(self._apply(self.params, x))
    for key in ("hidden", "mlm_logits", "rtd_logits"):  # [batch, padded, ...]
      if key in out:
        out[key] = out[key][:, :length]
    result = {"hidden": np.asarray(out["hidden"], np.float32),
              "mask": np.asarray(inputs["doc_ids"]) != 0}
    # The sentence head (NSP, or ALBERT's SOP) reads the pooler: a fresh
    # pooler makes its logits meaningless too.
    for key, heads in (("pooled", ("pooler",)), ("nsp_logits", ("pooler", "nsp", "sop")),
                       ("rtd_logits", ("rtd",))):
      if key in out and not set(heads) & set(self.fresh_heads):
        result[key] = np.asarray(out[key], np.float32)
    if want_mlm and "mlm_logits" in out:  # an ELECTRA discriminator has none
      result["mlm_logits"] = np.asarray(out["mlm_logits"], np.float32)
    return result

  def encode(self, texts: Sequence[str | tuple[str, str]], *, mlm: bool = True,
             max_length: int | None = None) -> dict[str, np.ndarray]:
    """Tokenizes and runs ``texts``; see ``run`` for the outputs (plus tokens)."""
    inputs = self.tokenize(texts, max_length)
    return {"tokens": inputs["tokens"], **self.run(inputs, mlm=mlm)}

  def embed(self, texts: Sequence[str | tuple[str, str]],
            max_length: int | None = None) -> np.ndarray:
    """float32 [batch, hidden]: last hidden states averaged over real tokens
    (sentence-transformers' mean pooling, unnormalised)."""
    out = self.encode(texts, mlm=False, max_length=max_length)
    weights = out["mask"][..., None].astype(np.float32)
    return (out["hidden"] * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)

  def fill_mask(self, text: str, top_k: int = 5) -> list[list[dict[str, Any]]]:
    """Predicts each ``[MASK]`` written in ``text`` from the MLM head.

    Every ``[MASK]`` becomes one mask token, so each predicts exactly one
    token; the text around them gets the ids the model's tokenizer gives it
    with its own mask token in place (RoBERTa's ``<mask>``), as in
    transformers' fill-mask pipeline (``bertjax/fill_mask.py``). Special
    tokens ([PAD], [UNK], [CLS], [SEP], [MASK]) are never proposed.

    Args:
      text: one text holding one or more literal ``[MASK]``.
      top_k: predictions per mask.

    Returns:
      one list per [MASK], left to right, of ``top_k`` dicts, most probable
      first: ``token_id`` (bertjax id), ``token`` (its vocabulary piece:
      ``'Ġon'``, ``'▁on'``), ``text`` (what it reads as in text, decoded:
      ``' on'``, ``'on'``) and ``score`` (softmax probability over the whole
      vocabulary).
    """
    from bertjax import fill_mask as fill_mask_lib
    most = int(self.config["vocab_size"]) - batch_lib.NUM_SPECIAL_TOKENS
    # A numpy integer counts as the int it is; a bool or a float does not.
    if (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
        or not 1 <= top_k <= most):
      # Beyond ``most`` the special tokens, never proposed, would fill the list.
      raise ValueError(f"top_k={top_k!r} is invalid; pass the number of predictions "
                       f"wanted per [MASK], between 1 and {most} (the vocabulary's "
                       "tokens less its special ones), e.g. top_k=5.")
    if not isinstance(text, str):
      raise ValueError(f"fill_mask takes one text, not a {type(text).__name__}; "
                       "call it once per text.")
    if self._replaced_token_detection:
      raise ValueError(
          "This is an ELECTRA-style checkpoint (ELECTRA, DeBERTa-v3): its "
          "discriminator tells original from replaced tokens and has no MLM "
          "head to fill masks with; fill masks with a masked-LM checkpoint "
          "(BERT, RoBERTa, ALBERT, DeBERTa, ...).")
    if self.config.get("model") == "xlnet":
      raise ValueError(
          "This is an XLNet checkpoint: it predicts tokens from its query stream "
          "over a permutation and never saw [MASK] in its input, so its guesses "
          "for one would mean little; fill masks with a masked-LM checkpoint "
          "(BERT, RoBERTa, ALBERT, DeBERTa, ...).")
    if not self.has_mlm_head:
      raise ValueError("This checkpoint has no MLM head to fill masks with; "
                       "load a pretrained masked-LM checkpoint instead.")
    # After the model's own refusals, which no text would get past.
    inputs, where = fill_mask_lib.mask_inputs(self, text)
    logits = self.run(inputs)["mlm_logits"][0, where]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ranked = probs.copy()
    ranked[:, :batch_lib.NUM_SPECIAL_TOKENS] = -1.0
    out = []
    for row, scores in zip(np.argsort(-ranked, axis=-1)[:, :int(top_k)], probs):
      out.append([{"token_id": int(i), "token": self.tokenizer.id_to_piece(int(i)),
                   "text": self.tokenizer.decode([int(i)]), "score": float(scores[i])}
                  for i in row])
    return out


def load(path: str, step: int | None = None, data_dir: str | None = None):
  """Loads a bertjax workdir's checkpoint or a Hugging Face model directory.

  Args:
    path: a workdir with ``checkpoints/`` (trained or imported by bertjax), or
      an HF directory (config.json + model.safetensors / pytorch_model.bin +
      tokenizer files), read without writing anything; or a fine-tuning
      workdir (``python -m bertjax.finetune``).
    step: for a workdir, the checkpoint step (default the latest; for a
      fine-tuning workdir, its best evaluation's); the step of a workdir's
      ``best_checkpoint/`` too, which ``path`` may also name directly
      (``<workdir>/best_checkpoint``).
    data_dir: for a pretraining workdir, the data_dir holding its tokenizer
      (``tokenizers/``) when it is no longer where the run had it (the
      workdir or the data copied or moved, e.g. a whole study's directory).

  Returns:
    A Model; for a fine-tuning workdir a ``finetune.inference.FineTuned``,
    whose ``predict`` gives the task's predictions.
  """
  from bertjax import checkpointing
  from bertjax.convert import workdir as workdir_lib
  from bertjax.finetune import inference
  path = paths.absolute(path)  # ``~`` expanded, a gs:// path's slashes made one
  parent = os.path.dirname(str(path).rstrip("/"))
  if (os.path.basename(str(path).rstrip("/")) == "best_checkpoint" and step is None
      and checkpointing.best_step(parent) is not None):
    # The best evaluation's checkpoint, named by its directory (a fine-tuning
    # workdir loads it by default).
    return load(parent, None if inference.is_workdir(parent) else checkpointing.best_step(parent),
                data_dir)
  pretraining = paths.isdir(paths.join(path, "checkpoints")) and not inference.is_workdir(path)
  if data_dir is not None and not pretraining:
    raise ValueError(f"data_dir={data_dir!r} is for a pretraining workdir's tokenizer; "
                     f"{path} is not one: leave data_dir out.")
  if inference.is_workdir(path):
    return inference.load(path, step)
  if paths.isdir(paths.join(path, "checkpoints")):
    # Reads without the workdir's lock (a run may be training there) and
    # without orbax's notices about opening it read-only.
    with checkpointing.quiet_read_only():
      try:
        config, params, _ = workdir_lib.load_params(path, step)
      except ValueError as e:
        if step is None and str(e).startswith("No checkpoint in") and _run_started(path):
          # A run makes checkpoints/ as it starts, long before it fills it.
          raise ValueError(_NO_CHECKPOINT_YET.format(path=path)) from None
        # A missing step's fix, in this function's terms.
        raise ValueError(str(e).replace("pass --step as", "pass step= as")) from None
    if data_dir is not None:
      config = {**config, "data_dir": paths.absolute(str(data_dir))}
    return Model(config, params, _workdir_tokenizer(
        config, paths.absolute(path),
        "the run's data_dir moved or was removed? Pass the data_dir that holds its "
        "tokenizers/ now: bertjax.load(path, data_dir=...)."))
  if _is_hf_dir(path):
    if step is not None:
      raise ValueError(f"{path} is a Hugging Face model directory, which holds one "
                       f"set of weights and no steps; leave step={step} out.")
    fields, params, initialised, _, tokenizer = workdir_lib.load_hf(path)
    return Model(fields, params, tokenizer, fresh_heads=initialised)
  if _run_started(path):
    raise ValueError(_NO_CHECKPOINT_YET.format(path=path))
  if paths.isdir(paths.join(path, "pretrain", "checkpoints")):
    raise ValueError(
        f"{path} is an objective's directory of a bertjax.study, not a workdir; "
        f"load its pretraining run, {paths.join(path, 'pretrain')}, or one of its "
        "fine-tuning runs, finetune/<task>/step_<N>.")
  paths.require_bucket(path, "path")  # a mistyped bucket, said as such
  raise ValueError(
      f"{path} is neither a bertjax workdir (no checkpoints/) nor a Hugging Face "
      "model directory (config.json + model.safetensors); pass one of those.")
