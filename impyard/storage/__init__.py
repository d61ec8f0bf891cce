"""The host's one database and who holds what (docs/storage.md): engines and their threads (``db``), which
database (``urls``), the schema (``tables``) and its history (``migrations``), statements compiled once
(``prepared``), SQL that differs per engine (``portable``), a database failure in words (``faults``), leases
(``leases``, ``lease_rules``), whether a holder lives (``liveness``) and one supervisor per home (``instance``).

May import: the foundations (``impyard.errors``, ``clock``, ``paths``…). Nothing above: every store is built on
this package, and it knows none of them.
"""
