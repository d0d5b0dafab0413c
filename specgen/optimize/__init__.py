"""Speculative generation: triggers, forks, early termination and the optimize loop."""
