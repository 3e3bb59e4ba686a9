"""Models: from a model argument to a running backend, in one place.

- :mod:`.arguments`: what a model argument names (a GGUF file, an MLX folder, a Hub
  id, a known name) and which backend runs it;
- :mod:`.catalog`: the known models (manifests in ``models/``), where their weights
  live and how they are fetched;
- :mod:`.loading`: backends and drafters made from model arguments.

(Nothing is imported here: a backend asks :mod:`.arguments` and :mod:`.catalog`,
which sit below it, while :mod:`.loading` sits above every backend.)
"""
