"""Masking: the MLM collator (80-10-10 over bernoulli, whole-word, span or fixed choice)."""
