"""The Discord surface: inbound messages, outbound sends, slash commands, `impyard serve`."""
