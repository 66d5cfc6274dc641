"""Holds libperseus.so, the core library built from csrc/ by setup.py."""
