"""The ``dynamic`` storage backend factory, and the ranks a controller runs as.

SGLang builds a dynamic backend from the extra config's ``backend_name``,
``module_path`` and ``class_name``: it imports the module, insists the class is a
``HiCacheStorage``, and calls ``cls(storage_config, {})``; the host pool arrives
later through ``register_mem_pool_host``. Any exception reaches the engine's
start-up.
"""

from __future__ import annotations

import dataclasses
import importlib

from .contract import HiCacheStorage

REQUIRED = ("backend_name", "module_path", "class_name")


class StorageBackendFactory:
    @classmethod
    def create_backend(cls, backend_name, storage_config, mem_pool_host=None, **kwargs):
        if backend_name != "dynamic":
            raise ValueError(f"the model knows only the dynamic backend, not {backend_name!r}")
        extra = storage_config.extra_config
        if extra is None:
            raise ValueError("a dynamic backend needs an extra config")
        missing = [k for k in REQUIRED if k not in extra]
        if missing:
            raise ValueError(f"the dynamic backend's extra config lacks {', '.join(missing)}")
        module = importlib.import_module(extra["module_path"])
        backend_cls = getattr(module, extra["class_name"])
        if not (isinstance(backend_cls, type) and issubclass(backend_cls, HiCacheStorage)):
            raise TypeError(f"{extra['class_name']} is not a HiCacheStorage")
        return backend_cls(storage_config, kwargs)


@dataclasses.dataclass
class Ranks:
    """This process's place in the deployment, as a controller reads it."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    dp_rank: int = 0
    dp_size: int = 1
