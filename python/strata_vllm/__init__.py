"""Strata's node service (strata serve) as a secondary tier of vLLM's
offloading connector (TieringOffloadingSpec), shared by every engine on the
node: vLLM loads ``StrataTier`` from this module by the tier's
``module_path``. Taking ``StrataTier`` imports vLLM's tier interface and
checks it (interface.py): a vLLM this package does not know fails there, at
load, with one error saying so. ``python -m strata_vllm doctor`` needs no
vLLM to start.
"""

__all__ = ["StrataTier"]


def __getattr__(name):
    if name == "StrataTier":
        from .tier import StrataTier

        return StrataTier
    raise AttributeError(f"module 'strata_vllm' has no attribute {name!r}")
