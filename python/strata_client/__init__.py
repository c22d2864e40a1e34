"""Strata's node-service client, shared by the engine plugins (strata_sglang,
strata_vllm): the wire protocol, the deadline fence, a connection and its
reader, and a Client that reconnects and re-registers its memory segments by
itself. Nothing here knows an engine; it depends on the standard library only.
"""
