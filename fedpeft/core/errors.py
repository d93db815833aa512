"""Errors a user can cause. The CLI turns them into one sentence and exit code 2."""


class UserError(Exception):
    """A problem with the user's input (config, names, paths, budgets), not a bug.

    The message is one sentence that names the fix.
    """


class AllClientsFailedError(RuntimeError):
    """Every client of a federated round (or of personalization, or of the base model's evaluation) failed: the
    run cannot go on. The CLI prints the message, one sentence naming the step and the first failure, and exits
    with code 1; what the run wrote before stays."""


class MissingResultsError(RuntimeError):
    """The run ended, its outputs written, but fewer clients than ``validation.min_result_fraction`` asks have final
    results for some method (their failures are listed in ``summary.md``). The CLI prints the message, one
    sentence naming how many and where they are listed, and exits with code 1."""
