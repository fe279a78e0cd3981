"""Untrusted Python: run in a child process under limits (runner, harness), with the verdict computed outside it (checks, verdict)."""
