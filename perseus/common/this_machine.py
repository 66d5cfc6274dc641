"""Whether a host name names this machine: perseusrun --elastic (a host never
blacklisted) and a grow in place (new ranks only here) both ask. No core needed."""
import socket


def is_this_machine(host):
    return host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())
