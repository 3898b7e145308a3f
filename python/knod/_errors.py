"""Exceptions, one per D-Bus error of org.knod.Policy1 (schema/org.knod.Policy1.xml), plus the
failures that happen before or around the daemon. Every one is a knod.Error carrying:

  code       the C API's knod_errc (an int; knod_errc_name() spells it)
  dbus_name  the D-Bus error name the daemon or the bus answered with, or None
  rule       for Denied and QuotaExceeded: the policy rule that decided, or None (default deny)
"""


class Error(Exception):
    """A knod-policyd client failure."""

    def __init__(self, message, code=None, dbus_name=None, rule=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.dbus_name = dbus_name
        self.rule = rule


class Denied(Error, PermissionError):
    """org.knod.Policy1.Error.Denied: the policy, the key or the holder check refused."""


class InvalidArgument(Error, ValueError):
    """org.knod.Policy1.Error.InvalidArgument: the message names the argument."""


class NoSuchBinding(Error, LookupError):
    """org.knod.Policy1.Error.NoSuchBinding."""


class QuotaExceeded(Error):
    """org.knod.Policy1.Error.QuotaExceeded: a per-uid quota or rate limit; .rule set it."""


class LimitsExceeded(Error):
    """org.knod.Policy1.Error.LimitsExceeded: a bound on what the daemon keeps for callers
    (connections per user or in all, polkit questions, bindings in all, ...); retry later."""


class OutOfResources(Error):
    """org.knod.Policy1.Error.OutOfResources: the daemon ran out of fds, memory or disk while
    serving the call (the message says which); nothing changed; retry once it is back."""


class IsolationViolation(Error):
    """org.knod.Policy1.Error.IsolationViolation: IOMMU isolation does not hold."""


class DriverFailure(Error):
    """org.knod.Policy1.Error.DriverFailure."""


class JournalUnavailable(Error):
    """org.knod.Policy1.Error.JournalUnavailable: the daemon cannot journal, so refuses."""


class InvalidPolicy(Error):
    """org.knod.Policy1.Error.InvalidPolicy."""


class FlowConflict(Error):
    """org.knod.Policy1.Error.FlowConflict: a live binding on the NIC holds an overlapping flow."""


class Failed(Error):
    """org.knod.Policy1.Error.Failed, or an error the library has no name for."""


class Unavailable(Error, ConnectionError):
    """No bus at the address, or knod-policyd is not running on it."""


class BindingEnded(Error):
    """The binding ended under its holder: .reason is the daemon's end reason ("expire",
    "revoke: <why>", "link-down", ...), .revoked whether someone else ended it."""

    def __init__(self, message, reason=None, revoked=False, **kw):
        super().__init__(message, **kw)
        self.reason = reason
        self.revoked = revoked


class BusError(Error, OSError):
    """The bus connection failed, or a reply was malformed."""


class ExportUnavailable(Error):
    """A GPU allocation cannot become a dma-buf here: the runtime, a device or the kernel's
    support is missing (the message says which and what to install)."""


# knod_errc -> class (knod/client.h; the values never change meaning).
BY_CODE = {
    1: Denied, 2: InvalidArgument, 3: NoSuchBinding, 4: QuotaExceeded, 5: IsolationViolation,
    6: DriverFailure, 7: JournalUnavailable, 8: InvalidPolicy, 9: FlowConflict, 10: Failed,
    11: Unavailable, 13: BindingEnded, 14: BusError, 15: Error, 16: LimitsExceeded,
    17: OutOfResources,
}
KNOD_ERR_TIMEOUT = 12
KNOD_ERR_ENDED = 13
