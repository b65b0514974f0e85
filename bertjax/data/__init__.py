"""Host-side data: corpora, tokenizers, prepared shards and the input pipeline."""
