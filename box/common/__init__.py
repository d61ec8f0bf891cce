"""What the box and the host both run: the laws and shapes the two sides must compute the same way.

The host imports nothing of ``box/`` but this package and ``box.protocol`` (``tests/test_box_common.py``
holds it). Each module here is a rule or a shape, never a part of either side's machinery:

* ``laws`` — the memory engine's laws (felt strength, recall weights, mentions and names, the rule law);
* ``slot`` — the accessibility slot's law (mechanisms 84-89), applied by the host, rendered by the box;
* ``model_profiles`` — what each model and model server takes (issue 16), for request bodies and imp.toml;
* ``envelope`` — the reply envelope: its strict schema and its parsed form (ENV-19);
* ``request_bodies`` — the reply call's bodies on ``/chat/completions`` and ``/responses``;
* ``attempts`` — ENV-12's attempt count, backoff and per-attempt time limit;
* ``busy`` — mechanism 121's busy backoff for a memory call (the asking and the sleeping passed in);
* ``embedding`` — what is embedded, the offline hashing vector, the embeddings body and its checked answer;
* ``failures`` — the kinds of failure a box tags a failed turn with, and reading the tag back;
* ``history`` — a responder history line and its trimming rules (ENV-07, ENV-11).

Pure: no I/O (no file, socket, process or clock of its own), no state kept between calls; ``now`` and
any waiting are arguments. A module here imports only the standard library, pydantic, ``box.protocol``
and ``box.common``: it runs inside the box's image and in the host's process alike.
"""
