"""Reverie's packaged default configuration: ``reverie.toml`` (the runtime),
``profiles.toml`` (source memory profiles) and ``fact_kinds.toml`` (the closed
set of fact kinds). Data only; :mod:`runtime.config` finds this directory
through the import system, so the files ship inside the wheel.

Do not edit these for one installation: ``reverie init`` writes a user
configuration (``~/.config/reverie/reverie.toml``) whose settings are layered
over these defaults.
"""
