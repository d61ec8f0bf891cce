"""The gateway (docs/architecture.md, docs/security.md): every act of a box decided, metered and audited —
the policy (``policy``, ``policy_models``) and its judge (``judge``), channel trust (``trust``), approval gates
(``gates``, ``gate_pump``), the budget ledger and prices (``ledger``, ``prices``, ``rate_precheck``), the model
broker (``broker``), ``http.fetch`` (``fetch``), the audit log (``audit``), where acts land (``surfaces``), and
the gateway itself (``core``).

May import: the foundations, ``storage``, ``backends``, ``imps``, ``channels``.
"""
