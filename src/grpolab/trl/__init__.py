"""``grpolab convert-trl``: TRL configs into grpolab configs. Its field rules (``fields``) take the words of
each TRL name that maps to grpolab keys from the one TRL name table, ``grpolab.config.trl_names``."""
