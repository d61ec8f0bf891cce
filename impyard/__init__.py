"""impyard: the host side — supervisor, gateway, surfaces. Everything here is trusted."""

__version__ = "0.1.0"
