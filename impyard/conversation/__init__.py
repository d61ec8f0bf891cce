"""The conversation (docs/conversation.md, seed 004): a message in, a turn, a reply out — what a surface hands in
(``inbound``), the wake rule (``wake``), respond-vs-judge framing (``framing``), warm box sessions
(``sessions``), the pipeline every surface plugs into (``pipeline``), the channel history and wakes
(``history``), the imp's own posts joining it (``history_surface``), the responder's own lines
(``responder_history``) and the gateway's handler of a box's ``history.*`` (``history_act``), and the typing
indicator (``typing_indicator``).

May import: the foundations, ``storage``, ``backends``, ``imps``, ``channels``, ``gateway``, ``tasks``,
``memory``.
"""
