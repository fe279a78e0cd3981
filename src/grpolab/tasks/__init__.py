"""Built-in tasks and the tiny model of the embedded default."""
