"""Backends: each runs one model (its tokenizer, its KV cache, its passes) and
implements :class:`edgespec.core.backend.Backend`; nothing here knows of drafting.

``llamacpp.py`` (with ``llama_lib.py``, ``gguf_tokenizer.py``, ``repack.py``, ``rpc.py``,
``kernels.py``), ``mlx_backend.py`` (with ``mlx_ops.py``, ``gguf_mlx.py``), the test
models ``toy.py``, ``table.py``, ``simulated.py``, and ``compat.py`` (whether two
models can pair, as a list of reasons). Model arguments are resolved above, in
:mod:`edgespec.models`: a backend is handed files.

May import: core, errors, paths.
"""
