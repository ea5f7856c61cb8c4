"""The one exception type for mistakes a user can make and fix."""


class UserError(Exception):
    """A bad config, unknown task, mismatched vocab, mesh that does not divide the batch ...

    The message always says what to do about it.
    """


class Preempted(Exception):
    """`t5lite train` got SIGTERM (or JAX's preemption sync point) and saved a checkpoint at
    `step`: the CLI exits with EX_TEMPFAIL (75) so a supervisor reruns the same command."""

    EXIT_CODE = 75

    def __init__(self, step: int):
        super().__init__(f"preempted at step {step}: checkpoint saved; rerun the same command "
                         "to resume")
        self.step = step
