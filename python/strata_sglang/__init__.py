"""Strata as SGLang's HiCache L3: the ``StrataStorage`` backend over ``strata serve``.

SGLang loads ``strata_sglang.StrataStorage`` through its ``dynamic`` storage
backend (see the README's "Use with SGLang"). ``python -m strata_sglang doctor``
checks a node's setup. Importing this package needs only the standard library;
``StrataStorage`` is imported on first use, with SGLang and torch.
"""

__version__ = "0.1.0"

__all__ = ["StrataStorage", "__version__"]


def __getattr__(name):
    if name == "StrataStorage":
        from .storage import StrataStorage

        return StrataStorage
    raise AttributeError(f"module 'strata_sglang' has no attribute {name!r}")
