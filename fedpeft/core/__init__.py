"""Engine-neutral pieces every layer builds on: types, errors, registries, configuration, seeds, client-state
stores, atomic writes and cost bookkeeping. Nothing here imports from the rest of fedpeft at import time; the
registries read their catalogues (:mod:`fedpeft.catalog`, declarations only) by name on first use."""
