"""One error hierarchy; behaviour is a class attribute (as aiokafka's `errors.py` does)."""


class HivemuxError(RuntimeError):
    """Base of every error hivemux raises on purpose."""

    retriable = False


class InvalidEvent(HivemuxError):
    """A record that cannot be accepted: it goes to the dead-letter topic with this reason."""

    retriable = False


class TransientError(HivemuxError):
    """A failure worth retrying with backoff (a database or broker hiccup)."""

    retriable = True


class InvariantViolation(HivemuxError):
    """A safety invariant broke (VC safety, lane safety). A bug: stop loudly."""

    retriable = False


class ConfigurationError(HivemuxError):
    """Bad configuration: the service refuses to start."""

    retriable = False


class Outage(HivemuxError):
    """A broker or database the service needs cannot be reached: the service waits it out
    (unready, retrying with backoff) and never drops or dead-letters the record for it."""

    retriable = True
