"""Engine-neutral pieces every layer builds on: types, errors, registries, configuration, seeds, client-state
stores, atomic writes and cost bookkeeping. Nothing here imports from the rest of fedpeft."""
