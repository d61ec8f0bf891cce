"""The host's one database and who holds what (docs/storage.md): the database and where a call of it runs (``db``),
its engines (``engines``), worker threads (``workers``) and quick path (``quick``), which database (``urls``), the
schema (``tables``), its history (``migrations``, with the frozen ``migrations.legacy``) and its migration at open
(``migrate``), its errors (``errors``), statements compiled once (``prepared``), SQL that differs per engine
(``portable``), a store's objects from its rows (``rows``), a database failure in words (``faults``), leases
(``leases``, ``lease_rules``), one Discord shard layout per database (``shard_layout``), whether a holder lives (``liveness``) and one supervisor per home (``instance``).

May import: the foundations (``impyard.errors``, ``clock``, ``paths``…). Nothing above: every store is built on
this package, and it knows none of them.
"""
