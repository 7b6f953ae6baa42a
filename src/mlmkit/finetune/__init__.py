"""Fine-tuning the encoder on a labelled task: ``mlmkit finetune``.

One loop (``loop``: the run, its loaders, the evaluation after every epoch) and one ``Task``
per kind (``task``): a reader, a head and a decoder/scorer. ``sequence``: a class or a score
per sentence (pair), GLUE's tasks and your own files; ``model``: the head on the checkpoint's
encoder, linear probing. ``reader``: the labelled-file reader (TSV, CSV, JSONL, the Hub) that
probes, STS and the embedder share; ``metric_modules``: the metrics shipped for ``evaluate``
(no network); ``correlation``: Pearson and Spearman in numpy."""
