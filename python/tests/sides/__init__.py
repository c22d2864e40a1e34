"""The two sides a plugin test can drive the plugin through: the project's own
model of SGLang (``sides.model``, always) and SGLang's real classes from a
fetched copy (``sides.real``, when ``STRATA_SGLANG_DIR`` names one). Both
offer the same names, so one test body runs on either; ``harness`` picks the
side of this run (``STRATA_SGLANG_SIDE``: model, the default, or real)."""
