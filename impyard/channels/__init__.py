"""Channels: what the host knows of each channel a surface shows it — kind, name, guild, trust, response mode
and audience (``store``; docs/conversation.md).

May import: the foundations and ``storage``. When a channel turns private, what moves with it (memories) is
passed in by the host (``ChannelStore(on_private=…)``): the channels know no memory.
"""
