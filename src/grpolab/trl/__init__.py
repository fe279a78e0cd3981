"""``grpolab convert-trl``: TRL configs into grpolab configs, over the one TRL name table (``grpolab.config.trl_names``)."""
