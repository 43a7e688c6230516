"""The torch backend: Hugging Face causal LMs and EAGLE-3 heads as `Model`s, every sequence a
row of one cache and every pass assembled in one place, on every device; loading models and
pairs."""
