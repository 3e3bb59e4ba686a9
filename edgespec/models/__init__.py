"""Models: from a model argument to a running backend and its drafter, in one place.

- :mod:`.arguments`: what a model argument names (a GGUF file, an MLX folder, a Hub
  id, a known name) and which backend runs it;
- :mod:`.catalog`: the known models (manifests in ``models/``), where their weights
  live and how they are fetched (and checked);
- :mod:`.loading`: backends and drafters made from model arguments;
- :mod:`.quantize`: requantization.

May import: planner, drafters, backends, core, errors, paths.
"""
