"""What the parser (cli/__init__.py) and the handlers (cli/commands.py) share: the refusal and
the default schedule. A module of its own, so that the handlers need not import the package
that imports them."""

DEFAULT_SCHEDULE = "v3"


class Refused(Exception):
    """A command line that cannot be taken as given: one line on stderr, exit status 2."""

    exit_status = 2
