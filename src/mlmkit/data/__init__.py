"""Data: corpora (built-in, text/JSON/Parquet files, the Hub, mixtures) tokenized and packed
into blocks, in map mode (``corpus``: a cached dataset) or streamed (``streaming``); the
tokenizer, loaded or trained on the corpus (``tokenizer``)."""
