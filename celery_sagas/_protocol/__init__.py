"""The pure saga protocol: transition tables and decisions, no I/O, no clock, no randomness."""
