"""The one exception type for mistakes a user can make and fix."""


class UserError(Exception):
    """A bad config, unknown task, mismatched vocab, mesh that does not divide the batch ...

    The message always says what to do about it.
    """
