"""Adapters for the tools data users live in (fsspec, PyTorch, Dask), each an optional extra.

Like ``bundlefs.mount``, they sit on the public face (``bundlefs``) and are imported only when used.
May import: ``bundlefs`` (the public face), ``bundlefs.errors``, ``bundlefs.read``.

Order (bottom first): dask | fsspec | torch_sampler | torch_iterable, torch
"""
