"""``audit``: the cluster as it is held against the policy: pods judged by the admission engine itself, the
device-level reservation against the driver's devices, the rule table and its findings, the PolicyReports.
May import ``devices``, ``lending`` and the shared modules of ``ops``; never ``pool`` or ``recommend``."""
