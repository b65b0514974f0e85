r"""ERNIE 1.0 pretraining: knowledge masking (words, phrases, entities) + NSP.

The quick local run on the embedded demo corpus:

  python -m bertjax.main --config=configs/ernie.py:tiny --workdir=/tmp/ernie-demo

``get_config(arg)`` takes a model size: ``tiny`` (the demo run, BERT's tiny
schedule) or the paper's ``base`` (Sun et al., 2019: BERT-base's shape, 12
layers, H 768, 12 heads; the paper gives no schedule, so base keeps BERT's:
batch 256 x 512 tokens, 1M steps, lr 1e-4). Any field can be overridden,
e.g. ``--config.ernie_gazetteer=names.txt``.

What differs from ``configs/bert.py`` (every other field is BERT's):
  knowledge_spans  True -- prepare marks phrases (word n-gram collocations of
                   the train split) and named entities (a gazetteer, or
                   recurring capitalised names) in the shards, see
                   bertjax/data/knowledge.py; they are kept apart from plain
                   shards (``<source>__knowledge``) in the same data_dir.
  objective        'ernie' -- per example a masking level (word, phrase or
                   entity, at ``ernie_level_rates``) and whole units of that
                   level masked within BERT's 15% budget, 80/10/10, plus
                   NSP (bertjax/objectives/ernie.py).
The model is BERT's ('bert').
"""

import ml_collections

from bertjax import config_files

# Loaded by path (configs are data, not a package): the bert.py beside this
# file, else bertjax's shipped one.
bert = config_files.sibling(__file__, "bert")


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  size = arg or "tiny"
  c = bert.get_config(size)

  # --- variant -------------------------------------------------------------
  c.objective = "ernie"  # bertjax/objectives/ernie.py: knowledge MLM + NSP
  c.model = "bert"  # ERNIE 1.0 is BERT's encoder

  # --- knowledge units, marked at prepare time (bertjax/data/knowledge.py) ---
  c.knowledge_spans = True  # shards carry phrase_starts and entity_starts
  c.ernie_max_phrase_words = 4  # phrases are word n-grams, n = 2..this
  c.ernie_phrase_min_count = 5  # fewest occurrences in the train split
  c.ernie_phrase_min_pmi = 3.0  # PMI (nats) required at every cut of a phrase
  # Entity list: a UTF-8 file, one entity per line; '' = recurring
  # capitalised multi-word names of the train split.
  c.ernie_gazetteer = ""
  c.ernie_entity_min_count = 3  # fewest occurrences of a default entity
  # The lists are fitted on this many evenly spaced train documents (at most
  # knowledge.MAX_FIT_SENTENCES of their sentences): bounded at any corpus size.
  c.knowledge_fit_documents = 50_000

  # --- masking ---------------------------------------------------------------
  # Probabilities of the word, phrase and entity levels, drawn per example.
  c.ernie_level_rates = "0.4,0.3,0.3"
  c.whole_word_masking = False  # ernie chooses its own units at every level
  return c
