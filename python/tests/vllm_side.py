"""Which vLLM the vLLM tier's tests drive it through: the project's model of
vLLM's side (vllm_model, the default), or vLLM's real TieringOffloadingSpec,
manager and CPU primary tier from a fetched copy (STRATA_VLLM_SIDE=real with
STRATA_VLLM_DIR at a folder holding vLLM's ``vllm/`` package; vllm_real/boot.py
makes its scheduler-side code import on CPU). Both give an engine with the
same calls (vllm_model/engine.py's Engine; RealEngine here), so one test body
runs on both sides.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SIDE = os.environ.get("STRATA_VLLM_SIDE", "model")
PROBLEM = ""
COMMIT = ""

if SIDE == "real":
    src = os.environ.get("STRATA_VLLM_DIR", "")
    if not src or not os.path.isfile(
        os.path.join(src, "vllm", "v1", "kv_offload", "tiering", "base.py")
    ):
        PROBLEM = (
            "vLLM's real classes: STRATA_VLLM_DIR does not hold a fetched vLLM (vllm/v1/kv_offload/tiering); "
            "extract one with: git -C <vllm git dir> archive <commit> vllm | tar -x -C .vllm"
        )
    else:
        try:
            COMMIT = open(os.path.join(src, "COMMIT")).read().strip()
        except OSError:
            COMMIT = "unknown commit"
        sys.path.insert(0, os.path.join(HERE, "vllm_real"))
        import boot  # noqa: E402

        boot.install(os.path.join(src, "vllm"))
else:
    import vllm_model

    vllm_model.install()

DESCRIPTION = (
    f"vLLM's real classes at {COMMIT}" if SIDE == "real" else "the project's model of vLLM"
)


def new_engine(engine_id: str, rows: int, stride: int, tier_kwargs: dict, model=None):
    if SIDE == "real":
        from vllm_real.engine import RealEngine

        return RealEngine(engine_id, rows, stride, tier_kwargs, model)
    from vllm_model.engine import Engine, Model

    import strata_vllm

    def make(spec, view):
        return strata_vllm.StrataTier(spec, view, "StrataTier", **tier_kwargs)

    return Engine(engine_id, rows, stride, make, model=model or Model())
