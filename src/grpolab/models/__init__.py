"""Policy, reference and critic loading (loading), model sources (GGUF, package:), hub checks, fast inference settings, the chunked LM head."""
