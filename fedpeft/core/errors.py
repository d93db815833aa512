"""Errors a user can cause. The CLI turns them into one sentence and exit code 2."""


class UserError(Exception):
    """A problem with the user's input (config, names, paths, budgets), not a bug.

    The message is one sentence that names the fix.
    """
