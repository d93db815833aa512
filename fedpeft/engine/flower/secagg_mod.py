"""The ClientApp mod of a SecAgg+ round (light: Flower only), for the ClientApps of both engines."""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, Message

from fedpeft.engine.flower.relay import error_reply


def secure_aggregation_mod(
    message: Message, context: Context, call_next: Callable[[Message, Context], Message]
) -> Message:
    """A ClientApp mod: hand the messages of a SecAgg+ round to Flower's ``secaggplus_mod``, pass the rest on.

    A node that cannot train its part of the round (every client of it dropped out, or it failed) answers with an
    error, which the server's workflow takes as the node dropping out."""
    from flwr.client.mod import secaggplus_mod
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    if message.metadata.message_type != "train" or RECORD_KEY_CONFIGS not in message.content.config_records:
        return call_next(message, context)

    def train_or_raise(inner: Message, ctx: Context) -> Message:
        reply = call_next(inner, ctx)
        if reply.has_error():
            raise _NodeOutError(reply.error.reason or "the node failed")
        return reply

    try:
        return secaggplus_mod(message, context, train_or_raise)
    except _NodeOutError as err:
        return error_reply(message, str(err))


class _NodeOutError(Exception):
    """This node answers the round with an error (its reason is the message)."""
