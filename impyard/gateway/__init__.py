"""The gateway (docs/architecture.md, docs/security.md): every act of a box decided, metered and audited —
the core (``core``: the lease, the rate meter, the audit write, the gates) and what it agrees with each act's
handler (``act``); the handlers of ``model.request`` (``model_act``), ``discord.send`` (``send_act``) and
``http.fetch`` (``fetch_act``) — ``history.*`` and ``memory.*`` are served by handlers of their own packages,
registered by the host; the policy (``policy``, ``policy_models``) and its judge (``judge``), channel trust
(``trust``), approval gates (``gates``, ``gate_pump``), the budget ledger and prices (``ledger``, ``prices``,
``rate_precheck``), the model broker (``broker``), the fetcher (``fetch``), the audit log (``audit``), and where
acts land (``surfaces``: one ``Post`` each).

May import: the foundations, ``storage``, ``backends``, ``imps``, ``channels``.
"""
