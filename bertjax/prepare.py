r"""Prepares a corpus once: text dataset, tokenizer and tokenized shards.

  python -m bertjax.prepare --config=configs/bert.py:tiny --workdir=/tmp/bertjax-demo

Everything goes to ``config.data_dir`` (default ``<workdir>/data``); running it
again checks and reuses what is there. Training (``bertjax.main``) calls the
same library function, so running this first is optional.
"""

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags
import tensorflow_datasets as tfds

from bertjax import cli
from bertjax.data import prepare

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/bert.py:tiny.", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory; data goes to <workdir>/data unless --config.data_dir.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  # prepare logs each step and its duration; TFDS's progress bars only add noise.
  tfds.disable_progress_bar()
  config = _CONFIG.value
  data_dir = prepare.resolve_data_dir(config, _WORKDIR.value)
  try:
    prepared = prepare.prepare(config, data_dir)
  except ValueError as e:
    # Bad input gets its one sentence, not a traceback.
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(f"Prepared {config.dataset} in {prepared.data_dir}")
  print(f"  tokenizer: {prepared.tokenizer_path} ({config.tokenizer}, vocab "
        f"{prepared.vocab_size}, sha256 {prepared.fingerprint[:12]})")
  for split, docs in prepared.splits.items():
    unknown = prepared.unk_rate.get(split)
    print(f"  {split}: {docs} documents, {prepared.num_tokens.get(split, 0)} tokens"
          + ("" if unknown is None else f", {100 * unknown:.2f}% [UNK]"))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
