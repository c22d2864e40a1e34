"""Strata's node service (strata serve) as a secondary tier of vLLM's
offloading connector (TieringOffloadingSpec), shared by every engine on the
node: vLLM loads ``StrataTier`` from this module by the tier's
``module_path``. Importing it imports vLLM's tier interface and checks it
(interface.py): a vLLM this package does not know fails here, at load, with
one error saying so.
"""

from .tier import StrataTier  # noqa: F401

__all__ = ["StrataTier"]
