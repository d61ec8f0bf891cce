"""The box: the program that runs inside an imp's locked-down container.

Everything here is untrusted from the host's point of view. The host talks to it
only through the box protocol (``box.protocol``) on stdin/stdout.
"""

__version__ = "0.1.0"
