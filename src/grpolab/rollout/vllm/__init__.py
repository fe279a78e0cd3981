"""The vLLM engine (``rollout.engine=vllm``): colocated in the training process, or a server the trainer is a
client of (``rollout.mode=server``; docs/vllm.md, docs/server_mode.md).

Colocated: ``engine`` (the sampler over an in-process engine), ``process`` (the process's engines, started once
and reused), ``setup`` (settings, checks, the builder that rollout/engines.py registers), ``sync`` (the policy's
weights under their Hugging Face names).
Server mode: ``server_setup`` (the engine spec to server and client; the server builder), ``server`` (starting and
stopping the server process) under ``server_guard`` (a stdlib-only script), ``client`` (the sampler over
HTTP) with ``weights`` (the sender's half of a weight sync), ``server_client`` (the HTTP calls),
``server_protocol`` (what the server is asked and what it sends back, checked); on the server's side,
``batch`` (grpolab's batch route and worker extension) and ``shm`` (the shared-memory weight transfer).

Nothing is imported here: vLLM's server processes import ``shm`` and ``batch`` as plugins, and they should
not load the trainer's side with them.
"""
